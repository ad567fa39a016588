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
    run_init_with(dir, config, &[])
}

fn run_init_with(dir: &Path, config: &Path, env: &[(&str, &str)]) -> std::process::Output {
    Command::new("bash")
        .arg(workspace().join("scripts/init-smoke.sh"))
        .arg(dir)
        .env("ORCH_BIN", orchestrator_bin())
        .env("TRAINER_BIN", env!("CARGO_BIN_EXE_trainer"))
        .env("INIT_DOCS", "40")
        .env("INIT_TASKS", "6")
        .env("INIT_HELD_OUT", "2")
        .env("INIT_VOCAB", "2000")
        .env("INIT_COPY_ROWS", "32")
        .env("SMALL_CONFIG", config)
        .env("SMOKE_SFT_EPOCHS", "1")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn tiny_config(dir: &Path) -> PathBuf {
    let config = dir.join("tiny.json");
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
    config
}

fn jsonl(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A model directory as `trainer serve` loads it (CPU, f32).
fn load_model(dir: &Path) -> std::collections::BTreeMap<String, tch::Tensor> {
    trainer::model::weights::read_model_dir(dir, tch::Device::Cpu, tch::Kind::Float)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// A task's lineage: the number in its rubrics' evidence ids (`gene-00012` is lineage 12).
fn lineage(task: &serde_json::Value) -> u64 {
    let ids: std::collections::BTreeSet<u64> = task["rubrics"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["evidence"].as_array().unwrap().iter())
        .filter_map(|e| e.as_str()?.rsplit_once('-')?.1.parse().ok())
        .collect();
    assert_eq!(ids.len(), 1, "one lineage a task: {ids:?}");
    ids.into_iter().next().unwrap()
}

#[test]
fn a_split_warm_start_learns_from_its_own_lineages_only() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path());
    let dir = tmp.path().join("runs/split");
    let bad = run_init_with(&dir, &config, &[("INIT_SFT_SPLIT", "3")]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("INIT_SFT_SPLIT = 3; expected MOD:REM"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let out = run_init_with(&dir, &config, &[("INIT_SFT_SPLIT", "2:1")]);
    assert!(
        out.status.success(),
        "init-smoke.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all = jsonl(&dir.join("world/tasks.jsonl"));
    let sft_tasks = jsonl(&dir.join("world/tasks-sft.jsonl"));
    let rl_tasks = jsonl(&dir.join("world/tasks-rl.jsonl"));
    assert_eq!(sft_tasks.len() + rl_tasks.len(), all.len());
    assert!(!sft_tasks.is_empty() && !rl_tasks.is_empty());
    assert!(sft_tasks.iter().all(|t| lineage(t) % 2 != 1));
    assert!(rl_tasks.iter().all(|t| lineage(t) % 2 == 1));
    // The demonstrations are of the SFT side's tasks only, repeated in order to as many rows
    // as there are training tasks.
    let sft_ids: std::collections::HashSet<&str> = sft_tasks
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    let demos = jsonl(&dir.join("sft-demos.jsonl"));
    let rows = jsonl(&dir.join("sft.jsonl"));
    assert!(!demos.is_empty() && demos.len() <= sft_tasks.len());
    assert_eq!(rows.len(), all.len());
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row, &demos[i % demos.len()], "row {i}");
        let id = row["id"].as_str().unwrap();
        assert!(
            sft_ids.contains(id),
            "row {i}: {id} is not an SFT-side task"
        );
    }
    assert!(dir.join("model-sft/model.safetensors").exists());
    let provenance = std::fs::read_to_string(dir.join("provenance.txt")).unwrap();
    for f in ["world/tasks-rl.jsonl", "sft-demos.jsonl"] {
        assert!(
            provenance.contains(&format!("  {f}\n")),
            "{f}: {provenance}"
        );
    }
    // Resuming this DIR without the split would keep the split's data under the default's name.
    let mixed = run_init(&dir, &config);
    assert_eq!(mixed.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&mixed.stderr).contains("was built with INIT_SFT_SPLIT"),
        "{}",
        String::from_utf8_lossy(&mixed.stderr)
    );
}

/// A saved warm start (the model directory and the provenance of the run that trained it) is
/// copied in instead of training one, but only where the world, the SFT data and the tokenizer
/// this run generates hash as that provenance records.
#[test]
fn a_saved_warm_start_is_taken_only_for_the_inputs_it_was_trained_from() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path());
    let split = ("INIT_SFT_SPLIT", "2:1");
    let first = tmp.path().join("runs/first");
    let out = run_init_with(&first, &config, &[split]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let saved = tmp.path().join("saved");
    std::fs::create_dir_all(&saved).unwrap();
    for entry in std::fs::read_dir(first.join("model-sft")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, saved.join(path.file_name().unwrap())).unwrap();
    }
    std::fs::copy(first.join("provenance.txt"), saved.join("provenance.txt")).unwrap();
    let saved_str = saved.to_str().unwrap();
    let warm = ("INIT_WARM_START", saved_str);

    let second = tmp.path().join("runs/second");
    let out = run_init_with(&second, &config, &[split, warm]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("warm start taken from"), "{log}");
    assert!(!log.contains("copying exercise"), "{log}");
    for skipped in ["model-init", "model-copy", "model-sft1"] {
        assert!(!second.join(skipped).exists(), "{skipped} trained: {log}");
    }
    assert_eq!(
        std::fs::read(second.join("model-sft/model.safetensors")).unwrap(),
        std::fs::read(first.join("model-sft/model.safetensors")).unwrap()
    );
    assert!(second.join("model-sft/warm-start-provenance.txt").exists());
    assert!(!load_model(&second.join("model-sft")).is_empty());

    // Each refusal: exit code 2, the messages named, no model copied.
    let refused = |name: &str, env: &[(&str, &str)], messages: &[&str]| {
        let dir = tmp.path().join("runs").join(name);
        let bad = run_init_with(&dir, &config, env);
        let err = String::from_utf8_lossy(&bad.stderr);
        assert_eq!(bad.status.code(), Some(2), "{name}: {err}");
        for m in messages {
            assert!(err.contains(m), "{name}: {m} not in {err}");
        }
        assert!(!dir.join("model-sft").exists(), "{name}");
    };
    // Another world (two more training tasks).
    refused(
        "third",
        &[split, warm, ("INIT_TASKS", "8")],
        &["was trained from other inputs", "world/tasks.jsonl: FAILED"],
    );
    // The same world without the split: the split's files it was trained from are missing.
    refused("fourth", &[warm], &["world/tasks-sft.jsonl"]);
    // A model directory without the provenance to check it against.
    std::fs::remove_file(saved.join("provenance.txt")).unwrap();
    refused("fifth", &[split, warm], &["has no provenance.txt"]);
}

