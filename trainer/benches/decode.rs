//! Batched decoding at the smoke run's context lengths: `Qwen3::decode_step` for 32 sequences
//! (the smoke run's wave: 8 tasks x 4 rollouts) whose caches hold 64 to 2,048 tokens, on
//! `configs/small.json` with a 4,096-token vocabulary (the smoke tokenizer's size until session
//! 27, now 2,048; kept so the figures in BENCHMARKS.md stay comparable; random weights: the time
//! of a forward does not depend on them). Prints
//! milliseconds per decode round and tokens/s at each context, with the ratio to the 64-token
//! context as the reference: what a longer context costs per generated token. Side by side, the
//! same rounds for one sequence. Run: `cargo bench -p trainer --bench decode` after
//! `source scripts/torch-env.sh` (`-- ROUNDS`, default 24).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::Instant;

use trainer::model::{BatchKv, Fwd, KvCache, Qwen3, Qwen3Config};

/// A batch cache of `len` tokens for each of `b` sequences, filled by real prefills.
fn caches(m: &Qwen3, b: usize, len: i64) -> BatchKv {
    let mut kv = BatchKv::default();
    for i in 0..b {
        let mut c = KvCache::new(m.layers.len());
        let ids = tch::Tensor::arange(len, (tch::Kind::Int64, tch::Device::Cpu))
            .g_mul_scalar(7)
            .g_add_scalar(i as i64)
            .remainder(4000)
            .view([1, -1]);
        let _ = m.forward_cached(&ids, &mut c, Fwd::POLICY);
        kv.push(&c);
    }
    kv
}

/// Seconds per `decode_step` round over `rounds` rounds (after one warm-up round).
fn per_round(m: &Qwen3, caches: &mut BatchKv, rounds: usize) -> f64 {
    let ids: Vec<i64> = (0..caches.rows() as i64).map(|i| 100 + i).collect();
    let _ = m.decode_step(&ids, caches, Fwd::POLICY);
    let t0 = Instant::now();
    for _ in 0..rounds {
        let _ = m.decode_step(&ids, caches, Fwd::POLICY);
    }
    t0.elapsed().as_secs_f64() / rounds as f64
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(24);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/small.json");
    let mut cfg = Qwen3Config::from_file(&path).unwrap();
    // The smoke model's vocabulary until session 27 (scripts/init-smoke.sh trains 2,048 now).
    cfg.vocab_size = 4096;
    let m = Qwen3::random(cfg, 3, 0.02, tch::Device::Cpu, tch::Kind::Float).unwrap();
    println!(
        "decode_step, configs/small.json, vocabulary 4096 (random weights), f32, {} torch threads, {rounds} rounds",
        tch::get_num_threads()
    );
    println!(
        "| context | 32 sequences: ms/round | tokens/s | x 64-token rate | 1 sequence: ms/round |"
    );
    println!("|---:|---:|---:|---:|---:|");
    let mut base = None;
    tch::no_grad(|| {
        for len in [64, 512, 1024, 2048] {
            let mut many = caches(&m, 32, len);
            let t = per_round(&m, &mut many, rounds);
            drop(many);
            let mut one = caches(&m, 1, len);
            let t1 = per_round(&m, &mut one, rounds);
            let rate = 32.0 / t;
            let b = *base.get_or_insert(rate);
            println!(
                "| {len} | {:.2} | {rate:.0} | {:.2} | {:.2} |",
                t * 1e3,
                rate / b,
                t1 * 1e3
            );
        }
    });
}
