//! `orchestrator track`: export an existing run's step metrics to TensorBoard and / or MLflow
//! post hoc (a finished run, or one started without `[tracking]`), under the same tracker names
//! the live follower of `orchestrator run` uses.

use std::process::ExitCode;

use super::out;
use crate::cli::TrackArgs;
use crate::domain::config::TrackingConfig;
use crate::infra::db;

pub(super) async fn track(args: &TrackArgs) -> anyhow::Result<ExitCode> {
    let cfg = TrackingConfig {
        tensorboard_dir: args.tensorboard.clone(),
        mlflow_url: args.mlflow_url.clone().filter(|u| !u.trim().is_empty()),
        mlflow_experiment: args.mlflow_experiment.clone(),
        ..TrackingConfig::default()
    };
    if !cfg.enabled() {
        anyhow::bail!("nothing to export to: give --tensorboard DIR and/or --mlflow-url URL");
    }
    let pool = db::open(&args.database_url, 4).await?;
    let runs = db::tracking::find_runs(&pool, &args.run).await?;
    let Some(run) = runs.first() else {
        anyhow::bail!(
            "no run `{}` in {} (give a run id, a run name or EXPERIMENT/NAME)",
            args.run,
            db::redact_url(&args.database_url)
        );
    };
    if runs.len() > 1 {
        out(format!(
            "{} runs are named `{}`; exporting the newest, {} of experiment {} (give the id or EXPERIMENT/NAME for another)",
            runs.len(),
            args.run,
            run.id,
            run.experiment
        ));
    }
    let params = db::runs::config_of(&pool, run.id)
        .await?
        .map(|c| crate::domain::tracking::flatten_params(&c))
        .unwrap_or_default();
    let Some(stats) = crate::pipeline::tracking::export(&pool, &cfg, run, params).await? else {
        anyhow::bail!("no tracker configured");
    };
    for f in &stats.event_files {
        out(format!("TensorBoard: {}", f.display()));
    }
    if let Some(r) = &stats.mlflow_run {
        out(format!("MLflow run: {r}"));
    }
    out(format!(
        "run {} ({}, {}): {} values exported, {} TensorBoard events, {} MLflow requests, {} errors",
        run.name,
        run.id,
        run.status,
        stats.points,
        stats.tensorboard_events,
        stats.mlflow_requests,
        stats.errors
    ));
    if stats.errors > 0 || stats.unsent > 0 {
        anyhow::bail!(
            "{} values were not exported ({} errors; the log says which tracker failed)",
            stats.unsent,
            stats.errors
        );
    }
    Ok(ExitCode::SUCCESS)
}
