//! API keys never reach logs or Postgres: a judge server and a web-search server that echo the
//! request's key headers in their error bodies are called with a key from the environment; the
//! error text, the captured log output and every stored judge-call and tool-call row are
//! checked for the key.
#![allow(clippy::disallowed_methods)] // reads Postgres directly to check what the product stored
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code fails loudly"
)]

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use common::fixtures::segment;
use orchestrator::domain::config::Recipe;
use orchestrator::domain::credit::Lambda;
use orchestrator::domain::tool::ToolArgs;
use orchestrator::domain::trajectory::{SegmentKind, Stage, Trajectory};
use orchestrator::infra::llm::judge::{LlmJudge, LlmJudgeOptions};
use orchestrator::infra::llm::{
    ApiKey, ChatMessage, ChatRequest, EndpointPool, LlmClient, RetryPolicy, Role,
};
use orchestrator::infra::tools::runner::{ToolLimits, ToolRunner};
use orchestrator::pipeline::judging::{StepOptions, judge_step};
use sqlx::PgPool;

const KEY: &str = "sk-echo-5f2b9c7e1d3a4b6c8e0f";
const VAR: &str = "RUBRICEM_TEST_ECHO_KEY";

/// Answers 500 with every request header it got, as a careless proxy would.
async fn echo(headers: HeaderMap) -> (StatusCode, String) {
    let dump: Vec<String> = headers
        .iter()
        .map(|(k, v)| format!("{k}: {}", v.to_str().unwrap_or("")))
        .collect();
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        serde_json::json!({"message": format!("upstream failed; request was: {}", dump.join("; "))})
            .to_string(),
    )
}

async fn start_echo() -> String {
    let app = Router::new()
        .route("/v1/chat/completions", post(echo))
        .route("/search", post(echo));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    format!("http://{addr}")
}

fn trajectory(run: uuid::Uuid, task: uuid::Uuid) -> Trajectory {
    let answer = "X binds the receptor.".to_string();
    Trajectory {
        id: uuid::Uuid::now_v7(),
        run_id: run,
        step: 0,
        task_id: task,
        sample_index: 0,
        policy_version: 0,
        server: "fake".into(),
        server_version: None,
        prompt_token_ids: vec![1, 2, 3],
        segments: vec![
            segment(
                SegmentKind::Model,
                Some(Stage::Plan),
                "<structured_plan>look it up</structured_plan>",
            ),
            segment(
                SegmentKind::Model,
                Some(Stage::Answer),
                &format!("<answer>{answer}</answer>"),
            ),
        ],
        finish_reason: "answer".into(),
        parsed: serde_json::json!({ "answer": answer }),
        timings: serde_json::json!({}),
    }
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The key must come from the environment, as in the product, and this crate forbids the
/// `unsafe` of `set_var`: the test runs [`echo_inner`] in a child process of this test binary
/// with the variable set.
#[test]
fn an_echoing_server_cannot_put_the_key_into_logs_or_postgres() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "echo_inner", "--include-ignored", "--nocapture"])
        .env(VAR, KEY)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "the inner test ran: {text}");
    assert!(!text.contains(KEY), "the key reached the output:\n{text}");
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
#[ignore = "run by an_echoing_server_cannot_put_the_key_into_logs_or_postgres with the key set"]
async fn echo_inner(pool: PgPool) {
    assert_eq!(
        std::env::var(VAR).as_deref(),
        Ok(KEY),
        "run through an_echoing_server_cannot_put_the_key_into_logs_or_postgres"
    );
    let logs = Captured::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let url = start_echo().await;

    // The LLM door: the key is sent, the server echoes it, the error carries none of it.
    let pool_cfg = EndpointPool::new(
        Role::Judge,
        "echo-judge",
        std::slice::from_ref(&url),
        4,
        Duration::from_secs(5),
        1000,
    );
    let client = LlmClient::new(
        orchestrator::infra::llm::build_http(Duration::from_secs(5)).unwrap(),
        Arc::new(pool_cfg),
        RetryPolicy {
            max_retries: 1,
            min_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
            jitter: false,
        },
    )
    .with_api_key(Some(ApiKey::from_env(VAR).unwrap()));
    let err = client
        .chat(&ChatRequest {
            model: "echo-judge".into(),
            messages: vec![ChatMessage::user("hi")],
            temperature: 0.0,
            max_tokens: 8,
            response_format: None,
            seed: None,
            stop: vec![],
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("Bearer [redacted]"), "{err}");
    assert!(!err.contains(KEY), "{err}");

    // The judge step stores every failed call's error in judge_calls.
    let judge = LlmJudge::new(client, LlmJudgeOptions::default()).unwrap();
    let task = orchestrator::infra::db::tasks::upsert(
        &pool,
        &[orchestrator::infra::db::tasks::NewTask {
            source: "fixture".into(),
            external_id: "t".into(),
            prompt: "q?".into(),
            answer_format: "long".into(),
            persistent_rubrics: serde_json::json!([{"title": "x", "description": "names x", "weight": 1.0}]),
            metadata: serde_json::json!({}),
        }],
    )
    .await
    .unwrap()[0];
    let exp = orchestrator::infra::db::runs::create_experiment(
        &pool,
        "exp",
        "smoke",
        &serde_json::json!({}),
    )
    .await
    .unwrap();
    let run = orchestrator::infra::db::runs::create_run(
        &pool,
        exp,
        "full",
        "full",
        &serde_json::json!({}),
        1,
    )
    .await
    .unwrap();
    orchestrator::infra::db::runs::begin_step(&pool, run, 0, 0, &[task])
        .await
        .unwrap();
    let t = trajectory(run, task);
    orchestrator::infra::db::trajectories::insert_batch(&pool, &[t])
        .await
        .unwrap();
    let opts = StepOptions::for_recipe(Recipe::Full, Lambda::default(), false);
    judge_step(&pool, &judge, &opts, run, 0).await.unwrap();

    // The web-search tool: the key goes in X-API-KEY, the echo comes back as the tool error.
    let google = orchestrator::infra::tools::search_apis::GoogleSearch::new(&url, VAR).unwrap();
    let mut runner = ToolRunner::new(None);
    runner.register("google_search", Arc::new(google), ToolLimits::default());
    let r = runner
        .run(
            "google_search",
            ToolArgs {
                query: "q".into(),
                attrs: Default::default(),
            },
        )
        .await;
    let tool_err = r.error.clone().unwrap();
    assert!(tool_err.contains("[redacted]"), "{tool_err}");
    assert!(!r.output_text.contains(KEY) && !tool_err.contains(KEY));

    let errors: Vec<Option<String>> =
        sqlx::query_scalar("SELECT error FROM judge_calls WHERE run_id = $1")
            .bind(run)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(!errors.is_empty() && errors.iter().all(Option::is_some));
    for e in errors.iter().flatten() {
        assert!(e.contains("[redacted]") && !e.contains(KEY), "{e}");
    }
    let stored: Vec<String> = sqlx::query_scalar(
        "SELECT t::text FROM (SELECT * FROM judge_calls) t
         UNION ALL SELECT t::text FROM (SELECT * FROM judgments) t
         UNION ALL SELECT t::text FROM (SELECT * FROM runs) t",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(stored.iter().all(|row| !row.contains(KEY)));
    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("[redacted]"),
        "the failures were logged: {logs}"
    );
    assert!(!logs.contains(KEY), "the key reached the logs:\n{logs}");
}
