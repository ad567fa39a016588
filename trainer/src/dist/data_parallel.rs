//! Data parallelism over a [`Collective`]: rank 0 splits a batch's sequences across ranks
//! balanced by tokens and hands each rank its part through the control plane; after backward,
//! gradients are summed across ranks in flat buckets (each rank's loss is already weighted by
//! the GLOBAL token and sequence counts, so the sum is the one-process gradient).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use super::{Collective, DistError, ReduceOp, Result, Work};
use crate::sequence::Sequence;

/// Which step a command runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// Phase B RL step (SS-GRPO / GRPO), minibatches included.
    Rl,
    /// Phase A reflection update.
    Reflection,
    /// Masked cross-entropy.
    Sft,
}

/// One optimizer update's share for one rank: its sequences, and the whole update's totals the
/// loss weights come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Part {
    pub seqs: Vec<Sequence>,
    /// Counted (loss-mask) tokens of the whole update, over every rank.
    pub total_tokens: usize,
    /// Sequences with at least one counted token, over every rank.
    pub counted_seqs: usize,
    /// Sequences of the whole update, over every rank.
    pub sequences: usize,
}

/// What rank 0 sends each rank for one step: the kind, and one [`Part`] per optimizer update;
/// or, between steps, a [`Control`] every rank applies to its own copy of the policy (then
/// `kind` and `parts` are ignored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Command {
    pub kind: StepKind,
    pub parts: Vec<Part>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<Control>,
}

/// A change of the policy that rank 0 makes outside a step and every other rank must repeat,
/// in the same place of the command sequence, to keep its copy identical.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Control {
    /// Rebuild the policy from the model directory (`None`) or a checkpoint directory
    /// (`POST /v1/restore`; the path as every rank of the node sees it).
    Restore {
        checkpoint: Option<std::path::PathBuf>,
    },
    /// Apply these training settings (`POST /v1/settings`; wire `TrainSettings` as JSON).
    Settings { settings: serde_json::Value },
    /// Write this rank's ZeRO optimizer shard into `dir` (a checkpoint being built) and set
    /// `done/RANK` under `key` to `ok` or the error.
    SaveShard {
        dir: std::path::PathBuf,
        key: String,
    },
}

/// Split sequences of token counts `lens` into `world` groups of near-equal token totals
/// (longest first, each to the least-loaded rank; ties to the lower rank and index). Groups
/// keep the batch order; a group is empty only when there are fewer sequences than ranks.
pub fn partition_by_tokens(lens: &[usize], world: usize) -> Vec<Vec<usize>> {
    let world = world.max(1);
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(lens[i]), i));
    let mut load = vec![0usize; world];
    let mut out = vec![Vec::new(); world];
    for i in order {
        let r = (0..world).min_by_key(|&r| (load[r], r)).unwrap_or(0);
        load[r] += lens[i];
        out[r].push(i);
    }
    for g in &mut out {
        g.sort_unstable();
    }
    out
}

/// The commands for every rank (index = rank) of a step over `seqs`, whose optimizer updates
/// are the contiguous `ranges` (one for SFT, reflection and a one-minibatch RL step). Each
/// update's rows are shared out by `cost` (a row's tokens; 1 for a row the step will skip, so
/// the work each rank does is what is balanced).
pub fn plan(
    kind: StepKind,
    seqs: &[Sequence],
    ranges: &[std::ops::Range<usize>],
    world: usize,
    cost: impl Fn(&Sequence) -> usize,
) -> Vec<Command> {
    let mut cmds: Vec<Command> = (0..world.max(1))
        .map(|_| Command {
            kind,
            parts: Vec::with_capacity(ranges.len()),
            control: None,
        })
        .collect();
    for r in ranges {
        let part = &seqs[r.clone()];
        let total_tokens = part
            .iter()
            .map(|s| s.loss_mask.iter().filter(|&&m| m).count())
            .sum();
        let counted_seqs = part
            .iter()
            .filter(|s| s.loss_mask.iter().any(|&m| m))
            .count();
        let lens: Vec<usize> = part.iter().map(&cost).collect();
        for (cmd, idx) in cmds.iter_mut().zip(partition_by_tokens(&lens, world)) {
            cmd.parts.push(Part {
                seqs: idx.iter().map(|&i| part[i].clone()).collect(),
                total_tokens,
                counted_seqs,
                sequences: part.len(),
            });
        }
    }
    cmds
}

