//! `trainer sft`: supervised warm start on scaffold trajectories written by
//! `orchestrator sft-data` (ChatML JSONL: `messages` for the prompt, `segments` for the assistant
//! turn with tool outputs marked). The prompt is rendered with the model's chat template; each
//! segment is tokenised on its own, exactly as rollouts append them; only model segments and the
//! closing end-of-turn token count in the loss. The result is a model directory that
//! `trainer serve` loads unchanged.
//!
//! `--copy-rows N` adds (or, without `--data`, is) the copying exercise a model trained from
//! random weights needs before it can imitate research: N sequences of random ordinary tokens
//! in which a random span comes back after a random distance, the loss on its second copy
//! only, so the one way to predict it is to find the first by its content and copy (the
//! induction-head task of Olsson et al., 2022). The papers' policy starts from pretrained
//! weights that copy; the smoke model must learn it here (issue 25).
//!
//! `--save-every N` makes a run resumable: every N steps the weights, the AdamW state and the
//! step are written to `OUT.resume/` (a checkpoint directory, the latest kept), and a run of
//! the same command that finds one continues from it exactly (the same rows in the same order:
//! the copy rows and every epoch's shuffle replay from the seed). `--stop-after N` ends an
//! invocation after N steps with such a checkpoint, without writing OUT. A checkpoint written
//! by another run (other data, seed, batch, schedule...) is refused, naming what differs.

use std::path::{Path, PathBuf};

use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainerError};
use crate::model::Qwen3;
use crate::train::{Sequence, TrainConfig, Trainer};

