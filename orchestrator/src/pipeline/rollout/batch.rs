//! Batches: n rollouts per task, concurrent across tasks with a bound on trajectories in flight,
//! cancellation-safe (a cancelled batch stops starting work and abandons what is in flight), with
//! a progress bar.

use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::admission::Admission;
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
    rollout_batch_gated(ctx, tasks, n, slot, max_inflight, cancel, progress, None).await
}

/// [`rollout_batch`] with admission control: each trajectory starts only once the gate lets it
/// (the policy servers' queues are short enough).
#[allow(clippy::too_many_arguments)]
pub async fn rollout_batch_gated(
    ctx: &RolloutCtx,
    tasks: &[RolloutTask],
    n: u32,
    slot: RolloutSlot,
    max_inflight: usize,
    cancel: &CancellationToken,
    progress: Option<&indicatif::ProgressBar>,
    gate: Option<Arc<Admission>>,
) -> Vec<Result<Rollout, RolloutError>> {
    let slots = Arc::new(Semaphore::new(max_inflight.max(1)));
    rollout_batch_pooled(ctx, tasks, n, slot, slots, cancel, progress, gate).await
}

/// [`rollout_batch_gated`] drawing its trajectory slots from `slots`, a pool that other batches
/// may share: a trajectory starts once it holds a slot, and tokio's semaphore hands slots out
/// first come, first served, so a batch started later runs in the slots an earlier one frees
/// (`pipeline.overlap_rollouts`).
#[allow(clippy::too_many_arguments)]
pub async fn rollout_batch_pooled(
    ctx: &RolloutCtx,
    tasks: &[RolloutTask],
    n: u32,
    slot: RolloutSlot,
    slots: Arc<Semaphore>,
    cancel: &CancellationToken,
    progress: Option<&indicatif::ProgressBar>,
    gate: Option<Arc<Admission>>,
) -> Vec<Result<Rollout, RolloutError>> {
    let mut set = tokio::task::JoinSet::new();
    for (ti, task) in tasks.iter().enumerate() {
        for k in 0..n {
            let (ctx, task, sem, cancel, gate) = (
                ctx.clone(),
                task.clone(),
                slots.clone(),
                cancel.clone(),
                gate.clone(),
            );
            let slot = RolloutSlot {
                sample_index: k as i32,
                ..slot
            };
            set.spawn(async move {
                let key = (ti, k);
                let Ok(_permit) = sem.acquire_owned().await else {
                    return (key, Err(RolloutError::Cancelled));
                };
                if let Some(g) = &gate {
                    g.admit(&cancel).await;
                }
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

/// Run a batch and keep the successful rollouts, with the counts `orchestrator rollout` reports.
pub async fn rollout_batch_summary(
    ctx: &RolloutCtx,
    tasks: &[RolloutTask],
    n: u32,
    slot: RolloutSlot,
    max_inflight: usize,
    cancel: &CancellationToken,
    progress: Option<&indicatif::ProgressBar>,
) -> (Vec<Rollout>, RolloutSummary) {
    let results = rollout_batch(ctx, tasks, n, slot, max_inflight, cancel, progress).await;
    summarize(results)
}

/// Keep the successful rollouts and count finish reasons, tool calls, parse failures, tokens.
pub fn summarize(results: Vec<Result<Rollout, RolloutError>>) -> (Vec<Rollout>, RolloutSummary) {
    let mut summary = RolloutSummary::default();
    let mut ok = Vec::new();
    for r in results {
        match r {
            Ok(r) => {
                *summary
                    .finish_reasons
                    .entry(r.trajectory.finish_reason.clone())
                    .or_default() += 1;
                for c in &r.calls {
                    *summary
                        .tool_calls
                        .entry((c.stage.as_str().to_string(), c.result.tool.clone()))
                        .or_default() += 1;
                }
                if r.parsed.failed() {
                    summary.parse_failures += 1;
                }
                if let Some(a) = &r.parsed.answer {
                    summary.answers += 1;
                    summary.answer_chars += a.chars().count();
                }
                summary.model_tokens += r.trajectory.num_model_tokens();
                ok.push(r);
            }
            Err(e) => {
                *summary
                    .finish_reasons
                    .entry(format!("not_run ({e})"))
                    .or_default() += 1;
            }
        }
    }
    summary.trajectories = ok.len();
    (ok, summary)
}

/// What `orchestrator rollout` reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RolloutSummary {
    pub run_id: uuid::Uuid,
    pub trajectories: usize,
    pub finish_reasons: std::collections::BTreeMap<String, usize>,
    /// (stage, tool) -> calls
    pub tool_calls: std::collections::BTreeMap<(String, String), usize>,
    /// Trajectories with malformed tags or without a recognised plan or answer.
    pub parse_failures: usize,
    pub model_tokens: usize,
    /// Trajectories with an answer, and the characters of those answers together.
    pub answers: usize,
    pub answer_chars: usize,
    pub seconds: f64,
}

impl RolloutSummary {
    pub fn render(&self) -> String {
        let mut s = format!(
            "run {}: {} trajectories in {:.1} s, {} model tokens ({:.0} tokens/s)\nfinish reasons:",
            self.run_id,
            self.trajectories,
            self.seconds,
            self.model_tokens,
            self.model_tokens as f64 / self.seconds.max(1e-9)
        );
        for (k, v) in &self.finish_reasons {
            s.push_str(&format!(" {k}={v}"));
        }
        s.push_str("\ntool calls per stage:");
        if self.tool_calls.is_empty() {
            s.push_str(" none");
        }
        for ((stage, tool), n) in &self.tool_calls {
            s.push_str(&format!(" {stage}/{tool}={n}"));
        }
        s.push_str(&format!("\nparse failures: {}", self.parse_failures));
        s
    }
}
