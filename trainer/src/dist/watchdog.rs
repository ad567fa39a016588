//! A process-wide deadline for calls into c10d's TCPStore that can block past their own
//! timeout. The store's client cancels a timed-out wait and then reads the server's
//! acknowledgement with no timeout: across a network partition (the store's host out of reach,
//! no connection ever closed) that read lasts until the kernel gives up on the connection, about
//! 15 minutes, or forever when nothing is left to send. [`within`] runs such a call (every store
//! call of a [`C10d`](super::C10d) group goes through it); if it has not returned by its
//! deadline the process exits with an error naming the rank and the call, and the launcher stops
//! the job as for any rank that dies.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once, PoisonError};
use std::time::{Duration, Instant};

/// The exit status of a process the watchdog ends.
pub const EXIT: i32 = 3;

/// What a store call may take beyond its own timeout (the cancel's round trip, answered at
/// once by a live store).
pub const GRACE: Duration = Duration::from_secs(30);

/// A call being watched.
struct Armed {
    id: u64,
    deadline: Instant,
    rank: usize,
    what: String,
}

static ARMED: Mutex<Vec<Armed>> = Mutex::new(Vec::new());
static NEXT: AtomicU64 = AtomicU64::new(0);
static START: Once = Once::new();

/// Run `f`, a store call of `rank` named `what`; if it has not returned after `limit`, the
/// process exits with status [`EXIT`].
pub fn within<T>(rank: usize, what: String, limit: Duration, f: impl FnOnce() -> T) -> T {
    START.call_once(start);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let deadline = Instant::now() + limit;
    lock().push(Armed {
        id,
        deadline,
        rank,
        what,
    });
    let out = f();
    lock().retain(|a| a.id != id);
    out
}

fn lock() -> std::sync::MutexGuard<'static, Vec<Armed>> {
    ARMED.lock().unwrap_or_else(PoisonError::into_inner)
}

fn start() {
    let spawned = std::thread::Builder::new()
        .name("store-watchdog".into())
        .spawn(|| {
            loop {
                std::thread::sleep(Duration::from_millis(500));
                let now = Instant::now();
                let late = lock()
                    .iter()
                    .find(|a| now > a.deadline)
                    .map(|a| (a.rank, a.what.clone()));
                if let Some((rank, what)) = late {
                    let why = format!(
                        "rank {rank}: {what} did not return by its deadline: the group's store \
                         is out of reach (its host gone or the network partitioned)"
                    );
                    tracing::error!("{why}; exiting");
                    eprintln!("{why}");
                    std::process::exit(EXIT);
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no store watchdog: a network partition may block this rank");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_within_its_limit_returns_its_value_and_is_unwatched_after() {
        let what = "a test call";
        assert_eq!(within(0, what.into(), Duration::from_secs(60), || 7), 7);
        assert!(lock().iter().all(|a| a.what != what));
    }
}
