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
    #[error(transparent)]
    Lease(#[from] db::lease::LeaseError),
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

/// One run of an experiment to carry out: its id, recipe, training seed and display name.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedRun {
    pub id: Uuid,
    pub recipe: Recipe,
    pub seed: u64,
    pub name: String,
}

/// Store an experiment named `name` (from preset `preset`) and one run per `(name, recipe,
/// seed)`, each with the configuration snapshot of `cfg`. Returns the experiment id and the
/// run ids in order.
async fn create(
    pool: &PgPool,
    cfg: &Config,
    name: &str,
    preset: &str,
    runs: &[(String, &str, u64)],
) -> Result<(Uuid, Vec<Uuid>), DbError> {
    let snapshot = cfg.snapshot();
    let exp = db::runs::create_experiment(pool, name, preset, &snapshot).await?;
    let mut ids = Vec::with_capacity(runs.len());
    for (run_name, recipe, seed) in runs {
        let id = db::runs::create_run(pool, exp, run_name, recipe, &snapshot, *seed as i64).await?;
        ids.push(id);
    }
    Ok((exp, ids))
}

/// The runs of an experiment, seed-major (every recipe on the first seed, then on the next, so
/// an experiment cut short still compares the recipes on the seeds it finished): `(recipe,
/// seed, name)`, named after the recipe, with `-s<seed>` when there are several seeds.
pub fn plan(cfg: &Config) -> Vec<(Recipe, u64, String)> {
    let seeds = cfg.experiment.run_seeds();
    let several = seeds.len() > 1;
    seeds
        .iter()
        .flat_map(|&seed| {
            cfg.experiment.recipes.iter().map(move |&r| {
                let name = if several {
                    format!("{}-s{seed}", r.as_str())
                } else {
                    r.as_str().to_string()
                };
                (r, seed, name)
            })
        })
        .collect()
}

/// Register a new experiment from preset `preset` with one run per configured recipe and seed
/// ([`plan`]). Returns the experiment id and the runs to carry out, in that order.
pub async fn register_experiment(
    pool: &PgPool,
    cfg: &Config,
    preset: &str,
) -> Result<(Uuid, Vec<PlannedRun>), DbError> {
    let planned = plan(cfg);
    let rows: Vec<(String, &str, u64)> = planned
        .iter()
        .map(|(r, seed, name)| (name.clone(), r.as_str(), *seed))
        .collect();
    let (exp, ids) = create(pool, cfg, &cfg.experiment.name, preset, &rows).await?;
    let runs = ids
        .into_iter()
        .zip(planned)
        .map(|(id, (recipe, seed, name))| PlannedRun {
            id,
            recipe,
            seed,
            name,
        })
        .collect();
    Ok((exp, runs))
}

/// The `--resume` merge policy: a resumed run continues on the configuration it was started
/// with (`stored`), except where it must reach the world of today (`current`): the database,
/// the policy servers, the trainer's URL and the judge servers, and the trackers when any is
/// given; `--steps`, when given, extends it. The trainer's settings stay the stored ones: a
/// resume under another preset must not change a run's learning rate halfway.
pub fn merge_resumed(mut stored: Config, current: &Config, steps: Option<u32>) -> Config {
    stored.database = current.database.clone();
    stored.policy.urls = current.policy.urls.clone();
    stored.trainer.url = current.trainer.url.clone();
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
            seed: r.seed as u64,
            name: r.name,
        })
        .collect();
    Ok((cfg, runs))
}

/// What [`claim`] found.
#[derive(Debug)]
pub enum Claim {
    /// The run is this process's to run until the lease is released.
    Mine(db::lease::RunLease),
    /// Another orchestrator holds the run (the lease error names it).
    Held(db::lease::LeaseError),
    /// The run was completed (by another orchestrator) since the runs were listed.
    Completed,
}

/// Take the lease of a planned run for this process. Several orchestrators (each with its own
/// policy servers and trainer) can share one experiment's runs this way: each runs the runs no
/// other holds and that are not completed yet.
pub async fn claim(pool: &PgPool, run_id: Uuid) -> Result<Claim, RunError> {
    let lease = match db::lease::acquire(
        pool,
        run_id,
        &db::lease::this_process(),
        db::lease::HELD_GRACE,
    )
    .await
    {
        Ok(l) => l,
        Err(e @ db::lease::LeaseError::Held { .. }) => return Ok(Claim::Held(e)),
        Err(e) => return Err(e.into()),
    };
    let done = db::runs::get_run(pool, run_id)
        .await?
        .is_some_and(|r| r.status == RunStatus::Completed.as_str());
    if done {
        lease.release().await;
        return Ok(Claim::Completed);
    }
    Ok(Claim::Mine(lease))
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
    let (_, ids) = create(
        pool,
        cfg,
        "rollout",
        preset,
        &[("rollout".to_string(), "rollout", cfg.experiment.seed)],
    )
    .await?;
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

#[cfg(test)]
mod tests {
    use super::plan;
    use crate::domain::config::{Config, Overrides, Recipe};

    #[test]
    fn a_resume_reaches_todays_trainer_but_keeps_the_runs_settings() {
        let stored = Config::load("ablation-mini", &Overrides::default()).unwrap();
        let mut current = Config::load("smoke", &Overrides::default()).unwrap();
        current.trainer.url = "http://127.0.0.1:8200".into();
        current.policy.urls = vec!["http://127.0.0.1:8201".into()];
        assert_ne!(current.trainer.settings, stored.trainer.settings);
        let merged = super::merge_resumed(stored.clone(), &current, Some(20));
        assert_eq!(merged.trainer.url, "http://127.0.0.1:8200");
        assert_eq!(merged.policy.urls, current.policy.urls);
        assert_eq!(merged.trainer.settings, stored.trainer.settings);
        assert_eq!(merged.trainer.settings.lr, 5e-5);
        assert_eq!(merged.experiment.steps, 20);
        assert_eq!(merged.experiment.seeds, stored.experiment.seeds);
    }

    #[test]
    fn runs_are_planned_seed_major_and_named_by_seed_when_several() {
        let cfg = Config::load("ablation-mini", &Overrides::default()).unwrap();
        let smoke = Config::load("smoke", &Overrides::default()).unwrap();
        // Seed-major: every recipe on 17, then on 18.
        let planned = plan(&cfg);
        let names: Vec<&str> = planned.iter().map(|p| p.2.as_str()).collect();
        assert_eq!(
            names,
            [
                "baseline-rl-s17",
                "ss-grpo-s17",
                "meta-policy-s17",
                "full-s17",
                "baseline-rl-s18",
                "ss-grpo-s18",
                "meta-policy-s18",
                "full-s18"
            ]
        );
        assert!(planned[..4].iter().all(|p| p.1 == 17) && planned[4..].iter().all(|p| p.1 == 18));
        // One seed keeps the recipe's plain name.
        let one = plan(&smoke);
        assert_eq!(one, vec![(Recipe::Full, 17, "full".to_string())]);
    }
}
