//! Benchmark evaluations (`bench_*` tables): the run with everything its number depends on, the
//! selected items, one response per item, one row per judge-call result and one score per
//! (item, judge). Rows are written as they are produced, so a killed evaluation resumes from what
//! is stored: responses are not regenerated and grade units are not regraded.

use std::collections::HashMap;

use sqlx::PgPool;
use uuid::Uuid;

use super::{DbError, pg_json, pg_text};

/// A new evaluation's identity and settings.
#[derive(Debug, Clone, PartialEq)]
pub struct NewBenchRun {
    pub name: String,
    pub benchmark: String,
    pub data_path: String,
    pub data_sha256: String,
    pub selection: serde_json::Value,
    pub responder: serde_json::Value,
    pub grading: serde_json::Value,
    pub source_run_id: Option<Uuid>,
    pub policy_version: Option<i32>,
}

/// A stored evaluation.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct BenchRunRow {
    pub id: Uuid,
    pub name: String,
    pub benchmark: String,
    pub data_path: String,
    pub data_sha256: String,
    pub selection: serde_json::Value,
    pub responder: serde_json::Value,
    pub grading: serde_json::Value,
    pub source_run_id: Option<Uuid>,
    pub policy_version: Option<i32>,
    pub status: String,
    pub summary: Option<serde_json::Value>,
}

/// One item's response.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ResponseRow {
    pub item_id: String,
    pub answer: Option<String>,
    pub raw: Option<String>,
    pub trajectory: Option<serde_json::Value>,
    pub finish_reason: String,
    pub model_tokens: i32,
    pub tool_calls: i32,
    pub seconds: f64,
    pub error: Option<String>,
}

/// One judge call's result (after its parse retries).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct GradeRow {
    pub item_id: String,
    pub judge: String,
    pub unit: String,
    pub unit_index: i32,
    pub judge_model: String,
    pub template_sha256: String,
    pub prompt_sha256: String,
    pub parsed: Option<serde_json::Value>,
    pub raw: Option<String>,
    pub error: Option<String>,
    pub attempts: i32,
    pub prompt_tokens: i32,
    pub completion_tokens: i32,
    pub cost_usd: f64,
    pub seconds: f64,
}

/// One item's score by one judge.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ScoreRow {
    pub item_id: String,
    pub judge: String,
    pub score: Option<f64>,
    pub metrics: serde_json::Value,
    pub error: Option<String>,
}

const RUN_COLUMNS: &str = "id, name, benchmark, data_path, data_sha256, selection, responder, \
                           grading, source_run_id, policy_version, status, summary";

/// The evaluation named `name`, if stored.
pub async fn find(pool: &PgPool, name: &str) -> Result<Option<BenchRunRow>, DbError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {RUN_COLUMNS} FROM bench_runs WHERE name = $1"
    ))
    .bind(name)
    .fetch_optional(pool)
    .await?)
}

/// Evaluations of a training run's policy versions (periodic benchmark evaluation).
pub async fn for_source(pool: &PgPool, source: Uuid) -> Result<Vec<BenchRunRow>, DbError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {RUN_COLUMNS} FROM bench_runs WHERE source_run_id = $1
         ORDER BY policy_version, name"
    ))
    .bind(source)
    .fetch_all(pool)
    .await?)
}

/// Register a new evaluation with its items (in one transaction).
pub async fn create(
    pool: &PgPool,
    run: &NewBenchRun,
    items: &[(String, serde_json::Value)],
) -> Result<Uuid, DbError> {
    let id = Uuid::now_v7();
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO bench_runs (id, name, benchmark, data_path, data_sha256, selection,
                                 responder, grading, source_run_id, policy_version)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(id)
    .bind(pg_text(&run.name).as_ref())
    .bind(&run.benchmark)
    .bind(pg_text(&run.data_path).as_ref())
    .bind(&run.data_sha256)
    .bind(pg_json(&run.selection))
    .bind(pg_json(&run.responder))
    .bind(pg_json(&run.grading))
    .bind(run.source_run_id)
    .bind(run.policy_version)
    .execute(&mut *tx)
    .await?;
    // One statement for all items (UNNEST of parallel arrays), not one round trip per item.
    let ids: Vec<String> = items.iter().map(|(i, _)| pg_text(i).into_owned()).collect();
    let positions: Vec<i32> = (0..items.len() as i32).collect();
    let bodies: Vec<serde_json::Value> = items.iter().map(|(_, v)| pg_json(v)).collect();
    sqlx::query(
        "INSERT INTO bench_items (run_id, item_id, position, item)
         SELECT $1, * FROM UNNEST($2::text[], $3::int4[], $4::jsonb[])",
    )
    .bind(id)
    .bind(&ids)
    .bind(&positions)
    .bind(&bodies)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(id)
}

