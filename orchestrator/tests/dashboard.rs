//! `orchestrator dashboard` against a small real run: `orchestrator rollout` (the scripted fake
//! policy, the research world's local search index, the byte-level tokenizer) stores four-stage
//! trajectories with tool outputs, and `orchestrator judge --generate` (the smoke preset's
//! lexical judge) scores them, writing rubrics, buffers, stage scores, advantages and step
//! metrics. The JSON API is checked for content, errors and access control; then Debian's
//! chromium (driven by playwright-core, installed by scripts/browser-env.sh) opens every page:
//! no console or page errors, charts drawn with the stored metrics as series, the trajectory
//! viewer's four stage colours, masked tool outputs and heat strip. Screenshots are written to
//! target/dashboard-screens/.
#![allow(clippy::disallowed_methods)] // reads Postgres directly to check what the product stored
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use std::path::Path;

use common::browser::{browse, workspace};
use common::fake_openai::{FakeServer, Scripted};
use common::fixtures::{rollout_args, write_byte_tokenizer};
use common::loopback::Loopback;
use orchestrator::pipeline::dashboard;
use sqlx::PgPool;
use uuid::Uuid;

const PLAN: &str = "<think>find the entity first</think><structured_plan><deep_analysis>The question names one entity; its record holds the fact.</deep_analysis><rubric>Knowledge:\n- names the fact from the record\nAnalytical:\n- cites the document\nNegative:\n- guesses without searching</rubric><research_plan>search for the entity, read its record</research_plan></structured_plan><call_tool name=\"google_search\">gene protein compound</call_tool>";
/// A strong second turn: reviews, then answers with the task's known answer.
fn good(answer: &str) -> String {
    format!(
        "<think>the record answers it</think><state_evaluation>the search returned the record</state_evaluation><review><rubric_review>the fact is in the record</rubric_review><writing_plan>state the fact and cite it</writing_plan></review><answer>The records show it: {answer}. \\boxed{{{answer}}}</answer>"
    )
}
const WEAK: &str = "<think>guess</think><review><rubric_review>none</rubric_review><writing_plan>short</writing_plan></review><answer>\\boxed{unknown}</answer>";

fn db_url(pool: &PgPool) -> String {
    let name = pool.connect_options().get_database().unwrap().to_string();
    let mut url = url::Url::parse(&std::env::var("DATABASE_URL").unwrap()).unwrap();
    url.set_path(&format!("/{name}"));
    url.to_string()
}

/// A rollout of 2 world tasks x 2 samples (one strong, one weak answer per task), judged
/// lexically with generated rubrics. Returns the run id.
async fn small_run(pool: &PgPool, tmp: &Path) -> Uuid {
    let tok_dir = tmp.join("model");
    write_byte_tokenizer(&tok_dir);
    let world = orchestrator::domain::data::world::generate(9, 60, 2);
    orchestrator::domain::data::world::write(&world, &tmp.join("world")).unwrap();
    let idx_dir = tmp.join("idx");
    orchestrator::infra::tools::local_search::LocalIndex::build(&world.docs, Some(&idx_dir))
        .unwrap();
    let server = FakeServer::start().await;
    server.push_scripted(Scripted::reply("probe", "stop")).await;
    for i in 0..(2 * world.tasks.len()) {
        server.push_scripted(Scripted::reply(PLAN, "stop")).await;
        // Tasks are rolled out in file order, their samples one after the other.
        let answer = if i % 2 == 0 {
            good(&world.tasks[i / 2].answer)
        } else {
            WEAK.to_string()
        };
        server.push_scripted(Scripted::reply(&answer, "stop")).await;
    }
    let url = db_url(pool);
    let args = rollout_args(
        &url,
        server.url(),
        &tmp.join("world/tasks.jsonl"),
        &tok_dir,
        &idx_dir,
        2,
    );
    let summary = orchestrator::commands::rollout(&args).await.unwrap();
    assert_eq!(summary.trajectories, 4, "{summary:?}");
    let run: Uuid = sqlx::query_scalar("SELECT id FROM runs")
        .fetch_one(pool)
        .await
        .unwrap();
    use clap::Parser;
    let cli = orchestrator::cli::Cli::parse_from([
        "orchestrator",
        "judge",
        "--database-url",
        &url,
        "--run",
        &run.to_string(),
        "--step",
        "0",
        "--generate",
    ]);
    let code = orchestrator::commands::run(cli).await.unwrap();
    assert_eq!(code, std::process::ExitCode::SUCCESS);
    run
}

