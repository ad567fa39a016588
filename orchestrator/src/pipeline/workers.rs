//! The three workers of a run (rollout, judging, training) joined by bounded channels, and what
//! they share: the rollout context with memory injection, the batch a judged step becomes, the
//! progress line.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use sqlx::PgPool;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{Pipeline, PipelineError, Shared, batch};
use crate::domain::bank::Reuse;
use crate::infra::db::{self};
use crate::infra::llm::trainer::{named_metrics, publish_seconds, published_name};
use crate::pipeline::judging::{StepError, judge_step_guarded};
use crate::pipeline::rollout::{Rollout, RolloutCtx, RolloutError, RolloutSlot, RolloutTask};

/// What [`Pipeline::guide`] added to a step, and what it left out.
#[derive(Debug, Default)]
struct Guided {
    added: usize,
    failed: usize,
    over_budget: usize,
}

/// A step's trajectories, in (task, sample) order.
type StepResults = Vec<Result<Rollout, RolloutError>>;

/// A step whose rollouts run in the background ([`Pipeline::launch`]).
struct Launched {
    tasks: Vec<RolloutTask>,
    ctx: RolloutCtx,
    /// The step and the policy version it starts on, with sample index 0.
    slot: RolloutSlot,
    memory_metrics: Vec<(String, f64)>,
    started: Instant,
    /// Seconds the step waited on the staleness bound once it could otherwise have started.
    wait_secs: f64,
    /// Steps still rolling out when it started (`pipeline.overlap_rollouts`).
    behind: usize,
    handle: tokio::task::JoinHandle<StepResults>,
}

/// What the rollout worker waits for next.
enum Event {
    Cancelled,
    TrainerGone,
    Launch,
    Finished(Result<StepResults, tokio::task::JoinError>),
}

impl Pipeline {
    pub(super) fn rollout_ctx(&self, shared: &Shared) -> RolloutCtx {
        let mut ctx = self.rollout.clone();
        ctx.client = shared.client(&ctx.client);
        ctx
    }

    /// Rolls out steps `first..` in order and hands each, committed, to the judge. A step
    /// starts once the staleness bound allows it and, without `pipeline.overlap_rollouts`, once
    /// the previous step is committed; with it, as soon as the bound allows, its trajectories
    /// taking the slots of the shared pool (`pipeline.max_inflight`) that the previous step's
    /// finished ones free. Either way steps are committed and judged in order.
    pub(super) async fn rollout_worker(
        self: Arc<Self>,
        first: i32,
        mut trained: watch::Receiver<i32>,
        judge_tx: mpsc::Sender<i32>,
        shared: Arc<Shared>,
        cancel: CancellationToken,
    ) -> Result<(), PipelineError> {
        let k = self.cfg.max_staleness as i32;
        let steps = self.steps as i32;
        let slots = Arc::new(Semaphore::new(self.cfg.max_inflight.max(1) as usize));
        let mut inflight: VecDeque<Launched> = VecDeque::new();
        let mut next = first;
        // When the next step could start but for the staleness bound (rollout/wait_s).
        let mut ready_at = Instant::now();
        let result = loop {
            let may_launch = next < steps && (self.cfg.overlap_rollouts || inflight.is_empty());
            if !may_launch && inflight.is_empty() {
                break Ok(());
            }
            // Staleness bound: steps up to s - 1 - k must be trained before s is rolled out.
            let bound = next - k;
            let event = tokio::select! {
                biased;
                _ = cancel.cancelled() => Event::Cancelled,
                joined = async {
                    match inflight.front_mut() {
                        Some(l) => (&mut l.handle).await,
                        None => std::future::pending().await,
                    }
                }, if !inflight.is_empty() => Event::Finished(joined),
                ok = async { trained.wait_for(|v| *v >= bound).await.is_ok() },
                    if may_launch => if ok { Event::Launch } else { Event::TrainerGone },
            };
            match event {
                Event::Cancelled | Event::TrainerGone => break Ok(()),
                Event::Launch => {
                    let wait_secs = ready_at.elapsed().as_secs_f64();
                    let behind = inflight.len();
                    match self.launch(next, &trained, &shared, &slots, &cancel).await {
                        Ok(mut l) => {
                            l.wait_secs = wait_secs;
                            l.behind = behind;
                            inflight.push_back(l);
                        }
                        Err(e) => break Err(e),
                    }
                    next += 1;
                    ready_at = Instant::now();
                }
                Event::Finished(joined) => {
                    let results = match joined {
                        Ok(r) if !cancel.is_cancelled() => r,
                        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                        // Cancelled: the step stays in flight, to be marked abandoned below.
                        _ => break Ok(()),
                    };
                    let Some(l) = inflight.pop_front() else {
                        break Ok(());
                    };
                    match self.commit_step(l, results, &judge_tx).await {
                        Ok(true) => {}
                        Ok(false) => break Ok(()),
                        Err(e) => break Err(e),
                    }
                    if !self.cfg.overlap_rollouts {
                        ready_at = Instant::now();
                    }
                }
            }
        };
        // Whatever is still rolling out was interrupted (or the run ends with an error): its
        // trajectories are abandoned, and resume starts the step over.
        for l in inflight {
            l.handle.abort();
            if result.is_ok() {
                db::runs::set_step_status(&self.pool, self.run_id, l.slot.step, "abandoned")
                    .await?;
                tracing::warn!(
                    step = l.slot.step,
                    "interrupted: rollouts of this step abandoned"
                );
            }
        }
        result
    }

