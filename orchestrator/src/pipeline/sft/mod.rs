//! SFT data construction (method.md A.3): scaffold trajectories written as ChatML JSONL for
//! `trainer sft`. The offline teacher follows the research world's known evidence chains: it
//! plans with a self-rubric written from the question alone (`plan`: no gold rubric and no known
//! answer reaches the plan), searches the real local index hop by hop along the known chain,
//! evaluates its state after each result, reviews its checklist against the retrieved snippet
//! ids and answers with `<cite>` spans over sentences of the retrieved snippets (an exact
//! task's known answer boxed). Every trajectory passes the A.3 rejection rules
//! (`scaffold::sft::check`) or is dropped with the rule it broke; a task whose evidence the
//! index does not return is dropped as `evidence_not_found`. Rows: `messages` (system, user,
//! assistant = the whole trace) and `segments` (model text vs tool output, so tool spans carry
//! no loss). `teacher` writes the same rows with a teacher model behind an OpenAI-compatible
//! endpoint, for any task file (it sees the question only).

pub mod plan;
pub mod teacher;

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::domain::data::world::WorldTask;
use crate::infra::chat::AnswerFormat;
use crate::infra::tools::local_search::CorpusDoc;
use crate::infra::tools::runner::{ToolArgs, ToolRunner};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SftSegment {
    pub kind: &'static str,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SftMessage {
    pub role: &'static str,
    pub content: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SftRow {
    pub id: String,
    pub messages: Vec<SftMessage>,
    pub segments: Vec<SftSegment>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SftStats {
    pub tasks: usize,
    pub written: usize,
    /// Rejections by rule name.
    pub rejected: BTreeMap<String, usize>,
}

fn sentence_with<'a>(text: &'a str, terms: &[String]) -> Option<&'a str> {
    text.split_inclusive(". ")
        .map(str::trim)
        .find(|s| terms.iter().all(|t| s.contains(t.as_str())))
}

fn format_of(t: &WorldTask) -> AnswerFormat {
    match t.answer_format.as_str() {
        "exact" => AnswerFormat::Exact,
        "short" => AnswerFormat::Short,
        _ => AnswerFormat::Long,
    }
}

