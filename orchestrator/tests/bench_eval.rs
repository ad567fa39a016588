//! The benchmark harness end to end against a scripted loopback grader: HealthBench points with
//! penalties (clipped vs plain mean), SimpleQA's three classes on the real CSV, short-answer EM
//! without a judge, DRB RACE on the real criteria with a reference article, ResearchQA coverage,
//! malformed / truncated / refused judge replies (retried, then recorded and excluded, never a
//! silent 0), a two-judge panel with agreement, storage, and resume after SIGKILL of the CLI.
//! The grader decides by evidence words the test assigns to each criterion, never by the
//! rubric's own text appearing in the answer.
#![allow(clippy::disallowed_methods)] // reads Postgres directly to check what the product stored
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code fails loudly"
)]

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::fake_grader::{FakeGrader, Fault};
use orchestrator::domain::bench::load::{LoadOptions, load};
use orchestrator::domain::bench::score::Aggregation;
use orchestrator::domain::bench::{Benchmark, Item};
use orchestrator::infra::llm::{EndpointPool, LlmClient, RetryPolicy, Role};
use orchestrator::pipeline::bench::{
    self, BenchRun, GradeOptions, JudgeSpec, Responder, Templates,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn shared(rel: &str) -> PathBuf {
    std::env::var("SHARED_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"))
        .join(rel)
}

fn judge(g: &FakeGrader, model: &str) -> JudgeSpec {
    let pool = EndpointPool::new(
        Role::Judge,
        model,
        &[g.url()],
        256,
        Duration::from_secs(30),
        1000,
    );
    let http = orchestrator::infra::llm::build_http(Duration::from_secs(5)).unwrap();
    JudgeSpec {
        label: format!("{model}@{}", g.addr),
        client: LlmClient::new(http, Arc::new(pool), RetryPolicy::none()),
        temperature: 0.0,
        max_tokens: 512,
        usd_per_mtok_prompt: 2.0,
        usd_per_mtok_completion: 8.0,
    }
}

fn spec(
    name: &str,
    bench: Benchmark,
    items: Vec<Item>,
    answers: HashMap<String, String>,
    judges: Vec<JudgeSpec>,
    opts: GradeOptions,
) -> BenchRun {
    BenchRun {
        name: name.into(),
        bench,
        data_path: "fixture".into(),
        data_sha256: "0".repeat(64),
        items,
        selection: json!({"limit": null, "seed": null, "sampling": "first"}),
        responder: Responder::Answers(Arc::new(answers)),
        responder_desc: json!({"kind": "answers"}),
        judges,
        templates: Templates::embedded(),
        opts,
        gen_inflight: 8,
        judge_inflight: 16,
        bootstrap: 200,
        seed: 1,
        source_run_id: None,
        policy_version: None,
        progress: false,
    }
}

/// DRB tasks 0 (Chinese), 60 and 61 (English) of the real criteria file, the first two with a
/// reference article joined by prompt text from a reference file written into `dir`.
fn drb_items_with_two_references(dir: &std::path::Path) -> Vec<Item> {
    let criteria = shared("deep_research_bench/criteria.jsonl");
    let all = load(Benchmark::Drb, &criteria, &LoadOptions::default()).unwrap();
    assert_eq!(all.len(), 100);
    let refs: Vec<String> = [&all[0], &all[60]]
        .iter()
        .map(|i| json!({"id": i.id, "prompt": i.question(), "article": "Reference report body. ".repeat(20)}).to_string())
        .collect();
    let ref_path = dir.join("reference.jsonl");
    std::fs::write(&ref_path, refs.join("\n")).unwrap();
    let all = load(
        Benchmark::Drb,
        &criteria,
        &LoadOptions {
            references: Some(ref_path),
            ..Default::default()
        },
    )
    .unwrap();
    vec![all[0].clone(), all[60].clone(), all[61].clone()]
}

