//! What the experiment trackers cost a step. (1) The writer alone: a step's worth of metrics
//! (the stages' own producers: judging report, batch statistics, trainer step, reflection job,
//! rollout figures, about 60 names) mapped, de-duplicated and appended to a TensorBoard event
//! file, flushed. (2) The follower's whole poll against Postgres: read the rows recorded since
//! the cursor, map them, write and flush the event file, for a poll after each step and for an
//! idle poll (nothing new). Both against a step of the smoke run (BENCHMARKS.md: 383.8 s for
//! 6 steps, about 64 s a step on this 2-core machine; a GPU step of the paper presets is longer
//! still). MLflow's cost is the server's round trips, off the run's path like all of this.
//!
//! Needs DATABASE_URL (a server where it may create the database `rubricem_bench_tracking`).
//! Run: cargo bench -p orchestrator --bench tracking [-- STEPS] (default 100, about 20 s)
#![allow(clippy::disallowed_methods)] // reads Postgres directly to check what the product stored
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "test and benchmark code fails loudly"
)]

#[path = "common/bench_db.rs"]
mod bench_db;

use std::time::{Duration, Instant};

use orchestrator::domain::config::TrackingConfig;
use orchestrator::domain::tracking::{Row, Seen};
use orchestrator::infra::db;
use orchestrator::infra::tracking::tensorboard::EventWriter;
use orchestrator::pipeline::tracking::{Session, Target};

/// A typical smoke step (BENCHMARKS.md, split layout: 383.8 s / 6 steps).
const STEP_SECS: f64 = 383.8 / 6.0;
/// The follower's default poll interval.
const POLL_SECS: f64 = 5.0;

/// One step's metrics as the stages record them.
fn step_metrics(step: i32) -> Vec<(String, f64)> {
    let x = f64::from(step);
    let report = orchestrator::pipeline::judging::StepReport {
        trajectories: 32,
        calls: 40,
        mean_reward: 0.3 + x * 1e-3,
        mean_stage_score: [0.1, 0.2, 0.3, 0.4],
        active_rubrics: [3, 2, 2, 3],
        ..Default::default()
    };
    let mut m = report.metrics();
    m.extend(
        orchestrator::pipeline::batch::BatchStats {
            tokens: 50_000,
            groups: 8,
            ..Default::default()
        }
        .metrics(),
    );
    let train = wire::api::StepMetrics {
        loss: 0.1,
        kl: 0.01,
        lr: 1e-6,
        ..Default::default()
    };
    for (k, v) in orchestrator::infra::llm::trainer::named_metrics(&train) {
        m.push((format!("train/{k}"), v));
    }
    m.extend(orchestrator::domain::reflection::JobReport::default().metrics());
    for (k, v) in [
        ("time/rollout_s", 40.0),
        ("time/judge_s", 2.0),
        ("time/train_s", 20.0),
        ("rollout/trajectories", 32.0),
        ("rollout/model_tokens", 40_000.0),
        ("rollout/parse_failures", 1.0),
        ("rollout/tool_calls/research", 50.0),
        ("rollout/finish/answer", 30.0),
    ] {
        m.push((k.to_string(), v + x));
    }
    m
}

fn stats(xs: &mut [f64]) -> (f64, f64, f64) {
    xs.sort_by(f64::total_cmp);
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    let pct = |p: f64| xs[((xs.len() - 1) as f64 * p).round() as usize];
    (mean, pct(0.5), pct(0.99))
}

fn report(what: &str, xs: &mut [f64]) -> f64 {
    let (mean, p50, p99) = stats(xs);
    println!(
        "{what:<44} mean {:>8.1} us  p50 {:>8.1} us  p99 {:>8.1} us  = {:.5}% of a {:.0} s step",
        mean * 1e6,
        p50 * 1e6,
        p99 * 1e6,
        100.0 * mean / STEP_SECS,
        STEP_SECS
    );
    mean
}

