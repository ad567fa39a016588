//! The offline SFT teacher writes its plan (the `<structured_plan>`, self-rubric included) from
//! the question alone: for research-world tasks with persistent rubrics and known answers, no
//! gold rubric title or description, no rubric key term and no known answer appears in any
//! row's plan unless the question itself says it. The searches still follow the known evidence
//! chain and the final answer may still give the known answer. Real local BM25 index.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::collections::HashMap;

use orchestrator::domain::bank::{LocalEmbedder, dot};
use orchestrator::domain::data::world::{WorldTask, generate};
use orchestrator::domain::scaffold::Scaffold;
use orchestrator::domain::scaffold::parse::parse;
use orchestrator::infra::embed::Embedder;
use orchestrator::infra::prompts::system_prompt;
use orchestrator::infra::tools::setup::{ToolSetup, build};
use orchestrator::pipeline::sft::{SftRow, injected_rows, offline, reflection_rows};

/// Every `<structured_plan>…</structured_plan>` of a trace, lowercased.
fn plans(trace: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = trace;
    while let Some(i) = rest.find("<structured_plan>") {
        let tail = &rest[i..];
        let end = tail
            .find("</structured_plan>")
            .map_or(tail.len(), |e| e + "</structured_plan>".len());
        out.push(tail[..end].to_lowercase());
        rest = &tail[end..];
    }
    out
}

/// Whether `needle` (lowercase) occurs in `hay` (lowercase) as whole words.
fn has_words(hay: &str, needle: &str) -> bool {
    let needle = needle.trim();
    if needle.is_empty() {
        return false;
    }
    let word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    hay.match_indices(needle).any(|(i, m)| {
        !word(hay[..i].chars().next_back()) && !word(hay[i + m.len()..].chars().next())
    })
}

/// Gold text of a task that the question does not itself contain.
fn gold_not_in_question(t: &WorldTask) -> Vec<(&'static str, String)> {
    let q = t.query.to_lowercase();
    let mut gold = vec![("known answer", t.answer.to_lowercase())];
    for r in &t.rubrics {
        gold.push(("rubric title", r.title.to_lowercase()));
        gold.push(("rubric description", r.description.to_lowercase()));
        for k in &r.key_terms {
            gold.push(("rubric key term", k.to_lowercase()));
        }
    }
    gold.retain(|(_, g)| !g.trim().is_empty() && !has_words(&q, g));
    gold
}

#[tokio::test]
async fn the_offline_plan_sees_the_question_only() {
    let tmp = tempfile::tempdir().unwrap();
    // Twelve tasks: four of each kind (2-hop exact, 3-hop exact, 4-hop long report).
    let world = generate(11, 160, 12);
    let idx = tmp.path().join("idx");
    orchestrator::infra::tools::local_search::LocalIndex::build(&world.docs, Some(&idx)).unwrap();
    let tools = build(
        &ToolSetup {
            index: Some(idx),
            index_tool: None,
            index_k: None,
            web: false,
            mcp_urls: vec![],
        },
        None,
    )
    .await
    .unwrap();
    let docs: HashMap<_, _> = world
        .docs
        .iter()
        .map(|d| (d.id.clone(), d.clone()))
        .collect();
    let system = system_prompt(Scaffold::Rubricem, &tools.specs(), 10).unwrap();

    // The world's own tasks, and the same tasks with distinctive gold titles and descriptions
    // (which no plan written from the question could contain).
    let marked: Vec<WorldTask> = world
        .tasks
        .iter()
        .map(|t| {
            let mut t = t.clone();
            for (j, r) in t.rubrics.iter_mut().enumerate() {
                r.title = format!("gold criterion {j} on the {}", r.title);
                r.description = format!("Gold description {j}: {}", r.description);
            }
            t
        })
        .collect();
    for tasks in [&world.tasks, &marked] {
        let (rows, stats) = offline(tasks, &docs, &tools, "google_search", &system, 10).await;
        reflections_read_the_attempt_only(tasks, &rows).await;
        assert_eq!(stats.written, tasks.len(), "every task kept: {stats:?}");
        for (row, t) in rows.iter().zip(tasks) {
            assert_eq!(row.id, t.id);
            let trace = &row.messages[2].content;
            let ps = plans(trace);
            assert!(!ps.is_empty(), "{}: a plan", t.id);
            for p in &ps {
                for (what, g) in gold_not_in_question(t) {
                    assert!(
                        !has_words(p, &g),
                        "{}: the plan holds the {what} {g:?}:\n{p}",
                        t.id
                    );
                }
            }
            // The plan is a real self-rubric: checklist items under their headings.
            let parsed = parse(trace, &|_| true);
            let rubric = parsed.plan.and_then(|p| p.rubric).expect("a self-rubric");
            assert!(!rubric.knowledge.is_empty(), "{}: {}", t.id, rubric.raw);
            assert!(!rubric.negative.is_empty(), "{}: {}", t.id, rubric.raw);
            // Still trained towards the right answer.
            if t.answer_format == "exact" {
                assert!(
                    trace.contains(&format!("\\boxed{{{}}}", t.answer)),
                    "{}: {trace}",
                    t.id
                );
            }
        }
    }
}

