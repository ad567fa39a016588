//! Experiments, runs and steps.

use sqlx::PgPool;
use uuid::Uuid;

use super::DbError;

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct RunRow {
    pub id: Uuid,
    pub experiment_id: Uuid,
    pub name: String,
    pub recipe: String,
    pub status: String,
    pub seed: i64,
}

pub async fn create_experiment(
    pool: &PgPool,
    name: &str,
    preset: &str,
    config: &serde_json::Value,
) -> Result<Uuid, DbError> {
    let id = Uuid::now_v7();
    sqlx::query("INSERT INTO experiments (id, name, preset, config) VALUES ($1, $2, $3, $4)")
        .bind(id)
        .bind(name)
        .bind(preset)
        .bind(config)
        .execute(pool)
        .await?;
    Ok(id)
}

pub async fn create_run(
    pool: &PgPool,
    experiment_id: Uuid,
    name: &str,
    recipe: &str,
    config: &serde_json::Value,
    seed: i64,
) -> Result<Uuid, DbError> {
    let id = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO runs (id, experiment_id, name, recipe, config, seed) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(id)
    .bind(experiment_id)
    .bind(name)
    .bind(recipe)
    .bind(config)
    .bind(seed)
    .execute(pool)
    .await?;
    Ok(id)
}

pub async fn set_run_status(
    pool: &PgPool,
    run_id: Uuid,
    status: &str,
    error: Option<&str>,
) -> Result<(), DbError> {
    let done = matches!(status, "completed" | "failed" | "cancelled");
    let n = sqlx::query(
        "UPDATE runs SET status = $2, error = $3, updated_at = now(),
                finished_at = CASE WHEN $4 THEN now() ELSE finished_at END
         WHERE id = $1",
    )
    .bind(run_id)
    .bind(status)
    .bind(error)
    .bind(done)
    .execute(pool)
    .await?
    .rows_affected();
    if n == 0 {
        return Err(DbError::Invalid {
            what: "run id",
            message: format!("no run {run_id}"),
        });
    }
    Ok(())
}

pub async fn get_run(pool: &PgPool, run_id: Uuid) -> Result<Option<RunRow>, DbError> {
    Ok(sqlx::query_as::<_, RunRow>(
        "SELECT id, experiment_id, name, recipe, status, seed FROM runs WHERE id = $1",
    )
    .bind(run_id)
    .fetch_optional(pool)
    .await?)
}

/// Open a step (idempotent: re-opening an existing step keeps it).
pub async fn begin_step(
    pool: &PgPool,
    run_id: Uuid,
    step: i32,
    policy_version: i32,
    task_ids: &[Uuid],
) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO steps (run_id, step, policy_version, task_ids) VALUES ($1, $2, $3, $4)
         ON CONFLICT (run_id, step) DO NOTHING",
    )
    .bind(run_id)
    .bind(step)
    .bind(policy_version)
    .bind(task_ids)
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn set_step_status(
    pool: &PgPool,
    run_id: Uuid,
    step: i32,
    status: &str,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE steps SET status = $3,
                finished_at = CASE WHEN $3 IN ('completed', 'abandoned') THEN now() ELSE NULL END
         WHERE run_id = $1 AND step = $2",
    )
    .bind(run_id)
    .bind(step)
    .bind(status)
    .execute(pool)
    .await?;
    Ok(())
}

/// The runs of an experiment, in creation order.
pub async fn list_for_experiment(
    pool: &PgPool,
    experiment_id: Uuid,
) -> Result<Vec<RunRow>, DbError> {
    Ok(sqlx::query_as(
        "SELECT id, experiment_id, name, recipe, status, seed FROM runs
         WHERE experiment_id = $1 ORDER BY created_at, id",
    )
    .bind(experiment_id)
    .fetch_all(pool)
    .await?)
}

/// A run's configuration snapshot (what it was started with).
pub async fn config_of(pool: &PgPool, run_id: Uuid) -> Result<Option<serde_json::Value>, DbError> {
    Ok(sqlx::query_scalar("SELECT config FROM runs WHERE id = $1")
        .bind(run_id)
        .fetch_optional(pool)
        .await?)
}
