//! Benchmark sets in a training run (`[[eval.sets]]` with `benchmark`): at each due policy
//! version the run's agent answers the set's items and the set's gold judge panel grades them by
//! the benchmark's protocol (a benchmark evaluation stored with the run and version); the gold
//! score goes into the step metrics beside the training reward, and the reward-hacking monitor
//! flags a training reward that rises while the gold score falls.

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{BenchError, BenchRun, GradeOptions, JudgeSpec, Responder, Templates};
use crate::domain::bench::load::{LoadOptions, load};
use crate::domain::bench::monitor::{Point, diverging};
use crate::domain::bench::sample::{Sampling, select};
use crate::domain::bench::{Benchmark, Item};
use crate::domain::config::{Config, EvalSet};
use crate::infra::db;
use crate::pipeline::rollout::RolloutCtx;

/// Evaluations the monitor looks back over.
pub const MONITOR_WINDOW: usize = 3;
/// Changes smaller than this (on the 0..1 scale) are noise to the monitor.
pub const MONITOR_TOLERANCE: f64 = 0.01;

/// A benchmark evaluation set of a run.
#[derive(Clone)]
pub struct BenchSet {
    pub name: String,
    pub bench: Benchmark,
    pub data_path: String,
    pub data_sha256: String,
    pub items: Vec<Item>,
    pub selection: serde_json::Value,
    pub judges: Vec<JudgeSpec>,
    /// The set's sampling temperature (`eval.sets.temperature`); `None` = `eval.temperature`.
    pub temperature: Option<f32>,
}

/// The benchmark sets of `cfg.eval.sets` (seeded DR Tulu draw of `size` items).
pub fn load_sets(cfg: &Config) -> Result<Vec<BenchSet>, String> {
    cfg.eval
        .sets
        .iter()
        .filter(|s| s.benchmark.is_some())
        .map(|s| load_set(cfg, s))
        .collect()
}

fn load_set(cfg: &Config, set: &EvalSet) -> Result<BenchSet, String> {
    let bench: Benchmark = set.benchmark.as_deref().unwrap_or("").parse()?;
    let all = load(bench, &set.tasks, &LoadOptions::default()).map_err(|e| e.to_string())?;
    let bytes = std::fs::read(&set.tasks)
        .map_err(|e| format!("cannot read {}: {e}", set.tasks.display()))?;
    let picked = select(
        all.len(),
        Some(set.size as usize),
        Some(cfg.experiment.seed),
        Sampling::DrTulu,
    );
    let items: Vec<Item> = picked.iter().map(|&i| all[i].clone()).collect();
    let http = crate::infra::llm::build_http(Duration::from_secs(10)).map_err(|e| e.to_string())?;
    let judges = set
        .judges
        .iter()
        .map(|j| {
            JudgeSpec::on_endpoint(
                cfg,
                http.clone(),
                &j.url,
                &j.model,
                j.api_key_env.as_deref(),
                cfg.judge.max_concurrency as usize,
                cfg.judge.timeout_secs,
            )
            .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(BenchSet {
        name: set.name.clone(),
        bench,
        data_path: set.tasks.display().to_string(),
        data_sha256: crate::domain::util::sha256_hex(&bytes),
        items,
        selection: json!({"limit": set.size, "seed": cfg.experiment.seed, "sampling": "drtulu"}),
        judges,
        temperature: set.temperature,
    })
}

/// The stored name of a set's evaluation at a version.
pub fn eval_name(run_id: uuid::Uuid, set: &str, version: i32) -> String {
    format!("{run_id}/{set}/v{version}")
}

/// Evaluate one set at `version` with the run's agent (unless stored finished), record the
/// gold score and the monitor's flag at step `version - 1`. `Ok(None)` when cancelled.
#[allow(clippy::too_many_arguments)]
pub async fn evaluate_set(
    pool: &sqlx::PgPool,
    run_id: uuid::Uuid,
    set: &BenchSet,
    version: i32,
    ctx: RolloutCtx,
    system: &str,
    max_inflight: usize,
    cancel: &CancellationToken,
) -> Result<Option<f64>, BenchError> {
    let name = eval_name(run_id, &set.name, version);
    let score = match db::bench::find(pool, &name).await? {
        Some(row) if row.status == "finished" => {
            row.summary.as_ref().and_then(|s| s["score"].as_f64())
        }
        _ => {
            let spec = BenchRun {
                name: name.clone(),
                bench: set.bench,
                data_path: set.data_path.clone(),
                data_sha256: set.data_sha256.clone(),
                items: set.items.clone(),
                selection: set.selection.clone(),
                responder_desc: json!({"kind": "agent", "run": run_id, "version": version, "scaffold": ctx.scaffold}),
                responder: Responder::Agent {
                    ctx: Box::new(ctx),
                    system: system.to_string(),
                    policy_version: version,
                },
                judges: set.judges.clone(),
                templates: Templates::embedded(),
                opts: GradeOptions::default(),
                gen_inflight: max_inflight.max(1),
                judge_inflight: 64,
                bootstrap: 1000,
                seed: 0,
                source_run_id: Some(run_id),
                policy_version: Some(version),
                progress: false,
            };
            match super::run(pool, spec, cancel).await {
                Ok(s) => s.score,
                Err(BenchError::Interrupted { .. }) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    };
    if version > 0 {
        let mut metrics = Vec::new();
        if let Some(g) = score {
            metrics.push((
                format!("gold/{}", set.name),
                g / crate::domain::bench::SCALE,
            ));
        }
        let flag = monitor(pool, run_id, &set.name).await?;
        metrics.push((
            format!("monitor/divergence/{}", set.name),
            f64::from(u8::from(flag)),
        ));
        if flag {
            tracing::warn!(set = %set.name, version, "training reward rises while the gold score falls: possible reward hacking");
        }
        db::metrics::record(pool, run_id, version - 1, &metrics).await?;
    }
    Ok(score)
}

/// The monitor's points of one set: (version, training reward of the step that made it, gold
/// score), over the set's finished evaluations of the run.
pub async fn points(
    pool: &sqlx::PgPool,
    run_id: uuid::Uuid,
    set: &str,
) -> Result<Vec<Point>, crate::infra::db::DbError> {
    let rewards: std::collections::HashMap<i32, f64> =
        db::metrics::fetch(pool, run_id, "reward/mean")
            .await?
            .into_iter()
            .collect();
    let prefix = format!("{run_id}/{set}/v");
    let mut out = Vec::new();
    for row in db::bench::for_source(pool, run_id).await? {
        let (Some(v), Some(summary)) = (row.policy_version, row.summary.as_ref()) else {
            continue;
        };
        if !row.name.starts_with(&prefix) || row.status != "finished" || v < 1 {
            continue;
        }
        if let (Some(&reward), Some(gold)) = (rewards.get(&(v - 1)), summary["score"].as_f64()) {
            out.push(Point {
                version: v,
                reward,
                gold: gold / crate::domain::bench::SCALE,
            });
        }
    }
    out.sort_by_key(|p| p.version);
    Ok(out)
}

async fn monitor(pool: &sqlx::PgPool, run_id: uuid::Uuid, set: &str) -> Result<bool, BenchError> {
    let pts = points(pool, run_id, set).await?;
    Ok(diverging(&pts, MONITOR_WINDOW, MONITOR_TOLERANCE))
}

/// The set as log messages name it.
pub fn describe(set: &BenchSet) -> String {
    format!(
        "{} ({} items of {} from {}, {} gold judge(s))",
        set.name,
        set.items.len(),
        set.bench,
        Path::new(&set.data_path).display(),
        set.judges.len()
    )
}
