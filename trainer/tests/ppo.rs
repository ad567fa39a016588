//! The PPO side of a train step on CPU with tiny random models: with two minibatches the second
//! update's ratio is against the policy the step started from (it moves, and the clip binds);
//! with one the ratio is 1 and nothing is clipped; Phase A's ratio is against the candidates'
//! generation-time log-probs, with no truncated importance weight on top, at
//! `reflection_lr_scale` times the rate (refused at 0); a full fine-tune with a KL term trains
//! against a frozen copy of its initial weights.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tch::{Device, Kind};
use trainer::loss::PolicyLossConfig;
use trainer::model::lora::{LoraConfig, LoraTarget};
use trainer::model::{Fwd, Qwen3, Qwen3Config};
use trainer::optim::AdamWConfig;
use trainer::train::{Sequence, TrainConfig, Trainer, minibatch_ranges};

fn tiny_cfg() -> Qwen3Config {
    serde_json::from_value(serde_json::json!({
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "max_position_embeddings": 128, "rope_theta": 10000.0, "tie_word_embeddings": true
    }))
    .unwrap()
}

/// A random tiny model with every base weight trainable (full fine-tune).
fn full_model(seed: i64) -> Qwen3 {
    let m = Qwen3::random(tiny_cfg(), seed, 0.2, Device::Cpu, Kind::Float).unwrap();
    m.set_trainable(true);
    m
}

fn config(lr: f64, kl: f64, minibatches: usize) -> TrainConfig {
    TrainConfig {
        loss: PolicyLossConfig {
            kl_coef: kl,
            tis_clamp: None,
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
        minibatches_per_step: minibatches,
        skip_null_rows: true,
        reflection_lr_scale: 1.0,
    }
}

/// A sequence of `n` tokens whose tokens from 3 on count, with one advantage.
fn seq(offset: i64, n: usize, adv: f32) -> Sequence {
    Sequence {
        unlikelihood: Vec::new(),
        tokens: (0..n as i64)
            .map(|t| (t * 7 + offset * 13 + 1) % 64)
            .collect(),
        loss_mask: (0..n).map(|t| t >= 3).collect(),
        stages: vec![],
        behaviour_logprobs: vec![],
        advantages: vec![adv],
        off_policy: false,
    }
}

/// Per-token log-probs of `s` under the trainer's policy (entry t: token t).
fn logprobs(tr: &Trainer, s: &Sequence) -> Vec<f32> {
    tr.logprobs(std::slice::from_ref(&s.tokens), Fwd::POLICY)
        .remove(0)
}

#[test]
fn minibatches_split_contiguously_and_evenly() {
    let lens = |n, m| {
        minibatch_ranges(n, m)
            .into_iter()
            .map(|r| (r.start, r.end))
            .collect::<Vec<_>>()
    };
    assert_eq!(lens(5, 2), [(0, 3), (3, 5)]);
    assert_eq!(lens(6, 3), [(0, 2), (2, 4), (4, 6)]);
    assert_eq!(lens(2, 4), [(0, 1), (1, 2)], "never an empty minibatch");
    assert_eq!(lens(7, 1), [(0, 7)]);
}

#[test]
fn the_second_minibatch_ratio_is_against_the_starting_policy_and_clips() {
    // Minibatch 2 repeats minibatch 1's sequences: after update 1 raised their log-probs
    // (positive advantages, a large LR), their ratio against the starting policy is far above
    // 1 + clip_high.
    let first = vec![seq(0, 14, 1.0), seq(1, 11, 1.0)];
    let batch: Vec<Sequence> = first.iter().chain(&first).cloned().collect();
    let mut tr = Trainer::new(full_model(3), config(1e-2, 0.0, 2)).unwrap();
    let start: Vec<Vec<f32>> = first.iter().map(|s| logprobs(&tr, s)).collect();
    let parts = tr.rl_minibatch_steps(&batch).unwrap();
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0].sequences, 2);
    assert_eq!(
        parts[0].ratio_mean, 1.0,
        "minibatch 1 is the starting policy"
    );
    assert_eq!(parts[0].clip_fraction, 0.0);
    assert!(
        parts[1].ratio_mean > 1.2 && parts[1].clip_fraction > 0.0,
        "minibatch 2 moved: {:?}",
        parts[1]
    );
    assert_eq!(tr.opt.step, 2, "one optimizer update per minibatch");

    // Its ratio is exactly against the starting policy: a twin that took only update 1 has the
    // weights minibatch 2 saw.
    let mut twin = Trainer::new(full_model(3), config(1e-2, 0.0, 1)).unwrap();
    twin.rl_step(&first).unwrap();
    let (mut sum, mut n) = (0.0f64, 0.0f64);
    for (s, lp0) in first.iter().zip(&start) {
        let lp1 = logprobs(&twin, s);
        for t in 0..s.tokens.len() {
            if s.loss_mask[t] {
                sum += f64::from(lp1[t] - lp0[t])
                    .clamp(-trainer::loss::MAX_LOG_RATIO, trainer::loss::MAX_LOG_RATIO)
                    .exp();
                n += 1.0;
            }
        }
    }
    let want = sum / n;
    assert!(
        (parts[1].ratio_mean - want).abs() < 1e-3 * want,
        "ratio {} vs {want}",
        parts[1].ratio_mean
    );

    // rl_step reports the updates aggregated.
    let mut tr = Trainer::new(full_model(3), config(1e-2, 0.0, 2)).unwrap();
    let m = tr.rl_step(&batch).unwrap();
    assert_eq!((m.minibatches, m.sequences), (2, 4));
    assert_eq!(m.tokens, parts[0].tokens + parts[1].tokens);
    assert!((m.clip_fraction - parts[1].clip_fraction / 2.0).abs() < 1e-9);
}