/// Mark an evaluation running again (a resume), finished, interrupted or failed.
pub async fn set_status(
    pool: &PgPool,
    id: Uuid,
    status: &str,
    summary: Option<&serde_json::Value>,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE bench_runs SET status = $2, summary = COALESCE($3, summary),
                finished_at = CASE WHEN $2 = 'running' THEN NULL ELSE now() END
         WHERE id = $1",
    )
    .bind(id)
    .bind(status)
    .bind(summary.map(pg_json))
    .execute(pool)
    .await?;
    Ok(())
}

/// Stored responses by item id.
pub async fn responses(pool: &PgPool, id: Uuid) -> Result<HashMap<String, ResponseRow>, DbError> {
    let rows: Vec<ResponseRow> = sqlx::query_as(
        "SELECT item_id, answer, raw, trajectory, finish_reason, model_tokens, tool_calls,
                seconds, error
         FROM bench_responses WHERE run_id = $1",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.item_id.clone(), r)).collect())
}

/// Store responses in one statement (a response already stored for the item is kept).
pub async fn insert_responses(
    pool: &PgPool,
    id: Uuid,
    rows: &[ResponseRow],
) -> Result<(), DbError> {
    if rows.is_empty() {
        return Ok(());
    }
    let text = |f: fn(&ResponseRow) -> Option<&str>| -> Vec<Option<String>> {
        rows.iter()
            .map(|r| f(r).map(|s| pg_text(s).into_owned()))
            .collect()
    };
    sqlx::query(
        "INSERT INTO bench_responses (run_id, item_id, answer, raw, trajectory, finish_reason,
                                      model_tokens, tool_calls, seconds, error)
         SELECT $1, * FROM UNNEST($2::text[], $3::text[], $4::text[], $5::jsonb[], $6::text[],
                                  $7::int4[], $8::int4[], $9::float8[], $10::text[])
         ON CONFLICT (run_id, item_id) DO NOTHING",
    )
    .bind(id)
    .bind(text(|r| Some(r.item_id.as_str())))
    .bind(text(|r| r.answer.as_deref()))
    .bind(text(|r| r.raw.as_deref()))
    .bind(
        rows.iter()
            .map(|r| r.trajectory.as_ref().map(pg_json))
            .collect::<Vec<_>>(),
    )
    .bind(text(|r| Some(r.finish_reason.as_str())))
    .bind(rows.iter().map(|r| r.model_tokens).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.tool_calls).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.seconds).collect::<Vec<_>>())
    .bind(text(|r| r.error.as_deref()))
    .execute(pool)
    .await?;
    Ok(())
}

/// Every stored grade unit of an evaluation.
pub async fn grades(pool: &PgPool, id: Uuid) -> Result<Vec<GradeRow>, DbError> {
    Ok(sqlx::query_as(
        "SELECT item_id, judge, unit, unit_index, judge_model, template_sha256, prompt_sha256,
                parsed, raw, error, attempts, prompt_tokens, completion_tokens, cost_usd, seconds
         FROM bench_grades WHERE run_id = $1",
    )
    .bind(id)
    .fetch_all(pool)
    .await?)
}

