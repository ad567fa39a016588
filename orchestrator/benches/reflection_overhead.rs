//! Rollout throughput with and without the reflection branch running beside it (issue target:
//! under 10% slowdown). The policy is the loopback fake in a child process (so the CPU figures
//! are the orchestrator's alone) answering every completion after a fixed latency: 3-turn
//! scaffold trajectories with an instant search tool, and valid reflections for reflection
//! prompts. The judge is the lexical judge, Postgres is real. Three ways, each round side by side:
//! - alone: one batch of rollouts (the reference);
//! - pipeline: the same batch while one reflection job over the previous judged step (m = 8
//!   candidates per task, graded, committed with bank writes) runs beside it on the same runtime,
//!   client and endpoint pool, as `orchestrator run` schedules it (one job per new step);
//! - saturated: the same batch while jobs run back to back for its whole duration (a stress
//!   bound, heavier than any schedule the pipeline makes).
//!
//! The fake has unlimited parallelism, so this measures the orchestrator's own overhead and
//! shared-pool contention, not GPU contention on a real inference server.
//!
//! Needs DATABASE_URL (a server where it may create the database `rubricem_bench_reflection`).
//! Run: cargo bench -p orchestrator --bench reflection_overhead [-- TASKS N LATENCY_MS ROUNDS]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "benchmark code fails loudly"
)]

#[path = "common/bench_db.rs"]
mod bench_db;

#[path = "../tests/common/fake_openai.rs"]
mod fake_openai;
#[path = "../tests/common/loopback.rs"]
mod loopback;

#[path = "common/three_turns.rs"]
mod three_turns;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fake_openai::ToyCodec;
use orchestrator::domain::bank::LocalEmbedder;
use orchestrator::domain::config::Recipe;
use orchestrator::domain::config::RolloutConfig;
use orchestrator::domain::judge::lexical::LexicalJudge;
use orchestrator::infra::db;
use orchestrator::infra::llm::{EndpointPool, LlmClient, RetryPolicy, Role, build_http};
use orchestrator::pipeline::bank::{Bank, Embedder};
use orchestrator::pipeline::judging::{StepOptions, judge_step};
use orchestrator::pipeline::reflection::{Reflector, Settings};
use orchestrator::pipeline::rollout::{RolloutCtx, RolloutSlot, RolloutTask, rollout_batch};
use three_turns::cpu_seconds;

