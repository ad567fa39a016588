//! Batched decoding at the smoke run's context lengths: `Qwen3::decode_step` on
//! `configs/small.json` with a 4,096-token vocabulary (the smoke tokenizer's size until session
//! 27, now 2,048; kept so the figures in BENCHMARKS.md stay comparable; random weights: the time
//! of a forward does not depend on them). Prints milliseconds per decode round and tokens/s for
//! 32 sequences (the smoke run's wave: 8 tasks x 4 rollouts) whose caches all hold 64 to 2,048
//! tokens, and for a mixed wave of 64 rows of 400 to 3,600 tokens (new rollouts beside
//! stragglers and reflection prompts, as a policy server holds them under `max_staleness = 1`).
//! Each case side by side: the reference, libtorch's attention over a masked view of every row
//! up to the longest (`decode_step_masked`), and `decode_step`, which reads each row's own
//! positions with the CPU row kernel where that pays (`StepSlots::rows_pay`) and is the
//! reference otherwise, with the ratio; and the row kernel in every round
//! (`DecodeAttention::Rows`), which shows its cost per position against the reference. Run:
//! `cargo bench -p trainer --bench decode` after `source scripts/torch-env.sh` (`-- ROUNDS`,
//! default 24; `-- bf16` for a bf16 model and caches).
//!
//! Then a `guided` step's wave as the policy server holds it: 32 rows, 8 tasks x 4 samples,
//! every row beginning with one 694-token system prompt and each task's 4 rows with its 65
//! task tokens after it (BENCHMARKS.md, issue 25 session 85), at 1,024 to 2,048 tokens a row;
//! the row kernel in every round over rows pushed alone (each reads its own copy of the prompt:
//! the reference) and over the same rows pushed with their tokens (`BatchKv::push_shared`: the
//! rows read the shared prompt from one row), with the ratio.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::Arc;
use std::time::Instant;

use trainer::model::{BatchKv, DecodeAttention, Fwd, KvCache, Qwen3, Qwen3Config};

/// The `guided` wave of the module's second table, rows of `len` tokens: each row's cache
/// extends its task's, which extends the system prompt's (copies of one prefill, as the prefix
/// store hands them out); `share`: pushed with their tokens, else alone.
fn wave(m: &Qwen3, len: i64, share: bool) -> BatchKv {
    let ids = |from: i64, n: i64| -> Vec<i64> { (0..n).map(|k| (from + k * 7) % 4000).collect() };
    let extend = |c: &KvCache, toks: &[i64]| {
        let mut c = c.prefix(c.seq_len());
        let _ = m.forward_cached(
            &tch::Tensor::from_slice(toks).view([1, -1]),
            &mut c,
            Fwd::POLICY,
        );
        c
    };
    let system = ids(1, 694);
    let sys = extend(&KvCache::new(m.layers.len()), &system);
    let mut kv = BatchKv::default();
    for task in 0..8 {
        let task_ids = ids(2_000 + task * 65, 65);
        let t = extend(&sys, &task_ids);
        for sample in 0..4 {
            let own = ids(3_000 + task * 4 + sample, len - 759);
            let row = extend(&t, &own);
            let tokens: Vec<u32> = [&system[..], &task_ids, &own]
                .concat()
                .iter()
                .map(|&x| x as u32)
                .collect();
            if share {
                kv.push_shared(&row, Arc::new(tokens), 1);
            } else {
                kv.push(&row);
            }
        }
    }
    kv
}

/// Seconds per decode round of the row kernel over `kvs` (the same rows pushed two ways), over
/// `rounds` rounds after one warm-up, alternating in blocks of 4.
fn per_round_rows(m: &Qwen3, mut kvs: [BatchKv; 2], rounds: usize) -> [f64; 2] {
    let ids: Vec<i64> = (0..kvs[0].rows() as i64).map(|i| 100 + i).collect();
    let step = |kv: &mut BatchKv| {
        let _ = m.decode_step_with(&ids, kv, Fwd::POLICY, DecodeAttention::Rows);
    };
    kvs.iter_mut().for_each(step);
    let mut secs = [0.0; 2];
    let mut done = 0;
    while done < rounds {
        let n = 4.min(rounds - done);
        for (kv, s) in kvs.iter_mut().zip(&mut secs) {
            let t0 = Instant::now();
            for _ in 0..n {
                step(kv);
            }
            *s += t0.elapsed().as_secs_f64();
        }
        done += n;
    }
    secs.map(|s| s / rounds as f64)
}

