//! The reflection meta-policy and rubric bank against real Postgres, the loopback policy fake
//! (which writes reflection candidates) and both judges: candidate validity and utilities,
//! group advantages, the best valid candidate in the bank, judge-call accounting, the bank
//! reloaded from Postgres equal to the one in memory (resume), hash and cosine retrieval that
//! excludes the task itself, the deferred-batch assignment, and a failed job recorded.
#![allow(clippy::disallowed_methods)] // reads Postgres directly to check what the product stored
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::fake_judge::FakeJudge;
use common::fake_openai::{FakeServer, Fault, ToyCodec};
use common::fixtures::segment;
use orchestrator::domain::bank::{LocalEmbedder, Retrieved, Reuse};
use orchestrator::domain::config::Recipe;
use orchestrator::domain::credit::Lambda;
use orchestrator::domain::judge::Judge;
use orchestrator::domain::judge::lexical::LexicalJudge;
use orchestrator::domain::trajectory::{SegmentKind, Stage, Trajectory};
use orchestrator::infra::db;
use orchestrator::infra::llm::judge::{LlmJudge, LlmJudgeOptions};
use orchestrator::infra::llm::{EndpointPool, LlmClient, RetryPolicy, Role};
use orchestrator::pipeline::bank::{Bank, Embedder};
use orchestrator::pipeline::judging::{StepOptions, judge_step};
use orchestrator::pipeline::reflection::{Reflector, Settings};
use sqlx::PgPool;
use uuid::Uuid;

/// Invalid, and with a NUL byte (model output can hold one; PostgreSQL text cannot).
const INVALID: &str = "I would answer differently:\0 the enzyme is X.";
const SPECIFIC: &str = "<reflection_rubrics>\nCritical Requirement: name the mechanism by which the enzyme acts on its receptor.\nAnalytical Approach: search the enzyme and the receptor separately, then confirm the binding in a second source.\nCommunication & Structure: cite the snippet that states the mechanism.\nPitfalls: stopping after one search.\n</reflection_rubrics>\n<reflection_takeaways>\n- verify a mechanism claim in two sources\n- cite the sentence that states it\n</reflection_takeaways>";
const GENERIC: &str = "<reflection_rubrics>\nBe thorough.\n</reflection_rubrics>\n<reflection_takeaways>\n- be careful\n- be careful\n- be careful\n- be careful\n- be careful\n</reflection_takeaways>";

fn client(url: &str, role: Role, model: &str) -> LlmClient {
    let pool = EndpointPool::new(
        role,
        model,
        &[url.to_string()],
        64,
        Duration::from_secs(5),
        100,
    );
    LlmClient::new(
        orchestrator::infra::llm::build_http(Duration::from_secs(2)).unwrap(),
        Arc::new(pool),
        RetryPolicy::none(),
    )
}

