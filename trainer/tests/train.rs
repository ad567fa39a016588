//! Train-step behaviour on CPU with tiny random models: SS-GRPO with equal stage advantages is
//! GRPO; positive advantages raise log-probs and negative lower them; SFT overfits and masked
//! tokens get no gradient; the unlikelihood term on marked tokens is −log(1 − p) with its
//! gradient, and alone lowers those tokens; the entropy bonus is −c·H where the advantage is not
//! 0, with its gradient, and alone raises the entropy; copy sequences repeat a span at varying distances; micro-batches
//! keep the budget without padding short rows to long ones; rows that share a prompt run it
//! once with the loss and gradients of each row whole; optimizer + adapter checkpoints
//! continue exactly, and so does a stopped `trainer sft`; the tokenizer trainer and `init`
//! write a directory transformers loads with the same logits.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};

use common::cases::{
    full_copy_on, lora_config as lora, sft_data, small_trainer as trainer, tiny_cfg,
};
use common::seq;
use tch::{Device, Kind, Tensor};
use trainer::model::{Fwd, Qwen3};
use trainer::train::{Sequence, Trainer};

fn lora_model(seed: i64) -> Qwen3 {
    let mut m = Qwen3::random(tiny_cfg(), seed, 0.2, Device::Cpu, Kind::Float).unwrap();
    m.add_lora(&lora(), seed + 1).unwrap();
    // Non-zero B, so the reference (adapters off) differs from the policy.
    let _guard = trainer::model::rng_lock();
    tch::manual_seed(seed + 2);
    for (_, _, p) in m.projections_mut() {
        if let Some(l) = &mut p.lora {
            tch::no_grad(|| {
                let _ =
                    l.b.f_copy_(&(Tensor::randn(l.b.size(), (Kind::Float, Device::Cpu)) * 0.1));
            });
        }
    }
    m
}

fn grads(t: &Trainer) -> Vec<Tensor> {
    t.model
        .lora_tensors()
        .into_iter()
        .map(|(_, p)| p.grad().copy())
        .collect()
}

#[test]
fn ss_grpo_with_equal_stage_advantages_is_grpo() {
    let toks: Vec<Vec<i64>> = (0..3)
        .map(|r| (0..17).map(|t| (t * 7 + r * 11) % 64).collect())
        .collect();
    let run = |stagewise: bool| {
        let mut tr = trainer(lora_model(1), 0.0, 0.01);
        let batch: Vec<Sequence> = toks
            .iter()
            .enumerate()
            .map(|(r, t)| {
                let a = 0.5 - r as f32 * 0.6;
                seq(t.clone(), if stagewise { vec![a; 4] } else { vec![a] })
            })
            .collect();
        let m = tr.rl_step(&batch).unwrap();
        (m.loss, grads(&tr))
    };
    let (l1, g1) = run(true);
    let (l2, g2) = run(false);
    assert!((l1 - l2).abs() < 1e-7, "{l1} vs {l2}");
    for (a, b) in g1.iter().zip(&g2) {
        assert!((a - b).abs().max().double_value(&[]) < 1e-7);
    }
    // And different stage advantages do change the gradient.
    let mut tr = trainer(lora_model(1), 0.0, 0.01);
    let batch: Vec<Sequence> = toks
        .iter()
        .map(|t| seq(t.clone(), vec![1.0, -1.0, 0.5, 0.0]))
        .collect();
    tr.rl_step(&batch).unwrap();
    let g3 = grads(&tr);
    assert!(
        g3.iter()
            .zip(&g1)
            .any(|(a, b)| (a - b).abs().max().double_value(&[]) > 1e-6)
    );
}

fn mean_logprob(tr: &Trainer, s: &Sequence) -> f64 {
    let lp = &tr.logprobs(std::slice::from_ref(&s.tokens), Fwd::POLICY)[0];
    let (sum, n) = lp
        .iter()
        .zip(&s.loss_mask)
        .filter(|(_, m)| **m)
        .fold((0.0, 0), |(a, n), (l, _)| (a + *l as f64, n + 1));
    sum / n as f64
}

#[test]
fn positive_advantages_raise_log_probs_and_negative_lower_them() {
    let up = seq(
        (0..16).map(|t| (t * 5 + 1) % 64).collect(),
        vec![1.0, 1.0, 1.0, 1.0],
    );
    let down = seq((0..16).map(|t| (t * 3 + 2) % 64).collect(), vec![-1.0; 4]);
    let mut tr = trainer(lora_model(4), 1e-2, 0.0);
    let (u0, d0) = (mean_logprob(&tr, &up), mean_logprob(&tr, &down));
    for _ in 0..3 {
        tr.rl_step(&[up.clone(), down.clone()]).unwrap();
    }
    let (u1, d1) = (mean_logprob(&tr, &up), mean_logprob(&tr, &down));
    assert!(u1 > u0 + 1e-3, "positive advantage: {u0} -> {u1}");
    assert!(d1 < d0 - 1e-3, "negative advantage: {d0} -> {d1}");
}

#[test]
fn sft_overfits_and_masked_tokens_get_no_gradient() {
    // The loss function: masked positions receive exactly zero gradient.
    let logp = {
        let _guard = trainer::model::rng_lock();
        Tensor::randn([2, 6], (Kind::Float, Device::Cpu)).set_requires_grad(true)
    };
    let mask = Tensor::from_slice(&[0f32, 1., 1., 0., 1., 0., 1., 0., 0., 1., 1., 1.]).view([2, 6]);
    trainer::loss::sft_loss(&logp, &mask).backward();
    let g = logp.grad();
    let unmasked: Tensor = 1.0 - &mask;
    assert_eq!(
        (&g * unmasked).abs().sum(Kind::Float).double_value(&[]),
        0.0
    );
    assert!((g * &mask).abs().sum(Kind::Float).double_value(&[]) > 0.0);

    // Full fine-tune (no adapters, so no reference and kl 0).
    let model = Qwen3::random(tiny_cfg(), 9, 0.2, Device::Cpu, Kind::Float).unwrap();
    model.set_trainable(true);
    let mut tr = trainer(model, 3e-3, 0.0);
    let mk = |tokens: Vec<i64>| {
        let n = tokens.len();
        Sequence {
            unlikelihood: Vec::new(),
            // Prompt (3 tokens) and a "tool output" span (8..11) are masked.
            loss_mask: (0..n).map(|t| t >= 3 && !(8..11).contains(&t)).collect(),
            stages: vec![],
            behaviour_logprobs: vec![],
            advantages: vec![],
            tokens,
            off_policy: false,
        }
    };
    let data = vec![
        mk((0..20).map(|t| (t * 13 + 5) % 64).collect()),
        mk((0..14).map(|t| (t * 29 + 3) % 64).collect()),
    ];
    // A masked token that is never an input (the tool span's targets are masked): changing
    // the targets at masked positions must not change the gradient. Position 19 is masked
    // and last, so it is only ever a target.
    let mut masked_last = data[0].clone();
    masked_last.loss_mask[19] = false;
    let mut other = masked_last.clone();
    other.tokens[19] = (other.tokens[19] + 1) % 64;
    let probe = |s: &Sequence| {
        let m = Qwen3::random(tiny_cfg(), 9, 0.2, Device::Cpu, Kind::Float).unwrap();
        m.set_trainable(true);
        let mut t = trainer(m, 0.0, 0.0);
        t.sft_step(std::slice::from_ref(s)).unwrap();
        t.model
            .trainable()
            .into_iter()
            .map(|(_, p)| p.grad().copy())
            .collect::<Vec<_>>()
    };
    for (a, b) in probe(&masked_last).iter().zip(&probe(&other)) {
        assert_eq!((a - b).abs().max().double_value(&[]), 0.0);
    }

    let first = tr.sft_step(&data).unwrap().loss;
    let mut last = first;
    for _ in 0..80 {
        last = tr.sft_step(&data).unwrap().loss;
    }
    assert!(
        first > 3.0,
        "a random model starts near ln(64) = 4.16: {first}"
    );
    assert!(last < 0.2, "SFT did not overfit: {first} -> {last}");
}

