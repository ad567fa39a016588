//! The experiment's optimisation settings (`wire::TrainSettings`) mapped onto the trainer's own
//! configs, in one place: learning rate, schedule and AdamW (`AdamWConfig`), clip, KL, truncated
//! importance weights and aggregation (`PolicyLossConfig`), LoRA or full fine-tune
//! (`LoraConfig`), memory knobs and minibatches (`TrainConfig`), and whether a frozen reference
//! copy of the initial weights is needed. `trainer serve`'s flags go the other way
//! ([`from_config`]): the settings a trainer started ad hoc holds until a client sends its own.

use wire::settings::{
    Finetune, LoraSettings, LossAggregation, LrSchedule, ParamDtype, ReferencePolicy,
    SettingsError, TrainSettings,
};

use crate::loss::{Aggregation, PolicyLossConfig};
use crate::model::{LoraConfig, LoraTarget};
use crate::optim::{AdamWConfig, Schedule};
use crate::train::TrainConfig;

/// What the trainer builds from a [`TrainSettings`].
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub train: TrainConfig,
    /// The adapters to train; `None`: full fine-tune.
    pub lora: Option<LoraConfig>,
    /// Keep a frozen copy of the initial weights as the KL reference (full fine-tune with
    /// `kl_beta > 0` against the initial policy; LoRA's reference is the base with the adapters
    /// off).
    pub reference_copy: bool,
    /// The parameters' dtype; `None`: [`crate::default_kind`] of the device.
    pub kind: Option<tch::Kind>,
}

/// Check `s` completely (the wire rules, then what the trainer itself needs) and build the
/// trainer's configs from it. The error names the field, the value and what is allowed.
pub fn resolve(s: &TrainSettings) -> Result<Resolved, SettingsError> {
    s.validate()?;
    let bad = |field: &'static str, value: String, allowed: &'static str| SettingsError {
        field,
        value,
        allowed,
    };
    let schedule = match s.schedule {
        LrSchedule::Constant if s.warmup_steps == 0 => Schedule::Constant,
        LrSchedule::Constant => Schedule::Warmup {
            steps: s.warmup_steps,
        },
        LrSchedule::Cosine => Schedule::Cosine {
            warmup: s.warmup_steps,
            total: s.total_steps,
            min_ratio: s.min_lr_ratio,
        },
        LrSchedule::Linear => Schedule::Linear {
            warmup: s.warmup_steps,
            total: s.total_steps,
        },
    };
    let optim = AdamWConfig {
        lr: s.lr,
        betas: (s.adam_beta1, s.adam_beta2),
        eps: s.adam_eps,
        weight_decay: s.weight_decay,
        max_grad_norm: s.max_grad_norm,
        schedule,
    };
    let loss = PolicyLossConfig {
        clip_low: s.clip_low,
        clip_high: s.clip_high,
        kl_coef: s.kl_beta,
        tis_clamp: (s.tis_cap > 0.0).then_some(s.tis_cap),
        unlikelihood: s.loop_unlikelihood,
        shaping: s.off_policy_shaping,
        entropy: s.entropy_bonus,
        aggregation: match s.loss_aggregation {
            LossAggregation::TokenMean => Aggregation::TokenMean,
            LossAggregation::SequenceMean => Aggregation::SequenceMean,
            LossAggregation::Constant => Aggregation::Constant(s.aggregation_constant),
        },
    };
    loss.validate()
        .map_err(|e| bad("loss", e.to_string(), "a valid policy loss"))?;
    let lora = match s.finetune {
        Finetune::Full => None,
        Finetune::Lora => {
            let mut targets = Vec::new();
            for t in &s.lora.targets {
                let target = LoraTarget::parse(t).map_err(|_| {
                    bad(
                        "lora.targets",
                        format!("{:?}", s.lora.targets),
                        "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj",
                    )
                })?;
                if targets.contains(&target) {
                    return Err(bad(
                        "lora.targets",
                        format!("{:?}", s.lora.targets),
                        "each projection at most once",
                    ));
                }
                targets.push(target);
            }
            let cfg = LoraConfig {
                r: s.lora.r,
                alpha: if s.lora.alpha == 0.0 {
                    2.0 * s.lora.r as f64
                } else {
                    s.lora.alpha
                },
                dropout: s.lora.dropout,
                targets,
            };
            cfg.validate()
                .map_err(|e| bad("lora", e.to_string(), "a valid LoRA shape"))?;
            Some(cfg)
        }
    };
    let train = TrainConfig {
        loss,
        optim,
        micro_batch_tokens: s.micro_batch_tokens,
        logit_chunk: TrainConfig::default().logit_chunk,
        grad_checkpoint: s.grad_checkpoint,
        minibatches_per_step: s.minibatches_per_step as usize,
        skip_null_rows: s.skip_null_rows,
        reflection_lr_scale: s.reflection_lr_scale,
    };
    let reference_copy =
        lora.is_none() && s.kl_beta > 0.0 && s.reference == ReferencePolicy::Initial;
    let kind = match s.param_dtype {
        ParamDtype::Auto => None,
        ParamDtype::F32 => Some(tch::Kind::Float),
        ParamDtype::Bf16 => Some(tch::Kind::BFloat16),
    };
    Ok(Resolved {
        train,
        lora,
        reference_copy,
        kind,
    })
}

