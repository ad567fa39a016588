//! Parity with PyTorch: tiny random Qwen3 models made by transformers (GQA and not, tied and
//! untied embeddings) give the same logits in our model; our PEFT adapter loaded by PEFT gives
//! our logits; the merged model matches PEFT's merge; the policy loss and its LoRA gradients
//! match an independent PyTorch computation. Needs .venv (scripts/python-env.sh) or
//! TRAINER_PYTHON pointing at a Python with torch, transformers and peft.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use tch::{Device, Kind, Tensor};
use trainer::loss::{Aggregation, PolicyLossConfig};
use trainer::model::lora::{LoraConfig, LoraTarget, save_adapter};
use trainer::model::{Fwd, Qwen3};
use trainer::optim::AdamWConfig;
use trainer::train::{Sequence, TrainConfig, Trainer};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python(args: &[&str]) {
    let py = std::env::var("TRAINER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join(".venv/bin/python"));
    let out = Command::new(&py)
        .arg(root().join("scripts/parity/qwen3.py"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e} (run scripts/python-env.sh)", py.display()));
    assert!(
        out.status.success(),
        "parity script {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read(path: &Path) -> std::collections::BTreeMap<String, Tensor> {
    trainer::model::weights::read_file(path, Device::Cpu, None, None).unwrap()
}

fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a - b).abs().max().double_value(&[])
}

fn make(dir: &Path, tied: bool, kv: i64) -> (Qwen3, Tensor, Tensor) {
    let mut args = vec!["make", "--out", dir.to_str().unwrap(), "--kv"];
    let kv_s = kv.to_string();
    args.push(&kv_s);
    if tied {
        args.push("--tied");
    }
    python(&args);
    let model = Qwen3::load(dir, Device::Cpu, Kind::Float).unwrap();
    let mut exp = read(&dir.join("expected.safetensors"));
    (
        model,
        exp.remove("input_ids").unwrap(),
        exp.remove("logits").unwrap(),
    )
}

#[test]
fn logits_match_transformers_for_gqa_mha_tied_and_untied() {
    for (tied, kv) in [(true, 2), (false, 2), (false, 4), (true, 1)] {
        let tmp = tempfile::tempdir().unwrap();
        let (model, ids, want) = make(tmp.path(), tied, kv);
        assert_eq!(model.lm_head.is_none(), tied);
        let got = tch::no_grad(|| model.logits(&ids, Fwd::POLICY));
        let d = max_abs(&got, &want);
        assert!(d < 1e-4, "tied={tied} kv={kv}: max |Δ| = {d}");
        // The KV-cache path: prefill 11 tokens, then 4 one at a time, then the last 4 at once.
        let mut cache = trainer::model::KvCache::default();
        let mut parts = vec![tch::no_grad(|| {
            model.forward_cached(&ids.narrow(1, 0, 11), &mut cache, Fwd::POLICY)
        })];
        for t in 11..15 {
            parts.push(tch::no_grad(|| {
                model.forward_cached(&ids.narrow(1, t, 1), &mut cache, Fwd::POLICY)
            }));
        }
        parts.push(tch::no_grad(|| {
            model.forward_cached(&ids.narrow(1, 15, 4), &mut cache, Fwd::POLICY)
        }));
        let d = max_abs(&Tensor::cat(&parts, 1), &want);
        assert!(d < 1e-4, "cached decode: max |Δ| = {d}");
    }
}

fn lora_cfg() -> LoraConfig {
    LoraConfig {
        r: 4,
        alpha: 8.0,
        dropout: 0.0,
        targets: LoraTarget::ALL.to_vec(),
    }
}

/// Attach adapters with a random (non-zero) B so they change the output.
fn randomize_b(model: &mut Qwen3) {
    let _guard = trainer::model::rng_lock();
    tch::manual_seed(5);
    for (_, _, p) in model.projections_mut() {
        if let Some(l) = &mut p.lora {
            tch::no_grad(|| {
                let _ =
                    l.b.f_copy_(&(Tensor::randn(l.b.size(), (Kind::Float, Device::Cpu)) * 0.3));
            });
        }
    }
}

#[test]
fn our_adapter_loads_in_peft_and_merges_like_peft() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let (mut model, ids, base_logits) = make(&base, false, 2);
    model.add_lora(&lora_cfg(), 3).unwrap();
    randomize_b(&mut model);
    let adapter = tmp.path().join("adapter");
    save_adapter(&model, &lora_cfg(), "tiny", &adapter).unwrap();
    let out = tmp.path().join("peft.safetensors");
    let (b, a, o) = (
        base.to_str().unwrap(),
        adapter.to_str().unwrap(),
        out.to_str().unwrap(),
    );
    python(&["peft", "--base", b, "--adapter", a, "--out", o]);
    let want = read(&out).remove("logits").unwrap();
    let ours = tch::no_grad(|| model.logits(&ids, Fwd::POLICY));
    assert!(
        max_abs(&want, &base_logits) > 1e-2,
        "the adapter must matter"
    );
    let d = max_abs(&ours, &want);
    assert!(d < 1e-4, "LoRA logits vs PEFT: max |Δ| = {d}");
    // Adapters disabled = the reference policy = the base.
    let reference = tch::no_grad(|| model.logits(&ids, Fwd::REFERENCE));
    assert!(max_abs(&reference, &base_logits) < 1e-4);
    // Our adapter loads back into a fresh base with the same logits.
    let mut again = Qwen3::load(&base, Device::Cpu, Kind::Float).unwrap();
    trainer::model::lora::load_adapter(&mut again, &adapter).unwrap();
    let d = max_abs(&tch::no_grad(|| again.logits(&ids, Fwd::POLICY)), &ours);
    assert!(d < 1e-6, "reloaded adapter: {d}");
    // Merging matches PEFT's merge_and_unload.
    let merged_out = tmp.path().join("merged.safetensors");
    python(&[
        "merge",
        "--base",
        b,
        "--adapter",
        a,
        "--out",
        merged_out.to_str().unwrap(),
    ]);
    model.merge_lora();
    assert!(!model.has_lora());
    let want = read(&merged_out).remove("logits").unwrap();
    let d = max_abs(&tch::no_grad(|| model.logits(&ids, Fwd::POLICY)), &want);
    assert!(d < 1e-4, "merged: {d}");
}