#[test]
fn the_init_script_prepares_the_smoke_inputs_once() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path());
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
        "model-copy/model.safetensors",
        "model-sft1/model.safetensors",
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
    // The tokenizer saw the world's entity names only in its documents (the default
    // INIT_TOKENIZER_NAMES=corpus): a training task's compound, named in its SFT demonstration,
    // and a held-out task's are each in the document lines and in none of the SFT lines.
    let corpus_text = std::fs::read_to_string(dir.join("tokenizer-corpus.txt")).unwrap();
    let lines: Vec<&str> = corpus_text.lines().collect();
    // Two lines (title, text) a document, then the SFT text.
    let docs = std::fs::read_to_string(dir.join("world/corpus.jsonl"))
        .unwrap()
        .lines()
        .count();
    let (doc_lines, sft_lines) = lines.split_at(2 * docs);
    let compound_of = |file: &str| -> String {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        let task: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        task["rubrics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["title"] == "compound")
            .unwrap()["key_terms"][0]
            .as_str()
            .unwrap()
            .to_string()
    };
    let sft_text = std::fs::read_to_string(dir.join("sft.jsonl")).unwrap();
    for file in ["world/tasks.jsonl", "world/heldout.jsonl"] {
        let name = compound_of(file);
        assert!(
            doc_lines.iter().any(|l| l.contains(&name)),
            "{name} in the documents"
        );
        assert!(
            !sft_lines.iter().any(|l| l.contains(&name)),
            "{name} ({file}) left in the SFT text of the tokenizer corpus"
        );
        if file == "world/tasks.jsonl" {
            assert!(sft_text.contains(&name), "{name} is in its demonstration");
        }
    }
    // The provenance record: the machine, the commit, and every stage's output with the hash
    // of the file as it is.
    let provenance = std::fs::read_to_string(dir.join("provenance.txt")).unwrap();
    assert!(provenance.contains("\ncpu: "), "{provenance}");
    assert!(provenance.contains("\ngit at start: "), "{provenance}");
    for f in [
        "world/tasks.jsonl",
        "sft.jsonl",
        "tokenizer/tokenizer.json",
        "model-init/model.safetensors",
        "model-sft/model.safetensors",
    ] {
        let bytes = std::fs::read(dir.join(f)).unwrap();
        let line = provenance
            .lines()
            .find(|l| l.ends_with(&format!("  {f}")))
            .unwrap_or_else(|| panic!("{f} not in the provenance:\n{provenance}"));
        let hex: String = <sha2::Sha256 as sha2::Digest>::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert!(line.starts_with(&hex), "{f}: {line} vs {hex}");
    }
    // What `trainer serve` loads.
    assert!(!load_model(&dir.join("model-sft")).is_empty());
    let stamp = std::fs::metadata(dir.join("model-sft/model.safetensors"))
        .unwrap()
        .modified()
        .unwrap();
    // `trainer sft --nproc-per-node 2` (the same path as a data-parallel RL step: the batch
    // split by tokens, gradients summed) writes the model one process writes, and reports once.
    let sft = |nproc: &str, out: &str| {
        Command::new(env!("CARGO_BIN_EXE_trainer"))
            .args([
                "sft", "--epochs", "1", "--batch", "8", "--lr", "2e-3", "--device", "cpu",
            ])
            .arg("--data")
            .arg(dir.join("sft.jsonl"))
            .arg("--model")
            .arg(dir.join("model-init"))
            .arg("--out")
            .arg(dir.join(out))
            .args(["--nproc-per-node", nproc])
            .env_remove("WORLD_SIZE")
            .output()
            .unwrap()
    };
    let (one, two) = (sft("1", "sft-one"), sft("2", "sft-two"));
    for o in [&one, &two] {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let report = |o: &std::process::Output| -> serde_json::Value {
        let text = String::from_utf8_lossy(&o.stdout);
        let json: Vec<&str> = text.lines().filter(|l| l.starts_with('{')).collect();
        assert_eq!(json.len(), 1, "one report: {text}");
        serde_json::from_str(json[0]).unwrap()
    };
    let launched = String::from_utf8_lossy(&two.stderr)
        .matches("rank started")
        .count();
    assert_eq!(launched, 2, "two ranks ran");
    let (r1, r2) = (report(&one), report(&two));
    assert_eq!(r1["steps"], r2["steps"]);
    for k in ["first_loss", "last_loss"] {
        let (a, b) = (r1[k].as_f64().unwrap(), r2[k].as_f64().unwrap());
        assert!((a - b).abs() < 1e-4 * (1.0 + a.abs()), "{k}: {a} vs {b}");
    }
    let (w1, w2) = (
        load_model(&dir.join("sft-one")),
        load_model(&dir.join("sft-two")),
    );
    for (k, a) in &w1 {
        let d = (a - &w2[k]).abs().max().double_value(&[]);
        assert!(d < 1e-4, "{k}: max |diff| {d}");
    }
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
    // A warm start stopped after its first SFT pass resumes there: neither the copying
    // exercise nor the first pass runs again, the second pass does.
    let stamp_of = |f: &str| std::fs::metadata(dir.join(f)).unwrap().modified().unwrap();
    let copy = stamp_of("model-copy/model.safetensors");
    let sft1 = stamp_of("model-sft1/model.safetensors");
    std::fs::remove_dir_all(dir.join("model-sft")).unwrap();
    let resumed = run_init(&dir, &config);
    let log = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "resume failed:\n{log}");
    assert_eq!(stamp_of("model-copy/model.safetensors"), copy, "{log}");
    assert_eq!(stamp_of("model-sft1/model.safetensors"), sft1, "{log}");
    assert!(!log.contains("copying exercise"), "{log}");
    assert!(log.contains("second SFT pass"), "{log}");
    assert!(dir.join("model-sft/model.safetensors").exists());
    // Resuming it with a split would keep every lineage's data under the split's name.
    let mixed = run_init_with(&dir, &config, &[("INIT_SFT_SPLIT", "2:1")]);
    assert_eq!(mixed.status.code(), Some(2));
    let err = String::from_utf8_lossy(&mixed.stderr);
    assert!(err.contains("was built from every training task"), "{err}");
    assert!(
        !dir.join("world/tasks-rl.jsonl").exists(),
        "refused before splitting"
    );
}