const REFLECTION: &str = "<reflection_rubrics>\nCritical Requirement: name the enzyme mechanism.\nAnalytical Approach: verify in two sources.\nCommunication & Structure: cite it.\nPitfalls: one search only.\n</reflection_rubrics>\n<reflection_takeaways>\n- verify mechanism claims twice\n</reflection_takeaways>";

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    if three_turns::serve_if_child(&[REFLECTION]) {
        return;
    }
    let raw: Vec<String> = std::env::args().collect();
    let args: Vec<u64> = raw.iter().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (n_tasks, n, latency_ms, rounds) = (
        args.first().copied().unwrap_or(32) as usize,
        args.get(1).copied().unwrap_or(8) as u32,
        args.get(2).copied().unwrap_or(50),
        args.get(3).copied().unwrap_or(5).max(1) as usize,
    );
    let (mut child, url) = three_turns::spawn_fake(latency_ms);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (pool, db_url) = bench_db::fresh("rubricem_bench_reflection", 16).await;
        let ep = EndpointPool::new(Role::Policy, "policy", std::slice::from_ref(&url), 1024, Duration::from_secs(60), 100);
        let client = LlmClient::new(build_http(Duration::from_secs(5)).unwrap(), Arc::new(ep), RetryPolicy::none());
        let ctx = RolloutCtx {
            client: client.clone(),
            codec: Arc::new(ToyCodec),
            tools: Arc::new(three_turns::runner(1024)),
            cfg: RolloutConfig { n: 1, tasks_per_step: 1, max_tool_calls: 10, max_tokens: 8192, forced_answer_tokens: Some(512), max_prompt_tokens: None, temperature: 1.0, top_p: 1.0, repetition_detection: None, answer_after_loop: false },
            seed: Some(1),
            scaffold: orchestrator::domain::scaffold::Scaffold::Rubricem,
        };
        let new: Vec<db::tasks::NewTask> = (0..n_tasks).map(|i| db::tasks::NewTask {
            source: "bench".into(), external_id: i.to_string(),
            prompt: format!("How does enzyme {i} act on receptor {}?", i % 7),
            answer_format: "long".into(),
            persistent_rubrics: serde_json::json!([{"title": "mechanism", "description": "explains the enzyme mechanism", "weight": 1.0}]),
            metadata: serde_json::json!({}),
        }).collect();
        let ids = db::tasks::upsert(&pool, &new).await.unwrap();
        let exp = db::runs::create_experiment(&pool, "bench", "smoke", &serde_json::json!({})).await.unwrap();
        let run = db::runs::create_run(&pool, exp, "bench", "full", &serde_json::json!({}), 0).await.unwrap();
        let tasks: Vec<RolloutTask> = new.iter().zip(&ids).map(|(t, id)| RolloutTask {
            task_id: *id, key: orchestrator::domain::util::task_key(&t.source, &t.external_id),
            system: "You are a research agent.".repeat(20), user: t.prompt.clone(),
        }).collect();
        let slot = |step| RolloutSlot { run_id: run, step, sample_index: 0, policy_version: 0 };
        let inflight = n_tasks * n as usize;

        // A judged step for the reflection jobs to read.
        db::runs::begin_step(&pool, run, 0, 0, &ids).await.unwrap();
        let cancel = tokio_util::sync::CancellationToken::new();
        let first: Vec<_> = rollout_batch(&ctx, &tasks, n, slot(0), inflight, &cancel, None).await.into_iter().map(|r| r.unwrap()).collect();
        db::rollouts::insert(&pool, &first).await.unwrap();
        let judge = Arc::new(LexicalJudge::new("lexical-v1"));
        judge_step(&pool, judge.as_ref(), &StepOptions::for_recipe(Recipe::Full, Default::default(), false), run, 0).await.unwrap();
        let bank = Bank::load(pool.clone(), run, Embedder::Local(LocalEmbedder::default()), 2).await.unwrap();
        let reflector = Reflector {
            pool: pool.clone(), run_id: run, seed: 1, client: client.clone(), codec: Arc::new(ToyCodec),
            judge: judge.clone(), bank: Arc::new(bank),
            settings: Settings { candidates: 8, temperature: 0.7, top_p: 1.0, max_tokens: 1024, accept_threshold: 0.0, max_trajectory_chars: 12_000 },
        };
        // Warm the connection pools and caches once.
        reflector.run_job(0, 0).await.unwrap();
        let _ = rollout_batch(&ctx, &tasks, n, slot(1), inflight, &cancel, None).await;

        let batch = || async {
            let (c0, t0) = (cpu_seconds(), Instant::now());
            let r = rollout_batch(&ctx, &tasks, n, slot(1), inflight, &cancel, None).await;
            assert!(r.iter().all(|x| matches!(x, Ok(r) if r.trajectory.finish_reason == "answer")));
            (t0.elapsed().as_secs_f64(), cpu_seconds() - c0)
        };
        let (mut alone, mut alone_cpu) = (Vec::new(), Vec::new());
        let (mut piped, mut piped_cpu, mut job_s) = (Vec::new(), Vec::new(), Vec::new());
        let (mut sat, mut sat_cpu) = (Vec::new(), Vec::new());
        let mut sat_jobs = 0;
        for _ in 0..rounds {
            let (w, c) = batch().await;
            alone.push(w);
            alone_cpu.push(c);

            // Pipeline: the previous step's job starts with the batch, as the judge worker
            // launches it; the batch is timed, the job runs to its end.
            let job = {
                let refl = reflector.clone();
                tokio::spawn(async move { refl.run_job(0, 0).await.unwrap() })
            };
            let (w, c) = batch().await;
            piped.push(w);
            piped_cpu.push(c);
            job_s.push(job.await.unwrap().seconds);

            let stop = Arc::new(AtomicBool::new(false));
            let done = Arc::new(AtomicUsize::new(0));
            let bg = {
                let (stop, done, refl) = (stop.clone(), done.clone(), reflector.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        refl.run_job(0, 0).await.unwrap();
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                })
            };
            let (w, c) = batch().await;
            sat.push(w);
            sat_cpu.push(c);
            stop.store(true, Ordering::Relaxed);
            bg.await.unwrap();
            sat_jobs += done.load(Ordering::Relaxed);
        }
        let trajectories = (n_tasks * n as usize) as f64;
        let a = median(&mut alone);
        println!("rollout throughput with and without the reflection branch ({n_tasks} tasks x n={n}, 3 turns each, fake latency {latency_ms} ms in a child process, median of {rounds} rounds)");
        println!("{:>34} | {:>8} | {:>9} | {:>9} | {:>16}", "", "wall s", "traj/s", "slowdown", "orchestrator CPU s");
        println!("{:>34} | {:>8.3} | {:>9.1} | {:>9} | {:>16.3}", "rollouts alone (reference)", a, trajectories / a, "-", median(&mut alone_cpu));
        let p = median(&mut piped);
        println!("{:>34} | {:>8.3} | {:>9.1} | {:>8.1}% | {:>16.3}", "+ one job (pipeline schedule)", p, trajectories / p, (p / a - 1.0) * 100.0, median(&mut piped_cpu));
        let s = median(&mut sat);
        println!("{:>34} | {:>8.3} | {:>9.1} | {:>8.1}% | {:>16.3}", "+ jobs back to back (stress)", s, trajectories / s, (s / a - 1.0) * 100.0, median(&mut sat_cpu));
        println!("pipeline slowdown {:.1}% (target < 10%); one job takes {:.3} s ({} candidates); stress ran {sat_jobs} jobs in {rounds} batches",
            (p / a - 1.0) * 100.0, median(&mut job_s), n_tasks * 8);
        let items = db::bank::load(&pool, run).await.unwrap().len();
        println!("bank items after the jobs: {items}");
        pool.close().await;
        bench_db::drop(&db_url).await;
    });
    drop(child.stdin.take());
    let _ = child.wait();
}
