//! Helpers shared by the trainer's integration tests: a tiny random Qwen3 with its tokenizer
//! in Hugging Face layout, and a free loopback port.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

pub fn tiny_config() -> serde_json::Value {
    serde_json::json!({
        "vocab_size": 0, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "max_position_embeddings": 512, "rope_theta": 10000.0, "tie_word_embeddings": true
    })
}

/// Tokenizer + random tiny Qwen3 in HF layout.
pub fn model_dir(tmp: &Path) -> PathBuf {
    let corpus = tmp.join("corpus.jsonl");
    let mut lines = String::new();
    for i in 0..200 {
        lines.push_str(
            &serde_json::json!({"text": format!("gene TN{i} binds receptor {i}; <answer>yes</answer> study {i} in yeast")})
                .to_string(),
        );
        lines.push('\n');
    }
    std::fs::write(&corpus, lines).unwrap();
    let tok = tmp.join("tok");
    trainer::smallmodel::train_tokenizer(&corpus, 300, &tok).unwrap();
    let cfg = tmp.join("config.json");
    std::fs::write(&cfg, tiny_config().to_string()).unwrap();
    let out = tmp.join("model");
    trainer::smallmodel::init_model(&cfg, &tok, &out, 3).unwrap();
    out
}

/// A free TCP port on 127.0.0.1 (bound and released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
