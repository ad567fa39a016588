//! Evaluation of a policy on a fixed subset, end to end against the loopback fake policy server,
//! the offline lexical judge and real Postgres: a right answer scores above a wrong one and hits
//! the known answer, a policy-server failure is counted as failed (not as a zero), and the evaluation is
//! stored whole (summary and per-task results) and replaced, not duplicated, when redone.
#![allow(clippy::disallowed_methods)] // reads Postgres directly to check what the product stored
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::fake_openai::{FakeServer, Fault, Scripted, ToyCodec};
use orchestrator::domain::config::RolloutConfig;
use orchestrator::domain::judge::lexical::LexicalJudge;
use orchestrator::infra::db;
use orchestrator::infra::llm::Role;
use orchestrator::infra::tools::runner::ToolRunner;
use orchestrator::pipeline::evaluate::{EvalRun, EvalTask, Subset, evaluate};
use orchestrator::pipeline::rollout::{RolloutCtx, RolloutTask};
use tokio_util::sync::CancellationToken;

const PLAN: &str = "<think>Plan it.</think><structured_plan><deep_analysis>two hops</deep_analysis><rubric>Knowledge checklist:\n- the facts</rubric><research_plan>answer directly</research_plan></structured_plan>";

fn ctx(server: &FakeServer) -> RolloutCtx {
    RolloutCtx {
        client: server.client(Role::Policy, "policy"),
        codec: Arc::new(ToyCodec),
        tools: Arc::new(ToolRunner::new(None)),
        cfg: RolloutConfig {
            n: 1,
            tasks_per_step: 1,
            max_tool_calls: 2,
            max_tokens: 4000,
            forced_answer_tokens: Some(200),
            max_prompt_tokens: None,
            repetition_detection: None,
            answer_after_loop: false,
            temperature: 0.0,
            top_p: 1.0,
        },
        seed: Some(3),
        scaffold: orchestrator::domain::scaffold::Scaffold::Rubricem,
    }
}