#[test]
fn policy_loss_and_lora_gradients_match_pytorch() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let (mut model, ids, _) = make(&base, true, 2);
    model.add_lora(&lora_cfg(), 3).unwrap();
    randomize_b(&mut model);
    let adapter = tmp.path().join("adapter");
    save_adapter(&model, &lora_cfg(), "tiny", &adapter).unwrap();

    // Three sequences of 19 tokens: prompt (5 tokens), then stages and a masked tool span.
    let rows: Vec<Vec<i64>> = (0..3)
        .map(|r| Vec::<i64>::try_from(ids.get(r)).unwrap())
        .collect();
    let mut seqs = Vec::new();
    for (r, tokens) in rows.iter().enumerate() {
        let n = tokens.len();
        let mask: Vec<bool> = (0..n).map(|t| t >= 5 && !(10..13).contains(&t)).collect();
        let stages: Vec<i8> = (0..n)
            .map(|t| match t {
                0..5 => -1,
                5..8 => 0,
                8..10 => 1,
                10..13 => -1,
                13..16 => 2,
                _ => 3,
            })
            .collect();
        let behaviour: Vec<f32> = (0..n)
            .map(|t| {
                if mask[t] {
                    -2.0 - 0.1 * ((t * (r + 1)) % 7) as f32
                } else {
                    0.0
                }
            })
            .collect();
        seqs.push(Sequence {
            unlikelihood: Vec::new(),
            tokens: tokens.clone(),
            loss_mask: mask,
            stages,
            behaviour_logprobs: behaviour,
            advantages: vec![
                0.9 - r as f32,
                -0.4 + 0.3 * r as f32,
                0.2,
                1.1 - 0.7 * r as f32,
            ],
            off_policy: false,
        });
    }
    let loss_cfg = PolicyLossConfig {
        clip_low: 0.2,
        clip_high: 0.28,
        kl_coef: 0.05,
        tis_clamp: Some(2.0),
        aggregation: Aggregation::TokenMean,
        unlikelihood: 0.0,
        shaping: 0.0,
        entropy: 0.0,
    };
    // The batch as the reference script reads it (arrays shifted to target positions).
    let shifted = |f: &dyn Fn(&Sequence) -> Vec<f32>| {
        let flat: Vec<f32> = seqs.iter().flat_map(|s| f(s)[1..].to_vec()).collect();
        Tensor::from_slice(&flat).view([3, -1])
    };
    let adv = shifted(&|s| {
        trainer::loss::per_token_advantages(&s.advantages, &s.stages, &s.loss_mask).unwrap()
    });
    let batch = tmp.path().join("batch.safetensors");
    trainer::model::weights::write_file(
        &batch,
        &[
            ("ids".into(), ids.shallow_clone()),
            (
                "mask".into(),
                shifted(&|s| {
                    s.loss_mask
                        .iter()
                        .map(|&m| f32::from(u8::from(m)))
                        .collect()
                }),
            ),
            ("adv".into(), adv),
            (
                "behaviour".into(),
                shifted(&|s| s.behaviour_logprobs.clone()),
            ),
        ],
    )
    .unwrap();
    std::fs::write(
        batch.with_extension("safetensors.json"),
        serde_json::json!({"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.05, "tis_clamp": 2.0})
            .to_string(),
    )
    .unwrap();
    let out = tmp.path().join("loss.safetensors");
    python(&[
        "loss",
        "--base",
        base.to_str().unwrap(),
        "--adapter",
        adapter.to_str().unwrap(),
        "--batch",
        batch.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let mut want = read(&out);

    for checkpoint in [true, false] {
        let mut m2 = Qwen3::load(&base, Device::Cpu, Kind::Float).unwrap();
        trainer::model::lora::load_adapter(&mut m2, &adapter).unwrap();
        let cfg = TrainConfig {
            loss: loss_cfg.clone(),
            optim: AdamWConfig {
                lr: 0.0,
                ..AdamWConfig::default()
            },
            micro_batch_tokens: 40, // two micro-batches: accumulation must not change the result
            logit_chunk: 5,
            grad_checkpoint: checkpoint,
            minibatches_per_step: 1,
            skip_null_rows: true,
            reflection_lr_scale: 1.0,
        };
        let mut tr = Trainer::new(m2, cfg).unwrap();
        let m = tr.rl_step(&seqs).unwrap();
        assert_eq!(m.micro_batches, 2);
        let want_loss = want["loss"].double_value(&[0]);
        assert!(
            (m.loss - want_loss).abs() < 1e-5,
            "checkpoint={checkpoint}: loss {} vs PyTorch {want_loss}",
            m.loss
        );
        assert!((m.kl - want["kl"].double_value(&[0])).abs() < 1e-6);
        let mut compared = 0;
        for (name, t) in tr.model.lora_tensors() {
            let g = want
                .get(&format!("grad.{name}"))
                .unwrap_or_else(|| panic!("PyTorch has no gradient for {name}"));
            let d = max_abs(&t.grad(), g);
            let scale = g.abs().max().double_value(&[]).max(1e-3);
            assert!(
                d / scale < 1e-4,
                "checkpoint={checkpoint}: {name}: |Δ| {d} (scale {scale})"
            );
            compared += 1;
        }
        assert_eq!(
            compared,
            want.keys().filter(|k| k.starts_with("grad.")).count()
        );
    }
    want.clear();
}
