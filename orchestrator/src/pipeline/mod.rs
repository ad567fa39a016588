//! The experiment loop (`orchestrator run`): rollout, judging and training as three overlapping
//! workers joined by bounded channels, with a staleness bound, exact resume from Postgres and
//! trainer checkpoints, recovery from a trainer restart, per-step metrics and live progress.
//!
//! Step s moves through `rollout` → `judging` (its trajectories committed in one transaction)
//! → `training` (judged; all scores in one transaction) → `completed` (the trainer applied it:
//! policy version s + 1). Policy version v is the number of steps trained, so the trainer's
//! version says exactly which steps it holds; train requests carry `expect_version` and cannot
//! be applied twice. On (re)start the trainer is brought to the last completed step: kept if
//! its session and version already match, otherwise restored from the run's newest checkpoint
//! and the steps after it replayed from their stored batches.
//!
//! Recipes with the meta-policy (method.md A.6-A.8) add: the windowed curriculum (new batches,
//! then their replay), `<reference_examples>` injected from the rubric bank (cross-episode on
//! new steps, within-episode on replays), a background reflection job per judged new step that
//! never blocks rollouts, and the job's candidates trained as Phase A of the next step (the
//! deferred batch; later if the job was late, which the lag metric shows).
//!
//! Evaluation (`[eval]`): the starting policy, every `eval.every` versions and the final one
//! are evaluated on the fixed subsets right after the step that made them, while the trainer
//! holds that version (rollouts of the next steps go on beside it; the next train step waits).
//! An evaluation is stored whole or not at all; one cut off by a crash is redone on resume, and
//! one that overlapped a trainer restart is discarded and redone on the restored policy.

pub mod bank;
pub mod batch;
pub mod evaluate;
pub mod judging;
pub mod reflection;
pub mod report;
pub mod rollout;
pub mod setup;
pub mod sft;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::domain::bank::Reuse;
use crate::domain::config::{PipelineConfig, Recipe};
use crate::domain::judge::Judge;
use crate::infra::db::{self, DbError};
use crate::infra::llm::trainer::{TrainReply, TrainerClient, TrainerError};
use crate::pipeline::judging::{StepError, StepOptions, judge_step};
use crate::pipeline::rollout::{Admission, RolloutCtx, RolloutSlot, RolloutTask};

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("judging step {step} failed: {source}")]
    Judge { step: i32, source: StepError },
    #[error("trainer: {0}")]
    Trainer(#[from] TrainerError),
    #[error(
        "the trainer at {url} did not come back within {waited_secs} s (pipeline.trainer_wait_secs)"
    )]
    TrainerGone { url: String, waited_secs: u64 },
    #[error("setting up the run: {0}")]
    Setup(String),
    #[error("a pipeline worker stopped unexpectedly: {0}")]
    Worker(String),
    #[error("rubric bank: {0}")]
    Bank(#[from] crate::domain::bank::BankError),
}

/// The memory half of the meta-policy recipes.
pub struct Memory {
    pub reflector: crate::pipeline::reflection::Reflector,
    /// Curriculum window K.
    pub window: u32,
    /// How long training of step s waits for the reflection job of step s - 1.
    pub wait: Duration,
}

/// Everything one run of the pipeline needs.
pub struct Pipeline {
    pub pool: PgPool,
    pub run_id: Uuid,
    pub recipe: Recipe,
    pub steps: u32,
    pub cfg: PipelineConfig,
    /// Every task of the task file, in file order (the schedule indexes into it).
    pub tasks: Vec<RolloutTask>,
    /// The question text of each task (bank keys and retrieval queries), same order.
    pub questions: Vec<String>,
    /// Fixed evaluation subsets (never trained on).
    pub evals: Vec<evaluate::Subset>,
    pub eval: crate::domain::config::EvalConfig,
    /// Reflection, bank and curriculum (meta-policy and full recipes).
    pub memory: Option<Memory>,
    pub tasks_per_step: usize,
    pub n: u32,
    pub seed: u64,
    pub rollout: RolloutCtx,
    pub admission: Option<Arc<Admission>>,
    pub judge: Arc<dyn Judge>,
    pub judge_opts: StepOptions,
    pub trainer: TrainerClient,
    /// `lora` or `full`, as the trainer reported it.
    pub trainer_mode: String,
}

