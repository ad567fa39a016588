//! The trainer's optimisation settings as the experiment states them (the orchestrator's
//! `[trainer]` table): learning rate and schedule, AdamW, clipping, the KL penalty and its
//! reference policy, importance-weight cap, loss aggregation, LoRA or full fine-tune, memory
//! knobs and PPO minibatches per step. The orchestrator sends them to `POST /v1/settings` when a
//! run starts or resumes; every train step it sends carries [`TrainSettings::hash`], and the
//! trainer refuses (409) a step whose hash differs from the settings it holds, so two runs of
//! one preset cannot silently train with different optimisers.
//!
//! Defaults are the papers' (method.md A.5.3, A.9, B.7-B.8): LR 5e-7 constant, AdamW
//! (0.9, 0.95), eps 1e-8, weight decay 0, grad-norm clip 1.0, KL3 with beta 0.001, clip 0.2/0.2,
//! token-mean aggregation, one minibatch per step, full fine-tune with a frozen reference copy.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Learning-rate schedule after a linear warm-up of `warmup_steps`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LrSchedule {
    /// Constant after warm-up (the papers).
    #[default]
    Constant,
    /// Cosine decay to `min_lr_ratio`·lr at `total_steps`.
    Cosine,
    /// Linear decay to 0 at `total_steps`.
    Linear,
}

/// How per-token losses are combined (method.md A.5.3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossAggregation {
    /// Mean over every counted token of the minibatch (DAPO / DR Tulu / RubricEM).
    #[default]
    TokenMean,
    /// Mean over sequences of each sequence's token mean (the GRPO paper).
    SequenceMean,
    /// Sum over counted tokens divided by `aggregation_constant` (Dr. GRPO).
    Constant,
}

/// The KL estimator (only KL3, `exp(-d) - 1 + d`, as DR Tulu and RubricEM).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    #[default]
    Kl3,
}

/// What the KL penalty measures against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReferencePolicy {
    /// A frozen copy of the initial weights (full fine-tune; LoRA: the base with adapters off,
    /// which is the same policy).
    #[default]
    Initial,
    /// No reference: `kl_beta` must be 0.
    None,
}

/// Full fine-tune or LoRA adapters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finetune {
    #[default]
    Full,
    Lora,
}

/// The dtype the trainer holds the model's parameters in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamDtype {
    /// bf16 on a GPU, f32 on a CPU.
    #[default]
    Auto,
    F32,
    /// bf16 parameters with fp32 master weights and AdamW moments (the usual mixed-precision
    /// recipe). On a CPU it pays only where the cores multiply bf16 natively (AMX-BF16 or
    /// AVX512-BF16, which libtorch's oneDNN kernels use); elsewhere it is slower than f32.
    Bf16,
}

impl ParamDtype {
    fn is_auto(&self) -> bool {
        *self == ParamDtype::Auto
    }
}

/// LoRA shape (used when `finetune = "lora"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoraSettings {
    pub r: i64,
    /// Scale numerator (alpha / r); 0: 2r.
    pub alpha: f64,
    pub dropout: f64,
    /// Projections that get adapters (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
    /// down_proj).
    pub targets: Vec<String>,
}

