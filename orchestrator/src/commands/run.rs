//! `orchestrator run`: register the experiment (or find the runs to resume), then run each
//! recipe's pipeline in turn. Ctrl-C stops starting rollouts, trains what is already judged and
//! leaves the run `paused`; a second Ctrl-C exits at once. `--resume` takes a run id or an
//! experiment id and continues every run of it that is not completed, on the configuration the
//! run was started with (database URL and endpoints may be overridden). Several orchestrators
//! may share an experiment: each runs the runs that no other holds (`--resume EXPERIMENT` with
//! other `--policy-url` / `--trainer-url` starts a second one beside the first).

use std::process::ExitCode;

use super::{cancel_on_ctrl_c, load_config, out};
use crate::cli::ConfigArgs;
use crate::infra::db;
use crate::pipeline::run::{Claim, RunStatus, claim, find_resumable, mark, register_experiment};
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
    let shared = runs.len() > 1;
    for run in runs {
        if cancel.is_cancelled() {
            break;
        }
        let (run_id, name) = (run.id, run.name);
        let mut judge_down = false;
        // One orchestrator per run. Of an experiment's several runs, those another orchestrator
        // holds or has completed meanwhile are left to it (two orchestrators with their own
        // servers share the runs of `--resume EXPERIMENT`); a single run held is refused,
        // naming the holder.
        let lease = match claim(&pool, run_id).await? {
            Claim::Mine(lease) => lease,
            Claim::Held(e) if shared => {
                out(format!(
                    "run {name} ({run_id}): left to another orchestrator: {e}"
                ));
                continue;
            }
            Claim::Held(e) => return Err(e.into()),
            Claim::Completed => {
                out(format!(
                    "run {name} ({run_id}): completed by another orchestrator"
                ));
                continue;
            }
        };
        mark(&pool, run_id, RunStatus::Running, None).await?;
        let pipeline =
            match setup::pipeline(&cfg, &pool, &common, run_id, run.recipe, run.seed).await {
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