async fn get(base: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String, Option<String>) {
    let client = reqwest::Client::builder().build().unwrap();
    let mut req = client.get(format!("{base}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let cookie = resp
        .headers()
        .get("set-cookie")
        .map(|v| v.to_str().unwrap().to_string());
    (status, resp.text().await.unwrap(), cookie)
}

async fn get_json(base: &str, path: &str) -> serde_json::Value {
    let (status, body, _) = get(base, path, &[]).await;
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn the_api_serves_a_real_run_and_guards_its_door(pool: PgPool) {
    let tmp = tempfile::tempdir().unwrap();
    let run = small_run(&pool, tmp.path()).await;
    let srv = Loopback::serve(dashboard::router(pool.clone(), None)).await;
    let base = format!("http://{}", srv.addr);

    let runs = get_json(&base, "/api/runs").await;
    assert_eq!(runs.as_array().unwrap().len(), 1);
    assert_eq!(runs[0]["id"], run.to_string());
    assert_eq!(runs[0]["status"], "completed");

    let detail = get_json(&base, &format!("/api/runs/{run}")).await;
    assert_eq!(detail["steps"].as_array().unwrap().len(), 1);
    assert!(detail["config"]["rollout"].is_object(), "{detail}");

    // Metrics: exactly what step_metrics holds, as [step, value] pairs.
    let stored: Vec<(String, f64)> =
        sqlx::query_as("SELECT name, value FROM step_metrics WHERE run_id = $1 AND step = 0")
            .bind(run)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(
        stored.len() >= 5,
        "the judge records its metrics: {stored:?}"
    );
    let metrics = get_json(&base, &format!("/api/runs/{run}/metrics")).await;
    assert_eq!(metrics.as_object().unwrap().len(), stored.len());
    for (name, value) in &stored {
        assert_eq!(metrics[name][0][0], 0, "{name}");
        assert!((metrics[name][0][1].as_f64().unwrap() - value).abs() < 1e-12);
    }
    let tail = get_json(&base, &format!("/api/runs/{run}/metrics?since=1")).await;
    assert_eq!(tail, serde_json::json!({}), "nothing after step 0");

    // A step's groups and one trajectory with everything the viewer shows.
    let groups = get_json(&base, &format!("/api/runs/{run}/steps/0")).await;
    assert_eq!(groups.as_array().unwrap().len(), 2);
    let first = &groups[0]["trajectories"][0];
    assert_eq!(first["stages"].as_array().unwrap().len(), 4, "{first}");
    let id = first["id"].as_str().unwrap();
    let t = get_json(&base, &format!("/api/trajectories/{id}")).await;
    let segs = t["segments"].as_array().unwrap();
    assert!(
        segs.iter()
            .any(|s| s["kind"] == "tool_output" && s["text"].as_str().unwrap().len() > 20),
        "a tool output segment: {segs:?}"
    );
    assert!(segs.iter().all(|s| s.get("token_ids").is_none()));
    let model_tokens: i64 = segs
        .iter()
        .filter(|s| s["kind"] == "model")
        .map(|s| s["tokens"].as_i64().unwrap())
        .sum();
    assert_eq!(model_tokens, t["model_tokens"].as_i64().unwrap());
    assert!(!t["judgments"].as_array().unwrap().is_empty());
    assert!(t["judgments"][0]["description"].as_str().unwrap().len() > 3);
    assert_eq!(t["group"].as_array().unwrap().len(), 2);
    assert_eq!(t["tool_calls"][0]["tool"], "google_search");

    let buffers = get_json(&base, &format!("/api/runs/{run}/buffers")).await;
    assert_eq!(buffers.as_array().unwrap().len(), 2, "{buffers}");
    let task = buffers[0]["task_id"].as_str().unwrap();
    let buffer = get_json(&base, &format!("/api/runs/{run}/buffers/{task}")).await;
    assert!(!buffer["rubrics"].as_array().unwrap().is_empty());

    // Bad input: clear 4xx, never a 500.
    let (s, body, _) = get(&base, "/api/runs/not-a-uuid", &[]).await;
    assert_eq!(s, 400);
    assert!(body.contains("not-a-uuid"), "{body}");
    let (s, _, _) = get(&base, &format!("/api/runs/{}", Uuid::nil()), &[]).await;
    assert_eq!(s, 404);
    let (s, body, _) = get(&base, &format!("/api/runs/{run}/metrics?since=-1"), &[]).await;
    assert_eq!(s, 400, "{body}");
    let (s, _, _) = get(&base, &format!("/api/runs/{run}/steps/x"), &[]).await;
    assert_eq!(s, 400);
    // A search string is a bound parameter: SQL and LIKE wildcards are plain text.
    let bank = get_json(&base, &format!("/api/runs/{run}/bank?q=%25'%3B%20DROP")).await;
    assert_eq!(bank, serde_json::json!([]));
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM runs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 1);

    // With a token: 401 without it, the bearer header or the cookie set by ?token= open it.
    let secret = "dashboard-test-token-0123";
    let token = dashboard::Token::from_value(Some(secret)).unwrap();
    let guarded = Loopback::serve(dashboard::router(pool.clone(), token)).await;
    let gbase = format!("http://{}", guarded.addr);
    let (s, _, _) = get(&gbase, "/api/runs", &[]).await;
    assert_eq!(s, 401);
    let (s, _, _) = get(&gbase, "/", &[]).await;
    assert_eq!(s, 401);
    let (s, _, _) = get(&gbase, "/healthz", &[]).await;
    assert_eq!(s, 200);
    let (s, _, _) = get(
        &gbase,
        "/api/runs",
        &[("authorization", "Bearer wrong-token-0000000")],
    )
    .await;
    assert_eq!(s, 401);
    let bearer = format!("Bearer {secret}");
    let (s, _, _) = get(&gbase, "/api/runs", &[("authorization", &bearer)]).await;
    assert_eq!(s, 200);
    let (s, _, cookie) = get(&gbase, &format!("/?token={secret}"), &[]).await;
    assert_eq!(s, 200);
    let cookie = cookie.expect("the token is handed over as a cookie");
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    let pair = cookie.split(';').next().unwrap().to_string();
    let (s, _, _) = get(&gbase, "/api/runs", &[("cookie", &pair)]).await;
    assert_eq!(s, 200);
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn every_page_renders_in_chromium_without_errors(pool: PgPool) {
    let tmp = tempfile::tempdir().unwrap();
    let run = small_run(&pool, tmp.path()).await;
    let (exp, traj, task): (Uuid, Uuid, Uuid) = sqlx::query_as(
        "SELECT r.experiment_id, t.id, t.task_id FROM runs r JOIN trajectories t ON t.run_id = r.id
         WHERE EXISTS (SELECT 1 FROM trajectory_segments s WHERE s.trajectory_id = t.id AND s.kind = 'tool_output')
         ORDER BY t.sample_index LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let names: i64 =
        sqlx::query_scalar("SELECT count(DISTINCT name) FROM step_metrics WHERE run_id = $1")
            .bind(run)
            .fetch_one(&pool)
            .await
            .unwrap();
    let segments: i64 =
        sqlx::query_scalar("SELECT count(*) FROM trajectory_segments WHERE trajectory_id = $1")
            .bind(traj)
            .fetch_one(&pool)
            .await
            .unwrap();
    let srv = Loopback::serve(dashboard::router(pool.clone(), None)).await;
    let base = format!("http://{}", srv.addr);
    let out = workspace().join("target/dashboard-screens/small-run");
    let pages = [
        ("runs", "#/".to_string()),
        ("metrics", format!("#/run/{run}")),
        ("steps", format!("#/run/{run}/steps")),
        ("step", format!("#/run/{run}/step/0")),
        ("trajectory", format!("#/trajectory/{traj}")),
        ("rubrics", format!("#/run/{run}/rubrics")),
        ("buffer", format!("#/run/{run}/rubrics/{task}")),
        ("evaluations", format!("#/run/{run}/evaluations")),
        ("reflections", format!("#/run/{run}/reflections")),
        ("bank", format!("#/run/{run}/bank")),
        ("config", format!("#/run/{run}/config")),
        ("experiment", format!("#/experiment/{exp}")),
    ];
    let report = browse(&base, &out, &pages).await;
    for (name, _) in &pages {
        let p = &report["pages"][name];
        assert_eq!(p["console"], serde_json::json!([]), "{name}: {p}");
        assert_eq!(p["errors"], serde_json::json!([]), "{name}: {p}");
        assert_eq!(p["failed"], serde_json::json!([]), "{name}: {p}");
        assert_eq!(p["errorText"], serde_json::json!([]), "{name}: {p}");
        let text = p["text"].as_str().unwrap();
        assert!(
            !text.contains("undefined") && !text.lines().any(|l| l.trim() == "null"),
            "{name} prints a missing value: {text}"
        );
        assert!(Path::new(p["screenshot"].as_str().unwrap()).exists());
    }
    // Every stored metric is one series of one drawn chart, and every chart has ink.
    let metrics = &report["pages"]["metrics"];
    let charts = metrics["charts"].as_array().unwrap();
    assert!(!charts.is_empty(), "{metrics}");
    let series: i64 = charts.iter().map(|c| c["series"].as_i64().unwrap()).sum();
    assert_eq!(series, names, "{charts:?}");
    for c in charts {
        assert_eq!(c["legend"], c["series"], "{c}");
        assert!(c["inked"].as_i64().unwrap() > 500, "an empty canvas: {c}");
    }
    // The trajectory viewer: four stage colours, a masked tool output, one heat cell per segment.
    let t = &report["pages"]["trajectory"];
    let colors = t["stageColors"].as_object().unwrap();
    let mut stages: Vec<_> = colors.keys().cloned().collect();
    stages.sort();
    assert_eq!(stages, ["answer", "plan", "research", "review"], "{t}");
    let distinct: std::collections::BTreeSet<_> = colors.values().map(|v| v.to_string()).collect();
    assert_eq!(distinct.len(), 4, "{colors:?}");
    assert!(t["maskedToolOutputs"].as_i64().unwrap() >= 1, "{t}");
    assert_eq!(t["heatCells"].as_i64().unwrap(), segments);
    assert!(t["judgments"].as_i64().unwrap() > 0);
    // The buffer page charts the buffer over steps.
    let b = &report["pages"]["buffer"];
    assert!(!b["charts"].as_array().unwrap().is_empty(), "{b}");
}
