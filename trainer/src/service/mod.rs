//! `trainer serve`: the long-lived trainer process. One policy (model + optimizer) behind a
//! read/write lock: train steps take it for writing (one at a time; a concurrent one gets 409),
//! generation reads it between tokens. Routes: `POST /v1/train_step` (the `wire` batch;
//! `?dry_run=true` only decodes and validates it; `?settings_hash=H` refuses a step unless the
//! trainer holds settings with that hash), `POST /v1/settings` and `GET /v1/settings` (the
//! optimisation settings, `wire::TrainSettings`), `POST /v1/checkpoint`, `POST /v1/restore`,
//! `GET /v1/state`, `GET /health`, `GET /version`, `GET /metrics`, and the
//! OpenAI-compatible generation API (`/v1/models`, `/v1/completions`, `/v1/chat/completions`,
//! `/tokenize`, `/detokenize`, `/v1/load_lora_adapter`), and vLLM's disk weight-transfer API
//! (see `weights`), so one `trainer serve` can be the policy server a trainer publishes to.
//! A restore publishes the restored weights, so servers never keep serving the replaced policy.
//! Binds to loopback unless told otherwise; bound elsewhere it needs a bearer token (`auth`).
//! The trainer routes answer with the `wire` crate's typed replies (`wire::api`); every refusal
//! on every route is an `ApiError`.
//!
//! Every route checks a request whole before it touches the policy: lengths against the
//! model's position limit with checked arithmetic, adapters and weights tensor by tensor in a
//! staging copy swapped in only when complete, a train batch (every phase) before any optimizer
//! step, and `?dry_run=true` runs exactly those checks. A step that still fails half-way is
//! undone from a snapshot ([`ROLLBACK_MAX_BYTES`]); one that cannot be undone marks the server
//! unhealthy: `GET /health` answers 503 naming why, and every route that reads or changes the
//! policy refuses with 503 until `POST /v1/restore` rebuilds it or the process restarts.

pub mod auth;
mod error;
pub mod follower;
pub mod generate;
pub mod load;
mod openai;
mod weights;

use std::net::SocketAddr;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use wire::{
    CheckpointReply, CheckpointRequest, DryRunReply, RestoreReply, RestoreRequest, SettingsReply,
    StateReply, TrainMode, TrainReply, TrainSettings,
};

use crate::checkpoint::{self, CheckpointState};
use crate::dist::data_parallel::{self, Control};
use crate::error::{Result, TrainerError, panic_message};
use crate::model::lora::{self, LoraConfig};
use crate::publish::{Published, Publisher};
use crate::train::{SeqLimits, Sequence, StepMetrics, TrainConfig, Trainer};

pub use auth::ApiToken;
pub use error::{ApiError, ApiResult};

/// Trainable parameters of at most this many bytes (every LoRA adapter; full fine-tunes of
/// small models) are copied to the CPU before each train step, so a step that fails half-way is
/// undone; a step over larger parameters that fails marks the server unhealthy instead.
pub const ROLLBACK_MAX_BYTES: usize = 1 << 30;

/// The served policy. Behind a mutex (tch tensors are `Send` but not `Sync`): the generation
/// worker holds it for one token round, a train step for the whole step.
pub struct Policy {
    pub trainer: Trainer,
    /// Incremented by every train step; 0 is the loaded model.
    pub version: i64,
    pub lora: Option<LoraConfig>,
    /// The base model directory (recorded in adapters and checkpoints).
    pub base: String,
    pub seed: i64,
    /// The optimisation settings `trainer` was built with (`wire::TrainSettings::hash` is what
    /// train steps are checked against).
    pub settings: TrainSettings,
    /// Which weights these are: unique per built policy and renewed by every change of its
    /// weights (`weights_changed`), so the generation worker's prefix cache never serves keys
    /// and values computed under other weights.
    pub weights_epoch: u64,
}

/// A fresh value for `Policy::weights_epoch` (process-wide, never repeated).
pub fn next_weights_epoch() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Policy {
    /// Record that the weights changed (or may have): a train step, an adapter load, a weight
    /// update.
    pub fn weights_changed(&mut self) {
        self.weights_epoch = next_weights_epoch();
    }

    /// Refuse `what` (a route that replaces this process's weights in place) on a group of
    /// several ranks: only rank 0 would change, and the ranks would train different models.
    /// Restores and settings reach every rank; these routes do not.
    pub fn single_rank_only(&self, what: &str) -> std::result::Result<(), String> {
        match self.trainer.collective().map(|g| g.world()) {
            Some(n) if n > 1 => Err(format!(
                "{what} would change rank 0 of {n} ranks only; on a data-parallel trainer, \
                 restore a checkpoint (POST /v1/restore), which every rank loads"
            )),
            _ => Ok(()),
        }
    }

    /// Train with `new` from the next step on the live trainer, AdamW moments kept: for settings
    /// that keep the model's structure (`TrainSettings::structural_change` is false). Rank 0's
    /// `POST /v1/settings` and the other ranks' follower loop both apply settings here.
    pub fn apply_live_settings(&mut self, new: &TrainSettings) -> Result<()> {
        let resolved =
            crate::settings::resolve(new).map_err(|e| TrainerError::Config(e.to_string()))?;
        self.trainer.set_config(resolved.train)?;
        self.settings = new.clone();
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub bind: SocketAddr,
    /// The name `/v1/models` serves (requests may use it or the latest versioned name).
    pub served_name: String,
    /// Checkpoints go to `checkpoint_dir/step-N` every `checkpoint_every` steps (0 = only on
    /// request).
    pub checkpoint_dir: Option<PathBuf>,
    pub checkpoint_every: u64,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Tokens of finished sequences' keys and values kept for requests that extend them (the
    /// generation worker's prefix cache; 0 turns it off).
    pub prefix_cache_tokens: usize,
    /// How decode rounds attend (`--decode-attention`).
    pub decode_attention: crate::model::DecodeAttention,
    /// The generation worker's batch-cache dtype (`--kv-cache-dtype`); `None`: the weights'.
    pub kv_cache_kind: Option<tch::Kind>,
    /// Model context length reported to clients (generation is also held to the model's own
    /// position limit).
    pub max_model_len: usize,
    /// Required as `Authorization: Bearer` on every route but `/health` when set (`auth`).
    pub api_token: Option<ApiToken>,
}

pub struct AppState {
    pub policy: Arc<Mutex<Policy>>,
    training: tokio::sync::Mutex<()>,
    publisher: Option<tokio::sync::Mutex<Publisher>>,
    pub tokenizer: Arc<tokenizers::Tokenizer>,
    pub chat_template: Option<String>,
    pub cfg: ServeConfig,
    gen_tx: mpsc::Sender<generate::GenJob>,
    pub stats: Arc<generate::GenStats>,
    /// Names under which the current policy is also served (published versions, loaded adapters).
    aliases: std::sync::Mutex<Vec<String>>,
    /// How the policy is built, so `POST /v1/restore` can rebuild it (set by the binary; its
    /// settings follow `POST /v1/settings`).
    load_opts: std::sync::Mutex<Option<load::LoadOptions>>,
    /// The client session (the orchestrator's run id) the current weights belong to; `None`
    /// after start, so a client can tell a restarted trainer from its own.
    session: std::sync::Mutex<Option<String>>,
    /// Between `/start_weight_update` and `/finish_weight_update`.
    updating: AtomicBool,
    /// Why the policy's state is unknown (a train step failed and could not be undone); `None`
    /// while healthy. Cleared by a restore, which rebuilds the policy.
    broken: std::sync::Mutex<Option<String>>,
    /// False once the generation worker has stopped (or could not start).
    worker_alive: Arc<AtomicBool>,
    /// Rings when the data-parallel group broke: the server stops and the process fails, so
    /// the launcher stops every rank and a supervisor restarts the group whole.
    group_failed: tokio::sync::Notify,
    group_broken: AtomicBool,
    /// The policy version `/metrics` last read (reported while the policy is busy).
    metrics_version: AtomicI64,
}

/// A JSON request body that may be empty (then the default).
fn optional_json<T: DeserializeOwned + Default>(body: &[u8]) -> ApiResult<T> {
    if body.is_empty() {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("bad request body: {e}")))
}

