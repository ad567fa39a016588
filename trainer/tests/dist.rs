//! The collective layer across real processes: the test binary re-executes itself as the ranks
//! of a 2-process gloo group on CPU (RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT as torchrun
//! sets them; one torch thread per rank). Collectives give the hand-computed values; a rank
//! that exits or hangs makes the other's collective fail within the timeout, naming the
//! operation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Output;
use std::time::{Duration, Instant};

mod common;

use common::ranks::{
    Spawn, assert_ranks_passed, child_env, collectives_give_hand_computed_values, join,
};
use tch::{Device, Kind, Tensor};
use trainer::dist::{BackendKind, C10d, Collective, DistError, ReduceOp, Work};

/// The env var naming the test a child process runs as one rank.
const CHILD: &str = "RUBRICEM_DIST_TEST_CHILD";

/// Run test `name` of this binary as `world` ranks, each on its own device (CPU here).
fn run_ranks(name: &str, world: usize, limit: Duration) -> Vec<Output> {
    let spawn = Spawn {
        child_var: CHILD,
        one_device: false,
    };
    common::ranks::run_ranks(spawn, name, world, limit)
}

/// In a child process started for test `name`: its group (1 torch thread, gloo, `timeout`).
fn child_group(name: &str, timeout: Duration) -> Option<C10d> {
    let env = child_env(CHILD, name)?;
    Some(join(&env, BackendKind::Gloo, timeout).unwrap())
}

fn f32s(v: &[f32]) -> Tensor {
    Tensor::from_slice(v)
}

#[test]
fn collectives_across_two_processes_give_the_expected_values() {
    let outs = run_ranks("rank_collectives", 2, Duration::from_secs(120));
    assert_ranks_passed("rank_collectives", &outs);
}

#[test]
fn rank_collectives() {
    let Some(g) = child_group("rank_collectives", Duration::from_secs(30)) else {
        return;
    };
    let (rank, world) = (g.rank(), g.world());
    assert_eq!((world, g.backend(), g.device()), (2, "gloo", Device::Cpu));
    collectives_give_hand_computed_values(&g, Device::Cpu);
    // Control plane.
    if rank == 0 {
        g.set("greeting", b"hello from 0").unwrap();
    }
    assert_eq!(
        g.get("greeting", Duration::from_secs(10)).unwrap(),
        b"hello from 0"
    );
    // Wrong calls are refused before anything is sent (both ranks make them; nothing hangs).
    let input = Tensor::arange(4, (Kind::Float, Device::Cpu));
    let mut t = f32s(&[0.0, 1.0]);
    let mut short = Tensor::zeros([3], (Kind::Float, Device::Cpu));
    let e = g
        .reduce_scatter(&mut short, &input, ReduceOp::Sum)
        .unwrap_err();
    assert!(
        matches!(
            e,
            DistError::Invalid {
                op: "reduce_scatter",
                ..
            }
        ),
        "{e}"
    );
    let mut strided = Tensor::zeros([4, 2], (Kind::Float, Device::Cpu)).tr();
    let e = g.all_reduce(&mut strided, ReduceOp::Sum).unwrap_err();
    assert!(e.to_string().contains("non-contiguous"), "{e}");
    let e = g.broadcast(&mut t, 2).unwrap_err();
    assert!(e.to_string().contains("root 2"), "{e}");
    g.barrier().unwrap();
}

#[test]
fn a_rank_that_exits_fails_the_others_collective_naming_it() {
    let outs = run_ranks("rank_peer_exits", 2, Duration::from_secs(120));
    // Rank 1 leaves by `exit(0)` before its test finishes: only rank 0 reports.
    assert_ranks_passed("rank_peer_exits", &outs[..1]);
    assert!(outs[1].status.success());
}

