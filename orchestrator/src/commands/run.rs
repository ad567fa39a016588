//! `orchestrator run`: register the experiment (or find the runs to resume), then run each
//! recipe's pipeline in turn. Ctrl-C stops starting rollouts, trains what is already judged and
//! leaves the run `paused`; a second Ctrl-C exits at once. `--resume` takes a run id or an
//! experiment id and continues every run of it that is not completed, on the configuration the
//! run was started with (database URL and endpoints may be overridden).

use std::process::ExitCode;

use super::{cancel_on_ctrl_c, load_config, out};
use crate::cli::ConfigArgs;
use crate::infra::db;
use crate::pipeline::run::{RunStatus, find_resumable, mark, register_experiment};
use crate::pipeline::{setup, tracking};

pub(super) async fn run_experiment(
    args: &ConfigArgs,
    resume: Option<uuid::Uuid>,
) -> anyhow::Result<ExitCode> {
    let cfg = load_config(args)?;
    let pool = db::open(&cfg.database.url, cfg.database.max_connections).await?;
    let refuse = |cfg: &crate::domain::config::Config, recipes: &[_]| -> anyhow::Result<()> {
        let missing = setup::missing_inputs(cfg, recipes);
        if missing.is_empty() {
            return Ok(());
        }
        anyhow::bail!(
            "experiment {} cannot start; missing inputs:\n  - {}",
            cfg.experiment.name,
            missing.join("\n  - ")
        )
    };
    let (cfg, runs) = match resume {
        Some(id) => {
            let (cfg, runs) = find_resumable(&pool, cfg, id, args.steps).await?;
            let recipes: Vec<_> = runs.iter().map(|r| r.recipe).collect();
            refuse(&cfg, &recipes)?;
            (cfg, runs)
        }
        None => {
            refuse(&cfg, &cfg.experiment.recipes)?;
            let (exp, runs) = register_experiment(&pool, &cfg, &args.experiment).await?;
            out(format!(
                "experiment {} ({}) registered as {exp} with {} run(s), {} steps each",
                cfg.experiment.name,
                cfg.experiment.description,
                runs.len(),
                cfg.experiment.steps
            ));
            (cfg, runs)
        }
    };
    let recipes: Vec<_> = runs.iter().map(|r| r.recipe).collect();
    out(setup::summary(&cfg, &recipes));
    let common = setup::common(&cfg, &pool).await?;
    let (cancel, watcher) = cancel_on_ctrl_c(
        "interrupted: no new rollouts; finishing judged steps (Ctrl-C again to quit now)",
        true,
    );
    let mut failed = false;
    for run in runs {
        if cancel.is_cancelled() {
            break;
        }
        let (run_id, name) = (run.id, run.name);
        let mut judge_down = false;
        // One orchestrator per run: a second one is refused here, naming the holder.
        let lease = db::lease::acquire(&pool, run_id, &db::lease::this_process()).await?;
        mark(&pool, run_id, RunStatus::Running, None).await?;
        let pipeline = match setup::pipeline(&cfg, &pool, &common, run_id, run.recipe).await {
            Ok(p) => std::sync::Arc::new(p),
            Err(e) => {
                let msg = crate::domain::util::error_chain(&e);
                mark(&pool, run_id, RunStatus::Failed, Some(&msg)).await?;
                return Err(anyhow::anyhow!(msg).context(format!("run {name} ({run_id})")));
            }
        };
        let pb = crate::telemetry::progress(u64::from(cfg.experiment.steps), &name);
        let trackers = tracking::follow(&pool, &cfg, run_id, &name, run.recipe.as_str());
        let result = pipeline.run(cancel.clone(), pb.clone()).await;
        pb.finish_and_clear();
        if let Some(t) = trackers {
            t.finish(tracking::end_status(&result)).await;
        }
        match result {
            Ok(o) => {
                let status = if o.interrupted {
                    RunStatus::Paused
                } else {
                    RunStatus::Completed
                };
                mark(&pool, run_id, status, None).await?;
                let curve = db::metrics::fetch(&pool, run_id, "reward/answer").await?;
                let mean = |xs: &[(i32, f64)]| {
                    xs.iter().map(|x| x.1).sum::<f64>() / xs.len().max(1) as f64
                };
                let k = curve.len().min(3);
                out(format!(
                    "run {name} ({run_id}): {}, {} of {} steps ({} now, {} replayed into the trainer); \
                     answer reward first {k} steps {:.4}, last {k} steps {:.4}",
                    status.as_str(),
                    o.completed,
                    cfg.experiment.steps,
                    o.completed_now,
                    o.replayed,
                    mean(&curve[..k]),
                    mean(&curve[curve.len() - k..]),
                ));
                if let Some(c) = crate::pipeline::evaluate::change(
                    &pool,
                    run_id,
                    crate::pipeline::evaluate::HELD_OUT,
                )
                .await?
                {
                    out(format!("run {name}: {c}"));
                }
            }
            Err(e @ crate::pipeline::PipelineError::JudgeDown { .. }) => {
                let msg = crate::domain::util::error_chain(&e);
                mark(&pool, run_id, RunStatus::Paused, Some(&msg)).await?;
                out(format!("run {name} ({run_id}): paused: {msg}"));
                failed = true;
                judge_down = true;
            }
            Err(e) => {
                let msg = crate::domain::util::error_chain(&e);
                mark(&pool, run_id, RunStatus::Failed, Some(&msg)).await?;
                out(format!("run {name} ({run_id}): failed: {msg}"));
                failed = true;
            }
        }
        lease.release().await;
        if judge_down {
            break;
        }
    }
    watcher.abort();
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