/// What a run did this time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// Steps completed in total (including those of earlier attempts).
    pub completed: u32,
    /// Steps completed by this invocation.
    pub completed_now: u32,
    /// Steps replayed into a restored trainer.
    pub replayed: u32,
    pub interrupted: bool,
}

/// Live state shared by the workers and the progress display.
struct Shared {
    /// The model name rollouts ask for (a published version once the trainer publishes).
    model: RwLock<Option<String>>,
    replayed: std::sync::atomic::AtomicU32,
    /// Background reflection jobs by generation step.
    jobs: Mutex<HashMap<i32, tokio::task::JoinHandle<()>>>,
    /// Steps trained so far (the policy version reflection jobs generate with).
    trained: watch::Receiver<i32>,
}

impl Shared {
    /// `base` asking for the currently served (published) model name.
    fn client(&self, base: &crate::infra::llm::LlmClient) -> crate::infra::llm::LlmClient {
        match self.model.read().ok().as_deref().and_then(|m| m.as_deref()) {
            Some(m) => base.with_model(m),
            None => base.clone(),
        }
    }
}

impl Pipeline {
    /// Run (or continue) the run until all steps are trained or `cancel` fires.
    pub async fn run(
        self: Arc<Self>,
        cancel: CancellationToken,
        progress: indicatif::ProgressBar,
    ) -> Result<Outcome, PipelineError> {
        let rows = db::pipeline::steps(&self.pool, self.run_id).await?;
        let completed = rows
            .iter()
            .enumerate()
            .take_while(|(i, r)| r.step == *i as i32 && r.status == "completed")
            .count() as i32;
        let (trained_tx, trained_rx) = watch::channel(completed);
        let shared = Arc::new(Shared {
            model: RwLock::new(None),
            replayed: Default::default(),
            jobs: Mutex::new(HashMap::new()),
            trained: trained_rx.clone(),
        });
        self.sync_trainer(completed, &shared, &cancel).await?;
        // The current policy's evaluation, if due and not stored (the start, or a crash cut it).
        self.evaluate_due(completed, &shared, &cancel).await?;
        self.relaunch_reflections(&rows, &shared).await?;

        // Steps rolled out (and maybe judged) but not trained continue where they stopped.
        let mut pending = Vec::new();
        let mut next_rollout = completed;
        for r in rows.iter().filter(|r| r.step >= completed) {
            if r.step == next_rollout && (r.status == "judging" || r.status == "training") {
                pending.push(r.step);
                next_rollout += 1;
            } else {
                break;
            }
        }
        progress.set_length(u64::from(self.steps));
        progress.set_position(completed as u64);
        if completed as u32 >= self.steps {
            return Ok(Outcome {
                completed: completed as u32,
                ..Default::default()
            });
        }
        let k = self.cfg.max_staleness as i32;
        // Servers that failed (e.g. a restarting trainer) return to rotation once a probe passes.
        let probes = self
            .rollout
            .client
            .spawn_health_probes(Duration::from_secs(2), cancel.child_token());
        let (judge_tx, judge_rx) = mpsc::channel::<i32>(pending.len() + k as usize + 1);
        let (train_tx, train_rx) = mpsc::channel::<Prepared>(1);
        for s in pending {
            let _ = judge_tx.send(s).await;
        }
        let rollouts = tokio::spawn(self.clone().rollout_worker(
            next_rollout,
            trained_rx,
            judge_tx,
            shared.clone(),
            cancel.clone(),
        ));
        let judging = tokio::spawn(
            self.clone()
                .judge_worker(judge_rx, train_tx, shared.clone()),
        );
        let training = tokio::spawn(self.clone().train_worker(
            train_rx,
            trained_tx,
            shared.clone(),
            progress.clone(),
            cancel.clone(),
        ));
        let (r, j, t) = tokio::join!(rollouts, judging, training);
        probes.abort();
        self.finish_reflections(&shared, &cancel).await;
        let flat = |x: Result<Result<(), PipelineError>, tokio::task::JoinError>| match x {
            Ok(r) => r,
            Err(e) => Err(PipelineError::Worker(e.to_string())),
        };
        // Report the first failure in pipeline order.
        let (r, j, t) = (flat(r), flat(j), flat(t));
        r?;
        j?;
        t?;
        let done = db::pipeline::steps(&self.pool, self.run_id)
            .await?
            .iter()
            .filter(|r| r.status == "completed")
            .count() as u32;
        Ok(Outcome {
            completed: done,
            completed_now: done.saturating_sub(completed as u32),
            replayed: shared.replayed.load(std::sync::atomic::Ordering::Relaxed),
            interrupted: done < self.steps,
        })
    }