/// Write the policy where the publisher's servers read it: its adapter, or its full weights.
fn write_version_dir(p: &Policy, dir: &std::path::Path) -> Result<()> {
    checkpoint::write_dir_atomically(dir, |tmp| match &p.lora {
        Some(l) => lora::save_adapter(&p.trainer.model, l, &p.base, tmp),
        None => p.trainer.model.save(tmp),
    })
}

/// A train batch checked whole, split by phase: (reflection = Phase A, task = Phase B).
#[derive(Debug)]
struct CheckedBatch {
    rl: bool,
    reflection: Vec<Sequence>,
    task: Vec<Sequence>,
}

/// Check every sequence of the batch, both phases, against the model's limits (numbered as in
/// the batch) before anything trains, so a refused batch changes nothing and a dry run refuses
/// exactly what a step would: reflection sequences only in an RL batch, an SFT batch not empty,
/// and each sequence as [`Sequence::validate`] (length against the position limit, ids, stages
/// and advantages).
fn check_batch(batch: wire::Batch, limits: SeqLimits) -> Result<CheckedBatch> {
    let rl = batch.rl;
    let mut reflection = Vec::new();
    let mut task = Vec::new();
    for (i, s) in batch.seqs.into_iter().enumerate() {
        if !rl && s.phase == wire::Phase::Reflection {
            return Err(TrainerError::Batch(format!(
                "sequence {i}: reflection (phase 1) sequences need an RL batch (flags bit 0)"
            )));
        }
        if s.off_policy && !(rl && s.phase == wire::Phase::Task) {
            return Err(TrainerError::Batch(format!(
                "sequence {i}: an off-policy sequence (phase word bit 8) must be a task (phase 0) \
                 sequence of an RL batch (flags bit 0)"
            )));
        }
        let phase = s.phase;
        let seq = Sequence {
            tokens: s.tokens.into_iter().map(i64::from).collect(),
            loss_mask: s.loss_mask,
            unlikelihood: s.unlikelihood,
            stages: s.stages,
            behaviour_logprobs: s.behaviour_logprobs,
            advantages: s.advantages,
            off_policy: s.off_policy,
        };
        seq.validate(i, limits, rl)?;
        match phase {
            wire::Phase::Reflection => reflection.push(seq),
            wire::Phase::Task => task.push(seq),
        }
    }
    if !rl && task.is_empty() {
        return Err(TrainerError::Batch(
            "an SFT batch needs at least one sequence".into(),
        ));
    }
    Ok(CheckedBatch {
        rl,
        reflection,
        task,
    })
}

/// How a train step failed.
#[derive(Debug)]
pub(crate) enum StepFailure {
    /// Everything the step changed was undone: the policy is as it was before.
    RolledBack(TrainerError),
    /// The step could not be undone: what the policy holds is unknown.
    Unrecoverable(String),
}

/// Run `step` on the policy so that it either completes or leaves the policy as it was: the
/// trainable parameters (up to `max_bytes`) and the optimizer state are kept before it, and an
/// error or a panic (libtorch: out of memory, a kernel failure) puts them and the version back.
/// Without a snapshot (larger parameters) or when undoing fails, the failure is
/// `Unrecoverable`. Panics are caught here, with the policy lock held by the caller, so the lock
/// is never poisoned.
pub(crate) fn guarded_step<T>(
    p: &mut Policy,
    max_bytes: usize,
    step: impl FnOnce(&mut Policy) -> Result<T>,
) -> std::result::Result<T, StepFailure> {
    let snapshot = catch_unwind(AssertUnwindSafe(|| p.trainer.snapshot(max_bytes)))
        .ok()
        .flatten();
    let version = p.version;
    let err = match catch_unwind(AssertUnwindSafe(|| step(p))) {
        Ok(Ok(v)) => return Ok(v),
        Ok(Err(e)) => e,
        Err(panic) => TrainerError::Panicked(panic_message(&*panic)),
    };
    let Some(snapshot) = snapshot else {
        return Err(StepFailure::Unrecoverable(format!(
            "{err}; the step could not be undone: its trainable parameters ({} bytes) exceed the rollback budget of {max_bytes} bytes",
            p.trainer.trainable_bytes()
        )));
    };
    match catch_unwind(AssertUnwindSafe(|| p.trainer.rollback(snapshot))) {
        Ok(Ok(())) => {
            p.version = version;
            Err(StepFailure::RolledBack(err))
        }
        Ok(Err(e)) => Err(StepFailure::Unrecoverable(format!(
            "{err}; undoing the step failed too: {e}"
        ))),
        Err(panic) => Err(StepFailure::Unrecoverable(format!(
            "{err}; undoing the step panicked: {}",
            panic_message(&*panic)
        ))),
    }
}

