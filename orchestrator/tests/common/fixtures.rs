//! Hand-built trajectory pieces and a byte-level tokenizer directory shared by tests.
#![allow(dead_code)]

use std::path::Path;

use orchestrator::domain::trajectory::{Segment, SegmentKind, Stage, Trajectory};
use uuid::Uuid;

/// A stored segment of `text` in the fake's toy tokenisation; model segments get logprobs and
/// policy version 0.
pub fn segment(kind: SegmentKind, stage: Option<Stage>, text: &str) -> Segment {
    let ids = super::fake_openai::toy_tokenize(text);
    let model = kind == SegmentKind::Model;
    Segment {
        kind,
        stage,
        logprobs: model.then(|| vec![-0.1; ids.len()]),
        token_ids: ids,
        text: text.into(),
        policy_version: model.then_some(0),
    }
}

/// Sample `i` of `task` at step 0 of `run`, as the rollout engine stores it (policy version 0,
/// a three-token prompt, finished by an answer): `segments` and its scaffold parse `parsed`.
pub fn stored_trajectory(
    run: Uuid,
    task: Uuid,
    i: i32,
    segments: Vec<Segment>,
    parsed: serde_json::Value,
) -> Trajectory {
    Trajectory {
        id: Uuid::now_v7(),
        run_id: run,
        step: 0,
        task_id: task,
        sample_index: i,
        policy_version: 0,
        server: "fake".into(),
        server_version: None,
        prompt_token_ids: vec![1, 2, 3],
        segments,
        finish_reason: "answer".into(),
        parsed,
        timings: serde_json::json!({}),
    }
}

/// GPT-2's byte-to-unicode map, so a ByteLevel BPE with no merges has one token per byte; ids
/// are byte + 10 like the fake server's toy tokenizer.
pub fn write_byte_tokenizer(dir: &Path) {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let vocab: serde_json::Map<String, serde_json::Value> = bs
        .iter()
        .zip(&cs)
        .map(|(b, c)| {
            (
                char::from_u32(*c).unwrap().to_string(),
                serde_json::json!(b + 10),
            )
        })
        .collect();
    let bl = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false});
    let tok = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": bl, "post_processor": null, "decoder": bl,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []}
    });
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    let template = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../prompts/chat_template.jinja"),
    )
    .unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::json!({"eos_token": "<|im_end|>", "chat_template": template}).to_string(),
    )
    .unwrap();
}

/// `orchestrator rollout`'s arguments for a smoke-preset rollout of `tasks` with `n` samples
/// each, against the scripted fake policy at `policy_url` (one request at a time: its replies
/// are a single queue), the tokenizer in `tokenizer` and the local index in `index`.
pub fn rollout_args(
    database_url: &str,
    policy_url: String,
    tasks: &Path,
    tokenizer: &Path,
    index: &Path,
    n: u32,
) -> orchestrator::cli::RolloutArgs {
    orchestrator::cli::RolloutArgs {
        config: orchestrator::cli::ConfigArgs {
            experiment: "smoke".into(),
            config_file: None,
            database_url: Some(database_url.to_string()),
            policy_urls: Some(vec![policy_url]),
            judge_urls: None,
            embeddings_urls: None,
            trainer_url: None,
            steps: None,
            sets: vec!["rollout.max_tokens=4096".into()],
        },
        tasks: tasks.to_path_buf(),
        n: Some(n),
        limit: None,
        tokenizer: tokenizer.to_path_buf(),
        tools: orchestrator::cli::ToolFlags {
            index: Some(index.to_path_buf()),
            web_tools: false,
            mcp: vec![],
        },
        scaffold: orchestrator::domain::scaffold::Scaffold::Rubricem,
        max_inflight: 1,
        reuse: orchestrator::domain::bank::Reuse::None,
        bank_run: None,
    }
}
