//! Persisting one step: 256 trajectories x 16k tokens (ids + behaviour logprobs + segments)
//! through `db::trajectories::insert_batch` (binary COPY in one transaction). Reference, side by
//! side: the same segment bytes COPYed into a constraint-free temporary table, i.e. Postgres'
//! ingest floor on this machine.
//!
//! Needs DATABASE_URL (a server where it may create the database `rubricem_bench`).
//! Run: cargo bench -p orchestrator --bench persist_step [-- TRAJECTORIES TOKENS REPEATS]
#![allow(clippy::disallowed_methods)] // reads Postgres directly to check what the product stored
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "test and benchmark code fails loudly"
)]

#[path = "common/bench_db.rs"]
mod bench_db;

use std::time::{Duration, Instant};

use orchestrator::domain::trajectory::{Segment, SegmentKind, Stage, Trajectory};
use orchestrator::infra::db;
use uuid::Uuid;

fn trajectory(run_id: Uuid, step: i32, task_id: Uuid, sample: i32, tokens: usize) -> Trajectory {
    // 10 tool calls: 11 model segments and 10 tool outputs; tool outputs take ~30% of tokens.
    let model_seg = tokens * 7 / 10 / 11;
    let tool_seg = tokens * 3 / 10 / 10;
    let mut segments = Vec::new();
    let mut next = 1000u32 + sample as u32;
    for k in 0..21 {
        let is_tool = k % 2 == 1;
        let len = if is_tool { tool_seg } else { model_seg };
        let ids: Vec<u32> = (0..len)
            .map(|i| {
                next = next
                    .wrapping_mul(1_103_515_245)
                    .wrapping_add(12345 + i as u32)
                    % 151_000;
                next
            })
            .collect();
        let stage = match k {
            0 => Some(Stage::Plan),
            20 => Some(Stage::Answer),
            18 => Some(Stage::Review),
            _ => Some(Stage::Research),
        };
        segments.push(Segment {
            kind: if is_tool {
                SegmentKind::ToolOutput
            } else {
                SegmentKind::Model
            },
            stage: if is_tool { None } else { stage },
            logprobs: (!is_tool)
                .then(|| ids.iter().map(|i| -((*i % 1000) as f32) / 250.0).collect()),
            text: "x".repeat(len * 4),
            token_ids: ids,
            policy_version: (!is_tool).then_some(step),
        });
    }
    Trajectory {
        id: Uuid::now_v7(),
        run_id,
        step,
        task_id,
        sample_index: sample,
        policy_version: step,
        server: "http://127.0.0.1:8000".into(),
        server_version: Some("bench".into()),
        prompt_token_ids: (0..1024).collect(),
        segments,
        finish_reason: "stop".into(),
        parsed: serde_json::json!({"citations": [{"id": "a", "known": true}]}),
        timings: serde_json::json!({"rollout_ms": 1}),
    }
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (n, tokens, repeats) = (
        args.first().copied().unwrap_or(256),
        args.get(1).copied().unwrap_or(16_384),
        args.get(2).copied().unwrap_or(3),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (pool, url) = bench_db::fresh("rubricem_bench", 4).await;
        let exp = db::runs::create_experiment(&pool, "bench", "smoke", &serde_json::json!({})).await.unwrap();
        let run_id = db::runs::create_run(&pool, exp, "bench", "full", &serde_json::json!({}), 0).await.unwrap();
        let tasks: Vec<db::tasks::NewTask> = (0..n / 8 + 1).map(|i| db::tasks::NewTask {
            source: "bench".into(), external_id: i.to_string(), prompt: format!("q{i}"),
            answer_format: "long".into(), persistent_rubrics: serde_json::json!([]), metadata: serde_json::json!({}),
        }).collect();
        let task_ids = db::tasks::upsert(&pool, &tasks).await.unwrap();
        let mut ours = Vec::new();
        let mut floor = Vec::new();
        let mut total_tokens = 0;
        for step in 0..repeats as i32 {
            db::runs::begin_step(&pool, run_id, step, step, &task_ids).await.unwrap();
            let batch: Vec<Trajectory> = (0..n).map(|i| trajectory(run_id, step, task_ids[i / 8], (i % 8) as i32 + 8 * (i / 8 / task_ids.len()) as i32, tokens)).collect();
            total_tokens = batch.iter().map(|t| t.segments.iter().map(|s| s.token_ids.len()).sum::<usize>()).sum::<usize>();
            let t0 = Instant::now();
            db::trajectories::insert_batch(&pool, &batch).await.unwrap();
            ours.push(t0.elapsed());

            // Reference: the same segment rows into a constraint-free temp table.
            let mut w = db::CopyWriter::new();
            for t in &batch {
                for (k, s) in t.segments.iter().enumerate() {
                    w.row(8); w.uuid(t.id); w.i32(k as i32); w.text(s.kind.as_str());
                    w.opt_i16(s.stage.map(|x| x as i16)); w.int4_array(&s.token_ids);
                    w.opt_float4_array(s.logprobs.as_deref()); w.text(&s.text); w.opt_i32(s.policy_version);
                }
            }
            let bytes = w.finish();
            let mut conn = pool.acquire().await.unwrap();
            sqlx::query("CREATE TEMP TABLE IF NOT EXISTS seg_ref (trajectory_id uuid, ordinal int, kind text, stage int2, token_ids int4[], logprobs real[], text text, policy_version int)").execute(&mut *conn).await.unwrap();
            sqlx::query("TRUNCATE seg_ref").execute(&mut *conn).await.unwrap();
            let t0 = Instant::now();
            let mut copy = conn.copy_in_raw("COPY seg_ref FROM STDIN (FORMAT binary)").await.unwrap();
            for chunk in bytes.chunks(8 << 20) { copy.send(chunk).await.unwrap(); }
            copy.finish().await.unwrap();
            floor.push(t0.elapsed());
            drop(conn);
        }
        ours.sort(); floor.sort();
        let med = |v: &[Duration]| v[v.len() / 2].as_secs_f64();
        println!("persist one step: {n} trajectories x {tokens} tokens ({total_tokens} ids + logprobs for model tokens), {repeats} repeats, median");
        println!("{:>22} {:>10} {:>12}", "", "seconds", "M tokens/s");
        println!("{:>22} {:>10.3} {:>12.2}", "insert_batch (ours)", med(&ours), total_tokens as f64 / med(&ours) / 1e6);
        println!("{:>22} {:>10.3} {:>12.2}", "raw COPY floor (ref)", med(&floor), total_tokens as f64 / med(&floor) / 1e6);
        println!("ratio ours / floor: {:.2}", med(&ours) / med(&floor));
        pool.close().await;
        bench_db::drop(&url).await;
    });
}
