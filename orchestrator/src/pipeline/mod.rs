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
pub mod bench;
pub mod dashboard;
pub mod deeprubric;
pub mod evaluate;
pub mod judging;
pub mod reflection;
mod reflection_jobs;
pub mod report;
pub mod rollout;
pub mod run;
pub mod setup;
pub mod sft;
pub mod tracking;
mod trainer_sync;
mod workers;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::domain::config::{PipelineConfig, Recipe};
use crate::domain::judge::Judge;
use crate::infra::db::{self, DbError};
use crate::infra::llm::trainer::{TrainerClient, TrainerError};
use crate::pipeline::judging::{StepError, StepOptions};
use crate::pipeline::rollout::{Admission, RolloutCtx, RolloutTask};
use workers::Prepared;

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
    #[error("{0}")]
    Benchmark(String),
    #[error("a pipeline worker stopped unexpectedly: {0}")]
    Worker(String),
    #[error("rubric bank: {0}")]
    Bank(#[from] crate::domain::bank::BankError),
    #[error(
        "step {step}: {failed} of {calls} scoring calls failed after their retries (more than \
         judge.max_failure_rate = {limit}); the judge at {url} last answered: {last_error}. The \
         step was not trained and the run is paused: `orchestrator run --resume <run id>` \
         continues once the judge answers"
    )]
    JudgeDown {
        step: i32,
        failed: usize,
        calls: usize,
        limit: f64,
        url: String,
        last_error: String,
    },
}

/// The memory half of the meta-policy recipes.
pub struct Memory {
    pub reflector: crate::pipeline::reflection::Reflector,
    /// Curriculum window K.
    pub window: u32,
    /// `reflection.max_item_chars`: the cap on each injected item (0 = whole).
    pub max_item_chars: usize,
    /// `reflection.inject`: which kinds of item the training prompts carry.
    pub inject: crate::domain::schedule::Inject,
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
    /// Off-policy guidance (`credit.guidance_demos`): demonstrations by task id, each replayed
    /// as one more member of its task's group (empty: off).
    pub guidance: Arc<HashMap<Uuid, crate::domain::data::demos::Demo>>,
    /// The question text of each task (bank keys and retrieval queries), same order.
    pub questions: Vec<String>,
    /// Fixed evaluation subsets (never trained on).
    pub evals: Vec<evaluate::Subset>,
    /// Benchmark sets graded by gold judges (the reward-hacking monitor's yardstick).
    pub bench_sets: Vec<bench::periodic::BenchSet>,
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
    /// What cut trajectories put in the loss (`credit.overlong_filter`,
    /// `credit.loop_tokens_only`) and whether their loops carry the unlikelihood term
    /// (`trainer.loop_unlikelihood`).
    pub batch_credit: crate::domain::config::BatchCredit,
    /// The judge's endpoints, for messages (`lexical` for the offline judge).
    pub judge_url: String,
    /// `judge.max_failure_rate`: the circuit breaker of each step's scoring calls.
    pub max_judge_failure_rate: f64,
    pub trainer: TrainerClient,
    /// `lora` or `full`, from the run's trainer settings.
    pub trainer_mode: wire::api::TrainMode,
    /// The run's optimisation settings (`[trainer]`), sent when the trainer is synced.
    pub trainer_settings: wire::TrainSettings,
    /// Their hash, carried by every train step.
    pub settings_hash: String,
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
}
