//! One optimizer step over a batch of sequences: micro-batches to a token budget, forward and
//! backward with the logits head computed in chunks (backward per chunk, so no [T, V] tensor is
//! kept), optional per-layer gradient checkpointing (recompute), then AdamW. RL steps use the
//! policy loss with per-token advantages; SFT steps the masked cross-entropy.

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::error::{Result, TrainerError};
use crate::loss::{self, Aggregation, PolicyLossConfig};
use crate::model::{Fwd, Qwen3};
use crate::optim::{AdamW, AdamWConfig};

/// One training sequence. Arrays are aligned with `tokens`: entry t describes token t.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sequence {
    pub tokens: Vec<i64>,
    /// Token t counts in the loss (model-generated tokens; prompts and tool outputs do not).
    pub loss_mask: Vec<bool>,
    /// Stage of token t (0..K), or -1 where it has none.
    #[serde(default)]
    pub stages: Vec<i8>,
    /// Behaviour log-prob of token t from the inference server (0 where not generated).
    #[serde(default)]
    pub behaviour_logprobs: Vec<f32>,
    /// Per-stage advantages (SS-GRPO) or one value (GRPO). Empty for SFT.
    #[serde(default)]
    pub advantages: Vec<f32>,
}

impl Sequence {
    pub fn validate(&self, i: usize, vocab: i64, rl: bool) -> Result<()> {
        let n = self.tokens.len();
        let bad = |m: String| Err(TrainerError::Batch(format!("sequence {i}: {m}")));
        if n < 2 {
            return bad(format!("{n} tokens; at least 2 are needed"));
        }
        if self.loss_mask.len() != n {
            return bad(format!(
                "{} mask entries for {n} tokens",
                self.loss_mask.len()
            ));
        }
        if self.loss_mask[0] {
            return bad("the first token cannot count in the loss (nothing predicts it)".into());
        }
        if let Some(t) = self.tokens.iter().find(|&&t| t < 0 || t >= vocab) {
            return bad(format!("token id {t} is outside the vocabulary 0..{vocab}"));
        }
        if rl {
            if self.advantages.is_empty() {
                return bad("no advantages".into());
            }
            if self.advantages.len() > 1 && self.stages.len() != n {
                return bad(format!(
                    "{} stage indices for {n} tokens",
                    self.stages.len()
                ));
            }
            if !self.behaviour_logprobs.is_empty() && self.behaviour_logprobs.len() != n {
                return bad(format!(
                    "{} behaviour log-probs for {n} tokens",
                    self.behaviour_logprobs.len()
                ));
            }
            if let Some(a) = self.advantages.iter().find(|a| !a.is_finite()) {
                return bad(format!("advantage {a} is not finite"));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    pub loss: PolicyLossConfig,
    pub optim: AdamWConfig,
    /// Padded tokens per micro-batch (rows × longest row).
    pub micro_batch_tokens: i64,
    /// Positions per chunk of the logits head.
    pub logit_chunk: i64,
    /// Recompute each layer in backward instead of keeping its activations.
    pub grad_checkpoint: bool,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            loss: PolicyLossConfig::default(),
            optim: AdamWConfig::default(),
            micro_batch_tokens: 16384,
            logit_chunk: 1024,
            grad_checkpoint: true,
        }
    }
}

/// What a step reports (the train-step reply's `metrics` and `reflection`).
pub use wire::StepMetrics;

/// Per-token targets and weights of one micro-batch, [B, T-1] each.
struct Micro {
    ids: Tensor,
    targets: Tensor,
    mask: Tensor,
    weights: Tensor,
    adv: Tensor,
    behaviour: Option<Tensor>,
    reference: Option<Tensor>,
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
}

pub struct Trainer {
    pub model: Qwen3,
    pub opt: AdamW,
    pub cfg: TrainConfig,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("opt", &self.opt)
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// Group sequence indices into micro-batches whose padded size stays within the budget
/// (sorted by length so padding is small; a sequence longer than the budget goes alone).
pub fn micro_batches(lens: &[usize], budget: i64) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lens[i]));
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut longest = 0usize;
    for i in order {
        let l = longest.max(lens[i]);
        if !cur.is_empty() && (l * (cur.len() + 1)) as i64 > budget {
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
    pub fn new(model: Qwen3, cfg: TrainConfig) -> Result<Self> {
        cfg.loss.validate()?;
        if cfg.loss.kl_coef > 0.0 && !model.has_lora() {
            return Err(TrainerError::Config(format!(
                "kl_coef = {} needs a reference policy, which is the base with adapters \
                 disabled; a full fine-tune has none: set kl_coef = 0 or train LoRA",
                cfg.loss.kl_coef
            )));
        }
        if cfg.micro_batch_tokens < 2 || cfg.logit_chunk < 1 {
            return Err(TrainerError::Config(format!(
                "micro_batch_tokens = {} (>= 2) and logit_chunk = {} (>= 1)",
                cfg.micro_batch_tokens, cfg.logit_chunk
            )));
        }
        let opt = AdamW::new(model.trainable(), cfg.optim.clone());
        Ok(Self { model, opt, cfg })
    }

    /// One RL step (SS-GRPO when sequences carry per-stage advantages, GRPO with one).
    pub fn rl_step(&mut self, seqs: &[Sequence]) -> Result<StepMetrics> {
        self.step(seqs, true)
    }

    /// One SFT step (masked cross-entropy).
    pub fn sft_step(&mut self, seqs: &[Sequence]) -> Result<StepMetrics> {
        self.step(seqs, false)
    }

    fn step(&mut self, seqs: &[Sequence], rl: bool) -> Result<StepMetrics> {
        let t0 = std::time::Instant::now();
        if seqs.is_empty() {
            return Err(TrainerError::Batch("empty batch".into()));
        }
        for (i, s) in seqs.iter().enumerate() {
            s.validate(i, self.model.cfg.vocab_size, rl)?;
        }
        // Global aggregation weights: computed over the whole batch, then sliced per micro.
        let total_tokens: usize = seqs
            .iter()
            .map(|s| s.loss_mask.iter().filter(|&&m| m).count())
            .sum();
        let counted_seqs = seqs
            .iter()
            .filter(|s| s.loss_mask.iter().any(|&m| m))
            .count();
        let agg = if rl {
            self.cfg.loss.aggregation
        } else {
            Aggregation::TokenMean
        };
        let lens: Vec<usize> = seqs.iter().map(|s| s.tokens.len()).collect();
        let groups = micro_batches(&lens, self.cfg.micro_batch_tokens);
        self.opt.zero_grad();
        let mut sums = Sums {
            tis_min: f64::INFINITY,
            tis_max: f64::NEG_INFINITY,
            ..Sums::default()
        };
        for group in &groups {
            let micro = self.prepare(seqs, group, rl, agg, total_tokens, counted_seqs)?;
            self.forward_backward(&micro, rl, &mut sums)?;
        }
        let (grad_norm, lr) = self.opt.step();
        let n = sums.tokens.max(1.0);
        Ok(StepMetrics {
            loss: sums.loss,
            tokens: sums.tokens as i64,
            sequences: seqs.len(),
            micro_batches: groups.len(),
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
            seconds: t0.elapsed().as_secs_f64(),
        })
    }

    fn prepare(
        &self,
        seqs: &[Sequence],
        group: &[usize],
        rl: bool,
        agg: Aggregation,
        total_tokens: usize,
        counted_seqs: usize,
    ) -> Result<Micro> {
        let dev = self.model.device;
        let rows: Vec<&Sequence> = group.iter().map(|&i| &seqs[i]).collect();
        let ids: Vec<Vec<i64>> = rows.iter().map(|s| s.tokens.clone()).collect();
        // Position t of the shifted arrays describes token t+1.
        let shift = |f: &dyn Fn(&Sequence) -> Vec<f32>| -> Vec<Vec<f32>> {
            rows.iter().map(|s| f(s)[1..].to_vec()).collect()
        };
        let mask = shift(&|s| {
            s.loss_mask
                .iter()
                .map(|&m| f32::from(u8::from(m)))
                .collect()
        });
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
                let stages = if s.stages.is_empty() {
                    vec![-1i8; s.tokens.len()]
                } else {
                    s.stages.clone()
                };
                let a = loss::per_token_advantages(&s.advantages, &stages, &s.loss_mask)?;
                out.push(a[1..].to_vec());
            }
            out
        } else {
            mask.iter().map(|m| vec![0.0; m.len()]).collect()
        };
        let behaviour = (rl
            && self.cfg.loss.tis_clamp.is_some()
            && rows.iter().all(|s| !s.behaviour_logprobs.is_empty()))
        .then(|| shift(&|s| s.behaviour_logprobs.clone()));
        let ids_t = pad_2d(&ids, 0i64, dev);
        let t = ids_t.size()[1];
        let targets = ids_t.narrow(1, 1, t - 1);
        let inputs = ids_t.narrow(1, 0, t - 1);
        let reference = if rl && self.cfg.loss.kl_coef > 0.0 {
            Some(tch::no_grad(|| {
                let h = self.model.hidden(&inputs, Fwd::REFERENCE);
                loss::token_logprobs(&h, self.model.lm_weight(), &targets, self.cfg.logit_chunk)
            }))
        } else {
            None
        };
        Ok(Micro {
            ids: inputs,
            targets,
            mask: pad_2d(&mask, 0.0f32, dev),
            weights: pad_2d(&weights, 0.0f32, dev),
            adv: pad_2d(&adv, 0.0f32, dev),
            behaviour: behaviour.map(|b| pad_2d(&b, 0.0f32, dev)),
            reference,
        })
    }

    /// Loss of one chunk from its target log-probs `logp` [B, c] (a leaf; backward is the
    /// caller's), accumulating metrics.
    fn chunk_loss(
        &self,
        logp: &Tensor,
        m: &Micro,
        s: i64,
        c: i64,
        rl: bool,
        sums: &mut Sums,
    ) -> Tensor {
        let mask = m.mask.narrow(1, s, c);
        let w = m.weights.narrow(1, s, c);
        let n = mask.sum(Kind::Float).double_value(&[]);
        sums.tokens += n;
        let per_token = if rl {
            let old = logp.detach();
            let reference = m.reference.as_ref().map(|r| r.narrow(1, s, c));
            let behaviour = m.behaviour.as_ref().map(|b| b.narrow(1, s, c));
            let terms = loss::policy_terms(
                logp,
                &old,
                &m.adv.narrow(1, s, c),
                reference.as_ref(),
                behaviour.as_ref(),
                &self.cfg.loss,
            );
            tch::no_grad(|| {
                let sum = |t: &Tensor| (t * &mask).sum(Kind::Float).double_value(&[]);
                sums.clipped += sum(&terms.clipped);
                sums.kl += sum(&terms.kl3);
                sums.ratio += sum(&terms.ratio);
                sums.tis += sum(&terms.tis);
                if n > 0.0 {
                    let on = mask.gt(0.0);
                    let sel = terms.tis.masked_select(&on);
                    sums.tis_min = sums.tis_min.min(sel.min().double_value(&[]));
                    sums.tis_max = sums.tis_max.max(sel.max().double_value(&[]));
                }
            });
            terms.loss
        } else {
            -logp
        };
        let l = (per_token * w).sum(Kind::Float);
        sums.loss += l.double_value(&[]);
        l
    }

    /// Head: final norm, then a fused linear + log-softmax + loss per chunk of positions. The
    /// softmax of a chunk serves the entropy metric and the analytic gradient
    /// dℓ/dlogits = g·(onehot − softmax), so no [T, V] tensor outlives its chunk and autograd
    /// never stores logits. Gradients reach x (and the norm and lm weights) in one backward.
    fn head_backward(&self, x: &Tensor, m: &Micro, rl: bool, sums: &mut Sums) {
        let h = crate::model::qwen3::rms_norm(x, &self.model.norm, self.model.cfg.rms_norm_eps);
        let w = self.model.lm_weight();
        let (hd, wd) = (h.detach(), w.detach());
        let t = hd.size()[1];
        let chunk = self.cfg.logit_chunk.max(1);
        let mut grad_h = Vec::new();
        let mut grad_w: Option<Tensor> = None;
        let mut s = 0;
        while s < t {
            let c = chunk.min(t - s);
            let hc = hd.narrow(1, s, c);
            let targets = m.targets.narrow(1, s, c).unsqueeze(-1);
            // One fused log-softmax kernel (faster on CPU than logsumexp's separate passes).
            let (logp_all, logp) = tch::no_grad(|| {
                let logp_all = hc
                    .matmul(&wd.tr())
                    .to_kind(Kind::Float)
                    .log_softmax(-1, Kind::Float);
                let logp = logp_all.gather(-1, &targets, false).squeeze_dim(-1);
                (logp_all, logp)
            });
            let leaf = logp.set_requires_grad(true);
            let l = self.chunk_loss(&leaf, m, s, c, rl, sums);
            if l.requires_grad() {
                l.backward();
            }
            let gl = leaf.grad();
            tch::no_grad(|| {
                let mut p = logp_all.exp();
                let ent = -(&p * &logp_all).sum_dim_intlist(-1, false, Kind::Float);
                let mask = m.mask.narrow(1, s, c);
                sums.entropy += (ent * &mask).sum(Kind::Float).double_value(&[]);
                drop(logp_all);
                if !gl.defined() {
                    grad_h.push(hc.zeros_like());
                    return;
                }
                let gl = gl.unsqueeze(-1);
                let _ = p.f_mul_(&(-&gl));
                let _ = p.f_scatter_add_(-1, &targets, &gl);
                let g = p.to_kind(hc.kind());
                grad_h.push(g.matmul(&wd));
                if w.requires_grad() {
                    let gw = g.flatten(0, 1).tr().matmul(&hc.flatten(0, 1));
                    grad_w = Some(match grad_w.take() {
                        Some(acc) => acc + gw,
                        None => gw,
                    });
                }
            });
            s += c;
        }
        let grad_h = Tensor::cat(&grad_h, 1);
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

    fn forward_backward(&self, m: &Micro, rl: bool, sums: &mut Sums) -> Result<()> {
        let model = &self.model;
        let n_layers = model.layers.len();
        if !self.cfg.grad_checkpoint {
            let mut x = model.embed(&m.ids);
            for l in 0..n_layers {
                x = model.layer_forward(l, &x, 0, None, Fwd::TRAIN);
            }
            let leaf = x.detach().set_requires_grad(true);
            self.head_backward(&leaf, m, rl, sums);
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
        let mut inputs = Vec::with_capacity(n_layers + 1);
        tch::no_grad(|| {
            let mut x = model.embed(&m.ids);
            for l in 0..n_layers {
                inputs.push(x.shallow_clone());
                seeded(l);
                x = model.layer_forward(l, &x, 0, None, Fwd::TRAIN);
            }
            inputs.push(x);
        });
        // Head, then layers in reverse, each recomputed with grad from its detached input.
        let leaf = inputs[n_layers].detach().set_requires_grad(true);
        self.head_backward(&leaf, m, rl, sums);
        let mut g = leaf.grad();
        for l in (0..n_layers).rev() {
            if !g.defined() {
                return Ok(());
            }
            let xin = inputs[l].detach().set_requires_grad(true);
            seeded(l);
            let y = model.layer_forward(l, &xin, 0, None, Fwd::TRAIN);
            (y * &g).sum(Kind::Float).backward();
            g = xin.grad();
        }
        if g.defined() && model.embed_tokens.requires_grad() {
            (model.embed(&m.ids) * g).sum(Kind::Float).backward();
        }
        Ok(())
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