#[derive(Debug, Clone, Deserialize)]
pub struct SftMessage {
    pub role: String,
    pub content: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SftSegment {
    /// `model` (trained on) or `tool_output` / `injected` (context only).
    pub kind: String,
    pub text: String,
}

/// One row of the SFT file.
#[derive(Debug, Clone, Deserialize)]
pub struct SftRow {
    #[serde(default)]
    pub id: String,
    /// The system and user messages (an assistant message, if present, is the ChatML view of
    /// the segments and is not used for tokenisation).
    pub messages: Vec<SftMessage>,
    pub segments: Vec<SftSegment>,
}

#[derive(Debug, Clone)]
pub struct SftOptions {
    /// The SFT JSONL file (optional when `copy_rows` > 0).
    pub data: Option<PathBuf>,
    /// Synthetic copy sequences mixed into the rows (0: none).
    pub copy_rows: usize,
    /// Longest span a copy sequence repeats (spans are `copy_length / 2 ..= copy_length`).
    pub copy_length: usize,
    pub model_dir: PathBuf,
    pub out: PathBuf,
    pub epochs: usize,
    /// Sequences per optimizer step.
    pub batch: usize,
    /// Longer sequences are dropped (with a count in the report).
    pub max_len: usize,
    pub train: TrainConfig,
    pub device: tch::Device,
    /// Parameter dtype; `None`: [`crate::default_kind`] of the device.
    pub kind: Option<tch::Kind>,
    pub seed: u64,
    /// Ranks on this machine (`--nproc-per-node`); the binary launches them.
    pub nproc_per_node: usize,
    /// Every collective's limit.
    pub dist_timeout: std::time::Duration,
    /// Cosine decay to a tenth of the peak learning rate at the last step; otherwise the
    /// learning rate is constant. Either starts with `warmup_steps` of linear warm-up.
    pub cosine: bool,
    pub warmup_steps: u64,
    /// Write a resumable checkpoint to `OUT.resume/` every this many steps (0: never).
    pub save_every: usize,
    /// Stop this invocation after this many steps, leaving a checkpoint, without writing OUT.
    pub stop_after: Option<usize>,
}

/// The fraction of the peak learning rate the cosine schedule ends at.
pub const COSINE_MIN_RATIO: f64 = 0.1;

#[derive(Debug, Clone, Serialize)]
pub struct SftReport {
    pub rows: usize,
    /// Synthetic copy sequences trained on besides the rows.
    pub copy_rows: usize,
    pub dropped_too_long: usize,
    pub steps: usize,
    pub tokens: usize,
    pub trained_tokens: usize,
    pub first_loss: f64,
    pub last_loss: f64,
    pub seconds: f64,
    pub out: PathBuf,
    /// The step a resumed run continued from (`tokens`, `trained_tokens` and the losses count
    /// this invocation's steps only; `steps` is the run's position).
    pub resumed_from: Option<usize>,
    /// The run stopped at `--stop-after` with a checkpoint in `OUT.resume/`; OUT is not written.
    pub stopped: bool,
    /// This process's rank (0 when alone); only rank 0 writes `out` and reports.
    #[serde(skip)]
    pub rank: usize,
}

/// Tokenise one row: (token ids, loss mask).
pub fn tokenize_row(
    row: &SftRow,
    tokenizer: &tokenizers::Tokenizer,
    template: &str,
    line: usize,
) -> Result<(Vec<i64>, Vec<bool>)> {
    let bad = |m: String| TrainerError::Batch(format!("SFT row {line} ({}): {m}", row.id));
    let prompt_msgs: Vec<(&str, &str)> = row
        .messages
        .iter()
        .filter(|m| m.role != "assistant")
        .map(|m| (m.role.as_str(), m.content.as_str()))
        .collect();
    if prompt_msgs.is_empty() {
        return Err(bad("no system or user message".into()));
    }
    if !row.segments.iter().any(|s| s.kind == "model") {
        return Err(bad("no model segment to learn from".into()));
    }
    let prompt = crate::chat::render(template, &prompt_msgs, true)
        .map_err(|e| bad(format!("chat template: {e}")))?;
    let enc = |text: &str| -> Result<Vec<i64>> {
        tokenizer
            .encode(text, false)
            .map(|e| e.get_ids().iter().map(|&i| i64::from(i)).collect())
            .map_err(|e| bad(format!("tokenizer: {e}")))
    };
    let mut ids = enc(&prompt)?;
    let mut mask = vec![false; ids.len()];
    for s in &row.segments {
        let train = match s.kind.as_str() {
            "model" => true,
            "tool_output" | "injected" => false,
            other => {
                return Err(bad(format!(
                    "segment kind {other:?}; allowed: model, tool_output, injected"
                )));
            }
        };
        let t = enc(&s.text)?;
        mask.extend(std::iter::repeat_n(train, t.len()));
        ids.extend(t);
    }
    let end = tokenizer
        .token_to_id("<|im_end|>")
        .ok_or_else(|| bad("the tokenizer has no <|im_end|>".into()))?;
    ids.push(i64::from(end));
    mask.push(true);
    Ok((ids, mask))
}

/// Read and tokenise the whole file; errors name the line.
pub fn load_rows(
    path: &Path,
    tokenizer: &tokenizers::Tokenizer,
    template: &str,
) -> Result<Vec<(Vec<i64>, Vec<bool>)>> {
    let text = std::fs::read_to_string(path).map_err(TrainerError::io(path))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let row: SftRow = serde_json::from_str(line)
            .map_err(|e| TrainerError::Batch(format!("{} line {}: {e}", path.display(), i + 1)))?;
        out.push(tokenize_row(&row, tokenizer, template, i + 1)?);
    }
    Ok(out)
}

/// `n` copy sequences over `ids`: random noise, a random span X of `length / 2 ..= length`
/// tokens, more noise (`0 ..= length` tokens), then X again. Only the second X is a target, and
/// not its first token (nothing before it predicts it), so the loss rewards exactly finding the
/// earlier X by its content and copying what followed. The distance between the copies varies
/// from row to row: with a fixed distance a model learns to read a fixed offset back instead,
/// which copies nothing in real text (measured in BENCHMARKS.md, issue 25, session 15).
pub fn copy_sequences(
    n: usize,
    length: usize,
    ids: &[i64],
    rng: &mut impl rand::Rng,
) -> Vec<Sequence> {
    fn draw(k: usize, ids: &[i64], rng: &mut impl rand::Rng) -> Vec<i64> {
        (0..k)
            .map(|_| ids[rng.random_range(0..ids.len())])
            .collect()
    }
    (0..n)
        .map(|_| {
            let span = rng.random_range(length.div_ceil(2).max(2)..=length.max(2));
            let lead = rng.random_range(0..=length / 2);
            let gap = rng.random_range(0..=length);
            let x = draw(span, ids, rng);
            let mut tokens = draw(lead, ids, rng);
            tokens.extend_from_slice(&x);
            tokens.extend(draw(gap, ids, rng));
            let start = tokens.len();
            tokens.extend_from_slice(&x);
            let loss_mask = (0..tokens.len()).map(|i| i > start).collect();
            Sequence::supervised(tokens, loss_mask)
        })
        .collect()
}

