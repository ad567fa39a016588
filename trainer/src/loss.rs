//! Losses as pure functions of tensors: chunked token log-probs, the clipped policy loss with
//! per-token advantages (SS-GRPO from per-stage advantages and per-token stage indices, or one
//! sequence advantage for GRPO), KL3 to the reference, truncated importance weights against
//! behaviour log-probs, aggregation weights, the unlikelihood term on marked tokens, and the
//! masked SFT cross-entropy.

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::error::{Result, TrainerError};

/// How per-token losses are combined into the step loss.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Aggregation {
    /// Mean over every counted token of the batch (DAPO / DR Tulu).
    TokenMean,
    /// Mean over sequences of each sequence's token mean (GRPO paper).
    SequenceMean,
    /// Sum over counted tokens divided by a constant (Dr. GRPO).
    Constant(f64),
}

impl Aggregation {
    /// The weight of one counted token, so that loss = Σ weight · ℓ over the whole batch:
    /// `seq_tokens` counted tokens in its sequence, `total_tokens` in the batch, over
    /// `counted_seqs` sequences with at least one counted token. Computed from batch totals so
    /// micro-batching does not change the loss.
    pub fn weight(self, seq_tokens: usize, total_tokens: usize, counted_seqs: usize) -> f64 {
        match self {
            Aggregation::TokenMean => 1.0 / total_tokens.max(1) as f64,
            Aggregation::SequenceMean => {
                1.0 / seq_tokens.max(1) as f64 / counted_seqs.max(1) as f64
            }
            Aggregation::Constant(c) => 1.0 / c,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyLossConfig {
    pub clip_low: f64,
    pub clip_high: f64,
    /// β of the KL3 penalty to the reference policy (0 = no reference pass).
    pub kl_coef: f64,
    /// Truncated importance weight min(π_old/π_behaviour, C) per token; None = off.
    pub tis_clamp: Option<f64>,
    pub aggregation: Aggregation,
    /// Coefficient of [`unlikelihood`] on the tokens a sequence marks (a loop's repeated
    /// copies); 0 = off.
    pub unlikelihood: f64,
    /// γ of LUFFY's policy shaping on off-policy tokens ([`policy_terms`]); 0 = off.
    pub shaping: f64,
    /// Coefficient c of the entropy bonus −c · H(π(·|prefix)) of Phase B, at the counted tokens
    /// whose advantage is not 0, with their aggregation weight (the trainer's head applies it
    /// with its analytic gradient); 0 = off.
    pub entropy: f64,
}

impl Default for PolicyLossConfig {
    fn default() -> Self {
        Self {
            clip_low: 0.2,
            clip_high: 0.28,
            kl_coef: 0.001,
            tis_clamp: Some(2.0),
            aggregation: Aggregation::TokenMean,
            unlikelihood: 0.0,
            shaping: 0.0,
            entropy: 0.0,
        }
    }
}

impl PolicyLossConfig {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(TrainerError::Config(m));
        if !(0.0..1.0).contains(&self.clip_low) {
            return bad(format!("clip_low = {}; allowed: [0, 1)", self.clip_low));
        }
        if !(0.0..=10.0).contains(&self.clip_high) {
            return bad(format!("clip_high = {}; allowed: [0, 10]", self.clip_high));
        }
        if !(0.0..=10.0).contains(&self.kl_coef) {
            return bad(format!("kl_coef = {}; allowed: [0, 10]", self.kl_coef));
        }
        if !(0.0..=10.0).contains(&self.unlikelihood) {
            return bad(format!(
                "unlikelihood = {}; allowed: [0, 10]",
                self.unlikelihood
            ));
        }
        if !(0.0..=10.0).contains(&self.shaping) {
            return bad(format!(
                "off_policy_shaping = {}; allowed: [0, 10] (0: off)",
                self.shaping
            ));
        }
        if !(0.0..=1.0).contains(&self.entropy) {
            return bad(format!(
                "entropy_bonus = {}; allowed: [0, 1] (0: off)",
                self.entropy
            ));
        }
        if let Some(c) = self.tis_clamp
            && (c.is_nan() || c < 1.0)
        {
            return bad(format!("tis_clamp = {c}; it must be >= 1"));
        }
        if let Aggregation::Constant(c) = self.aggregation
            && (c.is_nan() || c <= 0.0)
        {
            return bad(format!("aggregation constant = {c}; it must be > 0"));
        }
        Ok(())
    }
}

/// log p(target) for each position of `hidden` [B, T, H] against `lm_weight` [V, H], computed
/// `chunk` positions at a time so no [B, T, V] f32 tensor exists at once.
pub fn token_logprobs(hidden: &Tensor, lm_weight: &Tensor, targets: &Tensor, chunk: i64) -> Tensor {
    let t = hidden.size()[1];
    let chunk = chunk.max(1);
    let mut lps = Vec::new();
    let mut s = 0;
    while s < t {
        let c = chunk.min(t - s);
        let logits = hidden
            .narrow(1, s, c)
            .matmul(&lm_weight.tr())
            .to_kind(Kind::Float);
        lps.push(logprobs_of_logits(&logits, &targets.narrow(1, s, c)));
        s += c;
    }
    Tensor::cat(&lps, 1)
}

/// [`token_logprobs`] at the positions `keep` (indices into the row-major flattening of
/// `hidden`'s [B, T]) only; every other entry of the [B, T] result is 0. The head's [c, V]
/// work then scales with the positions that carry a loss, not with the prompt, the tool
/// outputs and the padding, whose log-probs nothing reads.
pub fn token_logprobs_at(
    hidden: &Tensor,
    lm_weight: &Tensor,
    targets: &Tensor,
    keep: &Tensor,
    chunk: i64,
) -> Tensor {
    let size = hidden.size();
    let (b, t, d) = (size[0], size[1], size[2]);
    let h = hidden.reshape([-1, d]).index_select(0, keep).unsqueeze(0);
    let tg = targets.reshape([-1]).index_select(0, keep).unsqueeze(0);
    let lp = token_logprobs(&h, lm_weight, &tg, chunk).squeeze_dim(0);
    Tensor::zeros([b * t], (lp.kind(), lp.device()))
        .index_copy(0, keep, &lp)
        .view([b, t])
}

/// log-softmax picked at the targets without materialising log_softmax.
pub fn logprobs_of_logits(logits: &Tensor, targets: &Tensor) -> Tensor {
    let lse = logits.logsumexp([-1i64], false);
    let picked = logits
        .gather(-1, &targets.unsqueeze(-1), false)
        .squeeze_dim(-1);
    picked - lse
}

/// Per-token advantages [len] from per-stage advantages and per-token stage indices
/// (SS-GRPO), or from one advantage for the whole sequence (GRPO / terminal broadcast).
/// Tokens that do not count (mask false) get 0. A counted token without a stage is an error.
pub fn per_token_advantages(
    stage_advantages: &[f32],
    stages: &[i8],
    mask: &[bool],
) -> Result<Vec<f32>> {
    if stages.len() != mask.len() {
        return Err(TrainerError::Batch(format!(
            "{} stage indices for {} mask entries",
            stages.len(),
            mask.len()
        )));
    }
    let k = stage_advantages.len();
    if k == 0 {
        return Err(TrainerError::Batch("no advantages".into()));
    }
    stages
        .iter()
        .zip(mask)
        .enumerate()
        .map(|(i, (&s, &m))| {
            if !m {
                return Ok(0.0);
            }
            if k == 1 {
                return Ok(stage_advantages[0]);
            }
            usize::try_from(s)
                .ok()
                .and_then(|s| stage_advantages.get(s).copied())
                .ok_or_else(|| {
                    TrainerError::Batch(format!(
                        "token {i} counts in the loss but has stage {s}; allowed: 0..{k}"
                    ))
                })
        })
        .collect()
}

/// Per-token policy-gradient terms: returns (loss per token, metrics per token).
#[derive(Debug)]
pub struct PolicyTerms {
    /// tis · max(−A·ρ, −A·clip(ρ)) + β·kl3, per token; at a shaped off-policy token
    /// tis · (−A·π/(π + γ)) + β·kl3 (tis is 1 there: no behaviour log-prob is recorded).
    pub loss: Tensor,
    /// 1 where the clipped branch was taken.
    pub clipped: Tensor,
    pub kl3: Tensor,
    pub ratio: Tensor,
    pub tis: Tensor,
}

/// Bound on |log ρ|: a ratio against a far-off old policy (Phase A's behaviour log-probs, a late
/// minibatch) stays finite, so a clipped token never turns the loss into inf or NaN. Where it
/// binds the token is far outside the clip range anyway.
pub const MAX_LOG_RATIO: f64 = 20.0;

/// The clipped surrogate per token. `logp` carries the gradient; the others are constants.
/// `old_logp` is the ratio's denominator: the step's starting policy (the detached `logp` itself
/// for one minibatch, so ρ = 1), or the behaviour policy for Phase A.
///
/// `off_policy` (1 at the tokens of sequences no policy server sampled, the demonstrations of
/// `credit.guidance_demos`) with `cfg.shaping` = γ > 0: those tokens take LUFFY's shaped
/// objective instead (Yan et al. 2025, "Learning to Reason under Off-Policy Guidance": the
/// importance ratio π_θ / π_φ with π_φ taken as 1, passed through f(x) = x / (x + γ), no clip),
/// −A · π / (π + γ) with π = exp(`logp`), whose gradient in log π is A · γπ / (π + γ)², where the
/// ratio's is A. For γ ≤ 1 the weight γπ / (π + γ)² peaks at 1/4 at π = γ and falls to
/// γ / (1 + γ)² as π → 1 (0.083 at γ = 0.1) and towards 0 as π → 0 (0.083 again at π = 0.01):
/// the tokens near π = γ are learned ahead of those the policy already predicts, and every
/// demonstration token moves the policy at most a quarter as much as without the shaping.
pub fn policy_terms(
    logp: &Tensor,
    old_logp: &Tensor,
    advantages: &Tensor,
    ref_logp: Option<&Tensor>,
    behaviour_logp: Option<&Tensor>,
    off_policy: Option<&Tensor>,
    cfg: &PolicyLossConfig,
) -> PolicyTerms {
    let ratio = (logp - old_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp();
    let unclipped = -advantages * &ratio;
    let clipped_ratio = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high);
    let clipped = -advantages * &clipped_ratio;
    let pg = unclipped.maximum(&clipped);
    let clipped_taken = tch::no_grad(|| clipped.gt_tensor(&unclipped).to_kind(Kind::Float));
    let (pg, clipped_taken) = match off_policy {
        Some(off) if cfg.shaping > 0.0 => {
            let p = logp.exp();
            let shaped = -advantages * (&p / (&p + cfg.shaping));
            let on = off.gt(0.0);
            // An off-policy token is never clipped.
            let taken = tch::no_grad(|| {
                clipped_taken.where_self(&on.logical_not(), &clipped_taken.zeros_like())
            });
            (shaped.where_self(&on, &pg), taken)
        }
        _ => (pg, clipped_taken),
    };
    let tis = match (behaviour_logp, cfg.tis_clamp) {
        // A behaviour log-prob of exactly 0 is "not recorded" (tokens no policy server sampled:
        // a demonstration's, `credit.guidance_demos`): weight 1 there.
        (Some(b), Some(c)) => tch::no_grad(|| {
            let w = (old_logp - b).exp().clamp_max(c);
            w.where_self(&b.ne(0.0), &w.ones_like())
        }),
        _ => Tensor::ones_like(logp).detach(),
    };
    let kl3 = match ref_logp {
        Some(r) if cfg.kl_coef > 0.0 => {
            let d = (logp - r).clamp(-40.0, 40.0);
            (-&d).exp() - 1.0 + d
        }
        _ => logp.zeros_like(),
    };
    let loss = &tis * pg + &kl3 * cfg.kl_coef;
    PolicyTerms {
        loss,
        clipped: clipped_taken,
        kl3,
        ratio: ratio.detach(),
        tis,
    }
}

/// Floor on 1 − p in [`unlikelihood`]: −log(1 − p) is at most −ln(1e-5) ≈ 11.5, and a token
/// already at p > 1 − 1e-5 gets no gradient (Welleck et al. clamp the same way).
pub const UNLIKELIHOOD_FLOOR: f64 = 1e-5;

/// The unlikelihood term per token, −log(max(1 − p, floor)) with p = exp(`logp`) (Welleck et
/// al. 2020). 1 − p is taken as −expm1(log p), exact as p nears 1. Its gradient in log p is
/// p / (1 − p), so through the softmax it moves the token's logit by −p: the more certain
/// the token, the harder the push, where a policy gradient's push, |A|·(1 − p), vanishes.
pub fn unlikelihood(logp: &Tensor) -> Tensor {
    -(-logp.expm1()).clamp_min(UNLIKELIHOOD_FLOOR).log()
}

/// Masked SFT cross-entropy: mean −log p over counted tokens (tool outputs and prompts masked).
pub fn sft_loss(logp: &Tensor, mask: &Tensor) -> Tensor {
    let mask = mask.to_kind(Kind::Float);
    -(logp * &mask).sum(Kind::Float) / mask.sum(Kind::Float).clamp_min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_indices_pick_stage_advantages() {
        let a = per_token_advantages(
            &[1.0, 2.0, 3.0, 4.0],
            &[-1, 0, 1, -1, 2, 3],
            &[false, true, true, false, true, true],
        )
        .unwrap();
        assert_eq!(a, vec![0.0, 1.0, 2.0, 0.0, 3.0, 4.0]);
        let g = per_token_advantages(&[0.5], &[0, 1, -1], &[true, true, false]).unwrap();
        assert_eq!(g, vec![0.5, 0.5, 0.0]);
        let e = per_token_advantages(&[1.0, 2.0, 3.0, 4.0], &[-1], &[true]).unwrap_err();
        assert!(e.to_string().contains("stage -1"), "{e}");
    }

    #[test]
    fn log_probs_at_kept_positions_equal_the_full_heads_and_are_zero_elsewhere() {
        let _rng = crate::model::rng_lock();
        tch::manual_seed(3);
        let (b, t, d, v) = (2i64, 9i64, 6i64, 11i64);
        let hidden = Tensor::randn([b, t, d], (Kind::Float, tch::Device::Cpu));
        let w = Tensor::randn([v, d], (Kind::Float, tch::Device::Cpu));
        let targets = Tensor::randint(v, [b, t], (Kind::Int64, tch::Device::Cpu));
        let full = token_logprobs(&hidden, &w, &targets, 4).reshape([-1]);
        // Row 0 keeps positions 3..9, row 1 positions 1..5: uneven, across chunk edges.
        let keep: Vec<i64> = (3..9).chain(t + 1..t + 5).collect();
        let at = token_logprobs_at(&hidden, &w, &targets, &Tensor::from_slice(&keep), 4);
        assert_eq!(at.size(), [b, t]);
        let at = Vec::<f32>::try_from(at.reshape([-1])).unwrap();
        let full = Vec::<f32>::try_from(full).unwrap();
        for (i, (&a, &f)) in at.iter().zip(&full).enumerate() {
            if keep.contains(&(i as i64)) {
                assert!((a - f).abs() < 1e-6, "position {i}: {a} against {f}");
                assert!(a < 0.0, "position {i}: a log-prob of {a}");
            } else {
                assert_eq!(a, 0.0, "position {i} is not kept");
            }
        }
    }

    #[test]
    fn unlikelihood_is_minus_log_one_minus_p_with_gradient_p_over_one_minus_p() {
        let p = [0.1f64, 0.5, 0.95, 0.999];
        let logp = Tensor::from_slice(&p.map(f64::ln))
            .to_kind(Kind::Double)
            .set_requires_grad(true);
        let u = unlikelihood(&logp);
        u.sum(Kind::Double).backward();
        let got = Vec::<f64>::try_from(&u.detach()).unwrap();
        let grad = Vec::<f64>::try_from(&logp.grad()).unwrap();
        for (k, &p) in p.iter().enumerate() {
            assert!((got[k] + (1.0 - p).ln()).abs() < 1e-9, "p {p}: {}", got[k]);
            let want = p / (1.0 - p);
            assert!((grad[k] - want).abs() < 1e-6 * want, "p {p}: {}", grad[k]);
        }
        // At the floor the value is capped and the gradient is 0.
        let logp = Tensor::from_slice(&[-1e-9f64]).set_requires_grad(true);
        let u = unlikelihood(&logp);
        u.sum(Kind::Double).backward();
        let v = u.double_value(&[0]);
        assert!((v + UNLIKELIHOOD_FLOOR.ln()).abs() < 1e-9, "{v}");
        assert_eq!(logp.grad().double_value(&[0]), 0.0);
    }

    #[test]
    fn shaped_off_policy_tokens_are_never_clipped_and_take_minus_a_p_over_p_plus_gamma() {
        // Four tokens whose ratio against `old` is e (far above 1 + clip_high, so the clip binds
        // for A > 0); tokens 1 and 3 are off-policy.
        let p = [0.05f64, 0.1, 0.5, 0.99];
        let logp = Tensor::from_slice(&p.map(f64::ln))
            .to_kind(Kind::Double)
            .set_requires_grad(true);
        let old = logp.detach() - 1.0;
        let adv = Tensor::from_slice(&[1.0f64, 2.0, 1.0, -0.5]);
        let off = Tensor::from_slice(&[0.0f64, 1.0, 0.0, 1.0]);
        let gamma = 0.1;
        let cfg = PolicyLossConfig {
            kl_coef: 0.0,
            tis_clamp: None,
            shaping: gamma,
            ..PolicyLossConfig::default()
        };
        let t = policy_terms(&logp, &old, &adv, None, None, Some(&off), &cfg);
        t.loss.sum(Kind::Double).backward();
        let loss = Vec::<f64>::try_from(&t.loss.detach()).unwrap();
        let grad = Vec::<f64>::try_from(&logp.grad()).unwrap();
        let clipped = Vec::<f64>::try_from(&t.clipped.to_kind(Kind::Double)).unwrap();
        let a = [1.0, 2.0, 1.0, -0.5];
        for k in [1, 3] {
            let want = -a[k] * p[k] / (p[k] + gamma);
            assert!(
                (loss[k] - want).abs() < 1e-9,
                "token {k}: {} vs {want}",
                loss[k]
            );
            let g = -a[k] * gamma * p[k] / (p[k] + gamma).powi(2);
            assert!((grad[k] - g).abs() < 1e-9, "token {k}: {} vs {g}", grad[k]);
            assert_eq!(clipped[k], 0.0, "token {k}");
        }
        // The policy's tokens keep the clipped surrogate: −A·(1 + clip_high), no gradient.
        for k in [0, 2] {
            assert!(
                (loss[k] + a[k] * 1.28).abs() < 1e-9,
                "token {k}: {}",
                loss[k]
            );
            assert_eq!((grad[k], clipped[k]), (0.0, 1.0), "token {k}");
        }
        // γ = 0: the flag changes nothing.
        let plain = PolicyLossConfig {
            shaping: 0.0,
            ..cfg
        };
        let with = policy_terms(&logp.detach(), &old, &adv, None, None, Some(&off), &plain);
        let without = policy_terms(&logp.detach(), &old, &adv, None, None, None, &plain);
        assert!(with.loss.equal(&without.loss) && with.clipped.equal(&without.clipped));
    }

    #[test]
    fn config_ranges_are_named() {
        let c = PolicyLossConfig {
            clip_low: 1.5,
            ..PolicyLossConfig::default()
        };
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("clip_low = 1.5")
        );
    }
}