/// The head runs only on positions that carry a loss mask; the step's loss and every gradient
/// (the tied embedding's too) must still be those of plain autograd through the whole logits,
/// row by row without padding.
/// A full fine-tune of the tiny config from `seed`, every weight trainable.
fn fresh_full(seed: i64) -> Qwen3 {
    let m = Qwen3::random(tiny_cfg(), seed, 0.2, Device::Cpu, Kind::Float).unwrap();
    m.set_trainable(true);
    m
}

/// The trainable weights' gradients after a step, by name.
fn trained_grads(tr: &Trainer) -> Vec<(String, Tensor)> {
    tr.model
        .trainable()
        .into_iter()
        .map(|(n, p)| (n, p.grad().copy()))
        .collect()
}

/// The trainable weights after a step, by name (detached copies).
fn trained_weights(tr: &Trainer) -> Vec<(String, Tensor)> {
    tr.model
        .trainable()
        .into_iter()
        .map(|(n, p)| (n, p.detach().copy()))
        .collect()
}

/// RL rows of `(length, advantage)`, row r's token t being `(t·mul + r·row_mul + add) % 64`.
fn rl_rows(rows: &[(i64, f32)], mul: i64, row_mul: i64, add: i64) -> Vec<Sequence> {
    rows.iter()
        .enumerate()
        .map(|(r, &(n, a))| {
            seq(
                (0..n)
                    .map(|t| (t * mul + r as i64 * row_mul + add) % 64)
                    .collect(),
                vec![a],
            )
        })
        .collect()
}

/// log p(token t+1 | prefix) of `tokens` through `m`'s full head, with autograd: the reference
/// the trainer's loss-positions-only head is checked against.
fn full_head_logp(m: &Qwen3, tokens: &[i64]) -> Tensor {
    let n = tokens.len() as i64;
    let ids = Tensor::from_slice(tokens).view([1, n]);
    full_head_log_softmax(m, tokens)
        .gather(1, &ids.narrow(1, 1, n - 1).view([-1, 1]), false)
        .squeeze_dim(1)
}

/// log π(·|prefix) [n − 1, V] at the positions that predict tokens 1.. of `tokens`, through `m`'s
/// full head with autograd.
fn full_head_log_softmax(m: &Qwen3, tokens: &[i64]) -> Tensor {
    let n = tokens.len() as i64;
    let ids = Tensor::from_slice(tokens).view([1, n]);
    m.logits(&ids.narrow(1, 0, n - 1), Fwd::TRAIN)
        .log_softmax(-1, Kind::Float)
        .squeeze_dim(0)
}

/// A per-token flag as the f32 weights of the positions that predict tokens 1.. (shifted).
fn shifted(flags: &[bool]) -> Tensor {
    let v: Vec<f32> = flags[1..].iter().map(|&m| f32::from(u8::from(m))).collect();
    Tensor::from_slice(&v)
}

/// Tokens the loss counts over `data` (the token mean's divisor).
fn counted(data: &[Sequence]) -> usize {
    data.iter()
        .map(|s| s.loss_mask[1..].iter().filter(|&&m| m).count())
        .sum()
}

/// The reference's `total` as a token mean over `data`'s counted tokens, back-propagated (so the
/// reference model holds its gradients); the step's `loss` must equal it to 1e-5 of its size.
fn token_mean_backward(total: Tensor, data: &[Sequence], loss: f64) {
    let total = total / counted(data) as f64;
    total.backward();
    let want = total.double_value(&[]);
    assert!(
        (loss - want).abs() < 1e-5 * want.abs(),
        "loss {loss} vs {want}"
    );
}

/// Every trainable weight's gradient in `ours` equals `reference`'s (after its backward) to
/// 1e-5 of the largest entry, and none is zero.
fn assert_grads_match(ours: &[(String, Tensor)], reference: &Qwen3) {
    for (name, p) in reference.trainable() {
        let g = &ours.iter().find(|(n, _)| *n == name).unwrap().1;
        let scale = p.grad().abs().max().double_value(&[]);
        let d = (g - p.grad()).abs().max().double_value(&[]);
        assert!(scale > 0.0, "{name}: no gradient");
        assert!(d <= 1e-5 * scale, "{name}: max |diff| {d} (scale {scale})");
    }
}

#[test]
fn the_head_on_masked_positions_only_gives_the_full_heads_loss_and_gradients() {
    let mk = |tokens: Vec<i64>, prompt: usize, tool: std::ops::Range<usize>| Sequence {
        unlikelihood: Vec::new(),
        loss_mask: (0..tokens.len())
            .map(|t| t >= prompt && !tool.contains(&t))
            .collect(),
        stages: vec![],
        behaviour_logprobs: vec![],
        advantages: vec![],
        tokens,
        off_policy: false,
    };
    // Rows of 23 and 15 tokens share a micro-batch (the shorter padded); chunks of 7 positions
    // cut across kept and dropped positions.
    let data = vec![
        mk((0..23).map(|t| (t * 13 + 5) % 64).collect(), 6, 11..17),
        mk((0..15).map(|t| (t * 29 + 3) % 64).collect(), 4, 8..10),
    ];
    let mut tr = trainer(fresh_full(21), 0.0, 0.0);
    let loss = tr.sft_step(&data).unwrap().loss;
    let ours = trained_grads(&tr);

    let reference = fresh_full(21);
    let mut total = Tensor::zeros([], (Kind::Float, Device::Cpu));
    for s in &data {
        total -= (full_head_logp(&reference, &s.tokens) * shifted(&s.loss_mask)).sum(Kind::Float);
    }
    token_mean_backward(total, &data, loss);
    assert_grads_match(&ours, &reference);
}

/// RL sequences for the unlikelihood tests: `seq`'s stages and advantage `adv`, no behaviour
/// log-probs (truncated importance weights 1), and `marks` carrying the unlikelihood term.
fn marked(tokens: Vec<i64>, adv: f32, marks: std::ops::Range<usize>) -> Sequence {
    let mut s = seq(tokens, vec![adv; 4]);
    s.behaviour_logprobs.clear();
    if !marks.is_empty() {
        s.unlikelihood = (0..s.tokens.len()).map(|t| marks.contains(&t)).collect();
    }
    s
}