fn step_key(step: u64, rank: usize) -> String {
    format!("step/{step}/rank/{rank}")
}

/// Rank 0: publish `cmds[r]` for every rank r > 0 as the group's next command; rank 0's own.
pub fn publish(coll: &dyn Collective, mut cmds: Vec<Command>) -> Result<Command> {
    let invalid = |message: String| DistError::Invalid {
        rank: coll.rank(),
        op: "publish step",
        message,
    };
    if cmds.len() != coll.world() {
        return Err(invalid(format!(
            "{} commands for {} ranks",
            cmds.len(),
            coll.world()
        )));
    }
    let step = coll.commands().fetch_add(1, Ordering::SeqCst);
    for (r, cmd) in cmds.iter().enumerate().skip(1) {
        let bytes = serde_json::to_vec(cmd).map_err(|e| invalid(e.to_string()))?;
        coll.set(&step_key(step, r), &bytes)?;
    }
    Ok(cmds.swap_remove(0))
}

/// Rank 0: publish `control` to every other rank as the group's next command.
pub fn publish_control(coll: &dyn Collective, control: Control) -> Result<()> {
    let cmd = Command {
        kind: StepKind::Sft,
        parts: Vec::new(),
        control: Some(control),
    };
    publish(coll, vec![cmd; coll.world()]).map(|_| ())
}

/// A follower: wait up to `timeout` for this rank's part of the group's next command, and
/// consume it. After a timeout the same command is waited for again.
pub fn receive(coll: &dyn Collective, timeout: Duration) -> Result<Command> {
    let key = step_key(coll.commands().load(Ordering::SeqCst), coll.rank());
    let bytes = coll.get(&key, timeout)?;
    coll.delete(&key)?;
    coll.commands().fetch_add(1, Ordering::SeqCst);
    serde_json::from_slice(&bytes).map_err(|e| DistError::Invalid {
        rank: coll.rank(),
        op: "receive step",
        message: format!("undecodable command: {e}"),
    })
}

fn fatal_key(rank: usize) -> String {
    format!("fatal/rank/{rank}")
}

/// A follower whose share of a step failed: leave the reason where rank 0 looks for it, so the
/// step's error names the rank and the cause rather than only rank 0's side of a broken
/// collective. Best effort (a dead store loses the report, not the error).
pub fn report_fatal(coll: &dyn Collective, message: &str) {
    let key = fatal_key(coll.rank());
    if let Err(e) = coll.set(&key, message.as_bytes()) {
        tracing::warn!(error = %e, "could not report this rank's failure to the group");
    }
}