fn main() {
    let steps: i32 = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .find_map(|a| a.parse().ok())
        .unwrap_or(100);
    let per_step = step_metrics(0).len();
    println!("{steps} steps x {per_step} metrics per step");

    // (1) The writer alone.
    let dir = tempfile::tempdir().unwrap();
    let mut w = EventWriter::create(dir.path()).unwrap();
    let mut seen = Seen::default();
    let mut writer = Vec::new();
    for s in 0..steps {
        let rows: Vec<Row> = step_metrics(s)
            .into_iter()
            .map(|(name, value)| Row {
                step: s,
                name,
                value,
                recorded_ms: 1_700_000_000_000 + i64::from(s),
            })
            .collect();
        let t = Instant::now();
        let points = seen.take(&rows);
        w.write_points(&points).unwrap();
        writer.push(t.elapsed().as_secs_f64());
    }
    let bytes = std::fs::metadata(w.path()).unwrap().len();
    report("map + write + flush one step's event", &mut writer);
    println!(
        "event file: {bytes} bytes for {steps} steps ({} bytes a step)",
        bytes / steps as u64
    );

    // (2) The follower's poll against Postgres.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (pool, url) = bench_db::fresh("rubricem_bench_tracking", 4).await;
        let exp = db::runs::create_experiment(&pool, "bench", "smoke", &serde_json::json!({}))
            .await
            .unwrap();
        let run = db::runs::create_run(&pool, exp, "full", "full", &serde_json::json!({}), 0)
            .await
            .unwrap();
        let tb = tempfile::tempdir().unwrap();
        let cfg = TrackingConfig {
            tensorboard_dir: Some(tb.path().to_path_buf()),
            ..TrackingConfig::default()
        };
        let target = Target {
            run_id: run,
            run_name: "full".into(),
            recipe: "full".into(),
            experiment: "bench".into(),
            params: Vec::new(),
        };
        // Real steps are a minute or more apart, so a poll re-reads (LOOKBACK, 5 s) at most the
        // last step's rows; here steps come every 150 ms, so the window shrinks to 100 ms to
        // re-read the same amount.
        let mut session = Session::new(pool.clone(), &cfg, target)
            .unwrap()
            .unwrap()
            .with_lookback(chrono::TimeDelta::milliseconds(100));
        session.poll().await; // opens the event file
        let (mut busy, mut idle, mut record) = (Vec::new(), Vec::new(), Vec::new());
        for s in 0..steps {
            let m = step_metrics(s);
            let t = Instant::now();
            db::metrics::record(&pool, run, s, &m).await.unwrap();
            record.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            session.poll().await;
            busy.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            session.poll().await;
            idle.push(t.elapsed().as_secs_f64());
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        let mut settled = Vec::new();
        for _ in 0..50 {
            let t = Instant::now();
            session.poll().await;
            settled.push(t.elapsed().as_secs_f64());
        }
        let st = session.stats().clone();
        assert_eq!(st.errors, 0, "{st:?}");
        assert_eq!(st.points as usize, steps as usize * (per_step + 1));
        let rec = report("(reference) the stages' record() of a step", &mut record);
        let poll = report("follower poll after a step (read+map+write)", &mut busy);
        let idle_recent = report("idle poll, re-reading the last step", &mut idle);
        let idle_settled = report("idle poll, nothing recent", &mut settled);
        println!(
            "follower per step: {:.1} us = {:.5}% of a step ({:.2}x the step's own metric write); \
             idle polling every {POLL_SECS} s: {:.1} us per {:.0} s step = {:.5}%",
            poll * 1e6,
            100.0 * poll / STEP_SECS,
            poll / rec,
            idle_settled.max(idle_recent) * STEP_SECS / POLL_SECS * 1e6,
            STEP_SECS,
            100.0 * idle_settled.max(idle_recent) / POLL_SECS,
        );
        pool.close().await;
        bench_db::drop(&url).await;
    });
}
