//! Scheduling the reflection jobs of a run (method.md A.6.3): one background job per judged
//! new-batch step, awaited (up to `reflection.wait_secs`) before the next train step, relaunched
//! on resume, finished before the run ends. The job itself is `pipeline::reflection`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::{Pipeline, PipelineError, Shared};
use crate::infra::db::{self};

impl Pipeline {
    /// Start the background reflection job of a judged new-phase step (never awaited here).
    pub(super) fn launch_reflection(self: &Arc<Self>, s: i32, shared: &Arc<Shared>) {
        let Some(slot) = self.slot(s) else { return };
        if slot.phase != crate::domain::schedule::Phase::New {
            return;
        }
        if shared.jobs.lock().is_ok_and(|g| g.contains_key(&s)) {
            return;
        }
        let this = self.clone();
        let sh = shared.clone();
        let handle = tokio::spawn(async move {
            let Some(mem) = &this.memory else { return };
            // A finished job is never redone: its candidates may already be trained.
            match db::bank::job_status(&this.pool, this.run_id, s).await {
                Ok(Some(st)) if st == "done" || st == "failed" => return,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(step = s, error = %e, "reading the reflection job status failed");
                    return;
                }
            }
            let mut r = mem.reflector.clone();
            r.client = sh.client(&r.client);
            let version = *sh.trained.borrow();
            match r.run_job(s, version).await {
                Ok(rep) => {
                    let mut m = rep.metrics();
                    m.push(("reflection/failed".into(), 0.0));
                    if let Err(e) = db::metrics::record(&this.pool, this.run_id, s, &m).await {
                        tracing::warn!(step = s, error = %e, "recording reflection metrics failed");
                    }
                    tracing::info!(
                        step = s,
                        candidates = rep.candidates,
                        valid = rep.valid,
                        bank_writes = rep.bank_writes,
                        "reflection job done"
                    );
                }
                Err(e) => {
                    // Logged and recorded; the replay of these questions falls back to
                    // cross-episode retrieval.
                    tracing::warn!(step = s, error = %e, "reflection job failed");
                    let msg = crate::domain::util::error_chain(&e);
                    let _ = db::bank::fail_job(&this.pool, this.run_id, s, &msg).await;
                    let _ = db::metrics::record(
                        &this.pool,
                        this.run_id,
                        s,
                        &[("reflection/failed".to_string(), 1.0)],
                    )
                    .await;
                }
            }
        });
        if let Ok(mut g) = shared.jobs.lock() {
            g.insert(s, handle);
        }
    }

    /// Wait (up to `wait`) for the reflection job of step `s`; returns the seconds waited.
    pub(super) async fn await_reflection(&self, s: i32, shared: &Shared) -> f64 {
        let Some(mem) = &self.memory else { return 0.0 };
        let handle = shared.jobs.lock().ok().and_then(|mut g| g.remove(&s));
        let Some(mut handle) = handle else { return 0.0 };
        let t0 = Instant::now();
        if tokio::time::timeout(mem.wait, &mut handle).await.is_err() {
            tracing::warn!(
                step = s,
                waited_secs = mem.wait.as_secs(),
                "reflection job still running; training without it (its candidates join a later step)"
            );
            if let Ok(mut g) = shared.jobs.lock() {
                g.insert(s, handle);
            }
        }
        t0.elapsed().as_secs_f64()
    }

    /// On (re)start: rerun the reflection jobs of judged new-phase steps that never finished
    /// (the process died while they ran), so their candidates and bank rows are not lost.
    pub(super) async fn relaunch_reflections(
        self: &Arc<Self>,
        rows: &[db::pipeline::StepRow],
        shared: &Arc<Shared>,
    ) -> Result<(), PipelineError> {
        if self.memory.is_none() {
            return Ok(());
        }
        let jobs: HashMap<i32, String> = db::bank::jobs(&self.pool, self.run_id)
            .await?
            .into_iter()
            .collect();
        for r in rows {
            let judged = r.status == "training" || r.status == "completed";
            let finished = matches!(
                jobs.get(&r.step).map(String::as_str),
                Some("done" | "failed")
            );
            if judged && !finished {
                tracing::info!(step = r.step, "relaunching an unfinished reflection job");
                self.launch_reflection(r.step, shared);
            }
        }
        Ok(())
    }

    /// At the end of a run: let outstanding reflection jobs finish (their bank writes serve
    /// evaluation and later runs), or abort them when the run was cancelled.
    pub(super) async fn finish_reflections(&self, shared: &Shared, cancel: &CancellationToken) {
        let handles: Vec<_> = match shared.jobs.lock() {
            Ok(mut g) => g.drain().map(|(_, h)| h).collect(),
            Err(_) => return,
        };
        for h in handles {
            if cancel.is_cancelled() {
                h.abort();
            } else {
                let _ = h.await;
            }
        }
    }
}