/// The first failure another rank reported within `wait` (and consume it): (rank, reason).
pub fn peer_failure(coll: &dyn Collective, wait: Duration) -> Option<(usize, String)> {
    let deadline = Instant::now() + wait;
    loop {
        for r in (0..coll.world()).filter(|&r| r != coll.rank()) {
            let key = fatal_key(r);
            if let Ok(bytes) = coll.get(&key, Duration::from_millis(10)) {
                let _ = coll.delete(&key);
                return Some((r, String::from_utf8_lossy(&bytes).into_owned()));
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Give every parameter without a gradient a zero one, so every rank hands the same tensors
/// to the gradient collectives whatever its backward reached (or an empty shard).
pub fn ensure_grads(coll: &dyn Collective, params: &mut [Tensor]) -> Result<()> {
    for p in params.iter_mut() {
        if !p.grad().defined() {
            let zeros = p.zeros_like();
            super::ffi::set_grad(p, &zeros).map_err(|message| DistError::Invalid {
                rank: coll.rank(),
                op: "set_grad",
                message,
            })?;
        }
    }
    Ok(())
}

/// What one gradient synchronisation did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SyncStats {
    pub collectives: usize,
    pub elements: usize,
    /// Wall time from the first launch to the last wait.
    pub seconds: f64,
}

/// Sum every parameter's gradient across ranks, in place. Gradients are packed into flat fp32
/// buckets of at most `bucket_elems` elements (a larger tensor is a bucket of its own; 0: one
/// collective per tensor), all launched before any is waited on. Summing in fp32 keeps bf16
/// gradients from losing precision across ranks. Every rank must pass the same parameter list
/// (with [`ensure_grads`] applied).
pub fn sync_grads(
    coll: &dyn Collective,
    params: &[Tensor],
    bucket_elems: usize,
) -> Result<SyncStats> {
    let t0 = Instant::now();
    let mut stats = SyncStats::default();
    if coll.world() == 1 {
        return Ok(stats);
    }
    let grads: Vec<Tensor> = params.iter().map(Tensor::grad).collect();
    if let Some(i) = grads.iter().position(|g| !g.defined()) {
        return Err(DistError::Invalid {
            rank: coll.rank(),
            op: "all_reduce",
            message: format!("parameter {i} has no gradient (ensure_grads first)"),
        });
    }
    // Buckets of consecutive parameters.
    let mut buckets: Vec<std::ops::Range<usize>> = Vec::new();
    let mut start = 0;
    let mut elems = 0usize;
    for (i, g) in grads.iter().enumerate() {
        let n = g.numel();
        if i > start && (bucket_elems == 0 || elems + n > bucket_elems) {
            buckets.push(start..i);
            start = i;
            elems = 0;
        }
        elems += n;
    }
    if start < grads.len() {
        buckets.push(start..grads.len());
    }
    let mut flats: Vec<(std::ops::Range<usize>, Tensor, Work)> = Vec::with_capacity(buckets.len());
    tch::no_grad(|| -> Result<()> {
        for b in buckets {
            let parts: Vec<Tensor> = grads[b.clone()]
                .iter()
                .map(|g| g.to_kind(Kind::Float).reshape([-1]))
                .collect();
            let mut flat = Tensor::cat(&parts, 0);
            stats.elements += flat.numel();
            let work = coll.all_reduce(&mut flat, ReduceOp::Sum)?;
            stats.collectives += 1;
            flats.push((b, flat, work));
        }
        for (b, flat, work) in flats {
            work.wait()?;
            let mut off = 0i64;
            for g in &grads[b] {
                let n = g.numel() as i64;
                let mut g = g.shallow_clone();
                g.copy_(&flat.narrow(0, off, n).view_as(&g));
                off += n;
            }
        }
        Ok(())
    })?;
    stats.seconds = t0.elapsed().as_secs_f64();
    Ok(stats)
}

/// Gradient all-reduce overlapped with backward. Under gradient checkpointing backward runs one
/// decoder layer at a time, last layer first; once the last micro-batch's backward has passed a
/// layer, that layer's gradients are final, so its bucket is reduced (asynchronously, on the
/// backend's own threads) while the earlier layers' backward runs. Buckets: one per decoder
/// layer (parameters named `...layers.L.`), then one for everything else (embeddings, final
/// norm, head), launched in descending layer order on every rank: a rank whose backward ended
/// early (no gradient reached a layer) launches the rest in the same order in
/// [`Overlap::finish`].
pub struct Overlap<'a> {
    coll: &'a dyn Collective,
    params: Vec<Tensor>,
    layers: Vec<Vec<usize>>,
    rest: Vec<usize>,
    launched: Vec<bool>,
    pending: Vec<(Vec<usize>, Tensor, Work)>,
    first: Option<Instant>,
    stats: SyncStats,
}

impl<'a> Overlap<'a> {
    /// Over `params` (shallow clones, with gradients: [`ensure_grads`] first) named `names`, in
    /// a model of `n_layers` decoder layers.
    pub fn new(
        coll: &'a dyn Collective,
        names: &[String],
        params: &[Tensor],
        n_layers: usize,
    ) -> Self {
        let mut layers = vec![Vec::new(); n_layers];
        let mut rest = Vec::new();
        for (i, n) in names.iter().enumerate() {
            // `model.layers.L.` (and adapters' `base_model.model.model.layers.L.`).
            let layer = n
                .find("layers.")
                .and_then(|at| n[at + "layers.".len()..].split('.').next())
                .and_then(|l| l.parse::<usize>().ok())
                .filter(|&l| l < n_layers);
            match layer {
                Some(l) => layers[l].push(i),
                None => rest.push(i),
            }
        }
        Self {
            coll,
            params: params.iter().map(Tensor::shallow_clone).collect(),
            layers,
            rest,
            launched: vec![false; n_layers],
            pending: Vec::new(),
            first: None,
            stats: SyncStats::default(),
        }
    }

    /// Layer `l`'s backward is complete for the step: reduce its bucket now.
    pub fn layer_done(&mut self, l: usize) -> Result<()> {
        if l < self.launched.len() && !self.launched[l] {
            self.launched[l] = true;
            let idx = std::mem::take(&mut self.layers[l]);
            self.launch(idx)?;
        }
        Ok(())
    }

    fn launch(&mut self, idx: Vec<usize>) -> Result<()> {
        if idx.is_empty() {
            return Ok(());
        }
        self.first.get_or_insert_with(Instant::now);
        let mut flat = tch::no_grad(|| {
            let parts: Vec<Tensor> = idx
                .iter()
                .map(|&i| self.params[i].grad().to_kind(Kind::Float).reshape([-1]))
                .collect();
            Tensor::cat(&parts, 0)
        });
        self.stats.elements += flat.numel();
        let work = self.coll.all_reduce(&mut flat, ReduceOp::Sum)?;
        self.stats.collectives += 1;
        self.pending.push((idx, flat, work));
        Ok(())
    }

    /// Launch every bucket not launched yet (layers in descending order, then the rest), wait
    /// for all and write the sums back into the gradients.
    pub fn finish(mut self) -> Result<SyncStats> {
        for l in (0..self.launched.len()).rev() {
            self.layer_done(l)?;
        }
        let rest = std::mem::take(&mut self.rest);
        self.launch(rest)?;
        tch::no_grad(|| -> Result<()> {
            for (idx, flat, work) in std::mem::take(&mut self.pending) {
                work.wait()?;
                let mut off = 0i64;
                for i in idx {
                    let mut g = self.params[i].grad();
                    let n = g.numel() as i64;
                    g.copy_(&flat.narrow(0, off, n).view_as(&g));
                    off += n;
                }
            }
            Ok(())
        })?;
        self.stats.seconds = self.first.map_or(0.0, |t| t.elapsed().as_secs_f64());
        Ok(self.stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_balances_tokens_and_keeps_order() {
        let lens = [40, 7, 12, 30, 9, 25];
        let parts = partition_by_tokens(&lens, 2);
        let load: Vec<usize> = parts
            .iter()
            .map(|p| p.iter().map(|&i| lens[i]).sum())
            .collect();
        assert_eq!(load.iter().sum::<usize>(), 123);
        assert!(load[0].abs_diff(load[1]) <= 7, "{load:?}");
        assert!(parts.iter().all(|p| p.windows(2).all(|w| w[0] < w[1])));
        // Fewer sequences than ranks: the rest get none.
        assert_eq!(partition_by_tokens(&[5], 3), vec![vec![0], vec![], vec![]]);
        assert_eq!(
            partition_by_tokens(&[], 2),
            vec![Vec::<usize>::new(), vec![]]
        );
    }
}