impl AppState {
    pub fn new(
        policy: Policy,
        tokenizer: tokenizers::Tokenizer,
        chat_template: Option<String>,
        eos: Vec<u32>,
        cfg: ServeConfig,
        publisher: Option<Publisher>,
    ) -> Arc<Self> {
        let metrics_version = AtomicI64::new(policy.version);
        let policy = Arc::new(Mutex::new(policy));
        let tokenizer = Arc::new(tokenizer);
        let stats = Arc::new(generate::GenStats::default());
        let (tx, rx) = mpsc::channel(4096);
        let worker_alive = Arc::new(AtomicBool::new(true));
        {
            let (p, t, s) = (policy.clone(), tokenizer.clone(), stats.clone());
            let prefix_tokens = cfg.prefix_cache_tokens;
            let decode = crate::model::DecodeOptions {
                attention: cfg.decode_attention,
                kv_cache: cfg.kv_cache_kind,
            };
            let alive = worker_alive.clone();
            let started = std::thread::Builder::new()
                .name("generate".into())
                .spawn(move || {
                    generate::run_worker(p, t, eos, s, rx, prefix_tokens, decode);
                    alive.store(false, Ordering::SeqCst);
                });
            if let Err(e) = started {
                tracing::error!(error = %e, "the generation worker could not start");
                worker_alive.store(false, Ordering::SeqCst);
            }
        }
        Arc::new(Self {
            policy,
            training: tokio::sync::Mutex::new(()),
            publisher: publisher.map(tokio::sync::Mutex::new),
            tokenizer,
            chat_template,
            cfg,
            gen_tx: tx,
            stats,
            aliases: std::sync::Mutex::new(Vec::new()),
            load_opts: std::sync::Mutex::new(None),
            session: std::sync::Mutex::new(None),
            updating: AtomicBool::new(false),
            broken: std::sync::Mutex::new(None),
            worker_alive,
            group_failed: tokio::sync::Notify::new(),
            group_broken: AtomicBool::new(false),
            metrics_version,
        })
    }

    /// Why the server cannot be trusted now, or `None` when it is healthy: the generation
    /// worker stopped, the policy lock is poisoned, or a step could not be undone.
    pub fn unhealthy(&self) -> Option<String> {
        if !self.worker_alive.load(Ordering::SeqCst) {
            return Some("the generation worker stopped; restart the trainer".into());
        }
        if self.policy.is_poisoned() {
            return Some(
                "the policy lock was poisoned by a panic; POST /v1/restore or restart".into(),
            );
        }
        self.broken
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Record that the policy's state is unknown: `/health` answers 503 with `reason`, and the
    /// routes that read or change the policy refuse until a restore rebuilds it.
    pub fn mark_unhealthy(&self, reason: impl Into<String>) {
        let reason = reason.into();
        tracing::error!(%reason, "trainer serve is unhealthy");
        *self.broken.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason);
    }

    /// The data-parallel group can no longer be trusted (a grouped step or control message
    /// failed, so the ranks may differ): unhealthy now, and the server shuts down so the
    /// process exits with the reason.
    pub fn fail_group(&self, reason: impl Into<String>) {
        self.mark_unhealthy(reason);
        self.group_broken.store(true, Ordering::SeqCst);
        self.group_failed.notify_one();
    }

    /// 503 naming why, while unhealthy.
    fn ensure_healthy(&self) -> ApiResult<()> {
        match self.unhealthy() {
            None => Ok(()),
            Some(why) => Err(ApiError::Unavailable(format!(
                "trainer unhealthy: {why} (GET /health)"
            ))),
        }
    }

    /// The limits the policy's model puts on sequences (vocabulary, positions).
    fn limits(&self) -> ApiResult<SeqLimits> {
        let p = self.policy.lock().map_err(|_| ApiError::poisoned())?;
        Ok(SeqLimits::of(&p.trainer.model))
    }

    /// Enable `POST /v1/restore` (and structural `POST /v1/settings` changes) by recording how
    /// the policy is built.
    pub fn set_load_options(&self, opts: load::LoadOptions) {
        if let Ok(mut o) = self.load_opts.lock() {
            *o = Some(opts);
        }
    }

    fn load_options(&self) -> Option<load::LoadOptions> {
        self.load_opts.lock().ok().and_then(|o| o.clone())
    }

    fn session(&self) -> Option<String> {
        self.session.lock().ok().and_then(|s| s.clone())
    }

    pub fn served_names(&self) -> Vec<String> {
        let mut v = vec![self.cfg.served_name.clone()];
        if let Ok(a) = self.aliases.lock() {
            v.extend(a.iter().cloned());
        }
        v
    }

    fn add_alias(&self, name: String, keep: usize) {
        if let Ok(mut a) = self.aliases.lock() {
            if !a.contains(&name) {
                a.push(name);
            }
            let extra = a.len().saturating_sub(keep.max(1));
            a.drain(..extra);
        }
    }

    /// Stop serving under `name`; false when it was not served.
    fn remove_alias(&self, name: &str) -> bool {
        let Ok(mut a) = self.aliases.lock() else {
            return false;
        };
        let before = a.len();
        a.retain(|x| x != name);
        a.len() != before
    }

    /// Save a checkpoint of the current policy (blocking; call off the async workers), under
    /// `checkpoint_dir/sub` when a sub-directory is given.
    pub fn checkpoint_blocking(&self, sub: Option<&str>) -> Result<Option<PathBuf>> {
        let Some(root) = &self.cfg.checkpoint_dir else {
            return Ok(None);
        };
        let root = match sub {
            Some(s) => root.join(s),
            None => root.clone(),
        };
        let root = &root;
        let p = self
            .policy
            .lock()
            .map_err(|_| TrainerError::Config("policy lock poisoned".into()))?;
        let state = CheckpointState {
            step: p.trainer.opt.step,
            policy_version: p.version,
            seed: p.seed,
            mode: if p.lora.is_some() { "lora" } else { "full" }.into(),
            base: p.base.clone(),
            dtype: crate::dtype_name(p.trainer.model.kind).into(),
        };
        if p.trainer.zero_shard().is_none() {
            return checkpoint::save(root, &p.trainer, p.lora.as_ref(), &state).map(Some);
        }
        // ZeRO: every rank writes its optimizer shard into the directory being built, before
        // rank 0 renames it into place; rank 0 waits for each rank's report.
        let trainer = &p.trainer;
        checkpoint::save_with(root, trainer, p.lora.as_ref(), &state, |tmp| {
            let g = trainer
                .collective()
                .ok_or_else(|| TrainerError::Config("a ZeRO shard without its group".into()))?;
            let key = format!("ckpt/{}/{}", state.policy_version, state.step);
            let control = Control::SaveShard {
                dir: tmp.to_path_buf(),
                key: key.clone(),
            };
            let sent = data_parallel::publish_control(g, control);
            if let Err(e) = sent {
                self.fail_group(format!(
                    "checkpoint: the other ranks could not be told: {e}"
                ));
                return Err(e.into());
            }
            trainer.save_zero(tmp)?;
            for r in 1..g.world() {
                let done = format!("{key}/done/{r}");
                let reply = g.get(&done, g.timeout());
                let _ = g.delete(&done);
                match reply {
                    Ok(v) if v == b"ok" => {}
                    Ok(v) => {
                        return Err(TrainerError::Config(format!(
                            "checkpoint: rank {r} could not write its optimizer shard: {}",
                            String::from_utf8_lossy(&v)
                        )));
                    }
                    Err(e) => {
                        self.fail_group(format!("checkpoint: rank {r} did not answer: {e}"));
                        return Err(e.into());
                    }
                }
            }
            Ok(())
        })
        .map(Some)
    }
}

