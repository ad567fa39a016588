//! The pipeline's bookkeeping: a step's rollouts committed together with its status, step
//! states for resume, and trainer checkpoints. Every decision `--resume` makes is derived from
//! these rows, so each write that moves a step forward is one transaction.

use sqlx::PgPool;
use uuid::Uuid;

use super::DbError;
use crate::domain::rollout::Rollout;

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StepRow {
    pub step: i32,
    pub status: String,
    pub policy_version: i32,
}

/// Open step `step` afresh: whatever an interrupted attempt left (the step row and, by
/// cascade, any trajectories) is removed first.
pub async fn restart_step(
    pool: &PgPool,
    run_id: Uuid,
    step: i32,
    policy_version: i32,
    task_ids: &[Uuid],
) -> Result<(), DbError> {
    let mut tx = pool.begin().await?;
    sqlx::query("DELETE FROM steps WHERE run_id = $1 AND step = $2")
        .bind(run_id)
        .bind(step)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO steps (run_id, step, policy_version, task_ids, status)
         VALUES ($1, $2, $3, $4, 'rollout')",
    )
    .bind(run_id)
    .bind(step)
    .bind(policy_version)
    .bind(task_ids)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Store a step's rollouts and mark it ready for judging, atomically: after a crash a step
/// either has all its trajectories or none.
pub async fn commit_rollouts(
    pool: &PgPool,
    run_id: Uuid,
    step: i32,
    rollouts: &[Rollout],
) -> Result<(), DbError> {
    let mut tx = pool.begin().await?;
    super::rollouts::insert_in(&mut tx, rollouts).await?;
    let n = sqlx::query(
        "UPDATE steps SET status = 'judging' WHERE run_id = $1 AND step = $2 AND status = 'rollout'",
    )
    .bind(run_id)
    .bind(step)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if n != 1 {
        return Err(DbError::Invalid {
            what: "step",
            message: format!("run {run_id} step {step} is not open for rollouts"),
        });
    }
    tx.commit().await?;
    Ok(())
}

pub async fn steps(pool: &PgPool, run_id: Uuid) -> Result<Vec<StepRow>, DbError> {
    Ok(sqlx::query_as(
        "SELECT step, status, policy_version FROM steps WHERE run_id = $1 ORDER BY step",
    )
    .bind(run_id)
    .fetch_all(pool)
    .await?)
}

/// Whether judging of the step was committed (judge_step writes all scores in one transaction).
pub async fn is_judged(
    pool: &PgPool,
    run_id: Uuid,
    step: i32,
    judge_model: &str,
) -> Result<bool, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM stage_scores s JOIN trajectories t ON t.id = s.trajectory_id
                        WHERE t.run_id = $1 AND t.step = $2 AND s.judge_model = $3)",
    )
    .bind(run_id)
    .bind(step)
    .bind(judge_model)
    .fetch_one(pool)
    .await?)
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct CheckpointRow {
    pub step: i32,
    pub policy_version: i32,
    pub kind: String,
    pub path: String,
}

pub async fn record_checkpoint(
    pool: &PgPool,
    run_id: Uuid,
    row: &CheckpointRow,
    state: &serde_json::Value,
) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO checkpoints (id, run_id, step, policy_version, kind, path, state)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (run_id, step) DO UPDATE
         SET policy_version = EXCLUDED.policy_version, kind = EXCLUDED.kind,
             path = EXCLUDED.path, state = EXCLUDED.state, created_at = now()",
    )
    .bind(Uuid::now_v7())
    .bind(run_id)
    .bind(row.step)
    .bind(row.policy_version)
    .bind(&row.kind)
    .bind(&row.path)
    .bind(state)
    .execute(pool)
    .await?;
    Ok(())
}

/// The trainer settings a run's trainer echoed back, and their hash.
pub async fn record_trainer_settings(
    pool: &PgPool,
    run_id: Uuid,
    settings: &serde_json::Value,
    hash: &str,
) -> Result<(), DbError> {
    sqlx::query("UPDATE runs SET trainer_settings = $2, trainer_settings_hash = $3 WHERE id = $1")
        .bind(run_id)
        .bind(settings)
        .bind(hash)
        .execute(pool)
        .await?;
    Ok(())
}

/// A run's stored trainer settings and hash (`None` before its trainer was first synced).
pub async fn trainer_settings(
    pool: &PgPool,
    run_id: Uuid,
) -> Result<Option<(serde_json::Value, String)>, DbError> {
    let row: Option<(Option<serde_json::Value>, Option<String>)> =
        sqlx::query_as("SELECT trainer_settings, trainer_settings_hash FROM runs WHERE id = $1")
            .bind(run_id)
            .fetch_optional(pool)
            .await?;
    Ok(row.and_then(|(s, h)| Some((s?, h?))))
}

/// The newest checkpoint taken after a step no later than `max_step`.
pub async fn latest_checkpoint(
    pool: &PgPool,
    run_id: Uuid,
    max_step: i32,
) -> Result<Option<CheckpointRow>, DbError> {
    Ok(sqlx::query_as(
        "SELECT step, policy_version, kind, path FROM checkpoints
         WHERE run_id = $1 AND step <= $2 ORDER BY step DESC LIMIT 1",
    )
    .bind(run_id)
    .bind(max_step)
    .fetch_optional(pool)
    .await?)
}

/// Every checkpoint of a run, oldest first.
pub async fn checkpoints(pool: &PgPool, run_id: Uuid) -> Result<Vec<CheckpointRow>, DbError> {
    Ok(sqlx::query_as(
        "SELECT step, policy_version, kind, path FROM checkpoints WHERE run_id = $1 ORDER BY step",
    )
    .bind(run_id)
    .fetch_all(pool)
    .await?)
}

/// What a model card says of a run: experiment name and preset, and its completed steps.
pub async fn card_facts(
    pool: &PgPool,
    run_id: Uuid,
) -> Result<Option<(String, String, i64)>, DbError> {
    Ok(sqlx::query_as(
        "SELECT e.name, e.preset,
                (SELECT count(*) FROM steps s WHERE s.run_id = r.id AND s.status = 'completed')
         FROM runs r JOIN experiments e ON e.id = r.experiment_id WHERE r.id = $1",
    )
    .bind(run_id)
    .fetch_optional(pool)
    .await?)
}

/// Gold-judged benchmark runs of a run: (name, benchmark, policy version, summary score).
pub async fn gold_benchmarks(
    pool: &PgPool,
    run_id: Uuid,
) -> Result<Vec<(String, String, Option<i32>, Option<f64>)>, DbError> {
    Ok(sqlx::query_as(
        "SELECT name, benchmark, policy_version, (summary->>'score')::float8 FROM bench_runs
         WHERE source_run_id = $1 ORDER BY policy_version, name",
    )
    .bind(run_id)
    .fetch_all(pool)
    .await?)
}
