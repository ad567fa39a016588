//! Rollout engine overhead: turns per second, orchestrator CPU per turn and peak RSS with 256 and
//! 2048 concurrent trajectories against the loopback fake answering at 0 ms and 50 ms. The fake
//! runs in a child process, so CPU and memory figures are the orchestrator's alone. Each
//! trajectory is 3 turns (plan + call, research + call, review + answer) with an instant tool.
//! Reference, side by side: the ideal wall time at 50 ms (3 turns x 50 ms when nothing queues).
//!
//! Run: cargo bench -p orchestrator --bench rollout_engine
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "benchmark code fails loudly"
)]

#[path = "../tests/common/fake_openai.rs"]
mod fake_openai;
#[path = "../tests/common/loopback.rs"]
mod loopback;

#[path = "common/three_turns.rs"]
mod three_turns;

use std::sync::Arc;
use std::time::{Duration, Instant};

use orchestrator::domain::config::RolloutConfig;
use orchestrator::infra::llm::{EndpointPool, LlmClient, RetryPolicy, Role, build_http};
use orchestrator::pipeline::rollout::{RolloutCtx, RolloutSlot, RolloutTask, rollout_batch};
use three_turns::cpu_seconds;
use uuid::Uuid;

fn rss_peak_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() {
    if three_turns::serve_if_child(&[]) {
        return;
    }
    println!("rollout engine: 3-turn trajectories, instant tool, fake server in a child process");
    println!(
        "{:>10} {:>8} | {:>8} {:>9} {:>11} {:>12} | {:>10} {:>10}",
        "concurrent",
        "latency",
        "turns/s",
        "wall s",
        "CPU us/turn",
        "CPU % of turn",
        "ideal s",
        "wall/ideal"
    );
    for latency in [0u64, 50] {
        let (mut child, url) = three_turns::spawn_fake(latency);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        for concurrent in [256usize, 2048] {
            rt.block_on(async {
                let pool = EndpointPool::new(
                    Role::Policy,
                    "policy",
                    std::slice::from_ref(&url),
                    4096,
                    Duration::from_secs(120),
                    3,
                );
                let client = LlmClient::new(
                    build_http(Duration::from_secs(5)).unwrap(),
                    Arc::new(pool),
                    RetryPolicy::none(),
                );
                let ctx = RolloutCtx {
                    client,
                    codec: Arc::new(fake_openai::ToyCodec),
                    tools: Arc::new(three_turns::runner(4096)),
                    cfg: RolloutConfig {
                        n: 1,
                        tasks_per_step: 1,
                        max_tool_calls: 10,
                        max_tokens: 8192,
                        forced_answer_tokens: Some(512),
                        max_prompt_tokens: None,
                        repetition_detection: None,
                        answer_after_loop: false,
                        temperature: 1.0,
                        top_p: 1.0,
                    },
                    seed: None,
                    scaffold: orchestrator::domain::scaffold::Scaffold::Rubricem,
                };
                let tasks: Vec<RolloutTask> = (0..concurrent)
                    .map(|i| RolloutTask {
                        task_id: Uuid::now_v7(),
                        key: i as u64,
                        system: "You are a research agent.".repeat(20),
                        user: format!("Question {i} about an enzyme?"),
                    })
                    .collect();
                let slot = RolloutSlot {
                    run_id: Uuid::now_v7(),
                    step: 0,
                    sample_index: 0,
                    policy_version: 0,
                };
                let cancel = tokio_util::sync::CancellationToken::new();
                let (cpu0, t0) = (cpu_seconds(), Instant::now());
                let out = rollout_batch(&ctx, &tasks, 1, slot, concurrent, &cancel, None).await;
                let (wall, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
                let ok = out
                    .iter()
                    .filter(|r| matches!(r, Ok(r) if r.trajectory.finish_reason == "answer"))
                    .count();
                assert_eq!(ok, concurrent, "every trajectory answered");
                let turns = (concurrent * 3) as f64;
                let cpu_per_turn_us = cpu / turns * 1e6;
                let pct = if latency > 0 {
                    format!(
                        "{:.2}%",
                        cpu_per_turn_us / (latency as f64 * 1000.0) * 100.0
                    )
                } else {
                    "-".into()
                };
                let ideal = 3.0 * latency as f64 / 1000.0;
                let ratio = if latency > 0 {
                    format!("{:.2}", wall / ideal)
                } else {
                    "-".into()
                };
                println!(
                    "{:>10} {:>6}ms | {:>8.0} {:>9.2} {:>11.0} {:>12} | {:>10.2} {:>10}",
                    concurrent,
                    latency,
                    turns / wall,
                    wall,
                    cpu_per_turn_us,
                    pct,
                    ideal,
                    ratio
                );
            });
        }
        drop(child.stdin.take());
        let _ = child.wait();
    }
    println!(
        "peak RSS of the orchestrator process: {:.0} MiB",
        rss_peak_mib()
    );
}
