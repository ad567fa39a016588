//! Rollout throughput with and without the reflection branch running beside it (issue target:
//! under 10% slowdown). The policy is the loopback fake answering every completion after a
//! fixed latency (one-turn scaffold trajectories; reflection prompts get valid reflections), the
//! judge is the lexical judge, Postgres is real. Without: one batch of rollouts alone. With:
//! the same batch while reflection jobs over a judged step (m = 8 candidates per task, graded,
//! committed with bank writes) run back to back on the same client and endpoint pool, as the
//! pipeline runs them. The fake has unlimited parallelism, so this measures the orchestrator's
//! own overhead and shared-pool contention, not GPU contention on a real inference server.
//!
//! Needs DATABASE_URL (a server where it may create the database `rubricem_bench_reflection`).
//! Run: cargo bench -p orchestrator --bench reflection_overhead [-- TASKS N LATENCY_MS]
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

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fake_openai::{FakeServer, ToyCodec};
use orchestrator::bank::{Bank, Embedder, LocalEmbedder};
use orchestrator::config::Recipe;
use orchestrator::db;
use orchestrator::judge::lexical::LexicalJudge;
use orchestrator::judge::step::{StepOptions, judge_step};
use orchestrator::llm::{EndpointPool, LlmClient, RetryPolicy, Role, build_http};
use orchestrator::reflection::{Reflector, Settings};
use orchestrator::rollout::{RolloutConfig, RolloutCtx, RolloutSlot, RolloutTask, rollout_batch};
use orchestrator::tools::runner::ToolRunner;

const TURNS: [&str; 1] = [
    "<think>plan the search</think><structured_plan><deep_analysis>two hops</deep_analysis><rubric>- the enzyme\n- the receptor</rubric><research_plan>search both</research_plan></structured_plan><think>done</think><review><rubric_review>covered</rubric_review><writing_plan>short</writing_plan></review><answer>The enzyme binds the receptor.</answer>",
];
const REFLECTION: &str = "<reflection_rubrics>\nCritical Requirement: name the enzyme mechanism.\nAnalytical Approach: verify in two sources.\nCommunication & Structure: cite it.\nPitfalls: one search only.\n</reflection_rubrics>\n<reflection_takeaways>\n- verify mechanism claims twice\n</reflection_takeaways>";

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (n_tasks, n, latency_ms) = (
        args.first().copied().unwrap_or(32) as usize,
        args.get(1).copied().unwrap_or(8) as u32,
        args.get(2).copied().unwrap_or(20),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (pool, _url) = bench_db::fresh("rubricem_bench_reflection", 16).await;
        let server = FakeServer::start().await;
        server.set_latency(Duration::from_millis(latency_ms));
        *server.state.auto_turns.write().unwrap() = TURNS.iter().map(|s| s.to_string()).collect();
        *server.state.reflection_replies.write().unwrap() = vec![REFLECTION.to_string()];
        let ep = EndpointPool::new(Role::Policy, "policy", &[server.url()], 256, Duration::from_secs(30), 100);
        let client = LlmClient::new(build_http(Duration::from_secs(5)).unwrap(), Arc::new(ep), RetryPolicy::none());
        let ctx = RolloutCtx {
            client: client.clone(),
            codec: Arc::new(ToyCodec),
            tools: Arc::new(ToolRunner::new(None)),
            cfg: RolloutConfig { max_tool_calls: 0, max_tokens: 4096, forced_answer_tokens: 256, temperature: 1.0, top_p: 1.0, seed: Some(1) },
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
            task_id: *id, system: "SYS".into(), user: t.prompt.clone(),
        }).collect();
        let slot = |step| RolloutSlot { run_id: run, step, sample_index: 0, policy_version: 0 };

        // A judged step for the reflection jobs to read.
        db::runs::begin_step(&pool, run, 0, 0, &ids).await.unwrap();
        let cancel = tokio_util::sync::CancellationToken::new();
        let first: Vec<_> = rollout_batch(&ctx, &tasks, n, slot(0), 256, &cancel, None).await.into_iter().map(|r| r.unwrap()).collect();
        db::rollouts::insert(&pool, &first).await.unwrap();
        let judge = Arc::new(LexicalJudge::new("lexical-v1"));
        judge_step(&pool, judge.as_ref(), &StepOptions::for_recipe(Recipe::Full, Default::default(), false), run, 0).await.unwrap();
        let bank = Bank::load(pool.clone(), run, Embedder::Local(LocalEmbedder::default()), 2).await.unwrap();
        let reflector = Reflector {
            pool: pool.clone(), run_id: run, seed: 1, client: client.clone(), codec: Arc::new(ToyCodec),
            judge: judge.clone(), bank: Arc::new(bank),
            settings: Settings { candidates: 8, temperature: 0.7, top_p: 1.0, max_tokens: 1024, accept_threshold: 0.0, max_trajectory_chars: 12_000 },
        };

        let trajectories = n_tasks * n as usize;
        let mut alone = Vec::new();
        let mut beside = Vec::new();
        let mut jobs_done = 0;
        for round in 0..3 {
            let t0 = Instant::now();
            let r = rollout_batch(&ctx, &tasks, n, slot(1), 256, &cancel, None).await;
            assert!(r.iter().all(|x| x.is_ok()));
            alone.push(t0.elapsed().as_secs_f64());

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
            let t0 = Instant::now();
            let r = rollout_batch(&ctx, &tasks, n, slot(1), 256, &cancel, None).await;
            assert!(r.iter().all(|x| x.is_ok()));
            beside.push(t0.elapsed().as_secs_f64());
            stop.store(true, Ordering::Relaxed);
            bg.await.unwrap();
            jobs_done += done.load(Ordering::Relaxed);
            let _ = round;
        }
        alone.sort_by(|a, b| a.partial_cmp(b).unwrap());
        beside.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let (a, b) = (alone[1], beside[1]);
        println!("rollout throughput with and without the reflection branch ({n_tasks} tasks x n={n}, one turn each, fake latency {latency_ms} ms, median of 3)");
        println!("{:>28} | {:>10} | {:>12}", "", "wall s", "traj/s");
        println!("{:>28} | {:>10.3} | {:>12.1}", "rollouts alone", a, trajectories as f64 / a);
        println!("{:>28} | {:>10.3} | {:>12.1}", "rollouts + reflection jobs", b, trajectories as f64 / b);
        println!("slowdown: {:.1}% (target < 10%); reflection jobs completed beside the rollouts: {jobs_done} ({} candidates each)", (b / a - 1.0) * 100.0, n_tasks * 8);
        let items = db::bank::load(&pool, run).await.unwrap().len();
        println!("bank items after the jobs: {items}");
    });
}