    fn rollout_ctx(&self, shared: &Shared) -> RolloutCtx {
        let mut ctx = self.rollout.clone();
        ctx.client = shared.client(&ctx.client);
        ctx
    }

    async fn rollout_worker(
        self: Arc<Self>,
        first: i32,
        mut trained: watch::Receiver<i32>,
        judge_tx: mpsc::Sender<i32>,
        shared: Arc<Shared>,
        cancel: CancellationToken,
    ) -> Result<(), PipelineError> {
        let k = self.cfg.max_staleness as i32;
        for s in first..self.steps as i32 {
            // Staleness bound: steps up to s - 1 - k must be trained before s is rolled out.
            let t_wait = Instant::now();
            let ok = tokio::select! {
                _ = cancel.cancelled() => false,
                r = trained.wait_for(|v| *v >= s - k) => r.is_ok(),
            };
            if !ok {
                break;
            }
            let wait_secs = t_wait.elapsed().as_secs_f64();
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
            let t0 = Instant::now();
            let ctx = self.rollout_ctx(&shared);
            let slot = RolloutSlot {
                run_id: self.run_id,
                step: s,
                sample_index: 0,
                policy_version: version,
            };
            let results = crate::pipeline::rollout::rollout_batch_gated(
                &ctx,
                &tasks,
                self.n,
                slot,
                self.cfg.max_inflight as usize,
                &cancel,
                None,
                self.admission.clone(),
            )
            .await;
            if cancel.is_cancelled() {
                db::runs::set_step_status(&self.pool, self.run_id, s, "abandoned").await?;
                tracing::warn!(step = s, "interrupted: rollouts of this step abandoned");
                break;
            }
            let (rollouts, summary) = crate::pipeline::rollout::summarize(results);
            db::pipeline::commit_rollouts(&self.pool, self.run_id, s, &rollouts).await?;
            let secs = t0.elapsed().as_secs_f64();
            let mut m = vec![
                ("time/rollout_s".to_string(), secs),
                ("time/rollout_wait_s".to_string(), wait_secs),
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
                ("rollout/policy_version".to_string(), f64::from(version)),
            ];
            m.extend(memory_metrics);
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
            if judge_tx.send(s).await.is_err() {
                break;
            }
        }
        Ok(())
    }

