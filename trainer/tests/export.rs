//! `trainer export` against the libraries that load exports: a tiny model (tokenizer trained,
//! `init` directory) trained two real steps, checkpointed the normal way and exported loads in
//! transformers (full fine-tune, f32 sharded and bf16) and PEFT (LoRA adapter; the merged export
//! too) with our logits, its tokenizer renders the chat template as we do, and the merged export
//! equals the adapter. Also: `--version` and `latest` resolution, a checkpoint whose optimizer
//! is ZeRO-sharded exports the same weights, errors name what is wrong. Needs .venv
//! (scripts/python-env.sh) or TRAINER_PYTHON pointing at a Python with torch, transformers and
//! peft.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};

use common::seq;
use tch::{Device, Kind, Tensor};
use trainer::checkpoint::{self, CheckpointState};
use trainer::export::{ExportDtype, ExportFormat, ExportOptions, ExportReport};
use trainer::loss::PolicyLossConfig;
use trainer::model::lora::{LoraConfig, LoraTarget};
use trainer::model::{Fwd, Qwen3};
use trainer::optim::AdamWConfig;
use trainer::train::{TrainConfig, Trainer};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A base model directory as users make one: a BPE tokenizer trained on a small corpus, then
/// `trainer init` (config, random weights, tokenizer files with the ChatML template).
fn make_base(tmp: &Path, name: &str, tied: bool) -> PathBuf {
    let corpus = tmp.join("corpus.jsonl");
    let mut lines = String::new();
    for i in 0..300 {
        lines.push_str(
            &serde_json::json!({"title": format!("Gene TN{i}"),
                "text": format!("The TN{i} gene encodes a transposase; study {i} measured its \
                                 activity in yeast and in mice. Which gene encodes Tn5?")})
            .to_string(),
        );
        lines.push('\n');
    }
    std::fs::write(&corpus, lines).unwrap();
    let tok = tmp.join(format!("{name}-tok"));
    trainer::smallmodel::train_tokenizer(&corpus, 400, &tok).unwrap();
    let cfg = tmp.join(format!("{name}-config.json"));
    std::fs::write(
        &cfg,
        serde_json::json!({
            "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "max_position_embeddings": 128, "rope_theta": 10000.0, "tie_word_embeddings": tied,
            "initializer_range": 0.2
        })
        .to_string(),
    )
    .unwrap();
    let out = tmp.join(name);
    trainer::smallmodel::init_model(&cfg, &tok, &out, 5).unwrap();
    out
}

/// Two real RL steps, so the weights (or adapters) differ from the initial ones.
fn train_two_steps(model: Qwen3) -> Trainer {
    let mut tr = Trainer::new(
        model,
        TrainConfig {
            loss: PolicyLossConfig {
                kl_coef: 0.0,
                ..PolicyLossConfig::default()
            },
            optim: AdamWConfig {
                lr: 1e-2,
                ..AdamWConfig::default()
            },
            micro_batch_tokens: 64,
            logit_chunk: 7,
            grad_checkpoint: false,
            minibatches_per_step: 1,
            skip_null_rows: true,
            reflection_lr_scale: 1.0,
        },
    )
    .unwrap();
    let batch = vec![
        seq(
            vec![5, 17, 42, 99, 120, 7, 33, 250, 61, 12],
            vec![1.0, 0.5, 0.8, 1.2],
        ),
        seq(
            vec![8, 3, 77, 150, 201, 64, 9, 31, 18, 300],
            vec![-0.7, -1.0, -0.2, -0.9],
        ),
    ];
    for _ in 0..2 {
        tr.rl_step(&batch).unwrap();
    }
    tr
}

fn ids() -> Tensor {
    Tensor::from_slice(&[
        1i64, 5, 17, 42, 99, 120, 7, 33, 250, 61, 12, 300, 8, 3, 77, 150, 201, 64, 9, 31, 18, 300,
        2, 40,
    ])
    .view([2, 12])
}

fn logits(model: &Qwen3, f: Fwd) -> Tensor {
    tch::no_grad(|| model.logits(&ids(), f))
}

fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a - b).abs().max().double_value(&[])
}

/// Our logits on `ids()` as the Python side reads them.
fn expected(path: &Path, logits: &Tensor) -> PathBuf {
    trainer::model::weights::write_file(
        path,
        &[
            ("input_ids".into(), ids()),
            ("logits".into(), logits.shallow_clone()),
        ],
    )
    .unwrap();
    path.to_path_buf()
}

/// Run scripts/parity/export_check.py on (kind, dir, expected) triples; its JSON.
fn python_check(checks: &[(&str, &Path, &Path)]) -> serde_json::Value {
    let py = std::env::var("TRAINER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join(".venv/bin/python"));
    let mut cmd = std::process::Command::new(&py);
    cmd.arg(root().join("scripts/parity/export_check.py"));
    for (kind, dir, exp) in checks {
        cmd.args([
            "--check",
            kind,
            dir.to_str().unwrap(),
            exp.to_str().unwrap(),
        ]);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e} (run scripts/python-env.sh)", py.display()));
    assert!(
        out.status.success(),
        "export_check.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The exported tokenizer renders our chat template exactly as transformers does (text and
/// ids), and the model's eos is the ChatML end of turn.
fn check_chat(dir: &Path, r: &serde_json::Value) {
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap())
            .unwrap();
    let template = cfg["chat_template"].as_str().unwrap();
    let ours = trainer::chat::render(
        template,
        &[
            ("system", "You are a careful research assistant."),
            ("user", "Which gene encodes Tn5?"),
        ],
        true,
    )
    .unwrap();
    assert_eq!(r["chat_text"].as_str().unwrap(), ours);
    assert!(ours.ends_with("<|im_start|>assistant\n"), "{ours}");
    let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let our_ids: Vec<u64> = tok
        .encode(ours.as_str(), false)
        .unwrap()
        .get_ids()
        .iter()
        .map(|&i| u64::from(i))
        .collect();
    let theirs: Vec<u64> = serde_json::from_value(r["chat_ids"].clone()).unwrap();
    assert_eq!(theirs, our_ids);
    let template_ids: Vec<u64> = serde_json::from_value(r["template_ids"].clone()).unwrap();
    assert_eq!(template_ids, our_ids);
    assert_eq!(r["eos_token"], "<|im_end|>");
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn sha256_hex(path: &Path) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(std::fs::read(path).unwrap())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// export.json holds what the report says, with each weight file's true SHA-256.
fn check_report(r: &ExportReport) {
    let j = read_json(&r.out.join("export.json"));
    assert_eq!(j, serde_json::to_value(r).unwrap());
    assert!(!r.sha256.is_empty());
    for (file, sha) in &r.sha256 {
        assert_eq!(&sha256_hex(&r.out.join(file)), sha, "{file}");
    }
    for f in &r.files {
        assert!(r.out.join(f).is_file(), "{f} listed but not written");
    }
    assert!(r.files.iter().any(|f| f == "tokenizer.json"));
}

#[test]
fn full_fine_tune_exports_load_in_transformers_with_our_logits() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let base = make_base(t, "base", false);
    let model = Qwen3::load(&base, Device::Cpu, Kind::Float).unwrap();
    let before = logits(&model, Fwd::POLICY);
    model.set_trainable(true);
    let tr = train_two_steps(model);
    let ours = logits(&tr.model, Fwd::POLICY);
    assert!(
        max_abs(&ours, &before) > 1e-3,
        "training must change the weights"
    );
    let ck_root = t.join("ckpt");
    let state = CheckpointState {
        step: tr.opt.step,
        policy_version: 2,
        seed: 17,
        mode: "full".into(),
        base: base.display().to_string(),
        dtype: String::new(),
    };
    let ck = checkpoint::save(&ck_root, &tr, None, &state).unwrap();
    let extra = t.join("eval.md");
    std::fs::write(
        &extra,
        "## Evaluation\n\n| benchmark | score |\n| --- | --- |\n| scifact | 0.5 |\n",
    )
    .unwrap();

    // f32, forced into shards: the root resolves through `latest`.
    let total: u64 = tr
        .model
        .base_tensors()
        .iter()
        .map(|(_, t)| t.numel() as u64 * 4)
        .sum();
    let out = t.join("export-full");
    let mut opts = ExportOptions::new(&ck_root, &out);
    opts.dtype = ExportDtype::F32;
    opts.max_shard_bytes = total / 3;
    opts.card_extra = Some(extra.clone());
    let r = trainer::export::run(&opts).unwrap();
    assert_eq!(r.format, ExportFormat::Full);
    assert_eq!((r.policy_version, r.step, r.mode.as_str()), (2, 2, "full"));
    assert_eq!(r.source_checkpoint, ck.canonicalize().unwrap());
    assert_eq!(r.dtype, "float32");
    check_report(&r);
    assert!(r.sha256.len() >= 3, "{:?}", r.sha256.keys());
    assert!(out.join("model.safetensors.index.json").is_file());
    assert!(!out.join("model.safetensors").exists());
    for f in [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
    ] {
        assert!(out.join(f).is_file(), "{f}");
    }
    assert_eq!(
        read_json(&out.join("config.json"))["torch_dtype"],
        "float32"
    );
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(
        card.starts_with("---\nlibrary_name: transformers\n"),
        "{card}"
    );
    assert!(
        card.contains(&format!("base_model: {:?}", r.base)),
        "{card}"
    );
    assert!(card.contains("- rubricem\n") && card.contains("| policy version | 2 |"));
    assert!(card.contains("| learning rate | 0.01 |"), "{card}");
    assert!(card.trim_end().ends_with("| scifact | 0.5 |"), "{card}");
    // It loads back in our model with the trained weights.
    let back = Qwen3::load(&out, Device::Cpu, Kind::Float).unwrap();
    assert_eq!(max_abs(&logits(&back, Fwd::POLICY), &ours), 0.0);

    // bf16 by --version under the root, one file.
    let out16 = t.join("export-bf16");
    let mut o16 = ExportOptions::new(&ck_root, &out16);
    o16.dtype = ExportDtype::Bf16;
    o16.version = Some(2);
    let r16 = trainer::export::run(&o16).unwrap();
    assert_eq!(r16.dtype, "bfloat16");
    check_report(&r16);
    assert_eq!(r16.sha256.keys().collect::<Vec<_>>(), ["model.safetensors"]);
    assert_eq!(
        read_json(&out16.join("config.json"))["torch_dtype"],
        "bfloat16"
    );
    let ours16 = logits(
        &Qwen3::load(&out16, Device::Cpu, Kind::Float).unwrap(),
        Fwd::POLICY,
    );
    assert!(max_abs(&ours16, &ours) > 0.0, "bf16 rounds the weights");

    let e32 = expected(&t.join("expected-f32.safetensors"), &ours);
    let e16 = expected(&t.join("expected-bf16.safetensors"), &ours16);
    // The third check compares the bf16 export with the f32 logits: the comparison must see
    // the rounding (it is not vacuous).
    let py = python_check(&[
        ("full", &out, &e32),
        ("full", &out16, &e16),
        ("full", &out16, &e32),
    ]);
    let res = py["results"].as_array().unwrap();
    let rounding = res[2]["max_abs_diff"].as_f64().unwrap();
    assert!(rounding > 1e-6, "bf16 export vs f32 logits: {rounding}");
    let (d32, d16) = (
        res[0]["max_abs_diff"].as_f64().unwrap(),
        res[1]["max_abs_diff"].as_f64().unwrap(),
    );
    eprintln!(
        "full f32 sharded export vs ours: max |Δ| = {d32:e}; bf16 export vs ours (bf16 \
         weights): {d16:e}; bf16 export vs f32 logits: {rounding:e}"
    );
    assert!(d32 < 1e-4, "f32 export in transformers: max |Δ| = {d32}");
    assert!(
        d16 < 1e-4,
        "bf16 export in transformers (f32 compute): max |Δ| = {d16}"
    );
    assert_eq!(res[0]["auto_dtype"], "float32");
    assert_eq!(res[1]["auto_dtype"], "bfloat16");
    assert_eq!(res[1]["config_dtype"], "bfloat16");
    check_chat(&out, &res[0]);
    check_chat(&out16, &res[1]);

    // Re-exporting replaces an earlier export; the same weights give the same files.
    let again = trainer::export::run(&opts).unwrap();
    assert_eq!(again.sha256, r.sha256);

    // A ZeRO checkpoint: weights whole (rank 0 writes them), the optimizer in per-rank shards.
    // The export reads only the weights and state.json: same files, same hashes.
    let zroot = t.join("zero");
    let zck = zroot.join("step-000002");
    std::fs::create_dir_all(&zck).unwrap();
    for f in ["model.safetensors", "config.json", "state.json"] {
        std::fs::copy(ck.join(f), zck.join(f)).unwrap();
    }
    std::fs::write(
        zck.join("optimizer.zero.json"),
        serde_json::json!({"step": 2, "world": 2, "stage": "two", "names": [], "numels": [],
                           "shapes": []})
        .to_string(),
    )
    .unwrap();
    for r in 0..2 {
        std::fs::write(
            zck.join(trainer::dist::zero::shard_file(r, 2)),
            b"not read by the export",
        )
        .unwrap();
    }
    let mut oz = opts.clone();
    oz.checkpoint = zck.clone();
    oz.out = t.join("export-zero");
    oz.card_extra = None;
    let rz = trainer::export::run(&oz).unwrap();
    assert_eq!(rz.sha256, r.sha256);
    let card = std::fs::read_to_string(rz.out.join("README.md")).unwrap();
    assert!(card.contains("ZeRO stage two over 2 ranks"), "{card}");

    // Errors name the path and what is wrong; nothing is written.
    let err = |o: &ExportOptions| trainer::export::run(o).unwrap_err().to_string();
    let mut bad = opts.clone();
    bad.version = Some(9);
    let e = err(&bad);
    assert!(
        e.contains("holds no checkpoint of policy version 9 (versions found: 2)"),
        "{e}"
    );
    bad = ExportOptions::new(&ck, &ck_root);
    let e = err(&bad);
    assert!(e.contains("would replace"), "{e}");
    bad = ExportOptions::new(&ck, &base);
    assert!(err(&bad).contains("would replace"));
    bad = ExportOptions::new(&ck, t.join("x"));
    bad.version = Some(3);
    let e = err(&bad);
    assert!(e.contains("holds policy version 2, not --version 3"), "{e}");
    bad = ExportOptions::new(t.join("nowhere"), t.join("x"));
    assert!(err(&bad).contains("nowhere: no such directory"));
    bad = ExportOptions::new(t, t.join("x"));
    let e = err(&bad);
    assert!(e.contains("neither state.json"), "{e}");
    // A base without a tokenizer: the file is named.
    let bare = t.join("bare");
    std::fs::create_dir_all(&bare).unwrap();
    std::fs::copy(base.join("config.json"), bare.join("config.json")).unwrap();
    bad = ExportOptions::new(&ck, t.join("x"));
    bad.base = Some(bare.clone());
    let e = err(&bad);
    assert!(e.contains("bare has no tokenizer.json"), "{e}");
    bad.base = Some(t.join("gone"));
    let e = err(&bad);
    assert!(
        e.contains("gone has no config.json") && e.contains("--base"),
        "{e}"
    );
    // An existing directory that is not an export is not replaced.
    let keep = t.join("keep");
    std::fs::create_dir_all(&keep).unwrap();
    std::fs::write(keep.join("notes.txt"), "mine").unwrap();
    bad = ExportOptions::new(&ck, &keep);
    let e = err(&bad);
    assert!(e.contains("is not an earlier export"), "{e}");
    assert!(keep.join("notes.txt").is_file());
    assert!(!t.join("x").exists());
}

#[test]
fn lora_exports_load_in_peft_and_the_merge_equals_the_adapter() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let base = make_base(t, "base", true);
    let lcfg = LoraConfig {
        r: 4,
        alpha: 8.0,
        dropout: 0.0,
        targets: LoraTarget::ALL.to_vec(),
    };
    let mut model = Qwen3::load(&base, Device::Cpu, Kind::Float).unwrap();
    model.add_lora(&lcfg, 3).unwrap();
    let tr = train_two_steps(model);
    let ours = logits(&tr.model, Fwd::POLICY);
    let base_logits = logits(&tr.model, Fwd::REFERENCE);
    assert!(
        max_abs(&ours, &base_logits) > 1e-3,
        "training must change the adapters"
    );
    let ck_root = t.join("ckpt");
    let state = CheckpointState {
        step: tr.opt.step,
        policy_version: 2,
        seed: 17,
        mode: "lora".into(),
        base: base.display().to_string(),
        dtype: String::new(),
    };
    checkpoint::save(&ck_root, &tr, Some(&lcfg), &state).unwrap();

    let adapter = t.join("export-adapter");
    let ra = trainer::export::run(&ExportOptions::new(&ck_root, &adapter)).unwrap();
    assert_eq!(ra.format, ExportFormat::Adapter);
    assert_eq!(ra.dtype, "float32");
    check_report(&ra);
    assert_eq!(
        ra.sha256.keys().collect::<Vec<_>>(),
        ["adapter_model.safetensors"]
    );
    let acfg = read_json(&adapter.join("adapter_config.json"));
    assert_eq!(
        acfg["base_model_name_or_path"],
        base.canonicalize().unwrap().display().to_string()
    );
    assert_eq!(
        (acfg["r"].as_i64(), acfg["peft_type"].as_str()),
        (Some(4), Some("LORA"))
    );
    assert!(!adapter.join("config.json").exists());
    let card = std::fs::read_to_string(adapter.join("README.md")).unwrap();
    assert!(card.starts_with("---\nlibrary_name: peft\n"), "{card}");
    assert!(card.contains("- lora\n") && card.contains("LoRA r = 4, alpha = 8"));
    assert!(
        card.contains("--enable-lora --lora-modules policy="),
        "{card}"
    );
    // Our own loader takes the export back with the same logits.
    let mut back = Qwen3::load(&base, Device::Cpu, Kind::Float).unwrap();
    trainer::model::lora::load_adapter(&mut back, &adapter).unwrap();
    assert!(max_abs(&logits(&back, Fwd::POLICY), &ours) < 1e-6);

    let merged = t.join("export-merged");
    let mut om = ExportOptions::new(&ck_root, &merged);
    om.merge = true;
    om.base_name = Some("tiny/qwen3-base".into());
    let rm = trainer::export::run(&om).unwrap();
    assert_eq!(rm.format, ExportFormat::Merged);
    assert_eq!(rm.base, "tiny/qwen3-base");
    check_report(&rm);
    assert!(merged.join("model.safetensors").is_file());
    assert_eq!(
        read_json(&merged.join("config.json"))["torch_dtype"],
        "float32"
    );
    let card = std::fs::read_to_string(merged.join("README.md")).unwrap();
    assert!(card.contains("base_model: \"tiny/qwen3-base\"\n"), "{card}");
    assert!(card.contains("merged into the base weights"), "{card}");

    let e = expected(&t.join("expected.safetensors"), &ours);
    let py = python_check(&[("adapter", &adapter, &e), ("full", &merged, &e)]);
    let res = py["results"].as_array().unwrap();
    let (da, dm) = (
        res[0]["max_abs_diff"].as_f64().unwrap(),
        res[1]["max_abs_diff"].as_f64().unwrap(),
    );
    let pair = py["pairwise"][0][1].as_f64().unwrap();
    eprintln!(
        "LoRA adapter in PEFT vs ours: max |Δ| = {da:e}; merged in transformers: {dm:e}; merged vs adapter: {pair:e}"
    );
    assert!(da < 1e-4, "adapter export in PEFT: max |Δ| = {da}");
    assert!(dm < 1e-4, "merged export in transformers: max |Δ| = {dm}");
    assert!(pair < 1e-4, "merged vs adapter export: max |Δ| = {pair}");
    check_chat(&adapter, &res[0]);
    check_chat(&merged, &res[1]);
}
