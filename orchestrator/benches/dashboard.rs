//! Dashboard server time on a large run: 600 steps x 256 trajectories (32 tasks x 8 samples,
//! four stage scores each), 80 step metrics per step, and one trajectory of 18k tokens (48
//! segments, 16 tool calls with outputs, 60 judgments). Rows are generated in Postgres with
//! `generate_series`. Each page's API requests go through the real router on a loopback port;
//! reported: median and p95 wall time per page over repeated loads (HTTP included) and the
//! Postgres time the server reports in `Server-Timing`, side by side with the budgets of issue
//! 23 (metrics page 300 ms, one 18k-token trajectory 100 ms) as a ratio.
//!
//! Needs DATABASE_URL (a server where it may create the database `rubricem_bench_dashboard`).
//! Run: cargo bench -p orchestrator --bench dashboard [-- STEPS TRAJECTORIES_PER_STEP REPEATS]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::disallowed_methods,
    reason = "benchmark code fails loudly and writes its rows with SQL"
)]

#[path = "common/bench_db.rs"]
mod bench_db;

mod common {
    #[path = "../../tests/common/loopback.rs"]
    pub mod loopback;
}

use std::time::{Duration, Instant};

use sqlx::PgPool;
use uuid::Uuid;

const METRICS_PER_STEP: i32 = 80;
const TASKS: i32 = 32;

async fn exec(pool: &PgPool, sql: &str) {
    sqlx::query(sql).execute(pool).await.unwrap();
}

/// Returns (run id, id of the 18k-token trajectory).
async fn generate(pool: &PgPool, steps: i32, per_step: i32) -> (Uuid, Uuid) {
    let exp = Uuid::now_v7();
    let run = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO experiments (id, name, preset, config) VALUES ($1, 'bench', 'smoke', '{}')",
    )
    .bind(exp)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO runs (id, experiment_id, name, recipe, status, config, seed)
         VALUES ($1, $2, 'full', 'full', 'running', '{\"experiment\": {\"steps\": 1000}}', 1)",
    )
    .bind(run)
    .bind(exp)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO tasks (id, source, external_id, prompt, prompt_sha256)
         SELECT gen_random_uuid(), 'bench', 'task-' || i, 'Question ' || i || repeat(' about the world', 20), md5(i::text)
         FROM generate_series(0, $1 - 1) i",
    )
    .bind(TASKS)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO steps (run_id, step, policy_version, status, started_at, finished_at)
         SELECT $1, s, s, 'completed', now() - (($2 - s) * interval '30 s'), now() - (($2 - s) * interval '30 s') + interval '25 s'
         FROM generate_series(0, $2 - 1) s",
    )
    .bind(run)
    .bind(steps)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO step_metrics (run_id, step, name, value)
         SELECT $1, s, 'group' || (m % 10) || '/metric_' || m, sin(s * 0.01 + m)
         FROM generate_series(0, $2 - 1) s, generate_series(0, $3 - 1) m",
    )
    .bind(run)
    .bind(steps)
    .bind(METRICS_PER_STEP)
    .execute(pool)
    .await
    .unwrap();
    let samples = per_step / TASKS;
    sqlx::query(
        "INSERT INTO trajectories (id, run_id, step, task_id, sample_index, policy_version, server,
                                   prompt_token_ids, finish_reason, num_model_tokens, num_tool_tokens)
         SELECT gen_random_uuid(), $1, s, t.id, k, s, 'http://policy', '{1,2,3}', 'answer', 900, 1200
         FROM generate_series(0, $2 - 1) s, (SELECT id FROM tasks) t, generate_series(0, $3 - 1) k",
    )
    .bind(run)
    .bind(steps)
    .bind(samples)
    .execute(pool)
    .await
    .unwrap();
    exec(
        pool,
        "INSERT INTO stage_scores (trajectory_id, stage, judge_model, score, stage_return, advantage)
         SELECT t.id, st.id, 'judge', 0.5, 0.5, 0.1 FROM trajectories t, stages st",
    )
    .await;
    exec(pool, "ANALYZE").await;

    // The long trajectory: the first sample of the last step, 48 segments of 375 tokens.
    let long: Uuid = sqlx::query_scalar(
        "SELECT id FROM trajectories WHERE run_id = $1 AND step = $2 - 1 ORDER BY task_id, sample_index LIMIT 1",
    )
    .bind(run)
    .bind(steps)
    .fetch_one(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO trajectory_segments (trajectory_id, ordinal, kind, stage, token_ids, logprobs, text, policy_version)
         SELECT $1, o, CASE WHEN o % 3 = 1 THEN 'tool_output' ELSE 'model' END,
                CASE WHEN o % 3 = 1 THEN NULL ELSE (o * 4 / 48) END,
                array_fill(7, ARRAY[375]),
                CASE WHEN o % 3 = 1 THEN NULL ELSE array_fill(-0.5::real, ARRAY[375]) END,
                repeat('word ', 375), 1
         FROM generate_series(0, 47) o",
    )
    .bind(long)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO tool_calls (id, trajectory_id, ordinal, stage, tool, arguments, output_text, snippet_ids)
         SELECT gen_random_uuid(), $1, c, 1, 'google_search', '{\"query\": \"q\"}', repeat('snippet text ', 120), ARRAY['s' || c]
         FROM generate_series(0, 15) c",
    )
    .bind(long)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "WITH r AS (
           INSERT INTO rubrics (id, task_id, stage, origin, title, description, run_id, created_step)
           SELECT gen_random_uuid(), (SELECT task_id FROM trajectories WHERE id = $1), i % 4,
                  'generated', 'rubric ' || i, repeat('criterion text ', 10), $2, 0
           FROM generate_series(0, 59) i RETURNING id, stage)
         INSERT INTO judgments (id, trajectory_id, rubric_id, stage, score, justification, judge_model, judge_kind)
         SELECT gen_random_uuid(), $1, r.id, r.stage, 1, repeat('because ', 20), 'judge', 'llm' FROM r",
    )
    .bind(long)
    .bind(run)
    .execute(pool)
    .await
    .unwrap();
    (run, long)
}