/// One offline teacher trajectory; `Err(rule)` when it must be rejected.
pub async fn teach(
    task: &WorldTask,
    docs: &HashMap<String, CorpusDoc>,
    tools: &ToolRunner,
    tool: &str,
    system: &str,
    max_tool_calls: u32,
) -> Result<SftRow, String> {
    let hops: Vec<&crate::domain::data::world::WorldRubric> = {
        // One search per distinct evidence document, in chain order.
        let mut seen = Vec::new();
        let mut v = Vec::new();
        for r in &task.rubrics {
            if let Some(e) = r.evidence.first()
                && !seen.contains(e)
            {
                seen.push(e.clone());
                v.push(r);
            }
        }
        v
    };
    if hops.is_empty() || hops.len() as u32 > max_tool_calls {
        return Err("too_many_hops".into());
    }
    // The plan is written before searching from the question alone (`plan`): no gold rubric
    // and no known answer reaches it, so the warm start teaches planning, not the answer key.
    let plan = plan::from_question(&task.query, format_of(task));
    let checklist: String = plan.checklist.iter().map(|c| format!("- {c}\n")).collect();
    let plan_steps: String = plan
        .steps
        .iter()
        .enumerate()
        .map(|(i, s)| format!("{}. {s}\n", i + 1))
        .collect();
    let mut segments = Vec::new();
    let mut rounds_text: Vec<String> = Vec::new();
    let mut found: Vec<(String, String)> = Vec::new(); // (snippet id, sentence)
    for (h, r) in hops.iter().enumerate() {
        let Some(doc) = docs.get(&r.evidence[0]) else {
            return Err("evidence_not_found".into());
        };
        let query = doc.title.clone();
        let mut text = String::new();
        if h == 0 {
            text.push_str(&format!(
                "<think>\n{} facts, each from a search.\n</think>\n\
                 <structured_plan>\n<deep_analysis>\n{}\n</deep_analysis>\n\
                 <rubric>\nKnowledge checklist:\n{checklist}Analytical criteria:\n- Each fact leads to the next.\n\
                 Negative constraints:\n- No fact without a snippet.\n</rubric>\n\
                 <research_plan>\n{plan_steps}</research_plan>\n</structured_plan>\n",
                plan.checklist.len(),
                plan.analysis
            ));
        } else {
            let (id, sentence) = &found[found.len() - 1];
            text.push_str(&format!(
                "<think>\nNext link.\n</think>\n<state_evaluation>\nFound: {sentence} ({id})\n</state_evaluation>\n"
            ));
        }
        text.push_str(&format!("<call_tool name=\"{tool}\">{query}</call_tool>"));
        let res = tools
            .run(
                tool,
                ToolArgs {
                    query,
                    attrs: BTreeMap::new(),
                },
            )
            .await;
        if res.error.is_some() {
            return Err("tool_error".into());
        }
        // Every rubric that this document supports, from the snippet that carries it.
        for rr in task
            .rubrics
            .iter()
            .filter(|x| x.evidence.first() == r.evidence.first())
        {
            let hit = res.snippets.iter().find_map(|s| {
                sentence_with(&s.text, &rr.key_terms).map(|sent| (s.id.clone(), sent.to_string()))
            });
            match hit {
                Some((id, sent)) => found.push((id, sent)),
                None => return Err("evidence_not_found".into()),
            }
        }
        rounds_text.push(text.clone());
        segments.push(SftSegment {
            kind: "model",
            text,
        });
        segments.push(SftSegment {
            kind: "tool_output",
            text: format!("\n{}\n", res.output_text),
        });
    }
    // Each checklist item with the snippets that satisfy it: one fact per item when the chain
    // gave as many facts as the plan has items (they come in the same order), else the chain.
    let ids: Vec<&str> = found.iter().map(|(id, _)| id.as_str()).collect();
    let mut chain = ids.clone();
    chain.dedup();
    let review: String = (1..=plan.checklist.len())
        .map(|i| {
            let by = if ids.len() == plan.checklist.len() {
                ids[i - 1].to_string()
            } else {
                chain.join(", ")
            };
            format!("- Item {i}: {by}.\n")
        })
        .collect();
    let claims: Vec<String> = found
        .iter()
        .map(|(id, sent)| format!("<cite id=\"{id}\">{sent}</cite>"))
        .collect();
    let boxed = if format_of(task) == AnswerFormat::Exact {
        format!("\nThe answer is \\boxed{{{}}}.", task.answer)
    } else {
        String::new()
    };
    let last = format!(
        "<think>\nAll found.\n</think>\n<state_evaluation>\nAll {} items found.\n</state_evaluation>\n\
         <review>\n<rubric_review>\n{review}</rubric_review>\n<writing_plan>\nThe chain in order, cited.\n</writing_plan>\n</review>\n\
         <answer>\n{}{boxed}\n</answer>",
        plan.checklist.len(),
        claims.join("\n")
    );
    rounds_text.push(last.clone());
    segments.push(SftSegment {
        kind: "model",
        text: last,
    });
    let rounds: Vec<crate::domain::scaffold::sft::Round<'_>> = rounds_text
        .iter()
        .map(|t| crate::domain::scaffold::sft::Round {
            text: t,
            tool_error: false,
        })
        .collect();
    if let Some(rule) = crate::domain::scaffold::sft::check(&rounds).first() {
        return Err(rule.name().to_string());
    }
    let user = crate::infra::prompts::user_message(&task.query, format_of(task));
    let assistant: String = segments.iter().map(|s| s.text.as_str()).collect();
    Ok(SftRow {
        id: task.id.clone(),
        messages: vec![
            SftMessage {
                role: "system",
                content: system.to_string(),
            },
            SftMessage {
                role: "user",
                content: user,
            },
            SftMessage {
                role: "assistant",
                content: assistant,
            },
        ],
        segments,
    })
}

