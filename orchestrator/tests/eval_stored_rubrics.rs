//! Evaluation reads each task's persistent rubrics from Postgres (where `orchestrator rubrics
//! init` writes them) as well as from the task file, and counts what it could not score as
//! failed: held-out tasks grounded only in Postgres are scored; a task with no rubric and no
//! known answer, or whose judge failed after its retries, is failed in the evaluation row. Real
//! Postgres, the loopback fake policy server, the lexical judge (or the fake LLM judge, dead),
//! and the real `rubrics init` command over a local index.
#![allow(clippy::disallowed_methods)] // reads Postgres directly to check what the product stored
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::fake_judge::FakeJudge;
use common::fake_openai::{FakeServer, Scripted, ToyCodec};
use orchestrator::domain::config::RolloutConfig;
use orchestrator::domain::data::tasks::{RubricSpec, TaskRow};
use orchestrator::domain::data::world::{WorldTask, generate};
use orchestrator::domain::judge::Judge;
use orchestrator::domain::judge::lexical::LexicalJudge;
use orchestrator::infra::db;
use orchestrator::infra::llm::judge::{LlmJudge, LlmJudgeOptions};
use orchestrator::infra::llm::{EndpointPool, LlmClient, RetryPolicy, Role};
use orchestrator::infra::tools::runner::ToolRunner;
use orchestrator::pipeline::evaluate::{EvalRun, EvalTask, Subset, evaluate_stored};
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

fn run_of<'a>(run_id: uuid::Uuid, c: &'a RolloutCtx, judge: &'a dyn Judge) -> EvalRun<'a> {
    EvalRun {
        run_id,
        version: 1,
        samples: 1,
        // One at a time, in task order, so each scripted reply goes to its task.
        max_inflight: 1,
        ctx: c,
        judge,
        gate: None,
    }
}

async fn new_run(pool: &sqlx::PgPool) -> uuid::Uuid {
    let exp = db::runs::create_experiment(pool, "t", "smoke", &serde_json::json!({}))
        .await
        .unwrap();
    db::runs::create_run(pool, exp, "r", "full", &serde_json::json!({}), 1)
        .await
        .unwrap()
}

/// A task file of world tasks; `keep_rubrics` false strips every rubric (tasks to be grounded by
/// `rubrics init`).
fn write_tasks(path: &Path, tasks: &[WorldTask], keep_rubrics: bool) {
    let text: String = tasks
        .iter()
        .map(|t| {
            let mut t = t.clone();
            if !keep_rubrics {
                t.rubrics.clear();
            }
            serde_json::to_string(&t).unwrap() + "\n"
        })
        .collect();
    std::fs::write(path, text).unwrap();
}

/// The evaluation subset exactly as run setup builds it: the task file's rows, stored (an
/// upsert keeps rubrics Postgres already holds), each with its file rubrics.
async fn subset_of(pool: &sqlx::PgPool, path: &Path) -> (Vec<TaskRow>, Subset) {
    let rows = orchestrator::domain::data::tasks::load(path).unwrap();
    let new: Vec<_> = rows.iter().map(db::tasks::from_task_row).collect();
    let ids = db::tasks::upsert(pool, &new).await.unwrap();
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
    (rows, subset)
}

async fn stored_specs(pool: &sqlx::PgPool, id: uuid::Uuid) -> Vec<RubricSpec> {
    let got = db::tasks::get_many(pool, &[id]).await.unwrap();
    serde_json::from_value(got[&id].persistent_rubrics.clone()).unwrap_or_default()
}