#[derive(Debug, Default, Deserialize)]
struct TrainQuery {
    /// Decode and validate the batch, but do not train (clients check batches; benchmarks time
    /// the handoff).
    #[serde(default)]
    dry_run: bool,
    /// Refuse (409) unless the policy is at this version: a client that lost track (it crashed,
    /// or the trainer restarted) cannot apply a batch twice or to the wrong weights.
    #[serde(default)]
    expect_version: Option<i64>,
    /// Refuse (409) unless the trainer holds settings with this `wire::TrainSettings::hash`:
    /// a step never trains with an optimiser other than the client's run states.
    #[serde(default)]
    settings_hash: Option<String>,
}

/// A new version on its way to the inference servers: a written directory (disk route, LoRA
/// adapters) or the weights themselves (vLLM's NCCL route).
enum Outgoing {
    /// Written at the publisher's `dir_of(version)`.
    Written,
    Tensors(Vec<(String, tch::Tensor)>),
}

/// What a train step's blocking part returns: Phase B and Phase A metrics, the new version,
/// the checkpoint written (if due), the published directory (if publishing) and the hash of
/// the settings it trained with.
type StepOutcome = (
    StepMetrics,
    Option<StepMetrics>,
    i64,
    Option<PathBuf>,
    Option<Outgoing>,
    String,
);

async fn train_step(
    State(s): State<Arc<AppState>>,
    Query(q): Query<TrainQuery>,
    body: Bytes,
) -> ApiResult<Response> {
    s.ensure_healthy()?;
    // A real step holds the training lock from here on; a dry run never takes it.
    let _guard = if q.dry_run {
        None
    } else {
        Some(s.training.try_lock().map_err(|_| {
            ApiError::conflict(
                "a train step is already running; send the next batch when it returns",
            )
        })?)
    };
    if let Some(want) = &q.settings_hash {
        let have = s
            .policy
            .lock()
            .map_err(|_| ApiError::poisoned())?
            .settings
            .hash();
        if *want != have {
            return Err(ApiError::conflict(format!(
                "settings_hash = {want}, but the trainer holds settings with hash {have}: \
                 POST /v1/settings with the run's settings first"
            )));
        }
    }
    let t0 = std::time::Instant::now();
    let batch = wire::Batch::decode(&body)
        .map_err(|e| ApiError::bad_request(format!("train batch rejected: {e}")))?;
    // The whole batch, both phases, is checked before anything trains; a dry run stops here.
    let CheckedBatch {
        rl,
        reflection,
        task: seqs,
    } = check_batch(batch, s.limits()?)?;
    if q.dry_run {
        return Ok(Json(DryRunReply {
            sequences: seqs.len() + reflection.len(),
            reflection_sequences: reflection.len(),
            tokens: seqs.iter().chain(&reflection).map(|x| x.tokens.len()).sum(),
            decode_seconds: t0.elapsed().as_secs_f64(),
        })
        .into_response());
    }
    let decode_seconds = t0.elapsed().as_secs_f64();
    if let Some(want) = q.expect_version {
        let have = s.policy.lock().map(|p| p.version).unwrap_or(-1);
        if have != want {
            return Err(ApiError::conflict(format!(
                "expect_version = {want}, but the policy is at version {have}"
            )));
        }
    }
    let state = s.clone();
    let (metrics, reflection, version, checkpoint, publish_dir, settings_hash) =
        tokio::task::spawn_blocking(move || -> ApiResult<StepOutcome> {
            let (metrics, refl_metrics, version, publish_dir, hash) = {
                let mut p = state.policy.lock().map_err(|_| ApiError::poisoned())?;
                // Whatever the step does (a failed one is undone), cached keys and values of
                // the weights before it are not reused after it.
                p.weights_changed();
                let before = p.version;
                let grouped = p.trainer.collective().is_some_and(|g| g.world() > 1);
                let done = guarded_step(&mut p, ROLLBACK_MAX_BYTES, |p| {
                    // Phase A (the meta-policy's deferred batch) is its own optimizer step,
                    // before Phase B, with its ratio against the candidates' generation-time
                    // log-probs; together they are one policy version.
                    let ma = if reflection.is_empty() {
                        None
                    } else {
                        Some(p.trainer.reflection_step(&reflection)?)
                    };
                    // An RL batch without task sequences (only reflections, or nothing the
                    // client could learn from) takes no Phase B update; the version still
                    // advances, so the client's steps and versions stay aligned.
                    let m = match (rl, seqs.is_empty()) {
                        (true, true) => StepMetrics::default(),
                        (true, false) => p.trainer.rl_step(&seqs)?,
                        (false, _) => p.trainer.sft_step(&seqs)?,
                    };
                    p.version += 1;
                    let version = p.version;
                    // Write the new version for the servers while holding the lock (weights
                    // are stable); a failed write undoes the step with the rest.
                    let dir = match &state.publisher {
                        Some(publ) => {
                            let publ = publ.blocking_lock();
                            if publ.uses_nccl() {
                                // Pushed as tensors after the step (the training lock keeps
                                // them unchanged until then).
                                Some(Outgoing::Tensors(p.trainer.model.base_tensors()))
                            } else {
                                let dir = publ.dir_of(version);
                                write_version_dir(p, &dir)?;
                                Some(Outgoing::Written)
                            }
                        }
                        None => None,
                    };
                    Ok((m, ma, version, dir, p.settings.hash()))
                });
                match done {
                    Ok(v) => v,
                    Err(StepFailure::RolledBack(e)) if grouped => {
                        // The other ranks may have taken the update or not: the group is
                        // inconsistent, so it stops whole (the launcher restarts nothing by
                        // itself; the orchestrator waits for and re-synchronises the trainer).
                        let why =
                            format!("data-parallel train step at version {before} failed: {e}");
                        state.fail_group(why.clone());
                        return Err(ApiError::internal(format!("{why}; the group is stopping")));
                    }
                    Err(StepFailure::RolledBack(e)) => {
                        tracing::warn!(error = %e, "train step failed and was undone");
                        return Err(match e {
                            TrainerError::Batch(_) => ApiError::from(e),
                            e => ApiError::internal(format!(
                                "train step failed and was undone (the policy is still at \
                                 version {before}): {e}"
                            )),
                        });
                    }
                    Err(StepFailure::Unrecoverable(why)) => {
                        let why = format!("train step at version {before} failed: {why}");
                        if grouped {
                            state.fail_group(why.clone());
                        } else {
                            state.mark_unhealthy(why.clone());
                        }
                        return Err(ApiError::internal(format!(
                            "{why}; the trainer is now unhealthy: POST /v1/restore or restart it"
                        )));
                    }
                }
            };
            let ckpt = if state.cfg.checkpoint_every > 0
                && (version as u64).is_multiple_of(state.cfg.checkpoint_every)
            {
                state.checkpoint_blocking(None)?
            } else {
                None
            };
            Ok((metrics, refl_metrics, version, ckpt, publish_dir, hash))
        })
        .await
        .map_err(|e| ApiError::internal(format!("train step panicked: {e}")))??;
    let published = match (&s.publisher, publish_dir) {
        (Some(p), Some(out)) => {
            let mut p = p.lock().await;
            let r = match out {
                Outgoing::Written => p.publish(version).await,
                Outgoing::Tensors(t) => p.publish_tensors(version, t).await,
            };
            s.add_alias(r.name.clone(), p.config().window);
            Some(r)
        }
        _ => None,
    };
    tracing::info!(
        version,
        loss = metrics.loss,
        seconds = metrics.seconds,
        "train step"
    );
    Ok(Json(TrainReply {
        policy_version: version.into(),
        metrics,
        reflection,
        checkpoint,
        published,
        decode_seconds,
        settings_hash: Some(settings_hash),
    })
    .into_response())
}