#[test]
fn one_minibatch_on_a_fresh_policy_has_ratio_one_and_no_clipping() {
    let batch = vec![seq(0, 14, 1.0), seq(1, 11, -1.0), seq(2, 9, 0.5)];
    let mut tr = Trainer::new(full_model(5), config(1e-2, 0.0, 1)).unwrap();
    let m = tr.rl_step(&batch).unwrap();
    assert_eq!(m.minibatches, 1);
    assert_eq!(m.ratio_mean, 1.0);
    assert_eq!(m.clip_fraction, 0.0);
    assert!(m.grad_norm > 0.0);
    // More minibatches than sequences: one per sequence.
    let mut tr = Trainer::new(full_model(5), config(1e-2, 0.0, 8)).unwrap();
    assert_eq!(tr.rl_step(&batch).unwrap().minibatches, 3);
}

#[test]
fn phase_a_ratio_is_against_the_generation_time_log_probs() {
    let mut tr = Trainer::new(full_model(7), config(1e-3, 0.0, 1)).unwrap();
    let mut cands = vec![seq(0, 14, 1.0), seq(1, 12, -1.0)];
    // Behaviour log-probs half a nat below the current policy's at the counted tokens; the
    // first counted token of each is "not recorded" (0), so it keeps ratio 1.
    let mut want = (0.0, 0.0);
    for s in &mut cands {
        let lp = logprobs(&tr, s);
        s.behaviour_logprobs = lp
            .iter()
            .enumerate()
            .map(|(t, &l)| {
                if t > 3 && s.loss_mask[t] {
                    l - 0.5
                } else {
                    0.0
                }
            })
            .collect();
        for t in 0..s.tokens.len() {
            if s.loss_mask[t] {
                want.0 += if t > 3 { 0.5f64.exp() } else { 1.0 };
                want.1 += 1.0;
            }
        }
    }
    let want = want.0 / want.1;
    let m = tr.reflection_step(&cands).unwrap();
    assert!(
        (m.ratio_mean - want).abs() < 1e-4,
        "ratio {} vs {want}",
        m.ratio_mean
    );
    // exp(0.5) > 1 + clip_high: every recorded token of the positive candidate is clipped, and
    // none of the negative one's (its unclipped branch is the larger loss).
    assert!(m.clip_fraction > 0.0 && m.clip_fraction < 1.0, "{m:?}");
    assert_eq!(
        (m.tis_mean, m.tis_min, m.tis_max),
        (1.0, 1.0, 1.0),
        "no truncated IS in Phase A"
    );

    // The same candidates as Phase B sequences: ratio 1 against the step's own policy.
    let mut tr = Trainer::new(full_model(7), config(1e-3, 0.0, 1)).unwrap();
    let m = tr.rl_step(&cands).unwrap();
    assert_eq!((m.ratio_mean, m.clip_fraction), (1.0, 0.0));
}