/// The questions of a block's `## Similar Question N:` items, in order.
fn similar(user: &str) -> Vec<String> {
    user.lines()
        .filter_map(|l| l.strip_prefix("## Similar Question "))
        .filter_map(|l| l.split_once(": ").map(|(_, q)| q.to_string()))
        .collect()
}

/// The questions of the `k` items (whole attempts' post-mortems) of other tasks most similar to
/// `query` by the local embedding, computed here by brute force.
fn nearest(tasks: &[WorldTask], refl: &[SftRow], query: &str, k: usize) -> Vec<String> {
    let e = LocalEmbedder::default();
    let q = e.embed_one(query);
    let mut scored: Vec<(f32, String)> = refl
        .iter()
        .filter_map(|r| r.id.strip_suffix("#reflect"))
        .filter_map(|id| tasks.iter().find(|t| t.id == id))
        .filter(|t| t.query != query)
        .map(|t| (dot(&e.embed_one(&t.query), &q), t.query.clone()))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored.into_iter().take(k).map(|(_, q)| q).collect()
}

/// The reflection demonstrations of the taught rows (`reflection_rows`): one per row, a quarter
/// on an attempt cut after an earlier search and answered, a quarter on one that degenerates
/// into a loop until the budget and never answers; each is the meta-policy's own prompt over the attempt and
/// a valid post-mortem that `demo` derives from that attempt's text alone, so no gold rubric text
/// reaches it, and a cut attempt's post-mortem names where its chain stopped without the known
/// answer.
async fn reflections_read_the_attempt_only(tasks: &[WorldTask], rows: &[SftRow]) {
    use orchestrator::domain::reflection::{STOP, demo, parse};
    let refl = reflection_rows(tasks, rows, 12_000).unwrap();
    assert_eq!(refl.len(), rows.len());
    // The agent rows again with the bank's block in front of the question: the nearest two
    // items of other tasks, as a run with reflection.top_k = 2 retrieves them.
    let local = Embedder::Local(LocalEmbedder::default());
    let inj = injected_rows(tasks, rows, &refl, 0, 2, &local)
        .await
        .unwrap();
    let within = inj.iter().filter(|r| r.id.ends_with("#within")).count();
    let cross = inj.iter().filter(|r| r.id.ends_with("#cross")).count();
    assert_eq!((within, cross), (rows.len().div_ceil(2), rows.len() / 2));
    for r in &inj {
        let base = r.id.rsplit_once('#').unwrap().0;
        let plain = rows.iter().find(|a| a.id == base).unwrap();
        let t = tasks.iter().find(|t| t.id == base).unwrap();
        assert_eq!(r.segments, plain.segments, "the same demonstration");
        let user = &r.messages[1].content;
        assert!(user.starts_with("<reference_examples>"), "{user}");
        assert!(user.ends_with(&plain.messages[1].content));
        if r.id.ends_with("#within") {
            let own = refl
                .iter()
                .find(|x| x.id == format!("{base}#reflect"))
                .unwrap();
            let own_blocks = parse(&own.segments[0].text).unwrap();
            assert!(user.contains(&own_blocks.rubrics), "its own post-mortem");
        } else {
            assert_eq!(user.matches("## Similar Question").count(), 2, "{user}");
            assert!(!user.contains(&format!("Question 1: {}\n", t.query)));
            assert!(!user.contains(&format!("Question 2: {}\n", t.query)));
            assert_eq!(
                similar(user),
                nearest(tasks, &refl, &t.query, 2),
                "{}: the nearest other tasks' items, most similar first",
                t.id
            );
        }
    }
    // At k = 1 every report task (four hops) is shown another report task's item: the block a
    // run puts in front of it (session 42: a warm start that only ever saw other kinds' items
    // there looped to the budget under it).
    let one = injected_rows(tasks, rows, &refl, 0, 1, &local)
        .await
        .unwrap();
    let reports: Vec<&WorldTask> = tasks.iter().filter(|t| t.hops == 4).collect();
    let mut checked = 0;
    for r in one.iter().filter(|r| r.id.ends_with("#cross")) {
        let t = tasks
            .iter()
            .find(|t| r.id == format!("{}#cross", t.id))
            .unwrap();
        let shown = similar(&r.messages[1].content);
        assert_eq!(shown.len(), 1);
        if t.hops == 4 {
            checked += 1;
            assert!(
                reports.iter().any(|o| o.query == shown[0]),
                "{}: a report task shown {:?}",
                t.id,
                shown[0]
            );
        }
    }
    assert!(checked > 0, "a report task got a cross row");
    // Fewer items than k + 1: no rows rather than a short block.
    assert!(
        injected_rows(tasks, rows, &refl, 0, refl.len(), &local)
            .await
            .unwrap()
            .is_empty()
    );
    let cut: Vec<&SftRow> = refl
        .iter()
        .filter(|r| r.id.contains("#reflect-cut"))
        .collect();
    assert_eq!(
        cut.len(),
        (rows.len() + 2) / 4,
        "every fourth attempt is cut"
    );
    let looping = refl
        .iter()
        .filter(|r| r.id.contains("#reflect-loop"))
        .count();
    assert_eq!(looping, rows.len() / 4, "every fourth attempt loops");
    for (r, t) in refl.iter().zip(tasks) {
        assert!(r.id.starts_with(&t.id));
        let text = &r.segments[0].text;
        assert_eq!(r.segments.len(), 1);
        assert!(parse(text).is_some() && text.ends_with(STOP), "{text}");
        let user = &r.messages[1].content;
        let attempt = user
            .split("## The attempt (the agent's work, ending in its answer)")
            .nth(1)
            .unwrap();
        let (system, _) = orchestrator::pipeline::reflection::prompt(&t.query, "x").unwrap();
        assert_eq!(
            r.messages[0].content, system,
            "the meta-policy's own prompt"
        );
        // A function of the question and the attempt only.
        let again = demo::write(&t.query, &demo::read(attempt), t.answer_format == "exact");
        assert_eq!(&again, text, "{}", t.id);
        let lower = text.to_lowercase();
        assert!(!lower.contains("gold criterion") && !lower.contains("gold description"));
        if r.id.contains("#reflect-cut") {
            assert!(
                !demo::read(attempt).boxed,
                "the cut answer is not boxed: {attempt}"
            );
            assert!(text.contains("Pitfalls: answered after"), "{text}");
            let q = t.query.to_lowercase();
            let a = t.answer.to_lowercase();
            if t.answer_format == "exact" && !has_words(&q, &a) {
                assert!(!has_words(&lower, &a), "{}: {a:?} in {text}", t.id);
            }
        } else if r.id.contains("#reflect-loop") {
            let seen = demo::read(attempt);
            assert!(!seen.answered, "{attempt}");
            let l = seen.looped.expect("the loop is read from the attempt");
            assert!(
                attempt.matches(l.as_str()).count() >= demo::LOOP_MIN,
                "{l:?} in {attempt}"
            );
            assert!(
                text.contains(&format!("Pitfalls: no answer; the text loops on \"{l}\".")),
                "{text}"
            );
            assert!(!text.contains("\\boxed"), "{text}");
        } else {
            assert!(text.contains("Pitfalls: none seen;"), "{text}");
        }
    }
}