#[test]
fn rank_peer_exits() {
    let timeout = Duration::from_secs(10);
    let Some(g) = child_group("rank_peer_exits", timeout) else {
        return;
    };
    g.barrier().unwrap();
    if g.rank() == 1 {
        // Gone without a word, mid-job.
        std::process::exit(0);
    }
    let t0 = Instant::now();
    let mut t = f32s(&[1.0; 1024]);
    let err = g
        .all_reduce(&mut t, ReduceOp::Sum)
        .and_then(Work::wait)
        .unwrap_err();
    let took = t0.elapsed();
    let msg = err.to_string();
    assert!(msg.starts_with("rank 0: all_reduce failed:"), "{msg}");
    assert!(took < timeout, "the error took {took:?}");
    eprintln!("peer exit -> {msg} after {took:?}");
}

#[test]
fn a_rank_that_hangs_fails_the_others_collective_at_the_timeout() {
    let outs = run_ranks("rank_peer_hangs", 2, Duration::from_secs(120));
    // Rank 1 leaves by `exit(0)` before its test finishes: only rank 0 reports.
    assert_ranks_passed("rank_peer_hangs", &outs[..1]);
    assert!(outs[1].status.success());
}

#[test]
fn rank_peer_hangs() {
    let timeout = Duration::from_secs(2);
    let Some(g) = child_group("rank_peer_hangs", timeout) else {
        return;
    };
    g.barrier().unwrap();
    if g.rank() == 1 {
        // Alive but never joins the collective; leaves after rank 0 has given up.
        std::thread::sleep(Duration::from_secs(6));
        std::process::exit(0);
    }
    let t0 = Instant::now();
    let mut t = f32s(&[1.0; 8]);
    let err = g.broadcast(&mut t, 1).and_then(Work::wait).unwrap_err();
    let took = t0.elapsed();
    let msg = err.to_string();
    assert!(msg.starts_with("rank 0: broadcast failed:"), "{msg}");
    assert!(
        took >= timeout - Duration::from_millis(200) && took < timeout * 2,
        "the error took {took:?} with a {timeout:?} timeout"
    );
    eprintln!("peer hang -> {msg} after {took:?}");
}

// ---------------------------------------------------------------------------------------------
// Data parallel: one step on 2 ranks equals one rank on the whole batch.

use common::cases::{
    CASES, Case, batch, close, dp_cases_agree, step, trainer_on, zero_cases_agree,
};
use trainer::loss::PolicyLossConfig;
use trainer::model::lora::{LoraConfig, LoraTarget};
use trainer::model::{Qwen3, Qwen3Config};
use trainer::train::{Sequence, StepMetrics, TrainConfig, Trainer};

/// The case's trainer on CPU.
fn trainer_for(c: &Case) -> Trainer {
    trainer_on(c, Device::Cpu)
}

#[test]
fn a_two_rank_step_equals_one_rank_on_the_whole_batch() {
    let outs = run_ranks("rank_dp_steps", 2, Duration::from_secs(300));
    assert_ranks_passed("rank_dp_steps", &outs);
}

#[test]
fn rank_dp_steps() {
    let Some(g) = child_group("rank_dp_steps", Duration::from_secs(60)) else {
        return;
    };
    dp_cases_agree(Box::new(g), Device::Cpu, None, &CASES);
}

// ---------------------------------------------------------------------------------------------
// Timing (ignored; run with `cargo test -p trainer --test dist -- --ignored --nocapture`):
// 2 ranks x 1 thread against 1 rank x 1 thread on the same global batch, bucketed and
// unbucketed gradient all-reduce, and the communication time per step.

fn bench_trainer(lora: bool) -> Trainer {
    let cfg: Qwen3Config = serde_json::from_value(serde_json::json!({
        "vocab_size": 2048, "hidden_size": 256, "intermediate_size": 768,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 32, "max_position_embeddings": 512, "rope_theta": 10000.0,
        "tie_word_embeddings": true
    }))
    .unwrap();
    let mut m = Qwen3::random(cfg, 3, 0.02, Device::Cpu, Kind::Float).unwrap();
    if lora {
        let l = LoraConfig {
            r: 16,
            alpha: 32.0,
            dropout: 0.0,
            targets: LoraTarget::ALL.to_vec(),
        };
        m.add_lora(&l, 4).unwrap();
    } else {
        m.set_trainable(true);
    }
    Trainer::new(
        m,
        TrainConfig {
            loss: PolicyLossConfig {
                kl_coef: 0.0,
                ..PolicyLossConfig::default()
            },
            micro_batch_tokens: 1024,
            logit_chunk: 256,
            ..TrainConfig::default()
        },
    )
    .unwrap()
}

