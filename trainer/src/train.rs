//! One train step over a batch of sequences: micro-batches to a token budget, forward and
//! backward with the logits head computed in chunks (backward per chunk, so no [T, V] tensor is
//! kept), optional per-layer gradient checkpointing (recompute), then AdamW. RL steps use the
//! policy loss with per-token advantages, split into `minibatches_per_step` PPO updates against
//! the log-probs of the policy the step started from; Phase A (reflection candidates) takes its
//! ratio against the generation-time log-probs; SFT steps the masked cross-entropy. The KL
//! reference of a full fine-tune is a frozen copy of the initial weights, of LoRA the base with
//! adapters off.

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::dist::data_parallel::{self, Command, StepKind, SyncStats};
use crate::dist::zero::{ZeroShard, ZeroStage};
use crate::dist::{Collective, ReduceOp};
use crate::error::{Result, TrainerError};
use crate::loss::{self, Aggregation, PolicyLossConfig};
use crate::model::qwen3::{join_shared, shared_positions, split_shared};
use crate::model::{Fwd, Qwen3};
use crate::optim::{AdamW, AdamWConfig, AdamWState};
pub use crate::sequence::{SeqLimits, Sequence};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    pub loss: PolicyLossConfig,
    pub optim: AdamWConfig,
    /// Padded tokens per micro-batch (rows × longest row).
    pub micro_batch_tokens: i64,
    /// Positions (of all the micro-batch's rows together) per chunk of the logits head.
    pub logit_chunk: i64,
    /// Recompute each layer in backward instead of keeping its activations.
    pub grad_checkpoint: bool,
    /// PPO minibatches (optimizer updates) per RL step: the step's sequences split into this
    /// many contiguous parts; from the second on the ratio against the step's starting policy
    /// moves and the clip binds. 1 = one update with ratio 1 (DR Tulu).
    pub minibatches_per_step: usize,
    /// Leave out of forward and backward the RL rows whose loss is zero at every token whatever
    /// the weights (see [`null_row`]: every counted token's advantage 0, no KL term, no
    /// unlikelihood token), which positive-only credit (`credit.negative_advantage_scale = 0`)
    /// makes of about half a batch. The update is the same: the aggregation weights keep the
    /// whole batch's totals and those rows' gradient is exactly zero (with LoRA dropout, the
    /// same in distribution: the masks are drawn per micro-batch). `tokens` and the per-token
    /// metrics (entropy, clip fraction, ratio, importance weights) are then over the rows
    /// trained on; `null_sequences` counts the others.
    pub skip_null_rows: bool,
    /// Phase A (the reflection step) updates at this fraction of the scheduled learning rate,
    /// in [0, 1]; 1 = the task step's rate. 0 = no Phase A update: a reflection step is refused.
    pub reflection_lr_scale: f64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            loss: PolicyLossConfig::default(),
            optim: AdamWConfig::default(),
            micro_batch_tokens: 16384,
            logit_chunk: 1024,
            grad_checkpoint: true,
            minibatches_per_step: 1,
            skip_null_rows: true,
            reflection_lr_scale: 1.0,
        }
    }
}

/// Whether `s` adds nothing to an RL update under `loss` whatever the weights: every counted
/// token's advantage is 0 (so the clipped surrogate and its gradient are 0 at any ratio), there is
/// no KL term (`kl_coef` 0) and no token carries the unlikelihood term. An SFT row never is.
pub fn null_row(s: &Sequence, loss: &PolicyLossConfig, rl: bool) -> bool {
    if !rl || loss.kl_coef != 0.0 {
        return false;
    }
    if loss.unlikelihood > 0.0 && s.unlikelihood.contains(&true) {
        return false;
    }
    match loss::per_token_advantages(&s.advantages, &s.stages_or_none(), &s.loss_mask) {
        Ok(a) => a.iter().all(|&x| x == 0.0),
        Err(_) => false,
    }
}

impl TrainConfig {
    /// Whether an update under this config leaves `s` out of forward and backward:
    /// `skip_null_rows` is on and `s` is a [`null_row`] of its loss.
    pub fn skips(&self, s: &Sequence, rl: bool) -> bool {
        self.skip_null_rows && null_row(s, &self.loss, rl)
    }
}

/// The rows of `seqs` an update under `cfg` runs forward and backward on: all but those it
/// [skips](TrainConfig::skips) — but never none, so that every rank of a group runs a backward
/// (the overlapped all-reduce's hooks fire in it): when all are skipped the shortest stays.
fn live_rows(seqs: &[Sequence], cfg: &TrainConfig, rl: bool) -> Vec<usize> {
    let live: Vec<usize> = (0..seqs.len())
        .filter(|&i| !cfg.skips(&seqs[i], rl))
        .collect();
    if live.is_empty() {
        return (0..seqs.len())
            .min_by_key(|&i| seqs[i].tokens.len())
            .into_iter()
            .collect();
    }
    live
}

/// The largest `minibatches_per_step` accepted.
pub const MAX_MINIBATCHES: usize = 64;

/// What a step reports (the train-step reply's `metrics` and `reflection`).
pub use wire::StepMetrics;

/// One micro-batch: its input ids [B, T-1], and per position its target and weights,
/// flattened row-major to [B·(T-1)] (the logits head takes its chunks from that order).
struct Micro {
    ids: Tensor,
    /// Leading input positions every row shares, which run once ([`shared_prefix`]; 0: none).
    prefix: i64,
    targets: Tensor,
    mask: Tensor,
    weights: Tensor,
    adv: Tensor,
    behaviour: Option<Tensor>,
    reference: Option<Tensor>,
    /// The ratio's denominator log π_old where it is not the token's own detached log-prob:
    /// values, and (when not every position has one) where they apply.
    old: Option<(Tensor, Option<Tensor>)>,
    /// 1 at the positions the unlikelihood term applies to (RL with a non-zero coefficient and
    /// marked tokens only).
    ul: Option<Tensor>,
    /// 1 at the positions of off-policy rows (Phase B with `shaping` on, when a row is one).
    off: Option<Tensor>,
}

impl Micro {
    /// The flattened positions `keep` only, in their order: what the head needs of a
    /// micro-batch whose other positions carry no loss (`ids` is not per position and stays).
    fn select(&self, keep: &Tensor) -> Micro {
        let sel = |t: &Tensor| t.index_select(0, keep);
        Micro {
            ids: self.ids.shallow_clone(),
            prefix: self.prefix,
            targets: sel(&self.targets),
            mask: sel(&self.mask),
            weights: sel(&self.weights),
            adv: sel(&self.adv),
            behaviour: self.behaviour.as_ref().map(sel),
            reference: self.reference.as_ref().map(sel),
            old: self
                .old
                .as_ref()
                .map(|(vals, usable)| (sel(vals), usable.as_ref().map(sel))),
            ul: self.ul.as_ref().map(sel),
            off: self.off.as_ref().map(sel),
        }
    }
}

/// What kind of update a step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Masked cross-entropy.
    Sft,
    /// Phase B: the clipped policy loss against the step's starting policy.
    Rl,
    /// Phase A: the clipped policy loss against the generation-time (behaviour) log-probs.
    Reflection,
}

impl Mode {
    fn rl(self) -> bool {
        self != Mode::Sft
    }
}

/// Accumulated metric sums over counted tokens.
#[derive(Default)]
struct Sums {
    loss: f64,
    tokens: f64,
    clipped: f64,
    kl: f64,
    entropy: f64,
    ratio: f64,
    tis: f64,
    tis_min: f64,
    tis_max: f64,
    /// Σ −log(1 − p) over the tokens with the unlikelihood term, and their count.
    ul: f64,
    ul_tokens: f64,
    /// Counted tokens that took the off-policy shaped objective.
    shaped: f64,
    /// Rows left out as null ([`live_rows`]).
    null: f64,
    /// Positions run once for the rows that share them, less once ([`shared_prefix`]).
    shared: f64,
}

/// What a step changes, as it was before ([`Trainer::snapshot`]).
#[derive(Debug)]
pub struct Snapshot {
    params: Vec<(String, Tensor)>,
    opt: AdamWState,
    zero: Option<crate::dist::zero::ZeroSnap>,
}

/// One prompt position of `Trainer::prompt_logprobs`.
#[derive(Debug, Clone, PartialEq)]
pub struct PositionLogprobs {
    pub token: u32,
    pub logprob: f32,
    /// 1-based rank of `token` (1: the most likely).
    pub rank: i64,
    /// The most likely tokens and their log-probs, best first.
    pub top: Vec<(u32, f32)>,
}

