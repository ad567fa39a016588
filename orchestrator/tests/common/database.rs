//! The URL of a `#[sqlx::test]`'s own database, for the binaries and scripts a test runs.
#![allow(dead_code)]

/// `DATABASE_URL` with its database (and any `?` parameters) replaced by the test's own fresh
/// database, which `#[sqlx::test]` created under another name.
#[allow(
    clippy::disallowed_methods,
    clippy::expect_used,
    reason = "asks Postgres its own name; a test without DATABASE_URL fails loudly"
)]
pub async fn db_url(pool: &sqlx::PgPool) -> String {
    let db_name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(pool)
        .await
        .expect("the test database answers");
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let base = base.split('?').next().unwrap_or_default();
    let (server, _) = base.rsplit_once('/').expect("a database URL with a path");
    format!("{server}/{db_name}")
}