/// A stored, judged step 0: two tasks x three trajectories of differing quality.
async fn judged_step(pool: &PgPool) -> (Uuid, Vec<Uuid>, Vec<String>) {
    let questions: Vec<String> = (0..2)
        .map(|k| format!("How does enzyme {k} act on its receptor in liver cells?"))
        .collect();
    let new: Vec<db::tasks::NewTask> = questions
        .iter()
        .enumerate()
        .map(|(k, q)| db::tasks::NewTask {
            source: "fixture".into(),
            external_id: format!("r{k}"),
            prompt: q.clone(),
            answer_format: "long".into(),
            persistent_rubrics: serde_json::json!([
                {"title": "mechanism", "description": "explains the enzyme receptor binding mechanism", "weight": 1.0}
            ]),
            metadata: serde_json::json!({}),
        })
        .collect();
    let tasks = db::tasks::upsert(pool, &new).await.unwrap();
    let exp = db::runs::create_experiment(pool, "exp", "smoke", &serde_json::json!({}))
        .await
        .unwrap();
    let run = db::runs::create_run(pool, exp, "full", "full", &serde_json::json!({}), 1)
        .await
        .unwrap();
    db::runs::begin_step(pool, run, 0, 0, &tasks).await.unwrap();
    let mut trajs = Vec::new();
    for &t in &tasks {
        for (i, q) in ["strong", "fair", "weak"].iter().enumerate() {
            let answer = format!("The {q} answer: <cite id=\"s1\">the enzyme binds</cite>.");
            trajs.push(Trajectory {
                id: Uuid::now_v7(),
                run_id: run,
                step: 0,
                task_id: t,
                sample_index: i as i32,
                policy_version: 0,
                server: "fake".into(),
                server_version: None,
                prompt_token_ids: vec![11, 12, 13],
                segments: vec![
                    segment(SegmentKind::Model, Some(Stage::Plan), &format!("<think>{q} plan</think>")),
                    segment(
                        SegmentKind::Model,
                        Some(Stage::Research),
                        "<call_tool name=\"google_search\">enzyme receptor</call_tool>",
                    ),
                    segment(
                        SegmentKind::ToolOutput,
                        None,
                        "<tool_output><snippet id=s1>\nTitle: E\nSnippet: the enzyme binds the receptor\n</snippet>\n</tool_output>",
                    ),
                    segment(SegmentKind::Model, Some(Stage::Review), "<review>ok</review>"),
                    segment(
                        SegmentKind::Model,
                        Some(Stage::Answer),
                        &format!("<answer>{answer}</answer>"),
                    ),
                ],
                finish_reason: "answer".into(),
                parsed: serde_json::json!({"answer": answer, "tool_calls": [{"name": "google_search"}]}),
                timings: serde_json::json!({}),
            });
        }
    }
    db::trajectories::insert_batch(pool, &trajs).await.unwrap();
    (run, tasks, questions)
}

async fn reflector(pool: &PgPool, run: Uuid, policy_url: &str, judge: Arc<dyn Judge>) -> Reflector {
    let bank = Bank::load(
        pool.clone(),
        run,
        Embedder::Local(LocalEmbedder::default()),
        2,
    )
    .await
    .unwrap();
    Reflector {
        pool: pool.clone(),
        run_id: run,
        seed: 3,
        client: client(policy_url, Role::Policy, "policy"),
        codec: Arc::new(ToyCodec),
        judge,
        bank: Arc::new(bank),
        settings: Settings {
            candidates: 3,
            temperature: 0.7,
            top_p: 1.0,
            max_tokens: 2048,
            accept_threshold: 0.0,
            max_trajectory_chars: 4000,
        },
    }
}

