//! The run lifecycle, kept once for `orchestrator run` and `orchestrator rollout`: register an
//! experiment and its runs, find the runs a `--resume` continues (and the configuration they
//! continue on), mark a run's status, and open and close the single step of a rollout-only run.

use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::config::{Config, Recipe};
use crate::infra::db::{self, DbError};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("--resume {id}: no run or experiment with that id in {url}")]
    NothingToResume { id: Uuid, url: String },
    #[error("the run's stored configuration no longer parses")]
    StoredConfig(#[source] serde_json::Error),
}

/// A run's lifecycle status, as stored in `runs.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    Running,
    /// Interrupted (Ctrl-C) with its finished steps kept; `--resume` continues it.
    Paused,
    Completed,
    Cancelled,
    Failed,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Completed => "completed",
            Self::Cancelled => "cancelled",
            Self::Failed => "failed",
        }
    }
}

/// One run of an experiment to carry out: its id, recipe and display name.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedRun {
    pub id: Uuid,
    pub recipe: Recipe,
    pub name: String,
}

/// Store an experiment named `name` (from preset `preset`) and one run per `(name, recipe)`,
/// each with the configuration snapshot and seed of `cfg`. Returns the experiment id and the
/// run ids in order.
async fn create(
    pool: &PgPool,
    cfg: &Config,
    name: &str,
    preset: &str,
    runs: &[(&str, &str)],
) -> Result<(Uuid, Vec<Uuid>), DbError> {
    let snapshot = cfg.snapshot();
    let exp = db::runs::create_experiment(pool, name, preset, &snapshot).await?;
    let mut ids = Vec::with_capacity(runs.len());
    for (run_name, recipe) in runs {
        let id = db::runs::create_run(
            pool,
            exp,
            run_name,
            recipe,
            &snapshot,
            cfg.experiment.seed as i64,
        )
        .await?;
        ids.push(id);
    }
    Ok((exp, ids))
}

/// Register a new experiment from preset `preset` with one run per configured recipe (named
/// after the recipe). Returns the experiment id and the runs to carry out, in recipe order.
pub async fn register_experiment(
    pool: &PgPool,
    cfg: &Config,
    preset: &str,
) -> Result<(Uuid, Vec<PlannedRun>), DbError> {
    let names: Vec<(&str, &str)> = cfg
        .experiment
        .recipes
        .iter()
        .map(|r| (r.as_str(), r.as_str()))
        .collect();
    let (exp, ids) = create(pool, cfg, &cfg.experiment.name, preset, &names).await?;
    let runs = ids
        .into_iter()
        .zip(&cfg.experiment.recipes)
        .map(|(id, recipe)| PlannedRun {
            id,
            recipe: *recipe,
            name: recipe.as_str().to_string(),
        })
        .collect();
    Ok((exp, runs))
}

/// The `--resume` merge policy: a resumed run continues on the configuration it was started
/// with (`stored`), except where it must reach the world of today (`current`): the database,
/// the policy servers, the trainer and the judge servers, and the trackers when any is given;
/// `--steps`, when given, extends it.
pub fn merge_resumed(mut stored: Config, current: &Config, steps: Option<u32>) -> Config {
    stored.database = current.database.clone();
    stored.policy.urls = current.policy.urls.clone();
    stored.trainer = current.trainer.clone();
    stored.judge.urls = current.judge.urls.clone();
    // Trackers given now replace the stored ones (whose MLflow URL is stored redacted).
    if current.tracking.enabled() {
        stored.tracking = current.tracking.clone();
    }
    if let Some(steps) = steps {
        stored.experiment.steps = steps;
    }
    stored
}

/// The runs `--resume id` continues: the run `id`, or every run of experiment `id`, less those
/// already completed; with the configuration to continue on ([`merge_resumed`] of the first
/// run's stored snapshot and `cfg`; `cfg` itself when no snapshot is stored).
pub async fn find_resumable(
    pool: &PgPool,
    cfg: Config,
    id: Uuid,
    steps: Option<u32>,
) -> Result<(Config, Vec<PlannedRun>), RunError> {
    let rows = match db::runs::get_run(pool, id).await? {
        Some(r) => vec![r],
        None => db::runs::list_for_experiment(pool, id).await?,
    };
    if rows.is_empty() {
        return Err(RunError::NothingToResume {
            id,
            url: db::redact_url(&cfg.database.url),
        });
    }
    let cfg = match db::runs::config_of(pool, rows[0].id).await? {
        Some(snap) => {
            let stored: Config = serde_json::from_value(snap).map_err(RunError::StoredConfig)?;
            merge_resumed(stored, &cfg, steps)
        }
        None => cfg,
    };
    let runs = rows
        .into_iter()
        .filter(|r| r.status != RunStatus::Completed.as_str())
        .map(|r| PlannedRun {
            id: r.id,
            // Runs made by `orchestrator rollout` have no recipe.
            recipe: Recipe::parse(&r.recipe).unwrap_or(Recipe::Full),
            name: r.name,
        })
        .collect();
    Ok((cfg, runs))
}

/// Set a run's status (and its error message, for [`RunStatus::Failed`]).
pub async fn mark(
    pool: &PgPool,
    run_id: Uuid,
    status: RunStatus,
    error: Option<&str>,
) -> Result<(), DbError> {
    db::runs::set_run_status(pool, run_id, status.as_str(), error).await
}

/// The one step of a rollout-only run.
pub const ROLLOUT_STEP: i32 = 0;

/// Start the run of `orchestrator rollout`: an experiment named `rollout` (from preset
/// `preset`) with one run `rollout`, marked running, its single step opened on policy
/// version 0 over `task_ids`. Returns the run id.
pub async fn start_rollout_run(
    pool: &PgPool,
    cfg: &Config,
    preset: &str,
    task_ids: &[Uuid],
) -> Result<Uuid, DbError> {
    let (_, ids) = create(pool, cfg, "rollout", preset, &[("rollout", "rollout")]).await?;
    let run_id = ids[0];
    mark(pool, run_id, RunStatus::Running, None).await?;
    db::runs::begin_step(pool, run_id, ROLLOUT_STEP, 0, task_ids).await?;
    Ok(run_id)
}

/// Close the run of `orchestrator rollout`: its step and the run become `cancelled` when the
/// rollouts were interrupted, `completed` otherwise. Returns the status set.
pub async fn finish_rollout_run(
    pool: &PgPool,
    run_id: Uuid,
    cancelled: bool,
) -> Result<RunStatus, DbError> {
    let status = if cancelled {
        RunStatus::Cancelled
    } else {
        RunStatus::Completed
    };
    db::runs::set_step_status(pool, run_id, ROLLOUT_STEP, status.as_str()).await?;
    mark(pool, run_id, status, None).await?;
    Ok(status)
}
