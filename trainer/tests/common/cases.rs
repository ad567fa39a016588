//! The data-parallel cases shared by tests/dist.rs (2 gloo ranks on CPU) and tests/cuda.rs (the
//! same on a GPU): a tiny random Qwen3 (full fine-tune or LoRA), a batch of uneven sequences
//! with per-stage advantages, the trainer settings of each case, and a tolerance check.

use std::time::Duration;

use tch::{Device, Kind, Tensor};
use trainer::dist::Collective;
use trainer::dist::zero::ZeroStage;
use trainer::loss::PolicyLossConfig;
use trainer::model::lora::{LoraConfig, LoraTarget};
use trainer::model::{Qwen3, Qwen3Config};
use trainer::optim::AdamWConfig;
use trainer::train::{Sequence, StepMetrics, TrainConfig, Trainer};

pub fn tiny_cfg() -> Qwen3Config {
    serde_json::from_value(serde_json::json!({
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "max_position_embeddings": 128, "rope_theta": 10000.0, "tie_word_embeddings": true
    }))
    .unwrap()
}

/// r 4, alpha 8, no dropout, every projection.
pub fn lora_config() -> LoraConfig {
    LoraConfig {
        r: 4,
        alpha: 8.0,
        dropout: 0.0,
        targets: LoraTarget::ALL.to_vec(),
    }
}

/// The case's model on CPU, fp32: weights N(0, 0.2) from `seed`; with `lora`, adapters on
/// every projection with a non-zero B.
pub fn model(seed: i64, lora: bool) -> Qwen3 {
    let mut m = Qwen3::random(tiny_cfg(), seed, 0.2, Device::Cpu, Kind::Float).unwrap();
    if lora {
        m.add_lora(&lora_config(), seed + 1).unwrap();
        // Non-zero B, so the adapters matter from the first step.
        let _guard = trainer::model::rng_lock();
        tch::manual_seed(seed + 2);
        for (_, _, p) in m.projections_mut() {
            if let Some(l) = &mut p.lora {
                tch::no_grad(|| {
                    l.b.copy_(&(Tensor::randn(l.b.size(), (Kind::Float, Device::Cpu)) * 0.1));
                });
            }
        }
    } else {
        m.set_trainable(true);
    }
    m
}

/// A copy of `m` on `device` (fp32): the same base weights and adapters, the same trainable set.
pub fn to_device(m: &Qwen3, device: Device) -> Qwen3 {
    let mut out = Qwen3::random(tiny_cfg(), 0, 0.2, device, Kind::Float).unwrap();
    tch::no_grad(|| {
        for ((_, mut d), (_, s)) in out.base_tensors().into_iter().zip(m.base_tensors()) {
            d.copy_(&s);
        }
    });
    if m.has_lora() {
        out.add_lora(&lora_config(), 0).unwrap();
        tch::no_grad(|| {
            for ((_, mut d), (_, s)) in out.lora_tensors().into_iter().zip(m.lora_tensors()) {
                d.copy_(&s);
            }
        });
    } else {
        out.set_trainable(true);
    }
    out
}

/// Sequences of uneven lengths (7 to 40 tokens) and per-stage advantages (all 0 in row 4); row 2
/// is off-policy (a demonstration: no behaviour log-probs recorded), shaped in the RL cases.
pub fn batch(n: usize) -> Vec<Sequence> {
    let lens = [31usize, 9, 17, 40, 12, 7, 23];
    (0..n)
        .map(|i| {
            let len = lens[i % lens.len()];
            let tokens: Vec<i64> = (0..len as i64)
                .map(|t| (t * 7 + i as i64 * 11 + 3) % 64)
                .collect();
            Sequence {
                unlikelihood: Vec::new(),
                loss_mask: (0..len).map(|t| t >= 3).collect(),
                stages: (0..len)
                    .map(|t| {
                        if t < 3 {
                            -1
                        } else {
                            ((t - 3) * 4 / (len - 3)) as i8
                        }
                    })
                    .collect(),
                behaviour_logprobs: (0..len)
                    .map(|t| if i == 2 { 0.0 } else { -3.0 - 0.05 * t as f32 })
                    .collect(),
                // Row 4 has every advantage 0: an RL step without a KL term skips it
                // (`skip_null_rows`), so the split and the totals are checked with it.
                advantages: if i == 4 {
                    vec![0.0; 4]
                } else {
                    vec![0.5 - i as f32 * 0.3, 0.2, -0.4 + i as f32 * 0.1, 0.9]
                },
                tokens,
                off_policy: i == 2,
            }
        })
        .collect()
}

