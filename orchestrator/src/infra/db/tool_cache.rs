//! The tool-result cache in Postgres: (tool, normalised-args key) -> snippets, with hit counts.

use futures::future::BoxFuture;
use sqlx::PgPool;

use crate::infra::tools::runner::{Snippet, ToolArgs, ToolCache};

/// A [`ToolCache`] on the `tool_cache` table. Cache failures are logged and treated as misses:
/// a broken cache must not fail a rollout.
#[derive(Debug, Clone)]
pub struct PgToolCache {
    pub pool: PgPool,
}

impl ToolCache for PgToolCache {
    fn get<'a>(&'a self, tool: &'a str, key: &'a str) -> BoxFuture<'a, Option<Vec<Snippet>>> {
        Box::pin(async move {
            let row: Result<Option<serde_json::Value>, _> = sqlx::query_scalar(
                "UPDATE tool_cache SET hits = hits + 1, last_hit_at = now()
                 WHERE tool = $1 AND args_key = $2 RETURNING output",
            )
            .bind(tool)
            .bind(key)
            .fetch_optional(&self.pool)
            .await;
            match row {
                Ok(Some(v)) => serde_json::from_value(v).ok(),
                Ok(None) => None,
                Err(e) => {
                    tracing::warn!(tool, error = %e, "tool cache read failed");
                    None
                }
            }
        })
    }

    fn put<'a>(
        &'a self,
        tool: &'a str,
        key: &'a str,
        args: &'a ToolArgs,
        snippets: &'a [Snippet],
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let (Ok(a), Ok(o)) = (serde_json::to_value(args), serde_json::to_value(snippets))
            else {
                return;
            };
            let r = sqlx::query(
                "INSERT INTO tool_cache (tool, args_key, arguments, output) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (tool, args_key) DO NOTHING",
            )
            .bind(tool)
            .bind(key)
            .bind(a)
            .bind(o)
            .execute(&self.pool)
            .await;
            if let Err(e) = r {
                tracing::warn!(tool, error = %e, "tool cache write failed");
            }
        })
    }
}