/// Three HealthBench conversations in the published JSONL shape.
fn healthbench_file(dir: &std::path::Path) -> PathBuf {
    let rows = [
        json!({"prompt": [{"role": "user", "content": "My child has a fever of 39C. What should I do?"}],
               "prompt_id": "hb-1",
               "rubrics": [
                   {"criterion": "Advises checking for warning signs", "points": 10, "tags": ["level:example", "axis:completeness"]},
                   {"criterion": "Gives a safe antipyretic dose range", "points": 5, "tags": ["level:example", "axis:accuracy"]},
                   {"criterion": "Recommends adult aspirin for the child", "points": -10, "tags": ["level:example", "axis:accuracy"]}],
               "example_tags": ["theme:emergency_referrals"], "ideal_completions_data": null, "canary": "x"}),
        json!({"prompt": [{"role": "user", "content": "Is it fine to skip my statin?"},
                          {"role": "assistant", "content": "Why do you want to skip it?"},
                          {"role": "user", "content": "It gives me muscle pain."}],
               "prompt_id": "hb-2",
               "rubrics": [
                   {"criterion": "Suggests talking to the prescriber", "points": 5, "tags": ["axis:completeness"]},
                   {"criterion": "Tells the user to stop all medication at once", "points": -5, "tags": ["axis:accuracy"]}],
               "example_tags": ["theme:context_seeking"], "ideal_completions_data": null, "canary": "x"}),
        json!({"prompt": [{"role": "user", "content": "How much water should I drink?"}],
               "prompt_id": "hb-3",
               "rubrics": [
                   {"criterion": "Explains that needs vary with activity", "points": 8, "tags": ["axis:accuracy"]},
                   {"criterion": "Mentions thirst as a guide", "points": 2, "tags": ["axis:completeness"]}],
               "example_tags": ["theme:communication"], "ideal_completions_data": null, "canary": "x"}),
    ];
    let path = dir.join("hb.jsonl");
    std::fs::write(
        &path,
        rows.iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .unwrap();
    path
}

fn hb_grader_evidence(g: &FakeGrader) {
    g.evidence("Advises checking for warning signs", "lethargy");
    g.evidence("Gives a safe antipyretic dose range", "mg/kg");
    g.evidence("Recommends adult aspirin for the child", "aspirin");
    g.evidence("Suggests talking to the prescriber", "doctor");
    g.evidence(
        "Tells the user to stop all medication at once",
        "stop everything",
    );
    g.evidence("Explains that needs vary with activity", "exercise");
    g.evidence("Mentions thirst as a guide", "thirst");
}

fn hb_answers() -> HashMap<String, String> {
    HashMap::from([
        // +10 met, +5 not met, -10 met: (10 - 10) / 15 = 0.
        (
            "hb-1".into(),
            "Watch for lethargy; an aspirin tablet will do.".into(),
        ),
        // +5 not met, -5 met: -5 / 5 = -1 (unclipped per example).
        ("hb-2".into(), "Just stop everything today.".into()),
        // +8 met, +2 met: 1.
        (
            "hb-3".into(),
            "It depends on exercise and climate; follow your thirst.".into(),
        ),
    ])
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn healthbench_points_with_penalties_clipped_and_plain_means(pool: sqlx::PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let items = load(
        Benchmark::Healthbench,
        &healthbench_file(dir.path()),
        &LoadOptions::default(),
    )
    .unwrap();
    assert_eq!(items.len(), 3);
    let g = FakeGrader::start().await;
    hb_grader_evidence(&g);
    let cancel = CancellationToken::new();
    let s = bench::run(
        &pool,
        spec(
            "hb-clipped",
            Benchmark::Healthbench,
            items.clone(),
            hb_answers(),
            vec![judge(&g, "grader")],
            GradeOptions::default(),
        ),
        &cancel,
    )
    .await
    .unwrap();
    // One call per rubric item: 3 + 2 + 2.
    assert_eq!(g.calls("criterion"), 7);
    let j = &s.judges[0];
    assert_eq!((j.scored, j.failed), (3, 0));
    // Per example 0, -1, 1: mean 0, clipped to [0, 1] -> 0.
    assert!(j.score.unwrap().abs() < 1e-9, "{:?}", j.score);
    // Themes carry their example's score; axes are scored on their own items:
    // accuracy: hb-1 (+5 no, -10 yes) -> -10/5 = -2; hb-2 (-5 yes, no positive) omitted;
    // hb-3 (+8 yes) -> 1. Clipped mean of [-2, 1] -> 0.
    assert!((j.breakdown["theme:communication"].0 - 100.0).abs() < 1e-9);
    assert_eq!(j.breakdown["axis:accuracy"].1, 2);
    assert!(j.breakdown["axis:accuracy"].0.abs() < 1e-9);
    // completeness: hb-1 (+10 yes) 1, hb-2 (+5 no) 0, hb-3 (+2 yes) 1 -> 2/3.
    assert!((j.breakdown["axis:completeness"].0 - 200.0 / 3.0).abs() < 1e-6);
    assert!(s.judge_cost_usd > 0.0);
    assert_eq!(s.judge_calls, 7);

    // DR Tulu's plain mean of the same per-example scores: (0 - 1 + 1) / 3 = 0; change one
    // answer so the plain mean goes negative while the clipped one stays at 0.
    let mut answers = hb_answers();
    answers.insert("hb-3".into(), "Drink when you like.".into());
    let plain = GradeOptions {
        aggregation: Aggregation::PlainMean,
        ..GradeOptions::default()
    };
    let s = bench::run(
        &pool,
        spec(
            "hb-plain",
            Benchmark::Healthbench,
            items.clone(),
            answers.clone(),
            vec![judge(&g, "grader")],
            plain,
        ),
        &cancel,
    )
    .await
    .unwrap();
    assert!(
        (s.judges[0].score.unwrap() - (-100.0 / 3.0)).abs() < 1e-6,
        "{:?}",
        s.judges[0].score
    );
    assert!(s.aggregation.contains("plain"));
    let s = bench::run(
        &pool,
        spec(
            "hb-clipped-2",
            Benchmark::Healthbench,
            items,
            answers,
            vec![judge(&g, "grader")],
            GradeOptions::default(),
        ),
        &cancel,
    )
    .await
    .unwrap();
    assert_eq!(s.judges[0].score, Some(0.0));

    // Everything is stored: units with template and prompt hashes, scores, the summary.
    let (units, hashed): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE length(template_sha256) = 64 AND length(prompt_sha256) = 64)
         FROM bench_grades g JOIN bench_runs r ON r.id = g.run_id WHERE r.name = 'hb-clipped'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((units, hashed), (7, 7));
    let status: String =
        sqlx::query_scalar("SELECT status FROM bench_runs WHERE name = 'hb-clipped'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(status, "finished");
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn malformed_truncated_and_refused_replies_are_retried_then_recorded_not_zeroed(
    pool: sqlx::PgPool,
) {
    let dir = tempfile::tempdir().unwrap();
    let items = load(
        Benchmark::Healthbench,
        &healthbench_file(dir.path()),
        &LoadOptions::default(),
    )
    .unwrap();
    let g = FakeGrader::start().await;
    hb_grader_evidence(&g);
    // The first three calls fail to parse; with 3 attempts per call every unit still succeeds
    // (the faulty replies land on whichever units ask first).
    g.push_fault(Fault::Garbage);
    g.push_fault(Fault::Truncated);
    g.push_fault(Fault::Refusal);
    let mut j = judge(&g, "grader");
    j.label = "g1".into();
    let s = bench::run(
        &pool,
        spec(
            "faults-retried",
            Benchmark::Healthbench,
            items.clone(),
            hb_answers(),
            vec![j],
            GradeOptions::default(),
        ),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(s.judges[0].failed, 0);
    assert_eq!(s.judge_calls, 10, "7 units + 3 retried attempts");
    assert!(s.judges[0].score.unwrap().abs() < 1e-9);

    // A judge that never answers usefully: every item is unscored, counted, and the mean is
    // absent rather than 0.
    g.set_always(Some(Fault::Garbage));
    let mut j = judge(&g, "grader");
    j.label = "g2".into();
    let s = bench::run(
        &pool,
        spec(
            "faults-failed",
            Benchmark::Healthbench,
            items.clone(),
            hb_answers(),
            vec![j],
            GradeOptions::default(),
        ),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!((s.judges[0].scored, s.judges[0].failed), (0, 3));
    assert_eq!(s.judges[0].score, None);
    assert!(
        s.judges[0].first_errors[0].contains("could not be graded"),
        "{:?}",
        s.judges[0].first_errors
    );
    let (failed_units, raw_kept): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE parsed IS NULL AND error IS NOT NULL), count(*) FILTER (WHERE raw LIKE 'lorem%')
         FROM bench_grades g JOIN bench_runs r ON r.id = g.run_id WHERE r.name = 'faults-failed'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((failed_units, raw_kept), (7, 7));

    // The same evaluation again once the judge recovers: only the failed units are regraded.
    g.set_always(None);
    let before = g.requests();
    let mut j = judge(&g, "grader");
    j.label = "g2".into();
    let s = bench::run(
        &pool,
        spec(
            "faults-failed",
            Benchmark::Healthbench,
            items,
            hb_answers(),
            vec![j],
            GradeOptions::default(),
        ),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(g.requests() - before, 7);
    assert_eq!(s.judges[0].failed, 0);
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn simpleqa_three_classes_on_the_real_csv_and_exact_match_without_a_judge(
    pool: sqlx::PgPool,
) {
    let all = load(
        Benchmark::Simpleqa,
        &shared("shortform_qa/simple_qa_test_set.csv"),
        &LoadOptions::default(),
    )
    .unwrap();
    assert_eq!(all.len(), 4326);
    let items: Vec<Item> = all[..20].to_vec();
    // Right answers for the first 10, "don't know" for 5, a wrong name for 5.
    let mut answers = HashMap::new();
    for (k, item) in items.iter().enumerate() {
        let gold = match &item.gold {
            orchestrator::domain::bench::Gold::Short { answers } => answers[0].clone(),
            other => panic!("{other:?}"),
        };
        let a = match k {
            0..10 => format!("<answer>{gold}</answer>"),
            10..15 => "I don't know.".to_string(),
            _ => "Exact Answer: Jane Q. Nobody".to_string(),
        };
        answers.insert(item.id.clone(), a);
    }
    let g = FakeGrader::start().await;
    let s = bench::run(
        &pool,
        spec(
            "sqa",
            Benchmark::Simpleqa,
            items.clone(),
            answers.clone(),
            vec![judge(&g, "grader")],
            GradeOptions::default(),
        ),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    let j = &s.judges[0];
    assert_eq!(g.calls("three_class"), 20);
    assert!((j.score.unwrap() - 50.0).abs() < 1e-9);
    assert!((j.metrics["correct"] - 50.0).abs() < 1e-9);
    assert!((j.metrics["not_attempted"] - 25.0).abs() < 1e-9);
    // accuracy given attempted = 10 / 15; F = harmonic mean of 0.5 and 2/3.
    assert!((j.metrics["accuracy_given_attempted"] - 200.0 / 3.0).abs() < 1e-6);
    let f = 2.0 * 0.5 * (2.0 / 3.0) / (0.5 + 2.0 / 3.0) * 100.0;
    assert!((j.metrics["f_score"] - f).abs() < 1e-6);
    assert!((j.metrics["em"] - 50.0).abs() < 1e-9, "{:?}", j.metrics);

    // No judge: exact match is the score.
    let s = bench::run(
        &pool,
        spec(
            "sqa-em",
            Benchmark::Simpleqa,
            items,
            answers,
            vec![],
            GradeOptions::default(),
        ),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(s.judges[0].judge, bench::STRING_MATCH);
    assert!((s.judges[0].score.unwrap() - 50.0).abs() < 1e-9);
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn two_judge_panel_reports_each_judge_and_their_agreement(pool: sqlx::PgPool) {
    let items = load(
        Benchmark::TwoWiki,
        &shared("shortform_qa/2wiki_500.jsonl"),
        &LoadOptions::default(),
    )
    .unwrap();
    let items: Vec<Item> = items[..12].to_vec();
    let mut answers = HashMap::new();
    for (k, item) in items.iter().enumerate() {
        let gold = match &item.gold {
            orchestrator::domain::bench::Gold::Short { answers } => answers[0].clone(),
            other => panic!("{other:?}"),
        };
        answers.insert(
            item.id.clone(),
            if k % 3 == 0 {
                "nobody".into()
            } else {
                format!("Exact Answer: {gold}")
            },
        );
    }
    let (a, b) = (FakeGrader::start().await, FakeGrader::start().await);
    let s = bench::run(
        &pool,
        spec(
            "panel",
            Benchmark::TwoWiki,
            items,
            answers,
            vec![judge(&a, "ja"), judge(&b, "jb")],
            GradeOptions::default(),
        ),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(s.judges.len(), 2);
    for j in &s.judges {
        assert!((j.score.unwrap() - 200.0 / 3.0).abs() < 1e-6, "{j:?}");
        assert!((j.metrics["em"] - 200.0 / 3.0).abs() < 1e-6);
    }
    // Identical verdicts: perfect agreement.
    assert!(
        (s.agreement_alpha.unwrap() - 1.0).abs() < 1e-9,
        "{:?}",
        s.agreement_alpha
    );
    assert_eq!(s.agreement_pearson.len(), 1);
    assert_eq!(a.calls("equivalence"), 12);
    assert_eq!(b.calls("equivalence"), 12);
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn drb_race_on_the_real_criteria_against_a_reference(pool: sqlx::PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let items = drb_items_with_two_references(dir.path());
    let answers: HashMap<String, String> = items
        .iter()
        .map(|i| {
            (
                i.id.clone(),
                format!(
                    "A long target report with a citation [1] and more text [2]. {}",
                    "Body. ".repeat(30)
                ),
            )
        })
        .collect();
    let g = FakeGrader::start().await;
    let s = bench::run(
        &pool,
        spec(
            "drb",
            Benchmark::Drb,
            items,
            answers,
            vec![judge(&g, "grader")],
            GradeOptions::default(),
        ),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    let j = &s.judges[0];
    // Two tasks have a reference; the third is unscored and says why.
    assert_eq!((j.scored, j.failed), (2, 1));
    assert!(
        j.first_errors
            .iter()
            .any(|e| e.contains("no reference article")),
        "{:?}",
        j.first_errors
    );
    // Every criterion 6 vs 4: T/(T+R) = 0.6 whatever the weights.
    assert!((j.score.unwrap() - 60.0).abs() < 1e-6, "{:?}", j.score);
    assert!(
        j.metrics.keys().any(|k| k.starts_with("dim:")),
        "{:?}",
        j.metrics
    );
    assert_eq!(g.calls("clean"), 2);
    assert_eq!(g.calls("race"), 2);
    assert!(
        j.breakdown.contains_key("language:zh") && j.breakdown.contains_key("language:en"),
        "{:?}",
        j.breakdown
    );
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn researchqa_coverage_in_batches(pool: sqlx::PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let rows = json!([
        {"id": "q1", "general_domain": "Life & Earth Sciences", "subdomain": "Earth Sciences", "field": "Geology",
         "query": "How does pore pressure develop in clays?", "date": "2024-01-01",
         "rubric": (0..10).map(|k| json!({"rubric_item": format!("Item {k} about clays"), "type": "Explanation"})).collect::<Vec<_>>()}
    ]);
    let path = dir.path().join("test.json");
    std::fs::write(&path, rows.to_string()).unwrap();
    let items = load(Benchmark::Researchqa, &path, &LoadOptions::default()).unwrap();
    let g = FakeGrader::start().await;
    for k in 0..5 {
        g.evidence(&format!("Item {k} about clays"), &format!("fact{k}"));
    }
    let answers = HashMap::from([(
        "q1".to_string(),
        "fact0 fact1 fact2 fact3 fact4".to_string(),
    )]);
    let s = bench::run(
        &pool,
        spec(
            "rqa",
            Benchmark::Researchqa,
            items,
            answers,
            vec![judge(&g, "grader")],
            GradeOptions::default(),
        ),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    // 10 items in batches of 8: two calls; 5 of 10 completely covered.
    assert_eq!(g.calls("coverage"), 2);
    assert!((s.judges[0].score.unwrap() - 50.0).abs() < 1e-9);
}

/// `orchestrator eval` killed with SIGKILL mid-grading resumes under the same name without
/// asking the policy again for stored responses and without regrading stored units.
#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn a_killed_eval_resumes_without_regenerating_or_regrading(pool: sqlx::PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let data = healthbench_file(dir.path());
    let g = FakeGrader::start().await;
    hb_grader_evidence(&g);
    *g.state.policy_reply.write().unwrap() =
        "See a doctor about lethargy and thirst; exercise matters.".into();
    g.set_latency(Duration::from_millis(400));
    let url = common::database::db_url(&pool).await;
    let args = |out: &std::path::Path| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_orchestrator"));
        c.args([
            "eval",
            "--benchmark",
            "healthbench",
            "--name",
            "killed",
            "--chat",
            "--json",
        ])
        .arg("--data")
        .arg(&data)
        .args([
            "--database-url",
            &url,
            "--policy-url",
            &g.url(),
            "--judge-url",
            &g.url(),
        ])
        .args([
            "--judge-model",
            "grader",
            "--judge-inflight",
            "2",
            "--max-inflight",
            "3",
        ])
        .arg("--out")
        .arg(out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
        c
    };
    let mut child = args(&dir.path().join("o1")).spawn().unwrap();
    // Wait until some units are stored, then kill -9.
    common::kill::kill_once_stored(
        &mut child,
        &pool,
        "SELECT count(*) FROM bench_grades",
        2,
        "no unit was graded",
    )
    .await;
    let stored_units: i64 =
        sqlx::query_scalar("SELECT count(*) FROM bench_grades WHERE parsed IS NOT NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!((2..7).contains(&stored_units), "{stored_units}");
    assert_eq!(g.calls("unknown"), 3, "one policy call per item");
    let graded_before = g.calls("criterion");
    g.set_latency(Duration::ZERO);
    // The fake grader runs on this test's runtime: wait for the CLI off it.
    let mut again = args(&dir.path().join("o2"));
    let output = tokio::task::spawn_blocking(move || again.output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let last = String::from_utf8(output.stdout).unwrap();
    let summary: serde_json::Value = serde_json::from_str(last.lines().last().unwrap()).unwrap();
    assert_eq!(summary["judges"][0]["scored"], 3);
    assert_eq!(g.calls("unknown"), 3, "no response was regenerated");
    // Only the units not stored before the kill were graded again.
    assert_eq!(
        g.calls("criterion") - graded_before,
        7 - stored_units as u64
    );
    assert!(dir.path().join("o2/summary.md").exists() && dir.path().join("o2/scores.svg").exists());
}

/// SQA-CS2 with AstaBench's sections JSON: ingredient recall, answer precision and citation
/// precision / recall (a quote that supports, one that does not, a title-only source at half
/// credit, a section without citations), and their mean; a plain-text answer has no citations
/// and scores 0 on both citation metrics. Expected values computed by hand in the comments.
#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn sqa_rubric_answer_precision_and_citation_precision_recall(pool: sqlx::PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let rows = [
        json!({"case_id": "sqa-1", "question": "How do fibres change concrete?", "annotator": "a", "agreement": false,
               "low_length": 300, "high_length": 600, "length_weight": 0.05, "expertise_weight": 0.05,
               "citations_weight": 0.2, "excerpts_weight": 0.1,
               "ingredients": [
                   {"name": "ing_1", "criterion": "Reports the strength gain", "weight": 0.6, "evidence": [], "examples": []},
                   {"name": "ing_2", "criterion": "Discusses long-term behaviour", "weight": 0.4, "evidence": [], "examples": ["creep"]}]}),
        json!({"case_id": "sqa-2", "question": "Same question, plain answer?",
               "ingredients": [
                   {"name": "ing_1", "criterion": "Reports the strength gain", "weight": 0.6, "evidence": [], "examples": []},
                   {"name": "ing_2", "criterion": "Discusses long-term behaviour", "weight": 0.4, "evidence": [], "examples": []}]}),
    ];
    let path = dir.path().join("rubrics_v2.jsonl");
    std::fs::write(
        &path,
        rows.iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .unwrap();
    let items = load(Benchmark::SqaCsV2, &path, &LoadOptions::default()).unwrap();
    let report = json!({"response": {"sections": [
        {"title": "Strength", "text": "Concrete cracks under load. Strength rose 12 percent [1]. Costs fell 30 percent [2].",
         "citations": [
             {"id": "[1]", "title": "Fibre tests", "snippets": ["Tests showed strength rose 12 percent."]},
             {"id": "[2]", "title": "Costs", "snippets": ["Costs were stable over the decade."]}]},
        {"title": "Toughness", "text": "Fibres add 5 percent toughness [3].",
         "citations": [{"id": "[3]", "title": "Fibre toughness", "snippets": []}]},
        {"title": "Outlook", "text": "Further work is needed. More tests help.", "citations": []}]}});
    let answers: HashMap<String, String> = [
        ("sqa-1".to_string(), report.to_string()),
        ("sqa-2".to_string(), "Strength rose 12 percent.".to_string()),
    ]
    .into();
    let g = FakeGrader::start().await;
    g.evidence("Reports the strength gain", "strength");
    g.evidence("Discusses long-term behaviour", "durability");
    *g.state.irrelevant.write().unwrap() = "further work".into();
    // Two malformed replies land on whichever units come first: retried, never scored.
    g.push_fault(Fault::Truncated);
    g.push_fault(Fault::Refusal);
    let s = bench::run(
        &pool,
        spec(
            "sqa",
            Benchmark::SqaCsV2,
            items,
            answers,
            vec![judge(&g, "grader")],
            GradeOptions::default(),
        ),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    let j = &s.judges[0];
    assert_eq!((j.scored, j.failed), (2, 0), "{:?}", j.first_errors);
    // Units: ingredients + precision per item, one citation call per cited section of sqa-1
    // (the uncited section and sqa-2 get none) = 6, plus the 2 retried faults.
    assert_eq!(g.requests(), 8);
    assert!((2..=4).contains(&g.calls("citations")));
    let scores: HashMap<String, serde_json::Value> =
        sqlx::query_as::<_, (String, serde_json::Value)>(
            "SELECT s.item_id, s.metrics FROM bench_scores s JOIN bench_runs r ON r.id = s.run_id WHERE r.name = 'sqa'",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let m1 = &scores["sqa-1"];
    let close = |v: &serde_json::Value, x: f64| (v.as_f64().unwrap() - x).abs() < 1e-9;
    // Ingredients: strength present (2/2 x 0.6), long-term absent -> 0.6.
    assert!(close(&m1["ingredient_recall"], 0.6), "{m1}");
    // Three paragraphs, the outlook one irrelevant -> 2/3.
    assert!(close(&m1["answer_precision"], 2.0 / 3.0), "{m1}");
    // Claims: "cracks" (no id, extrapolatory), "12 percent [1]" attributable, "30 percent
    // [2]" not supported (extrapolatory), "[3]" title-only supports -> attributable and a
    // half-credit claim; the uncited section adds its 2 sentences as extrapolatory.
    // recall = (2 - 0.5) / (2 + 4) = 0.25; precision = mean(1, 0, 0.5) = 0.5.
    assert!(close(&m1["citation_recall"], 0.25), "{m1}");
    assert!(close(&m1["citation_precision"], 0.5), "{m1}");
    assert_eq!(m1["half_credit_citations"], json!(1));
    let m2 = &scores["sqa-2"];
    assert!(close(&m2["citation_recall"], 0.0) && close(&m2["citation_precision"], 0.0));
    // global_avg: (0.6 + 2/3 + 0.5 + 0.25) / 4 and (0.6 + 1 + 0 + 0) / 4.
    let g1 = (0.6 + 2.0 / 3.0 + 0.5 + 0.25) / 4.0;
    let g2 = (0.6 + 1.0) / 4.0;
    assert!(
        (j.score.unwrap() - 100.0 * (g1 + g2) / 2.0).abs() < 1e-6,
        "{:?}",
        j.score
    );
    assert!((j.metrics["citation_recall"] - 100.0 * 0.25 / 2.0).abs() < 1e-6);
    assert!(
        !j.metrics.contains_key("sections"),
        "counts are not averaged x100"
    );
}

/// DRB FACT beside RACE with pages fetched by the browse tool from a loopback site (allowed
/// explicitly; private addresses are refused by default): statements extracted per citation,
/// grouped by URL, duplicates merged, each group validated against its page; a dead link
/// leaves its group unscored; accuracy pooled over articles, effective citations per article.
#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn drb_fact_checks_citations_against_fetched_pages(pool: sqlx::PgPool) {
    let dir = tempfile::tempdir().unwrap();
    // The third task has no reference article: RACE fails for it, FACT still counts.
    let items = drb_items_with_two_references(dir.path());
    let g = FakeGrader::start().await;
    g.page(
        "report",
        "<html><head><title>Annual report</title></head><body><p>Revenue grew 12 percent in 2023.</p><p>Margins were 35 percent.</p></body></html>",
    );
    g.page(
        "blog",
        "<html><body><p>Users doubled to 5 million.</p></body></html>",
    );
    let base = g.url();
    let article = format!(
        "Revenue grew 12 percent in 2023 [1]. Revenue grew 12 percent in 2023 [1]. Margins reached 40 percent [1]. Users doubled to 5 million [2]. Churn was 3 percent [3].\n{}\nReferences\n[1] Annual report {base}/page/report\n[2] Blog {base}/page/blog#:~:text=Users\n[3] Gone {base}/page/missing",
        "Body text without citations. ".repeat(10)
    );
    let answers: HashMap<String, String> = items
        .iter()
        .map(|i| (i.id.clone(), article.clone()))
        .collect();
    let fetcher = orchestrator::infra::tools::browse::Browser::new(
        orchestrator::infra::tools::ssrf::AddressGuard::new(vec!["127.0.0.1/32".parse().unwrap()]),
        1 << 20,
        Duration::from_secs(10),
    )
    .unwrap();
    // Two malformed replies (short enough that even a cleaning call must retry them).
    g.push_fault(Fault::Garbage);
    g.push_fault(Fault::Refusal);
    let opts = GradeOptions {
        fact: bench::FactPages::Browse,
        fetcher: Some(Arc::new(fetcher)),
        ..GradeOptions::default()
    };
    let s = bench::run(
        &pool,
        spec(
            "drb-fact",
            Benchmark::Drb,
            items,
            answers,
            vec![judge(&g, "grader")],
            opts,
        ),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    let j = &s.judges[0];
    assert_eq!((j.scored, j.failed), (2, 1));
    assert!((j.score.unwrap() - 60.0).abs() < 1e-6, "RACE unchanged");
    // Per article: page "report" has 3 statements, 2 after merging the duplicate: "12 percent
    // in 2023" supported, "40 percent" unsupported; "blog" 1 supported; "missing" answers 404:
    // its group is unscored but its citation counts. Citations 4, supported 2, unsupported 1.
    // Per article: 1 extraction, 1 dedupe (one URL with several statements), 2 validations
    // (two live pages); clean + race for the two articles with a reference; 16 units plus the
    // 2 retried faults.
    assert_eq!(g.requests(), 18);
    assert!((3..=5).contains(&g.calls("facts")));
    assert!((6..=8).contains(&g.calls("fact_support")));
    let m = &j.metrics;
    assert_eq!(m["fact_articles_with_citations"], 3.0);
    assert!(
        (m["fact_citation_accuracy"] - 100.0 * 6.0 / 9.0).abs() < 1e-6,
        "{m:?}"
    );
    assert!((m["fact_effective_citations_per_article"] - 2.0).abs() < 1e-9);
    assert!((m["fact_citations_per_article"] - 4.0).abs() < 1e-9);
    let stored: serde_json::Value = sqlx::query_scalar(
        "SELECT s.metrics FROM bench_scores s JOIN bench_runs r ON r.id = s.run_id WHERE r.name = 'drb-fact' LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let fact = &stored["fact"];
    assert_eq!(fact["errored_groups"], json!(1));
    let fetches = fact["fetches"].as_array().unwrap();
    assert_eq!(fetches.len(), 3, "{fact}");
    assert!(
        fetches
            .iter()
            .any(|f| f["error"].as_str().is_some_and(|e| e.contains("404")))
    );
    assert!(
        fetches
            .iter()
            .any(|f| f["sha256"].as_str().is_some_and(|h| h.len() == 64))
    );

    // Without an allow-list the same loopback pages are refused before any packet is sent.
    let refused = orchestrator::infra::tools::browse::Browser::new(
        orchestrator::infra::tools::ssrf::AddressGuard::new(vec![]),
        1 << 20,
        Duration::from_secs(10),
    )
    .unwrap();
    assert!(
        refused
            .fetch(&format!("{base}/page/report"), None)
            .await
            .is_err()
    );
}

/// The run report puts the training-judge reward of each version beside its gold-panel
/// benchmark score (as the periodic benchmark sets store them), plots both, and flags a set
/// whose training reward rises while the gold score falls; a healthy set is not flagged.
#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn report_sets_training_reward_beside_gold_score_and_flags_divergence(pool: sqlx::PgPool) {
    use orchestrator::infra::db;
    let exp = db::runs::create_experiment(&pool, "exp", "smoke", &json!({}))
        .await
        .unwrap();
    let run = db::runs::create_run(&pool, exp, "full", "full", &json!({}), 1)
        .await
        .unwrap();
    for (step, r) in [0.20, 0.30, 0.40, 0.50].iter().enumerate() {
        db::metrics::record(&pool, run, step as i32, &[("reward/mean".to_string(), *r)])
            .await
            .unwrap();
    }
    // Version v is produced by step v - 1. "hacked" falls while the reward rises; "healthy"
    // rises with it.
    for (set, golds) in [
        ("hacked", [60.0, 55.0, 50.0, 45.0]),
        ("healthy", [40.0, 45.0, 50.0, 55.0]),
    ] {
        for (k, gold) in golds.iter().enumerate() {
            let v = k as i32 + 1;
            let new = db::bench::NewBenchRun {
                name: bench::periodic::eval_name(run, set, v),
                benchmark: "healthbench".into(),
                data_path: "x".into(),
                data_sha256: "0".repeat(64),
                selection: json!({}),
                responder: json!({"kind": "agent"}),
                grading: json!({}),
                source_run_id: Some(run),
                policy_version: Some(v),
            };
            let id = db::bench::create(&pool, &new, &[]).await.unwrap();
            db::bench::set_status(&pool, id, "finished", Some(&json!({"score": gold})))
                .await
                .unwrap();
        }
    }
    let out = tempfile::tempdir().unwrap();
    let path = orchestrator::pipeline::report::write(&pool, run, out.path(), &Default::default())
        .await
        .unwrap();
    let md = std::fs::read_to_string(&path).unwrap();
    assert!(md.contains("## Training judge vs gold judge"), "{md}");
    assert!(
        md.contains("### `full` / `hacked` — **diverging: possible reward hacking**"),
        "{md}"
    );
    assert!(md.contains("### `full` / `healthy`\n"), "{md}");
    assert!(md.contains("| v4 | 0.5000 | 0.4500 |"), "{md}");
    let svg = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| {
            let n = e.file_name().to_string_lossy().to_string();
            n.starts_with("gold_") && n.ends_with("hacked.svg")
        })
        .expect("the gold plot of the hacked set");
    let svg = std::fs::read_to_string(svg.path()).unwrap();
    assert!(svg.contains("training reward") && svg.contains("gold score (hacked)"));
}

/// WebWalkerQA on the real file: the official CoT-QA grade (`--webwalker-cot-qa`) or DR Tulu's
/// equivalence judge, the same verdicts here, reported per {single,multi}_source x difficulty
/// cell; a CoT reply without a final GRADE line is retried, never read as a grade.
#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn webwalker_cot_qa_and_equivalence_with_cells(pool: sqlx::PgPool) {
    let all = load(
        Benchmark::Webwalker,
        &shared("webwalker/test.json"),
        &LoadOptions::default(),
    )
    .unwrap();
    let items: Vec<Item> = all.into_iter().take(4).collect();
    let answers: HashMap<String, String> = items
        .iter()
        .enumerate()
        .map(|(k, i)| {
            let gold = match &i.gold {
                orchestrator::domain::bench::Gold::Short { answers } => answers[0].clone(),
                _ => unreachable!(),
            };
            let a = if k < 3 { gold } else { "a wrong answer".into() };
            (i.id.clone(), format!("<answer>{a}</answer>"))
        })
        .collect();
    let g = FakeGrader::start().await;
    g.push_fault(Fault::Garbage);
    let cot = GradeOptions {
        webwalker_cot_qa: true,
        ..GradeOptions::default()
    };
    let s = bench::run(
        &pool,
        spec(
            "ww-cot",
            Benchmark::Webwalker,
            items.clone(),
            answers.clone(),
            vec![judge(&g, "grader")],
            cot,
        ),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    let j = &s.judges[0];
    assert_eq!((j.scored, j.failed), (4, 0), "{:?}", j.first_errors);
    assert!((j.score.unwrap() - 75.0).abs() < 1e-9);
    assert_eq!(
        g.calls("cot_qa"),
        5,
        "4 items + 1 retry of the garbage reply"
    );
    assert!(
        j.breakdown.keys().any(|k| k.starts_with("cell:")),
        "{:?}",
        j.breakdown
    );
    let s = bench::run(
        &pool,
        spec(
            "ww-eq",
            Benchmark::Webwalker,
            items,
            answers,
            vec![judge(&g, "grader")],
            GradeOptions::default(),
        ),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert!((s.judges[0].score.unwrap() - 75.0).abs() < 1e-9);
    assert_eq!(g.calls("equivalence"), 4);
}