/// Store grade units in one statement (a failed unit tried again after a resume replaces the
/// failure; a parsed unit is never overwritten). A unit listed twice keeps its last row.
pub async fn insert_grades(pool: &PgPool, id: Uuid, rows: &[GradeRow]) -> Result<(), DbError> {
    let mut last: std::collections::HashMap<(&str, &str, &str, i32), &GradeRow> =
        std::collections::HashMap::new();
    for g in rows {
        last.insert(
            (
                g.item_id.as_str(),
                g.judge.as_str(),
                g.unit.as_str(),
                g.unit_index,
            ),
            g,
        );
    }
    let rows: Vec<&GradeRow> = last.into_values().collect();
    if rows.is_empty() {
        return Ok(());
    }
    let text = |f: fn(&GradeRow) -> Option<&str>| -> Vec<Option<String>> {
        rows.iter()
            .map(|g| f(g).map(|s| pg_text(s).into_owned()))
            .collect()
    };
    sqlx::query(
        "INSERT INTO bench_grades (run_id, item_id, judge, unit, unit_index, judge_model,
                                   template_sha256, prompt_sha256, parsed, raw, error, attempts,
                                   prompt_tokens, completion_tokens, cost_usd, seconds)
         SELECT $1, * FROM UNNEST($2::text[], $3::text[], $4::text[], $5::int4[], $6::text[],
                                  $7::text[], $8::text[], $9::jsonb[], $10::text[], $11::text[],
                                  $12::int4[], $13::int4[], $14::int4[], $15::float8[],
                                  $16::float8[])
         ON CONFLICT (run_id, item_id, judge, unit, unit_index) DO UPDATE SET
             judge_model = EXCLUDED.judge_model, template_sha256 = EXCLUDED.template_sha256,
             prompt_sha256 = EXCLUDED.prompt_sha256, parsed = EXCLUDED.parsed,
             raw = EXCLUDED.raw, error = EXCLUDED.error,
             attempts = bench_grades.attempts + EXCLUDED.attempts,
             prompt_tokens = bench_grades.prompt_tokens + EXCLUDED.prompt_tokens,
             completion_tokens = bench_grades.completion_tokens + EXCLUDED.completion_tokens,
             cost_usd = bench_grades.cost_usd + EXCLUDED.cost_usd,
             seconds = bench_grades.seconds + EXCLUDED.seconds
         WHERE bench_grades.parsed IS NULL",
    )
    .bind(id)
    .bind(text(|g| Some(g.item_id.as_str())))
    .bind(text(|g| Some(g.judge.as_str())))
    .bind(text(|g| Some(g.unit.as_str())))
    .bind(rows.iter().map(|g| g.unit_index).collect::<Vec<_>>())
    .bind(text(|g| Some(g.judge_model.as_str())))
    .bind(text(|g| Some(g.template_sha256.as_str())))
    .bind(text(|g| Some(g.prompt_sha256.as_str())))
    .bind(
        rows.iter()
            .map(|g| g.parsed.as_ref().map(pg_json))
            .collect::<Vec<_>>(),
    )
    .bind(text(|g| g.raw.as_deref()))
    .bind(text(|g| g.error.as_deref()))
    .bind(rows.iter().map(|g| g.attempts).collect::<Vec<_>>())
    .bind(rows.iter().map(|g| g.prompt_tokens).collect::<Vec<_>>())
    .bind(rows.iter().map(|g| g.completion_tokens).collect::<Vec<_>>())
    .bind(rows.iter().map(|g| g.cost_usd).collect::<Vec<_>>())
    .bind(rows.iter().map(|g| g.seconds).collect::<Vec<_>>())
    .execute(pool)
    .await?;
    Ok(())
}

/// Store (or replace) the scores of an evaluation's items, in one statement.
pub async fn put_scores(pool: &PgPool, id: Uuid, scores: &[ScoreRow]) -> Result<(), DbError> {
    if scores.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO bench_scores (run_id, item_id, judge, score, metrics, error)
         SELECT $1, * FROM UNNEST($2::text[], $3::text[], $4::float8[], $5::jsonb[], $6::text[])
         ON CONFLICT (run_id, item_id, judge)
         DO UPDATE SET score = EXCLUDED.score, metrics = EXCLUDED.metrics,
                       error = EXCLUDED.error",
    )
    .bind(id)
    .bind(
        scores
            .iter()
            .map(|s| pg_text(&s.item_id).into_owned())
            .collect::<Vec<_>>(),
    )
    .bind(
        scores
            .iter()
            .map(|s| pg_text(&s.judge).into_owned())
            .collect::<Vec<_>>(),
    )
    .bind(scores.iter().map(|s| s.score).collect::<Vec<_>>())
    .bind(
        scores
            .iter()
            .map(|s| pg_json(&s.metrics))
            .collect::<Vec<_>>(),
    )
    .bind(
        scores
            .iter()
            .map(|s| s.error.as_deref().map(|e| pg_text(e).into_owned()))
            .collect::<Vec<_>>(),
    )
    .execute(pool)
    .await?;
    Ok(())
}