#[test]
fn the_unlikelihood_term_adds_minus_log_one_minus_p_on_marked_tokens_with_its_gradient() {
    let coef = 0.5;
    // Rows of 21 and 13 tokens (3 prompt tokens each): the first ends in 6 marked tokens, the
    // second has none; chunks of 7 positions cut across them.
    let data = vec![
        marked((0..21).map(|t| (t * 13 + 5) % 64).collect(), -1.0, 15..21),
        marked((0..13).map(|t| (t * 29 + 3) % 64).collect(), 0.5, 0..0),
    ];
    let run = |c: f64| {
        let mut tr = trainer(fresh_full(23), 0.0, 0.0);
        tr.cfg.loss.unlikelihood = c;
        let m = tr.rl_step(&data).unwrap();
        (m, trained_grads(&tr))
    };
    let (m, ours) = run(coef);

    // The reference: token-mean over counted tokens of −A·ρ (ρ = 1, gradient −A·∇log p) plus
    // coef · −log(1 − p) at the marked ones, through autograd with the full head.
    let reference = fresh_full(23);
    let mut total = Tensor::zeros([], (Kind::Float, Device::Cpu));
    let (mut ul_sum, mut ul_n) = (0.0, 0.0);
    for s in &data {
        let logp = full_head_logp(&reference, &s.tokens);
        let ratio = (&logp - logp.detach()).exp();
        total += (ratio * shifted(&s.loss_mask)).sum(Kind::Float) * -f64::from(s.advantages[0]);
        if !s.unlikelihood.is_empty() {
            let marks = shifted(&s.unlikelihood);
            let u = -(logp.exp().neg() + 1.0).log();
            ul_sum += (u.detach() * &marks).sum(Kind::Float).double_value(&[]);
            ul_n += marks.sum(Kind::Float).double_value(&[]);
            total += (u * marks).sum(Kind::Float) * coef;
        }
    }
    token_mean_backward(total, &data, m.loss);
    assert_eq!((m.unlikelihood_tokens, ul_n), (6, 6.0));
    assert!(
        (m.unlikelihood - ul_sum / ul_n).abs() < 1e-5,
        "mean −log(1 − p) {} vs {}",
        m.unlikelihood,
        ul_sum / ul_n
    );
    assert_grads_match(&ours, &reference);

    // Off (coefficient 0) the marks change nothing: the policy gradient alone, no tokens counted.
    let (m0, plain) = run(0.0);
    assert_eq!((m0.unlikelihood_tokens, m0.unlikelihood), (0, 0.0));
    let moved = max_diff(&ours, &plain);
    assert!(
        moved > 1e-6,
        "the term did not change the gradient ({moved})"
    );
}

#[test]
fn the_unlikelihood_term_alone_lowers_the_marked_tokens_and_leaves_a_zero_advantage_batch_else_unmoved()
 {
    // Advantages 0: the policy gradient is 0, so only the term moves the weights.
    let s = marked((0..20).map(|t| (t * 11 + 2) % 64).collect(), 0.0, 12..20);
    let at_marks = |tr: &Trainer| {
        let lp = &tr.logprobs(std::slice::from_ref(&s.tokens), Fwd::POLICY)[0];
        (13..20).map(|t| f64::from(lp[t - 1])).sum::<f64>() / 7.0
    };
    let mut tr = trainer(fresh_full(5), 1e-2, 0.0);
    tr.cfg.loss.unlikelihood = 1.0;
    let before = at_marks(&tr);
    for _ in 0..3 {
        tr.rl_step(std::slice::from_ref(&s)).unwrap();
    }
    let after = at_marks(&tr);
    assert!(
        after < before - 1e-3,
        "marked tokens' mean log-prob {before} -> {after}"
    );
    let mut off = trainer(fresh_full(5), 1e-2, 0.0);
    let w0 = off.model.trainable();
    let w0: Vec<Tensor> = w0.iter().map(|(_, p)| p.copy()).collect();
    off.rl_step(std::slice::from_ref(&s)).unwrap();
    for ((name, p), w) in off.model.trainable().iter().zip(&w0) {
        assert_eq!(
            (p - w).abs().max().double_value(&[]),
            0.0,
            "{name} moved without the term"
        );
    }
}

#[test]
fn off_policy_shaping_takes_minus_a_p_over_p_plus_gamma_on_a_demonstrations_tokens_alone() {
    let gamma = 0.1;
    // An off-policy row of 19 tokens (a demonstration, advantage 1.5) beside a policy row of 14
    // (advantage -0.5), 3 prompt tokens each; chunks of 7 positions cut across both.
    let mut demo = marked((0..19).map(|t| (t * 7 + 1) % 64).collect(), 1.5, 0..0);
    demo.off_policy = true;
    let data = vec![
        demo,
        marked((0..14).map(|t| (t * 17 + 9) % 64).collect(), -0.5, 0..0),
    ];
    let run = |g: f64| {
        let mut tr = trainer(fresh_full(31), 0.0, 0.0);
        tr.cfg.loss.shaping = g;
        let m = tr.rl_step(&data).unwrap();
        (m, trained_grads(&tr))
    };
    let (m, ours) = run(gamma);

    // The reference, through autograd with the full head: token-mean over counted tokens of
    // −A·π/(π + γ) on the demonstration's tokens and −A·ρ (ρ = 1) on the policy's.
    let reference = fresh_full(31);
    let mut total = Tensor::zeros([], (Kind::Float, Device::Cpu));
    for s in &data {
        let logp = full_head_logp(&reference, &s.tokens);
        let a = -f64::from(s.advantages[0]);
        let per_token = if s.off_policy {
            let p = logp.exp();
            &p / (&p + gamma)
        } else {
            (&logp - logp.detach()).exp()
        };
        total += (per_token * shifted(&s.loss_mask)).sum(Kind::Float) * a;
    }
    token_mean_backward(total, &data, m.loss);
    assert_eq!(m.shaped_tokens, 16);
    assert_eq!(m.clip_fraction, 0.0);
    assert_grads_match(&ours, &reference);

    // Off (γ = 0) the flag changes nothing: the demonstration takes the ratio like the policy's
    // rows, and no token is counted as shaped.
    let (m0, plain) = run(0.0);
    assert_eq!(m0.shaped_tokens, 0);
    let mut flat = data.clone();
    flat[0].off_policy = false;
    let mut tr = trainer(fresh_full(31), 0.0, 0.0);
    tr.cfg.loss.shaping = gamma;
    let m_flat = tr.rl_step(&flat).unwrap();
    assert_eq!((m_flat.shaped_tokens, m_flat.loss), (0, m0.loss));
    assert_eq!(
        max_diff(&trained_grads(&tr), &plain),
        0.0,
        "γ moved a batch without off-policy rows"
    );
    let moved = max_diff(&ours, &plain);
    assert!(
        moved > 1e-6,
        "shaping did not change the gradient ({moved})"
    );
}

/// H(π(·|prefix)) at the positions that predict tokens 1.. of `tokens` through `m`'s full head,
/// with autograd.
fn full_head_entropy(m: &Qwen3, tokens: &[i64]) -> Tensor {
    let logp = full_head_log_softmax(m, tokens);
    -(logp.exp() * logp).sum_dim_intlist(-1, false, Kind::Float)
}

