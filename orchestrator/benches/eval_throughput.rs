//! Benchmark evaluation throughput: 100 HealthBench-shaped items x 10 criteria (HealthBench's mean
//! is 9.7) graded through `pipeline::bench::run` (answers file, one judge, per-criterion calls,
//! every unit stored in Postgres) against the loopback fake grader answering after 200 ms, with
//! 64 judge calls in flight. Reference, side by side: the judge-bound ideal (calls / concurrency
//! x latency) and a bare client floor (the same number of calls through the same LLM client
//! with the same bound, no grading, no storage).
//!
//! Needs DATABASE_URL (a server where it may create the database `rubricem_bench_eval`).
//! Run: cargo bench -p orchestrator --bench eval_throughput [-- ITEMS CRITERIA INFLIGHT LATENCY_MS]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "benchmark code fails loudly"
)]

#[path = "common/bench_db.rs"]
mod bench_db;

mod common {
    #[path = "../../tests/common/loopback.rs"]
    pub mod loopback;

    #[path = "../../tests/common/fake_grader.rs"]
    pub mod fake_grader;
}

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fake_grader::FakeGrader;
use orchestrator::domain::bench::{Benchmark, Gold, Item, Turn, WeightedItem};
use orchestrator::infra::llm::{
    ChatMessage, ChatRequest, EndpointPool, LlmClient, RetryPolicy, Role,
};
use orchestrator::pipeline::bench::{
    self, BenchRun, GradeOptions, JudgeSpec, Responder, Templates,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn client(g: &FakeGrader, inflight: usize) -> LlmClient {
    let pool = EndpointPool::new(
        Role::Judge,
        "grader",
        &[g.url()],
        inflight,
        Duration::from_secs(30),
        1000,
    );
    let http = orchestrator::infra::llm::build_http(Duration::from_secs(5)).unwrap();
    LlmClient::new(http, Arc::new(pool), RetryPolicy::none())
}

fn items(n: usize, k: usize) -> (Vec<Item>, HashMap<String, String>) {
    let items: Vec<Item> = (0..n)
        .map(|i| Item {
            id: format!("hb-{i}"),
            row: i,
            prompt: vec![Turn::user(format!(
                "Patient question {i}: what should I do about symptom {i}?"
            ))],
            gold: Gold::Weighted {
                items: (0..k)
                    .map(|c| WeightedItem {
                        text: format!("Criterion {c} of item {i}"),
                        weight: if k > 1 && c == k - 1 {
                            -5.0
                        } else {
                            5.0 + c as f64
                        },
                        tags: vec![format!("axis:a{}", c % 3)],
                    })
                    .collect(),
            },
            tags: vec![format!("theme:t{}", i % 4)],
            language: None,
        })
        .collect();
    let answers = items
        .iter()
        .map(|i| {
            (
                i.id.clone(),
                format!("A considered answer to {} with advice and caveats.", i.id),
            )
        })
        .collect();
    (items, answers)
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let n = args.first().copied().unwrap_or(100);
    let k = args.get(1).copied().unwrap_or(10);
    let inflight = args.get(2).copied().unwrap_or(64);
    let latency = Duration::from_millis(args.get(3).copied().unwrap_or(200) as u64);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (pool, url) = bench_db::fresh("rubricem_bench_eval", 8).await;
        let g = FakeGrader::start().await;
        g.set_latency(latency);
        let calls = n * k;
        let ideal = (calls as f64 / inflight as f64).ceil() * latency.as_secs_f64();

        // Floor: the same calls through the same client and bound, nothing else.
        let c = client(&g, inflight);
        let sem = Arc::new(tokio::sync::Semaphore::new(inflight));
        let t0 = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for i in 0..calls {
            let (c, sem) = (c.clone(), sem.clone());
            set.spawn(async move {
                let _p = sem.acquire().await.unwrap();
                let req = ChatRequest {
                    model: "grader".into(),
                    messages: vec![ChatMessage::user(format!("\"criteria_met\" call {i}"))],
                    temperature: 0.0,
                    max_tokens: 64,
                    response_format: None,
                    seed: None,
                    stop: vec![],
                };
                c.chat(&req).await.unwrap();
            });
        }
        while set.join_next().await.is_some() {}
        let floor = t0.elapsed().as_secs_f64();
        let before = g.requests();
        g.state.peak_in_flight.store(0, std::sync::atomic::Ordering::SeqCst);

        let (items, answers) = items(n, k);
        let spec = BenchRun {
            name: "bench-eval".into(),
            bench: Benchmark::Healthbench,
            data_path: "synthetic".into(),
            data_sha256: "0".repeat(64),
            items,
            selection: json!({"limit": n, "seed": 0, "sampling": "first"}),
            responder: Responder::Answers(Arc::new(answers)),
            responder_desc: json!({"kind": "answers"}),
            judges: vec![JudgeSpec {
                label: "grader@loopback".into(),
                client: client(&g, inflight),
                temperature: 0.0,
                max_tokens: 64,
                usd_per_mtok_prompt: 0.0,
                usd_per_mtok_completion: 0.0,
            }],
            templates: Templates::embedded(),
            opts: GradeOptions::default(),
            gen_inflight: 16,
            judge_inflight: inflight,
            bootstrap: 1000,
            seed: 0,
            source_run_id: None,
            policy_version: None,
            progress: false,
        };
        let t0 = Instant::now();
        let s = bench::run(&pool, spec, &CancellationToken::new()).await.unwrap();
        let ours = t0.elapsed().as_secs_f64();
        let made = g.requests() - before;
        let peak = g.state.peak_in_flight.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(s.judges[0].scored, n, "every item scored");
        println!(
            "benchmark evaluation: {n} items x {k} criteria = {calls} judge calls, {} ms fake judge, {inflight} in flight",
            latency.as_millis()
        );
        println!("{:>34} {:>9} {:>9} {:>13}", "", "seconds", "items/s", "x ideal");
        println!("{:>34} {:>9.3} {:>9.1} {:>13.3}", "judge-bound ideal (reference)", ideal, n as f64 / ideal, 1.0);
        println!("{:>34} {:>9.3} {:>9.1} {:>13.3}", "bare client, same calls (floor)", floor, n as f64 / floor, floor / ideal);
        println!("{:>34} {:>9.3} {:>9.1} {:>13.3}", "bench::run (ours)", ours, n as f64 / ours, ours / ideal);
        println!(
            "judge calls per item {:.2}; peak calls in flight {peak}; overhead per item over ideal {:.1} ms, over the floor {:.1} ms",
            made as f64 / n as f64,
            (ours - ideal) / n as f64 * 1e3,
            (ours - floor) / n as f64 * 1e3
        );
        pool.close().await;
        bench_db::drop(&url).await;
    });
}