pub struct Trainer {
    pub model: Qwen3,
    /// The KL reference of a full fine-tune: a frozen (no-grad) copy of the initial weights,
    /// loaded from the model directory. `None` for LoRA (the reference is the base with the
    /// adapters off) and without a KL term.
    pub reference: Option<Qwen3>,
    pub opt: AdamW,
    pub cfg: TrainConfig,
    /// The data-parallel group (`None`: one process, the plain path).
    dist: Option<Box<dyn Collective>>,
    /// Gradient all-reduce bucket size in elements (0: one collective per tensor).
    pub bucket_elems: usize,
    /// What the last step's gradient synchronisation did (zeros in one process).
    pub last_sync: SyncStats,
    /// Overlap the gradient all-reduce with backward (per-layer buckets, under gradient
    /// checkpointing, without ZeRO); else one bucketed all-reduce after backward. `None`
    /// (default): on for NCCL groups only; with gloo on CPU the collectives compete with
    /// backward for the same cores and it measured slower (BENCHMARKS.md). Every rank decides
    /// alike from its group's backend, so all run the same collectives.
    pub overlap: Option<bool>,
    /// ZeRO stage of the optimizer in a group ([`Trainer::set_zero`]).
    zero: ZeroStage,
    /// This rank's optimizer shard, made at the first grouped step under ZeRO.
    zero_shard: Option<ZeroShard>,
}

/// How long rank 0 waits, after its part of a step failed, for a follower's report of why.
const PEER_REPORT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Default gradient bucket: 32 Mi fp32 elements (128 MiB), near DDP's 25 MB order of magnitude.
pub const DEFAULT_BUCKET_ELEMS: usize = 32 << 20;

/// Totals of one optimizer update over every rank: the aggregation weights' denominators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Totals {
    total_tokens: usize,
    counted_seqs: usize,
    sequences: usize,
}

impl Totals {
    fn of(seqs: &[Sequence]) -> Self {
        Self {
            total_tokens: seqs
                .iter()
                .map(|s| s.loss_mask.iter().filter(|&&m| m).count())
                .sum(),
            counted_seqs: seqs
                .iter()
                .filter(|s| s.loss_mask.iter().any(|&m| m))
                .count(),
            sequences: seqs.len(),
        }
    }
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("opt", &self.opt)
            .field("cfg", &self.cfg)
            .field("reference_copy", &self.reference.is_some())
            .field(
                "dist",
                &self
                    .dist
                    .as_ref()
                    .map(|d| (d.backend(), d.rank(), d.world())),
            )
            .finish_non_exhaustive()
    }
}

/// Contiguous `[start, end)` ranges splitting `n` items into `m` parts as even as possible (the
/// first `n % m` parts one longer); never an empty part, so at most `n` parts.
pub fn minibatch_ranges(n: usize, m: usize) -> Vec<std::ops::Range<usize>> {
    let m = m.clamp(1, n.max(1));
    let (base, extra) = (n / m, n % m);
    let mut out = Vec::with_capacity(m);
    let mut start = 0;
    for k in 0..m {
        let len = base + usize::from(k < extra);
        out.push(start..start + len);
        start += len;
    }
    out
}

/// One step's metrics from its minibatch updates: counts and seconds add up, per-token figures
/// are means over all counted tokens, `loss` and `grad_norm` the minibatches' mean, `lr` the
/// last update's, the importance-weight range the union.
pub fn aggregate(parts: &[StepMetrics]) -> StepMetrics {
    let Some(last) = parts.last() else {
        return StepMetrics::default();
    };
    if parts.len() == 1 {
        return last.clone();
    }
    let tokens: i64 = parts.iter().map(|p| p.tokens).sum();
    let n = tokens.max(1) as f64;
    let ul_tokens: i64 = parts.iter().map(|p| p.unlikelihood_tokens).sum();
    let per_token = |f: fn(&StepMetrics) -> f64| -> f64 {
        parts.iter().map(|p| f(p) * p.tokens as f64).sum::<f64>() / n
    };
    let k = parts.len() as f64;
    StepMetrics {
        loss: parts.iter().map(|p| p.loss).sum::<f64>() / k,
        tokens,
        sequences: parts.iter().map(|p| p.sequences).sum(),
        micro_batches: parts.iter().map(|p| p.micro_batches).sum(),
        minibatches: parts.iter().map(|p| p.minibatches).sum(),
        grad_norm: parts.iter().map(|p| p.grad_norm).sum::<f64>() / k,
        lr: last.lr,
        clip_fraction: per_token(|p| p.clip_fraction),
        kl: per_token(|p| p.kl),
        entropy: per_token(|p| p.entropy),
        ratio_mean: per_token(|p| p.ratio_mean),
        tis_mean: per_token(|p| p.tis_mean),
        tis_min: parts
            .iter()
            .map(|p| p.tis_min)
            .fold(f64::INFINITY, f64::min),
        tis_max: parts
            .iter()
            .map(|p| p.tis_max)
            .fold(f64::NEG_INFINITY, f64::max),
        unlikelihood: parts
            .iter()
            .map(|p| p.unlikelihood * p.unlikelihood_tokens as f64)
            .sum::<f64>()
            / ul_tokens.max(1) as f64,
        unlikelihood_tokens: ul_tokens,
        shaped_tokens: parts.iter().map(|p| p.shaped_tokens).sum(),
        null_sequences: parts.iter().map(|p| p.null_sequences).sum(),
        shared_prefix_tokens: parts.iter().map(|p| p.shared_prefix_tokens).sum(),
        seconds: parts.iter().map(|p| p.seconds).sum(),
    }
}