    /// Start step `s`'s rollouts in the background: its tasks (with memory), the step row, and
    /// one trajectory per task and sample drawing from `slots`.
    async fn launch(
        &self,
        s: i32,
        trained: &watch::Receiver<i32>,
        shared: &Shared,
        slots: &Arc<Semaphore>,
        cancel: &CancellationToken,
    ) -> Result<Launched, PipelineError> {
        let version = *trained.borrow();
        let slot = self.slot(s);
        let picks = crate::domain::schedule::tasks_for_step(
            self.tasks.len(),
            self.tasks_per_step,
            self.seed,
            slot.map_or(s as u32, |x| x.batch),
        );
        let (tasks, memory_metrics) = self.with_memory(&picks, slot).await?;
        let ids: Vec<Uuid> = tasks.iter().map(|t| t.task_id).collect();
        db::pipeline::restart_step(&self.pool, self.run_id, s, version, &ids).await?;
        let ctx = self.rollout_ctx(shared);
        let slot = RolloutSlot {
            run_id: self.run_id,
            step: s,
            sample_index: 0,
            policy_version: version,
        };
        let handle = tokio::spawn({
            let (ctx, tasks, slots, cancel) =
                (ctx.clone(), tasks.clone(), slots.clone(), cancel.clone());
            let (n, gate) = (self.n, self.admission.clone());
            async move {
                crate::pipeline::rollout::rollout_batch_pooled(
                    &ctx, &tasks, n, slot, slots, &cancel, None, gate,
                )
                .await
            }
        });
        Ok(Launched {
            tasks,
            ctx,
            slot,
            memory_metrics,
            started: Instant::now(),
            wait_secs: 0.0,
            behind: 0,
            handle,
        })
    }

    /// A finished step: the demonstrations added, the trajectories committed, the step's
    /// rollout metrics recorded, the step handed to the judge. False when the judge is gone.
    async fn commit_step(
        &self,
        l: Launched,
        results: StepResults,
        judge_tx: &mpsc::Sender<i32>,
    ) -> Result<bool, PipelineError> {
        let s = l.slot.step;
        let (mut rollouts, summary) = crate::pipeline::rollout::summarize(results);
        let guided = self.guide(&l.ctx, &l.tasks, l.slot, &mut rollouts).await;
        db::pipeline::commit_rollouts(&self.pool, self.run_id, s, &rollouts).await?;
        let secs = l.started.elapsed().as_secs_f64();
        let mut m = vec![
            ("time/rollout_s".to_string(), secs),
            ("time/rollout_wait_s".to_string(), l.wait_secs),
            ("rollout/overlapping_steps".to_string(), l.behind as f64),
            (
                "rollout/trajectories".to_string(),
                summary.trajectories as f64,
            ),
            (
                "rollout/model_tokens".to_string(),
                summary.model_tokens as f64,
            ),
            (
                "rollout/tokens_per_s".to_string(),
                summary.model_tokens as f64 / secs.max(1e-9),
            ),
            (
                "rollout/parse_failures".to_string(),
                summary.parse_failures as f64,
            ),
            (
                "rollout/answer_chars".to_string(),
                summary.answer_chars as f64 / summary.answers.max(1) as f64,
            ),
            (
                "rollout/policy_version".to_string(),
                f64::from(l.slot.policy_version),
            ),
        ];
        if !self.guidance.is_empty() {
            m.push(("rollout/guidance".to_string(), guided.added as f64));
            m.push(("rollout/guidance_failed".to_string(), guided.failed as f64));
            m.push((
                "rollout/guidance_over_budget".to_string(),
                guided.over_budget as f64,
            ));
        }
        m.extend(l.memory_metrics);
        if let Some(a) = &self.admission {
            m.push((
                "rollout/admission_held_s".to_string(),
                a.take_held().as_secs_f64(),
            ));
        }
        for (reason, c) in &summary.finish_reasons {
            m.push((format!("rollout/finish/{reason}"), *c as f64));
        }
        let mut per_stage = std::collections::BTreeMap::<String, usize>::new();
        for ((stage, _tool), c) in &summary.tool_calls {
            *per_stage.entry(stage.clone()).or_default() += c;
        }
        for (stage, c) in per_stage {
            m.push((format!("rollout/tool_calls/{stage}"), c as f64));
        }
        db::metrics::record(&self.pool, self.run_id, s, &m).await?;
        Ok(judge_tx.send(s).await.is_ok())
    }