/// What a grader matches in a world task: its rubrics' key terms, and the answer of a
/// short-answer task.
fn entities(task: &serde_json::Value) -> std::collections::HashSet<String> {
    let mut out: std::collections::HashSet<String> = task["rubrics"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["key_terms"].as_array().unwrap().iter())
        .map(|t| t.as_str().unwrap().trim().to_lowercase())
        .collect();
    if task["answer_format"] == "exact" {
        out.insert(task["answer"].as_str().unwrap().trim().to_lowercase());
    }
    out
}

/// scripts/disjoint-eval-tasks.py on a world split by lineage as issue 25's experiments split
/// it (SFT lineages; RL lineages; lineages neither trains on): a pool task is kept exactly when
/// it shares no entity with a training task, and a pool that overlaps the training lineages is
/// refused. The check is written from the world's task format, independently of the script.
#[test]
fn the_unseen_lineage_eval_set_shares_no_entity_with_training_tasks() {
    let tmp = tempfile::tempdir().unwrap();
    let w = tmp.path();
    let run = |cmd: &mut Command| -> std::process::Output {
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{cmd:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    run(Command::new(orchestrator_bin())
        .args(["world", "generate", "--seed", "17", "--docs", "800"])
        .args(["--tasks", "300", "--held-out", "16", "--out"])
        .arg(w));
    let script = |name: &str| workspace().join("scripts").join(name);
    let split = |input: &str, first: &str, second: &str, m: &str, r: &str| {
        run(Command::new("python3")
            .arg(script("split-tasks-by-lineage.py"))
            .args([w.join(input), w.join(first), w.join(second)])
            .args(["--mod", m, "--rem", r]));
    };
    // As in BENCHMARKS.md (issue 25, session 32): lineage % 3 == 2 is RL's side, and half of
    // it (lineage % 6 == 5) is kept from RL too.
    split("tasks.jsonl", "sft.jsonl", "rl.jsonl", "3", "2");
    split("rl.jsonl", "rl-train.jsonl", "pool.jsonl", "6", "5");
    let out = run(Command::new("python3")
        .arg(script("disjoint-eval-tasks.py"))
        .args([w.join("pool.jsonl"), w.join("eval.jsonl")])
        .arg("--train")
        .args([w.join("sft.jsonl"), w.join("rl-train.jsonl")]));
    let report = String::from_utf8_lossy(&out.stderr);

    let train: Vec<serde_json::Value> = ["sft.jsonl", "rl-train.jsonl"]
        .iter()
        .flat_map(|f| jsonl(&w.join(f)))
        .collect();
    let seen: std::collections::HashSet<String> = train.iter().flat_map(entities).collect();
    let train_lineages: std::collections::HashSet<u64> = train.iter().map(lineage).collect();
    let pool = jsonl(&w.join("pool.jsonl"));
    let kept = jsonl(&w.join("eval.jsonl"));
    assert!(!kept.is_empty(), "{report}");
    assert!(kept.len() < pool.len(), "nothing was dropped: {report}");
    assert!(
        report.contains(&format!("kept {} tasks", kept.len())),
        "{report}"
    );
    let kept_ids: std::collections::HashSet<&str> =
        kept.iter().map(|t| t["id"].as_str().unwrap()).collect();
    for t in &pool {
        assert!(!train_lineages.contains(&lineage(t)), "{}", t["id"]);
        let e = entities(t);
        let shared: Vec<&String> = e.iter().filter(|x| seen.contains(*x)).collect();
        // Kept exactly when nothing is shared: the set is as large as the rule allows.
        assert_eq!(
            kept_ids.contains(t["id"].as_str().unwrap()),
            shared.is_empty(),
            "task {} shares {shared:?}",
            t["id"]
        );
    }
    // Two-hop questions name only their own lineage's gene, protein and compound: all kept.
    assert!(
        pool.iter()
            .filter(|t| t["hops"] == 2)
            .all(|t| kept_ids.contains(t["id"].as_str().unwrap()))
    );

    // A pool whose lineages a training file covers is refused, naming the task.
    let bad = Command::new("python3")
        .arg(script("disjoint-eval-tasks.py"))
        .args([w.join("rl-train.jsonl"), w.join("bad.jsonl")])
        .arg("--train")
        .arg(w.join("rl-train.jsonl"))
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("which a training file also covers"), "{err}");
    assert!(!w.join("bad.jsonl").exists());
}

#[test]
fn split_digit_inputs_stop_before_training_and_resume_into_a_warm_start() {
    // INIT_INPUTS_ONLY=1 leaves what `scripts/device-check.sh pack-warm` packs (the training
    // stages then run elsewhere); INIT_SPLIT_DIGITS=1 writes every digit as its own token. The
    // same command without INIT_INPUTS_ONLY then trains the stages here.
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path());
    let dir = tmp.path().join("runs/digits");
    let digits = ("INIT_SPLIT_DIGITS", "1");
    let out = run_init_with(&dir, &config, &[digits, ("INIT_INPUTS_ONLY", "1")]);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "init-smoke.sh failed:\n{stderr}");
    assert!(
        stderr.contains("inputs ready (INIT_INPUTS_ONLY=1)"),
        "{stderr}"
    );
    assert!(dir.join("model-init/generation_config.json").exists());
    assert!(!dir.join("model-copy").exists() && !dir.join("model-sft").exists());
    let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer/tokenizer.json")).unwrap();
    let enc = tok.encode("protein-00743", false).unwrap();
    let digit_tokens: Vec<&String> = enc
        .get_tokens()
        .iter()
        .filter(|t| t.chars().any(|c| c.is_ascii_digit()))
        .collect();
    assert_eq!(digit_tokens.len(), 5, "{:?}", enc.get_tokens());

    let out = run_init_with(&dir, &config, &[digits, ("INIT_DTYPE", "f32")]);
    assert!(
        out.status.success(),
        "init-smoke.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.join("model-sft/model.safetensors").exists());
    let prov = std::fs::read_to_string(dir.join("provenance.txt")).unwrap();
    assert!(prov.contains("--device cpu --dtype f32"), "{prov}");
}