impl Default for LoraSettings {
    fn default() -> Self {
        Self {
            r: 16,
            alpha: 32.0,
            dropout: 0.0,
            targets: LORA_TARGETS.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// Projection names a LoRA adapter may target.
pub const LORA_TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// The trainer's optimisation settings (the experiment's `[trainer]` table without `url`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSettings {
    /// Peak learning rate.
    pub lr: f64,
    pub schedule: LrSchedule,
    pub warmup_steps: u64,
    /// Steps of the decay for cosine / linear schedules (0: constant after warm-up).
    pub total_steps: u64,
    /// Cosine floor as a fraction of `lr`.
    pub min_lr_ratio: f64,
    pub adam_beta1: f64,
    pub adam_beta2: f64,
    pub adam_eps: f64,
    pub weight_decay: f64,
    /// Global gradient-norm clip (0 = off).
    pub max_grad_norm: f64,
    /// Coefficient of the KL penalty to the reference policy.
    pub kl_beta: f64,
    pub kl_estimator: KlEstimator,
    pub reference: ReferencePolicy,
    /// PPO clip: ratio kept in [1 - clip_low, 1 + clip_high].
    pub clip_low: f64,
    pub clip_high: f64,
    /// Truncated importance weight cap min(pi_old / pi_behaviour, cap); 0 = off.
    pub tis_cap: f64,
    /// Coefficient of the unlikelihood term −log(1 − p) (Welleck et al. 2020, "Neural Text
    /// Generation with Unlikelihood Training", their sequence-level form) on the repeated copies
    /// of the loop that a loop-stopped attempt ended in, which the orchestrator marks by
    /// `rollout.repetition_detection`'s rule; 0 = off (the papers'). Added to the step loss with
    /// each marked token's aggregation weight. Where a policy gradient moves a token of
    /// probability p by |A|·(1 − p), this term moves it by p: a near-certain loop is pushed
    /// down hardest. Left out of the serialised settings (and so of [`TrainSettings::hash`])
    /// when 0, so every earlier run's hash stands.
    #[serde(skip_serializing_if = "is_zero")]
    pub loop_unlikelihood: f64,
    /// γ of LUFFY's policy shaping (Yan et al. 2025, "Learning to Reason under Off-Policy
    /// Guidance", their f(x) = x / (x + γ), γ = 0.1) on the tokens of off-policy sequences (the
    /// demonstrations of `credit.guidance_demos`); 0 = off, their tokens then take the clipped
    /// ratio against the step's own policy like the policy's. On: a demonstration token's loss is
    /// −A · π / (π + γ), π its probability under the current policy, unclipped, so its gradient
    /// in log π is A · γπ / (π + γ)² instead of A: for γ ≤ 1 at most A / 4 (at π = γ), about
    /// A · γ for a token the policy already predicts. The demonstration's tokens near π = γ are
    /// learned ahead of the confident ones, which LUFFY found keeps the policy's entropy from
    /// collapsing onto the demonstrations, and all of them by less than without it. Left out of
    /// the serialised settings (and the hash) when 0, so every earlier run's hash stands.
    #[serde(skip_serializing_if = "is_zero")]
    pub off_policy_shaping: f64,
    /// Coefficient c of an entropy bonus on the task update (Phase B): the loss takes
    /// −c · H(π(·|prefix)) at every counted token whose advantage is not 0, H over the whole
    /// vocabulary at temperature 1, with the token's aggregation weight (the regulariser of
    /// Williams & Peng 1991 and Mnih et al. 2016's A3C; verl's `entropy_coeff`). Limited to the
    /// tokens the policy gradient acts on, so the rows an update skips as null would have taken
    /// none and skipping them stays exact. 0 = off. Left out of the serialised settings (and the
    /// hash) when 0, so every earlier run's hash stands.
    #[serde(skip_serializing_if = "is_zero")]
    pub entropy_bonus: f64,
    pub loss_aggregation: LossAggregation,
    /// Divisor when `loss_aggregation = "constant"`.
    pub aggregation_constant: f64,
    pub finetune: Finetune,
    pub lora: LoraSettings,
    /// Recompute each layer in backward instead of keeping activations.
    pub grad_checkpoint: bool,
    /// Padded tokens per micro-batch (rows x longest row).
    pub micro_batch_tokens: i64,
    /// PPO minibatches (optimizer updates) per train step; 1 = DR Tulu. With more, the ratio
    /// against the step's starting policy moves and the clip binds.
    pub minibatches_per_step: u32,
    /// Leave out of the trainer's forward and backward the rows whose loss is zero at every
    /// token (every counted token's advantage 0, no KL term, no unlikelihood token): about half
    /// a batch under `credit.negative_advantage_scale = 0`. The update is the same (their
    /// gradient is exactly 0 and the loss's totals keep them; with LoRA dropout the same in
    /// distribution, as the masks are drawn per micro-batch); the step's `tokens` and per-token
    /// metrics (entropy, clip fraction, ratio, importance weights) are then over the rows
    /// trained on, so they do not compare with a run that trained on all, and
    /// `train/null_sequences` counts the rest. `false` trains on every row. Left out of the
    /// serialised settings (and the hash) when `true`, so every earlier run's hash stands.
    #[serde(skip_serializing_if = "is_true")]
    pub skip_null_rows: bool,
    /// The meta-policy's Phase A update (the reflection candidates' own optimizer step) at this
    /// fraction of the step's learning rate, in [0, 1]; 1 (the default) is RubricEM's update
    /// as written, weight 1 beside the task step. AdamW normalises each parameter's step by its
    /// gradient's running scale, so scaling the candidates' advantages would barely change the
    /// update's size: the rate is what damps it. 0 leaves Phase A out: the orchestrator sends
    /// no candidates (they stay untrained in Postgres) and the trainer refuses any it is sent.
    /// Left out of the serialised settings (and the hash) when 1, so every earlier run's hash
    /// stands.
    #[serde(skip_serializing_if = "is_one")]
    pub reflection_lr_scale: f64,
    /// The parameters' dtype. When it differs from the dtype the trainer holds (`auto` resolved
    /// for its device), the trainer rebuilds the policy in it, at version 0 only, like a
    /// structural change.
    /// Left out of the serialised settings (and the hash) when `auto`, so every earlier run's
    /// hash stands.
    #[serde(skip_serializing_if = "ParamDtype::is_auto")]
    pub param_dtype: ParamDtype,
}

impl Default for TrainSettings {
    fn default() -> Self {
        Self {
            lr: 5e-7,
            schedule: LrSchedule::Constant,
            warmup_steps: 0,
            total_steps: 0,
            min_lr_ratio: 0.0,
            adam_beta1: 0.9,
            adam_beta2: 0.95,
            adam_eps: 1e-8,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            kl_beta: 0.001,
            kl_estimator: KlEstimator::Kl3,
            reference: ReferencePolicy::Initial,
            clip_low: 0.2,
            clip_high: 0.2,
            tis_cap: 2.0,
            loop_unlikelihood: 0.0,
            off_policy_shaping: 0.0,
            entropy_bonus: 0.0,
            loss_aggregation: LossAggregation::TokenMean,
            aggregation_constant: 1.0,
            finetune: Finetune::Full,
            lora: LoraSettings::default(),
            grad_checkpoint: true,
            micro_batch_tokens: 16384,
            minibatches_per_step: 1,
            skip_null_rows: true,
            reflection_lr_scale: 1.0,
            param_dtype: ParamDtype::Auto,
        }
    }
}

fn is_one(x: &f64) -> bool {
    *x == 1.0
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn is_true(x: &bool) -> bool {
    *x
}

/// A setting outside its allowed range: names the field, the value and what is allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("trainer.{field} = {value}; allowed: {allowed}")]
pub struct SettingsError {
    pub field: &'static str,
    pub value: String,
    pub allowed: &'static str,
}

impl TrainSettings {
    /// Check every field; the first bad one is named.
    pub fn validate(&self) -> Result<(), SettingsError> {
        fn check(
            ok: bool,
            field: &'static str,
            value: impl std::fmt::Display,
            allowed: &'static str,
        ) -> Result<(), SettingsError> {
            if ok {
                Ok(())
            } else {
                Err(SettingsError {
                    field,
                    value: value.to_string(),
                    allowed,
                })
            }
        }
        let s = self;
        check(
            s.lr.is_finite() && s.lr > 0.0 && s.lr <= 1.0,
            "lr",
            s.lr,
            "(0, 1]",
        )?;
        check(
            s.schedule == LrSchedule::Constant || s.total_steps > s.warmup_steps,
            "total_steps",
            s.total_steps,
            "greater than warmup_steps for cosine and linear schedules",
        )?;
        check(
            (0.0..=1.0).contains(&s.min_lr_ratio),
            "min_lr_ratio",
            s.min_lr_ratio,
            "[0, 1]",
        )?;
        check(
            (0.0..1.0).contains(&s.adam_beta1),
            "adam_beta1",
            s.adam_beta1,
            "[0, 1)",
        )?;
        check(
            (0.0..1.0).contains(&s.adam_beta2),
            "adam_beta2",
            s.adam_beta2,
            "[0, 1)",
        )?;
        check(
            s.adam_eps > 0.0 && s.adam_eps <= 1e-2,
            "adam_eps",
            s.adam_eps,
            "(0, 0.01]",
        )?;
        check(
            (0.0..=1.0).contains(&s.weight_decay),
            "weight_decay",
            s.weight_decay,
            "[0, 1]",
        )?;
        check(
            s.max_grad_norm.is_finite() && s.max_grad_norm >= 0.0,
            "max_grad_norm",
            s.max_grad_norm,
            "0 (off) or more",
        )?;
        check(
            (0.0..=10.0).contains(&s.kl_beta),
            "kl_beta",
            s.kl_beta,
            "[0, 10]",
        )?;
        check(
            s.kl_beta == 0.0 || s.reference != ReferencePolicy::None,
            "kl_beta",
            s.kl_beta,
            "0 when reference = \"none\"",
        )?;
        check(
            (0.0..1.0).contains(&s.clip_low),
            "clip_low",
            s.clip_low,
            "[0, 1)",
        )?;
        check(
            (0.0..=10.0).contains(&s.clip_high),
            "clip_high",
            s.clip_high,
            "[0, 10]",
        )?;
        check(
            s.tis_cap == 0.0 || s.tis_cap >= 1.0,
            "tis_cap",
            s.tis_cap,
            "0 (off) or >= 1",
        )?;
        check(
            (0.0..=10.0).contains(&s.loop_unlikelihood),
            "loop_unlikelihood",
            s.loop_unlikelihood,
            "[0, 10] (0: off)",
        )?;
        check(
            (0.0..=10.0).contains(&s.off_policy_shaping),
            "off_policy_shaping",
            s.off_policy_shaping,
            "[0, 10] (0: off; LUFFY's γ is 0.1)",
        )?;
        check(
            (0.0..=1.0).contains(&s.entropy_bonus),
            "entropy_bonus",
            s.entropy_bonus,
            "[0, 1] (0: off)",
        )?;
        check(
            (0.0..=1.0).contains(&s.reflection_lr_scale),
            "reflection_lr_scale",
            s.reflection_lr_scale,
            "[0, 1] (a fraction of lr; 0: no Phase A update)",
        )?;
        check(
            s.aggregation_constant.is_finite() && s.aggregation_constant > 0.0,
            "aggregation_constant",
            s.aggregation_constant,
            "> 0",
        )?;
        if s.finetune == Finetune::Lora {
            check(
                (1..=1024).contains(&s.lora.r),
                "lora.r",
                s.lora.r,
                "1..=1024",
            )?;
            check(
                s.lora.alpha.is_finite() && s.lora.alpha >= 0.0,
                "lora.alpha",
                s.lora.alpha,
                "0 (= 2r) or more",
            )?;
            check(
                (0.0..1.0).contains(&s.lora.dropout),
                "lora.dropout",
                s.lora.dropout,
                "[0, 1)",
            )?;
            check(
                !s.lora.targets.is_empty()
                    && s.lora
                        .targets
                        .iter()
                        .all(|t| LORA_TARGETS.contains(&t.as_str())),
                "lora.targets",
                format!("{:?}", s.lora.targets),
                "a non-empty list of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj",
            )?;
        }
        check(
            (2..=1 << 24).contains(&s.micro_batch_tokens),
            "micro_batch_tokens",
            s.micro_batch_tokens,
            "2..=16777216",
        )?;
        check(
            (1..=64).contains(&s.minibatches_per_step),
            "minibatches_per_step",
            s.minibatches_per_step,
            "1..=64",
        )?;
        Ok(())
    }

    /// A stable fingerprint of the settings: SHA-256 of their canonical JSON (fields in
    /// declaration order), first 16 hex digits. Equal settings give equal hashes on both sides.
    pub fn hash(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        let digest = Sha256::digest(&json);
        digest[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Whether moving from `self` to `other` changes the model's structure (what is trained
    /// and what the reference is), which needs the policy rebuilt from its model directory.
    pub fn structural_change(&self, other: &TrainSettings) -> bool {
        self.finetune != other.finetune
            || (self.finetune == Finetune::Lora && self.lora != other.lora)
            || (self.reference != other.reference)
            || (self.kl_beta == 0.0) != (other.kl_beta == 0.0)
    }
}

/// `POST /v1/settings` and `GET /v1/settings` reply: the settings the trainer now trains with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SettingsReply {
    pub settings: TrainSettings,
    /// [`TrainSettings::hash`] of `settings`.
    pub hash: String,
    /// The policy was rebuilt from its model directory (a structural change at version 0).
    #[serde(default)]
    pub rebuilt: bool,
    pub policy_version: crate::PolicyVersion,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_papers_and_valid() {
        let s = TrainSettings::default();
        s.validate().unwrap();
        assert_eq!(s.lr, 5e-7);
        assert_eq!((s.adam_beta1, s.adam_beta2), (0.9, 0.95));
        assert_eq!((s.kl_beta, s.clip_low, s.clip_high), (0.001, 0.2, 0.2));
        assert_eq!(s.minibatches_per_step, 1);
    }

    #[test]
    fn hash_is_stable_and_sensitive() {
        let a = TrainSettings::default();
        let mut b = a.clone();
        assert_eq!(a.hash(), b.hash());
        assert_eq!(a.hash().len(), 16);
        b.lr = 1e-5;
        assert_ne!(a.hash(), b.hash());
        let back: TrainSettings =
            serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
        assert_eq!(back.hash(), a.hash());
        // A setting left out of the JSON at its default (so hashes from before it stand):
        // absent there; changed, it is present, changes the hash and round-trips.
        let optional = |name: &str, changed: TrainSettings| {
            assert!(!serde_json::to_string(&a).unwrap().contains(name), "{name}");
            let json = serde_json::to_value(&changed).unwrap();
            assert!(json.get(name).is_some(), "{name}");
            assert_ne!(changed.hash(), a.hash(), "{name}");
            let back: TrainSettings =
                serde_json::from_str(&serde_json::to_string(&changed).unwrap()).unwrap();
            let back_json = serde_json::to_value(&back).unwrap();
            assert_eq!(
                (&back_json[name], back.hash()),
                (&json[name], changed.hash()),
                "{name}"
            );
        };
        // The unlikelihood term, off by default.
        optional(
            "loop_unlikelihood",
            TrainSettings {
                loop_unlikelihood: 0.5,
                ..a.clone()
            },
        );
        // LUFFY's policy shaping, off by default.
        optional(
            "off_policy_shaping",
            TrainSettings {
                off_policy_shaping: 0.1,
                ..a.clone()
            },
        );
        // The entropy bonus, off by default.
        optional(
            "entropy_bonus",
            TrainSettings {
                entropy_bonus: 0.01,
                ..a.clone()
            },
        );
        // Skipping the null rows, on by default.
        optional(
            "skip_null_rows",
            TrainSettings {
                skip_null_rows: false,
                ..a.clone()
            },
        );
        // Phase A's rate scale, 1 by default.
        optional(
            "reflection_lr_scale",
            TrainSettings {
                reflection_lr_scale: 0.1,
                ..a.clone()
            },
        );
        // The parameters' dtype, auto by default.
        optional(
            "param_dtype",
            TrainSettings {
                param_dtype: ParamDtype::Bf16,
                ..a.clone()
            },
        );
        let json = serde_json::to_value(TrainSettings {
            param_dtype: ParamDtype::Bf16,
            ..a.clone()
        })
        .unwrap();
        assert_eq!(json["param_dtype"], "bf16");
    }

    #[test]
    fn validation_names_field_value_and_limit() {
        let s = TrainSettings {
            minibatches_per_step: 0,
            ..TrainSettings::default()
        };
        let e = s.validate().unwrap_err().to_string();
        assert!(
            e.contains("trainer.minibatches_per_step = 0") && e.contains("1..=64"),
            "{e}"
        );
        let s = TrainSettings {
            reference: ReferencePolicy::None,
            ..TrainSettings::default()
        };
        assert!(s.validate().unwrap_err().to_string().contains("kl_beta"));
        let mut s = TrainSettings {
            finetune: Finetune::Lora,
            ..TrainSettings::default()
        };
        s.lora.targets = vec!["qkv".into()];
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .contains("lora.targets")
        );
        let s = TrainSettings {
            loop_unlikelihood: 11.0,
            ..TrainSettings::default()
        };
        let e = s.validate().unwrap_err().to_string();
        assert!(
            e.contains("trainer.loop_unlikelihood = 11") && e.contains("[0, 10]"),
            "{e}"
        );
        for bad in [-0.1, 10.5, f64::NAN] {
            let s = TrainSettings {
                off_policy_shaping: bad,
                ..TrainSettings::default()
            };
            let e = s.validate().unwrap_err().to_string();
            assert!(
                e.contains("trainer.off_policy_shaping") && e.contains("[0, 10]"),
                "{e}"
            );
        }
        for bad in [-0.1, 1.5, f64::NAN] {
            let s = TrainSettings {
                entropy_bonus: bad,
                ..TrainSettings::default()
            };
            let e = s.validate().unwrap_err().to_string();
            assert!(
                e.contains("trainer.entropy_bonus") && e.contains("[0, 1]"),
                "{e}"
            );
        }
        for bad in [1.5, -0.1, f64::NAN] {
            let s = TrainSettings {
                reflection_lr_scale: bad,
                ..TrainSettings::default()
            };
            let e = s.validate().unwrap_err().to_string();
            assert!(
                e.contains(&format!("trainer.reflection_lr_scale = {bad}")) && e.contains("[0, 1]"),
                "{e}"
            );
        }
        let s = TrainSettings {
            schedule: LrSchedule::Cosine,
            ..TrainSettings::default()
        };
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .contains("total_steps")
        );
    }

    #[test]
    fn structural_changes() {
        let a = TrainSettings::default();
        let mut b = a.clone();
        b.lr = 1e-6;
        assert!(!a.structural_change(&b));
        b.finetune = Finetune::Lora;
        assert!(a.structural_change(&b));
        // The dtype is compared by the trainer against the dtype it holds (`auto` resolves per
        // device), not here.
        let mut c = a.clone();
        c.param_dtype = ParamDtype::Bf16;
        assert!(!a.structural_change(&c));
    }
}