/// Teach every task; returns the kept rows and the counts.
pub async fn offline(
    tasks: &[WorldTask],
    docs: &HashMap<String, CorpusDoc>,
    tools: &ToolRunner,
    tool: &str,
    system: &str,
    max_tool_calls: u32,
) -> (Vec<SftRow>, SftStats) {
    let mut stats = SftStats {
        tasks: tasks.len(),
        ..Default::default()
    };
    let mut rows = Vec::new();
    for t in tasks {
        match teach(t, docs, tools, tool, system, max_tool_calls).await {
            Ok(r) => rows.push(r),
            Err(rule) => *stats.rejected.entry(rule).or_default() += 1,
        }
    }
    stats.written = rows.len();
    (rows, stats)
}

/// The attempt a reflection demonstration reads: the taught trajectory whole (`cut` None), or
/// cut after its first `cut` searches and answered from what those found, without a box (a
/// flawed attempt whose flaw shows in its text). None when `cut` is not below the row's
/// searches.
fn attempt(row: &SftRow, cut: Option<usize>) -> Option<Vec<SftSegment>> {
    let Some(k) = cut else {
        return Some(row.segments.clone());
    };
    let searches = row
        .segments
        .iter()
        .filter(|s| s.kind == "tool_output")
        .count();
    if k == 0 || k >= searches {
        return None;
    }
    let kept: Vec<SftSegment> = row.segments[..2 * k].to_vec();
    let outputs: String = kept
        .iter()
        .filter(|s| s.kind == "tool_output")
        .map(|s| s.text.as_str())
        .collect();
    let last = &row.segments.last()?.text;
    let answer = last
        .split("<answer>")
        .nth(1)
        .and_then(|a| a.split("</answer>").next())
        .unwrap_or_default();
    // The full answer's claims whose snippet the kept searches returned.
    let claims: Vec<&str> = answer
        .lines()
        .filter(|l| {
            l.strip_prefix("<cite id=\"")
                .and_then(|r| r.split('"').next())
                .is_some_and(|id| outputs.contains(id))
        })
        .collect();
    let ids: Vec<&str> = claims
        .iter()
        .filter_map(|l| l.strip_prefix("<cite id=\"")?.split('"').next())
        .collect();
    let mut out = kept;
    out.push(SftSegment {
        kind: "model",
        text: format!(
            "<think>\nAnswer from what was found.\n</think>\n<review>\n<rubric_review>\n- Found: {}.\n</rubric_review>\n<writing_plan>\nWhat was found, cited.\n</writing_plan>\n</review>\n<answer>\n{}\n</answer>",
            ids.join(", "),
            claims.join("\n")
        ),
    });
    Some(out)
}

/// An attempt that degenerates the way a small policy at temperature 0.7 does when it runs to
/// its token budget (BENCHMARKS.md, issue 25 session 39: a `<call_tool>` line written hundreds
/// of times, or one phrase until the budget ends): the taught trajectory's first `k` searches,
/// the start of its next model turn, then `fill` characters of one fragment over and over, the
/// forced `<answer>` opening the rollout engine injects at the budget, and more of the loop,
/// never closed. The fragment is a scaffold tag line (`variant` even) or the last three words
/// the turn wrote before it broke off (odd). None when `k` is 0 or above the row's searches.
fn looping_attempt(row: &SftRow, k: usize, variant: usize, fill: usize) -> Option<Vec<SftSegment>> {
    const TAGS: [&str; 4] = [
        "<call_tool>",
        "<state_evaluation>",
        "</rubric>",
        "<writing_plan>",
    ];
    let searches = row
        .segments
        .iter()
        .filter(|s| s.kind == "tool_output")
        .count();
    if k == 0 || k > searches {
        return None;
    }
    let mut out: Vec<SftSegment> = row.segments[..2 * k].to_vec();
    let next = &row.segments.get(2 * k)?.text;
    // The turn breaks off a third of the way in, at a word boundary.
    let mut at = next.len() / 3;
    while !next.is_char_boundary(at) {
        at -= 1;
    }
    let at = next[..at].rfind(char::is_whitespace).unwrap_or(at);
    let start = &next[..at];
    let fragment = if variant.is_multiple_of(2) {
        format!("\n{}", TAGS[(variant / 2) % TAGS.len()])
    } else {
        let words: Vec<&str> = start.split_whitespace().collect();
        let tail = words[words.len().saturating_sub(3)..].join(" ");
        if tail.is_empty() {
            format!("\n{}", TAGS[0])
        } else {
            format!(" {tail}")
        }
    };
    let reps = fill / fragment.len() + 1;
    out.push(SftSegment {
        kind: "model",
        text: format!("{start}{}", fragment.repeat(reps)),
    });
    out.push(SftSegment {
        kind: "injected",
        text: "\n<answer>\n".to_string(),
    });
    out.push(SftSegment {
        kind: "model",
        text: fragment.repeat(reps / 4 + 1),
    });
    Some(out)
}

