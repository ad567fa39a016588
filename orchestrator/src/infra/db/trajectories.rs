//! Trajectories and their segments: written per step in one transaction with binary COPY (a step
//! of 256 x 16k tokens is ~8M ids and logprobs), read back whole.

use sqlx::PgPool;
use uuid::Uuid;

use super::{CopyWriter, DbError};
use crate::domain::trajectory::{Segment, SegmentKind, Stage, TEACHER, Trajectory};

const TRAJ_COLS: &str = "id, run_id, step, task_id, sample_index, policy_version, server, \
    server_version, prompt_token_ids, finish_reason, parsed, num_model_tokens, num_tool_tokens, timings";
const SEG_COLS: &str =
    "trajectory_id, ordinal, kind, stage, token_ids, logprobs, text, policy_version";

fn encode_trajectories(batch: &[Trajectory]) -> Vec<u8> {
    let mut w = CopyWriter::with_capacity(batch.len() * 512);
    for t in batch {
        w.row(14);
        w.uuid(t.id);
        w.uuid(t.run_id);
        w.i32(t.step);
        w.uuid(t.task_id);
        w.i32(t.sample_index);
        w.i32(t.policy_version);
        w.text(&t.server);
        w.opt_text(t.server_version.as_deref());
        w.int4_array(&t.prompt_token_ids);
        w.text(&t.finish_reason);
        w.jsonb(&t.parsed);
        w.i32(t.num_model_tokens() as i32);
        w.i32(t.num_tool_tokens() as i32);
        w.jsonb(&t.timings);
    }
    w.finish()
}

fn encode_segments(batch: &[Trajectory]) -> Vec<u8> {
    let tokens: usize = batch
        .iter()
        .flat_map(|t| &t.segments)
        .map(|s| s.token_ids.len())
        .sum();
    let mut w = CopyWriter::with_capacity(tokens * 17);
    for t in batch {
        for (i, s) in t.segments.iter().enumerate() {
            w.row(8);
            w.uuid(t.id);
            w.i32(i as i32);
            w.text(s.kind.as_str());
            w.opt_i16(s.stage.map(|st| st as i16));
            w.int4_array(&s.token_ids);
            w.opt_float4_array(s.logprobs.as_deref());
            w.text(&s.text);
            w.opt_i32(s.policy_version);
        }
    }
    w.finish()
}

/// Persist a batch of trajectories atomically. Fails without writing anything if any trajectory
/// breaks the segment invariants or already exists.
pub async fn insert_batch(pool: &PgPool, batch: &[Trajectory]) -> Result<(), DbError> {
    let mut tx = pool.begin().await?;
    copy_in(&mut tx, batch).await?;
    tx.commit().await?;
    Ok(())
}

/// COPY trajectories and segments on an open transaction (the caller commits).
pub async fn copy_in(conn: &mut sqlx::PgConnection, batch: &[Trajectory]) -> Result<(), DbError> {
    if batch.is_empty() {
        return Ok(());
    }
    for t in batch {
        t.validate().map_err(|message| DbError::Invalid {
            what: "trajectory",
            message: format!("{}: {message}", t.id),
        })?;
    }
    // Encoding ~100 MB is CPU work: keep it off the async workers.
    let owned: Vec<Trajectory> = batch.to_vec();
    let (traj_bytes, seg_bytes) =
        tokio::task::spawn_blocking(move || (encode_trajectories(&owned), encode_segments(&owned)))
            .await
            .map_err(|e| DbError::Invalid {
                what: "encoder",
                message: e.to_string(),
            })?;
    let mut copy = conn
        .copy_in_raw(&format!(
            "COPY trajectories ({TRAJ_COLS}) FROM STDIN (FORMAT binary)"
        ))
        .await?;
    copy.send(traj_bytes).await?;
    copy.finish().await?;
    let mut copy = conn
        .copy_in_raw(&format!(
            "COPY trajectory_segments ({SEG_COLS}) FROM STDIN (FORMAT binary)"
        ))
        .await?;
    for chunk in seg_bytes.chunks(8 << 20) {
        copy.send(chunk).await?;
    }
    copy.finish().await?;
    Ok(())
}

type TrajRow = (
    Uuid,
    Uuid,
    i32,
    Uuid,
    i32,
    i32,
    String,
    Option<String>,
    Vec<i32>,
    String,
    serde_json::Value,
    serde_json::Value,
);

/// A segment row with its trajectory id first.
type OwnedSegRow = (
    Uuid,
    String,
    Option<i16>,
    Vec<i32>,
    Option<Vec<f32>>,
    String,
    Option<i32>,
);

type SegRow = (
    String,
    Option<i16>,
    Vec<i32>,
    Option<Vec<f32>>,
    String,
    Option<i32>,
);

const TRAJ_SELECT: &str = "SELECT id, run_id, step, task_id, sample_index, policy_version, server,
        server_version, prompt_token_ids, finish_reason, parsed, timings FROM trajectories";