/// Wall time and summed Server-Timing db time of loading `paths` once.
async fn load(client: &reqwest::Client, base: &str, paths: &[String]) -> (Duration, f64, usize) {
    let t0 = Instant::now();
    let mut db_ms = 0.0;
    let mut bytes = 0;
    for p in paths {
        let resp = client.get(format!("{base}{p}")).send().await.unwrap();
        assert!(resp.status().is_success(), "{p}: {}", resp.status());
        let timing = resp
            .headers()
            .get("server-timing")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("db;dur="))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        db_ms += timing;
        bytes += resp.bytes().await.unwrap().len();
    }
    (t0.elapsed(), db_ms, bytes)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let steps: i32 = args.first().and_then(|s| s.parse().ok()).unwrap_or(600);
    let per_step: i32 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(256);
    let repeats: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20);
    let (pool, url) = bench_db::fresh("rubricem_bench_dashboard", 8).await;
    let t0 = Instant::now();
    let (run, long) = generate(&pool, steps, per_step).await;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM trajectories")
        .fetch_one(&pool)
        .await
        .unwrap();
    println!(
        "generated {steps} steps x {per_step} trajectories ({rows} rows), {} metric rows, in {:.1} s",
        i64::from(steps) * i64::from(METRICS_PER_STEP),
        t0.elapsed().as_secs_f64()
    );
    let srv = common::loopback::Loopback::serve(orchestrator::pipeline::dashboard::router(
        pool.clone(),
        None,
    ))
    .await;
    let base = format!("http://{}", srv.addr);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let pages: [(&str, Vec<String>, Option<f64>); 4] = [
        (
            "metrics page (run + all metrics)",
            vec![
                format!("/api/runs/{run}"),
                format!("/api/runs/{run}/metrics"),
            ],
            Some(300.0),
        ),
        (
            "trajectory (18k tokens)",
            vec![format!("/api/trajectories/{long}")],
            Some(100.0),
        ),
        (
            "step page (256 trajectories)",
            vec![format!("/api/runs/{run}/steps/{}", steps / 2)],
            None,
        ),
        ("runs list", vec!["/api/runs".to_string()], None),
    ];
    println!(
        "{:<34} {:>10} {:>10} {:>12} {:>10} {:>8} {:>7}",
        "page", "median ms", "p95 ms", "db med ms", "budget ms", "ratio", "KiB"
    );
    for (name, paths, budget) in &pages {
        let _ = load(&client, &base, paths).await; // warm-up
        let mut wall = Vec::with_capacity(repeats);
        let mut db = Vec::with_capacity(repeats);
        let mut size = 0;
        for _ in 0..repeats {
            let (w, d, b) = load(&client, &base, paths).await;
            wall.push(w.as_secs_f64() * 1e3);
            db.push(d);
            size = b;
        }
        wall.sort_by(f64::total_cmp);
        db.sort_by(f64::total_cmp);
        let med = quantile(&wall, 0.5);
        println!(
            "{:<34} {:>10.1} {:>10.1} {:>12.1} {:>10} {:>8} {:>7}",
            name,
            med,
            quantile(&wall, 0.95),
            quantile(&db, 0.5),
            budget.map_or("-".into(), |b| format!("{b:.0}")),
            budget.map_or("-".into(), |b| format!("{:.2}x", med / b)),
            size / 1024
        );
    }
    drop(srv);
    pool.close().await;
    bench_db::drop(&url).await;
}