/// A path under the checkpoint root given by a client: relative, made of plain names only.
fn relative_path(raw: &str, what: &str) -> ApiResult<PathBuf> {
    use std::path::Component;
    let p = PathBuf::from(raw);
    if raw.is_empty()
        || raw.len() > 512
        || !p.components().all(|c| matches!(c, Component::Normal(_)))
    {
        return Err(ApiError::bad_request(format!(
            "{what} = {raw:?}; allowed: a relative path of plain names under --checkpoint-dir (no '..', no leading '/', at most 512 bytes)"
        )));
    }
    Ok(p)
}

const NO_CHECKPOINT_DIR: &str = "no checkpoint directory configured (start with --checkpoint-dir)";

async fn save_checkpoint(
    State(s): State<Arc<AppState>>,
    body: Bytes,
) -> ApiResult<Json<CheckpointReply>> {
    let req: CheckpointRequest = optional_json(&body)?;
    // Weights whose state is unknown are never saved as a checkpoint.
    s.ensure_healthy()?;
    let sub = match req.subdir.as_deref() {
        Some(d) => Some(relative_path(d, "subdir")?.display().to_string()),
        None => None,
    };
    let Ok(_guard) = s.training.try_lock() else {
        return Err(ApiError::conflict("a train step is running"));
    };
    let st = s.clone();
    let version = s.policy.lock().map(|p| p.version).unwrap_or(-1);
    let dir = tokio::task::spawn_blocking(move || st.checkpoint_blocking(sub.as_deref()))
        .await??
        .ok_or_else(|| ApiError::bad_request(NO_CHECKPOINT_DIR))?;
    let relative = s
        .cfg
        .checkpoint_dir
        .as_ref()
        .and_then(|root| dir.strip_prefix(root).ok())
        .map(|p| p.display().to_string());
    Ok(Json(CheckpointReply {
        checkpoint: dir,
        relative,
        policy_version: version.into(),
    }))
}

/// Replace the policy by a checkpoint (or by the model as loaded at start) and set the session.
/// The policy is built whole first and swapped in only when complete; a restore also repairs a
/// server marked unhealthy by a step that could not be undone (the policy is rebuilt).
async fn restore(State(s): State<Arc<AppState>>, body: Bytes) -> ApiResult<Json<RestoreReply>> {
    let req: RestoreRequest = optional_json(&body)?;
    let Some(opts) = s.load_options() else {
        return Err(ApiError::NotImplemented(
            "this trainer was started without restore support".into(),
        ));
    };
    let ck = match req.checkpoint.as_deref() {
        None => None,
        Some(raw) => {
            let Some(root) = &s.cfg.checkpoint_dir else {
                return Err(ApiError::bad_request(NO_CHECKPOINT_DIR));
            };
            let dir = root.join(relative_path(raw, "checkpoint")?);
            if !dir.join("state.json").exists() {
                return Err(ApiError::not_found(format!(
                    "checkpoint {} holds no state.json",
                    dir.display()
                )));
            }
            Some(dir)
        }
    };
    let Ok(_guard) = s.training.try_lock() else {
        return Err(ApiError::conflict("a train step is running"));
    };
    let st = s.clone();
    let version = tokio::task::spawn_blocking(move || -> Result<i64> {
        let mut fresh = load::build_policy(&opts, ck.as_deref())?;
        let version = fresh.version;
        // The whole policy is replaced, so a lock poisoned by an earlier panic is sound again.
        let mut p = st.policy.lock().unwrap_or_else(PoisonError::into_inner);
        // The other ranks rebuild the same policy; the group moves to the new trainer.
        let sharded = ck.clone();
        adopt_group(&st, &mut p, &mut fresh, || Control::Restore {
            checkpoint: ck,
        })?;
        if let Some(ck) = &sharded {
            load::restore_sharded_optimizer(&mut fresh, ck)?;
        }
        *p = fresh;
        drop(p);
        st.policy.clear_poison();
        *st.broken.lock().unwrap_or_else(PoisonError::into_inner) = None;
        Ok(version)
    })
    .await??;
    if let Ok(mut sess) = s.session.lock() {
        sess.clone_from(&req.session);
    }
    // The names of the replaced policy's versions no longer name these weights.
    if let Ok(mut a) = s.aliases.lock() {
        a.clear();
    }
    let published = match &s.publisher {
        Some(publ) => Some(publish_restored(&s, publ, version).await?),
        None => None,
    };
    tracing::info!(version, session = ?req.session, checkpoint = ?req.checkpoint, "policy restored");
    Ok(Json(RestoreReply {
        policy_version: version.into(),
        session: req.session,
        published,
    }))
}