#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub lora: bool,
    pub grad_checkpoint: bool,
    pub kind: &'static str,
    pub sequences: usize,
    pub minibatches: usize,
}

/// The case's trainer on `device`, its model [`model`]`(5, lora)`.
pub fn trainer_on(c: &Case, device: Device) -> Trainer {
    let mut t = Trainer::new(
        to_device(&model(5, c.lora), device),
        TrainConfig {
            loss: PolicyLossConfig {
                // The KL term needs a reference: LoRA's is the base with adapters off.
                kl_coef: if c.lora { 0.01 } else { 0.0 },
                // LUFFY's shaping on row 2 of [`batch`] (RL steps only).
                shaping: 0.1,
                // The entropy bonus at the tokens with an advantage (RL steps only).
                entropy: 0.05,
                ..PolicyLossConfig::default()
            },
            optim: AdamWConfig {
                lr: 1e-3,
                // Low enough that global-norm clipping binds.
                max_grad_norm: 0.05,
                ..AdamWConfig::default()
            },
            micro_batch_tokens: 48,
            logit_chunk: 7,
            grad_checkpoint: c.grad_checkpoint,
            minibatches_per_step: c.minibatches,
            skip_null_rows: true,
            reflection_lr_scale: 1.0,
        },
    )
    .unwrap();
    // The cases with gradient checkpointing take the overlapped all-reduce.
    t.overlap = Some(c.grad_checkpoint);
    t
}

/// One step of the case's kind (rl, sft, reflection).
pub fn step(t: &mut Trainer, c: &Case, seqs: &[Sequence]) -> StepMetrics {
    match c.kind {
        "rl" => t.rl_step(seqs),
        "sft" => t.sft_step(seqs),
        _ => t.reflection_step(seqs),
    }
    .unwrap()
}

/// How close two runs of one step must be: each metric to `rel` of max(|want|, 1); each tensor
/// to `rel` of its scale (its largest magnitude, at least 1e-3) plus `abs`.
#[derive(Debug, Clone, Copy)]
pub struct Tolerance {
    pub rel: f64,
    pub abs: f64,
}

/// Data parallel against one process on one device: the same kernels, other sums.
pub const DP_TOLERANCE: Tolerance = Tolerance {
    rel: 1e-5,
    abs: 1e-7,
};

/// `a` equals `b` within `tol` (compared on CPU); the difference over `b`'s scale.
pub fn tensor_agrees(what: &str, a: &Tensor, b: &Tensor, tol: Tolerance) -> f64 {
    let (a, b) = (a.to_device(Device::Cpu), b.to_device(Device::Cpu));
    let scale = b.abs().max().double_value(&[]).max(1e-3);
    let d = (&a - &b).abs().max().double_value(&[]);
    assert!(
        d <= tol.rel * scale + tol.abs,
        "{what}: max diff {d} (scale {scale})"
    );
    d / scale
}

/// `a` equals `b` to [`DP_TOLERANCE`].
pub fn close(what: &str, a: &Tensor, b: &Tensor) {
    tensor_agrees(what, a, b, DP_TOLERANCE);
}

