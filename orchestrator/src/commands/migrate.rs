//! `orchestrator migrate` creates the database if needed and applies pending migrations;
//! `orchestrator db-check` checks that it is reachable and migrated to this binary's set.

use std::process::ExitCode;

use super::out;
use crate::infra::db;

/// `orchestrator migrate`.
pub(super) async fn migrate(database_url: &str) -> anyhow::Result<ExitCode> {
    let applied = db::migrate(database_url).await?;
    db::check_migrations(&db::connect(database_url, 1).await?, database_url).await?;
    out(format!(
        "migrations up to date on {} ({} applied now, {} embedded)",
        db::redact_url(database_url),
        applied.len(),
        db::MIGRATOR.iter().count()
    ));
    Ok(ExitCode::SUCCESS)
}

/// `orchestrator db-check`.
pub(super) async fn db_check(database_url: &str) -> anyhow::Result<ExitCode> {
    db::open(database_url, 1).await?;
    out(format!(
        "database {} is reachable and migrated",
        db::redact_url(database_url)
    ));
    Ok(ExitCode::SUCCESS)
}