/// Move the data-parallel group (if any) from the policy being replaced, `old`, to `fresh`,
/// after telling the other ranks to make the same replacement (`control`). A group that cannot
/// be told is broken: the server stops.
fn adopt_group(
    st: &AppState,
    old: &mut Policy,
    fresh: &mut Policy,
    control: impl FnOnce() -> Control,
) -> Result<()> {
    let zero = old.trainer.zero_stage();
    let Some(g) = old.trainer.take_collective() else {
        return Ok(());
    };
    if g.world() > 1
        && let Err(e) = data_parallel::publish_control(&*g, control())
    {
        old.trainer.set_collective(g);
        let why = format!("the other ranks could not be told to rebuild the policy: {e}");
        st.fail_group(why.clone());
        return Err(TrainerError::Config(why));
    }
    fresh.trainer.set_collective(g);
    fresh.trainer.set_zero(zero)
}

/// Put a restored policy on the inference servers: retire every version the old policy had
/// published (its numbers start again), write the restored one and load it.
async fn publish_restored(
    s: &Arc<AppState>,
    publ: &tokio::sync::Mutex<Publisher>,
    version: i64,
) -> Result<Published> {
    let mut publ = publ.lock().await;
    publ.retire_all().await;
    if publ.uses_nccl() {
        let st = s.clone();
        let tensors = tokio::task::spawn_blocking(move || -> Result<Vec<(String, tch::Tensor)>> {
            let p = st
                .policy
                .lock()
                .map_err(|_| TrainerError::Config("policy lock poisoned".into()))?;
            Ok(p.trainer.model.base_tensors())
        })
        .await
        .map_err(|e| {
            TrainerError::Config(format!("reading the restored policy panicked: {e}"))
        })??;
        let r = publ.publish_tensors(version, tensors).await;
        s.add_alias(r.name.clone(), publ.config().window);
        return Ok(r);
    }
    let dir = publ.dir_of(version);
    let st = s.clone();
    tokio::task::spawn_blocking(move || -> Result<()> {
        let p = st
            .policy
            .lock()
            .map_err(|_| TrainerError::Config("policy lock poisoned".into()))?;
        write_version_dir(&p, &dir)
    })
    .await
    .map_err(|e| TrainerError::Config(format!("writing the restored policy panicked: {e}")))??;
    let r = publ.publish(version).await;
    s.add_alias(r.name.clone(), publ.config().window);
    Ok(r)
}

/// `GET /v1/settings`: the settings the trainer trains with.
async fn get_settings(State(s): State<Arc<AppState>>) -> ApiResult<Json<SettingsReply>> {
    let p = s.policy.lock().map_err(|_| ApiError::poisoned())?;
    Ok(Json(SettingsReply {
        hash: p.settings.hash(),
        settings: p.settings.clone(),
        rebuilt: false,
        policy_version: p.version.into(),
    }))
}

/// `POST /v1/settings`: train with these settings from the next step. Checked completely first
/// (400 naming the field). A change of the model's structure (`TrainSettings::structural_change`:
/// fine-tune mode, LoRA shape, reference, KL on or off; or `param_dtype` resolving to another
/// dtype than the policy's) rebuilds the policy from its model
/// directory, only at policy version 0 (else 409: restore without a checkpoint, or restart,
/// first); any other change applies to the live trainer, AdamW moments kept. Either way a later
/// `POST /v1/restore` rebuilds with these settings. A refused request changes nothing.
async fn post_settings(
    State(s): State<Arc<AppState>>,
    body: Bytes,
) -> ApiResult<Json<SettingsReply>> {
    let new: TrainSettings = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("settings rejected: {e}")))?;
    let resolved = crate::settings::resolve(&new)
        .map_err(|e| ApiError::bad_request(format!("settings rejected: {e}")))?;
    if let Some(publ) = &s.publisher {
        let adapters = publ.lock().await.config().lora;
        if adapters != resolved.lora.is_some() {
            let (value, allowed) = if adapters {
                (
                    "full",
                    "lora: this trainer publishes LoRA adapters (started with --lora-r)",
                )
            } else {
                (
                    "lora",
                    "full: this trainer publishes full weights (started without --lora-r)",
                )
            };
            return Err(ApiError::bad_request(format!(
                "settings rejected: trainer.finetune = {value}; allowed: {allowed}"
            )));
        }
    }
    let Ok(_guard) = s.training.try_lock() else {
        return Err(ApiError::conflict("a train step is running"));
    };
    let (current, version, held_kind, device) = {
        let p = s.policy.lock().map_err(|_| ApiError::poisoned())?;
        (
            p.settings.clone(),
            p.version,
            p.trainer.model.kind,
            p.trainer.model.device,
        )
    };
    let hash = new.hash();
    // The dtype counts by what it resolves to here (`auto`: bf16 on CUDA, f32 on a CPU).
    let new_kind = resolved.kind.unwrap_or_else(|| crate::default_kind(device));
    let structural = current.structural_change(&new) || new_kind != held_kind;
    if structural {
        if version != 0 {
            return Err(ApiError::conflict(format!(
                "settings {hash} change the model's structure (fine-tune mode, LoRA shape, \
                 reference, KL on/off or parameter dtype) from the held settings {}, which \
                 needs policy version 0; the policy is at version {version}: POST /v1/restore \
                 without a checkpoint (or restart the trainer) first",
                current.hash()
            )));
        }
        let Some(mut opts) = s.load_options() else {
            return Err(ApiError::NotImplemented(
                "this trainer was started without restore support, so it cannot rebuild the \
                 policy for a structural settings change"
                    .into(),
            ));
        };
        opts.settings = new.clone();
        // Version 0 is the model directory's function whatever the structure (fresh adapters
        // start as no-ops), so what the servers serve stays right: nothing is republished.
        let st = s.clone();
        let o = opts.clone();
        let json = serde_json::to_value(&new).unwrap_or_default();
        tokio::task::spawn_blocking(move || -> Result<()> {
            let mut fresh = load::build_policy(&o, None)?;
            let mut p = st
                .policy
                .lock()
                .map_err(|_| TrainerError::Config("policy lock poisoned".into()))?;
            adopt_group(&st, &mut p, &mut fresh, || Control::Settings {
                settings: json,
            })?;
            *p = fresh;
            Ok(())
        })
        .await??;
        s.set_load_options(opts);
    } else {
        {
            let mut p = s.policy.lock().map_err(|_| ApiError::poisoned())?;
            p.apply_live_settings(&new)
                .map_err(|e| ApiError::bad_request(format!("settings rejected: {e}")))?;
            if let Some(g) = p.trainer.collective().filter(|g| g.world() > 1) {
                let control = Control::Settings {
                    settings: serde_json::to_value(&new).unwrap_or_default(),
                };
                if let Err(e) = data_parallel::publish_control(g, control) {
                    let why = format!("settings could not reach the other ranks: {e}");
                    s.fail_group(why.clone());
                    return Err(ApiError::internal(why));
                }
            }
        }
        if let Some(mut opts) = s.load_options() {
            opts.settings = new.clone();
            s.set_load_options(opts);
        }
    }
    tracing::info!(%hash, rebuilt = structural, version, "trainer settings applied");
    Ok(Json(SettingsReply {
        settings: new,
        hash,
        rebuilt: structural,
        policy_version: version.into(),
    }))
}