/// Every trainable tensor of `tr`, copied.
fn weights(tr: &Trainer) -> Vec<(String, tch::Tensor)> {
    tr.model
        .trainable()
        .into_iter()
        .map(|(n, p)| (n, p.detach().copy()))
        .collect()
}

#[test]
fn phase_a_takes_its_fraction_of_the_rate_and_is_refused_at_zero() {
    let cands = vec![seq(0, 14, 1.0), seq(1, 12, -1.0), seq(2, 9, 0.5)];
    let task = vec![seq(3, 13, 1.0), seq(4, 10, -1.0)];
    let scaled = |lr: f64, scale: f64| {
        let mut c = config(lr, 0.0, 1);
        c.reflection_lr_scale = scale;
        Trainer::new(full_model(11), c).unwrap()
    };
    // Phase A at a quarter of 4e-3 is the same update as Phase A at 1e-3.
    let mut a = scaled(4e-3, 0.25);
    let mut b = scaled(1e-3, 1.0);
    let before = weights(&a);
    let (ma, mb) = (
        a.reflection_step(&cands).unwrap(),
        b.reflection_step(&cands).unwrap(),
    );
    assert!(
        (ma.lr - 1e-3).abs() < 1e-15 && (mb.lr - 1e-3).abs() < 1e-15,
        "{ma:?}"
    );
    assert_eq!(ma.loss, mb.loss);
    let mut moved = 0.0f64;
    for (((name, wa), (_, wb)), (_, w0)) in weights(&a).iter().zip(weights(&b)).zip(&before) {
        let d = (wa - &wb).abs().max().double_value(&[]);
        assert!(d < 1e-7, "{name}: {d}");
        moved = moved.max((wa - w0).abs().max().double_value(&[]));
    }
    assert!(moved > 1e-4, "Phase A moved nothing: {moved}");
    // The task step keeps the whole rate.
    assert!((a.rl_step(&task).unwrap().lr - 4e-3).abs() < 1e-15);

    // At 0 Phase A is left out: the step is refused, naming the setting, and nothing moves.
    let mut z = scaled(4e-3, 0.0);
    let before = weights(&z);
    let e = z.reflection_step(&cands).unwrap_err().to_string();
    assert!(
        e.contains("reflection_lr_scale = 0") && e.contains("3 sequences"),
        "{e}"
    );
    for ((name, w), (_, w0)) in weights(&z).iter().zip(&before) {
        assert!(w.equal(w0), "{name} moved");
    }
    assert!((z.rl_step(&task).unwrap().lr - 4e-3).abs() < 1e-15);
}

#[test]
fn a_full_fine_tune_with_kl_trains_against_a_frozen_copy_of_its_initial_weights() {
    let batch = vec![seq(0, 14, 1.0), seq(1, 11, -1.0)];
    let e = Trainer::new(full_model(9), config(1e-2, 0.1, 1)).unwrap_err();
    assert!(e.to_string().contains("reference"), "{e}");
    // LoRA keeps the base with adapters off as its reference: no copy.
    let mut lora = full_model(9);
    lora.set_trainable(false);
    lora.add_lora(
        &LoraConfig {
            r: 4,
            alpha: 8.0,
            dropout: 0.0,
            targets: LoraTarget::ALL.to_vec(),
        },
        1,
    )
    .unwrap();
    let e = Trainer::with_reference(lora, Some(full_model(9)), config(1e-2, 0.1, 1)).unwrap_err();
    assert!(e.to_string().contains("LoRA"), "{e}");

    let mut tr =
        Trainer::with_reference(full_model(9), Some(full_model(9)), config(1e-2, 0.1, 1)).unwrap();
    let m1 = tr.rl_step(&batch).unwrap();
    assert!(
        m1.kl.abs() < 1e-9,
        "the policy starts at the reference: {}",
        m1.kl
    );
    let m2 = tr.rl_step(&batch).unwrap();
    assert!(
        m2.kl > 1e-4,
        "the policy moved away from the reference: {}",
        m2.kl
    );
    // The reference did not move and takes no gradient.
    let fresh = full_model(9);
    let reference = tr.reference.as_ref().unwrap();
    for ((name, a), (_, b)) in reference.base_tensors().iter().zip(fresh.base_tensors()) {
        assert!(!a.requires_grad(), "{name} takes gradients");
        assert_eq!((a - b).abs().max().double_value(&[]), 0.0, "{name} moved");
    }
}
