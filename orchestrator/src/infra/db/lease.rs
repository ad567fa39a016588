//! One orchestrator per run, enforced in Postgres: a session advisory lock keyed by the run id
//! on a connection of its own (detached from the pool, so the lock dies with the process or the
//! lease, never lingers on a pooled connection), with the holder written to `run_leases` so a
//! refused second orchestrator can name it.

use sqlx::{Connection, PgConnection, PgPool};
use uuid::Uuid;

use super::DbError;

/// Held while an orchestrator runs a run; dropping it (or the process dying) releases the run.
pub struct RunLease {
    conn: Option<PgConnection>,
    pub run_id: Uuid,
}

impl std::fmt::Debug for RunLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunLease")
            .field("run_id", &self.run_id)
            .finish()
    }
}

/// The advisory-lock key of a run: its 128 bits folded to 64.
fn key(run_id: Uuid) -> i64 {
    let (hi, lo) = run_id.as_u64_pair();
    (hi ^ lo) as i64
}

/// Why a lease was not granted.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error(
        "run {run_id} is already being run by another orchestrator ({holder}, since {since}); \
         stop it first, or wait for it to finish"
    )]
    Held {
        run_id: Uuid,
        holder: String,
        since: String,
    },
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<sqlx::Error> for LeaseError {
    fn from(e: sqlx::Error) -> Self {
        LeaseError::Db(DbError::from(e))
    }
}

/// How long [`acquire`] waits on a held run before refusing it. A holder killed outright (SIGKILL,
/// OOM) holds its lock until its Postgres backend reads the closed socket and exits; on a loaded
/// machine that can come after the `--resume` that follows the kill (the test
/// `sigkill_mid_step_then_resume_loses_and_duplicates_nothing` was refused so once in session
/// 84). A live holder is refused after this wait.
pub const HELD_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Take the run for this process, or say who holds it. `holder` describes this process (host,
/// pid) for the message another orchestrator will see. A held run is waited on for `grace`
/// (the lock is taken the moment its holder's connection ends), then refused.
pub async fn acquire(
    pool: &PgPool,
    run_id: Uuid,
    holder: &str,
    grace: std::time::Duration,
) -> Result<RunLease, LeaseError> {
    let mut conn = pool.acquire().await?.detach();
    let mut got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(key(run_id))
        .fetch_one(&mut conn)
        .await?;
    if !got && !grace.is_zero() {
        got = wait_for_lock(&mut conn, run_id, grace).await?;
    }
    if !got {
        let row: Option<(String, String)> = sqlx::query_as(
            "SELECT holder, to_char(acquired_at, 'YYYY-MM-DD HH24:MI:SS TZ') FROM run_leases
             WHERE run_id = $1",
        )
        .bind(run_id)
        .fetch_optional(&mut conn)
        .await?;
        let _ = conn.close().await;
        let (holder, since) = row.unwrap_or_else(|| ("unknown".into(), "unknown".into()));
        return Err(LeaseError::Held {
            run_id,
            holder,
            since,
        });
    }
    sqlx::query(
        "INSERT INTO run_leases (run_id, holder, acquired_at) VALUES ($1, $2, now())
         ON CONFLICT (run_id) DO UPDATE SET holder = EXCLUDED.holder, acquired_at = now()",
    )
    .bind(run_id)
    .bind(super::pg_text(holder).as_ref())
    .execute(&mut conn)
    .await?;
    Ok(RunLease {
        conn: Some(conn),
        run_id,
    })
}

/// Block on the run's lock for at most `grace`: Postgres's `lock_timeout`, which bounds an
/// advisory lock's wait too, set for one transaction alone so the connection's own setting
/// comes back whatever happens (a session-level advisory lock outlives the transaction that
/// took it). False when the wait ran out (SQLSTATE 55P03, lock_not_available).
async fn wait_for_lock(
    conn: &mut PgConnection,
    run_id: Uuid,
    grace: std::time::Duration,
) -> Result<bool, LeaseError> {
    let mut tx = conn.begin().await?;
    sqlx::query("SELECT set_config('lock_timeout', $1, true)")
        .bind(format!("{}ms", grace.as_millis().max(1)))
        .execute(&mut *tx)
        .await?;
    let waited = sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(key(run_id))
        .execute(&mut *tx)
        .await;
    match waited {
        Ok(_) => {
            tx.commit().await?;
            Ok(true)
        }
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55P03") => {
            tx.rollback().await?;
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

impl RunLease {
    /// Release the run now (dropping the lease also releases it, when its connection closes).
    pub async fn release(mut self) {
        if let Some(mut c) = self.conn.take() {
            let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(key(self.run_id))
                .execute(&mut c)
                .await;
            let _ = c.close().await;
        }
    }
}

/// This process, as a lease holder names it.
pub fn this_process() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_else(|| "unknown host".into());
    format!("orchestrator pid {} on {host}", std::process::id())
}