async fn get_state(
    State(s): State<Arc<AppState>>,
) -> ApiResult<Json<StateReply<LoraConfig, TrainConfig>>> {
    // Read-only, so it answers even through a poisoned lock (`/health` tells that apart).
    let p = s.policy.lock().unwrap_or_else(PoisonError::into_inner);
    Ok(Json(StateReply {
        policy_version: p.version.into(),
        optimizer_step: p.trainer.opt.step,
        mode: if p.lora.is_some() {
            TrainMode::Lora
        } else {
            TrainMode::Full
        },
        lora: p.lora.clone(),
        base: p.base.clone(),
        training: s.training.try_lock().is_err(),
        served_names: s.served_names(),
        session: s.session(),
        device: format!("{:?}", p.trainer.model.device),
        dtype: crate::dtype_name(p.trainer.model.kind).into(),
        train_config: p.trainer.cfg.clone(),
    }))
}

async fn metrics(State(s): State<Arc<AppState>>) -> String {
    let st = &s.stats;
    // Never wait on the policy: the generation worker holds it through a wave of prefills,
    // and admission control polls this route; a busy policy reports the version last read.
    let version = match s.policy.try_lock() {
        Ok(p) => {
            s.metrics_version.store(p.version, Ordering::Relaxed);
            p.version
        }
        Err(std::sync::TryLockError::WouldBlock) => s.metrics_version.load(Ordering::Relaxed),
        Err(std::sync::TryLockError::Poisoned(_)) => -1,
    };
    format!(
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running {}\n\
         # TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting {}\n\
         # TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total {}\n\
         # TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total {}\n\
         # TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total {}\n\
         # TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total {}\n\
         # TYPE trainer_policy_version gauge\ntrainer_policy_version {version}\n\
         # TYPE trainer_prefill_seconds_total counter\ntrainer_prefill_seconds_total {:.3}\n\
         # TYPE trainer_decode_seconds_total counter\ntrainer_decode_seconds_total {:.3}\n\
         # TYPE trainer_decode_rounds_total counter\ntrainer_decode_rounds_total {}\n\
         # TYPE trainer_decode_positions_total counter\ntrainer_decode_positions_total {}\n\
         # TYPE trainer_decode_span_positions_total counter\n\
         trainer_decode_span_positions_total {}\n\
         # TYPE trainer_decode_shared_positions_total counter\n\
         trainer_decode_shared_positions_total {}\n",
        st.running.load(Ordering::Relaxed),
        st.waiting.load(Ordering::Relaxed),
        st.generated_tokens.load(Ordering::Relaxed),
        st.prompt_tokens.load(Ordering::Relaxed),
        st.prompt_tokens.load(Ordering::Relaxed),
        st.prefix_hit_tokens.load(Ordering::Relaxed),
        st.prefill_micros.load(Ordering::Relaxed) as f64 / 1e6,
        st.decode_micros.load(Ordering::Relaxed) as f64 / 1e6,
        st.decode_rounds.load(Ordering::Relaxed),
        st.decode_positions.load(Ordering::Relaxed),
        st.decode_span_positions.load(Ordering::Relaxed),
        st.decode_shared_positions.load(Ordering::Relaxed),
    )
}

pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.cfg.max_body_bytes;
    Router::new()
        .route("/v1/train_step", post(train_step))
        .route("/v1/checkpoint", post(save_checkpoint))
        .route("/v1/restore", post(restore))
        .route("/v1/settings", get(get_settings).post(post_settings))
        .route("/v1/state", get(get_state))
        .route("/health", get(health))
        .route(
            "/version",
            get(|| async {
                axum::Json(serde_json::json!({"version": concat!("trainer-serve ", env!("CARGO_PKG_VERSION"))}))
            }),
        )
        .route("/metrics", get(metrics))
        .merge(openai::routes())
        .merge(weights::routes())
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ))
        .with_state(state)
}

/// `GET /health`: "ok", or 503 naming why the server cannot be trusted (`AppState::unhealthy`).
/// Never needs the token.
async fn health(State(s): State<Arc<AppState>>) -> Response {
    match s.unhealthy() {
        None => "ok".into_response(),
        Some(why) => ApiError::Unavailable(format!("unhealthy: {why}")).into_response(),
    }
}