#[test]
fn a_reflection_pass_writes_its_rows_alone_then_trains_in_the_dtype_asked() {
    // REFLECT_DATA_ONLY=1 leaves what `scripts/device-check.sh pack-reflect` packs (the pass then
    // trains elsewhere, REFLECT_DEVICE=cuda REFLECT_DTYPE=f32); the same command without it
    // trains the pass here and records the device and dtype in its provenance.
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path());
    let dir = tmp.path().join("runs/reflect");
    // Twelve training tasks: a demonstration each, so 8 rows (one batch) of every kind exist.
    let out = run_init_with(&dir, &config, &[("INIT_TASKS", "12")]);
    assert!(
        out.status.success(),
        "init-smoke.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pass = |env: &[(&str, &str)]| {
        Command::new("bash")
            .arg(workspace().join("scripts/reflection-pass.sh"))
            .arg(&dir)
            .current_dir(tmp.path())
            .env("ORCH_BIN", orchestrator_bin())
            .env("TRAINER_BIN", env!("CARGO_BIN_EXE_trainer"))
            .env("REFLECT_ROWS", "8")
            .envs(env.iter().copied())
            .output()
            .unwrap()
    };
    let out = pass(&[("REFLECT_DATA_ONLY", "1")]);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "reflection-pass.sh failed:\n{stderr}");
    assert!(
        stderr.contains("rows ready (REFLECT_DATA_ONLY=1)"),
        "{stderr}"
    );
    // A reflection row, an injected agent row, a plain agent row, eight times.
    assert_eq!(jsonl(&dir.join("sft-reflect.jsonl")).len(), 24);
    assert!(!dir.join("model-reflect").exists());

    let out = pass(&[("REFLECT_DTYPE", "f32")]);
    assert!(
        out.status.success(),
        "reflection-pass.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = load_model(&dir.join("model-sft"));
    let after = load_model(&dir.join("model-reflect"));
    assert_eq!(before.len(), after.len());
    assert!(
        before
            .iter()
            .any(|(k, v)| !v.allclose(&after[k], 0.0, 0.0, false)),
        "the pass changed no weight"
    );
    let prov = std::fs::read_to_string(dir.join("provenance-model-reflect.txt")).unwrap();
    assert!(
        prov.contains("REFLECT_DEVICE=cpu REFLECT_DTYPE=f32"),
        "{prov}"
    );
}

#[test]
fn info_prints_the_cpu_parameter_dtype_the_scripts_read() {
    // scripts/guided.sh's GUIDED_DTYPE=auto takes this line as the servers' and trainer's dtype.
    let out = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .args(["info", "--cpu-dtype"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "trainer info --cpu-dtype failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(printed.trim(), trainer::cpu_param_dtype(), "{printed:?}");
    let full = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .arg("info")
        .output()
        .unwrap();
    let full = String::from_utf8_lossy(&full.stdout);
    assert!(
        full.contains(&format!("cpu parameter dtype: {}", printed.trim())),
        "{full}"
    );
}