/// `got`'s step and trainer agree with `want`'s within `tol`: the counts exactly, every metric,
/// every trainable tensor and, when `grads`, its gradient. Returns the largest relative
/// difference seen, for the report line.
pub fn steps_agree(
    case: &str,
    (got, gt): (&StepMetrics, &Trainer),
    (want, wt): (&StepMetrics, &Trainer),
    grads: bool,
    tol: Tolerance,
) -> f64 {
    assert_eq!(
        (
            got.tokens,
            got.sequences,
            got.minibatches,
            got.null_sequences,
            got.shaped_tokens
        ),
        (
            want.tokens,
            want.sequences,
            want.minibatches,
            want.null_sequences,
            want.shaped_tokens
        ),
        "{case}"
    );
    let mut worst = 0f64;
    for (name, a, b) in [
        ("loss", got.loss, want.loss),
        ("grad_norm", got.grad_norm, want.grad_norm),
        ("clip_fraction", got.clip_fraction, want.clip_fraction),
        ("kl", got.kl, want.kl),
        ("entropy", got.entropy, want.entropy),
        ("tis_mean", got.tis_mean, want.tis_mean),
        ("tis_min", got.tis_min, want.tis_min),
        ("tis_max", got.tis_max, want.tis_max),
        ("lr", got.lr, want.lr),
    ] {
        let d = (a - b).abs() / b.abs().max(1.0);
        assert!(d <= tol.rel, "{case}: {name} {a} vs {b}");
        worst = worst.max(d);
    }
    for ((n, a), (_, b)) in gt.model.trainable().iter().zip(wt.model.trainable().iter()) {
        if grads {
            let d = tensor_agrees(&format!("{case}: grad of {n}"), &a.grad(), &b.grad(), tol);
            worst = worst.max(d);
        }
        worst = worst.max(tensor_agrees(&format!("{case}: {n}"), a, b, tol));
    }
    worst
}

pub const CASES: [Case; 6] = [
    // Full fine-tune, SS-GRPO, gradient checkpointing.
    Case {
        lora: false,
        grad_checkpoint: true,
        kind: "rl",
        sequences: 7,
        minibatches: 1,
    },
    // Full fine-tune without checkpointing, SFT.
    Case {
        lora: false,
        grad_checkpoint: false,
        kind: "sft",
        sequences: 5,
        minibatches: 1,
    },
    // LoRA (only adapter gradients are reduced), two PPO minibatches.
    Case {
        lora: true,
        grad_checkpoint: true,
        kind: "rl",
        sequences: 7,
        minibatches: 2,
    },
    Case {
        lora: true,
        grad_checkpoint: false,
        kind: "rl",
        sequences: 4,
        minibatches: 1,
    },
    // Phase A reflection update.
    Case {
        lora: true,
        grad_checkpoint: true,
        kind: "reflection",
        sequences: 3,
        minibatches: 1,
    },
    // One sequence: rank 1 has nothing, and still takes part.
    Case {
        lora: false,
        grad_checkpoint: true,
        kind: "sft",
        sequences: 1,
        minibatches: 1,
    },
];

/// The small-model trainer of tests/train.rs: lr `lr`, KL coefficient `kl`, no clipping,
/// 64-token micro-batches, gradient checkpointing.
pub fn small_trainer(model: Qwen3, lr: f64, kl: f64) -> Trainer {
    Trainer::new(
        model,
        TrainConfig {
            loss: PolicyLossConfig {
                kl_coef: kl,
                ..PolicyLossConfig::default()
            },
            optim: AdamWConfig {
                lr,
                max_grad_norm: 0.0,
                ..AdamWConfig::default()
            },
            micro_batch_tokens: 64,
            logit_chunk: 7,
            grad_checkpoint: true,
            minibatches_per_step: 1,
            skip_null_rows: true,
            reflection_lr_scale: 1.0,
        },
    )
    .unwrap()
}

/// A tiny full fine-tune in `kind` on `device` whose weights are `src`'s (exactly, when `src` is
/// bf16-valued).
pub fn full_copy_on(src: &Qwen3, kind: Kind, device: Device) -> Qwen3 {
    let m = Qwen3::random(tiny_cfg(), 0, 0.02, device, kind).unwrap();
    tch::no_grad(|| {
        for ((_, mut d), (_, s)) in m.base_tensors().into_iter().zip(src.base_tensors()) {
            d.copy_(&s);
        }
    });
    m.set_trainable(true);
    m
}

