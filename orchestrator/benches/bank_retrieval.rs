//! Rubric-bank retrieval latency: top-2 cosine over 10k and 100k items (dimension 1024, as
//! Qwen3-Embedding-0.6B; and 256, the local embedding), p50/p99 per query, with exclusion of
//! the querying task. Reference, side by side: the naive method (score every item into a
//! vector, sort it, take the first two that are not the task itself).
//!
//! Run: cargo bench -p orchestrator --bench bank_retrieval [-- QUERIES]
#![allow(
    clippy::unwrap_used,
    clippy::print_stdout,
    reason = "benchmark code fails loudly"
)]

use std::time::Instant;

use orchestrator::domain::bank::embed::{dot, normalize};
use orchestrator::domain::bank::{BankIndex, BankItem};
use uuid::Uuid;

/// xorshift64*: reproducible pseudo-random vectors without a dependency.
fn rng(state: &mut u64) -> f32 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    let x = state.wrapping_mul(0x2545_F491_4F6C_DD1D);
    (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
}

fn vector(dim: usize, s: &mut u64) -> Vec<f32> {
    let mut v: Vec<f32> = (0..dim).map(|_| rng(s)).collect();
    normalize(&mut v);
    v
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let queries: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(50);
    println!("bank retrieval, top-2 cosine, {queries} queries per row (1 thread)");
    println!(
        "{:>7} {:>5} | {:>10} {:>10} | {:>14} | {:>6}",
        "items", "dim", "p50 ms", "p99 ms", "naive p50 ms", "ratio"
    );
    for &(n, dim) in &[
        (10_000usize, 1024usize),
        (100_000, 1024),
        (10_000, 256),
        (100_000, 256),
    ] {
        let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ (n as u64) ^ ((dim as u64) << 32);
        let mut ix = BankIndex::default();
        let mut flat = Vec::with_capacity(n * dim);
        for i in 0..n {
            let e = vector(dim, &mut s);
            flat.extend_from_slice(&e);
            ix.upsert(BankItem {
                task_id: Uuid::from_u128(i as u128 + 1),
                question: String::new(),
                question_sha256: format!("{i:064x}"),
                embedding: e,
                rubrics: String::new(),
                takeaways: String::new(),
                score: 0.0,
                step: 0,
                reflection_id: None,
            })
            .unwrap();
        }
        let (mut fast, mut naive) = (Vec::new(), Vec::new());
        for q in 0..queries {
            let query = vector(dim, &mut s);
            let me = Uuid::from_u128((q % n) as u128 + 1);
            let t0 = Instant::now();
            let got = ix.top_k(&query, 2, me, "").unwrap();
            fast.push(t0.elapsed().as_secs_f64() * 1e3);
            let got: Vec<Uuid> = got.iter().map(|(it, _)| it.task_id).collect();

            let t1 = Instant::now();
            let mut scored: Vec<(f32, usize)> = flat
                .chunks_exact(dim)
                .enumerate()
                .map(|(i, row)| (dot(row, &query), i))
                .collect();
            scored.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap());
            let want: Vec<Uuid> = scored
                .iter()
                .map(|&(_, i)| Uuid::from_u128(i as u128 + 1))
                .filter(|id| *id != me)
                .take(2)
                .collect();
            naive.push(t1.elapsed().as_secs_f64() * 1e3);
            assert_eq!(got, want, "the index and the naive scan disagree");
        }
        let (p50, p99, n50) = (
            pct(&mut fast, 0.5),
            pct(&mut fast, 0.99),
            pct(&mut naive, 0.5),
        );
        println!(
            "{n:>7} {dim:>5} | {p50:>10.3} {p99:>10.3} | {n50:>14.3} | {:>5.2}x",
            n50 / p50
        );
    }
}