#[test]
fn the_entropy_bonus_subtracts_c_times_the_entropy_where_the_advantage_is_not_zero() {
    let coef = 0.3;
    // Rows of 19, 14 and 11 tokens (3 prompt tokens each) with advantages 1.5, -0.5 and 0 (a
    // null row); chunks of 7 positions cut across them.
    let data = vec![
        marked((0..19).map(|t| (t * 7 + 1) % 64).collect(), 1.5, 0..0),
        marked((0..14).map(|t| (t * 17 + 9) % 64).collect(), -0.5, 0..0),
        marked((0..11).map(|t| (t * 23 + 4) % 64).collect(), 0.0, 0..0),
    ];
    let run = |c: f64, skip: bool| {
        let mut tr = trainer(fresh_full(37), 0.0, 0.0);
        tr.cfg.loss.entropy = c;
        tr.cfg.skip_null_rows = skip;
        let m = tr.rl_step(&data).unwrap();
        (m, trained_grads(&tr))
    };
    let (m, ours) = run(coef, true);
    assert_eq!(m.null_sequences, 1);

    // The reference, through autograd with the full head: token-mean over all counted tokens of
    // −A·ρ (ρ = 1) minus coef · H at the tokens of the rows with an advantage.
    let reference = fresh_full(37);
    let mut total = Tensor::zeros([], (Kind::Float, Device::Cpu));
    for s in &data {
        let logp = full_head_logp(&reference, &s.tokens);
        let a = f64::from(s.advantages[0]);
        let mask = shifted(&s.loss_mask);
        total += ((&logp - logp.detach()).exp() * &mask).sum(Kind::Float) * -a;
        if a != 0.0 {
            total -= (full_head_entropy(&reference, &s.tokens) * &mask).sum(Kind::Float) * coef;
        }
    }
    token_mean_backward(total, &data, m.loss);
    assert_grads_match(&ours, &reference);

    // The null row takes no bonus, so training it gives the same update as skipping it.
    let (m_all, all) = run(coef, false);
    assert_eq!(m_all.null_sequences, 0);
    assert!(
        (m_all.loss - m.loss).abs() < 1e-6,
        "{} vs {}",
        m_all.loss,
        m.loss
    );
    let d = max_diff(&all, &ours);
    assert!(d < 1e-6, "the null row moved the update by {d}");
    // Off, the gradient is the policy gradient's alone; the entropy metric is the same either way.
    let (m0, plain) = run(0.0, true);
    assert!((m0.entropy - m.entropy).abs() < 1e-9);
    let moved = max_diff(&ours, &plain);
    assert!(
        moved > 1e-6,
        "the bonus did not change the gradient ({moved})"
    );
}

#[test]
fn the_entropy_bonus_alone_raises_the_entropy_of_the_rows_with_an_advantage() {
    // A tiny advantage: the policy gradient is negligible beside the bonus.
    let s = marked((0..20).map(|t| (t * 11 + 2) % 64).collect(), 1e-6, 0..0);
    let entropy = |tr: &Trainer| {
        let h = full_head_entropy(&tr.model, &s.tokens);
        (h * shifted(&s.loss_mask))
            .sum(Kind::Float)
            .double_value(&[])
    };
    let mut tr = trainer(fresh_full(5), 1e-2, 0.0);
    tr.cfg.loss.entropy = 1.0;
    let before = entropy(&tr);
    for _ in 0..3 {
        tr.rl_step(std::slice::from_ref(&s)).unwrap();
    }
    let after = entropy(&tr);
    assert!(after > before + 1e-3, "summed entropy {before} -> {after}");
}

#[test]
fn micro_batches_keep_the_budget_and_do_not_pad_short_rows_to_long_ones() {
    use trainer::train::micro_batches;
    // Longest first; a row under half its group's longest opens a new group.
    assert_eq!(
        micro_batches(&[2000, 64, 1900, 60, 900], 16384),
        vec![vec![0, 2], vec![4], vec![1, 3]]
    );
    // The padded budget: 3 x 10 tokens over a budget of 20.
    assert_eq!(micro_batches(&[10, 10, 10], 20), vec![vec![0, 1], vec![2]]);
    // A row over the budget goes alone.
    assert_eq!(micro_batches(&[50, 8], 20), vec![vec![0], vec![1]]);
}

#[test]
fn the_shared_prefix_is_what_every_row_of_two_or_more_has_in_common_from_the_start() {
    use trainer::train::{MIN_SHARED_PREFIX, shared_prefix};
    let row = |shared: i64, len: i64, r: i64| -> Vec<i64> {
        (0..len)
            .map(|t| {
                if t < shared {
                    t % 64
                } else {
                    (t + 7 * r + 1) % 64
                }
            })
            .collect()
    };
    // 40 tokens in common, then every row its own.
    assert_eq!(
        shared_prefix(&[row(40, 60, 0), row(40, 50, 1), row(40, 90, 2)]),
        40
    );
    // One row shares with nothing.
    assert_eq!(shared_prefix(&[row(40, 60, 0)]), 0);
    assert_eq!(shared_prefix(&[]), 0);
    // Under the floor, nothing is run once.
    let few = MIN_SHARED_PREFIX as i64 - 1;
    assert_eq!(shared_prefix(&[row(few, 60, 0), row(few, 60, 1)]), 0);
    // A row's inputs are its tokens but the last: a 41-token row shares at most 40 of them.
    assert_eq!(shared_prefix(&[row(60, 41, 0), row(60, 80, 1)]), 40);
    // Identical rows keep one position of their own in the padded width.
    assert_eq!(shared_prefix(&[row(50, 50, 0), row(50, 50, 0)]), 48);
}

/// A step that moves no weight (learning rate 0, no clipping), default loss, one minibatch:
/// what comparing a step's loss and gradients between two batchings needs.
fn unmoving_step(
    micro_batch_tokens: i64,
    logit_chunk: i64,
    grad_checkpoint: bool,
) -> trainer::train::TrainConfig {
    trainer::train::TrainConfig {
        loss: trainer::loss::PolicyLossConfig::default(),
        optim: trainer::optim::AdamWConfig {
            lr: 0.0,
            max_grad_norm: 0.0,
            ..trainer::optim::AdamWConfig::default()
        },
        micro_batch_tokens,
        logit_chunk,
        grad_checkpoint,
        minibatches_per_step: 1,
        skip_null_rows: true,
        reflection_lr_scale: 1.0,
    }
}

/// RL rows of `lens` tokens whose first `shared` tokens are the same in every row and the rest
/// the row's own; the loss counts every position from `loss_from` on (inside the shared part
/// too), with advantages of both signs.
fn prompt_rows(lens: &[i64], shared: i64, loss_from: usize) -> Vec<Sequence> {
    lens.iter()
        .enumerate()
        .map(|(r, &n)| {
            let tokens: Vec<i64> = (0..n)
                .map(|t| {
                    if t < shared {
                        (t * 11 + 7) % 64
                    } else {
                        (t * 5 + r as i64 * 17 + 3) % 64
                    }
                })
                .collect();
            let mut s = seq(tokens, vec![if r % 2 == 0 { 0.8 } else { -0.5 }]);
            s.loss_mask = (0..n as usize).map(|t| t >= loss_from).collect();
            s
        })
        .collect()
}

/// Rows that share a prompt run it once in their micro-batch (both the kept-activation pass and
/// the checkpointed one, and the KL reference's forward): the step's loss, its metrics and every
/// gradient are those of each row run whole, alone in its micro-batch, and the step reports the
/// positions it ran once.
#[test]
fn rows_sharing_a_prompt_run_it_once_with_the_loss_and_gradients_of_each_row_whole() {
    let data = prompt_rows(&[70, 52, 90, 61], 40, 20);
    for checkpoint in [false, true] {
        let step = |micro_batch_tokens: i64| {
            let cfg = unmoving_step(micro_batch_tokens, 7, checkpoint);
            // The KL term's frozen reference (other weights) takes the shared forward too.
            let mut tr =
                Trainer::with_reference(fresh_full(23), Some(fresh_full(24)), cfg).unwrap();
            let m = tr.rl_step(&data).unwrap();
            (m, trained_grads(&tr))
        };
        // One micro-batch of the four rows; then every row alone (a budget under any row).
        let (shared, ours) = step(1024);
        let (whole, want) = step(2);
        assert_eq!((shared.micro_batches, whole.micro_batches), (1, 4));
        assert_eq!(
            shared.shared_prefix_tokens,
            40 * 3,
            "checkpoint={checkpoint}"
        );
        assert_eq!(whole.shared_prefix_tokens, 0);
        assert_eq!(shared.tokens, whole.tokens);
        let close = |what: &str, a: f64, b: f64| {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1e-3),
                "checkpoint={checkpoint}: {what} {a} vs {b}"
            );
        };
        close("loss", shared.loss, whole.loss);
        close("entropy", shared.entropy, whole.entropy);
        close("kl", shared.kl, whole.kl);
        close("grad_norm", shared.grad_norm, whole.grad_norm);
        for ((name, g), (_, w)) in ours.iter().zip(&want) {
            let scale = w.abs().max().double_value(&[]);
            let d = (g - w).abs().max().double_value(&[]);
            assert!(scale > 0.0, "{name}: no gradient");
            assert!(
                d <= 1e-5 * scale,
                "checkpoint={checkpoint}: {name}: max |diff| {d} (scale {scale})"
            );
        }
    }
}