/// Two SFT sequences of 20 and 14 tokens, the first 3 masked.
pub fn sft_data() -> Vec<Sequence> {
    [
        (0..20).map(|t| (t * 13 + 5) % 64).collect::<Vec<i64>>(),
        (0..14).map(|t| (t * 29 + 3) % 64).collect(),
    ]
    .into_iter()
    .map(|tokens| Sequence {
        unlikelihood: Vec::new(),
        loss_mask: (0..tokens.len()).map(|t| t >= 3).collect(),
        stages: vec![],
        behaviour_logprobs: vec![],
        advantages: vec![],
        tokens,
        off_policy: false,
    })
    .collect()
}

/// A bf16 full fine-tune on `device` at the papers' learning rate moves as the fp32 reference
/// does (its fp32 master copy), 60 SFT steps.
pub fn bf16_follows_fp32(device: Device) {
    // The papers' learning rate: an AdamW update of ~5e-7 is far below half a bf16 unit in the
    // last place of most weights (|w| ≈ 0.02 → ulp ≈ 1.2e-4), so without an fp32 master copy
    // almost every update rounds away and the bf16 model never moves.
    let lr = 5e-7;
    let steps = 60;
    let init = Qwen3::random(tiny_cfg(), 21, 0.02, Device::Cpu, Kind::BFloat16).unwrap();
    let init = full_copy_on(&init, Kind::BFloat16, device);
    let mut low = small_trainer(full_copy_on(&init, Kind::BFloat16, device), lr, 0.0);
    let mut reference = small_trainer(full_copy_on(&init, Kind::Float, device), lr, 0.0);
    assert!(low.opt.has_master() && !reference.opt.has_master());
    let data = sft_data();
    for _ in 0..steps {
        low.sft_step(&data).unwrap();
        reference.sft_step(&data).unwrap();
    }
    let (mut moved_ref, mut moved_low, mut dot, mut n_ref, mut n_low) = (0i64, 0i64, 0.0, 0.0, 0.0);
    for (((name, p0), (_, p_low)), (_, p_ref)) in init
        .base_tensors()
        .into_iter()
        .zip(low.model.trainable())
        .zip(reference.model.trainable())
    {
        let p0 = p0.to_kind(Kind::Float);
        let master = low.opt.master(&name).unwrap();
        // The bf16 parameter is its master rounded once.
        assert_eq!(
            (p_low.to_kind(Kind::Float) - master.to_kind(Kind::BFloat16).to_kind(Kind::Float))
                .abs()
                .max()
                .double_value(&[]),
            0.0,
            "{name}"
        );
        // Master and reference moved the same way (bf16 forward/backward: a tolerance).
        let (d_low, d_ref) = (master - &p0, &p_ref - &p0);
        dot += (&d_low * &d_ref).sum(Kind::Double).double_value(&[]);
        n_low += d_low.square().sum(Kind::Double).double_value(&[]);
        n_ref += d_ref.square().sum(Kind::Double).double_value(&[]);
        // Where the reference moved by more than one bf16 ulp, the bf16 weight must have
        // changed too.
        let ulp = p0.abs().clamp_min(1e-30).log2().floor().exp2() * 2f64.powi(-7);
        let must = d_ref.abs().gt_tensor(&ulp);
        moved_ref += must.sum(Kind::Int64).int64_value(&[]);
        moved_low += (must.logical_and(&p_low.to_kind(Kind::Float).ne_tensor(&p0)))
            .sum(Kind::Int64)
            .int64_value(&[]);
    }
    let cos = dot / (n_low.sqrt() * n_ref.sqrt());
    let ratio = (n_low / n_ref).sqrt();
    assert!(cos > 0.98, "update direction: cosine {cos}");
    assert!((ratio - 1.0).abs() < 0.05, "update size: ratio {ratio}");
    assert!(
        moved_ref > 1000,
        "the reference moved only {moved_ref} weights by > 1 ulp"
    );
    assert!(
        moved_low as f64 >= 0.97 * moved_ref as f64,
        "bf16 weights changed in {moved_low} of {moved_ref} places where fp32 moved > 1 ulp"
    );
}