fn database_url(pool: &sqlx::PgPool) -> String {
    let db_name = pool.connect_options().get_database().unwrap().to_string();
    let mut url = url::Url::parse(&std::env::var("DATABASE_URL").unwrap()).unwrap();
    url.set_path(&format!("/{db_name}"));
    url.to_string()
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn held_out_tasks_grounded_by_rubrics_init_are_scored_and_unscorable_ones_fail(
    pool: sqlx::PgPool,
) {
    // Six tasks (exact, exact, long, exact, exact, long) in a file without rubrics; `rubrics
    // init --limit 3` grounds the first three in Postgres.
    let tmp = tempfile::tempdir().unwrap();
    let world = generate(5, 80, 6);
    let idx = tmp.path().join("idx");
    orchestrator::infra::tools::local_search::LocalIndex::build(&world.docs, Some(&idx)).unwrap();
    let file = tmp.path().join("tasks.jsonl");
    write_tasks(&file, &world.tasks, false);
    let cli = orchestrator::cli::Cli {
        log_format: orchestrator::cli::LogFormat::Text,
        command: orchestrator::cli::Command::Rubrics(orchestrator::cli::RubricsCommand::Init {
            config: orchestrator::cli::ConfigArgs {
                experiment: "smoke".into(),
                config_file: None,
                database_url: Some(database_url(&pool)),
                policy_urls: None,
                judge_urls: None,
                embeddings_urls: None,
                trainer_url: None,
                steps: None,
                sets: vec![],
            },
            tasks: file.clone(),
            limit: Some(3),
            index: Some(idx),
            web_tools: false,
            mcp: vec![],
            tool: "google_search".into(),
            k: 10,
            overwrite: false,
        }),
    };
    let code = orchestrator::commands::run(cli).await.unwrap();
    assert_eq!(code, std::process::ExitCode::SUCCESS);

    let (rows, subset) = subset_of(&pool, &file).await;
    assert!(
        subset.tasks.iter().all(|t| t.rubrics.is_empty()),
        "the task file holds no rubrics"
    );
    let mut grounded = Vec::new();
    for t in &subset.tasks {
        grounded.push(stored_specs(&pool, t.rollout.task_id).await);
    }
    for (i, g) in grounded.iter().enumerate() {
        assert_eq!(
            !g.is_empty(),
            i < 3,
            "task {i}: rubrics init grounded {g:?}"
        );
    }
    let formats: Vec<&str> = world
        .tasks
        .iter()
        .map(|t| t.answer_format.as_str())
        .collect();
    assert_eq!(
        formats,
        ["exact", "exact", "long", "exact", "exact", "long"]
    );

    // Every answer holds its task's known answer and the grounded rubrics' key terms.
    let server = FakeServer::start().await;
    for (t, g) in world.tasks.iter().zip(&grounded) {
        let terms: Vec<String> = g.iter().flat_map(|r| r.key_terms.clone()).collect();
        let reply = format!(
            "{PLAN}<answer>It is {} ({}). \\boxed{{{}}}</answer>",
            t.answer,
            terms.join(", "),
            t.answer
        );
        server.push_scripted(Scripted::reply(&reply, "stop")).await;
    }
    let run_id = new_run(&pool).await;
    let judge = LexicalJudge::new("lexical-v1");
    let c = ctx(&server);
    let er = run_of(run_id, &c, &judge);
    let (row, results) = evaluate_stored(&pool, &er, &subset, &CancellationToken::new())
        .await
        .unwrap()
        .expect("not cancelled");
    assert_eq!(results.len(), 6);

    // Grounded in Postgres only: scored on every stored rubric.
    for (i, r) in results.iter().enumerate().take(3) {
        let s = r.score.unwrap_or_else(|| panic!("task {i} scored: {r:?}"));
        assert!(s > 0.0 && s <= 1.0, "task {i}: {s}");
        assert_eq!(
            r.rubric_scores.as_array().unwrap().len(),
            grounded[i].len(),
            "task {i}: every stored rubric scored"
        );
        assert_eq!(r.error, None, "task {i}");
    }
    assert_eq!(results[0].exact, Some(true));
    assert_eq!(results[1].exact, Some(true));
    // No rubric, but a known answer: exact match is the figure; not failed.
    for r in &results[3..5] {
        assert_eq!((r.score, r.exact), (None, Some(true)), "{r:?}");
    }
    // No rubric and no known answer (a long task): it cannot be scored.
    assert_eq!(rows[5].rubrics.len(), 0);
    let r5 = &results[5];
    assert_eq!((r5.score, r5.exact), (None, None));
    assert!(
        r5.error
            .as_deref()
            .is_some_and(|e| e.contains("no persistent rubrics") && e.contains("no known answer")),
        "{:?}",
        r5.error
    );
    assert_eq!(row.tasks, 6);
    assert_eq!((row.judged, row.failed, row.parse_failures), (3, 1, 0));
    assert!((row.exact.unwrap() - 1.0).abs() < 1e-9);

    // Stored as computed.
    db::evaluations::record(&pool, &row, &results)
        .await
        .unwrap();
    let stored = db::evaluations::for_run(&pool, run_id).await.unwrap();
    assert_eq!(stored, vec![row]);
}

/// A task whose file rubrics were stored at setup and later regrounded in Postgres (`rubrics
/// init --overwrite`): the stored rubric of the same title wins, a stored one with a new title is
/// added, and the file's others stay.
#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn stored_rubrics_win_by_title_and_are_added_to_the_file_rubrics(pool: sqlx::PgPool) {
    let tmp = tempfile::tempdir().unwrap();
    let world = generate(5, 80, 1);
    let task = &world.tasks[0];
    assert_eq!(task.answer_format, "exact");
    assert_eq!(task.rubrics.len(), 2);
    let file = tmp.path().join("tasks.jsonl");
    write_tasks(&file, std::slice::from_ref(task), true);
    let (_, subset) = subset_of(&pool, &file).await;
    assert_eq!(subset.tasks[0].rubrics.len(), 2, "the file's rubrics");
    let id = subset.tasks[0].rollout.task_id;
    let (first, second) = (&task.rubrics[0], &task.rubrics[1]);
    let regrounded = serde_json::json!([
        {"title": first.title.to_uppercase(), "description": "STORED: the protein, named from a retrieved source",
         "weight": 2.0, "key_terms": first.key_terms},
        {"title": "grounded extra", "description": "STORED: the gene, named as the question gives it",
         "weight": 1.0, "key_terms": ["gene"]},
    ]);
    db::tasks::set_persistent_rubrics(&pool, id, &regrounded)
        .await
        .unwrap();

    let server = FakeServer::start().await;
    let reply = format!(
        "{PLAN}<answer>The gene encodes {} which binds {}. \\boxed{{{}}}</answer>",
        first.key_terms.join(" "),
        task.answer,
        task.answer
    );
    server.push_scripted(Scripted::reply(&reply, "stop")).await;
    let run_id = new_run(&pool).await;
    let judge = LexicalJudge::new("lexical-v1");
    let c = ctx(&server);
    let (row, results) = evaluate_stored(
        &pool,
        &run_of(run_id, &c, &judge),
        &subset,
        &CancellationToken::new(),
    )
    .await
    .unwrap()
    .unwrap();
    let scored: Vec<(String, String)> = results[0]
        .rubric_scores
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["title"].as_str().unwrap().to_string(),
                r["description"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        scored,
        vec![
            (
                first.title.to_uppercase(),
                "STORED: the protein, named from a retrieved source".to_string()
            ),
            (second.title.clone(), second.description.clone()),
            (
                "grounded extra".to_string(),
                "STORED: the gene, named as the question gives it".to_string()
            ),
        ],
        "stored wins on the same title, the file's other stays, the stored new one is added"
    );
    assert_eq!((row.judged, row.failed), (1, 0));
}