/// In bf16 with heads 64 wide, the shape of the trainer's own causal attention on a CPU with
/// AVX512-BF16 (`kernels::causal_attention`: whole rows from position 0, a shared prompt's rows
/// after it; elsewhere libtorch's kernels): a micro-batch sharing its prompt gives the loss
/// and gradients of each row run whole, within bf16's rounding. Longer than the kernel's
/// 48-query strips and, with the prompt, than one 256-key chunk.
#[test]
fn bf16_rows_sharing_a_prompt_match_each_row_whole_with_heads_64_wide() {
    let cfg: trainer::model::Qwen3Config = serde_json::from_value(serde_json::json!({
        "vocab_size": 64, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "max_position_embeddings": 512, "rope_theta": 10000.0, "tie_word_embeddings": true
    }))
    .unwrap();
    let data = prompt_rows(&[330, 290, 371, 301], 200, 150);
    let step = |micro_batch_tokens: i64| {
        let model = |seed| Qwen3::random(cfg.clone(), seed, 0.2, Device::Cpu, Kind::BFloat16);
        let m = model(31).unwrap();
        m.set_trainable(true);
        let tc = unmoving_step(micro_batch_tokens, 64, false);
        // The KL term's frozen reference takes the no-grad forward through the same kernel.
        let mut tr = Trainer::with_reference(m, Some(model(32).unwrap()), tc).unwrap();
        let m = tr.rl_step(&data).unwrap();
        (m, trained_grads(&tr))
    };
    let (shared, ours) = step(4096);
    let (whole, want) = step(2);
    assert_eq!((shared.micro_batches, whole.micro_batches), (1, 4));
    assert_eq!(shared.shared_prefix_tokens, 200 * 3);
    let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-3);
    assert!(
        rel(shared.loss, whole.loss) < 1e-3,
        "loss {} vs {}",
        shared.loss,
        whole.loss
    );
    for ((name, g), (_, w)) in ours.iter().zip(&want) {
        let norm = |x: &Tensor| {
            x.to_kind(Kind::Float)
                .square()
                .sum(Kind::Float)
                .double_value(&[])
                .sqrt()
        };
        assert!(norm(w) > 0.0, "{name}: no gradient");
        let d = norm(&(g - w)) / norm(w);
        // Measured: at most 0.8% (session 88, the own kernel on a Zen 4).
        assert!(d < 3e-2, "{name}: relative RMS difference {d}");
    }
}

/// The no-grad forward a KL reference and the step's starting log-probs take.
#[test]
fn hidden_states_of_rows_sharing_a_prefix_are_those_of_each_row_whole() {
    let m = fresh_full(29);
    let rows = prompt_rows(&[70, 52, 90, 61], 40, 0);
    let width = rows.iter().map(|s| s.tokens.len()).max().unwrap();
    let flat: Vec<i64> = rows
        .iter()
        .flat_map(|s| {
            let mut t = s.tokens.clone();
            t.resize(width, 0);
            t
        })
        .collect();
    let ids = Tensor::from_slice(&flat).view([rows.len() as i64, width as i64]);
    tch::no_grad(|| {
        let shared = m.hidden_shared(&ids, 40, Fwd::POLICY);
        let whole = m.hidden(&ids, Fwd::POLICY);
        assert_eq!(shared.size(), whole.size());
        let d = (&shared - &whole).abs().max().double_value(&[]);
        assert!(d < 1e-5, "max |diff| {d}");
        // A prefix that leaves no position of the rows' own runs every row whole.
        let all = m.hidden_shared(&ids, width as i64, Fwd::POLICY);
        assert_eq!((&all - &whole).abs().max().double_value(&[]), 0.0);
    });
}

#[test]
fn copy_sequences_repeat_a_span_at_varying_distances() {
    use rand::SeedableRng;
    // `trainer sft --copy-rows`: a random span comes back after random noise; the targets are
    // the second copy after its first token, so only finding the first copy by its content
    // predicts them. The distance varies: at a fixed distance a model learns to read a fixed
    // offset back, which copies nothing in real text (BENCHMARKS.md, issue 25, session 15).
    let ids: Vec<i64> = (4..64).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let rows = trainer::sft::copy_sequences(64, 8, &ids, &mut rng);
    let mut distances = std::collections::BTreeSet::new();
    for s in &rows {
        let first = s.loss_mask.iter().position(|&m| m).unwrap();
        assert!(
            s.loss_mask[first..].iter().all(|&m| m),
            "one run of targets, at the end"
        );
        let copy = &s.tokens[first - 1..];
        assert!(
            (4..=8).contains(&copy.len()),
            "span of 4..=8 tokens: {}",
            copy.len()
        );
        let at = (0..first - 1)
            .find(|&i| s.tokens[i..].starts_with(copy))
            .expect("the copied span appears earlier");
        distances.insert(first - 1 - at);
        assert!(s.tokens.iter().all(|t| ids.contains(t)));
        assert!(
            s.tokens.len() <= 4 + 8 + 8 + 8,
            "lead <= 4, span <= 8, gap <= 8"
        );
    }
    assert!(distances.len() >= 8, "copy distances vary: {distances:?}");
    // Seeded: the same rows again.
    let again =
        trainer::sft::copy_sequences(64, 8, &ids, &mut rand::rngs::StdRng::seed_from_u64(3));
    assert!(rows.iter().zip(&again).all(|(a, b)| a.tokens == b.tokens));
}

/// A tiny model directory with a trained tokenizer and chat template under `dir`, as
/// `trainer init` writes it.
fn tiny_model_dir(dir: &Path) -> PathBuf {
    let corpus = dir.join("corpus.txt");
    let lines: String = (0..200)
        .map(|i| format!("Entry {i}: the TN{i} gene encodes a transposase studied in yeast.\n"))
        .collect();
    std::fs::write(&corpus, lines).unwrap();
    let tok = dir.join("tok");
    trainer::smallmodel::train_tokenizer(&corpus, 320, &tok).unwrap();
    let cfg_path = dir.join("config.json");
    std::fs::write(&cfg_path, serde_json::to_string(&tiny_cfg()).unwrap()).unwrap();
    let out = dir.join("model-init");
    trainer::smallmodel::init_model(&cfg_path, &tok, &out, 5).unwrap();
    out
}

fn sft_options(model: &Path, out: &Path) -> trainer::sft::SftOptions {
    let mut train = trainer::train::TrainConfig::default();
    train.optim.lr = 3e-3;
    train.loss.kl_coef = 0.0;
    trainer::sft::SftOptions {
        data: None,
        copy_rows: 40,
        copy_length: 8,
        model_dir: model.to_path_buf(),
        out: out.to_path_buf(),
        epochs: 2,
        batch: 8,
        max_len: 4096,
        train,
        device: Device::Cpu,
        kind: None,
        seed: 3,
        nproc_per_node: 1,
        dist_timeout: std::time::Duration::from_secs(30),
        cosine: true,
        warmup_steps: 2,
        save_every: 0,
        stop_after: None,
    }
}

