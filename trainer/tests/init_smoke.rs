//! scripts/init-smoke.sh, the set-up compose.yaml's `init` service and scripts/smoke.sh share,
//! run as a plain process with the built binaries on a shrunken world: it leaves the SFT model,
//! tokenizer, world and index where the trainer and the smoke preset look, loadable by the
//! trainer, and a second run changes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn orchestrator_bin() -> PathBuf {
    let trainer = PathBuf::from(env!("CARGO_BIN_EXE_trainer"));
    let bin = trainer.parent().unwrap().join("orchestrator");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p orchestrator` (cargo test --workspace does)",
        bin.display()
    );
    bin
}

fn run_init(dir: &Path, config: &Path) -> std::process::Output {
    Command::new("bash")
        .arg(workspace().join("scripts/init-smoke.sh"))
        .arg(dir)
        .env("ORCH_BIN", orchestrator_bin())
        .env("TRAINER_BIN", env!("CARGO_BIN_EXE_trainer"))
        .env("INIT_DOCS", "40")
        .env("INIT_TASKS", "6")
        .env("INIT_VOCAB", "2000")
        .env("SMALL_CONFIG", config)
        .env("SMOKE_SFT_EPOCHS", "1")
        .output()
        .unwrap()
}

#[test]
fn the_init_script_prepares_the_smoke_inputs_once() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("tiny.json");
    std::fs::write(
        &config,
        serde_json::json!({
            "vocab_size": 0, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "max_position_embeddings": 8192, "rope_theta": 10000.0, "tie_word_embeddings": true
        })
        .to_string(),
    )
    .unwrap();
    let dir = tmp.path().join("runs/smoke");
    let out = run_init(&dir, &config);
    assert!(
        out.status.success(),
        "init-smoke.sh failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for f in [
        "world/tasks.jsonl",
        "world/corpus.jsonl",
        "index/meta.json",
        "sft.jsonl",
        "tokenizer/tokenizer.json",
        "model-sft/model.safetensors",
        "model-sft/config.json",
        "model-sft/tokenizer_config.json",
    ] {
        assert!(dir.join(f).exists(), "{f} missing");
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("world/tasks.jsonl"))
            .unwrap()
            .lines()
            .count(),
        6
    );
    // What `trainer serve` loads.
    let weights = trainer::model::weights::read_model_dir(
        &dir.join("model-sft"),
        tch::Device::Cpu,
        tch::Kind::Float,
    )
    .unwrap();
    assert!(!weights.is_empty());
    let stamp = std::fs::metadata(dir.join("model-sft/model.safetensors"))
        .unwrap()
        .modified()
        .unwrap();
    let again = run_init(&dir, &config);
    assert!(again.status.success());
    assert_eq!(
        std::fs::metadata(dir.join("model-sft/model.safetensors"))
            .unwrap()
            .modified()
            .unwrap(),
        stamp,
        "a second run rebuilds nothing"
    );
}