    /// Off-policy guidance: each of `tasks` with a demonstration gets it replayed as one more
    /// member of its group (`sample_index` = n), appended to `rollouts`. Left out, and
    /// counted: a replay that fails (the codec; logged), and a demonstration longer than
    /// `rollout.max_tokens` (no sample of the group could have been). A group left without
    /// its demonstration trains on the policy's samples alone.
    async fn guide(
        &self,
        ctx: &RolloutCtx,
        tasks: &[RolloutTask],
        slot: RolloutSlot,
        rollouts: &mut Vec<Rollout>,
    ) -> Guided {
        let mut g = Guided::default();
        let slot = RolloutSlot {
            sample_index: self.n as i32,
            ..slot
        };
        for t in tasks {
            let Some(demo) = self.guidance.get(&t.task_id) else {
                continue;
            };
            match ctx.replay(t, slot, demo).await {
                Ok(r) => {
                    let tokens: usize = r
                        .trajectory
                        .segments
                        .iter()
                        .map(|x| x.token_ids.len())
                        .sum();
                    if tokens > ctx.cfg.max_tokens as usize {
                        g.over_budget += 1;
                    } else {
                        rollouts.push(r);
                        g.added += 1;
                    }
                }
                Err(e) => {
                    tracing::warn!(step = slot.step, task = %t.task_id, error = %e, "a demonstration could not be replayed; its group has no guidance this step");
                    g.failed += 1;
                }
            }
        }
        g
    }

    pub(super) async fn judge_worker(
        self: Arc<Self>,
        mut rx: mpsc::Receiver<i32>,
        tx: mpsc::Sender<Prepared>,
        shared: Arc<Shared>,
    ) -> Result<(), PipelineError> {
        while let Some(s) = rx.recv().await {
            let t0 = Instant::now();
            if !db::pipeline::is_judged(&self.pool, self.run_id, s, self.judge.model()).await? {
                judge_step_guarded(
                    &self.pool,
                    self.judge.as_ref(),
                    &self.judge_opts,
                    self.run_id,
                    s,
                    self.max_judge_failure_rate,
                )
                .await
                .map_err(|source| match source {
                    StepError::JudgeDown {
                        failed,
                        calls,
                        limit,
                        last_error,
                    } => PipelineError::JudgeDown {
                        step: s,
                        failed,
                        calls,
                        limit,
                        url: self.judge_url.clone(),
                        last_error,
                    },
                    source => PipelineError::Judge { step: s, source },
                })?;
            }
            db::runs::set_step_status(&self.pool, self.run_id, s, "training").await?;
            let judge_secs = t0.elapsed().as_secs_f64();
            self.launch_reflection(s, &shared);
            // Strictly sequential (max_staleness 0): the step's reflection job runs now, alone,
            // instead of beside the next step's rollouts and this step's training.
            let inline = if self.cfg.max_staleness == 0 {
                self.await_reflection(s, &shared).await
            } else {
                0.0
            };
            let t1 = Instant::now();
            let waited = self.await_reflection(s - 1, &shared).await;
            let (batch, stats, mut m) = self.build_batch(s, true).await?;
            if batch.seqs.is_empty() {
                // Nothing to learn from: the trainer takes an empty step (the policy version
                // advances, the weights do not change), so steps and versions stay aligned.
                tracing::warn!(
                    step = s,
                    groups_dropped = stats.groups_dropped,
                    failed_scoring = stats.failed_scoring,
                    "every group of the step is degenerate or unscored: nothing is trained"
                );
                m.push(("train/skipped".into(), 1.0));
            }
            m.extend(stats.metrics());
            m.push(("time/judge_s".into(), judge_secs));
            m.push(("time/reflection_wait_s".into(), waited));
            m.push(("time/reflection_inline_s".into(), inline));
            m.push(("time/prepare_s".into(), t1.elapsed().as_secs_f64()));
            db::metrics::record(&self.pool, self.run_id, s, &m).await?;
            // A cancelled run still trains what is judged, unless the train worker is gone.
            if tx.send(Prepared { step: s, batch }).await.is_err() {
                break;
            }
        }
        Ok(())
    }