/// The cases the ZeRO checks run: a full fine-tune under gradient checkpointing, LoRA with two
/// minibatches, and one sequence (a rank with none).
pub const ZERO_CASES: [Case; 3] = [CASES[0], CASES[2], CASES[5]];

/// [`dp_cases_agree`] for [`ZERO_CASES`] under ZeRO-1, then under ZeRO-2; the group back.
pub fn zero_cases_agree(group: Box<dyn Collective>, device: Device) -> Box<dyn Collective> {
    let mut g = group;
    for stage in [ZeroStage::One, ZeroStage::Two] {
        g = dp_cases_agree(g, device, Some(stage), &ZERO_CASES);
    }
    g
}

/// [`dp_cases_agree`] for every case in plain data parallel, then [`zero_cases_agree`]; the
/// group back.
pub fn dp_and_zero_cases_agree(group: Box<dyn Collective>, device: Device) -> Box<dyn Collective> {
    zero_cases_agree(dp_cases_agree(group, device, None, &CASES), device)
}

/// Every case of `cases` on `device`, as this rank of `group` (rank 0 leads each step, the
/// others follow it), with the optimizer sharded by `zero` when given, against the
/// one-process step on the whole batch, two steps a case:
/// - the step's counts exactly, its metrics to 1e-5 relative;
/// - every trainable tensor, and its gradient unless ZeRO-2 keeps only a shard of them, to
///   [`close`]'s tolerance;
/// - with LoRA, the frozen base has no gradient (only adapters were reduced);
/// - a sharded optimizer keeps 1/world of the state, rounded up.
///
/// Returns the group, for the next use.
pub fn dp_cases_agree(
    group: Box<dyn Collective>,
    device: Device,
    zero: Option<ZeroStage>,
    cases: &[Case],
) -> Box<dyn Collective> {
    let mut group = Some(group);
    for c in cases {
        let seqs = batch(c.sequences);
        let mut one = trainer_on(c, device);
        let mut dp = trainer_on(c, device);
        dp.set_collective(group.take().unwrap());
        if let Some(stage) = zero {
            dp.set_zero(stage).unwrap();
        }
        let (rank, world) = {
            let g = dp.collective().unwrap();
            (g.rank(), g.world())
        };
        for k in 0..2 {
            let want = step(&mut one, c, &seqs);
            let got = if rank == 0 {
                step(&mut dp, c, &seqs)
            } else {
                dp.follow_step(Duration::from_secs(60)).unwrap()
            };
            let case = format!("{zero:?} {c:?} step {k}");
            // Row 2 is off-policy: every RL case shapes its counted tokens.
            assert_eq!(want.shaped_tokens > 0, c.kind == "rl", "{case}");
            // ZeRO-2 keeps only this rank's shard of the gradients.
            let grads = zero != Some(ZeroStage::Two);
            steps_agree(&case, (&got, &dp), (&want, &one), grads, DP_TOLERANCE);
        }
        if c.lora {
            assert!(
                dp.model
                    .base_tensors()
                    .iter()
                    .all(|(_, t)| !t.grad().defined()),
                "{c:?}: a frozen base tensor has a gradient"
            );
        }
        if zero.is_some() {
            let shard = dp.zero_shard().expect("sharded");
            let total: i64 = one
                .model
                .trainable()
                .iter()
                .map(|(_, t)| t.numel() as i64)
                .sum();
            let world = world as i64;
            assert_eq!(shard.layout.chunk, (total + world - 1) / world);
        }
        eprintln!(
            "{zero:?} {c:?}: ok (rank {rank} of {world}, sync {:?})",
            dp.last_sync
        );
        group = dp.take_collective();
    }
    group.unwrap()
}