    async fn judge_worker(
        self: Arc<Self>,
        mut rx: mpsc::Receiver<i32>,
        tx: mpsc::Sender<Prepared>,
        shared: Arc<Shared>,
    ) -> Result<(), PipelineError> {
        while let Some(s) = rx.recv().await {
            let t0 = Instant::now();
            if !db::pipeline::is_judged(&self.pool, self.run_id, s, self.judge.model()).await? {
                judge_step(
                    &self.pool,
                    self.judge.as_ref(),
                    &self.judge_opts,
                    self.run_id,
                    s,
                )
                .await
                .map_err(|source| PipelineError::Judge { step: s, source })?;
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

    async fn train_worker(
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
                ("time/publish_s".to_string(), reply.publish_seconds()),
                (
                    "train/policy_version".to_string(),
                    reply.policy_version as f64,
                ),
            ];
            for (k, v) in &reply.metrics {
                if let Some(x) = v.as_f64().filter(|x| x.is_finite()) {
                    m.push((format!("train/{k}"), x));
                }
            }
            for (k, v) in reply.reflection.iter().flatten() {
                if let Some(x) = v.as_f64().filter(|x| x.is_finite()) {
                    m.push((format!("train/reflection/{k}"), x));
                }
            }
            db::metrics::record(&self.pool, self.run_id, s, &m).await?;
            if let Some(name) = reply.published_name()
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
    fn slot(&self, s: i32) -> Option<crate::domain::schedule::Slot> {
        self.memory
            .as_ref()
            .map(|m| crate::domain::schedule::windowed(s.max(0) as u32, m.window))
    }

    /// The step's tasks, with `<reference_examples>` injected before the question when the
    /// recipe has memory (cross-episode on new steps, within-episode on replays), and metrics.
    async fn with_memory(
        &self,
        picks: &[usize],
        slot: Option<crate::domain::schedule::Slot>,
    ) -> Result<(Vec<RolloutTask>, Vec<(String, f64)>), PipelineError> {
        let mut tasks: Vec<RolloutTask> = picks.iter().map(|&i| self.tasks[i].clone()).collect();
        let (Some(mem), Some(slot)) = (&self.memory, slot) else {
            return Ok((tasks, vec![]));
        };
        let mode = match slot.phase {
            crate::domain::schedule::Phase::New => Reuse::Cross,
            crate::domain::schedule::Phase::Replay => Reuse::Within,
        };
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
            t.user = got.inject(&t.user)?;
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

    /// Start the background reflection job of a judged new-phase step (never awaited here).
    fn launch_reflection(self: &Arc<Self>, s: i32, shared: &Arc<Shared>) {
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
    async fn await_reflection(&self, s: i32, shared: &Shared) -> f64 {
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

    /// A step's train batch: the deferred reflection candidates (Phase A) then its trajectories.
    /// `fresh` (first build) assigns every finished, untrained candidate to this step; a replay
    /// reads the assignment back, so the bytes match the first build.
    async fn build_batch(
        &self,
        s: i32,
        fresh: bool,
    ) -> Result<(wire::Batch, batch::BatchStats, Vec<(String, f64)>), PipelineError> {
        let (mut b, stats) = batch::build(&self.pool, self.run_id, s, self.judge.model()).await?;
        let mut m = Vec::new();
        if self.memory.is_none() {
            return Ok((b, stats, m));
        }
        if fresh {
            db::bank::assign_for_training(&self.pool, self.run_id, s).await?;
        }
        let rows = db::bank::for_training(&self.pool, self.run_id, s).await?;
        let first_group = b.seqs.iter().map(|q| q.group_id + 1).max().unwrap_or(0);
        let refl = crate::pipeline::reflection::sequences(&rows, first_group);
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

    /// On (re)start: rerun the reflection jobs of judged new-phase steps that never finished
    /// (the process died while they ran), so their candidates and bank rows are not lost.
    async fn relaunch_reflections(
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
    async fn finish_reflections(&self, shared: &Shared, cancel: &CancellationToken) {
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

    async fn show(&self, progress: &indicatif::ProgressBar, s: i32) {
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

    /// Evaluate the policy of `version` (which the trainer holds and the servers serve) on every
    /// subset not yet evaluated at that version, if the version is due; the time spent is the
    /// metric `time/eval_s` of the step that made the version. A cancelled evaluation stores
    /// nothing.
    async fn evaluate_due(
        &self,
        version: i32,
        shared: &Shared,
        cancel: &CancellationToken,
    ) -> Result<(), PipelineError> {
        if self.evals.is_empty() || !evaluate::due(version.max(0) as u32, self.steps, &self.eval) {
            return Ok(());
        }
        let t0 = Instant::now();
        let done = self.evaluate_subsets(version, shared, cancel).await?;
        if done && version > 0 {
            let m = [("time/eval_s".to_string(), t0.elapsed().as_secs_f64())];
            db::metrics::record(&self.pool, self.run_id, version - 1, &m).await?;
        }
        Ok(())
    }

    /// [`Self::evaluate_due`]'s work: true when some subset was evaluated now.
    async fn evaluate_subsets(
        &self,
        version: i32,
        shared: &Shared,
        cancel: &CancellationToken,
    ) -> Result<bool, PipelineError> {
        let mut done = false;
        let run = self.run_id.to_string();
        for subset in &self.evals {
            if db::evaluations::exists(&self.pool, self.run_id, version, &subset.name).await? {
                continue;
            }
            tracing::info!(
                version,
                subset = %subset.name,
                tasks = subset.tasks.len(),
                samples = self.eval.n,
                "evaluating"
            );
            loop {
                let mut ctx = self.rollout_ctx(shared);
                if let Some(t) = self.eval.temperature {
                    ctx.cfg.temperature = t;
                }
                let er = evaluate::EvalRun {
                    run_id: self.run_id,
                    version,
                    samples: self.eval.n,
                    max_inflight: self.cfg.max_inflight as usize,
                    ctx: &ctx,
                    judge: self.judge.as_ref(),
                    gate: self.admission.clone(),
                };
                let Some((row, results)) = evaluate::evaluate(&er, subset, cancel).await else {
                    tracing::warn!(version, subset = %subset.name, "evaluation interrupted; it reruns on resume");
                    return Ok(false);
                };
                // A trainer that restarted meanwhile served other weights: redo on the restored
                // policy.
                match self.trainer.state().await {
                    Ok(st)
                        if st.session.as_deref() == Some(run.as_str())
                            && st.policy_version == i64::from(version) =>
                    {
                        db::evaluations::record(&self.pool, &row, &results).await?;
                        done = true;
                        tracing::info!(
                            version,
                            subset = %subset.name,
                            score = ?row.score,
                            exact = ?row.exact,
                            judged = row.judged,
                            failed = row.failed,
                            "evaluated"
                        );
                        break;
                    }
                    other => {
                        tracing::warn!(version, subset = %subset.name, trainer = ?other.map(|s| (s.session, s.policy_version)), "the trainer changed during the evaluation; redoing it");
                        self.wait_for_trainer(cancel).await?;
                        self.sync_trainer(version, shared, cancel).await?;
                        if cancel.is_cancelled() {
                            return Ok(false);
                        }
                    }
                }
            }
        }
        Ok(done)
    }

    async fn checkpoint(&self, s: i32) -> Result<(), PipelineError> {
        let sub = format!("{}/{}", self.cfg.checkpoint_subdir, self.run_id);
        let path = self.trainer.checkpoint(&sub).await?;
        db::pipeline::record_checkpoint(
            &self.pool,
            self.run_id,
            &db::pipeline::CheckpointRow {
                step: s,
                policy_version: s + 1,
                kind: if self.trainer_mode == "lora" {
                    "lora".into()
                } else {
                    "full".into()
                },
                path,
            },
            &serde_json::json!({
                "trainer": self.trainer.url(),
                "schedule": {"seed": self.seed, "tasks_per_step": self.tasks_per_step, "next_step": s + 1},
                "curriculum": self.slot(s + 1).map(|x| serde_json::json!({
                    "window": x.window,
                    "phase": if x.phase == crate::domain::schedule::Phase::New { "new" } else { "replay" },
                    "batch": x.batch,
                    "k": self.memory.as_ref().map(|m| m.window),
                })),
                "bank_items": self.memory.as_ref().map(|m| m.reflector.bank.len()),
            }),
        )
        .await?;
        Ok(())
    }

    async fn train_with_recovery(
        &self,
        s: i32,
        batch: &wire::Batch,
        shared: &Shared,
        cancel: &CancellationToken,
    ) -> Result<TrainReply, PipelineError> {
        loop {
            match self.trainer.train_step(batch, i64::from(s)).await {
                Ok(r) => return Ok(r),
                Err(e) if e.is_transient() => {
                    tracing::warn!(step = s, error = %e, "train step failed; waiting for the trainer");
                    self.wait_for_trainer(cancel).await?;
                    self.sync_trainer(s, shared, cancel).await?;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    async fn wait_for_trainer(&self, cancel: &CancellationToken) -> Result<(), PipelineError> {
        let t0 = Instant::now();
        let limit = Duration::from_secs(self.cfg.trainer_wait_secs);
        while t0.elapsed() < limit {
            if self.trainer.health().await {
                return Ok(());
            }
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
        Err(PipelineError::TrainerGone {
            url: self.trainer.url().to_string(),
            waited_secs: self.cfg.trainer_wait_secs,
        })
    }

    /// Bring the trainer to policy version `target` (= steps 0..target trained) for this run.
    async fn sync_trainer(
        &self,
        target: i32,
        shared: &Shared,
        cancel: &CancellationToken,
    ) -> Result<(), PipelineError> {
        let run = self.run_id.to_string();
        loop {
            let st = match self.trainer.state().await {
                Ok(st) => st,
                Err(e) if e.is_transient() => {
                    self.wait_for_trainer(cancel).await?;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            if st.session.as_deref() == Some(run.as_str()) && st.policy_version == i64::from(target)
            {
                return Ok(());
            }
            let ck = if target > 0 {
                db::pipeline::latest_checkpoint(&self.pool, self.run_id, target - 1).await?
            } else {
                None
            };
            tracing::info!(
                run = %run,
                trainer_session = ?st.session,
                trainer_version = st.policy_version,
                target,
                checkpoint = ?ck.as_ref().map(|c| &c.path),
                "restoring the trainer"
            );
            let restored = match self
                .trainer
                .restore(ck.as_ref().map(|c| c.path.as_str()), &run)
                .await
            {
                Ok(r) => r,
                Err(e) if e.is_transient() => {
                    self.wait_for_trainer(cancel).await?;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            // The name the servers serve the policy under: the restored version's adapter when
            // the trainer publishes LoRA, then each replayed step's; else their plain name.
            let mut served = restored.published_name;
            let mut failed = None;
            for r in restored.policy_version as i32..target {
                let (b, _, _) = self.build_batch(r, false).await?;
                match self.trainer.train_step(&b, i64::from(r)).await {
                    Ok(reply) => {
                        if let Some(name) = reply.published_name() {
                            served = Some(name);
                        }
                        shared
                            .replayed
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(e) if e.is_transient() => {
                        failed = Some(e);
                        break;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            match failed {
                None => {
                    if let Ok(mut g) = shared.model.write() {
                        *g = served;
                    }
                    return Ok(());
                }
                Some(e) => {
                    tracing::warn!(error = %e, "replay interrupted; waiting for the trainer");
                    self.wait_for_trainer(cancel).await?;
                }
            }
        }
    }
}

/// A judged step's batch on its way to the trainer.
struct Prepared {
    step: i32,
    batch: wire::Batch,
}

async fn sqlx_value(pool: &PgPool, run: Uuid, step: i32, name: &str) -> Option<f64> {
    db::metrics::value(pool, run, step, name)
        .await
        .ok()
        .flatten()
}