/// World tasks as task-file rows, stored in `tasks`.
async fn stored_rows(
    pool: &sqlx::PgPool,
    tasks: &[&orchestrator::domain::data::world::WorldTask],
) -> (
    Vec<orchestrator::domain::data::tasks::TaskRow>,
    Vec<uuid::Uuid>,
) {
    let rows: Vec<_> = tasks
        .iter()
        .map(|t| {
            orchestrator::domain::data::tasks::parse_row(&serde_json::to_value(t).unwrap(), "world")
                .unwrap()
        })
        .collect();
    let new: Vec<_> = rows
        .iter()
        .map(orchestrator::infra::db::tasks::from_task_row)
        .collect();
    let ids = db::tasks::upsert(pool, &new).await.unwrap();
    (rows, ids)
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn a_right_answer_outscores_a_wrong_one_and_the_evaluation_is_stored_whole(
    pool: sqlx::PgPool,
) {
    let world = orchestrator::domain::data::world::generate(5, 80, 6);
    let exact: Vec<_> = world
        .tasks
        .iter()
        .filter(|t| t.answer_format == "exact" && !t.rubrics.is_empty())
        .take(3)
        .collect();
    assert_eq!(exact.len(), 3, "the world has exact-answer tasks");
    let (rows, ids) = stored_rows(&pool, &exact).await;
    let tasks = RolloutTask::from_rows(&rows, &ids, "SYS");
    let subset = Subset {
        name: "held-out".into(),
        samples: None,
        temperature: None,
        tasks: rows
            .iter()
            .zip(tasks)
            .map(|(r, t)| EvalTask::new(r, t))
            .collect(),
    };
    assert!(
        subset
            .tasks
            .iter()
            .all(|t| t.answer.is_some() && !t.rubrics.is_empty())
    );

    // Task 0: the known answer and every rubric's key terms. Task 1: a wrong answer.
    // Task 2: the policy server fails (its first request gets a 400; no retries).
    let terms: Vec<String> = exact[0]
        .rubrics
        .iter()
        .flat_map(|r| r.key_terms.clone())
        .collect();
    let right = format!(
        "{PLAN}<answer>The answer is {} ({}). \\boxed{{{}}}</answer>",
        exact[0].answer,
        terms.join(", "),
        exact[0].answer
    );
    let wrong = format!("{PLAN}<answer>I could not find it. \\boxed{{nothing}}</answer>");
    let server = FakeServer::start().await;
    server.push_scripted(Scripted::reply(&right, "stop")).await;
    server.push_scripted(Scripted::reply(&wrong, "stop")).await;
    for f in [
        Fault::Delay(Duration::ZERO),
        Fault::Delay(Duration::ZERO),
        Fault::Status(400),
    ] {
        server.push_fault(f).await;
    }

    let exp = db::runs::create_experiment(&pool, "t", "smoke", &serde_json::json!({}))
        .await
        .unwrap();
    let run_id = db::runs::create_run(&pool, exp, "r", "full", &serde_json::json!({}), 1)
        .await
        .unwrap();
    let judge = LexicalJudge::new("lexical-v1");
    let c = ctx(&server);
    let er = EvalRun {
        run_id,
        version: 2,
        samples: 1,
        // One at a time, in task order, so each scripted reply goes to its task.
        max_inflight: 1,
        ctx: &c,
        judge: &judge,
        gate: None,
    };
    let (row, results) = evaluate(&er, &subset, &CancellationToken::new())
        .await
        .expect("not cancelled");
    assert_eq!(results.len(), 3);
    for (r, t) in results.iter().zip(&subset.tasks) {
        assert_eq!(r.task_id, t.rollout.task_id, "results in task order");
    }
    let (a, b, c0) = (&results[0], &results[1], &results[2]);
    assert_eq!(a.exact, Some(true), "{:?}", a.answer);
    assert_eq!(b.exact, Some(false));
    assert_eq!(c0.exact, None, "a server failure is no miss");
    let (sa, sb) = (a.score.unwrap(), b.score.unwrap());
    assert!(sa > sb, "right {sa} > wrong {sb}");
    assert!((0.0..=1.0).contains(&sa) && (0.0..=1.0).contains(&sb));
    assert_eq!(
        a.rubric_scores.as_array().unwrap().len(),
        subset.tasks[0].rubrics.len(),
        "every persistent rubric scored"
    );
    assert_eq!(c0.answer, None);
    assert_eq!(c0.score, None, "a server failure is not scored as 0");
    assert!(
        c0.error.as_deref().unwrap().contains("400"),
        "{:?}",
        c0.error
    );
    assert!(c0.parse_failed);
    assert!(
        c0.rubric_scores.as_array().unwrap().is_empty(),
        "no judge call"
    );
    assert_eq!(row.tasks, 3);
    assert_eq!((row.judged, row.failed, row.parse_failures), (2, 1, 1));
    assert!((row.exact.unwrap() - 0.5).abs() < 1e-9);
    assert!((row.score.unwrap() - (sa + sb) / 2.0).abs() < 1e-9);
    assert_eq!(row.judge_model, "lexical-v1");

    assert!(
        !db::evaluations::exists(&pool, run_id, 2, "held-out")
            .await
            .unwrap()
    );
    db::evaluations::record(&pool, &row, &results)
        .await
        .unwrap();
    assert!(
        db::evaluations::exists(&pool, run_id, 2, "held-out")
            .await
            .unwrap()
    );
    // Redone (e.g. after a trainer restart): replaced, never duplicated.
    db::evaluations::record(&pool, &row, &results)
        .await
        .unwrap();
    let stored = db::evaluations::for_run(&pool, run_id).await.unwrap();
    assert_eq!(stored, vec![row.clone()]);
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM evaluation_results WHERE run_id = $1 AND policy_version = 2",
    )
    .bind(run_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(n, 3);
    // A cancelled evaluation returns nothing.
    let cancel = CancellationToken::new();
    cancel.cancel();
    assert!(evaluate(&er, &subset, &cancel).await.is_none());
}

/// The report puts each recipe's evaluation scores side by side per subset: a table of runs by
/// policy version (score and exact match) and a PNG and SVG plot over versions.
#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn the_report_shows_recipes_side_by_side_on_each_subset(pool: sqlx::PgPool) {
    let world = orchestrator::domain::data::world::generate(5, 40, 2);
    let (_, ids) = stored_rows(&pool, &world.tasks.iter().collect::<Vec<_>>()).await;
    let cfg = serde_json::json!({"judge": {"kind": "lexical", "model": "lexical-v1"},
                                 "experiment": {"steps": 4}});
    let exp = db::runs::create_experiment(&pool, "ablation", "ablation-600", &cfg)
        .await
        .unwrap();
    let mut runs = Vec::new();
    for (name, base) in [("baseline-rl", 0.10), ("full", 0.30)] {
        let run = db::runs::create_run(&pool, exp, name, name, &cfg, 1)
            .await
            .unwrap();
        for s in 0..4 {
            db::metrics::record(&pool, run, s, &[("reward/answer".into(), 0.1)])
                .await
                .unwrap();
        }
        for (v, bump) in [(0, 0.0), (2, 0.125), (4, 0.25)] {
            let row = db::evaluations::EvalRow {
                run_id: run,
                policy_version: v,
                subset: "held-out".into(),
                judge_model: "lexical-v1".into(),
                tasks: 2,
                samples: 1,
                score: Some(base + bump),
                exact: Some(0.5),
                judged: 2,
                failed: 0,
                parse_failures: 0,
                model_tokens: 10,
                judge_cost_usd: 0.0,
                seconds: 1.0,
            };
            let results: Vec<_> = ids
                .iter()
                .map(|&task_id| db::evaluations::ResultRow {
                    task_id,
                    sample_index: 0,
                    finish_reason: "stop".into(),
                    answer: Some("x\u{0}y".into()),
                    parsed: serde_json::json!({"answer": "x\u{0}y"}),
                    num_model_tokens: 5,
                    tool_calls: 0,
                    parse_failed: false,
                    score: Some(base + bump),
                    rubric_scores: serde_json::json!([]),
                    exact: Some(task_id == ids[0]),
                    error: None,
                })
                .collect();
            db::evaluations::record(&pool, &row, &results)
                .await
                .unwrap();
        }
        orchestrator::pipeline::run::mark(
            &pool,
            run,
            orchestrator::pipeline::run::RunStatus::Completed,
            None,
        )
        .await
        .unwrap();
        runs.push(run);
    }
    // A second seed of `full` that was paused before it trained: left out of the comparison
    // over seeds (it would cut `full`'s versions to v0).
    let paused = db::runs::create_run(&pool, exp, "full-s2", "full", &cfg, 2)
        .await
        .unwrap();
    orchestrator::pipeline::run::mark(
        &pool,
        paused,
        orchestrator::pipeline::run::RunStatus::Paused,
        None,
    )
    .await
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let path = orchestrator::pipeline::report::write(&pool, exp, out.path(), &Default::default())
        .await
        .unwrap();
    let md = std::fs::read_to_string(&path).unwrap();
    assert!(
        md.contains(
            "| full | 1 | v0 0.3000; v2 0.4250; v4 0.5500 | v0 0.500; v2 0.500; v4 0.500 | 0.2500 |"
        ),
        "completed runs compared over seeds: {md}"
    );
    assert!(
        md.contains("| baseline-rl | 1 | v0 0.1000; v2 0.2250; v4 0.3500 |"),
        "{md}"
    );
    assert!(md.contains("## Evaluation on fixed subsets"), "{md}");
    assert!(
        md.contains("| `held-out` v0 → v4: 0.3000 → 0.5500 |"),
        "side-by-side table names the evaluation span: {md}"
    );
    assert!(
        md.contains("| run | recipe | judge | v0 | v2 | v4 | change | judged / failed (last) |"),
        "{md}"
    );
    assert!(
        md.contains("| baseline-rl | baseline-rl | `lexical-v1` | 0.1000 (0.5000) | 0.2250 (0.5000) | 0.3500 (0.5000) | +0.2500 ± 0.0000 (2) | 2 / 0 |"),
        "a run's change paired over its tasks: {md}"
    );
    assert!(
        md.contains("| full | full | `lexical-v1` | 0.3000 (0.5000) | 0.4250 (0.5000) | 0.5500 (0.5000) | +0.2500 ± 0.0000 (2) | 2 / 0 |"),
        "{md}"
    );
    let dir = path.parent().unwrap();
    for f in ["eval_held_out.png", "eval_held_out.svg"] {
        let len = std::fs::metadata(dir.join(f)).unwrap().len();
        assert!(len > 1000, "{f}: {len} bytes");
    }
    let svg = std::fs::read_to_string(dir.join("eval_held_out.svg")).unwrap();
    assert!(
        svg.contains("baseline-rl") && svg.contains("full"),
        "legend names both runs"
    );
    // A run of one recipe alone: its own evaluation only.
    let one =
        orchestrator::pipeline::report::write(&pool, runs[0], out.path(), &Default::default())
            .await
            .unwrap();
    let md = std::fs::read_to_string(one).unwrap();
    assert!(
        md.contains("| baseline-rl |") && !md.contains("| full | full |"),
        "{md}"
    );
}

