//! DeepRubric builds in Postgres: builds, evidence trees and their nodes, composed candidates
//! and verifications (`migrations/*_deeprubric.sql`). A node is stored processed together with
//! the children it proposed, in one transaction, so a killed build resumes at the first pending
//! node without duplicating any.

use sqlx::PgPool;
use uuid::Uuid;

use super::{DbError, pg_json, pg_text};
use crate::domain::deeprubric::Node;

/// LLM use of one stored step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spent {
    pub calls: i32,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct TreeRow {
    pub seed_index: i32,
    pub seed: String,
    pub status: String,
    pub stop_reason: Option<String>,
    pub error: Option<String>,
    pub llm_calls: i32,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub seconds: f64,
    pub db_seconds: f64,
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ItemRow {
    pub seed_index: i32,
    pub status: String,
    pub candidate: Option<serde_json::Value>,
    pub error: Option<String>,
    pub raw: Option<String>,
    pub attempts: i32,
    pub llm_calls: i32,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct VerdictRow {
    pub seed_index: i32,
    pub decision: Option<String>,
    pub error_tags: serde_json::Value,
    pub verdict: Option<serde_json::Value>,
    pub r#final: Option<serde_json::Value>,
    pub error: Option<String>,
    pub raw: Option<String>,
    pub attempts: i32,
    pub llm_calls: i32,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
}

/// The build named `name` (its id and whether it was created now); an existing build must have
/// the same settings.
pub async fn open_build(
    pool: &PgPool,
    name: &str,
    config: &serde_json::Value,
) -> Result<(Uuid, Option<serde_json::Value>), DbError> {
    let row: Option<(Uuid, serde_json::Value)> =
        sqlx::query_as("SELECT id, config FROM dr_builds WHERE name = $1")
            .bind(pg_text(name).as_ref())
            .fetch_optional(pool)
            .await?;
    if let Some((id, stored)) = row {
        sqlx::query("UPDATE dr_builds SET status = 'running', updated_at = now() WHERE id = $1")
            .bind(id)
            .execute(pool)
            .await?;
        return Ok((id, Some(stored)));
    }
    let id = Uuid::now_v7();
    sqlx::query("INSERT INTO dr_builds (id, name, config) VALUES ($1, $2, $3)")
        .bind(id)
        .bind(pg_text(name).as_ref())
        .bind(pg_json(config))
        .execute(pool)
        .await?;
    Ok((id, None))
}

pub async fn set_build(
    pool: &PgPool,
    id: Uuid,
    status: &str,
    stats: Option<&serde_json::Value>,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE dr_builds SET status = $2, stats = COALESCE($3, stats), updated_at = now()
         WHERE id = $1",
    )
    .bind(id)
    .bind(status)
    .bind(stats.map(pg_json))
    .execute(pool)
    .await?;
    Ok(())
}

/// Register the seeds (kept as they are when already there).
pub async fn add_trees(pool: &PgPool, id: Uuid, seeds: &[String]) -> Result<(), DbError> {
    let idx: Vec<i32> = (0..seeds.len() as i32).collect();
    let texts: Vec<String> = seeds.iter().map(|s| pg_text(s).into_owned()).collect();
    sqlx::query(
        "INSERT INTO dr_trees (build_id, seed_index, seed)
         SELECT $1, * FROM UNNEST($2::int4[], $3::text[])
         ON CONFLICT (build_id, seed_index) DO NOTHING",
    )
    .bind(id)
    .bind(&idx)
    .bind(&texts)
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn trees(pool: &PgPool, id: Uuid) -> Result<Vec<TreeRow>, DbError> {
    Ok(sqlx::query_as(
        "SELECT seed_index, seed, status, stop_reason, error, llm_calls, prompt_tokens,
                completion_tokens, seconds, db_seconds
         FROM dr_trees WHERE build_id = $1 ORDER BY seed_index",
    )
    .bind(id)
    .fetch_all(pool)
    .await?)
}

/// Close a tree: its status, why it stopped or failed, and the time its node writes took (added
/// to what earlier runs of a resumed build recorded).
pub async fn set_tree(
    pool: &PgPool,
    id: Uuid,
    seed: i32,
    status: &str,
    stop_reason: Option<&str>,
    error: Option<&str>,
    db_seconds: f64,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE dr_trees SET status = $3, stop_reason = $4, error = $5,
             db_seconds = db_seconds + $6
         WHERE build_id = $1 AND seed_index = $2",
    )
    .bind(id)
    .bind(seed)
    .bind(status)
    .bind(stop_reason.map(pg_text))
    .bind(error.map(pg_text))
    .bind(db_seconds)
    .execute(pool)
    .await?;
    Ok(())
}

type NodeTuple = (
    String,
    Option<String>,
    i16,
    String,
    serde_json::Value,
    serde_json::Value,
    String,
    Option<String>,
);

/// A tree's nodes in creation order.
pub async fn nodes(pool: &PgPool, id: Uuid, seed: i32) -> Result<Vec<Node>, DbError> {
    let rows: Vec<NodeTuple> = sqlx::query_as(
        "SELECT node_id, parent, depth, query, statements, passages, status, stop_reason
         FROM dr_nodes WHERE build_id = $1 AND seed_index = $2 ORDER BY ordinal",
    )
    .bind(id)
    .bind(seed)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(id, parent, depth, query, st, passages, status, stop)| Node {
                id,
                parent,
                depth: depth.clamp(0, 255) as u8,
                query,
                statements: serde_json::from_value(st).unwrap_or_default(),
                passages: serde_json::from_value(passages).unwrap_or_default(),
                status,
                stop_reason: stop,
            },
        )
        .collect())
}

