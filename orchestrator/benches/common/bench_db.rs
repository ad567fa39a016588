//! A freshly migrated benchmark database on the server at `DATABASE_URL` (shared by the
//! benches that need Postgres; each names its own database, which is dropped and recreated).
#![allow(dead_code, reason = "each bench uses the part it needs")]

use sqlx::PgPool;

/// Drop and recreate database `name`, apply the migrations, and open a pool of `conns`;
/// returns the pool and the database URL.
pub async fn fresh(name: &str, conns: u32) -> (PgPool, String) {
    use sqlx::migrate::MigrateDatabase;
    let base = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| orchestrator::domain::config::DEFAULT_DATABASE_URL.into());
    let mut url = url::Url::parse(&base).expect("DATABASE_URL is a URL");
    url.set_path(&format!("/{name}"));
    let url = url.to_string();
    let _ = sqlx::Postgres::drop_database(&url).await;
    orchestrator::infra::db::migrate(&url)
        .await
        .expect("migrating the benchmark database");
    let pool = orchestrator::infra::db::open(&url, conns)
        .await
        .expect("opening the benchmark database");
    (pool, url)
}

/// Drop a benchmark database made by [`fresh`].
pub async fn drop(url: &str) {
    use sqlx::migrate::MigrateDatabase;
    let _ = sqlx::Postgres::drop_database(url).await;
}
