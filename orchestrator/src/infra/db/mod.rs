//! Postgres, the system of record: the pool, migrations (apply and verify), and typed queries.
//! All SQL of the orchestrator lives under this module, always with bound parameters.
#![allow(clippy::disallowed_methods)] // the SQL door (clippy.toml)

pub mod bank;
pub mod bench;
mod copy;
pub mod dashboard;
pub mod deeprubric;
pub mod evaluations;
pub mod judging;
pub mod lease;
pub mod metrics;
pub mod pipeline;
pub mod rollouts;
pub mod runs;
pub mod tasks;
pub mod tool_cache;
pub mod tracking;
pub mod trajectories;

use std::collections::BTreeMap;
use std::time::Duration;

pub use copy::CopyWriter;
use sqlx::migrate::{MigrateDatabase, Migrator};
use sqlx::postgres::{PgPool, PgPoolOptions};

/// The embedded migrations (`migrations/` at the workspace root).
pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

/// What to do when Postgres cannot be reached.
pub const SETUP_HINT: &str = "start Postgres with `scripts/setup.sh` (or `docker compose up -d postgres`) and point DATABASE_URL at it";

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("cannot connect to Postgres at {url}: {message}; {hint}", hint = SETUP_HINT)]
    Connect { url: String, message: String },
    #[error("database {url} has no migrations applied; run `orchestrator migrate`")]
    NotMigrated { url: String },
    #[error(
        "database {url} lacks migrations {missing:?}; run `orchestrator migrate` (applied set must match this binary)"
    )]
    MissingMigrations { url: String, missing: Vec<i64> },
    #[error(
        "database {url} has migrations {unknown:?} that this binary does not know; it was migrated by a newer version"
    )]
    UnknownMigrations { url: String, unknown: Vec<i64> },
    #[error(
        "migration {version} ({description}) in {url} differs from this binary's (checksum mismatch); migrations are forward-only and must never be edited"
    )]
    ChecksumMismatch {
        url: String,
        version: i64,
        description: String,
    },
    #[error("migration {version} in {url} failed part-way (dirty); repair it by hand")]
    Dirty { url: String, version: i64 },
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("database query failed: {0}")]
    Query(#[from] sqlx::Error),
    #[error("invalid {what}: {message}")]
    Invalid { what: &'static str, message: String },
}

/// Text as PostgreSQL can store it: NUL (which model output occasionally holds) becomes U+FFFD.
/// Token ids are stored separately and stay exact.
pub fn pg_text(v: &str) -> std::borrow::Cow<'_, str> {
    if v.as_bytes().contains(&0) {
        std::borrow::Cow::Owned(v.replace('\0', "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(v)
    }
}

/// JSON as Postgres `jsonb` accepts it: NUL in any string or key becomes U+FFFD (jsonb refuses
/// `\u0000`). The one path for JSON written to Postgres, as [`pg_text`] is for text.
pub fn pg_json(v: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::String(s) => Value::String(pg_text(s).into_owned()),
        Value::Array(a) => a.iter().map(pg_json).collect(),
        Value::Object(o) => o
            .iter()
            .map(|(k, x)| (pg_text(k).into_owned(), pg_json(x)))
            .collect(),
        other => other.clone(),
    }
}

pub use crate::domain::util::redact_url;

fn connect_error(url: &str, e: &sqlx::Error) -> DbError {
    DbError::Connect {
        url: redact_url(url),
        message: crate::domain::util::error_chain(e),
    }
}

/// Connect without checking migrations (only `migrate` should use this directly).
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, DbError> {
    // One direct connection first, so a refused or misaddressed server reports its real cause
    // (a pool would only say that it timed out).
    use sqlx::Connection;
    let probe = tokio::time::timeout(Duration::from_secs(10), sqlx::PgConnection::connect(url))
        .await
        .map_err(|_| DbError::Connect {
            url: redact_url(url),
            message: "no answer within 10 s".into(),
        })?
        .map_err(|e| connect_error(url, &e))?;
    let _ = probe.close().await;
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect(url)
        .await
        .map_err(|e| connect_error(url, &e))
}

/// Connect and verify that the applied migrations are exactly this binary's.
pub async fn open(url: &str, max_connections: u32) -> Result<PgPool, DbError> {
    let pool = connect(url, max_connections).await?;
    check_migrations(&pool, url).await?;
    Ok(pool)
}

/// Create the database if missing, then apply pending migrations. Returns applied versions.
pub async fn migrate(url: &str) -> Result<Vec<i64>, DbError> {
    if !sqlx::Postgres::database_exists(url)
        .await
        .map_err(|e| connect_error(url, &e))?
    {
        tracing::info!(url = %redact_url(url), "creating database");
        sqlx::Postgres::create_database(url)
            .await
            .map_err(|e| connect_error(url, &e))?;
    }
    let pool = connect(url, 2).await?;
    let before = applied(&pool).await?;
    MIGRATOR.run(&pool).await?;
    let after = applied(&pool).await?;
    pool.close().await;
    Ok(after
        .keys()
        .filter(|v| !before.contains_key(v))
        .copied()
        .collect())
}

/// version -> (checksum, success)
async fn applied(pool: &PgPool) -> Result<BTreeMap<i64, (Vec<u8>, bool)>, DbError> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !exists {
        return Ok(BTreeMap::new());
    }
    let rows: Vec<(i64, Vec<u8>, bool)> =
        sqlx::query_as("SELECT version, checksum, success FROM _sqlx_migrations ORDER BY version")
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().map(|(v, c, s)| (v, (c, s))).collect())
}

/// The applied set must equal the embedded set, with equal checksums and nothing dirty.
pub async fn check_migrations(pool: &PgPool, url: &str) -> Result<(), DbError> {
    let url = redact_url(url);
    let applied = applied(pool).await?;
    if applied.is_empty() {
        return Err(DbError::NotMigrated { url });
    }
    if let Some((v, _)) = applied.iter().find(|(_, (_, ok))| !ok) {
        return Err(DbError::Dirty { url, version: *v });
    }
    let embedded: BTreeMap<i64, &sqlx::migrate::Migration> =
        MIGRATOR.iter().map(|m| (m.version, m)).collect();
    let unknown: Vec<i64> = applied
        .keys()
        .filter(|v| !embedded.contains_key(v))
        .copied()
        .collect();
    if !unknown.is_empty() {
        return Err(DbError::UnknownMigrations { url, unknown });
    }
    let missing: Vec<i64> = embedded
        .keys()
        .filter(|v| !applied.contains_key(v))
        .copied()
        .collect();
    if !missing.is_empty() {
        return Err(DbError::MissingMigrations { url, missing });
    }
    for (v, m) in &embedded {
        if let Some((sum, _)) = applied.get(v)
            && sum.as_slice() != &*m.checksum
        {
            return Err(DbError::ChecksumMismatch {
                url,
                version: *v,
                description: m.description.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert!(!redact_url("postgres://u:se cret@h/db").contains("se cret"));
    }
}