/// A batch cache with one row per entry of `lens`, each filled by a real prefill.
fn caches(m: &Qwen3, lens: &[i64]) -> BatchKv {
    let mut kv = BatchKv::default();
    for (i, &len) in lens.iter().enumerate() {
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

/// Seconds per decode round over `rounds` rounds (after one warm-up round) for each way of
/// attending, alternating in blocks of 4 rounds on copies of one cache.
fn per_round(m: &Qwen3, lens: &[i64], rounds: usize) -> [f64; 3] {
    let ids: Vec<i64> = (0..lens.len() as i64).map(|i| 100 + i).collect();
    let ways = [
        DecodeAttention::Masked,
        DecodeAttention::Auto,
        DecodeAttention::Rows,
    ];
    let mut kvs: Vec<BatchKv> = ways.iter().map(|_| caches(m, lens)).collect();
    for (w, kv) in ways.iter().zip(&mut kvs) {
        let _ = m.decode_step_with(&ids, kv, Fwd::POLICY, *w);
    }
    let mut secs = [0.0; 3];
    let mut done = 0;
    while done < rounds {
        let n = 4.min(rounds - done);
        for ((w, kv), s) in ways.iter().zip(&mut kvs).zip(&mut secs) {
            let t0 = Instant::now();
            for _ in 0..n {
                let _ = m.decode_step_with(&ids, kv, Fwd::POLICY, *w);
            }
            *s += t0.elapsed().as_secs_f64();
        }
        done += n;
    }
    secs.map(|s| s / rounds as f64)
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(24);
    // `bf16` among the arguments: the model (and so its caches) in bf16, as a policy server
    // started with `--dtype bf16`.
    let (kind, dtype) = if std::env::args().any(|a| a == "bf16") {
        (tch::Kind::BFloat16, "bf16")
    } else {
        (tch::Kind::Float, "f32")
    };
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/small.json");
    let mut cfg = Qwen3Config::from_file(&path).unwrap();
    // The smoke model's vocabulary until session 27 (scripts/init-smoke.sh trains 2,048 now).
    cfg.vocab_size = 4096;
    let m = Qwen3::random(cfg, 3, 0.02, tch::Device::Cpu, kind).unwrap();
    println!(
        "decode_step, configs/small.json, vocabulary 4096 (random weights), {dtype}, {} torch threads, {rounds} rounds",
        tch::get_num_threads()
    );
    println!(
        "| rows x context | masked view (reference): ms/round | tokens/s | decode_step: ms/round | tokens/s | speed-up | row kernel always: ms/round | x reference |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut cases: Vec<(String, Vec<i64>)> = [64, 512, 1024, 2048]
        .iter()
        .map(|&n| (format!("32 x {n}"), vec![n; 32]))
        .collect();
    cases.push((
        "64 x 400..3,600".to_string(),
        (0..64).map(|i| 400 + i * 3200 / 63).collect(),
    ));
    tch::no_grad(|| {
        for (name, lens) in &cases {
            let [t_masked, t_auto, t_rows] = per_round(&m, lens, rounds);
            let rows = lens.len() as f64;
            println!(
                "| {name} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2}x | {:.2} | {:.2}x |",
                t_masked * 1e3,
                rows / t_masked,
                t_auto * 1e3,
                rows / t_auto,
                t_masked / t_auto,
                t_rows * 1e3,
                t_masked / t_rows
            );
        }
        println!();
        println!(
            "| guided wave, 32 rows x context | row kernel, own copies (reference): ms/round | shared prompt: ms/round | positions read from one row | speed-up |"
        );
        println!("|---|---:|---:|---:|---:|");
        for len in [1024, 1536, 2048] {
            let shared = wave(&m, len, true);
            let from_one = shared.shared_positions();
            let [own, one] = per_round_rows(&m, [wave(&m, len, false), shared], rounds);
            println!(
                "| 32 x {len} | {:.2} | {:.2} | {from_one} of {} | {:.2}x |",
                own * 1e3,
                one * 1e3,
                32 * (len + 1),
                own / one
            );
        }
    });
}