fn ordinal(node_id: &str) -> i32 {
    node_id
        .strip_prefix('N')
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Store `node` as processed (its statements, passages, status) with the `children` it
/// proposed and the LLM use, in one transaction. Children already stored are kept.
pub async fn finish_node(
    pool: &PgPool,
    id: Uuid,
    seed: i32,
    node: &Node,
    children: &[Node],
    spent: Spent,
    seconds: f64,
) -> Result<(), DbError> {
    let mut tx = pool.begin().await?;
    let statements = pg_json(&serde_json::json!(node.statements));
    let passages = pg_json(&serde_json::json!(node.passages));
    sqlx::query(
        "INSERT INTO dr_nodes (build_id, seed_index, node_id, ordinal, parent, depth, query,
                               statements, passages, status, stop_reason)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
         ON CONFLICT (build_id, seed_index, node_id) DO UPDATE SET
             statements = EXCLUDED.statements, passages = EXCLUDED.passages,
             status = EXCLUDED.status, stop_reason = EXCLUDED.stop_reason",
    )
    .bind(id)
    .bind(seed)
    .bind(&node.id)
    .bind(ordinal(&node.id))
    .bind(node.parent.as_deref())
    .bind(i16::from(node.depth))
    .bind(pg_text(&node.query).as_ref())
    .bind(statements)
    .bind(passages)
    .bind(&node.status)
    .bind(node.stop_reason.as_deref().map(pg_text))
    .execute(&mut *tx)
    .await?;
    for c in children {
        sqlx::query(
            "INSERT INTO dr_nodes (build_id, seed_index, node_id, ordinal, parent, depth, query,
                                   status)
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending')
             ON CONFLICT (build_id, seed_index, node_id) DO NOTHING",
        )
        .bind(id)
        .bind(seed)
        .bind(&c.id)
        .bind(ordinal(&c.id))
        .bind(c.parent.as_deref())
        .bind(i16::from(c.depth))
        .bind(pg_text(&c.query).as_ref())
        .execute(&mut *tx)
        .await?;
    }
    sqlx::query(
        "UPDATE dr_trees SET llm_calls = llm_calls + $3, prompt_tokens = prompt_tokens + $4,
             completion_tokens = completion_tokens + $5, seconds = seconds + $6
         WHERE build_id = $1 AND seed_index = $2",
    )
    .bind(id)
    .bind(seed)
    .bind(spent.calls)
    .bind(spent.prompt_tokens)
    .bind(spent.completion_tokens)
    .bind(seconds)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