/// Group sequence indices into micro-batches whose padded size stays within the budget
/// (sorted by length so padding is small; a sequence longer than the budget goes alone). A
/// sequence shorter than half its group's longest starts a new group: padded, it would cost
/// more than twice its own length (a 64-token copy row beside 2,000-token demonstrations, a
/// rollout that answered early beside one cut at the budget).
pub fn micro_batches(lens: &[usize], budget: i64) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lens[i]));
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut longest = 0usize;
    for i in order {
        let l = longest.max(lens[i]);
        if !cur.is_empty() && ((l * (cur.len() + 1)) as i64 > budget || 2 * lens[i] < longest) {
            out.push(std::mem::take(&mut cur));
            longest = 0;
        }
        longest = longest.max(lens[i]);
        cur.push(i);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Sum (min, max) one update's metric sums and micro-batch count over the group's ranks. The
/// values travel on the group's device (an NCCL group takes CUDA tensors only).
fn reduce_sums(g: &dyn Collective, sums: &mut Sums, micro_batches: usize) -> Result<usize> {
    let dev = g.device();
    let mut t = Tensor::from_slice(&[
        sums.loss,
        sums.tokens,
        sums.clipped,
        sums.kl,
        sums.entropy,
        sums.ratio,
        sums.tis,
        sums.ul,
        sums.ul_tokens,
        sums.shaped,
        sums.null,
        sums.shared,
        micro_batches as f64,
    ])
    .to_device(dev);
    let mut lo = Tensor::from_slice(&[sums.tis_min]).to_device(dev);
    let mut hi = Tensor::from_slice(&[sums.tis_max]).to_device(dev);
    let works = [
        g.all_reduce(&mut t, ReduceOp::Sum)?,
        g.all_reduce(&mut lo, ReduceOp::Min)?,
        g.all_reduce(&mut hi, ReduceOp::Max)?,
    ];
    for w in works {
        w.wait()?;
    }
    let v = Vec::<f64>::try_from(&t.to_device(Device::Cpu))?;
    let [
        loss,
        tokens,
        clipped,
        kl,
        entropy,
        ratio,
        tis,
        ul,
        ul_tokens,
        shaped,
        null,
        shared,
        micro,
    ] = v[..]
    else {
        return Err(TrainerError::Panicked(
            "metric reduction lost values".into(),
        ));
    };
    *sums = Sums {
        loss,
        tokens,
        clipped,
        kl,
        entropy,
        ratio,
        tis,
        tis_min: lo.double_value(&[0]),
        tis_max: hi.double_value(&[0]),
        ul,
        ul_tokens,
        shaped,
        null,
        shared,
    };
    Ok(micro as usize)
}

/// The flattened positions whose loss mask `mask` is set (> 0): the only positions whose
/// log-probs a loss, a gradient or a metric reads.
fn loss_positions(mask: &Tensor) -> Tensor {
    mask.reshape([-1]).gt(0.0).nonzero().squeeze_dim(1)
}

/// Fewest shared leading positions run once. A floor, not a measured break-even: the split
/// costs one more pass per layer for the shared row and a copy of the rows' keys and values,
/// which a few positions would not repay; a chat batch's shared system prompt is hundreds.
pub const MIN_SHARED_PREFIX: usize = 32;

/// How many leading input positions (a row's tokens but its last) every row of a micro-batch
/// shares, to run once ([`Qwen3::layers_forward`]); 0 for a single row or fewer than
/// [`MIN_SHARED_PREFIX`]. Capped so every row keeps at least one position of its own in the
/// padded width (the longest row's inputs).
pub fn shared_prefix(rows: &[Vec<i64>]) -> i64 {
    let [first, rest @ ..] = rows else {
        return 0;
    };
    if rest.is_empty() {
        return 0;
    }
    let inputs = |r: &Vec<i64>| r.len().saturating_sub(1);
    let width = rows.iter().map(inputs).max().unwrap_or(0);
    let mut p = rows.iter().map(inputs).min().unwrap_or(0);
    for r in rest {
        p = first
            .iter()
            .zip(r)
            .take(p)
            .take_while(|(a, b)| a == b)
            .count();
    }
    let p = p.min(width.saturating_sub(1));
    if p < MIN_SHARED_PREFIX { 0 } else { p as i64 }
}

fn pad_2d<T: Copy + tch::kind::Element>(rows: &[Vec<T>], pad: T, device: Device) -> Tensor {
    let t = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut flat = Vec::with_capacity(rows.len() * t);
    for r in rows {
        flat.extend_from_slice(r);
        flat.extend(std::iter::repeat_n(pad, t - r.len()));
    }
    Tensor::from_slice(&flat)
        .view([rows.len() as i64, t as i64])
        .to_device(device)
}

impl Trainer {
    /// A trainer without a reference copy: LoRA (whose reference is the base with the adapters
    /// off) or no KL term. A full fine-tune with `kl_coef > 0` needs [`Trainer::with_reference`].
    pub fn new(model: Qwen3, cfg: TrainConfig) -> Result<Self> {
        Self::with_reference(model, None, cfg)
    }

    /// A trainer whose KL reference of a full fine-tune is `reference`, a frozen copy of the
    /// initial weights (loaded from the model directory; its parameters take no gradient).
    pub fn with_reference(
        model: Qwen3,
        reference: Option<Qwen3>,
        cfg: TrainConfig,
    ) -> Result<Self> {
        Self::check(&model, reference.as_ref(), &cfg)?;
        if let Some(r) = &reference {
            r.set_trainable(false);
        }
        let opt = AdamW::new(model.trainable(), cfg.optim.clone());
        Ok(Self {
            model,
            reference,
            opt,
            cfg,
            dist: None,
            bucket_elems: DEFAULT_BUCKET_ELEMS,
            overlap: None,
            last_sync: SyncStats::default(),
            zero: ZeroStage::Off,
            zero_shard: None,
        })
    }

    /// Train data-parallel in `group` from the next step: rank 0's `rl_step`, `sft_step` and
    /// `reflection_step` split each batch across the ranks, the others run
    /// [`Trainer::follow_step`]. Every rank must hold the same weights and optimizer state (the
    /// same model directory or checkpoint, and seed).
    pub fn set_collective(&mut self, group: Box<dyn Collective>) {
        self.dist = Some(group);
    }

    /// Shard the optimizer state across the group (ZeRO stage 1 or 2) from the next step; set
    /// it on every rank before the first step (the unsharded AdamW state is released when the
    /// shard is made). `Off` (the default) keeps the whole state on every rank.
    pub fn set_zero(&mut self, stage: ZeroStage) -> Result<()> {
        if self.zero_shard.is_some() && stage != self.zero {
            return Err(TrainerError::Config(format!(
                "the optimizer is already sharded as ZeRO {:?}; it cannot change to {stage:?}",
                self.zero
            )));
        }
        self.zero = stage;
        Ok(())
    }

    /// The ZeRO stage set with [`Trainer::set_zero`].
    pub fn zero_stage(&self) -> ZeroStage {
        self.zero
    }

    /// This rank's optimizer shard under ZeRO (after the first grouped step).
    pub fn zero_shard(&self) -> Option<&ZeroShard> {
        self.zero_shard.as_ref()
    }

    /// Shard the optimizer now (ZeRO set, in a group) and restore the shard from the shard
    /// files of `dir` (written by a group of any size, [`ZeroShard::save`]); returns the
    /// optimizer step restored.
    pub fn load_zero(&mut self, dir: &std::path::Path) -> Result<u64> {
        self.ensure_zero_shard()?;
        let shard = self
            .zero_shard
            .as_mut()
            .ok_or_else(|| TrainerError::Config("ZeRO is off or there is no group".into()))?;
        let step = shard.load(dir)?;
        self.opt.step = step;
        Ok(step)
    }

    /// Write this rank's optimizer shard into `dir` (every rank of the group calls it).
    pub fn save_zero(&self, dir: &std::path::Path) -> Result<()> {
        match &self.zero_shard {
            Some(s) => s.save(dir, self.opt.step),
            None => Err(TrainerError::Config("the optimizer is not sharded".into())),
        }
    }

    fn ensure_zero_shard(&mut self) -> Result<()> {
        if self.zero_shard.is_some() || self.zero == ZeroStage::Off {
            return Ok(());
        }
        let Some(g) = self.dist.as_deref().filter(|d| d.world() > 1) else {
            return Ok(());
        };
        let params = self.model.trainable();
        self.zero_shard = Some(ZeroShard::new(self.zero, &params, g.rank(), g.world()));
        self.opt.release_state();
        Ok(())
    }

    /// The data-parallel group, if any.
    pub fn collective(&self) -> Option<&dyn Collective> {
        self.dist.as_deref()
    }

    /// Leave the data-parallel group (train alone from the next step); the group.
    pub fn take_collective(&mut self) -> Option<Box<dyn Collective>> {
        self.dist.take()
    }

    /// The group when there is more than one rank.
    fn group(&self) -> Option<&dyn Collective> {
        self.dist.as_deref().filter(|d| d.world() > 1)
    }

    /// Rank 0 of a group: split `seqs` (validated) into every rank's part, publish the others'
    /// and run its own. Other ranks refuse: they take steps from rank 0 only.
    fn lead(&mut self, kind: StepKind, seqs: &[Sequence]) -> Result<StepMetrics> {
        let Some(g) = self.group() else {
            return Err(TrainerError::Config("not in a data-parallel group".into()));
        };
        if g.rank() != 0 {
            return Err(TrainerError::Config(format!(
                "rank {} takes its steps from rank 0 (follow_step), not from a caller",
                g.rank()
            )));
        }
        let ranges = match kind {
            StepKind::Rl => minibatch_ranges(seqs.len(), self.cfg.minibatches_per_step),
            StepKind::Reflection | StepKind::Sft => std::iter::once(0..seqs.len()).collect(),
        };
        let rl = kind != StepKind::Sft;
        let cost = |s: &Sequence| {
            if self.cfg.skips(s, rl) {
                1
            } else {
                s.tokens.len()
            }
        };
        let cmds = data_parallel::plan(kind, seqs, &ranges, g.world(), cost);
        let own = data_parallel::publish(g, cmds)?;
        match self.run_command(own) {
            Ok(m) => Ok(m),
            Err(e) => {
                // A follower that failed first said why: name it (wait a moment for its report,
                // which it writes as soon as its own error surfaces).
                let Some(g) = self.group() else {
                    return Err(e);
                };
                match data_parallel::peer_failure(g, PEER_REPORT_WAIT) {
                    Some((rank, message)) => {
                        Err(TrainerError::Dist(crate::dist::DistError::Peer {
                            rank,
                            message,
                            at: g.rank(),
                            here: e.to_string(),
                        }))
                    }
                    None => Err(e),
                }
            }
        }
    }

    /// A rank other than 0: wait up to `timeout` for rank 0's next step and take it. A timeout
    /// is an error ([`TrainerError::Dist`]) after which the same step can be waited for again.
    pub fn follow_step(&mut self, timeout: std::time::Duration) -> Result<StepMetrics> {
        let Some(g) = self.group() else {
            return Err(TrainerError::Config("not in a data-parallel group".into()));
        };
        let cmd = data_parallel::receive(g, timeout)?;
        self.run_received(cmd)
    }

    /// A rank other than 0: take a step command received from rank 0 (see
    /// [`data_parallel::receive`]); a failure is reported to rank 0 with its reason.
    pub fn run_received(&mut self, cmd: Command) -> Result<StepMetrics> {
        if cmd.control.is_some() {
            return Err(TrainerError::Config(
                "a control command is applied to the policy, not run as a step".into(),
            ));
        }
        let r = self.run_command(cmd);
        if let (Err(e), Some(g)) = (&r, self.group()) {
            data_parallel::report_fatal(g, &e.to_string());
        }
        r
    }

    /// One rank's share of a step: the updates of `cmd`, each weighted by its global totals.
    fn run_command(&mut self, cmd: Command) -> Result<StepMetrics> {
        let t0 = std::time::Instant::now();
        let totals = |p: &data_parallel::Part| Totals {
            total_tokens: p.total_tokens,
            counted_seqs: p.counted_seqs,
            sequences: p.sequences,
        };
        let mut parts = Vec::with_capacity(cmd.parts.len());
        match cmd.kind {
            StepKind::Rl => {
                // Log-probs of the step's starting policy for every update after the first.
                let later: Vec<&[Sequence]> = cmd
                    .parts
                    .iter()
                    .skip(1)
                    .map(|p| p.seqs.as_slice())
                    .collect();
                let old = if later.is_empty() {
                    Vec::new()
                } else {
                    self.start_logprobs(&later)?
                };
                let mut at = 0;
                for (k, p) in cmd.parts.iter().enumerate() {
                    let o = (k > 0).then(|| {
                        let r = &old[at..at + p.seqs.len()];
                        at += p.seqs.len();
                        r
                    });
                    parts.push(self.update_with(&p.seqs, Mode::Rl, o, totals(p))?);
                }
            }
            StepKind::Reflection | StepKind::Sft => {
                let mode = if cmd.kind == StepKind::Sft {
                    Mode::Sft
                } else {
                    Mode::Reflection
                };
                for p in &cmd.parts {
                    parts.push(self.update_with(&p.seqs, mode, None, totals(p))?);
                }
            }
        }
        let mut m = aggregate(&parts);
        m.seconds = t0.elapsed().as_secs_f64();
        Ok(m)
    }

    /// Whether `cfg` can train `model` with `reference`; the error names the value and the
    /// limit.
    fn check(model: &Qwen3, reference: Option<&Qwen3>, cfg: &TrainConfig) -> Result<()> {
        cfg.loss.validate()?;
        let lora = model.has_lora();
        if cfg.loss.kl_coef > 0.0 && !lora && reference.is_none() {
            return Err(TrainerError::Config(format!(
                "kl_coef = {} with a full fine-tune needs a reference policy: a frozen copy of \
                 the initial weights (Trainer::with_reference); set kl_coef = 0, pass one, or \
                 train LoRA (whose reference is the base with adapters disabled)",
                cfg.loss.kl_coef
            )));
        }
        if let Some(r) = reference {
            if lora {
                return Err(TrainerError::Config(
                    "a reference copy with LoRA: the reference is the base with the adapters \
                     disabled, so no copy is kept"
                        .into(),
                ));
            }
            if r.cfg != model.cfg || r.device != model.device {
                return Err(TrainerError::Config(format!(
                    "the reference copy ({} layers, hidden {}, vocab {}, {:?}) is not the \
                     policy's model ({} layers, hidden {}, vocab {}, {:?})",
                    r.cfg.num_hidden_layers,
                    r.cfg.hidden_size,
                    r.cfg.vocab_size,
                    r.device,
                    model.cfg.num_hidden_layers,
                    model.cfg.hidden_size,
                    model.cfg.vocab_size,
                    model.device
                )));
            }
        }
        if cfg.micro_batch_tokens < 2 || cfg.logit_chunk < 1 {
            return Err(TrainerError::Config(format!(
                "micro_batch_tokens = {} (>= 2) and logit_chunk = {} (>= 1)",
                cfg.micro_batch_tokens, cfg.logit_chunk
            )));
        }
        if !(1..=MAX_MINIBATCHES).contains(&cfg.minibatches_per_step) {
            return Err(TrainerError::Config(format!(
                "minibatches_per_step = {}; allowed: 1..={MAX_MINIBATCHES}",
                cfg.minibatches_per_step
            )));
        }
        Ok(())
    }

    /// Bytes the trainable parameters take (what [`Trainer::snapshot`] copies).
    pub fn trainable_bytes(&self) -> usize {
        self.model
            .trainable()
            .iter()
            .map(|(_, t)| t.numel() * t.kind().elt_size_in_bytes())
            .sum()
    }

    /// What a step changes, kept so a failed step can be undone ([`Trainer::rollback`]): a CPU
    /// copy of the trainable parameters and the optimizer's state. `None` when the parameters
    /// take more than `max_bytes` (a full fine-tune of a large model), or the copy fails.
    pub fn snapshot(&self, max_bytes: usize) -> Option<Snapshot> {
        if self.trainable_bytes() > max_bytes {
            return None;
        }
        let params = self
            .model
            .trainable()
            .into_iter()
            .map(|(n, t)| {
                let copy = t
                    .detach()
                    .f_to_device_(Device::Cpu, t.kind(), false, true)?;
                Ok((n, copy))
            })
            .collect::<Result<Vec<_>>>()
            .ok()?;
        Some(Snapshot {
            params,
            opt: self.opt.state(),
            zero: self.zero_shard.as_ref().map(ZeroShard::state),
        })
    }

    /// Put the parameters and optimizer state of `snap` back (gradients cleared). Fails only
    /// when the snapshot is of another parameter list, or libtorch cannot copy.
    pub fn rollback(&mut self, snap: Snapshot) -> Result<()> {
        let current = self.model.trainable();
        if current.len() != snap.params.len()
            || current.iter().zip(&snap.params).any(|(a, b)| a.0 != b.0)
        {
            return Err(TrainerError::Config(format!(
                "a snapshot of {} tensors does not match the model's {} trainable tensors",
                snap.params.len(),
                current.len()
            )));
        }
        tch::no_grad(|| -> Result<()> {
            for ((_, cur), (_, saved)) in current.iter().zip(&snap.params) {
                let mut cur = cur.shallow_clone();
                cur.f_copy_(saved)?;
            }
            Ok(())
        })?;
        self.opt.restore(snap.opt)?;
        if let (Some(shard), Some(z)) = (self.zero_shard.as_mut(), snap.zero) {
            shard.restore(z);
        }
        self.opt.zero_grad();
        Ok(())
    }

    /// Whether [`Trainer::set_config`] would accept `cfg` (nothing changes).
    pub fn check_config(&self, cfg: &TrainConfig) -> Result<()> {
        Self::check(&self.model, self.reference.as_ref(), cfg)
    }

    /// Train on with `cfg` from the next step: loss, optimizer settings (schedule included,
    /// applied at the current optimizer step), memory knobs and minibatches. The AdamW moments
    /// and step count are kept. On error nothing changes.
    pub fn set_config(&mut self, cfg: TrainConfig) -> Result<()> {
        self.check_config(&cfg)?;
        self.opt.cfg = cfg.optim.clone();
        self.cfg = cfg;
        Ok(())
    }

    /// One RL step (SS-GRPO when sequences carry per-stage advantages, GRPO with one): with
    /// `minibatches_per_step` > 1, one optimizer update per minibatch (see
    /// [`Trainer::rl_minibatch_steps`]); the metrics are aggregated over them.
    pub fn rl_step(&mut self, seqs: &[Sequence]) -> Result<StepMetrics> {
        if self.group().is_some() {
            self.validate(seqs, true)?;
            return self.lead(StepKind::Rl, seqs);
        }
        let t0 = std::time::Instant::now();
        let parts = self.rl_minibatch_steps(seqs)?;
        let mut m = aggregate(&parts);
        m.seconds = t0.elapsed().as_secs_f64();
        Ok(m)
    }

    /// One RL step as its minibatch updates, each one's metrics. The sequences are split into
    /// `minibatches_per_step` contiguous minibatches (as even as possible; never more than there
    /// are sequences); each minibatch's aggregation weights are computed over that minibatch.
    /// The ratio's denominator is the policy the step started from: for the first minibatch that
    /// is its own detached log-probs (the same weights, so ratio 1 and no extra forward pass);
    /// for the others, log-probs computed once before the first update (no grad). With one
    /// minibatch this is one update with ratio 1, as DR Tulu.
    pub fn rl_minibatch_steps(&mut self, seqs: &[Sequence]) -> Result<Vec<StepMetrics>> {
        if self.group().is_some() {
            return Err(TrainerError::Config(
                "in a data-parallel group an RL step is rl_step (rank 0) or follow_step".into(),
            ));
        }
        self.validate(seqs, true)?;
        let ranges = minibatch_ranges(seqs.len(), self.cfg.minibatches_per_step);
        let rest = ranges.get(1).map_or(seqs.len(), |r| r.start);
        let old = if rest < seqs.len() {
            let later: Vec<&[Sequence]> = ranges[1..].iter().map(|r| &seqs[r.clone()]).collect();
            self.start_logprobs(&later)?
        } else {
            Vec::new()
        };
        let mut out = Vec::with_capacity(ranges.len());
        for (k, r) in ranges.into_iter().enumerate() {
            let old = (k > 0).then(|| &old[r.start - rest..r.end - rest]);
            out.push(self.update(&seqs[r], Mode::Rl, old)?);
        }
        Ok(out)
    }

    /// Phase A: the reflection candidates' own optimizer step (method.md A.6.3). The candidates
    /// were generated one step earlier, so the PPO ratio is taken against their generation-time
    /// log-probs: log π_old is a sequence's `behaviour_logprobs` at every counted token where
    /// that value is present and non-zero (0 means "not recorded"; validation refuses a
    /// non-finite one), and the token's own detached log-prob (ratio 1) elsewhere; the clip is
    /// the task loss's. Truncated importance weights are off for these sequences, since the
    /// ratio already is against the behaviour policy. One update, whatever
    /// `minibatches_per_step` says, at `reflection_lr_scale` times the scheduled rate (refused
    /// at 0).
    pub fn reflection_step(&mut self, seqs: &[Sequence]) -> Result<StepMetrics> {
        if self.cfg.reflection_lr_scale == 0.0 {
            return Err(TrainerError::Config(format!(
                "a reflection (Phase A) step of {} sequences, but reflection_lr_scale = 0 \
                 leaves Phase A out: send no reflection sequences, or set a scale in (0, 1]",
                seqs.len()
            )));
        }
        self.validate(seqs, true)?;
        if self.group().is_some() {
            return self.lead(StepKind::Reflection, seqs);
        }
        self.update(seqs, Mode::Reflection, None)
    }

    /// One SFT step (masked cross-entropy).
    pub fn sft_step(&mut self, seqs: &[Sequence]) -> Result<StepMetrics> {
        self.validate(seqs, false)?;
        if self.group().is_some() {
            return self.lead(StepKind::Sft, seqs);
        }
        self.update(seqs, Mode::Sft, None)
    }

    fn validate(&self, seqs: &[Sequence], rl: bool) -> Result<()> {
        if seqs.is_empty() {
            return Err(TrainerError::Batch("empty batch".into()));
        }
        let limits = SeqLimits::of(&self.model);
        for (i, s) in seqs.iter().enumerate() {
            s.validate(i, limits, rl)?;
        }
        Ok(())
    }

    /// Log-probs of the current policy (no grad, no dropout) for the rows of `minibatches` that
    /// their update will train on ([`live_rows`]: a skipped row's are never read, so its entry
    /// stays empty), in the minibatches' order, shifted: entry t is log p(token t+1 | prefix).
    /// Batched by the micro-batch budget. Only tokens with a loss mask are computed (the ratio
    /// reads no other); the rest are 0.
    fn start_logprobs(&self, minibatches: &[&[Sequence]]) -> Result<Vec<Vec<f32>>> {
        let dev = self.model.device;
        let seqs: Vec<&Sequence> = minibatches.iter().flat_map(|m| m.iter()).collect();
        let mut need = Vec::new();
        let mut at = 0;
        for m in minibatches {
            need.extend(live_rows(m, &self.cfg, true).into_iter().map(|i| at + i));
            at += m.len();
        }
        let lens: Vec<usize> = seqs.iter().map(|s| s.tokens.len()).collect();
        let need_lens: Vec<usize> = need.iter().map(|&i| lens[i]).collect();
        let mut out = vec![Vec::new(); seqs.len()];
        tch::no_grad(|| -> Result<()> {
            for group in micro_batches(&need_lens, self.cfg.micro_batch_tokens) {
                let group: Vec<usize> = group.into_iter().map(|j| need[j]).collect();
                let ids: Vec<Vec<i64>> = group.iter().map(|&i| seqs[i].tokens.clone()).collect();
                let prefix = shared_prefix(&ids);
                let ids = pad_2d(&ids, 0i64, dev);
                let t = ids.size()[1];
                let h = self
                    .model
                    .hidden_shared(&ids.narrow(1, 0, t - 1), prefix, Fwd::POLICY);
                let mask: Vec<Vec<bool>> = group
                    .iter()
                    .map(|&i| seqs[i].loss_mask[1..].to_vec())
                    .collect();
                let keep = loss_positions(&pad_2d(&mask, false, dev));
                let lp = loss::token_logprobs_at(
                    &h,
                    self.model.lm_weight(),
                    &ids.narrow(1, 1, t - 1),
                    &keep,
                    self.cfg.logit_chunk,
                )
                .to_kind(Kind::Float)
                .to_device(Device::Cpu);
                for (row, &i) in group.iter().enumerate() {
                    let n = lens[i] as i64 - 1;
                    out[i] = Vec::<f32>::try_from(lp.get(row as i64).narrow(0, 0, n).contiguous())?;
                }
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// One optimizer update over validated `seqs`; `old` (RL only) holds the step's starting
    /// log-probs (shifted) when they are not the tokens' own detached log-probs.
    fn update(
        &mut self,
        seqs: &[Sequence],
        mode: Mode,
        old: Option<&[Vec<f32>]>,
    ) -> Result<StepMetrics> {
        // Aggregation weights: computed over the whole update, then sliced per micro-batch.
        self.update_with(seqs, mode, old, Totals::of(seqs))
    }

    /// One optimizer update over this rank's `seqs` (all of them in one process), weighted by
    /// the whole update's `totals`. In a group, every rank's gradients (and metric sums) are
    /// summed before the optimizer steps, so each rank takes the same update.
    fn update_with(
        &mut self,
        seqs: &[Sequence],
        mode: Mode,
        old: Option<&[Vec<f32>]>,
        totals: Totals,
    ) -> Result<StepMetrics> {
        let t0 = std::time::Instant::now();
        let Totals {
            total_tokens,
            counted_seqs,
            sequences,
        } = totals;
        let agg = if mode.rl() {
            self.cfg.loss.aggregation
        } else {
            Aggregation::TokenMean
        };
        // Rows with a zero loss at every token need no pass; the weights above keep the totals.
        let live = live_rows(seqs, &self.cfg, mode.rl());
        let lens: Vec<usize> = live.iter().map(|&i| seqs[i].tokens.len()).collect();
        let groups: Vec<Vec<usize>> = micro_batches(&lens, self.cfg.micro_batch_tokens)
            .into_iter()
            .map(|g| g.into_iter().map(|j| live[j]).collect())
            .collect();
        self.opt.zero_grad();
        let (names, mut params): (Vec<String>, Vec<Tensor>) = match self.group() {
            Some(_) => self.model.trainable().into_iter().unzip(),
            None => (Vec::new(), Vec::new()),
        };
        if let Some(g) = self.group() {
            data_parallel::ensure_grads(g, &mut params)?;
        }
        let mut sums = Sums {
            null: (seqs.len() - live.len()) as f64,
            tis_min: f64::INFINITY,
            tis_max: f64::NEG_INFINITY,
            ..Sums::default()
        };
        // Overlap needs every rank to run backward (each has a sequence when there are at
        // least as many as ranks: the split hands the longest ones out one per rank first).
        let mut overlap = match self.group() {
            Some(g)
                if self.overlap.unwrap_or(g.backend() == "nccl")
                    && self.cfg.grad_checkpoint
                    && self.zero == ZeroStage::Off
                    && sequences >= g.world() =>
            {
                Some(data_parallel::Overlap::new(
                    g,
                    &names,
                    &params,
                    self.model.layers.len(),
                ))
            }
            _ => None,
        };
        for (k, group) in groups.iter().enumerate() {
            let micro = self.prepare(seqs, group, mode, old, agg, total_tokens, counted_seqs)?;
            // Only the last micro-batch's backward leaves a layer's gradients final.
            let ov = if k + 1 == groups.len() {
                overlap.as_mut()
            } else {
                None
            };
            self.forward_backward(&micro, mode, &mut sums, ov)?;
        }
        let overlapped = match overlap {
            Some(o) => Some(o.finish()?),
            None => None,
        };
        let mut micro_batches = groups.len();
        self.ensure_zero_shard()?;
        // Phase A takes its own fraction of the scheduled rate (`reflection_lr_scale`).
        let lr_scale = match mode {
            Mode::Reflection => self.cfg.reflection_lr_scale,
            Mode::Rl | Mode::Sft => 1.0,
        };
        let (grad_norm, lr) = match (
            self.dist.as_deref().filter(|d| d.world() > 1),
            self.zero_shard.as_mut(),
        ) {
            (Some(g), Some(shard)) => {
                // ZeRO: the shard synchronises, clips, updates and gathers.
                let step = self.opt.step + 1;
                let cfg = self.opt.cfg.with_lr_scale(lr_scale);
                let (norm, lr, sync) = shard.step(g, &params, &cfg, step)?;
                self.opt.step = step;
                micro_batches = reduce_sums(g, &mut sums, micro_batches)?;
                self.last_sync = sync;
                (norm, lr)
            }
            (Some(g), None) => {
                let sync = match overlapped {
                    Some(s) => s,
                    None => data_parallel::sync_grads(g, &params, self.bucket_elems)?,
                };
                micro_batches = reduce_sums(g, &mut sums, micro_batches)?;
                self.last_sync = sync;
                self.opt.step_scaled(lr_scale)?
            }
            (None, _) => self.opt.step_scaled(lr_scale)?,
        };
        let n = sums.tokens.max(1.0);
        Ok(StepMetrics {
            loss: sums.loss,
            tokens: sums.tokens as i64,
            sequences,
            micro_batches,
            minibatches: 1,
            grad_norm,
            lr,
            clip_fraction: sums.clipped / n,
            kl: sums.kl / n,
            entropy: sums.entropy / n,
            ratio_mean: sums.ratio / n,
            tis_mean: sums.tis / n,
            tis_min: if sums.tis_min.is_finite() {
                sums.tis_min
            } else {
                1.0
            },
            tis_max: if sums.tis_max.is_finite() {
                sums.tis_max
            } else {
                1.0
            },
            unlikelihood: sums.ul / sums.ul_tokens.max(1.0),
            unlikelihood_tokens: sums.ul_tokens as i64,
            shaped_tokens: sums.shaped as i64,
            null_sequences: sums.null as usize,
            shared_prefix_tokens: sums.shared as i64,
            seconds: t0.elapsed().as_secs_f64(),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn prepare(
        &self,
        seqs: &[Sequence],
        group: &[usize],
        mode: Mode,
        old: Option<&[Vec<f32>]>,
        agg: Aggregation,
        total_tokens: usize,
        counted_seqs: usize,
    ) -> Result<Micro> {
        let rl = mode.rl();
        let dev = self.model.device;
        let rows: Vec<&Sequence> = group.iter().map(|&i| &seqs[i]).collect();
        let ids: Vec<Vec<i64>> = rows.iter().map(|s| s.tokens.clone()).collect();
        // Position t of the shifted arrays describes token t+1.
        let shift = |f: &dyn Fn(&Sequence) -> Vec<f32>| -> Vec<Vec<f32>> {
            rows.iter().map(|s| f(s)[1..].to_vec()).collect()
        };
        // Per-token flags as 0/1 weights (an empty array: none set).
        let flags = |v: &[bool], n: usize| -> Vec<f32> {
            if v.is_empty() {
                vec![0.0; n]
            } else {
                v.iter().map(|&m| f32::from(u8::from(m))).collect()
            }
        };
        let mask = shift(&|s| flags(&s.loss_mask, s.tokens.len()));
        let weights: Vec<Vec<f32>> = rows
            .iter()
            .zip(&mask)
            .map(|(s, m)| {
                let seq_tokens = s.loss_mask.iter().filter(|&&x| x).count();
                let w = agg.weight(seq_tokens, total_tokens, counted_seqs) as f32;
                m.iter().map(|&x| x * w).collect()
            })
            .collect();
        let adv = if rl {
            let mut out = Vec::new();
            for s in &rows {
                let a =
                    loss::per_token_advantages(&s.advantages, &s.stages_or_none(), &s.loss_mask)?;
                out.push(a[1..].to_vec());
            }
            out
        } else {
            mask.iter().map(|m| vec![0.0; m.len()]).collect()
        };
        // Phase A's ratio already is against the behaviour policy: no truncated IS on top.
        // Per token: where a behaviour log-prob is 0 (not recorded; a row without any is all
        // 0) the weight is 1 (`loss::policy_terms`).
        let behaviour = (mode == Mode::Rl
            && self.cfg.loss.tis_clamp.is_some()
            && rows.iter().any(|s| !s.behaviour_logprobs.is_empty()))
        .then(|| {
            shift(&|s| {
                if s.behaviour_logprobs.is_empty() {
                    vec![0.0; s.tokens.len()]
                } else {
                    s.behaviour_logprobs.clone()
                }
            })
        });
        let old = match (mode, old) {
            (Mode::Rl, Some(old)) => {
                let rows: Vec<Vec<f32>> = group.iter().map(|&i| old[i].clone()).collect();
                Some((pad_2d(&rows, 0.0f32, dev), None))
            }
            (Mode::Reflection, _) => {
                // Generation-time log-probs where recorded (present and non-zero; validation
                // has refused non-finite ones) at a counted token; elsewhere the token's own
                // detached log-prob.
                let vals = shift(&|s| {
                    if s.behaviour_logprobs.is_empty() {
                        vec![0.0; s.tokens.len()]
                    } else {
                        s.behaviour_logprobs.clone()
                    }
                });
                let usable: Vec<Vec<f32>> = vals
                    .iter()
                    .zip(&mask)
                    .map(|(v, m)| {
                        v.iter()
                            .zip(m)
                            .map(|(&b, &m)| f32::from(u8::from(m > 0.0 && b != 0.0)))
                            .collect()
                    })
                    .collect();
                Some((
                    pad_2d(&vals, 0.0f32, dev),
                    Some(pad_2d(&usable, 0.0f32, dev).gt(0.0)),
                ))
            }
            _ => None,
        };
        // The unlikelihood term: the task loss's (Phase B) marked tokens, when it is on.
        let ul = (mode == Mode::Rl
            && self.cfg.loss.unlikelihood > 0.0
            && rows.iter().any(|s| s.unlikelihood.contains(&true)))
        .then(|| shift(&|s| flags(&s.unlikelihood, s.tokens.len())));
        // LUFFY's shaping: every position of an off-policy row (the mask keeps the counted ones).
        let off =
            (mode == Mode::Rl && self.cfg.loss.shaping > 0.0 && rows.iter().any(|s| s.off_policy))
                .then(|| shift(&|s| vec![f32::from(u8::from(s.off_policy)); s.tokens.len()]));
        let ids_t = pad_2d(&ids, 0i64, dev);
        let t = ids_t.size()[1];
        let prefix = shared_prefix(&ids);
        let targets = ids_t.narrow(1, 1, t - 1);
        let inputs = ids_t.narrow(1, 0, t - 1);
        let flat = |t: Tensor| t.reshape([-1]);
        let mask = flat(pad_2d(&mask, 0.0f32, dev));
        let reference = if rl && self.cfg.loss.kl_coef > 0.0 {
            // The frozen copy of a full fine-tune, or the base with adapters off (LoRA). Its
            // head runs on the loss positions only, as the policy's does (`head_backward`):
            // nothing reads the reference elsewhere.
            let refm = self.reference.as_ref().unwrap_or(&self.model);
            Some(tch::no_grad(|| {
                let h = refm.hidden_shared(&inputs, prefix, Fwd::REFERENCE);
                let keep = loss_positions(&mask);
                loss::token_logprobs_at(&h, refm.lm_weight(), &targets, &keep, self.cfg.logit_chunk)
            }))
        } else {
            None
        };
        Ok(Micro {
            ids: inputs,
            prefix,
            targets: flat(targets),
            mask,
            weights: flat(pad_2d(&weights, 0.0f32, dev)),
            adv: flat(pad_2d(&adv, 0.0f32, dev)),
            behaviour: behaviour.map(|b| flat(pad_2d(&b, 0.0f32, dev))),
            reference: reference.map(flat),
            old: old.map(|(vals, usable)| (flat(vals), usable.map(flat))),
            ul: ul.map(|u| flat(pad_2d(&u, 0.0f32, dev))),
            off: off.map(|o| flat(pad_2d(&o, 0.0f32, dev))),
        })
    }

    /// Loss of one chunk from its target log-probs `logp` [c], the micro-batch's positions
    /// s..s+c in row-major order (a leaf; backward is the caller's), accumulating metrics.
    fn chunk_loss(
        &self,
        logp: &Tensor,
        m: &Micro,
        s: i64,
        c: i64,
        mode: Mode,
        sums: &mut Sums,
    ) -> Tensor {
        let mask = m.mask.narrow(0, s, c);
        let w = m.weights.narrow(0, s, c);
        let n = mask.sum(Kind::Float).double_value(&[]);
        sums.tokens += n;
        let per_token = if mode.rl() {
            let own = logp.detach();
            let old = match &m.old {
                None => own,
                Some((vals, None)) => vals.narrow(0, s, c),
                Some((vals, Some(usable))) => vals
                    .narrow(0, s, c)
                    .where_self(&usable.narrow(0, s, c), &own),
            };
            let reference = m.reference.as_ref().map(|r| r.narrow(0, s, c));
            let behaviour = m.behaviour.as_ref().map(|b| b.narrow(0, s, c));
            let off = m.off.as_ref().map(|o| o.narrow(0, s, c));
            let terms = loss::policy_terms(
                logp,
                &old,
                &m.adv.narrow(0, s, c),
                reference.as_ref(),
                behaviour.as_ref(),
                off.as_ref(),
                &self.cfg.loss,
            );
            // Marked tokens also carry coef · −log(1 − p), with their aggregation weight.
            let ul_term = m.ul.as_ref().map(|ul| {
                let ul = ul.narrow(0, s, c);
                let u = loss::unlikelihood(logp);
                tch::no_grad(|| {
                    sums.ul += (&u * &ul).sum(Kind::Float).double_value(&[]);
                    sums.ul_tokens += ul.sum(Kind::Float).double_value(&[]);
                });
                u * ul * self.cfg.loss.unlikelihood
            });
            tch::no_grad(|| {
                let sum = |t: &Tensor| (t * &mask).sum(Kind::Float).double_value(&[]);
                sums.clipped += sum(&terms.clipped);
                sums.kl += sum(&terms.kl3);
                sums.ratio += sum(&terms.ratio);
                sums.tis += sum(&terms.tis);
                if let Some(o) = &off {
                    sums.shaped += sum(o);
                }
                if n > 0.0 {
                    let on = mask.gt(0.0);
                    let sel = terms.tis.masked_select(&on);
                    sums.tis_min = sums.tis_min.min(sel.min().double_value(&[]));
                    sums.tis_max = sums.tis_max.max(sel.max().double_value(&[]));
                }
            });
            match ul_term {
                Some(u) => terms.loss + u,
                None => terms.loss,
            }
        } else {
            -logp
        };
        let l = (per_token * w).sum(Kind::Float);
        sums.loss += l.double_value(&[]);
        l
    }

    /// Head: final norm, then a fused linear + log-softmax + loss per chunk of `logit_chunk`
    /// of the micro-batch's positions that carry a loss mask (rows flattened, so a chunk's
    /// [c, V] size does not grow with the batch). The softmax of a chunk serves the entropy
    /// metric and the analytic gradient dℓ/dlogits = g·(onehot − p), applied without forming it: dℓ/dh = g·(W[y] − p·W)
    /// and dℓ/dW = Σ g·h at the targets' rows − pᵀ·(g·h), so no [c, V] pass beyond the
    /// log-softmax and its exp, which reuses the logits' storage. No [T, V] tensor outlives its
    /// chunk and autograd never stores logits. Gradients reach x (and the norm and lm weights)
    /// in one backward. With the entropy bonus on (Phase B), the dense part of the logits'
    /// gradient also carries e·p⊙(log p + H) and is formed as one [c, V] buffer.
    fn head_backward(&self, x: &Tensor, m: &Micro, mode: Mode, sums: &mut Sums) {
        let h = crate::model::qwen3::rms_norm(x, &self.model.norm, self.model.cfg.rms_norm_eps);
        let w = self.model.lm_weight();
        let size = h.size();
        let hidden = size[2];
        let (hd, wd) = (h.detach().reshape([-1, hidden]), w.detach());
        let all = hd.size()[0];
        // Only positions with a loss mask reach the loss, its gradient or a metric (every term
        // is weighted by the mask), so the head runs on those alone: a prompt, the tool outputs
        // and the padding cost no [c, V] work. Their gradient rows stay zero.
        let keep = loss_positions(&m.mask);
        let n = keep.size()[0];
        let compact = (n < all).then(|| m.select(&keep));
        let (hd, m) = match &compact {
            Some(c) => (hd.index_select(0, &keep), c),
            None => (hd, m),
        };
        let chunk = self.cfg.logit_chunk.max(1);
        // The entropy bonus's per-position coefficient (Phase B with it on): coef · the
        // aggregation weight at the counted positions whose advantage is not 0, so a row the
        // update skips as null (`null_row`) would have taken none.
        let coef = self.cfg.loss.entropy;
        let bonus = (mode == Mode::Rl && coef > 0.0)
            .then(|| &m.weights * m.adv.ne(0.0).to_kind(Kind::Float) * coef);
        let mut grad_h = Vec::new();
        let mut grad_w: Option<Tensor> = None;
        let mut s = 0;
        while s < n {
            let c = chunk.min(n - s);
            let hc = hd.narrow(0, s, c);
            let tc = m.targets.narrow(0, s, c);
            // One fused log-softmax kernel (faster on CPU than logsumexp's separate passes).
            let (logits, logp_all, logp) = tch::no_grad(|| {
                let logits = hc.mm(&wd.tr());
                let logp_all = logits.log_softmax(-1, Kind::Float);
                let logp = logp_all.gather(1, &tc.unsqueeze(1), false).squeeze_dim(1);
                (logits, logp_all, logp)
            });
            let leaf = logp.set_requires_grad(true);
            let l = self.chunk_loss(&leaf, m, s, c, mode, sums);
            if l.requires_grad() {
                l.backward();
            }
            let gl = leaf.grad();
            tch::no_grad(|| {
                let mut p = if logits.kind() == Kind::Float {
                    logp_all.exp_out(&logits)
                } else {
                    logp_all.exp()
                };
                let kind = hc.kind();
                // This chunk's rows of dℓ/dh, its dℓ/dW (when the head's weight trains), and
                // its entropy −Σ p·log p per position.
                let (rows, gw, ent) = match bonus.as_ref().map(|b| b.narrow(0, s, c)) {
                    Some(e) => {
                        // With the entropy bonus −e·H (e = coef · weight where the advantage
                        // is not 0), dℓ/dlogits = g·onehot + dense, dense = e·p⊙(log p + H)
                        // − g·p: one more [c, V] buffer and three in-place passes beyond the
                        // plain path, and the same two matmuls.
                        let mut dense = &p * &logp_all;
                        let ent = -dense.sum_dim_intlist(-1, false, Kind::Float);
                        let g = if gl.defined() {
                            gl.shallow_clone()
                        } else {
                            ent.zeros_like()
                        };
                        dense *= &e.unsqueeze(1);
                        p *= &(&e * &ent - &g).unsqueeze(1);
                        dense += &p;
                        let (gk, dk) = (g.unsqueeze(1).to_kind(kind), dense.to_kind(kind));
                        let rows = wd.index_select(0, &tc) * &gk + dk.mm(&wd);
                        let gw = w.requires_grad().then(|| {
                            let mut gw = dk.tr().mm(&hc);
                            let _ = gw.index_add_(0, &tc, &(&hc * &gk));
                            gw
                        });
                        sums.loss -= (&e * &ent).sum(Kind::Float).double_value(&[]);
                        (rows, gw, ent)
                    }
                    None => {
                        let (rows, gw) = if gl.defined() {
                            let g = gl.unsqueeze(1).to_kind(kind);
                            let pk = p.to_kind(kind);
                            let rows = (wd.index_select(0, &tc) - pk.mm(&wd)) * &g;
                            let gw = w.requires_grad().then(|| {
                                let gh = &hc * &g;
                                let mut gw = pk.tr().mm(&(-&gh));
                                let _ = gw.index_add_(0, &tc, &gh);
                                gw
                            });
                            (rows, gw)
                        } else {
                            (hc.zeros_like(), None)
                        };
                        // The product written over p.
                        let _ = p.f_mul_(&logp_all);
                        (rows, gw, -p.sum_dim_intlist(-1, false, Kind::Float))
                    }
                };
                grad_h.push(rows);
                if let Some(gw) = gw {
                    grad_w = Some(match grad_w.take() {
                        Some(acc) => acc + gw,
                        None => gw,
                    });
                }
                sums.entropy += (ent * m.mask.narrow(0, s, c))
                    .sum(Kind::Float)
                    .double_value(&[]);
            });
            s += c;
        }
        // The kept positions' rows, scattered back among zero rows when some were left out.
        let grad_h = if grad_h.is_empty() {
            h.detach().zeros_like()
        } else {
            let rows = Tensor::cat(&grad_h, 0);
            match compact {
                Some(_) => rows
                    .new_zeros([all, hidden], (rows.kind(), rows.device()))
                    .index_copy(0, &keep, &rows),
                None => rows,
            }
            .view(size.as_slice())
        };
        let mut root = if h.requires_grad() {
            Some((&h * grad_h).sum(Kind::Float))
        } else {
            None
        };
        if let Some(gw) = grad_w {
            let r = (w * gw).sum(Kind::Float);
            root = Some(match root {
                Some(x) => x + r,
                None => r,
            });
        }
        if let Some(r) = root {
            r.backward();
        }
    }

    fn forward_backward(
        &self,
        m: &Micro,
        mode: Mode,
        sums: &mut Sums,
        mut overlap: Option<&mut data_parallel::Overlap<'_>>,
    ) -> Result<()> {
        let model = &self.model;
        let n_layers = model.layers.len();
        // Rows that share their first `p` positions run them once, as one row whose keys and
        // values the rows' own positions attend to (`Qwen3::layers_forward`).
        let (b, t) = (m.ids.size()[0], m.ids.size()[1]);
        let p = shared_positions(b, t, m.prefix);
        sums.shared += (p * (b - 1)) as f64;
        if !self.cfg.grad_checkpoint {
            let x = model.layers_forward(&m.ids, p, Fwd::TRAIN);
            let leaf = x.detach().set_requires_grad(true);
            self.head_backward(&leaf, m, mode, sums);
            let g = leaf.grad();
            if g.defined() && x.requires_grad() {
                (x * g).sum(Kind::Float).backward();
            }
            return Ok(());
        }
        // Pass 1: keep only each layer's input. Dropout is made repeatable per layer by seeding.
        let seed_base = (self.opt.step as i64 + 1) * 1_000_003;
        let dropout = model.lora_dropout();
        let seeded = |l: usize| {
            if dropout {
                let _guard = crate::model::rng_lock();
                tch::manual_seed(seed_base + l as i64);
            }
        };
        // The shared row's input is kept per layer beside the rows'.
        let (shared_ids, own_ids) = split_shared(&m.ids, p);
        let mut inputs = Vec::with_capacity(n_layers + 1);
        let mut shared_inputs = Vec::with_capacity(n_layers + 1);
        tch::no_grad(|| {
            let mut x = model.embed(&own_ids);
            let mut xp = shared_ids.as_ref().map(|i| model.embed(i));
            for l in 0..n_layers {
                inputs.push(x.shallow_clone());
                if let Some(xp) = &xp {
                    shared_inputs.push(xp.shallow_clone());
                }
                seeded(l);
                (xp, x) = model.shared_layer_forward(l, xp.as_ref(), &x, Fwd::TRAIN);
            }
            inputs.push(x);
            shared_inputs.extend(xp);
        });
        // Head over every position, then layers in reverse, each recomputed with grad from its
        // detached input(s).
        let last = join_shared(shared_inputs.last(), &inputs[n_layers]);
        let leaf = last.detach().set_requires_grad(true);
        self.head_backward(&leaf, m, mode, sums);
        let full = leaf.grad();
        if !full.defined() {
            return Ok(());
        }
        // The shared row's gradient is its rows' summed.
        let (mut g, mut gp) = if p > 0 {
            (
                full.narrow(1, p, t - p),
                Some(
                    full.narrow(1, 0, p)
                        .sum_dim_intlist(0, true, Kind::Float)
                        .to_kind(full.kind()),
                ),
            )
        } else {
            (full, None)
        };
        for l in (0..n_layers).rev() {
            if !g.defined() {
                return Ok(());
            }
            let xin = inputs[l].detach().set_requires_grad(true);
            let xpin = shared_inputs
                .get(l)
                .map(|x| x.detach().set_requires_grad(true));
            seeded(l);
            let (yp, y) = model.shared_layer_forward(l, xpin.as_ref(), &xin, Fwd::TRAIN);
            let own = (y * &g).sum(Kind::Float);
            match (yp, &gp) {
                (Some(yp), Some(gp)) => (own + (yp * gp).sum(Kind::Float)).backward(),
                _ => own.backward(),
            }
            if let Some(o) = overlap.as_deref_mut() {
                o.layer_done(l)?;
            }
            g = xin.grad();
            gp = xpin.map(|x| x.grad());
        }
        if g.defined() && model.embed_tokens.requires_grad() {
            let own = (model.embed(&own_ids) * g).sum(Kind::Float);
            match (&shared_ids, &gp) {
                (Some(ids), Some(gp)) => {
                    (own + (model.embed(ids) * gp).sum(Kind::Float)).backward()
                }
                _ => own.backward(),
            }
        }
        Ok(())
    }

    /// vLLM's `prompt_logprobs` of one sequence under the current policy (no grad): for each
    /// position after the first, the token's log-prob (the value `logprobs` gives, so it can
    /// stand as a behaviour log-prob), its 1-based rank in the vocabulary (1 is the argmax) and
    /// the `k` most likely tokens with theirs. A sequence shorter than 2 tokens has none.
    pub fn prompt_logprobs(&self, seq: &[i64], k: i64, f: Fwd) -> Vec<PositionLogprobs> {
        if seq.len() < 2 {
            return Vec::new();
        }
        tch::no_grad(|| {
            let ids = Tensor::from_slice(seq)
                .view([1, -1])
                .to_device(self.model.device);
            let t = seq.len() as i64;
            let targets = ids.narrow(1, 1, t - 1);
            let h = self.model.hidden(&ids.narrow(1, 0, t - 1), f);
            let values =
                loss::token_logprobs(&h, self.model.lm_weight(), &targets, self.cfg.logit_chunk);
            let values =
                Vec::<f32>::try_from(values.view([-1]).to_kind(Kind::Float)).unwrap_or_default();
            // [T-1, V] log-softmax for ranks and the top k.
            let full = h
                .matmul(&self.model.lm_weight().tr())
                .to_kind(Kind::Float)
                .log_softmax(-1, Kind::Float)
                .squeeze_dim(0);
            let own = full.gather(1, &targets.view([-1, 1]), false);
            let ranks = Vec::<i64>::try_from(
                full.gt_tensor(&own).sum_dim_intlist(1, false, Kind::Int64) + 1,
            )
            .unwrap_or_default();
            let k = k.clamp(0, full.size()[1]);
            let (top_v, top_i) = if k > 0 {
                let (v, i) = full.topk(k, -1, true, true);
                (
                    Vec::<f32>::try_from(v.reshape([-1])).unwrap_or_default(),
                    Vec::<i64>::try_from(i.reshape([-1])).unwrap_or_default(),
                )
            } else {
                (Vec::new(), Vec::new())
            };
            let k = k as usize;
            values
                .iter()
                .zip(&ranks)
                .enumerate()
                .map(|(p, (&logprob, &rank))| PositionLogprobs {
                    token: seq[p + 1] as u32,
                    logprob,
                    rank,
                    top: (p * k..(p + 1) * k)
                        .filter_map(|j| Some((u32::try_from(*top_i.get(j)?).ok()?, *top_v.get(j)?)))
                        .collect(),
                })
                .collect()
        })
    }

    /// Per-token log-probs of every sequence under the current policy (no grad), aligned like
    /// `Sequence::tokens` (entry 0 is 0).
    pub fn logprobs(&self, seqs: &[Vec<i64>], f: Fwd) -> Vec<Vec<f32>> {
        tch::no_grad(|| {
            seqs.iter()
                .map(|s| {
                    if s.len() < 2 {
                        return vec![0.0; s.len()];
                    }
                    let ids = Tensor::from_slice(s)
                        .view([1, -1])
                        .to_device(self.model.device);
                    let t = s.len() as i64;
                    let h = self.model.hidden(&ids.narrow(1, 0, t - 1), f);
                    let lp = loss::token_logprobs(
                        &h,
                        self.model.lm_weight(),
                        &ids.narrow(1, 1, t - 1),
                        self.cfg.logit_chunk,
                    );
                    let mut out = vec![0.0f32];
                    out.extend(
                        Vec::<f32>::try_from(lp.view([-1]).to_kind(Kind::Float))
                            .unwrap_or_default(),
                    );
                    out
                })
                .collect()
        })
    }
}
