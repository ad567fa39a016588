//! Hand-built trajectory pieces and a byte-level tokenizer directory shared by tests.
#![allow(dead_code)]

use std::path::Path;

use orchestrator::domain::trajectory::{Segment, SegmentKind, Stage};

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
