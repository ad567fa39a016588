//! Per-step metrics in long format (run, step, name) -> value, written with UNNEST.

use sqlx::PgPool;
use uuid::Uuid;

use super::DbError;

/// Upsert metrics for one step; a rerun of the step overwrites its values.
pub async fn record(
    pool: &PgPool,
    run_id: Uuid,
    step: i32,
    metrics: &[(String, f64)],
) -> Result<(), DbError> {
    if let Some((name, v)) = metrics.iter().find(|(_, v)| !v.is_finite()) {
        return Err(DbError::Invalid {
            what: "metric",
            message: format!("`{name}` = {v} is not finite"),
        });
    }
    let names: Vec<&str> = metrics.iter().map(|(n, _)| n.as_str()).collect();
    let values: Vec<f64> = metrics.iter().map(|(_, v)| *v).collect();
    sqlx::query(
        "INSERT INTO step_metrics (run_id, step, name, value)
         SELECT $1, $2, n, v FROM UNNEST($3::text[], $4::float8[]) AS m(n, v)
         ON CONFLICT (run_id, step, name) DO UPDATE SET value = EXCLUDED.value, recorded_at = now()",
    )
    .bind(run_id)
    .bind(step)
    .bind(&names)
    .bind(&values)
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn fetch(pool: &PgPool, run_id: Uuid, name: &str) -> Result<Vec<(i32, f64)>, DbError> {
    Ok(sqlx::query_as(
        "SELECT step, value FROM step_metrics WHERE run_id = $1 AND name = $2 ORDER BY step",
    )
    .bind(run_id)
    .bind(name)
    .fetch_all(pool)
    .await?)
}

/// One metric of one step, if recorded.
pub async fn value(
    pool: &PgPool,
    run_id: Uuid,
    step: i32,
    name: &str,
) -> Result<Option<f64>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT value FROM step_metrics WHERE run_id = $1 AND step = $2 AND name = $3",
    )
    .bind(run_id)
    .bind(step)
    .bind(name)
    .fetch_optional(pool)
    .await?)
}