/// A count from the environment variable `name`, or `default` when unset or not a number.
fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The timing batch: `DP_TIMING_SEQS` sequences (default 16) of 64-223 tokens.
fn bench_batch() -> Vec<Sequence> {
    (0..env_count("DP_TIMING_SEQS", 16))
        .map(|i| {
            let len = 64 + (i * 37) % 160;
            Sequence {
                unlikelihood: Vec::new(),
                loss_mask: (0..len).map(|t| t >= 16).collect(),
                stages: vec![],
                behaviour_logprobs: vec![],
                advantages: vec![if i % 2 == 0 { 1.0 } else { -1.0 }],
                tokens: (0..len as i64)
                    .map(|t| (t * 31 + i as i64 * 17) % 2048)
                    .collect(),
                off_policy: false,
            }
        })
        .collect()
}

/// Rounds of 1 then 2 ranks (`DP_TIMING_ROUNDS`, default 1). Each round's efficiency is its
/// own 1-rank time over twice its 2-rank time, so this shared VM's drift between rounds does
/// not enter a ratio; the summary gives per setting the median seconds a step at each world
/// size and the median efficiency over rounds (rank 0's figures).
#[test]
#[ignore = "timing; run explicitly"]
fn data_parallel_timing() {
    let rounds = env_count("DP_TIMING_ROUNDS", 1);
    // setting -> world -> seconds a step, one per round
    let mut secs: std::collections::BTreeMap<String, [Vec<f64>; 2]> = Default::default();
    for _ in 0..rounds {
        for world in [1, 2] {
            let outs = run_ranks("rank_timing", world, Duration::from_secs(600));
            assert_ranks_passed("rank_timing", &outs);
            for line in String::from_utf8_lossy(&outs[0].stderr).lines() {
                let Some(rest) = line.split("timing -> ").nth(1) else {
                    continue;
                };
                let (head, tail) = rest.split_once(": ").unwrap();
                let setting = head.split_once(' ').unwrap().1.split_once(' ').unwrap().1;
                let s: f64 = tail.split(' ').next().unwrap().parse().unwrap();
                secs.entry(setting.to_string()).or_default()[world - 1].push(s);
            }
        }
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    eprintln!(
        "summary over {rounds} rounds (median; efficiency = 1-rank / (2 x 2-rank), per round):"
    );
    for (setting, [one, two]) in &secs {
        let eff: Vec<f64> = one.iter().zip(two).map(|(a, b)| a / (2.0 * b)).collect();
        let (o, t) = (
            (!one.is_empty()).then(|| format!("{:.3}", median(one))),
            median(two),
        );
        let e = if eff.is_empty() {
            "-".to_string()
        } else {
            format!(
                "{:.2} (range {:.2}-{:.2})",
                median(&eff),
                eff.iter().copied().fold(f64::INFINITY, f64::min),
                eff.iter().copied().fold(0.0, f64::max)
            )
        };
        eprintln!(
            "  {setting}: 1 rank {} s, 2 ranks {t:.3} s, efficiency {e}",
            o.unwrap_or_else(|| "-".into())
        );
    }
}

#[test]
fn rank_timing() {
    let Some(g) = child_group("rank_timing", Duration::from_secs(300)) else {
        return;
    };
    let world = g.world();
    let mut group: Option<Box<dyn Collective>> = Some(Box::new(g));
    let seqs = bench_batch();
    use trainer::dist::zero::ZeroStage;
    let bucketed = trainer::train::DEFAULT_BUCKET_ELEMS;
    for (lora, bucket, zero, overlap) in [
        (false, bucketed, ZeroStage::Off, false),
        (false, bucketed, ZeroStage::Off, true),
        (false, 0, ZeroStage::Off, false),
        (true, bucketed, ZeroStage::Off, false),
        (true, bucketed, ZeroStage::Off, true),
        (false, bucketed, ZeroStage::One, false),
        (false, bucketed, ZeroStage::Two, false),
    ] {
        if zero != ZeroStage::Off && world == 1 {
            continue;
        }
        let mut t = bench_trainer(lora);
        t.bucket_elems = bucket;
        t.overlap = Some(overlap);
        t.set_collective(group.take().unwrap());
        t.set_zero(zero).unwrap();
        let rank = t.collective().unwrap().rank();
        let run = |t: &mut Trainer| {
            if rank == 0 {
                t.rl_step(&seqs).unwrap()
            } else {
                t.follow_step(Duration::from_secs(300)).unwrap()
            }
        };
        run(&mut t);
        let steps = 3;
        let (mut secs, mut comm) = (0.0, 0.0);
        for _ in 0..steps {
            let t0 = Instant::now();
            run(&mut t);
            secs += t0.elapsed().as_secs_f64();
            comm += t.last_sync.seconds;
        }
        // fp32 AdamW state (m, v) held by this rank, in MB.
        let params: i64 = t
            .model
            .trainable()
            .iter()
            .map(|(_, p)| p.numel() as i64)
            .sum();
        let state_mb = match t.zero_shard() {
            Some(z) => z.layout.chunk as f64 * 8.0 / 1e6,
            None => params as f64 * 8.0 / 1e6,
        };
        eprintln!(
            "timing -> world {world} lora {lora} bucket_elems {bucket} zero {zero:?} overlap {overlap}: {:.3} s/step, \
             gradient sync {:.4} s/step ({} collectives, {} elements), optimizer moments {state_mb:.1} MB on this rank",
            secs / steps as f64,
            comm / steps as f64,
            t.last_sync.collectives,
            t.last_sync.elements
        );
        group = t.take_collective();
    }
}

// ---------------------------------------------------------------------------------------------
// ZeRO: stages 1 and 2 equal the one-process step; a sharded save restores on 2 ranks and,
// consolidated, on 1, and the next step is the same as without the save.

#[test]
fn zero_stages_equal_one_process_and_shards_restore_on_other_world_sizes() {
    let outs = run_ranks("rank_zero_steps", 2, Duration::from_secs(300));
    assert_ranks_passed("rank_zero_steps", &outs);
}

fn copy_params(dst: &Trainer, src: &Trainer) {
    tch::no_grad(|| {
        for ((_, d), (_, s)) in dst
            .model
            .trainable()
            .iter()
            .zip(src.model.trainable().iter())
        {
            let mut d = d.shallow_clone();
            d.copy_(s);
        }
    });
}

fn dp_step(t: &mut Trainer, c: &Case, seqs: &[Sequence]) -> StepMetrics {
    if t.collective().unwrap().rank() == 0 {
        step(t, c, seqs)
    } else {
        t.follow_step(Duration::from_secs(60)).unwrap()
    }
}

#[test]
fn rank_zero_steps() {
    use trainer::dist::zero::{Saved, ZeroStage};
    let Some(g) = child_group("rank_zero_steps", Duration::from_secs(60)) else {
        return;
    };
    let group = zero_cases_agree(Box::new(g), Device::Cpu);

    // Save after one ZeRO-2 step; restore on 2 ranks and, consolidated, on 1.
    let c = CASES[0];
    let seqs = batch(c.sequences);
    let mut one = trainer_for(&c);
    let mut dp = trainer_for(&c);
    dp.set_collective(group);
    dp.set_zero(ZeroStage::Two).unwrap();
    step(&mut one, &c, &seqs);
    dp_step(&mut dp, &c, &seqs);
    let port = std::env::var("MASTER_PORT").unwrap();
    let dir = std::env::temp_dir().join(format!("rubricem-zero-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
    dp.save_zero(&dir).unwrap();
    dp.collective().unwrap().barrier().unwrap();

    // One process from the single-file state `trainer consolidate` writes (rank 0 writes it).
    let mut solo_file = trainer_for(&c);
    copy_params(&solo_file, &dp);
    if dp.collective().unwrap().rank() == 0 {
        let (params, _, step) = trainer::dist::zero::consolidate(&dir).unwrap();
        assert_eq!((params, step), (dp.model.trainable().len(), 1));
    }
    dp.collective().unwrap().barrier().unwrap();
    solo_file.opt.load(&dir).unwrap();
    assert_eq!(solo_file.opt.step, 1);
    let got_file = step(&mut solo_file, &c, &seqs);

    // One process, from the shards reassembled in memory.
    let mut solo = trainer_for(&c);
    copy_params(&solo, &dp);
    let saved = Saved::read(&dir, Device::Cpu).unwrap();
    assert_eq!(saved.step, 1);
    for (name, master, m, v) in saved.per_parameter() {
        solo.opt.set_state(&name, &master, &m, &v).unwrap();
    }
    solo.opt.step = saved.step;
    let want = step(&mut one, &c, &seqs);
    let got = step(&mut solo, &c, &seqs);
    assert!((got.loss - want.loss).abs() <= 1e-5 * want.loss.abs().max(1.0));
    for ((n, a), (_, b)) in solo
        .model
        .trainable()
        .iter()
        .zip(one.model.trainable().iter())
    {
        close(&format!("restored on 1 rank: {n}"), a, b);
    }
    assert!((got_file.loss - want.loss).abs() <= 1e-5 * want.loss.abs().max(1.0));
    for ((n, a), (_, b)) in solo_file
        .model
        .trainable()
        .iter()
        .zip(one.model.trainable().iter())
    {
        close(&format!("consolidated on 1 rank: {n}"), a, b);
    }

    // Two ranks again, a fresh trainer restored from the shards.
    let mut again = trainer_for(&c);
    copy_params(&again, &dp);
    again.set_collective(dp.take_collective().unwrap());
    again.set_zero(ZeroStage::Two).unwrap();
    assert_eq!(again.load_zero(&dir).unwrap(), 1);
    dp_step(&mut again, &c, &seqs);
    for ((n, a), (_, b)) in again
        .model
        .trainable()
        .iter()
        .zip(one.model.trainable().iter())
    {
        close(&format!("restored on 2 ranks: {n}"), a, b);
    }
    again.collective().unwrap().barrier().unwrap();
    if again.collective().unwrap().rank() == 0 {
        let _ = std::fs::remove_dir_all(&dir);
    }
    eprintln!("zero save/restore: ok");
}

// ---------------------------------------------------------------------------------------------
// A follower's failure reaches rank 0 through the store with its reason, so the step's error
// names the rank and the cause.

#[test]
fn a_followers_failure_is_reported_to_rank_0_with_its_reason() {
    let outs = run_ranks("rank_fatal_report", 2, Duration::from_secs(120));
    assert_ranks_passed("rank_fatal_report", &outs);
}

#[test]
fn rank_fatal_report() {
    use trainer::dist::data_parallel::{peer_failure, report_fatal};
    let Some(g) = child_group("rank_fatal_report", Duration::from_secs(20)) else {
        return;
    };
    if g.rank() == 1 {
        report_fatal(&g, "rank 1: zero step: 0 parameters for a layout of 12");
    } else {
        let (rank, why) = peer_failure(&g, Duration::from_secs(15)).expect("a report");
        assert_eq!(rank, 1);
        assert!(why.contains("for a layout"), "{why}");
        // Consumed: asked again, nothing is pending.
        assert!(peer_failure(&g, Duration::from_millis(100)).is_none());
        let e = trainer::dist::DistError::Peer {
            rank,
            message: why,
            at: 0,
            here: "all_reduce failed: timed out".into(),
        };
        assert!(
            e.to_string()
                .starts_with("rank 1 failed the step: rank 1: zero step")
        );
    }
    g.barrier().unwrap();
}