/// Serve until Ctrl-C / SIGTERM; an in-flight train step finishes first.
pub async fn serve(state: Arc<AppState>) -> Result<()> {
    let addr = state.cfg.bind;
    auth::check_bind(addr, state.cfg.api_token.as_ref())
        .map_err(|e| TrainerError::Config(e.to_string()))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| TrainerError::Config(format!("cannot bind {addr}: {e}")))?;
    // The bound address, not the asked one: with port 0 the system picks a free port, and this
    // line is how a caller learns it.
    let bound = listener
        .local_addr()
        .map_err(|e| TrainerError::Config(format!("no local address after binding {addr}: {e}")))?;
    tracing::info!(addr = %bound, "trainer serve listening");
    let st = state.clone();
    axum::serve(listener, router(state.clone()))
        .with_graceful_shutdown(async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {
                    tracing::warn!("shutting down: waiting for the current train step");
                }
                () = st.group_failed.notified() => {
                    tracing::error!("the data-parallel group failed: shutting down");
                }
            }
            let _ = st.training.lock().await;
        })
        .await
        .map_err(|e| TrainerError::Config(format!("server error: {e}")))?;
    if state.group_broken.load(Ordering::SeqCst) {
        return Err(TrainerError::Config(
            state
                .unhealthy()
                .unwrap_or_else(|| "the data-parallel group failed".into()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::model::{LoraTarget, Qwen3, Qwen3Config};

    fn policy() -> Policy {
        let cfg: Qwen3Config = serde_json::from_value(serde_json::json!({
            "vocab_size": 64, "hidden_size": 16, "intermediate_size": 24,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 8, "max_position_embeddings": 32, "tie_word_embeddings": true
        }))
        .unwrap();
        let mut m = Qwen3::random(cfg, 5, 0.3, tch::Device::Cpu, tch::Kind::Float).unwrap();
        let lora = LoraConfig {
            r: 2,
            alpha: 4.0,
            dropout: 0.0,
            targets: LoraTarget::ALL.to_vec(),
        };
        m.add_lora(&lora, 1).unwrap();
        let mut train = TrainConfig::default();
        train.optim.lr = 0.05;
        train.loss.kl_coef = 0.0;
        Policy {
            trainer: Trainer::new(m, train).unwrap(),
            version: 3,
            lora: Some(lora),
            base: "test".into(),
            seed: 1,
            settings: TrainSettings::default(),
            weights_epoch: next_weights_epoch(),
        }
    }

    fn batch(adv: f32) -> Vec<Sequence> {
        (0..2)
            .map(|i| Sequence {
                unlikelihood: Vec::new(),
                tokens: (0..12).map(|k| (k * 5 + i * 3) % 64).collect(),
                loss_mask: (0..12).map(|k| k >= 4).collect(),
                stages: vec![-1; 12],
                behaviour_logprobs: vec![],
                advantages: vec![if i == 0 { adv } else { -adv }],
                off_policy: false,
            })
            .collect()
    }

    fn values(p: &Policy) -> Vec<Vec<f32>> {
        p.trainer
            .model
            .trainable()
            .iter()
            .map(|(_, t)| Vec::<f32>::try_from(t.detach().flatten(0, -1)).unwrap())
            .collect()
    }

    /// A step that errs or panics after an optimizer update is undone exactly: parameters,
    /// optimizer moments and step, and the version; the next step then equals the same step on
    /// a policy that never failed.
    #[test]
    fn a_step_that_fails_half_way_is_undone_exactly() {
        let mut p = policy();
        let mut twin = policy();
        p.trainer.rl_step(&batch(1.0)).unwrap();
        twin.trainer.rl_step(&batch(1.0)).unwrap();
        let before = values(&p);
        let failed = guarded_step(&mut p, ROLLBACK_MAX_BYTES, |p| {
            p.trainer.rl_step(&batch(0.5))?;
            p.version += 1;
            Err::<(), _>(TrainerError::Config("the publish directory is full".into()))
        });
        assert!(
            matches!(failed, Err(StepFailure::RolledBack(TrainerError::Config(ref m))) if m.contains("full")),
            "{failed:?}"
        );
        assert_eq!(values(&p), before);
        assert_eq!((p.version, p.trainer.opt.step), (3, 1));
        let panicked = guarded_step(&mut p, ROLLBACK_MAX_BYTES, |p| -> Result<()> {
            p.trainer.rl_step(&batch(0.5))?;
            panic!("CUDA out of memory (simulated)");
        });
        assert!(
            matches!(panicked, Err(StepFailure::RolledBack(TrainerError::Panicked(ref m))) if m.contains("out of memory")),
            "{panicked:?}"
        );
        assert_eq!(values(&p), before);
        assert_eq!((p.version, p.trainer.opt.step), (3, 1));
        // The moments came back too: the next step is the never-failed twin's.
        let ok = guarded_step(&mut p, ROLLBACK_MAX_BYTES, |p| {
            p.trainer.rl_step(&batch(-1.0))
        });
        assert!(ok.is_ok());
        twin.trainer.rl_step(&batch(-1.0)).unwrap();
        assert_eq!(values(&p), values(&twin));
    }

    #[test]
    fn a_failed_step_without_a_snapshot_is_unrecoverable() {
        let mut p = policy();
        let bytes = p.trainer.trainable_bytes();
        assert!(bytes > 0 && bytes < ROLLBACK_MAX_BYTES);
        let r = guarded_step(&mut p, bytes - 1, |p| p.trainer.rl_step(&batch(1.0)));
        assert!(r.is_ok(), "a step that succeeds needs no snapshot");
        let r = guarded_step(&mut p, bytes - 1, |_| -> Result<()> {
            Err(TrainerError::Config("boom".into()))
        });
        let Err(StepFailure::Unrecoverable(why)) = r else {
            panic!("{r:?}");
        };
        assert!(
            why.contains("boom") && why.contains(&format!("budget of {} bytes", bytes - 1)),
            "{why}"
        );
    }

    #[test]
    fn a_batch_is_checked_whole_in_its_own_numbering() {
        let limits = SeqLimits {
            vocab: 64,
            max_positions: 8,
        };
        let seq = |n: usize, phase| wire::WireSequence {
            unlikelihood: Vec::new(),
            tokens: (0..n as u32).collect(),
            loss_mask: (0..n).map(|k| k > 0).collect(),
            stages: vec![0; n],
            behaviour_logprobs: vec![0.0; n],
            advantages: vec![1.0],
            phase,
            ..Default::default()
        };
        let b = |rl, seqs| wire::Batch {
            policy_version: 0,
            rl,
            seqs,
        };
        let ok = check_batch(
            b(
                true,
                vec![seq(8, wire::Phase::Reflection), seq(3, wire::Phase::Task)],
            ),
            limits,
        )
        .unwrap();
        assert_eq!((ok.reflection.len(), ok.task.len()), (1, 1));
        let e = check_batch(
            b(
                true,
                vec![seq(8, wire::Phase::Reflection), seq(9, wire::Phase::Task)],
            ),
            limits,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("sequence 1: 9 tokens exceed the model's 8 positions"),
            "{e}"
        );
        let e = check_batch(b(false, vec![seq(3, wire::Phase::Reflection)]), limits)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sequence 0: reflection"), "{e}");
        // An off-policy sequence (a demonstration) is a task sequence of an RL batch.
        let off = |phase| wire::WireSequence {
            off_policy: true,
            ..seq(3, phase)
        };
        let ok = check_batch(b(true, vec![off(wire::Phase::Task)]), limits).unwrap();
        assert!(ok.task[0].off_policy);
        for (rl, phase) in [(true, wire::Phase::Reflection), (false, wire::Phase::Task)] {
            let e = check_batch(b(rl, vec![seq(3, wire::Phase::Task), off(phase)]), limits)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("sequence 1: an off-policy sequence") && e.contains("task (phase 0)"),
                "{e}"
            );
        }
        let e = check_batch(b(false, vec![]), limits)
            .unwrap_err()
            .to_string();
        assert!(e.contains("SFT batch needs at least one"), "{e}");
        assert!(
            check_batch(b(true, vec![]), limits).is_ok(),
            "an empty RL step"
        );
    }
}