    pub(super) async fn train_worker(
        self: Arc<Self>,
        mut rx: mpsc::Receiver<Prepared>,
        trained: watch::Sender<i32>,
        shared: Arc<Shared>,
        progress: indicatif::ProgressBar,
        cancel: CancellationToken,
    ) -> Result<(), PipelineError> {
        let mut idle = Instant::now();
        while let Some(p) = rx.recv().await {
            let idle_secs = idle.elapsed().as_secs_f64();
            let s = p.step;
            let t0 = Instant::now();
            let reply = self
                .train_with_recovery(s, &p.batch, &shared, &cancel)
                .await?;
            let train_secs = t0.elapsed().as_secs_f64();
            let mut m = vec![
                ("time/train_s".to_string(), train_secs),
                ("time/train_idle_s".to_string(), idle_secs),
                ("time/publish_s".to_string(), publish_seconds(&reply)),
                (
                    "train/policy_version".to_string(),
                    reply.policy_version.get() as f64,
                ),
            ];
            for (k, x) in named_metrics(&reply.metrics) {
                m.push((format!("train/{k}"), x));
            }
            for (k, x) in reply.reflection.iter().flat_map(named_metrics) {
                m.push((format!("train/reflection/{k}"), x));
            }
            db::metrics::record(&self.pool, self.run_id, s, &m).await?;
            if let Some(name) = published_name(reply.published.as_ref())
                && let Ok(mut g) = shared.model.write()
            {
                *g = Some(name);
            }
            db::runs::set_step_status(&self.pool, self.run_id, s, "completed").await?;
            let due = self.cfg.checkpoint_every > 0
                && (((s + 1) as u32).is_multiple_of(self.cfg.checkpoint_every)
                    || s + 1 == self.steps as i32);
            if due {
                self.checkpoint(s).await?;
            }
            let _ = trained.send(s + 1);
            self.evaluate_due(s + 1, &shared, &cancel).await?;
            self.show(&progress, s).await;
            idle = Instant::now();
        }
        Ok(())
    }

    /// The curriculum slot of a step (meta-policy recipes only).
    pub(super) fn slot(&self, s: i32) -> Option<crate::domain::schedule::Slot> {
        self.memory
            .as_ref()
            .map(|m| crate::domain::schedule::windowed(s.max(0) as u32, m.window))
    }

    /// The step's tasks, with `<reference_examples>` injected before the question when the
    /// recipe has memory (cross-episode on new steps, within-episode on replays), and metrics.
    pub(super) async fn with_memory(
        &self,
        picks: &[usize],
        slot: Option<crate::domain::schedule::Slot>,
    ) -> Result<(Vec<RolloutTask>, Vec<(String, f64)>), PipelineError> {
        let mut tasks: Vec<RolloutTask> = picks.iter().map(|&i| self.tasks[i].clone()).collect();
        let (Some(mem), Some(slot)) = (&self.memory, slot) else {
            return Ok((tasks, vec![]));
        };
        let mode = mem.inject.reuse(slot.phase);
        let t0 = Instant::now();
        let bank = &mem.reflector.bank;
        let queries: Vec<(Uuid, &str)> = tasks
            .iter()
            .zip(picks)
            .map(|(t, &i)| (t.task_id, self.questions[i].as_str()))
            .collect();
        let found = bank.retrieve_many(&queries, mode).await?;
        let (mut within, mut cross, mut fallback) = (0usize, 0usize, 0usize);
        for (t, got) in tasks.iter_mut().zip(found) {
            let got = mem.inject.keep(slot.phase, got);
            match got.mode() {
                Reuse::Within => within += 1,
                Reuse::Cross => {
                    cross += 1;
                    if mode == Reuse::Within {
                        fallback += 1;
                    }
                }
                Reuse::None => {}
            }
            t.user = got.clipped(mem.max_item_chars).inject(&t.user)?;
        }
        let n = tasks.len().max(1) as f64;
        let m = vec![
            (
                "curriculum/phase".to_string(),
                f64::from(u8::from(
                    slot.phase == crate::domain::schedule::Phase::Replay,
                )),
            ),
            ("curriculum/window".to_string(), f64::from(slot.window)),
            ("curriculum/batch".to_string(), f64::from(slot.batch)),
            ("bank/items".to_string(), bank.len() as f64),
            ("bank/injected_within".to_string(), within as f64 / n),
            ("bank/injected_cross".to_string(), cross as f64 / n),
            ("bank/within_fallbacks".to_string(), fallback as f64),
            ("time/retrieval_s".to_string(), t0.elapsed().as_secs_f64()),
        ];
        Ok((tasks, m))
    }