fn assemble(r: TrajRow, segs: Vec<SegRow>) -> Result<Trajectory, DbError> {
    let mut segments = Vec::with_capacity(segs.len());
    for (kind, stage, ids, logprobs, text, pv) in segs {
        let kind = SegmentKind::parse(&kind).ok_or_else(|| DbError::Invalid {
            what: "segment kind",
            message: kind.clone(),
        })?;
        segments.push(Segment {
            kind,
            stage: stage.and_then(|s| Stage::from_index(i64::from(s))),
            token_ids: ids.into_iter().map(|x| x as u32).collect(),
            logprobs,
            text,
            policy_version: pv,
        });
    }
    Ok(Trajectory {
        id: r.0,
        run_id: r.1,
        step: r.2,
        task_id: r.3,
        sample_index: r.4,
        policy_version: r.5,
        server: r.6,
        server_version: r.7,
        prompt_token_ids: r.8.into_iter().map(|x| x as u32).collect(),
        segments,
        finish_reason: r.9,
        parsed: r.10,
        timings: r.11,
    })
}

/// Load one trajectory with its segments, or `None`.
pub async fn get(pool: &PgPool, id: Uuid) -> Result<Option<Trajectory>, DbError> {
    let row: Option<TrajRow> = sqlx::query_as(&format!("{TRAJ_SELECT} WHERE id = $1"))
        .bind(id)
        .fetch_optional(pool)
        .await?;
    Ok(with_segments(pool, row.into_iter().collect()).await?.pop())
}

/// Load every trajectory of a run's step with its segments, ordered by task and sample index.
pub async fn list_for_step(
    pool: &PgPool,
    run_id: Uuid,
    step: i32,
) -> Result<Vec<Trajectory>, DbError> {
    let rows: Vec<TrajRow> = sqlx::query_as(&format!(
        "{TRAJ_SELECT} WHERE run_id = $1 AND step = $2 ORDER BY task_id, sample_index"
    ))
    .bind(run_id)
    .bind(step)
    .fetch_all(pool)
    .await?;
    with_segments(pool, rows).await
}

/// The trajectories with these ids and their segments, in id order (ids not found are absent).
pub async fn get_many(pool: &PgPool, ids: &[Uuid]) -> Result<Vec<Trajectory>, DbError> {
    let rows: Vec<TrajRow> =
        sqlx::query_as(&format!("{TRAJ_SELECT} WHERE id = ANY($1) ORDER BY id"))
            .bind(ids)
            .fetch_all(pool)
            .await?;
    with_segments(pool, rows).await
}

/// A run's step as (task, ids of the policy's trajectories by sample index), tasks in id
/// order, without loading any segment: enough to choose trajectories before reading them.
/// Replayed demonstrations (server [`TEACHER`]) are not the policy's and are left out.
pub async fn members_of_step(
    pool: &PgPool,
    run_id: Uuid,
    step: i32,
) -> Result<Vec<(Uuid, Vec<Uuid>)>, DbError> {
    let rows: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "SELECT task_id, id FROM trajectories WHERE run_id = $1 AND step = $2
             AND server <> $3 ORDER BY task_id, sample_index",
    )
    .bind(run_id)
    .bind(step)
    .bind(TEACHER)
    .fetch_all(pool)
    .await?;
    let mut out: Vec<(Uuid, Vec<Uuid>)> = Vec::new();
    for (task, id) in rows {
        match out.last_mut() {
            Some((t, ids)) if *t == task => ids.push(id),
            _ => out.push((task, vec![id])),
        }
    }
    Ok(out)
}

async fn with_segments(pool: &PgPool, rows: Vec<TrajRow>) -> Result<Vec<Trajectory>, DbError> {
    let ids: Vec<Uuid> = rows.iter().map(|r| r.0).collect();
    let segs: Vec<OwnedSegRow> = sqlx::query_as(
        "SELECT trajectory_id, kind, stage, token_ids, logprobs, text, policy_version
             FROM trajectory_segments WHERE trajectory_id = ANY($1)
             ORDER BY trajectory_id, ordinal",
    )
    .bind(&ids)
    .fetch_all(pool)
    .await?;
    let mut by_traj: std::collections::HashMap<Uuid, Vec<SegRow>> =
        std::collections::HashMap::new();
    for (t, kind, stage, tok, lp, text, pv) in segs {
        by_traj
            .entry(t)
            .or_default()
            .push((kind, stage, tok, lp, text, pv));
    }
    rows.into_iter()
        .map(|r| {
            let segs = by_traj.remove(&r.0).unwrap_or_default();
            assemble(r, segs)
        })
        .collect()
}

/// Count trajectories of a run's step.
pub async fn count_for_step(pool: &PgPool, run_id: Uuid, step: i32) -> Result<i64, DbError> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM trajectories WHERE run_id = $1 AND step = $2")
            .bind(run_id)
            .bind(step)
            .fetch_one(pool)
            .await?,
    )
}

/// The steps of a run that hold trajectories, in order.
pub async fn steps_of_run(pool: &PgPool, run_id: Uuid) -> Result<Vec<i32>, DbError> {
    Ok(
        sqlx::query_scalar(
            "SELECT DISTINCT step FROM trajectories WHERE run_id = $1 ORDER BY step",
        )
        .bind(run_id)
        .fetch_all(pool)
        .await?,
    )
}
