//! One training sequence as the trainer receives it (tokens, loss mask, stages, behaviour
//! log-probs, advantages) and its validation against the model's limits. Its own module so that
//! the train step and the data-parallel split both use it without depending on each other.

use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainerError};
use crate::loss;
use crate::model::Qwen3;

/// One training sequence. Arrays are aligned with `tokens`: entry t describes token t.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sequence {
    pub tokens: Vec<i64>,
    /// Token t counts in the loss (model-generated tokens; prompts and tool outputs do not).
    pub loss_mask: Vec<bool>,
    /// Token t (a counted one) also carries the unlikelihood term (`loss::unlikelihood`, scaled
    /// by the loss config's `unlikelihood`): a repeated copy of a loop. Empty: no token does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unlikelihood: Vec<bool>,
    /// Stage of token t (0..K), or -1 where it has none.
    #[serde(default)]
    pub stages: Vec<i8>,
    /// Behaviour log-prob of token t from the inference server (0 where not generated).
    #[serde(default)]
    pub behaviour_logprobs: Vec<f32>,
    /// Per-stage advantages (SS-GRPO) or one value (GRPO). Empty for SFT.
    #[serde(default)]
    pub advantages: Vec<f32>,
    /// No policy server sampled it (a demonstration, `credit.guidance_demos`): with the loss
    /// config's `shaping` its counted tokens take LUFFY's shaped objective
    /// ([`loss::policy_terms`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub off_policy: bool,
}

/// What a sequence is checked against: the model's vocabulary and its position limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqLimits {
    /// Token ids must be in `0..vocab`.
    pub vocab: i64,
    /// At most this many tokens (`max_position_embeddings`: the rotary tables end there).
    pub max_positions: usize,
}

impl SeqLimits {
    /// The limits of `model`.
    pub fn of(model: &Qwen3) -> Self {
        Self {
            vocab: model.cfg.vocab_size,
            max_positions: model.max_positions(),
        }
    }
}

impl Sequence {
    /// A supervised sequence (SFT): tokens and the mask of those the loss counts; no stages,
    /// behaviour log-probs or advantages.
    pub fn supervised(tokens: Vec<i64>, loss_mask: Vec<bool>) -> Self {
        Self {
            tokens,
            loss_mask,
            unlikelihood: Vec::new(),
            stages: Vec::new(),
            behaviour_logprobs: Vec::new(),
            advantages: Vec::new(),
            off_policy: false,
        }
    }

    /// Everything a step will rely on, checked before it starts: lengths (at least 2 tokens, at
    /// most the model's positions), aligned arrays, token ids in the vocabulary, and for RL a
    /// finite advantage for every counted token's stage and finite behaviour log-probs. A
    /// sequence that passes cannot fail the step on its data.
    pub fn validate(&self, i: usize, limits: SeqLimits, rl: bool) -> Result<()> {
        let n = self.tokens.len();
        let bad = |m: String| Err(TrainerError::Batch(format!("sequence {i}: {m}")));
        if n < 2 {
            return bad(format!("{n} tokens; at least 2 are needed"));
        }
        if n > limits.max_positions {
            return bad(format!(
                "{n} tokens exceed the model's {} positions (max_position_embeddings)",
                limits.max_positions
            ));
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
        if !self.unlikelihood.is_empty() {
            if self.unlikelihood.len() != n {
                return bad(format!(
                    "{} unlikelihood entries for {n} tokens (or none)",
                    self.unlikelihood.len()
                ));
            }
            if let Some(t) = (0..n).find(|&t| self.unlikelihood[t] && !self.loss_mask[t]) {
                return bad(format!(
                    "token {t} carries unlikelihood but does not count in the loss"
                ));
            }
        }
        let vocab = limits.vocab;
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
            // A behaviour log-prob enters the importance weight (and, for a reflection candidate,
            // the ratio): a NaN would poison the loss, a row the update skips would hide it, and
            // a data-parallel group could not send it to its ranks. Finite everywhere, as the
            // wire's decoder demands of every value.
            if let Some(t) = self.behaviour_logprobs.iter().position(|x| !x.is_finite()) {
                return bad(format!(
                    "behaviour log-prob {} at token {t} is not finite",
                    self.behaviour_logprobs[t]
                ));
            }
            // Every counted token's stage must name an advantage: what `prepare` computes.
            let stages = self.stages_or_none();
            if let Err(e) = loss::per_token_advantages(&self.advantages, &stages, &self.loss_mask) {
                return bad(match e {
                    TrainerError::Batch(m) => m,
                    e => e.to_string(),
                });
            }
        }
        Ok(())
    }

    /// The stage of every token (-1 throughout when the sequence carries none).
    pub(crate) fn stages_or_none(&self) -> Vec<i8> {
        if self.stages.is_empty() {
            vec![-1i8; self.tokens.len()]
        } else {
            self.stages.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: SeqLimits = SeqLimits {
        vocab: 32,
        max_positions: 64,
    };

    /// A 4-token RL row whose last two tokens count, with advantage 0 (a row the update may
    /// skip) and `lp` as the behaviour log-prob of token `at`.
    fn row(at: usize, lp: f32) -> Sequence {
        let mut behaviour_logprobs = vec![0.0, 0.0, -0.5, -0.7];
        behaviour_logprobs[at] = lp;
        Sequence {
            tokens: vec![1, 2, 3, 4],
            loss_mask: vec![false, false, true, true],
            unlikelihood: Vec::new(),
            stages: Vec::new(),
            behaviour_logprobs,
            advantages: vec![0.0],
            off_policy: false,
        }
    }

    #[test]
    fn behaviour_logprobs_must_be_finite() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            // At a counted token (read by the loss) and at one that is not (a data-parallel
            // group still sends it to its ranks, which a non-finite value cannot cross).
            for at in [3, 1] {
                let err = row(at, bad)
                    .validate(5, LIMITS, true)
                    .unwrap_err()
                    .to_string();
                assert!(err.contains("sequence 5"), "{err}");
                assert!(err.contains(&format!("token {at} is not finite")), "{err}");
            }
            // SFT reads no behaviour log-probs.
            row(3, bad).validate(5, LIMITS, false).unwrap();
        }
        row(3, -0.25).validate(5, LIMITS, true).unwrap();
    }
}
