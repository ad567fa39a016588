//! A smoke-sized rollout wave against `trainer serve` on CPU: 32 conversations (8 task prompts
//! of 400 tokens x 4 samples, as `rollout.n = 4, tasks_per_step = 8`), each 4 turns of 96
//! sampled tokens with a 160-token tool output appended between turns, every turn a new
//! request carrying the whole context (as the orchestrator sends them). The same wave with the
//! prefix cache off (`--prefix-cache-tokens 0`, the reference) and on (the default), one after
//! the other on the same model (`configs/small.json`, a 4,096-token tokenizer as the smoke
//! run's until session 27, random weights): wall time, generated tokens/s, prompt tokens
//! computed and the speed-up.
//! Run: `cargo bench -p trainer --bench rollout` after `source scripts/torch-env.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::time::Instant;

mod common;
use common::{complete, serve};

fn model_dir(tmp: &Path) -> PathBuf {
    let corpus = tmp.join("corpus.jsonl");
    // Varied made-up words, so the tokenizer reaches 4,096 tokens (the smoke run's until session
    // 27; 2,048 now).
    let mut lines = String::new();
    let mut x: u64 = 17;
    let mut next = || {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) as usize
    };
    for _ in 0..6000 {
        let words: Vec<String> = (0..24)
            .map(|_| {
                let n = 3 + next() % 7;
                (0..n)
                    .map(|_| (b'a' + (next() % 26) as u8) as char)
                    .collect()
            })
            .collect();
        lines.push_str(&serde_json::json!({"text": words.join(" ")}).to_string());
        lines.push('\n');
    }
    std::fs::write(&corpus, lines).unwrap();
    let tok = tmp.join("tok");
    trainer::smallmodel::train_tokenizer(&corpus, 4096, &tok).unwrap();
    let out = tmp.join("small");
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/small.json");
    trainer::smallmodel::init_model(&cfg, &tok, &out, 3).unwrap();
    out
}

const TASKS: usize = 8;
const SAMPLES: usize = 4;
const PROMPT: usize = 400;
const TURNS: usize = 4;
const GEN: usize = 96;
const TOOL: usize = 160;

/// One conversation: TURNS requests, each the whole context so far; returns tokens generated.
async fn conversation(http: reqwest::Client, url: String, task: usize, seed: usize) -> usize {
    let mut ctx: Vec<u32> = (0..PROMPT)
        .map(|k| ((task * 131 + k * 17) % 4000 + 10) as u32)
        .collect();
    let mut generated = 0;
    for turn in 0..TURNS {
        let body = serde_json::json!({"model": "policy", "prompt": ctx, "max_tokens": GEN,
            "temperature": 1.0, "seed": seed * 10 + turn, "ignore_eos": true,
            "return_token_ids": true, "logprobs": 0});
        let v = complete(&http, &url, &body).await;
        let ids: Vec<u32> = serde_json::from_value(v["choices"][0]["token_ids"].clone())
            .unwrap_or_else(|e| panic!("{e}: {v}"));
        generated += ids.len();
        ctx.extend(ids);
        if turn + 1 < TURNS {
            ctx.extend((0..TOOL).map(|k| ((seed * 71 + turn * 29 + k * 13) % 4000 + 10) as u32));
        }
    }
    generated
}

async fn wave(url: &str) -> (f64, usize) {
    let http = trainer::publish::http_client();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        for s in 0..SAMPLES {
            tasks.push(tokio::spawn(conversation(
                http.clone(),
                url.to_string(),
                t,
                t * SAMPLES + s,
            )));
        }
    }
    let mut n = 0;
    for t in tasks {
        n += t.await.unwrap();
    }
    (t0.elapsed().as_secs_f64(), n)
}

fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let vocab = trainer::model::Qwen3Config::from_file(&dir.join("config.json"))
            .unwrap()
            .vocab_size;
        println!(
            "rollout wave: {} conversations ({TASKS} prompts of {PROMPT} tokens x {SAMPLES}), {TURNS} turns of {GEN} sampled tokens, {TOOL} tool tokens between turns; configs/small.json, vocabulary {vocab}, f32, {} torch threads",
            TASKS * SAMPLES,
            tch::get_num_threads()
        );
        let mut reference = None;
        for (name, budget) in [("prefix cache off (reference)", 0), ("prefix cache on", 1 << 17)] {
            let (url, state) = serve(&dir, budget).await;
            let (secs, n) = wave(&url).await;
            let st = &state.stats;
            let prompt = st.prompt_tokens.load(std::sync::atomic::Ordering::Relaxed);
            let hits = st.prefix_hit_tokens.load(std::sync::atomic::Ordering::Relaxed);
            let r = *reference.get_or_insert(secs);
            println!(
                "  {name:<29} {secs:>7.1} s  {:>6.0} generated tokens/s  prompt tokens {prompt}, computed {}  speed-up {:.2}x",
                n as f64 / secs,
                prompt - hits,
                r / secs
            );
        }
    });
}