/// A task grounded only in Postgres whose judge fails after its retries: not scored, failed.
#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn a_judge_failure_on_stored_rubrics_counts_as_failed(pool: sqlx::PgPool) {
    let tmp = tempfile::tempdir().unwrap();
    let world = generate(5, 80, 1);
    let task = &world.tasks[0];
    let file = tmp.path().join("tasks.jsonl");
    write_tasks(&file, std::slice::from_ref(task), false);
    let (_, subset) = subset_of(&pool, &file).await;
    assert!(subset.tasks[0].rubrics.is_empty());
    let specs = serde_json::to_value(&task.rubrics).unwrap();
    db::tasks::set_persistent_rubrics(&pool, subset.tasks[0].rollout.task_id, &specs)
        .await
        .unwrap();

    let judge_srv = FakeJudge::start().await;
    *judge_srv.state.always_status.write().unwrap() = Some(500);
    let client = LlmClient::new(
        orchestrator::infra::llm::build_http(Duration::from_secs(5)).unwrap(),
        Arc::new(EndpointPool::new(
            Role::Judge,
            "fake-judge",
            &[judge_srv.url()],
            8,
            Duration::from_secs(5),
            1000,
        )),
        RetryPolicy {
            max_retries: 2,
            min_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
            jitter: false,
        },
    );
    let judge = LlmJudge::new(client, LlmJudgeOptions::default()).unwrap();

    let server = FakeServer::start().await;
    let reply = format!(
        "{PLAN}<answer>It is {}. \\boxed{{{}}}</answer>",
        task.answer, task.answer
    );
    server.push_scripted(Scripted::reply(&reply, "stop")).await;
    let run_id = new_run(&pool).await;
    let c = ctx(&server);
    let (row, results) = evaluate_stored(
        &pool,
        &run_of(run_id, &c, &judge),
        &subset,
        &CancellationToken::new(),
    )
    .await
    .unwrap()
    .unwrap();
    let r = &results[0];
    assert_eq!(r.score, None);
    assert!(
        r.error.as_deref().is_some_and(|e| e.starts_with("judge:")),
        "the judge was asked and failed: {:?}",
        r.error
    );
    assert!(
        judge_srv
            .state
            .requests
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 3,
        "retried"
    );
    assert_eq!((row.judged, row.failed), (0, 1));
}
