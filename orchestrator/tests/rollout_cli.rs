//! `orchestrator rollout` end to end: a task file from the research world, a local BM25 index, a
//! real tokenizer directory (byte-level, with ids that match the fake server's), the scripted
//! fake policy server, and Postgres; checks the summary and what was stored.
#![allow(clippy::disallowed_methods)] // reads Postgres directly to check what the product stored
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use common::fake_openai::{FakeServer, Scripted, toy_tokenize};
use common::fixtures::{rollout_args, write_byte_tokenizer};
use orchestrator::cli::RolloutArgs;

fn scripted(text: &str) -> Scripted {
    Scripted::reply(text, "stop")
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn rollout_command_stores_and_summarises(pool: sqlx::PgPool) {
    let tmp = tempfile::tempdir().unwrap();
    let tok_dir = tmp.path().join("model");
    write_byte_tokenizer(&tok_dir);
    let tok = orchestrator::infra::chat::ModelTokenizer::from_dir(&tok_dir).unwrap();
    assert_eq!(
        tok.encode("Hé").unwrap(),
        toy_tokenize("Hé"),
        "ids match the fake server's"
    );

    let world = orchestrator::domain::data::world::generate(9, 60, 2);
    orchestrator::domain::data::world::write(&world, &tmp.path().join("world")).unwrap();
    let idx_dir = tmp.path().join("idx");
    orchestrator::infra::tools::local_search::LocalIndex::build(&world.docs, Some(&idx_dir))
        .unwrap();

    let server = FakeServer::start().await;
    let n = 2;
    // The start-up feature detection sends one completion first.
    server.push_scripted(scripted("probe")).await;
    for _ in 0..(n * world.tasks.len()) {
        server.push_scripted(scripted("<think>plan</think><structured_plan><deep_analysis>a</deep_analysis><rubric>- fact</rubric><research_plan>search</research_plan></structured_plan><call_tool name=\"google_search\">gene protein</call_tool>")).await;
        server.push_scripted(scripted("<think>ok</think><state_evaluation>enough</state_evaluation><review><rubric_review>r</rubric_review><writing_plan>w</writing_plan></review><answer>\\boxed{x}</answer>")).await;
    }

    let db_name = pool.connect_options().get_database().unwrap().to_string();
    let mut url = url::Url::parse(&std::env::var("DATABASE_URL").unwrap()).unwrap();
    url.set_path(&format!("/{db_name}"));
    let args = rollout_args(
        url.as_str(),
        server.url(),
        &tmp.path().join("world/tasks.jsonl"),
        &tok_dir,
        &idx_dir,
        n as u32,
    );
    let summary = orchestrator::commands::rollout(&args).await.unwrap();
    assert_eq!(summary.trajectories, 4);
    assert_eq!(
        summary.finish_reasons.get("answer"),
        Some(&4),
        "{summary:?}"
    );
    assert_eq!(
        summary
            .tool_calls
            .get(&("research".to_string(), "google_search".to_string())),
        Some(&4)
    );
    assert_eq!(summary.parse_failures, 0);
    assert!(summary.render().contains("answer=4"));

    let n_traj: i64 = sqlx::query_scalar("SELECT count(*) FROM trajectories")
        .fetch_one(&pool)
        .await
        .unwrap();
    let n_calls: i64 = sqlx::query_scalar("SELECT count(*) FROM tool_calls")
        .fetch_one(&pool)
        .await
        .unwrap();
    let cached: i64 = sqlx::query_scalar("SELECT count(*) FROM tool_calls WHERE cached")
        .fetch_one(&pool)
        .await
        .unwrap();
    let status: String = sqlx::query_scalar("SELECT status FROM runs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!((n_traj, n_calls, status.as_str()), (4, 4, "completed"));
    assert_eq!(
        cached, 3,
        "the same query repeats: every call after the first is a cache hit"
    );
    // The prompt carries the RubricEM system prompt through the chat template.
    let prompt: Vec<i32> = sqlx::query_scalar("SELECT prompt_token_ids FROM trajectories LIMIT 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    let text = tok
        .decode(&prompt.iter().map(|x| *x as u32).collect::<Vec<_>>())
        .unwrap();
    assert!(
        text.starts_with("<|im_start|>system\n")
            && text.contains("<structured_plan>")
            && text.ends_with("<|im_start|>assistant\n"),
        "{text}"
    );

    // Inference-time reuse: the first run's bank (one item per task) is injected before each
    // question of a second rollout as the within-episode `<reference_examples>` block.
    let first_run: uuid::Uuid = sqlx::query_scalar("SELECT id FROM runs")
        .fetch_one(&pool)
        .await
        .unwrap();
    let ids: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT id FROM tasks ORDER BY prompt")
        .fetch_all(&pool)
        .await
        .unwrap();
    let prompts: Vec<String> = sqlx::query_scalar("SELECT prompt FROM tasks ORDER BY prompt")
        .fetch_all(&pool)
        .await
        .unwrap();
    let emb = orchestrator::domain::bank::LocalEmbedder::default();
    for (id, q) in ids.iter().zip(&prompts) {
        orchestrator::infra::db::bank::upsert(
            &pool,
            first_run,
            &orchestrator::domain::bank::BankItem {
                task_id: *id,
                question: q.clone(),
                question_sha256: orchestrator::domain::bank::question_hash(q),
                embedding: emb.embed_one(q),
                rubrics: format!("RUBRICS-FOR {q}"),
                takeaways: "check twice".into(),
                score: 0.8,
                step: 0,
                reflection_id: None,
            },
        )
        .await
        .unwrap();
    }
    let mut again = args.clone();
    let err = orchestrator::commands::rollout(&RolloutArgs {
        reuse: orchestrator::domain::bank::Reuse::Within,
        ..args.clone()
    })
    .await
    .unwrap_err();
    assert!(err.to_string().contains("--bank-run"), "{err}");
    again.reuse = orchestrator::domain::bank::Reuse::Within;
    again.bank_run = Some(first_run);
    server.push_scripted(scripted("probe")).await;
    for _ in 0..(n * world.tasks.len()) {
        server.push_scripted(scripted("<think>plan</think><structured_plan><deep_analysis>a</deep_analysis><rubric>- fact</rubric><research_plan>search</research_plan></structured_plan><call_tool name=\"google_search\">gene protein</call_tool>")).await;
        server.push_scripted(scripted("<think>ok</think><state_evaluation>enough</state_evaluation><review><rubric_review>r</rubric_review><writing_plan>w</writing_plan></review><answer>\\boxed{x}</answer>")).await;
    }
    orchestrator::commands::rollout(&again).await.unwrap();
    let rows: Vec<(Vec<i32>, uuid::Uuid)> = sqlx::query_as(
        "SELECT t.prompt_token_ids, t.task_id FROM trajectories t WHERE t.run_id <> $1",
    )
    .bind(first_run)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 4);
    for (ids_, task) in rows {
        let text = tok
            .decode(&ids_.iter().map(|x| *x as u32).collect::<Vec<_>>())
            .unwrap();
        let q = &prompts[ids.iter().position(|i| *i == task).unwrap()];
        let block = text.find("<reference_examples>").expect("block injected");
        assert!(
            text.contains(&format!("### Rubrics:\nRUBRICS-FOR {q}\n")),
            "{text}"
        );
        assert!(
            block < text.find(q.as_str()).unwrap(),
            "block precedes the question"
        );
    }
}
