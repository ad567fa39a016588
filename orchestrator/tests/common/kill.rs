//! Crash tests: kill a running CLI with SIGKILL once Postgres shows it got somewhere.
#![allow(dead_code)]
#![allow(clippy::disallowed_methods)] // polls Postgres directly to see what the CLI stored

use std::time::{Duration, Instant};

/// Wait (at most 60 s) until `count_sql` (a `SELECT count(*) ...`) reaches `at_least`, then
/// kill `child` with SIGKILL and reap it. Panics naming `what` when the count never gets there.
pub async fn kill_once_stored(
    child: &mut std::process::Child,
    pool: &sqlx::PgPool,
    count_sql: &str,
    at_least: i64,
    what: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n: i64 = sqlx::query_scalar(count_sql)
            .fetch_one(pool)
            .await
            .unwrap_or(0);
        if n >= at_least {
            break;
        }
        assert!(Instant::now() < deadline, "{what} in time");
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    child.kill().expect("SIGKILL the CLI");
    let _ = child.wait();
}