/// Which attempt a reflection demonstration reads.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Shown {
    /// The taught trajectory whole.
    Whole,
    /// Cut after this many searches and answered from what they found (`attempt`).
    Cut(usize),
    /// Degenerating after this many searches until the budget (`looping_attempt`).
    Loop(usize),
}

/// One reflection demonstration per taught trajectory (`rows`, matched to `tasks` by id): the
/// meta-policy's prompt over the attempt as the reflection job shows it (every segment, clipped
/// to `max_chars` head and tail) and the offline teacher's post-mortem of that attempt
/// (`domain::reflection::demo`), the row's one model segment. Half the attempts are whole; of
/// the others, every second one with two or more searches is cut after an earlier search and
/// answered (`attempt`: a chain that stopped short), and the rest degenerate into a loop until
/// the token budget (`looping_attempt`), as up to half of a smoke policy's attempts do: without
/// these, the meta-policy's post-mortems of such attempts were valid 6 times in 348
/// (BENCHMARKS.md, issue 25 session 38).
pub fn reflection_rows(
    tasks: &[WorldTask],
    rows: &[SftRow],
    max_chars: usize,
) -> Result<Vec<SftRow>, minijinja::Error> {
    let by_id: HashMap<&str, &WorldTask> = tasks.iter().map(|t| (t.id.as_str(), t)).collect();
    let mut out = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        let Some(task) = by_id.get(row.id.as_str()) else {
            continue;
        };
        let searches = row
            .segments
            .iter()
            .filter(|s| s.kind == "tool_output")
            .count();
        let kind = match i % 4 {
            1 if searches >= 2 => Shown::Cut(1 + (i / 4) % (searches - 1)),
            3 if searches >= 1 => Shown::Loop(1 + (i / 4) % searches),
            _ => Shown::Whole,
        };
        let segments = match kind {
            Shown::Whole => attempt(row, None),
            Shown::Cut(k) => attempt(row, Some(k)),
            // Loops of 2,000 to 8,000 characters: the reflection job's 6,000-character clip
            // shows some whole and the tail of the others.
            Shown::Loop(k) => looping_attempt(row, k, i / 4, 2_000 + (i * 997) % 6_000),
        };
        let Some(segments) = segments else {
            continue;
        };
        let full: String = segments.iter().map(|s| s.text.as_str()).collect();
        let shown = crate::domain::judge::view::clip_middle(&full, max_chars);
        let (system, user) = crate::infra::prompts::reflection_prompt(&task.query, &shown)?;
        let text = crate::domain::reflection::demo::write(
            &task.query,
            &crate::domain::reflection::demo::read(&full),
            format_of(task) == AnswerFormat::Exact,
        );
        out.push(SftRow {
            id: match kind {
                Shown::Cut(k) => format!("{}#reflect-cut{k}", row.id),
                Shown::Loop(k) => format!("{}#reflect-loop{k}", row.id),
                Shown::Whole => format!("{}#reflect", row.id),
            },
            messages: vec![
                SftMessage {
                    role: "system",
                    content: system,
                },
                SftMessage {
                    role: "user",
                    content: user,
                },
                SftMessage {
                    role: "assistant",
                    content: text.clone(),
                },
            ],
            segments: vec![SftSegment {
                kind: "model",
                text,
            }],
        });
    }
    Ok(out)
}

