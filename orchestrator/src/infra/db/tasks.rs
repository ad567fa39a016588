//! Tasks: bulk upsert by (source, external_id) with UNNEST.

use crate::domain::scaffold::AnswerFormat;
use sqlx::PgPool;
use uuid::Uuid;

use super::DbError;

#[derive(Debug, Clone, PartialEq)]
pub struct NewTask {
    pub source: String,
    pub external_id: String,
    pub prompt: String,
    pub answer_format: String,
    pub persistent_rubrics: serde_json::Value,
    pub metadata: serde_json::Value,
}

/// SHA-256 of a prompt as lowercase hex (the bank's within-episode key).
pub fn prompt_hash(prompt: &str) -> String {
    crate::domain::util::sha256_hex(prompt.as_bytes())
}

/// Insert or update tasks; returns their ids in input order. An empty rubric list keeps the
/// rubrics a task already has.
pub async fn upsert(pool: &PgPool, tasks: &[NewTask]) -> Result<Vec<Uuid>, DbError> {
    if tasks.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = tasks.iter().map(|_| Uuid::now_v7()).collect();
    let sources: Vec<&str> = tasks.iter().map(|t| t.source.as_str()).collect();
    let ext: Vec<&str> = tasks.iter().map(|t| t.external_id.as_str()).collect();
    let prompts: Vec<&str> = tasks.iter().map(|t| t.prompt.as_str()).collect();
    let hashes: Vec<String> = tasks.iter().map(|t| prompt_hash(&t.prompt)).collect();
    let formats: Vec<&str> = tasks.iter().map(|t| t.answer_format.as_str()).collect();
    let rubrics: Vec<serde_json::Value> =
        tasks.iter().map(|t| t.persistent_rubrics.clone()).collect();
    let meta: Vec<serde_json::Value> = tasks.iter().map(|t| t.metadata.clone()).collect();
    let rows: Vec<(i32, Uuid)> = sqlx::query_as(
        "INSERT INTO tasks (id, source, external_id, prompt, prompt_sha256, answer_format,
                            persistent_rubrics, metadata)
         SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[],
                              $6::text[], $7::jsonb[], $8::jsonb[])
         ON CONFLICT (source, external_id) DO UPDATE SET
             prompt = EXCLUDED.prompt, prompt_sha256 = EXCLUDED.prompt_sha256,
             answer_format = EXCLUDED.answer_format,
             -- a file without rubrics never wipes rubrics stored by `rubrics init`
             persistent_rubrics = CASE WHEN EXCLUDED.persistent_rubrics = '[]'::jsonb
                                       THEN tasks.persistent_rubrics
                                       ELSE EXCLUDED.persistent_rubrics END,
             metadata = EXCLUDED.metadata
         RETURNING 0, id",
    )
    .bind(&ids)
    .bind(&sources)
    .bind(&ext)
    .bind(&prompts)
    .bind(&hashes)
    .bind(&formats)
    .bind(&rubrics)
    .bind(&meta)
    .fetch_all(pool)
    .await?;
    if rows.len() != tasks.len() {
        return Err(DbError::Invalid {
            what: "task batch",
            message: format!(
                "{} rows written for {} tasks (duplicate source/external_id in one batch?)",
                rows.len(),
                tasks.len()
            ),
        });
    }
    // RETURNING order is not guaranteed: look ids up by key.
    let found: Vec<(String, String, Uuid)> = sqlx::query_as(
        "SELECT t.source, t.external_id, t.id FROM tasks t
         JOIN UNNEST($1::text[], $2::text[]) AS k(source, external_id)
           ON t.source = k.source AND t.external_id = k.external_id",
    )
    .bind(&sources)
    .bind(&ext)
    .fetch_all(pool)
    .await?;
    let map: std::collections::HashMap<(String, String), Uuid> =
        found.into_iter().map(|(s, e, id)| ((s, e), id)).collect();
    tasks
        .iter()
        .map(|t| {
            map.get(&(t.source.clone(), t.external_id.clone()))
                .copied()
                .ok_or_else(|| DbError::Invalid {
                    what: "task batch",
                    message: format!("task {} vanished", t.external_id),
                })
        })
        .collect()
}

/// A stored task as judging needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRow {
    pub id: Uuid,
    /// The task file's identity of the task (`domain::util::task_key` seeds from it).
    pub source: String,
    pub external_id: String,
    pub prompt: String,
    pub answer_format: String,
    pub persistent_rubrics: serde_json::Value,
}

impl TaskRow {
    /// The task's sampling seed material (`domain::util::task_key` of its source and external id).
    pub fn seed_key(&self) -> u64 {
        crate::domain::util::task_key(&self.source, &self.external_id)
    }
}

/// Load tasks by id (missing ids are absent from the map).
pub async fn get_many(
    pool: &PgPool,
    ids: &[Uuid],
) -> Result<std::collections::HashMap<Uuid, TaskRow>, DbError> {
    type Row = (Uuid, String, String, String, String, serde_json::Value);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT id, source, external_id, prompt, answer_format, persistent_rubrics
         FROM tasks WHERE id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(id, source, external_id, prompt, answer_format, persistent_rubrics)| {
                (
                    id,
                    TaskRow {
                        id,
                        source,
                        external_id,
                        prompt,
                        answer_format,
                        persistent_rubrics,
                    },
                )
            },
        )
        .collect())
}

/// Replace a task's persistent rubrics (`orchestrator rubrics init`).
pub async fn set_persistent_rubrics(
    pool: &PgPool,
    id: Uuid,
    rubrics: &serde_json::Value,
) -> Result<(), DbError> {
    sqlx::query("UPDATE tasks SET persistent_rubrics = $2 WHERE id = $1")
        .bind(id)
        .bind(rubrics)
        .execute(pool)
        .await?;
    Ok(())
}

/// A task file row as a database row.
pub fn from_task_row(t: &crate::domain::data::tasks::TaskRow) -> NewTask {
    NewTask {
        source: t.source.clone(),
        external_id: t.external_id.clone(),
        prompt: t.query.clone(),
        answer_format: match t.format {
            AnswerFormat::Exact => "exact",
            AnswerFormat::Short => "short",
            AnswerFormat::Long => "long",
        }
        .to_string(),
        persistent_rubrics: serde_json::to_value(&t.rubrics).unwrap_or_default(),
        metadata: t.metadata.clone(),
    }
}