/// The settings a trainer configured by `train` and `lora` (the `trainer serve` flags) trains
/// with; [`resolve`] gives the same configs back (up to `logit_chunk`, which is not a setting).
/// Without a KL term the reference is `none`.
pub fn from_config(train: &TrainConfig, lora: Option<&LoraConfig>) -> TrainSettings {
    let d = TrainSettings::default();
    let o = &train.optim;
    let (schedule, warmup_steps, total_steps, min_lr_ratio) = match o.schedule {
        Schedule::Constant => (LrSchedule::Constant, 0, 0, 0.0),
        Schedule::Warmup { steps } => (LrSchedule::Constant, steps, 0, 0.0),
        Schedule::Cosine {
            warmup,
            total,
            min_ratio,
        } => (LrSchedule::Cosine, warmup, total, min_ratio),
        Schedule::Linear { warmup, total } => (LrSchedule::Linear, warmup, total, 0.0),
    };
    let l = &train.loss;
    let (loss_aggregation, aggregation_constant) = match l.aggregation {
        Aggregation::TokenMean => (LossAggregation::TokenMean, d.aggregation_constant),
        Aggregation::SequenceMean => (LossAggregation::SequenceMean, d.aggregation_constant),
        Aggregation::Constant(c) => (LossAggregation::Constant, c),
    };
    let (finetune, lora) = match lora {
        Some(c) => (
            Finetune::Lora,
            LoraSettings {
                r: c.r,
                alpha: c.alpha,
                dropout: c.dropout,
                targets: c.targets.iter().map(|t| t.module().to_string()).collect(),
            },
        ),
        None => (Finetune::Full, LoraSettings::default()),
    };
    TrainSettings {
        lr: o.lr,
        schedule,
        warmup_steps,
        total_steps,
        min_lr_ratio,
        adam_beta1: o.betas.0,
        adam_beta2: o.betas.1,
        adam_eps: o.eps,
        weight_decay: o.weight_decay,
        max_grad_norm: o.max_grad_norm,
        kl_beta: l.kl_coef,
        kl_estimator: d.kl_estimator,
        reference: if l.kl_coef > 0.0 {
            ReferencePolicy::Initial
        } else {
            ReferencePolicy::None
        },
        clip_low: l.clip_low,
        clip_high: l.clip_high,
        tis_cap: l.tis_clamp.unwrap_or(0.0),
        loop_unlikelihood: l.unlikelihood,
        off_policy_shaping: l.shaping,
        entropy_bonus: l.entropy,
        loss_aggregation,
        aggregation_constant,
        finetune,
        lora,
        grad_checkpoint: train.grad_checkpoint,
        micro_batch_tokens: train.micro_batch_tokens,
        minibatches_per_step: u32::try_from(train.minibatches_per_step).unwrap_or(u32::MAX),
        skip_null_rows: train.skip_null_rows,
        reflection_lr_scale: train.reflection_lr_scale,
        param_dtype: ParamDtype::Auto,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_papers_settings_map_onto_the_trainers_configs() {
        let s = TrainSettings::default();
        let r = resolve(&s).unwrap();
        assert_eq!(r.train.optim.lr, 5e-7);
        assert_eq!(r.train.optim.betas, (0.9, 0.95));
        assert_eq!(r.train.optim.schedule, Schedule::Constant);
        assert_eq!(r.train.loss.kl_coef, 0.001);
        assert_eq!((r.train.loss.clip_low, r.train.loss.clip_high), (0.2, 0.2));
        assert_eq!(r.train.loss.tis_clamp, Some(2.0));
        assert_eq!(r.train.minibatches_per_step, 1);
        assert!(r.lora.is_none() && r.reference_copy);

        let mut s = TrainSettings {
            finetune: Finetune::Lora,
            tis_cap: 0.0,
            warmup_steps: 5,
            loss_aggregation: LossAggregation::Constant,
            aggregation_constant: 4096.0,
            minibatches_per_step: 4,
            ..TrainSettings::default()
        };
        s.lora.alpha = 0.0;
        s.lora.r = 8;
        s.lora.targets = vec!["q_proj".into(), "v_proj".into()];
        let r = resolve(&s).unwrap();
        let l = r.lora.unwrap();
        assert_eq!((l.r, l.alpha), (8, 16.0));
        assert_eq!(l.targets, vec![LoraTarget::Q, LoraTarget::V]);
        assert!(!r.reference_copy);
        assert_eq!(r.train.loss.tis_clamp, None);
        assert_eq!(r.train.loss.aggregation, Aggregation::Constant(4096.0));
        assert_eq!(r.train.optim.schedule, Schedule::Warmup { steps: 5 });
        assert_eq!(r.train.minibatches_per_step, 4);
        assert_eq!(r.train.loss.unlikelihood, 0.0);
        let s = TrainSettings {
            loop_unlikelihood: 0.25,
            ..TrainSettings::default()
        };
        assert_eq!(resolve(&s).unwrap().train.loss.unlikelihood, 0.25);
    }

    #[test]
    fn trainer_checks_name_the_field() {
        let mut s = TrainSettings {
            finetune: Finetune::Lora,
            ..TrainSettings::default()
        };
        s.lora.targets = vec!["q_proj".into(), "q_proj".into()];
        let e = resolve(&s).unwrap_err().to_string();
        assert!(
            e.contains("trainer.lora.targets") && e.contains("at most once"),
            "{e}"
        );
        let s = TrainSettings {
            lr: 0.0,
            ..TrainSettings::default()
        };
        assert!(
            resolve(&s)
                .unwrap_err()
                .to_string()
                .contains("trainer.lr = 0")
        );
    }

    #[test]
    fn flag_configs_round_trip() {
        let mut train = TrainConfig::default();
        train.optim.lr = 0.05;
        train.loss.kl_coef = 0.0;
        train.optim.schedule = Schedule::Cosine {
            warmup: 2,
            total: 10,
            min_ratio: 0.1,
        };
        let lora = LoraConfig {
            r: 4,
            alpha: 8.0,
            ..LoraConfig::default()
        };
        for lora in [None, Some(&lora)] {
            let s = from_config(&train, lora);
            assert_eq!(s.reference, ReferencePolicy::None);
            let r = resolve(&s).unwrap();
            assert_eq!(r.train, train);
            assert_eq!(r.lora.as_ref(), lora);
        }
    }
}