async fn count(pool: &PgPool, sql: &str, run: Uuid) -> i64 {
    sqlx::query_scalar(sql)
        .bind(run)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn job_grades_candidates_banks_the_best_and_the_bank_reloads_identically(pool: PgPool) {
    let (run, tasks, questions) = judged_step(&pool).await;
    let judge: Arc<dyn Judge> = Arc::new(LexicalJudge::new("lexical-v1"));
    let opts = StepOptions::for_recipe(Recipe::Full, Lambda::default(), false);
    judge_step(&pool, judge.as_ref(), &opts, run, 0)
        .await
        .unwrap();

    let policy = FakeServer::start().await;
    *policy.state.reflection_replies.write().unwrap() =
        vec![INVALID.into(), SPECIFIC.into(), GENERIC.into()];
    policy.record_bodies();
    let r = reflector(&pool, run, &policy.url(), judge.clone()).await;
    let rep = r.run_job(0, 1).await.unwrap();
    assert_eq!(
        (rep.tasks, rep.candidates, rep.valid, rep.bank_writes),
        (2, 6, 4, 2)
    );

    // One request per task: n = m candidates at the configured temperature, stopping after
    // the takeaways block.
    let bodies = policy.state.last_bodies.lock().await.clone();
    assert_eq!(bodies.len(), 2);
    assert_eq!(bodies[0]["n"], 3);
    assert!((bodies[0]["temperature"].as_f64().unwrap() - 0.7).abs() < 1e-6);
    assert_eq!(bodies[0]["stop"][0], "</reflection_takeaways>");

    let rows = db::bank::for_step(&pool, run, 0).await.unwrap();
    assert_eq!(rows.len(), 6);
    for task in &tasks {
        let g: Vec<_> = rows.iter().filter(|x| x.task_id == *task).collect();
        assert_eq!(g.len(), 3);
        // Candidate 0 is invalid: utility 0, lowest advantage; advantages sum to 0.
        assert!(!g[0].valid && g[0].score == Some(0.0));
        assert!(g[0].text.contains('\u{FFFD}') && !g[0].text.contains('\0'));
        assert!(g[1].valid && g[2].valid);
        assert!(
            g[1].score.unwrap() > g[2].score.unwrap(),
            "specific {} vs generic {}",
            g[1].score.unwrap(),
            g[2].score.unwrap()
        );
        let adv: f32 = g.iter().map(|x| x.advantage.unwrap()).sum();
        assert!(adv.abs() < 1e-4, "{adv}");
        assert!(g[0].advantage.unwrap() < g[2].advantage.unwrap());
        assert_eq!(g[0].policy_version, 1);
        assert_eq!(g[1].token_ids.len(), g[1].logprobs.len());
        assert!(!g[1].prompt_token_ids.is_empty());
        assert_eq!(
            g[1].utility["u"].as_f64().unwrap() as f32,
            g[1].score.unwrap()
        );
    }
    // The best valid candidate is the bank item, keyed by the question's SHA-256.
    let items = db::bank::load(&pool, run).await.unwrap();
    assert_eq!(items.len(), 2);
    for it in &items {
        let best = rows
            .iter()
            .filter(|x| x.task_id == it.task_id)
            .max_by(|a, b| a.score.partial_cmp(&b.score).unwrap())
            .unwrap();
        assert_eq!(it.reflection_id, Some(best.id));
        assert!(
            it.rubrics
                .starts_with("Critical Requirement: name the mechanism")
        );
        assert!(it.takeaways.contains("two sources"));
        assert_eq!(
            it.question_sha256,
            orchestrator::domain::bank::question_hash(&it.question)
        );
    }
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM judge_calls WHERE run_id = $1 AND kind = 'reflect'",
            run
        )
        .await,
        2
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM reflection_jobs WHERE run_id = $1 AND status = 'done'",
            run
        )
        .await,
        1
    );

    // A resumed process loads the same bank from Postgres and retrieves the same things.
    let reloaded = reflector(&pool, run, &policy.url(), judge.clone())
        .await
        .bank;
    assert_eq!(reloaded.len(), r.bank.len());
    for (k, q) in questions.iter().enumerate() {
        let a = r.bank.retrieve(tasks[k], q, Reuse::Within).await.unwrap();
        let b = reloaded.retrieve(tasks[k], q, Reuse::Within).await.unwrap();
        assert_eq!(a, b);
        let Retrieved::Within(it) = a else {
            panic!("within-episode lookup by hash missed: {a:?}")
        };
        assert_eq!(it.task_id, tasks[k]);
        // Cross-episode retrieval never returns the question's own item.
        let c = reloaded.retrieve(tasks[k], q, Reuse::Cross).await.unwrap();
        let Retrieved::Cross(v) = &c else {
            panic!("{c:?}")
        };
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].0.task_id, tasks[1 - k]);
        assert!(c.inject("Q").unwrap().contains("## Similar Question 1:"));
        assert_eq!(
            reloaded.retrieve(tasks[k], q, Reuse::None).await.unwrap(),
            Retrieved::Nothing
        );
    }

    // The deferred batch: every candidate goes to the next step exactly once.
    assert_eq!(
        db::bank::assign_for_training(&pool, run, 1).await.unwrap(),
        6
    );
    assert_eq!(
        db::bank::assign_for_training(&pool, run, 2).await.unwrap(),
        0
    );
    let assigned = db::bank::for_training(&pool, run, 1).await.unwrap();
    assert_eq!(assigned.len(), 6);
    let seqs = orchestrator::pipeline::reflection::sequences(&assigned, 0);
    assert_eq!(seqs.len(), 6);
    assert!(seqs.iter().all(|s| s.phase == wire::Phase::Reflection));
    assert!(
        db::bank::for_training(&pool, run, 2)
            .await
            .unwrap()
            .is_empty()
    );
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn llm_judge_grades_reflections_and_a_failed_job_is_recorded(pool: PgPool) {
    let (run, tasks, questions) = judged_step(&pool).await;
    let lexical = LexicalJudge::new("lexical-v1");
    let opts = StepOptions::for_recipe(Recipe::Full, Lambda::default(), false);
    judge_step(&pool, &lexical, &opts, run, 0).await.unwrap();
    // The LLM judge grades (its own judgments are absent, so it sees no findings here).
    let fj = FakeJudge::start().await;
    let llm: Arc<dyn Judge> = Arc::new(
        LlmJudge::new(
            client(&fj.url(), Role::Judge, "fake-judge"),
            LlmJudgeOptions::default(),
        )
        .unwrap(),
    );
    let policy = FakeServer::start().await;
    *policy.state.reflection_replies.write().unwrap() = vec![GENERIC.into(), SPECIFIC.into()];
    let mut r = reflector(&pool, run, &policy.url(), llm).await;
    r.settings.candidates = 2;
    let rep = r.run_job(0, 0).await.unwrap();
    assert_eq!((rep.candidates, rep.valid, rep.bank_writes), (4, 4, 2));
    assert_eq!(fj.calls("reflection_grades"), 2);
    let rows = db::bank::for_step(&pool, run, 0).await.unwrap();
    for g in rows.chunks(2) {
        // The fake grades the reflection naming the mechanism higher: u = (0.4 .9 + .3 .5)/.7.
        let want = (0.4 * 0.9 + 0.3 * 0.5) / 0.7;
        assert!((f64::from(g[1].score.unwrap()) - want).abs() < 1e-5);
        assert!(g[1].score > g[0].score);
        assert_eq!(g[1].judge_kind.as_deref(), Some("llm"));
    }

    // A job whose policy server fails: the error comes back, nothing is half-written, and the
    // failure is recorded; within-episode lookups of its questions fall back to cross-episode.
    let (run2, tasks2, questions2) = (run, tasks.clone(), questions.clone());
    sqlx::query("DELETE FROM rubric_bank WHERE run_id = $1 AND task_id = $2")
        .bind(run2)
        .bind(tasks2[0])
        .execute(&pool)
        .await
        .unwrap();
    policy.push_fault(Fault::Status(500)).await;
    policy.push_fault(Fault::Status(500)).await;
    let r2 = reflector(&pool, run2, &policy.url(), Arc::new(lexical)).await;
    assert_eq!(r2.bank.len(), 1);
    let before = db::bank::for_step(&pool, run2, 0).await.unwrap();
    let err = r2.run_job(0, 1).await.unwrap_err();
    assert!(err.to_string().contains("policy server"), "{err}");
    db::bank::fail_job(&pool, run2, 0, &err.to_string())
        .await
        .unwrap();
    assert_eq!(
        db::bank::job_status(&pool, run2, 0)
            .await
            .unwrap()
            .as_deref(),
        Some("failed")
    );
    assert_eq!(db::bank::for_step(&pool, run2, 0).await.unwrap(), before);
    let got = r2
        .bank
        .retrieve(tasks2[0], &questions2[0], Reuse::Within)
        .await
        .unwrap();
    assert_eq!(got.mode(), Reuse::Cross);
}