/// The tokenizer's ordinary tokens (no added or special token), sorted: what copy sequences
/// draw from.
pub fn ordinary_ids(tokenizer: &tokenizers::Tokenizer) -> Vec<i64> {
    let mut ids: Vec<i64> = tokenizer
        .get_vocab(false)
        .into_values()
        .map(i64::from)
        .collect();
    let added = tokenizer.get_added_tokens_decoder();
    ids.retain(|i| !added.contains_key(&(*i as u32)));
    ids.sort_unstable();
    ids
}

/// Where a run writing `out` keeps its resumable checkpoints: `OUT.resume` beside it.
pub fn resume_dir(out: &Path) -> PathBuf {
    let mut name = out
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".resume");
    out.with_file_name(name)
}

/// What must be equal for a checkpoint to continue a run: everything that decides the rows,
/// their order and the optimizer's course. Written as `sft.json` in each checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct RunKey {
    model: String,
    /// FNV-1a over every kept sequence's tokens and loss mask, in file order, before the copy
    /// rows (which the seed decides).
    data: String,
    sequences: usize,
    copy_rows: usize,
    copy_length: usize,
    epochs: usize,
    batch: usize,
    seed: u64,
    lr: f64,
    weight_decay: f64,
    cosine: bool,
    warmup_steps: u64,
    total_steps: usize,
}

impl RunKey {
    /// The first field where `self` (this run) and `saved` differ, as
    /// "name = VALUE here, VALUE in the checkpoint".
    fn difference(&self, saved: &RunKey) -> Option<String> {
        let a = serde_json::to_value(self).unwrap_or_default();
        let b = serde_json::to_value(saved).unwrap_or_default();
        let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
            return Some("unreadable".into());
        };
        a.iter().find(|(k, v)| b.get(*k) != Some(*v)).map(|(k, v)| {
            format!(
                "{k} = {v} here, {} in the checkpoint",
                b.get(k).unwrap_or(&serde_json::Value::Null)
            )
        })
    }
}