/// The held-out subset leaves the training schedule, is the same seeded pick each time, and
/// bad settings are refused naming the value and the limit: too many held out, or an evaluation
/// set that overlaps the training tasks.
#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn held_out_tasks_leave_the_schedule_and_bad_subsets_are_refused(pool: sqlx::PgPool) {
    use orchestrator::domain::config::{Config, EvalSet, Overrides};
    use orchestrator::pipeline::setup::split_tasks;
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    orchestrator::domain::data::world::write(
        &orchestrator::domain::data::world::generate(5, 40, 12),
        &a,
    )
    .unwrap();
    orchestrator::domain::data::world::write(
        &orchestrator::domain::data::world::generate(6, 40, 5),
        &b,
    )
    .unwrap();
    let mut cfg = Config::load("smoke", &Overrides::default()).unwrap();
    // A plain task file: the held-out subset is a seeded pick of it.
    cfg.data.world_held_out = 0;
    cfg.data.tasks = a.join("tasks.jsonl");
    cfg.rollout.tasks_per_step = 2;
    cfg.eval.held_out = 3;
    let (train, questions, evals) = split_tasks(&cfg, &pool, "SYS").await.unwrap();
    assert_eq!((train.len(), questions.len(), evals.len()), (9, 9, 1));
    assert_eq!(evals[0].name, "held-out");
    assert_eq!(evals[0].tasks.len(), 3);
    for t in &evals[0].tasks {
        assert!(
            train.iter().all(|x| x.task_id != t.rollout.task_id),
            "held out of training"
        );
    }
    let (_, _, again) = split_tasks(&cfg, &pool, "SYS").await.unwrap();
    let ids = |e: &[orchestrator::pipeline::evaluate::Subset]| -> Vec<uuid::Uuid> {
        e[0].tasks.iter().map(|t| t.rollout.task_id).collect()
    };
    assert_eq!(ids(&evals), ids(&again), "a fixed subset");

    // A further set: a seeded pick of another task file, capped at its size.
    cfg.eval.sets = vec![EvalSet {
        name: "other".into(),
        tasks: b.join("tasks.jsonl"),
        size: 100,
        n: Some(3),
        temperature: Some(0.7),
        benchmark: None,
        judges: vec![],
    }];
    let (_, _, evals) = split_tasks(&cfg, &pool, "SYS").await.unwrap();
    assert_eq!(
        evals
            .iter()
            .map(|e| (e.name.as_str(), e.tasks.len()))
            .collect::<Vec<_>>(),
        vec![("held-out", 3), ("other", 5)]
    );
    // The set's own samples and temperature; the held-out subset keeps eval.n and
    // eval.temperature.
    assert_eq!((evals[0].samples, evals[0].temperature), (None, None));
    assert_eq!(
        (evals[1].samples, evals[1].temperature),
        (Some(3), Some(0.7))
    );
    // The training file itself as a set overlaps the training tasks.
    cfg.eval.sets[0].tasks = a.join("tasks.jsonl");
    let err = split_tasks(&cfg, &pool, "SYS")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("eval set `other`") && err.contains("must not overlap"),
        "{err}"
    );

    cfg.eval.sets.clear();
    cfg.eval.held_out = 11;
    let err = split_tasks(&cfg, &pool, "SYS")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("eval.held_out = 11 leaves 1 of the 12 tasks")
            && err.contains("at most 10 can be held out"),
        "{err}"
    );

    // A split world (the smoke preset's): every task of data.tasks trains, and the held-out
    // subset is a seeded pick of heldout.jsonl, whose tasks are about other lineages.
    let c = tmp.path().join("c");
    orchestrator::domain::data::world::write(
        &orchestrator::domain::data::world::generate_split(5, 80, 12, 4),
        &c,
    )
    .unwrap();
    cfg.data.tasks = c.join("tasks.jsonl");
    cfg.data.world_held_out = 4;
    cfg.eval.held_out = 3;
    let (train, _, evals) = split_tasks(&cfg, &pool, "SYS").await.unwrap();
    assert_eq!((train.len(), evals.len(), evals[0].tasks.len()), (12, 1, 3));
    let held = std::fs::read_to_string(c.join("heldout.jsonl")).unwrap();
    for t in &evals[0].tasks {
        assert!(held.contains(&t.question), "{}", t.question);
        assert!(train.iter().all(|x| x.task_id != t.rollout.task_id));
    }
    cfg.eval.held_out = 5;
    let err = split_tasks(&cfg, &pool, "SYS")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("eval.held_out = 5 is more than the 4 held-out tasks")
            && err.contains("data.world_held_out"),
        "{err}"
    );
    // A world generated without held-out tasks is refused, not silently overlapped.
    cfg.data.tasks = a.join("tasks.jsonl");
    let err = orchestrator::pipeline::setup::ensure_world(&cfg)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("data.world_held_out = 4") && err.contains("delete the directory"),
        "{err}"
    );
}

