//! Evaluations of a run's policy on fixed task subsets: one summary row per (run, policy
//! version, subset) and its per-task results, written together in one transaction.

use sqlx::PgPool;
use uuid::Uuid;

use super::{DbError, pg_json, pg_text};

/// One evaluation's summary (the `evaluations` row).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct EvalRow {
    pub run_id: Uuid,
    pub policy_version: i32,
    pub subset: String,
    pub judge_model: String,
    pub tasks: i32,
    pub samples: i32,
    pub score: Option<f64>,
    pub exact: Option<f64>,
    /// Results with a rubric score.
    pub judged: i32,
    /// Results without their task's figure (see `pipeline::evaluate::EvalTask::scored`): no
    /// rubric and no known answer, a judge failed after its retries, or the rollout was cut.
    pub failed: i32,
    pub parse_failures: i32,
    pub model_tokens: i64,
    pub judge_cost_usd: f64,
    pub seconds: f64,
}

/// One rollout of one evaluation task.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultRow {
    pub task_id: Uuid,
    pub sample_index: i32,
    pub finish_reason: String,
    pub answer: Option<String>,
    pub parsed: serde_json::Value,
    pub num_model_tokens: i32,
    pub tool_calls: i32,
    pub parse_failed: bool,
    pub score: Option<f64>,
    pub rubric_scores: serde_json::Value,
    pub exact: Option<bool>,
    pub error: Option<String>,
}

/// Whether (run, version, subset) was already evaluated.
pub async fn exists(
    pool: &PgPool,
    run_id: Uuid,
    version: i32,
    subset: &str,
) -> Result<bool, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM evaluations
                        WHERE run_id = $1 AND policy_version = $2 AND subset = $3)",
    )
    .bind(run_id)
    .bind(version)
    .bind(subset)
    .fetch_one(pool)
    .await?)
}

/// Store an evaluation and its results; a repeated evaluation of the same (run, version,
/// subset) replaces the earlier one.
pub async fn record(pool: &PgPool, e: &EvalRow, results: &[ResultRow]) -> Result<(), DbError> {
    for (what, v) in [("score", e.score), ("exact", e.exact)] {
        if v.is_some_and(|x| !x.is_finite()) {
            return Err(DbError::Invalid {
                what: "evaluation",
                message: format!("{what} = {v:?} is not finite"),
            });
        }
    }
    let mut tx = pool.begin().await?;
    sqlx::query(
        "DELETE FROM evaluations WHERE run_id = $1 AND policy_version = $2 AND subset = $3",
    )
    .bind(e.run_id)
    .bind(e.policy_version)
    .bind(&e.subset)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO evaluations (run_id, policy_version, subset, judge_model, tasks, samples,
             score, exact, judged, failed, parse_failures, model_tokens, judge_cost_usd, seconds)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
    )
    .bind(e.run_id)
    .bind(e.policy_version)
    .bind(&e.subset)
    .bind(&e.judge_model)
    .bind(e.tasks)
    .bind(e.samples)
    .bind(e.score)
    .bind(e.exact)
    .bind(e.judged)
    .bind(e.failed)
    .bind(e.parse_failures)
    .bind(e.model_tokens)
    .bind(e.judge_cost_usd)
    .bind(e.seconds)
    .execute(&mut *tx)
    .await?;
    for r in results {
        sqlx::query(
            "INSERT INTO evaluation_results (run_id, policy_version, subset, task_id,
                 sample_index, finish_reason, answer, parsed, num_model_tokens, tool_calls,
                 parse_failed, score, rubric_scores, exact, error)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
        )
        .bind(e.run_id)
        .bind(e.policy_version)
        .bind(&e.subset)
        .bind(r.task_id)
        .bind(r.sample_index)
        .bind(pg_text(&r.finish_reason).as_ref())
        .bind(r.answer.as_deref().map(|a| pg_text(a).into_owned()))
        .bind(pg_json(&r.parsed))
        .bind(r.num_model_tokens)
        .bind(r.tool_calls)
        .bind(r.parse_failed)
        .bind(r.score.filter(|x| x.is_finite()))
        .bind(pg_json(&r.rubric_scores))
        .bind(r.exact)
        .bind(r.error.as_deref().map(|a| pg_text(a).into_owned()))
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Every evaluation of a run, by subset then version.
pub async fn for_run(pool: &PgPool, run_id: Uuid) -> Result<Vec<EvalRow>, DbError> {
    Ok(sqlx::query_as(
        "SELECT run_id, policy_version, subset, judge_model, tasks, samples, score, exact, judged,
                failed, parse_failures, model_tokens, judge_cost_usd, seconds
         FROM evaluations WHERE run_id = $1 ORDER BY subset, policy_version",
    )
    .bind(run_id)
    .fetch_all(pool)
    .await?)
}

/// Per-task means of one evaluation over its samples: (task, score, exact-match rate). A
/// sample without a figure (no rubric score, no known answer) stays out of that mean.
pub async fn task_means(
    pool: &PgPool,
    run_id: Uuid,
    subset: &str,
    version: i32,
) -> Result<Vec<(Uuid, Option<f64>, Option<f64>)>, DbError> {
    Ok(sqlx::query_as(
        "SELECT task_id, avg(score), avg(exact::int::float8)
         FROM evaluation_results
         WHERE run_id = $1 AND subset = $2 AND policy_version = $3
         GROUP BY task_id ORDER BY task_id",
    )
    .bind(run_id)
    .bind(subset)
    .bind(version)
    .fetch_all(pool)
    .await?)
}