    /// A step's train batch: the deferred reflection candidates (Phase A) then its trajectories.
    /// `fresh` (first build) assigns every finished, untrained candidate to this step; a replay
    /// reads the assignment back, so the bytes match the first build. With
    /// `trainer.reflection_lr_scale = 0` no candidate is assigned or sent.
    pub(super) async fn build_batch(
        &self,
        s: i32,
        fresh: bool,
    ) -> Result<(wire::Batch, batch::BatchStats, Vec<(String, f64)>), PipelineError> {
        let (mut b, stats) = batch::build(
            &self.pool,
            self.run_id,
            s,
            self.judge.model(),
            self.batch_credit,
        )
        .await?;
        let mut m = Vec::new();
        if self.memory.is_none() {
            return Ok((b, stats, m));
        }
        if self.trainer_settings.reflection_lr_scale == 0.0 {
            // Phase A left out (`trainer.reflection_lr_scale = 0`): the candidates still write
            // the bank, but none is assigned to a step or sent; they stay untrained.
            m.push(("batch/reflection_sequences".to_string(), 0.0));
            return Ok((b, stats, m));
        }
        if fresh {
            db::bank::assign_for_training(&self.pool, self.run_id, s).await?;
        }
        let rows = db::bank::for_training(&self.pool, self.run_id, s).await?;
        let first_group = b.seqs.iter().map(|q| q.group_id + 1).max().unwrap_or(0);
        let (refl, dropped) = crate::pipeline::reflection::trained(
            crate::pipeline::reflection::sequences(&rows, first_group),
            &self.batch_credit,
        );
        m.push((
            "train/reflection_groups_dropped".to_string(),
            dropped as f64,
        ));
        if !rows.is_empty() {
            let lag = rows.iter().map(|r| f64::from(s - r.step)).sum::<f64>() / rows.len() as f64;
            m.push(("reflection/lag_steps".to_string(), lag));
        }
        m.push(("batch/reflection_sequences".to_string(), refl.len() as f64));
        let mut seqs = refl;
        seqs.append(&mut b.seqs);
        b.seqs = seqs;
        Ok((b, stats, m))
    }

    pub(super) async fn show(&self, progress: &indicatif::ProgressBar, s: i32) {
        let get =
            |name: &'static str| async move { sqlx_value(&self.pool, self.run_id, s, name).await };
        let reward = get("reward/answer").await;
        let (r, j, t) = (
            get("time/rollout_s").await,
            get("time/judge_s").await,
            get("time/train_s").await,
        );
        progress.set_position((s + 1) as u64);
        progress.set_message(format!(
            "step {s}: reward {:.3} | rollout {:.1}s judge {:.1}s train {:.1}s",
            reward.unwrap_or(f64::NAN),
            r.unwrap_or(0.0),
            j.unwrap_or(0.0),
            t.unwrap_or(0.0)
        ));
    }
}

/// A judged step's batch on its way to the trainer.
pub(super) struct Prepared {
    pub(super) step: i32,
    pub(super) batch: wire::Batch,
}

async fn sqlx_value(pool: &PgPool, run: Uuid, step: i32, name: &str) -> Option<f64> {
    db::metrics::value(pool, run, step, name)
        .await
        .ok()
        .flatten()
}