fn weights(dir: &Path) -> Vec<(String, Tensor)> {
    let m = Qwen3::load(dir, Device::Cpu, Kind::Float).unwrap();
    m.base_tensors()
        .into_iter()
        .map(|(n, t)| (n, t.detach().copy()))
        .collect()
}

fn max_diff(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|((na, ta), (nb, tb))| {
            assert_eq!(na, nb);
            (ta - tb).abs().max().double_value(&[])
        })
        .fold(0.0, f64::max)
}

#[test]
fn a_stopped_sft_resumes_from_its_checkpoint_exactly() {
    // `trainer sft --save-every N` / `--stop-after N`: 10 steps (40 copy rows, batch 8, two
    // epochs, cosine with warm-up), stopped after 4 of them (mid-epoch: the first epoch has 5)
    // and run again, must end on the uninterrupted run's weights. It fails when the resumed run
    // replays another row order, restarts AdamW's moments or step (the schedule), or retrains
    // the steps it skipped.
    let tmp = tempfile::tempdir().unwrap();
    let init = tiny_model_dir(tmp.path());
    let whole = tmp.path().join("whole");
    let r = trainer::sft::run(&sft_options(&init, &whole)).unwrap();
    assert_eq!((r.steps, r.resumed_from, r.stopped), (10, None, false));

    let out = tmp.path().join("parts");
    let resume = trainer::sft::resume_dir(&out);
    let mut o = sft_options(&init, &out);
    o.save_every = 3;
    o.stop_after = Some(4);
    let r = trainer::sft::run(&o).unwrap();
    assert_eq!((r.steps, r.stopped), (4, true));
    assert!(!out.exists(), "a stopped run writes no model");
    assert_eq!(
        std::fs::read_to_string(resume.join("latest"))
            .unwrap()
            .trim(),
        "step-000004"
    );
    assert!(
        !resume.join("step-000003").exists(),
        "only the latest checkpoint is kept"
    );
    let at4 = weights(&resume.join("step-000004"));

    // Another seed is another row order: refused, naming it.
    let mut other = o.clone();
    other.seed = 4;
    other.stop_after = None;
    let e = trainer::sft::run(&other).unwrap_err().to_string();
    assert!(e.contains("seed = 4 here, 3 in the checkpoint"), "{e}");
    let e = trainer::sft::run(&trainer::sft::SftOptions {
        stop_after: Some(0),
        ..o.clone()
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("--stop-after = 0"), "{e}");

    o.stop_after = None;
    let r = trainer::sft::run(&o).unwrap();
    assert_eq!((r.steps, r.resumed_from, r.stopped), (10, Some(4), false));
    assert!(
        !resume.exists(),
        "the checkpoints go once the model is written"
    );
    let (a, b) = (weights(&whole), weights(&out));
    assert!(
        max_diff(&b, &at4) > 1e-3,
        "the resumed run trained past step 4"
    );
    let d = max_diff(&a, &b);
    assert!(d <= 1e-6, "resumed against uninterrupted: max diff {d}");
}

#[test]
fn adapter_and_optimizer_checkpoint_continue_exactly() {
    let batch = |k: i64| -> Vec<Sequence> {
        (0..2)
            .map(|r| {
                seq(
                    (0..15).map(|t| (t * 7 + r * 5 + k) % 64).collect(),
                    vec![0.3 - r as f32, 0.1, -0.2, 0.8],
                )
            })
            .collect()
    };
    let base = tempfile::tempdir().unwrap();
    lora_model(2).save(base.path()).unwrap();
    let fresh = || {
        let mut m = Qwen3::load(base.path(), Device::Cpu, Kind::Float).unwrap();
        m.add_lora(&lora(), 3).unwrap();
        trainer(m, 5e-3, 0.01)
    };
    let mut straight = fresh();
    for k in 0..3 {
        straight.rl_step(&batch(k)).unwrap();
    }
    let ck = tempfile::tempdir().unwrap();
    let mut first = fresh();
    for k in 0..2 {
        first.rl_step(&batch(k)).unwrap();
    }
    trainer::model::lora::save_adapter(&first.model, &lora(), "b", ck.path()).unwrap();
    first.opt.save(ck.path()).unwrap();
    drop(first);
    let mut m = Qwen3::load(base.path(), Device::Cpu, Kind::Float).unwrap();
    trainer::model::lora::load_adapter(&mut m, ck.path()).unwrap();
    let mut resumed = trainer(m, 5e-3, 0.01);
    resumed.opt.load(ck.path()).unwrap();
    assert_eq!(resumed.opt.step, 2);
    resumed.rl_step(&batch(2)).unwrap();
    for ((n, a), (_, b)) in straight
        .model
        .lora_tensors()
        .iter()
        .zip(resumed.model.lora_tensors().iter())
    {
        assert_eq!(
            (a - b).abs().max().double_value(&[]),
            0.0,
            "{n} differs after resume"
        );
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn tokenizer_train_and_init_write_a_directory_transformers_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("corpus.jsonl");
    let mut lines = String::new();
    for i in 0..300 {
        lines.push_str(
            &serde_json::json!({"title": format!("Gene TN{i}"),
                "text": format!("The TN{i} gene encodes a transposase that inserts adapters; \
                                 study {i} measured its activity in yeast and in mice.")})
            .to_string(),
        );
        lines.push('\n');
    }
    std::fs::write(&corpus, lines).unwrap();
    let tok = tmp.path().join("tok");
    let n = trainer::smallmodel::train_tokenizer(&corpus, 400, &tok).unwrap();
    assert!((300..=400).contains(&n), "{n}");
    let err = trainer::smallmodel::train_tokenizer(&corpus, 10, &tok).unwrap_err();
    assert!(err.to_string().contains("--vocab = 10"), "{err}");

    let cfg_path = tmp.path().join("config.json");
    std::fs::write(&cfg_path, serde_json::to_string(&tiny_cfg()).unwrap()).unwrap();
    let out = tmp.path().join("model");
    let cfg = trainer::smallmodel::init_model(&cfg_path, &tok, &out, 5).unwrap();
    assert_eq!(cfg.vocab_size, n as i64);
    let ours = Qwen3::load(&out, Device::Cpu, Kind::Float).unwrap();

    let py = std::env::var("TRAINER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join(".venv/bin/python"));
    let res = tmp.path().join("check.safetensors");
    let o = std::process::Command::new(py)
        .arg(root().join("scripts/parity/qwen3.py"))
        .args([
            "check-dir",
            "--dir",
            out.to_str().unwrap(),
            "--out",
            res.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rendered = String::from_utf8_lossy(&o.stdout);
    assert!(
        rendered.contains("<|im_start|>user\nWhich gene encodes Tn5?<|im_end|>"),
        "{rendered}"
    );
    let mut want = trainer::model::weights::read_file(&res, Device::Cpu, None, None).unwrap();
    let ids = want.remove("input_ids").unwrap();
    let got = tch::no_grad(|| ours.logits(&ids, Fwd::POLICY));
    let d = (got - want.remove("logits").unwrap())
        .abs()
        .max()
        .double_value(&[]);
    assert!(d < 1e-4, "{d}");
}

#[test]
fn aggregation_modes_weight_tokens_as_documented() {
    use trainer::loss::Aggregation;
    // First step: ratio = 1 (old = current), so each token's loss is −A·tis with
    // tis = min(exp(logp − behaviour), 2); KL is off.
    let seqs = vec![
        seq(
            (0..12).map(|t| (t * 5 + 1) % 64).collect(),
            vec![1.0, -0.5, 0.25, 2.0],
        ),
        seq(
            (0..20).map(|t| (t * 3 + 2) % 64).collect(),
            vec![-1.0, 0.5, 1.5, -2.0],
        ),
    ];
    let probe = trainer(lora_model(6), 0.0, 0.0);
    let lps = probe.logprobs(
        &seqs.iter().map(|s| s.tokens.clone()).collect::<Vec<_>>(),
        Fwd::POLICY,
    );
    let per_seq: Vec<(f64, f64)> = seqs
        .iter()
        .zip(&lps)
        .map(|(s, lp)| {
            let adv = trainer::loss::per_token_advantages(&s.advantages, &s.stages, &s.loss_mask)
                .unwrap();
            let mut sum = 0.0;
            let mut n = 0.0;
            for t in 0..s.tokens.len() {
                if s.loss_mask[t] {
                    let tis = ((lp[t] - s.behaviour_logprobs[t]) as f64).exp().min(2.0);
                    sum += -(adv[t] as f64) * tis;
                    n += 1.0;
                }
            }
            (sum, n)
        })
        .collect();
    let total: f64 = per_seq.iter().map(|x| x.0).sum();
    let tokens: f64 = per_seq.iter().map(|x| x.1).sum();
    for (agg, want) in [
        (Aggregation::TokenMean, total / tokens),
        (
            Aggregation::SequenceMean,
            per_seq.iter().map(|(s, n)| s / n).sum::<f64>() / 2.0,
        ),
        (Aggregation::Constant(64.0), total / 64.0),
    ] {
        let mut t = trainer(lora_model(6), 0.0, 0.0);
        t.cfg.loss.aggregation = agg;
        let got = t.rl_step(&seqs).unwrap().loss;
        assert!((got - want).abs() < 1e-5, "{agg:?}: {got} vs {want}");
    }
}

/// Off-policy guidance rows (a demonstration: no behaviour log-probs, or 0 where not recorded)
/// take weight 1 per token, while the sampled rows of the same batch keep their truncated
/// importance weights: the batch's loss is the per-token sum with each row's own weights.
#[test]
fn rows_without_behaviour_logprobs_take_unit_weight_beside_sampled_rows() {
    let sampled = seq(
        (0..12).map(|t| (t * 5 + 1) % 64).collect(),
        vec![1.0, -0.5, 0.25, 2.0],
    );
    let mut demo = seq(
        (0..20).map(|t| (t * 3 + 2) % 64).collect(),
        vec![-1.0, 0.5, 1.5, -2.0],
    );
    demo.behaviour_logprobs.clear();
    // Recorded on its first half only: 0 (not recorded) on the rest.
    let mut partial = seq(
        (0..16).map(|t| (t * 7 + 3) % 64).collect(),
        vec![0.5, 0.5, -1.0, 1.0],
    );
    for b in &mut partial.behaviour_logprobs[8..] {
        *b = 0.0;
    }
    let mut seqs = vec![sampled, demo, partial];
    let probe = trainer(lora_model(6), 0.0, 0.0);
    let lps = probe.logprobs(
        &seqs.iter().map(|s| s.tokens.clone()).collect::<Vec<_>>(),
        Fwd::POLICY,
    );
    // Recorded behaviour log-probs half a nat above the policy's: weight e^-0.5 on every
    // recorded token, so any weight of 1 comes from the unrecorded ones.
    for (s, lp) in seqs.iter_mut().zip(&lps) {
        for (b, l) in s.behaviour_logprobs.iter_mut().zip(lp) {
            if *b != 0.0 {
                *b = l + 0.5;
            }
        }
    }
    let (mut total, mut tokens, mut weighted) = (0.0, 0.0, 0usize);
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for (s, lp) in seqs.iter().zip(&lps) {
        let adv =
            trainer::loss::per_token_advantages(&s.advantages, &s.stages, &s.loss_mask).unwrap();
        for t in 0..s.tokens.len() {
            if !s.loss_mask[t] {
                continue;
            }
            let b = s.behaviour_logprobs.get(t).copied().unwrap_or(0.0);
            let tis = if b == 0.0 {
                1.0
            } else {
                weighted += 1;
                ((lp[t] - b) as f64).exp().min(2.0)
            };
            lo = lo.min(tis);
            hi = hi.max(tis);
            total += -(adv[t] as f64) * tis;
            tokens += 1.0;
        }
    }
    assert!(weighted > 0, "some tokens carry importance weights");
    assert!(
        (lo - (-0.5f64).exp()).abs() < 1e-5 && hi == 1.0,
        "{lo} {hi}"
    );
    let mut t = trainer(lora_model(6), 0.0, 0.0);
    let m = t.rl_step(&seqs).unwrap();
    let want = total / tokens;
    assert!((m.loss - want).abs() < 1e-5, "{} vs {want}", m.loss);
    // The recorded tokens' weights were applied (the minimum) and the unrecorded ones' were 1
    // (the maximum: no recorded token reaches it).
    assert!(
        (m.tis_min - lo).abs() < 1e-5 && (m.tis_max - 1.0).abs() < 1e-6,
        "{m:?}"
    );
}

#[test]
fn sharded_checkpoints_load_through_the_index() {
    let tmp = tempfile::tempdir().unwrap();
    let model = lora_model(8);
    model.save(tmp.path()).unwrap();
    let ids = Tensor::from_slice(&[1i64, 5, 9, 2, 7, 3]).view([1, 6]);
    let want = tch::no_grad(|| model.logits(&ids, Fwd::REFERENCE));
    // Split model.safetensors into two shards with an index, as large checkpoints ship.
    let all: Vec<(String, Tensor)> = model.base_tensors();
    let sharded = tmp.path().join("sharded");
    std::fs::create_dir_all(&sharded).unwrap();
    std::fs::copy(tmp.path().join("config.json"), sharded.join("config.json")).unwrap();
    let (a, b) = all.split_at(all.len() / 2);
    let mut map = serde_json::Map::new();
    for (file, part) in [
        ("model-00001-of-00002.safetensors", a),
        ("model-00002-of-00002.safetensors", b),
    ] {
        trainer::model::weights::write_file(&sharded.join(file), part).unwrap();
        for (n, _) in part {
            map.insert(n.clone(), serde_json::json!(file));
        }
    }
    std::fs::write(
        sharded.join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
    let loaded = Qwen3::load(&sharded, Device::Cpu, Kind::Float).unwrap();
    let got = tch::no_grad(|| loaded.logits(&ids, Fwd::POLICY));
    assert_eq!((got - want).abs().max().double_value(&[]), 0.0);
    // A missing shard entry is named.
    map.remove("model.norm.weight");
    std::fs::write(
        sharded.join("model.safetensors.index.json"),
        serde_json::json!({"weight_map": map}).to_string(),
    )
    .unwrap();
    let err = Qwen3::load(&sharded, Device::Cpu, Kind::Float).unwrap_err();
    assert!(err.to_string().contains("model.norm.weight"), "{err}");
}

#[test]
fn bf16_parameters_follow_the_fp32_reference_at_a_tiny_learning_rate() {
    common::cases::bf16_follows_fp32(Device::Cpu);
}

/// A tiny full fine-tune in `kind` on CPU whose weights are `src`'s.
fn full_copy(src: &Qwen3, kind: Kind) -> Qwen3 {
    full_copy_on(src, kind, Device::Cpu)
}

#[test]
fn master_weights_survive_checkpoint_and_rollback_exactly() {
    let init = Qwen3::random(tiny_cfg(), 22, 0.02, Device::Cpu, Kind::BFloat16).unwrap();
    let data = sft_data();
    let lr = 5e-7;
    let mut straight = trainer(full_copy(&init, Kind::BFloat16), lr, 0.0);
    for _ in 0..4 {
        straight.sft_step(&data).unwrap();
    }
    let ck = tempfile::tempdir().unwrap();
    let mut first = trainer(full_copy(&init, Kind::BFloat16), lr, 0.0);
    for _ in 0..3 {
        first.sft_step(&data).unwrap();
    }
    first.model.save(ck.path()).unwrap();
    first.opt.save(ck.path()).unwrap();
    // A failed step rolled back restores the master copy as well.
    let snap = first.snapshot(usize::MAX).unwrap();
    first.sft_step(&data).unwrap();
    first.rollback(snap).unwrap();
    first.sft_step(&data).unwrap();
    let m = Qwen3::load(ck.path(), Device::Cpu, Kind::BFloat16).unwrap();
    m.set_trainable(true);
    let mut resumed = trainer(m, lr, 0.0);
    resumed.opt.load(ck.path()).unwrap();
    resumed.sft_step(&data).unwrap();
    for other in [&first, &resumed] {
        for ((n, a), (_, b)) in straight
            .model
            .trainable()
            .iter()
            .zip(other.model.trainable().iter())
        {
            assert_eq!((a - b).abs().max().double_value(&[]), 0.0, "{n} differs");
            let (ma, mb) = (
                straight.opt.master(n).unwrap(),
                other.opt.master(n).unwrap(),
            );
            assert_eq!(
                (ma - mb).abs().max().double_value(&[]),
                0.0,
                "master of {n} differs"
            );
        }
    }
}

#[test]
fn rows_with_a_zero_loss_are_skipped_and_the_update_is_the_same() {
    use trainer::train::null_row;
    // Five rows of different lengths; three carry advantage 0 (positive-only credit's below-
    // the-mean members), so their loss is 0 at every token whatever the weights.
    let batch = rl_rows(
        &[(23, 0.8), (17, 0.0), (30, 0.3), (12, 0.0), (26, 0.0)],
        7,
        13,
        1,
    );
    let run = |skip: bool| {
        let mut tr = trainer(fresh_full(9), 1e-2, 0.0);
        tr.cfg.skip_null_rows = skip;
        let mut ms = Vec::new();
        for _ in 0..3 {
            ms.push(tr.rl_step(&batch).unwrap());
        }
        (ms, trained_weights(&tr))
    };
    let (skipped, w_skip) = run(true);
    let (full, w_full) = run(false);
    for (a, b) in skipped.iter().zip(&full) {
        assert_eq!((a.null_sequences, b.null_sequences), (3, 0));
        assert_eq!(a.sequences, 5);
        assert!(a.tokens < b.tokens, "{} vs {}", a.tokens, b.tokens);
        assert!((a.loss - b.loss).abs() < 1e-6, "{} vs {}", a.loss, b.loss);
        assert!(
            (a.grad_norm - b.grad_norm).abs() <= 1e-5 * b.grad_norm,
            "{} vs {}",
            a.grad_norm,
            b.grad_norm
        );
    }
    let d = max_diff(&w_skip, &w_full);
    assert!(d < 1e-5, "weights differ by {d} after three steps");
    let w0 = fresh_full(9);
    let moved = max_diff(&w_full, &w0.trainable());
    assert!(moved > 1e-3, "the steps moved nothing ({moved})");

    // What keeps a zero-advantage row in: a KL term, a marked unlikelihood token; an SFT row
    // never is null; a stage advantage whose stage has no counted token is still null.
    let zero = &batch[1];
    let mut cfg = trainer(fresh_full(9), 1e-2, 0.0).cfg.loss.clone();
    assert!(null_row(zero, &cfg, true));
    assert!(!null_row(zero, &cfg, false));
    assert!(!null_row(&batch[0], &cfg, true));
    cfg.kl_coef = 0.01;
    assert!(!null_row(zero, &cfg, true));
    cfg.kl_coef = 0.0;
    let ul = marked((0..20).map(|t| (t * 11 + 2) % 64).collect(), 0.0, 12..20);
    assert!(null_row(&ul, &cfg, true));
    cfg.unlikelihood = 1.0;
    assert!(!null_row(&ul, &cfg, true));
    cfg.unlikelihood = 0.0;
    let mut staged = seq((0..20).map(|t| (t * 5 + 3) % 64).collect(), vec![0.0; 4]);
    assert!(null_row(&staged, &cfg, true));
    staged.advantages[2] = 0.5;
    assert!(!null_row(&staged, &cfg, true));
    for s in staged.stages.iter_mut() {
        if *s == 2 {
            *s = 1;
        }
    }
    assert!(null_row(&staged, &cfg, true));

    // A batch of null rows only still runs one (the shortest), so the step has a backward.
    let nulls: Vec<Sequence> = batch
        .iter()
        .filter(|s| s.advantages[0] == 0.0)
        .cloned()
        .collect();
    let mut tr = trainer(fresh_full(9), 1e-2, 0.0);
    let m = tr.rl_step(&nulls).unwrap();
    assert_eq!((m.null_sequences, m.sequences), (2, 3));
    assert_eq!(m.tokens, 12 - 3);
}

#[test]
fn skipping_null_rows_keeps_the_update_across_minibatches_aggregations_and_reflection() {
    use trainer::loss::Aggregation;
    // Six rows; with two minibatches the second (rows 3-5) mixes null and live rows, so its
    // log-probs of the step's starting policy must be looked up by the rows' own indices.
    let batch = rl_rows(
        &[
            (23, 0.8),
            (17, 0.0),
            (30, 0.3),
            (12, 0.0),
            (26, -0.5),
            (20, 0.0),
        ],
        5,
        17,
        2,
    );
    // The same rows with row 4 null too: with three minibatches the last (rows 4-5) is null
    // throughout, so its update trains its shortest row (row 5), whose starting log-probs must
    // then have been computed; the middle one (rows 2-3) mixes a live and a null row. Both
    // batches skip three rows a step (here rows 1, 3 and 4).
    let mut last_null = batch.clone();
    last_null[4].advantages = vec![0.0];
    let cases = [
        (&batch, 2, Aggregation::TokenMean, false),
        (&batch, 2, Aggregation::SequenceMean, false),
        (&batch, 1, Aggregation::Constant(40.0), false),
        (&batch, 1, Aggregation::TokenMean, true),
        (&last_null, 3, Aggregation::TokenMean, false),
    ];
    for (batch, minibatches, agg, reflection) in cases {
        let run = |skip: bool| {
            let mut tr = trainer(fresh_full(11), 1e-2, 0.0);
            tr.cfg.skip_null_rows = skip;
            tr.cfg.minibatches_per_step = minibatches;
            tr.cfg.loss.aggregation = agg;
            let mut nulls = 0;
            for _ in 0..2 {
                let m = if reflection {
                    tr.reflection_step(batch)
                } else {
                    tr.rl_step(batch)
                }
                .unwrap();
                nulls += m.null_sequences;
            }
            (nulls, trained_weights(&tr))
        };
        let (n_skip, w_skip) = run(true);
        let (n_full, w_full) = run(false);
        let case = format!("{minibatches} minibatches, {agg:?}, reflection {reflection}");
        assert_eq!((n_skip, n_full), (6, 0), "{case}");
        let d = max_diff(&w_skip, &w_full);
        assert!(d < 1e-5, "{case}: weights differ by {d}");
        let moved = max_diff(&w_full, &fresh_full(11).trainable());
        assert!(moved > 1e-3, "{case}: the steps moved nothing ({moved})");
    }
}