/// Agent demonstrations with the rubric bank's `<reference_examples>` block prepended to the
/// question, exactly as a meta-policy run injects it (`Retrieved::inject`), so a warm start has
/// seen the block before RL puts it in front of every question (without such rows the smoke
/// model's rollouts under injection fell to reward 0: BENCHMARKS.md, issue 25 session 37). The
/// items are the offline teacher's post-mortems of full attempts (`reflection_rows`' rows
/// without a cut): every second row gets its own task's item (the `within` block of a replayed
/// question; skipped when its task has none), the others the `top_k` items of other tasks
/// nearest to the question by `embedder`, as a run retrieves them (`BankIndex::top_k`, the
/// run's `reflection.top_k` and embedder). Nearest, not arbitrary: a run puts a report task's
/// item in front of a report task, and a warm start that had only seen other kinds' items
/// there doubled its share of attempts cut at the budget on four-hop report tasks
/// (BENCHMARKS.md, issue 25 session 42). Each item is cut to `max_item_chars` as a run injects
/// it (`reflection.max_item_chars`; 0 = whole). No rows when fewer than `top_k + 1` items exist.
pub async fn injected_rows(
    tasks: &[WorldTask],
    rows: &[SftRow],
    reflections: &[SftRow],
    max_item_chars: usize,
    top_k: usize,
    embedder: &crate::infra::embed::Embedder,
) -> Result<Vec<SftRow>, crate::domain::bank::BankError> {
    use crate::domain::bank::{BankIndex, BankItem, Retrieved, question_hash};
    let queries: HashMap<&str, &str> = tasks
        .iter()
        .map(|t| (t.id.as_str(), t.query.as_str()))
        .collect();
    let own: Vec<(&str, crate::domain::reflection::Blocks)> = reflections
        .iter()
        .filter_map(|r| {
            let id = r.id.strip_suffix("#reflect")?;
            let blocks = crate::domain::reflection::parse(&r.segments.first()?.text)?;
            Some((*queries.get(id)?, blocks))
        })
        .collect();
    let mut out = Vec::new();
    if top_k == 0 || own.len() <= top_k {
        return Ok(out);
    }
    let asked: Vec<Option<&str>> = rows
        .iter()
        .map(|r| queries.get(r.id.as_str()).copied())
        .collect();
    // Each distinct question once, in one embedding call: the items' and the cross rows'.
    let distinct: std::collections::BTreeSet<&str> = own
        .iter()
        .map(|(q, _)| *q)
        .chain(asked.iter().skip(1).step_by(2).flatten().copied())
        .collect();
    let texts: Vec<String> = distinct.iter().map(|q| q.to_string()).collect();
    let embs: HashMap<&str, Vec<f32>> = distinct
        .into_iter()
        .zip(embedder.embed(&texts).await?)
        .collect();
    let mut index = BankIndex::default();
    for (n, (question, blocks)) in own.iter().enumerate() {
        index.upsert(BankItem {
            // Distinct per item: the index keeps one item per task.
            task_id: uuid::Uuid::from_u128(n as u128 + 1),
            question_sha256: question_hash(question),
            question: question.to_string(),
            embedding: embs.get(question).cloned().unwrap_or_default(),
            rubrics: blocks.rubrics.clone(),
            takeaways: blocks.takeaways.clone(),
            score: 0.0,
            step: 0,
            reflection_id: None,
        })?;
    }
    for (i, (row, question)) in rows.iter().zip(asked).enumerate() {
        let Some(question) = question else {
            continue;
        };
        let hash = question_hash(question);
        // As a run looks memory up: its own item by the question's hash, or the nearest others.
        let got = if i % 2 == 0 {
            let Some(item) = index.within(&hash) else {
                continue;
            };
            Retrieved::Within(item.clone())
        } else {
            let Some(emb) = embs.get(question) else {
                continue;
            };
            let near = index.top_k(emb, top_k, uuid::Uuid::nil(), &hash)?;
            Retrieved::Cross(near.into_iter().map(|(it, s)| (it.clone(), s)).collect())
        };
        let mut r = row.clone();
        let got = got.clipped(max_item_chars);
        for m in r.messages.iter_mut().filter(|m| m.role == "user") {
            m.content = got.inject(&m.content)?;
        }
        r.id = format!("{}#{}", row.id, got.mode().as_str());
        out.push(r);
    }
    Ok(out)
}