fn fnv1a(seqs: &[Sequence]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |x: u64| {
        for b in x.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for s in seqs {
        eat(s.tokens.len() as u64);
        for (&t, &m) in s.tokens.iter().zip(&s.loss_mask) {
            eat(t as u64);
            eat(u64::from(m));
        }
    }
    format!("{h:016x}")
}

/// The checkpoint to continue from, if `root` holds one; an error when it belongs to another
/// run.
fn find_resume(root: &Path, key: &RunKey) -> Result<Option<(PathBuf, usize)>> {
    crate::checkpoint::clean_partial(root);
    let Some(dir) = crate::checkpoint::latest(root)? else {
        return Ok(None);
    };
    let p = dir.join("sft.json");
    let text = std::fs::read_to_string(&p).map_err(TrainerError::io(&p))?;
    let saved: RunKey = serde_json::from_str(&text).map_err(TrainerError::json(&p))?;
    if let Some(d) = key.difference(&saved) {
        return Err(TrainerError::Config(format!(
            "{} was written by another run ({d}); remove {} to start over, or rerun the command \
             that wrote it",
            dir.display(),
            root.display()
        )));
    }
    let step = crate::checkpoint::read_state(&dir)?.step as usize;
    Ok(Some((dir, step)))
}

/// Write the checkpoint of step `step` into `root` and remove the older ones.
fn save_resume(root: &Path, trainer: &Trainer, key: &RunKey, step: usize) -> Result<()> {
    let state = crate::checkpoint::CheckpointState {
        step: step as u64,
        policy_version: 0,
        seed: key.seed as i64,
        mode: "full".into(),
        base: key.model.clone(),
        dtype: crate::dtype_name(trainer.model.kind).into(),
    };
    let dir = crate::checkpoint::save_with(root, trainer, None, &state, |tmp| {
        trainer.opt.save(tmp)?;
        let p = tmp.join("sft.json");
        let text = serde_json::to_string_pretty(key).map_err(TrainerError::json(&p))?;
        std::fs::write(&p, text).map_err(TrainerError::io(&p))
    })?;
    if let Ok(rd) = std::fs::read_dir(root) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with("step-") && e.path() != dir {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    tracing::info!(step, checkpoint = %dir.display(), "sft checkpoint");
    Ok(())
}

/// Full-weight SFT of the model directory; writes a servable model directory to `out`.
pub fn run(opts: &SftOptions) -> Result<SftReport> {
    if opts.epochs == 0 || opts.batch == 0 {
        return Err(TrainerError::Config(format!(
            "--epochs = {} and --batch = {}; both must be >= 1",
            opts.epochs, opts.batch
        )));
    }
    if opts.data.is_none() && opts.copy_rows == 0 {
        return Err(TrainerError::Config(
            "nothing to train on: give --data, --copy-rows N (N >= 1), or both".into(),
        ));
    }
    if opts.stop_after == Some(0) {
        return Err(TrainerError::Config(
            "--stop-after = 0; allowed: 1 or more steps (leave it out to run to the end)".into(),
        ));
    }
    if opts.copy_rows > 0 && opts.copy_length < 2 {
        return Err(TrainerError::Config(format!(
            "--copy-length = {}; allowed: 2 or more",
            opts.copy_length
        )));
    }
    let t0 = std::time::Instant::now();
    let dir = &opts.model_dir;
    let tok_path = dir.join("tokenizer.json");
    let tokenizer = tokenizers::Tokenizer::from_file(&tok_path)
        .map_err(|e| TrainerError::Tokenizer(format!("{}: {e}", tok_path.display())))?;
    let cfg_path = dir.join("tokenizer_config.json");
    let template = std::fs::read_to_string(&cfg_path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["chat_template"].as_str().map(str::to_string))
        .ok_or_else(|| {
            TrainerError::Config(format!("{} has no chat_template", cfg_path.display()))
        })?;
    let all = match &opts.data {
        Some(path) => load_rows(path, &tokenizer, &template)?,
        None => Vec::new(),
    };
    let rows = all.len();
    let mut kept: Vec<Sequence> = all
        .into_iter()
        .filter(|(ids, _)| ids.len() <= opts.max_len)
        .map(|(tokens, loss_mask)| Sequence::supervised(tokens, loss_mask))
        .collect();
    let dropped = rows - kept.len();
    if let (Some(path), true) = (&opts.data, kept.is_empty()) {
        return Err(TrainerError::Batch(format!(
            "{}: none of {rows} rows fits --max-len = {}",
            path.display(),
            opts.max_len
        )));
    }
    let data_hash = fnv1a(&kept);
    let data_sequences = kept.len();
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed);
    if opts.copy_rows > 0 {
        let ids = ordinary_ids(&tokenizer);
        if ids.is_empty() {
            return Err(TrainerError::Tokenizer(format!(
                "{}: no ordinary token to draw copy sequences from",
                tok_path.display()
            )));
        }
        kept.extend(copy_sequences(
            opts.copy_rows,
            opts.copy_length,
            &ids,
            &mut rng,
        ));
    }
    // Under a launcher (WORLD_SIZE set) every rank reads the same rows and shuffles them with
    // the same seed; rank 0 leads each step (splitting the batch by tokens), the others follow.
    let env = crate::dist::DistEnv::from_env()?.filter(|e| e.world > 1);
    let device = env.as_ref().map_or(opts.device, |e| e.device(opts.device));
    let kind = opts.kind.unwrap_or_else(|| crate::default_kind(device));
    let total_steps = opts.epochs * kept.len().div_ceil(opts.batch);
    let key = RunKey {
        model: dir.display().to_string(),
        data: data_hash,
        sequences: data_sequences,
        copy_rows: opts.copy_rows,
        copy_length: opts.copy_length,
        epochs: opts.epochs,
        batch: opts.batch,
        seed: opts.seed,
        lr: opts.train.optim.lr,
        weight_decay: opts.train.optim.weight_decay,
        cosine: opts.cosine,
        warmup_steps: opts.warmup_steps,
        total_steps,
    };
    let resume_root = resume_dir(&opts.out);
    // Every rank reads the same checkpoint (one machine, or a shared file system).
    let resume = find_resume(&resume_root, &key)?;
    let model = Qwen3::load(
        resume.as_ref().map_or(dir.as_path(), |r| &r.0),
        device,
        kind,
    )?;
    model.set_trainable(true);
    let mut train = opts.train.clone();
    if opts.cosine {
        train.optim.schedule = crate::optim::Schedule::Cosine {
            warmup: opts.warmup_steps,
            total: total_steps as u64,
            min_ratio: COSINE_MIN_RATIO,
        };
    } else if opts.warmup_steps > 0 {
        train.optim.schedule = crate::optim::Schedule::Warmup {
            steps: opts.warmup_steps,
        };
    }
    let mut trainer = Trainer::new(model, train)?;
    let resumed_from = match &resume {
        Some((ck, step)) => {
            trainer.opt.load(ck)?;
            tracing::info!(step, checkpoint = %ck.display(), "sft resumes");
            Some(*step)
        }
        None => None,
    };
    let mut rank = 0;
    if let Some(env) = &env {
        trainer.set_collective(Box::new(env.join(device, None, opts.dist_timeout)?));
        rank = env.rank;
    }
    let mut order: Vec<usize> = (0..kept.len()).collect();
    let (mut steps, mut tokens, mut trained) = (0usize, 0usize, 0usize);
    let (mut first, mut last) = (f64::NAN, f64::NAN);
    let start = resumed_from.unwrap_or(0);
    let mut taken = 0usize;
    let mut stopped = false;
    'epochs: for epoch in 0..opts.epochs {
        // Every epoch's shuffle is drawn, also those a resumed run skips, so the order is the
        // uninterrupted run's.
        order.shuffle(&mut rng);
        for chunk in order.chunks(opts.batch) {
            if steps < start {
                steps += 1;
                continue;
            }
            if opts.stop_after == Some(taken) {
                stopped = true;
                break 'epochs;
            }
            let batch: Vec<Sequence> = chunk.iter().map(|&i| kept[i].clone()).collect();
            tokens += batch.iter().map(|s| s.tokens.len()).sum::<usize>();
            trained += batch
                .iter()
                .map(|s| s.loss_mask.iter().filter(|&&m| m).count())
                .sum::<usize>();
            let m = if rank == 0 {
                trainer.sft_step(&batch)?
            } else {
                trainer.follow_step(opts.dist_timeout)?
            };
            if taken == 0 {
                first = m.loss;
            }
            last = m.loss;
            steps += 1;
            taken += 1;
            let stop_next = opts.stop_after == Some(taken) && steps < total_steps;
            let periodic = opts.save_every > 0 && steps % opts.save_every == 0;
            if rank == 0 && steps < total_steps && (periodic || stop_next) {
                save_resume(&resume_root, &trainer, &key, steps)?;
            }
            if steps % 10 == 0 || steps == total_steps {
                tracing::info!(
                    epoch,
                    step = steps,
                    of = total_steps,
                    loss = m.loss,
                    seconds = t0.elapsed().as_secs_f64(),
                    "sft"
                );
            }
        }
    }
    // Every rank holds the same weights; rank 0 writes them.
    if rank == 0 && !stopped {
        crate::checkpoint::write_dir_atomically(&opts.out, |tmp| {
            trainer.model.save(tmp)?;
            for f in [
                "tokenizer.json",
                "tokenizer_config.json",
                "generation_config.json",
            ] {
                let src = dir.join(f);
                if src.exists() {
                    std::fs::copy(&src, tmp.join(f)).map_err(TrainerError::io(&src))?;
                }
            }
            Ok(())
        })?;
        // OUT is whole: the checkpoints that led to it are spent.
        if resume_root.exists() {
            std::fs::remove_dir_all(&resume_root).map_err(TrainerError::io(&resume_root))?;
        }
    }
    Ok(SftReport {
        rows,
        copy_rows: opts.copy_rows,
        dropped_too_long: dropped,
        steps,
        tokens,
        trained_tokens: trained,
        first_loss: first,
        last_loss: last,
        seconds: t0.elapsed().as_secs_f64(),
        out: opts.out.clone(),
        resumed_from,
        stopped,
        rank,
    })
}
