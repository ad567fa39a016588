//! `trainer serve` on CPU: generation throughput (tokens/s) at 1, 8 and 64 concurrent requests
//! for a tiny and a small model, beside the reference of the same model decoding one sequence
//! in-process with no server (forward with KV cache, argmax); and the train-batch handoff of
//! 256 sequences x 16k tokens (encode, send, decode + validate on the server via dry_run).
//! Run: scripts/bench-serve.sh (sources the libtorch env) or
//! cargo bench -p trainer --bench serve [-- MAX_TOKENS]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::time::Instant;

use trainer::model::{Fwd, KvCache};
use trainer::service::AppState;

mod common;
use common::{complete, serve};

fn model_dir(tmp: &Path, name: &str, cfg: serde_json::Value, vocab: usize) -> PathBuf {
    let corpus = tmp.join(format!("{name}-corpus.jsonl"));
    let mut lines = String::new();
    for i in 0..3000 {
        lines.push_str(&serde_json::json!({"text": format!("gene TN{i} binds receptor R{} in study {i}; kinase K{} phosphorylates it under condition C{}", i % 97, i % 89, i % 83)}).to_string());
        lines.push('\n');
    }
    std::fs::write(&corpus, lines).unwrap();
    let tok = tmp.join(format!("{name}-tok"));
    trainer::smallmodel::train_tokenizer(&corpus, vocab, &tok).unwrap();
    let c = tmp.join(format!("{name}-config.json"));
    std::fs::write(&c, cfg.to_string()).unwrap();
    let out = tmp.join(name);
    trainer::smallmodel::init_model(&c, &tok, &out, 3).unwrap();
    out
}

fn reference_tokens_per_s(state: &AppState, prompt: &[i64], max_tokens: usize) -> f64 {
    let p = state.policy.lock().unwrap();
    let m = &p.trainer.model;
    tch::no_grad(|| {
        let t0 = Instant::now();
        let mut cache = KvCache::new(m.layers.len());
        let ids = tch::Tensor::from_slice(prompt).view([1, -1]);
        let mut logits = m.forward_cached(&ids, &mut cache, Fwd::POLICY);
        for _ in 0..max_tokens {
            let t = logits
                .select(1, logits.size()[1] - 1)
                .argmax(-1, false)
                .int64_value(&[0]);
            logits = m.forward_cached(
                &tch::Tensor::from_slice(&[t]).view([1, 1]),
                &mut cache,
                Fwd::POLICY,
            );
        }
        max_tokens as f64 / t0.elapsed().as_secs_f64()
    })
}

async fn throughput(url: &str, conc: usize, prompt: &[u32], max_tokens: usize) -> f64 {
    let http = trainer::publish::http_client();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..conc {
        let (http, url) = (http.clone(), url.to_string());
        let body = serde_json::json!({"model": "policy", "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 1.0, "seed": i, "ignore_eos": true, "return_token_ids": true, "logprobs": 0});
        tasks.push(tokio::spawn(async move {
            let v = complete(&http, &url, &body).await;
            v["choices"][0]["token_ids"].as_array().map_or(0, Vec::len)
        }));
    }
    let mut n = 0;
    for t in tasks {
        n += t.await.unwrap();
    }
    n as f64 / t0.elapsed().as_secs_f64()
}

fn main() {
    let max_tokens: usize = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .next()
        .unwrap_or(64);
    let tmp = tempfile::tempdir().unwrap();
    let tiny = serde_json::json!({"vocab_size": 0, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 2048,
        "rope_theta": 10000.0, "tie_word_embeddings": true});
    let small: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/small.json"))
            .unwrap(),
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for (name, cfg, vocab) in [("tiny", tiny, 512), ("small", small, 4096)] {
            let dir = model_dir(tmp.path(), name, cfg, vocab);
            let (url, state) = serve(&dir, 1 << 17).await;
            let prompt: Vec<u32> = state.tokenizer.encode("gene TN5 binds receptor R5 in study 5; kinase", false).unwrap().get_ids().to_vec();
            let p64: Vec<i64> = prompt.iter().map(|&t| i64::from(t)).collect();
            let params = state.policy.lock().unwrap().trainer.model.trainable().iter().map(|(_, t)| t.numel()).sum::<usize>();
            throughput(&url, 2, &prompt, 8).await; // warm-up
            reference_tokens_per_s(&state, &p64, max_tokens); // warm-up
            let reference = reference_tokens_per_s(&state, &p64, max_tokens);
            println!("{name} ({:.1}M parameters), prompt {} tokens, {max_tokens} new tokens per request; reference: one sequence in-process, no server = {reference:.0} tokens/s", params as f64 / 1e6, prompt.len());
            for conc in [1, 8, 64] {
                let tps = throughput(&url, conc, &prompt, max_tokens).await;
                println!("  {conc:>2} concurrent: {tps:>8.0} tokens/s   ratio vs reference {:.2}x", tps / reference);
            }
        }
        // Batch handoff: 256 x 16k tokens, encode + send + decode/validate (dry run).
        let dir = tmp.path().join("tiny");
        let (url, _state) = serve(&dir, 1 << 17).await;
        let n = 16_384;
        let batch = wire::Batch { policy_version: 0, rl: true, seqs: (0..256).map(|i| wire::WireSequence {
            unlikelihood: Vec::new(),
            tokens: (0..n).map(|k| ((i * 7 + k) % 500) as u32).collect(),
            loss_mask: (0..n).map(|k| k % 3 != 0).collect(),
            stages: (0..n).map(|k| (k * 4 / n) as i8).collect(),
            behaviour_logprobs: vec![-1.5; n],
            advantages: vec![0.5, -0.25, 0.1, 1.0],
            off_policy: false,
            group_id: (i / 8) as u32, policy_version: 0, phase: wire::Phase::Task }).collect() };
        let http = trainer::publish::http_client();
        for round in 0..2 {
            let t0 = Instant::now();
            let body = batch.encode().unwrap();
            let enc = t0.elapsed().as_secs_f64();
            let r: serde_json::Value = http.post(format!("{url}/v1/train_step?dry_run=true")).body(body).send().await.unwrap().json().await.unwrap();
            let total = t0.elapsed().as_secs_f64();
            if round == 1 {
                println!("handoff 256 x {n} tokens ({:.0} MB): encode {enc:.3} s, server decode + validate {:.3} s, total (encode + send + decode + reply) {total:.3} s   target < 1 s: ratio {:.2}x of the target",
                    batch.encoded_len() as f64 / 1e6, r["decode_seconds"].as_f64().unwrap_or(f64::NAN), total);
            }
        }
    });
}
