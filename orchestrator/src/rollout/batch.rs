//! Batches: n rollouts per task, concurrent across tasks with a bound on trajectories in flight,
//! cancellation-safe (a cancelled batch stops starting work and abandons what is in flight), with
//! a progress bar.

use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::engine::{Rollout, RolloutCtx, RolloutError, RolloutSlot, RolloutTask};

/// Roll out every task `n` times. Results come back in (task, sample) order; a cancelled batch
/// returns `Cancelled` for the trajectories that did not finish.
pub async fn rollout_batch(
    ctx: &RolloutCtx,
    tasks: &[RolloutTask],
    n: u32,
    slot: RolloutSlot,
    max_inflight: usize,
    cancel: &CancellationToken,
    progress: Option<&indicatif::ProgressBar>,
) -> Vec<Result<Rollout, RolloutError>> {
    let sem = Arc::new(Semaphore::new(max_inflight.max(1)));
    let mut set = tokio::task::JoinSet::new();
    for (ti, task) in tasks.iter().enumerate() {
        for k in 0..n {
            let (ctx, task, sem, cancel) = (ctx.clone(), task.clone(), sem.clone(), cancel.clone());
            let slot = RolloutSlot {
                sample_index: k as i32,
                ..slot
            };
            set.spawn(async move {
                let key = (ti, k);
                let Ok(_permit) = sem.acquire_owned().await else {
                    return (key, Err(RolloutError::Cancelled));
                };
                tokio::select! {
                    _ = cancel.cancelled() => (key, Err(RolloutError::Cancelled)),
                    r = ctx.run(&task, slot) => (key, r),
                }
            });
        }
    }
    let mut out: Vec<Option<Result<Rollout, RolloutError>>> =
        (0..tasks.len() * n as usize).map(|_| None).collect();
    while let Some(joined) = set.join_next().await {
        if let Ok(((ti, k), r)) = joined {
            out[ti * n as usize + k as usize] = Some(r);
        }
        if let Some(pb) = progress {
            pb.inc(1);
        }
    }
    out.into_iter()
        .map(|r| r.unwrap_or(Err(RolloutError::Cancelled)))
        .collect()
}
