//! What the experiment trackers read: a run's step metrics recorded after a cursor, and the run
//! a `orchestrator track --run` names.

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use super::DbError;

/// One row of `step_metrics`.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct MetricRow {
    pub step: i32,
    pub name: String,
    pub value: f64,
    pub recorded_at: DateTime<Utc>,
}

/// The run's metrics recorded (or overwritten) after `after` (all of them when `None`), oldest
/// first.
pub async fn metrics_since(
    pool: &PgPool,
    run_id: Uuid,
    after: Option<DateTime<Utc>>,
) -> Result<Vec<MetricRow>, DbError> {
    Ok(sqlx::query_as::<_, MetricRow>(
        "SELECT step, name, value, recorded_at FROM step_metrics
         WHERE run_id = $1 AND ($2::timestamptz IS NULL OR recorded_at > $2)
         ORDER BY recorded_at, step, name",
    )
    .bind(run_id)
    .bind(after)
    .fetch_all(pool)
    .await?)
}

/// A run as the trackers name it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct TrackedRun {
    pub id: Uuid,
    pub name: String,
    pub recipe: String,
    pub status: String,
    pub experiment_id: Uuid,
    pub experiment: String,
    pub created_at: DateTime<Utc>,
}

/// The runs `key` names, newest first: the run with that id, or every run named `key`, or
/// named `EXPERIMENT/RUN`.
pub async fn find_runs(pool: &PgPool, key: &str) -> Result<Vec<TrackedRun>, DbError> {
    Ok(sqlx::query_as::<_, TrackedRun>(
        "SELECT r.id, r.name, r.recipe, r.status, r.experiment_id, e.name AS experiment, r.created_at
         FROM runs r JOIN experiments e ON e.id = r.experiment_id
         WHERE r.id::text = $1 OR r.name = $1 OR e.name || '/' || r.name = $1
         ORDER BY r.created_at DESC, r.id",
    )
    .bind(key.trim())
    .fetch_all(pool)
    .await?)
}

/// The run `run_id`, as the trackers name it.
pub async fn run(pool: &PgPool, run_id: Uuid) -> Result<Option<TrackedRun>, DbError> {
    Ok(sqlx::query_as::<_, TrackedRun>(
        "SELECT r.id, r.name, r.recipe, r.status, r.experiment_id, e.name AS experiment, r.created_at
         FROM runs r JOIN experiments e ON e.id = r.experiment_id
         WHERE r.id = $1",
    )
    .bind(run_id)
    .fetch_optional(pool)
    .await?)
}