pub async fn put_item(pool: &PgPool, id: Uuid, item: &ItemRow) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO dr_items (build_id, seed_index, status, candidate, error, raw, attempts,
                               llm_calls, prompt_tokens, completion_tokens)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
         ON CONFLICT (build_id, seed_index) DO UPDATE SET
             status = EXCLUDED.status, candidate = EXCLUDED.candidate, error = EXCLUDED.error,
             raw = EXCLUDED.raw, attempts = dr_items.attempts + EXCLUDED.attempts,
             llm_calls = dr_items.llm_calls + EXCLUDED.llm_calls,
             prompt_tokens = dr_items.prompt_tokens + EXCLUDED.prompt_tokens,
             completion_tokens = dr_items.completion_tokens + EXCLUDED.completion_tokens",
    )
    .bind(id)
    .bind(item.seed_index)
    .bind(&item.status)
    .bind(item.candidate.as_ref().map(pg_json))
    .bind(item.error.as_deref().map(pg_text))
    .bind(item.raw.as_deref().map(pg_text))
    .bind(item.attempts)
    .bind(item.llm_calls)
    .bind(item.prompt_tokens)
    .bind(item.completion_tokens)
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn items(pool: &PgPool, id: Uuid) -> Result<Vec<ItemRow>, DbError> {
    Ok(sqlx::query_as(
        "SELECT seed_index, status, candidate, error, raw, attempts, llm_calls, prompt_tokens,
                completion_tokens
         FROM dr_items WHERE build_id = $1 ORDER BY seed_index",
    )
    .bind(id)
    .fetch_all(pool)
    .await?)
}

pub async fn put_verdict(pool: &PgPool, id: Uuid, v: &VerdictRow) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO dr_verdicts (build_id, seed_index, decision, error_tags, verdict, final,
                                  error, raw, attempts, llm_calls, prompt_tokens,
                                  completion_tokens)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
         ON CONFLICT (build_id, seed_index) DO UPDATE SET
             decision = EXCLUDED.decision, error_tags = EXCLUDED.error_tags,
             verdict = EXCLUDED.verdict, final = EXCLUDED.final, error = EXCLUDED.error,
             raw = EXCLUDED.raw, attempts = dr_verdicts.attempts + EXCLUDED.attempts,
             llm_calls = dr_verdicts.llm_calls + EXCLUDED.llm_calls,
             prompt_tokens = dr_verdicts.prompt_tokens + EXCLUDED.prompt_tokens,
             completion_tokens = dr_verdicts.completion_tokens + EXCLUDED.completion_tokens",
    )
    .bind(id)
    .bind(v.seed_index)
    .bind(v.decision.as_deref())
    .bind(pg_json(&v.error_tags))
    .bind(v.verdict.as_ref().map(pg_json))
    .bind(v.r#final.as_ref().map(pg_json))
    .bind(v.error.as_deref().map(pg_text))
    .bind(v.raw.as_deref().map(pg_text))
    .bind(v.attempts)
    .bind(v.llm_calls)
    .bind(v.prompt_tokens)
    .bind(v.completion_tokens)
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn verdicts(pool: &PgPool, id: Uuid) -> Result<Vec<VerdictRow>, DbError> {
    Ok(sqlx::query_as(
        "SELECT seed_index, decision, error_tags, verdict, final, error, raw, attempts,
                llm_calls, prompt_tokens, completion_tokens
         FROM dr_verdicts WHERE build_id = $1 ORDER BY seed_index",
    )
    .bind(id)
    .fetch_all(pool)
    .await?)
}
