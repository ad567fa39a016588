//! Persisting rollouts: trajectories and segments (binary COPY) plus their tool calls (UNNEST),
//! in one transaction per batch.

use sqlx::PgPool;
use uuid::Uuid;

use super::DbError;
use crate::domain::rollout::Rollout;

/// Write a batch of rollouts atomically.
pub async fn insert(pool: &PgPool, rollouts: &[Rollout]) -> Result<(), DbError> {
    let mut tx = pool.begin().await?;
    insert_in(&mut tx, rollouts).await?;
    tx.commit().await?;
    Ok(())
}

/// Write rollouts inside the caller's transaction.
pub async fn insert_in(tx: &mut sqlx::PgConnection, rollouts: &[Rollout]) -> Result<(), DbError> {
    let trajectories: Vec<_> = rollouts.iter().map(|r| r.trajectory.clone()).collect();
    super::trajectories::copy_in(&mut *tx, &trajectories).await?;
    let mut ids = Vec::new();
    let mut traj = Vec::new();
    let mut ordinal = Vec::new();
    let mut stage = Vec::new();
    let mut tool = Vec::new();
    let mut args = Vec::new();
    let mut output = Vec::new();
    let mut snippet_ids = Vec::new();
    let mut error: Vec<Option<String>> = Vec::new();
    let mut cached = Vec::new();
    let mut latency = Vec::new();
    for r in rollouts {
        for (k, c) in r.calls.iter().enumerate() {
            ids.push(Uuid::now_v7());
            traj.push(r.trajectory.id);
            ordinal.push(k as i32);
            stage.push(c.stage as i16);
            tool.push(super::pg_text(&c.result.tool).into_owned());
            args.push(super::pg_json(
                &serde_json::to_value(&c.result.args).unwrap_or_default(),
            ));
            output.push(super::pg_text(&c.result.output_text).into_owned());
            // text[] cannot be nested in UNNEST: pass the ids joined and split in SQL.
            snippet_ids.push(
                c.result
                    .snippets
                    .iter()
                    .map(|s| super::pg_text(&s.id).into_owned())
                    .collect::<Vec<_>>()
                    .join("\u{1f}"),
            );
            error.push(
                c.result
                    .error
                    .as_deref()
                    .map(|e| super::pg_text(e).into_owned()),
            );
            cached.push(c.result.cached);
            latency.push(c.result.latency.as_millis().min(i32::MAX as u128) as i32);
        }
    }
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO tool_calls (id, trajectory_id, ordinal, stage, tool, arguments, output_text,
                                 snippet_ids, error, cached, latency_ms)
         SELECT id, tid, ord, st, tool, args, out,
                CASE WHEN sids = '' THEN '{}'::text[] ELSE string_to_array(sids, E'\\x1f') END,
                err, cached, lat
         FROM UNNEST($1::uuid[], $2::uuid[], $3::int4[], $4::int2[], $5::text[], $6::jsonb[],
                     $7::text[], $8::text[], $9::text[], $10::bool[], $11::int4[])
              AS t(id, tid, ord, st, tool, args, out, sids, err, cached, lat)",
    )
    .bind(&ids)
    .bind(&traj)
    .bind(&ordinal)
    .bind(&stage)
    .bind(&tool)
    .bind(&args)
    .bind(&output)
    .bind(&snippet_ids)
    .bind(&error)
    .bind(&cached)
    .bind(&latency)
    .execute(&mut *tx)
    .await?;
    Ok(())
}