/// A benchmark set of `[[eval.sets]]` at a policy version: the run's agent answers real SimpleQA
/// items through the policy server, the gold panel (a loopback grader, not the training judge)
/// grades them by SimpleQA's protocol, `gold/<set>` and the monitor's flag are logged at the
/// step that produced the version, the trajectory is stored with the response, and a second
/// call at the same version reuses the stored evaluation without asking the policy again.
#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn a_benchmark_set_is_answered_by_the_agent_and_graded_by_the_gold_panel(pool: sqlx::PgPool) {
    use orchestrator::domain::bench::Benchmark;
    use orchestrator::domain::bench::load::{LoadOptions, load};
    use orchestrator::infra::llm::{EndpointPool, LlmClient, RetryPolicy};
    use orchestrator::pipeline::bench::JudgeSpec;
    use orchestrator::pipeline::bench::periodic::{BenchSet, evaluate_set};

    let csv = std::env::var("SHARED_DATA")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data")
        })
        .join("shortform_qa/simple_qa_test_set.csv");
    let all = load(Benchmark::Simpleqa, &csv, &LoadOptions::default()).unwrap();
    let items = vec![all[0].clone(), all[1].clone()];
    let gold = |i: usize| match &items[i].gold {
        orchestrator::domain::bench::Gold::Short { answers } => answers[0].clone(),
        _ => unreachable!("SimpleQA items carry short answers"),
    };
    let server = FakeServer::start().await;
    server
        .push_scripted(Scripted::reply(
            &format!("{PLAN}<answer>\\boxed{{{}}}</answer>", gold(0)),
            "stop",
        ))
        .await;
    server
        .push_scripted(Scripted::reply(
            &format!(
                "{PLAN}<answer>\\boxed{{certainly not {}}}</answer>",
                gold(1)
            ),
            "stop",
        ))
        .await;
    let grader = common::fake_grader::FakeGrader::start().await;
    let http = orchestrator::infra::llm::build_http(Duration::from_secs(5)).unwrap();
    let pool_ep = EndpointPool::new(
        Role::Judge,
        "gold",
        &[grader.url()],
        8,
        Duration::from_secs(10),
        1000,
    );
    let set = BenchSet {
        name: "simpleqa-gold".into(),
        bench: Benchmark::Simpleqa,
        data_path: csv.display().to_string(),
        data_sha256: "0".repeat(64),
        items,
        selection: serde_json::json!({"limit": 2, "seed": 0, "sampling": "first"}),
        judges: vec![JudgeSpec {
            label: "gold@loopback".into(),
            client: LlmClient::new(http, Arc::new(pool_ep), RetryPolicy::none()),
            temperature: 0.0,
            max_tokens: 64,
            usd_per_mtok_prompt: 0.0,
            usd_per_mtok_completion: 0.0,
        }],
        temperature: None,
    };
    let exp = db::runs::create_experiment(&pool, "t", "smoke", &serde_json::json!({}))
        .await
        .unwrap();
    let run = db::runs::create_run(&pool, exp, "r", "full", &serde_json::json!({}), 1)
        .await
        .unwrap();
    db::metrics::record(&pool, run, 0, &[("reward/mean".to_string(), 0.4)])
        .await
        .unwrap();
    let cancel = CancellationToken::new();
    let score = evaluate_set(&pool, run, &set, 1, ctx(&server), "SYS", 1, &cancel)
        .await
        .unwrap();
    assert_eq!(score, Some(50.0), "one CORRECT of two");
    assert_eq!(grader.calls("three_class"), 2);
    let logged = db::metrics::fetch(&pool, run, "gold/simpleqa-gold")
        .await
        .unwrap();
    assert_eq!(logged, vec![(0, 0.5)]);
    let flag = db::metrics::fetch(&pool, run, "monitor/divergence/simpleqa-gold")
        .await
        .unwrap();
    assert_eq!(flag, vec![(0, 0.0)]);
    let trajectories: Vec<serde_json::Value> = sqlx::query_scalar(
        "SELECT r.trajectory FROM bench_responses r JOIN bench_runs b ON b.id = r.run_id
         WHERE b.source_run_id = $1 AND b.policy_version = 1",
    )
    .bind(run)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(trajectories.len(), 2);
    assert!(trajectories.iter().all(
        |t| t["segments"].as_array().is_some_and(|s| !s.is_empty()) && t["sources"].is_array()
    ));

    let policy_calls = server.requests();
    let again = evaluate_set(&pool, run, &set, 1, ctx(&server), "SYS", 1, &cancel)
        .await
        .unwrap();
    assert_eq!(again, Some(50.0));
    assert_eq!(server.requests(), policy_calls, "stored, not regenerated");
}
