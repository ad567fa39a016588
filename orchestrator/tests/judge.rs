//! The judge phase on real Postgres against a fake LLM judge and the lexical judge: rubric
//! generation, buffers, per-rubric judgments, stage scores and advantages, the call log with
//! tokens and cost; garbage, partial JSON, missing indices, 429s and timeouts retried; a dead
//! judge or one unscorable trajectory handled by the documented fallbacks with nothing lost;
//! re-judging without duplicates; the DR Tulu recipe's composite rewards; `orchestrator judge`.
#![allow(clippy::disallowed_methods)] // reads Postgres directly to check what the product stored
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "test code fails loudly"
)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::fake_judge::{FakeJudge, JudgeFault};
use common::fixtures::{segment, stored_trajectory};
use orchestrator::domain::config::Recipe;
use orchestrator::domain::credit::{CreditMode, Lambda, group_advantages};
use orchestrator::domain::judge::Judge;
use orchestrator::domain::judge::lexical::LexicalJudge;
use orchestrator::domain::trajectory::{SegmentKind, Stage, Trajectory};
use orchestrator::infra::db;
use orchestrator::infra::llm::judge::{LlmJudge, LlmJudgeOptions};
use orchestrator::infra::llm::{EndpointPool, LlmClient, RetryPolicy, Role};
use orchestrator::pipeline::judging::{StepOptions, judge_step};
use sqlx::PgPool;
use uuid::Uuid;

fn llm_judge(url: &str, timeout: Duration) -> LlmJudge {
    let pool = EndpointPool::new(
        Role::Judge,
        "fake-judge",
        &[url.to_string()],
        64,
        timeout,
        1000,
    );
    let client = LlmClient::new(
        orchestrator::infra::llm::build_http(Duration::from_secs(5)).unwrap(),
        Arc::new(pool),
        RetryPolicy {
            max_retries: 5,
            min_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
            jitter: false,
        },
    );
    LlmJudge::new(
        client,
        LlmJudgeOptions {
            usd_per_mtok_prompt: 2.0,
            usd_per_mtok_completion: 8.0,
            ..LlmJudgeOptions::default()
        },
    )
    .unwrap()
}

/// A scaffold trajectory whose text carries `quality` ("strong", "fair" or "weak") in every stage.
fn trajectory(run: Uuid, task: Uuid, i: i32, quality: &str, extra: &str) -> Trajectory {
    let answer = format!(
        "The {quality} finding: <cite id=\"s1\">the enzyme binds the receptor</cite> in cells."
    );
    let segments = vec![
        segment(
            SegmentKind::Model,
            Some(Stage::Plan),
            &format!(
                "<think>{quality} plan {extra}</think><structured_plan>analyse</structured_plan>"
            ),
        ),
        segment(
            SegmentKind::Model,
            Some(Stage::Research),
            &format!("<call_tool name=\"google_search\">{quality} enzyme receptor</call_tool>"),
        ),
        segment(
            SegmentKind::ToolOutput,
            None,
            "<tool_output><snippet id=s1>\nTitle: Enzyme\nSnippet: the enzyme binds the receptor in cells\n</snippet>\n</tool_output>",
        ),
        segment(
            SegmentKind::Model,
            Some(Stage::Review),
            &format!("<review>{quality} review</review>"),
        ),
        segment(
            SegmentKind::Model,
            Some(Stage::Answer),
            &format!("<answer>{answer}</answer>"),
        ),
    ];
    stored_trajectory(
        run,
        task,
        i,
        segments,
        serde_json::json!({
            "answer": answer,
            "tool_calls": [{"name": "google_search", "query": "q"}],
        }),
    )
}

struct Fixture {
    run: Uuid,
    tasks: Vec<Uuid>,
    trajectories: Vec<Trajectory>,
}

/// Two tasks with one persistent rubric each, four rollouts per task, stored as step 0.
async fn fixture(pool: &PgPool, recipe: &str, qualities: &[&str], extra: &[&str]) -> Fixture {
    let new: Vec<db::tasks::NewTask> = (0..2)
        .map(|k| db::tasks::NewTask {
            source: "fixture".into(),
            external_id: format!("t{k}"),
            prompt: format!("How does enzyme {k} act on its receptor?"),
            answer_format: "long".into(),
            persistent_rubrics: serde_json::json!([
                {"title": "mechanism", "description": "explains the enzyme receptor binding", "weight": 1.0}
            ]),
            metadata: serde_json::json!({}),
        })
        .collect();
    let tasks = db::tasks::upsert(pool, &new).await.unwrap();
    let exp = db::runs::create_experiment(pool, "exp", "smoke", &serde_json::json!({}))
        .await
        .unwrap();
    let run = db::runs::create_run(pool, exp, recipe, recipe, &serde_json::json!({}), 1)
        .await
        .unwrap();
    db::runs::begin_step(pool, run, 0, 0, &tasks).await.unwrap();
    let mut trajectories = Vec::new();
    for &t in &tasks {
        for (i, q) in qualities.iter().enumerate() {
            trajectories.push(trajectory(
                run,
                t,
                i as i32,
                q,
                extra.get(i).copied().unwrap_or(""),
            ));
        }
    }
    db::trajectories::insert_batch(pool, &trajectories)
        .await
        .unwrap();
    Fixture {
        run,
        tasks,
        trajectories,
    }
}

async fn count(pool: &PgPool, sql: &str, run: Uuid) -> i64 {
    sqlx::query_scalar(sql)
        .bind(run)
        .fetch_one(pool)
        .await
        .unwrap()
}

const JUDGMENTS: &str = "SELECT count(*) FROM judgments j JOIN trajectories t ON t.id = j.trajectory_id WHERE t.run_id = $1";
const STAGE_ROWS: &str = "SELECT count(*) FROM stage_scores s JOIN trajectories t ON t.id = s.trajectory_id WHERE t.run_id = $1";

async fn stage_scores(pool: &PgPool, traj: Uuid) -> Vec<(i16, f32, f32, f32, String)> {
    sqlx::query_as(
        "SELECT stage, score, stage_return, advantage, source FROM stage_scores
         WHERE trajectory_id = $1 ORDER BY stage",
    )
    .bind(traj)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn llm_judge_step_writes_rubrics_scores_advantages_and_costs(pool: PgPool) {
    let judge_srv = FakeJudge::start().await;
    let judge = llm_judge(&judge_srv.url(), Duration::from_secs(10));
    let fx = fixture(&pool, "full", &["strong", "fair", "weak", "strong"], &[]).await;
    let opts = StepOptions::for_recipe(Recipe::Full, Lambda::default(), false);
    let r = judge_step(&pool, &judge, &opts, fx.run, 0).await.unwrap();

    assert_eq!((r.trajectories, r.groups), (8, 2));
    assert_eq!(
        judge_srv.calls("stage_rubrics"),
        2,
        "one generation call per task"
    );
    assert_eq!(
        judge_srv.calls("rubric_scores"),
        8,
        "one scoring call per trajectory"
    );
    assert_eq!(r.new_rubrics, 16);
    assert_eq!((r.failed_calls, r.broadcast, r.failed), (0, 0, 0));
    assert_eq!(r.calls, 10);
    assert_eq!((r.prompt_tokens, r.completion_tokens), (1000, 200));
    assert!((r.cost_usd - (1000.0 * 2.0 + 200.0 * 8.0) / 1e6).abs() < 1e-12);

    // Each trajectory was scored against 1 persistent + 8 generated rubrics.
    assert_eq!(count(&pool, JUDGMENTS, fx.run).await, 8 * 9);
    assert_eq!(count(&pool, STAGE_ROWS, fx.run).await, 8 * 4);
    let persistent: i64 = count(
        &pool,
        "SELECT count(*) FROM rubric_buffers WHERE run_id = $1 AND state = 'persistent'",
        fx.run,
    )
    .await;
    assert_eq!(persistent, 2);
    let active: Vec<(i16, i64)> = sqlx::query_as(
        "SELECT stage, count(*) FROM rubric_buffers WHERE run_id = $1 AND state = 'active'
         GROUP BY stage ORDER BY stage",
    )
    .bind(fx.run)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(active, vec![(0, 4), (1, 4), (2, 4), (3, 4)]);

    // Stage scores: positive weight 2 and negative weight 1, both scored s:
    // R = (2·s/2 + (2 − s)/2) / 3; the Answer stage adds the persistent rubric (weight 1, s/2).
    let first = &fx.trajectories[0]; // "strong": s = 2
    let rows = stage_scores(&pool, first.id).await;
    assert!((rows[0].1 - 2.0 / 3.0).abs() < 1e-6);
    assert!((rows[3].1 - 3.0 / 4.0).abs() < 1e-6);
    assert!(rows.iter().all(|r| r.4 == "judged"));

    // Advantages are SS-GRPO's on the stored scores of the group.
    let group: Vec<&Trajectory> = fx
        .trajectories
        .iter()
        .filter(|t| t.task_id == fx.tasks[0])
        .collect();
    let mut scores = Vec::new();
    for t in &group {
        let rows = stage_scores(&pool, t.id).await;
        scores.push(std::array::from_fn::<f64, 4, _>(|k| f64::from(rows[k].1)));
    }
    let want = group_advantages(
        CreditMode::StageStructured {
            lambda: Lambda::default(),
        },
        &scores,
    )
    .unwrap();
    for (i, t) in group.iter().enumerate() {
        for (k, row) in stage_scores(&pool, t.id).await.iter().enumerate() {
            assert!((f64::from(row.2) - want.returns[i][k]).abs() < 1e-5);
            assert!((f64::from(row.3) - want.advantages[i][k]).abs() < 1e-4);
        }
    }
    // Justifications and the judge model are stored with every judgment.
    let (just, model, kind): (String, String, String) = sqlx::query_as(
        "SELECT justification, judge_model, judge_kind FROM judgments WHERE trajectory_id = $1 LIMIT 1",
    )
    .bind(first.id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(just.contains("saw 2"));
    assert_eq!((model.as_str(), kind.as_str()), ("fake-judge", "llm"));
    let reward_plan = db::metrics::fetch(&pool, fx.run, "reward/plan")
        .await
        .unwrap();
    assert_eq!(reward_plan.len(), 1);

    // Re-judging the step without generation upserts: no duplicate judgments or stage rows.
    let mut rescoring = opts;
    rescoring.group.generate = false;
    let r2 = judge_step(&pool, &judge, &rescoring, fx.run, 0)
        .await
        .unwrap();
    assert_eq!(r2.new_rubrics, 0);
    assert_eq!(count(&pool, JUDGMENTS, fx.run).await, 8 * 9);
    assert_eq!(count(&pool, STAGE_ROWS, fx.run).await, 8 * 4);
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn garbage_partial_json_missing_indices_429s_and_timeouts_are_retried(pool: PgPool) {
    let judge_srv = FakeJudge::start().await;
    for f in [
        JudgeFault::Garbage,
        JudgeFault::Partial,
        JudgeFault::Status(429),
        JudgeFault::MissingIndex,
        JudgeFault::Delay(Duration::from_millis(6000)),
        JudgeFault::Status(503),
    ] {
        judge_srv.push_fault(f).await;
    }
    // The timeout sits far from both sides: a normal answer on a loaded 2-core CI machine must
    // never reach it (500 ms once did, costing a 7th retry), and the delayed one always passes it.
    let judge = llm_judge(&judge_srv.url(), Duration::from_millis(3000));
    let fx = fixture(&pool, "full", &["strong", "weak"], &[]).await;
    let opts = StepOptions::for_recipe(Recipe::Full, Lambda::default(), false);
    let r = judge_step(&pool, &judge, &opts, fx.run, 0).await.unwrap();
    assert_eq!((r.failed_calls, r.failed, r.broadcast), (0, 0, 0));
    let retries: i64 = count(
        &pool,
        "SELECT sum(attempts - 1) FROM judge_calls WHERE run_id = $1",
        fx.run,
    )
    .await;
    assert_eq!(retries, 6, "each fault cost exactly one retry");
    assert_eq!(count(&pool, STAGE_ROWS, fx.run).await, 4 * 4);
    let sources: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT source FROM stage_scores s JOIN trajectories t ON t.id = s.trajectory_id WHERE t.run_id = $1")
            .bind(fx.run)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(sources, vec!["judged".to_string()]);
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn a_dead_judge_falls_back_to_zero_and_records_every_failed_call(pool: PgPool) {
    let judge_srv = FakeJudge::start().await;
    *judge_srv.state.always_status.write().unwrap() = Some(500);
    let judge = llm_judge(&judge_srv.url(), Duration::from_secs(5));
    let fx = fixture(&pool, "full", &["strong", "fair", "weak"], &[]).await;
    let opts = StepOptions::for_recipe(Recipe::Full, Lambda::default(), false);
    let r = judge_step(&pool, &judge, &opts, fx.run, 0).await.unwrap();
    assert_eq!(r.new_rubrics, 0, "a failed generation means no new rubrics");
    assert_eq!(r.failed, 6);
    assert_eq!(r.degenerate_groups, 2);
    // Per task: generate + 3 scores + 3 answer-only fallbacks, all failed after 6 attempts.
    assert_eq!(r.calls, 14);
    assert_eq!(r.failed_calls, 14);
    let (n, attempts): (i64, i64) = sqlx::query_as(
        "SELECT count(*), sum(attempts)::int8 FROM judge_calls WHERE run_id = $1 AND NOT ok AND error LIKE '%500%'",
    )
    .bind(fx.run)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((n, attempts), (14, 14 * 6));
    // Nothing lost: every trajectory has its four stage rows, R = 0 and advantage 0.
    assert_eq!(count(&pool, STAGE_ROWS, fx.run).await, 6 * 4);
    for t in &fx.trajectories {
        for row in stage_scores(&pool, t.id).await {
            assert_eq!((row.1, row.3, row.4.as_str()), (0.0, 0.0, "failed"));
        }
    }
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn an_unscorable_trajectory_gets_the_answer_score_broadcast(pool: PgPool) {
    let judge_srv = FakeJudge::start().await;
    // The marker sits in one trajectory's plan only, so its answer-only fallback succeeds.
    *judge_srv.state.fail_score_marker.write().unwrap() = Some("UNSCORABLE".into());
    let judge = llm_judge(&judge_srv.url(), Duration::from_secs(5));
    let fx = fixture(&pool, "full", &["strong", "weak"], &["UNSCORABLE", ""]).await;
    let opts = StepOptions::for_recipe(Recipe::Full, Lambda::default(), false);
    let r = judge_step(&pool, &judge, &opts, fx.run, 0).await.unwrap();
    assert_eq!((r.broadcast, r.failed), (2, 0));
    assert_eq!(judge_srv.calls("rubric_scores"), 4 + 2 * 6);
    let bad = &fx.trajectories[0];
    let rows = stage_scores(&pool, bad.id).await;
    assert!(rows.iter().all(|r| r.4 == "broadcast"));
    assert!(
        rows.iter().all(|r| r.1 == rows[3].1),
        "R4 broadcast to every stage"
    );
    assert!(rows[3].1 > 0.0);
    let fallback: bool =
        sqlx::query_scalar("SELECT bool_and(fallback) FROM judgments WHERE trajectory_id = $1")
            .bind(bad.id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(fallback);
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn lexical_judge_drtulu_recipe_writes_composite_rewards(pool: PgPool) {
    let judge = LexicalJudge::new("lexical-v1");
    let fx = fixture(&pool, "drtulu", &["strong", "weak", "fair", "weak"], &[]).await;
    let opts = StepOptions::for_recipe(Recipe::Drtulu, Lambda::default(), true);
    let r = judge_step(&pool, &judge, &opts, fx.run, 0).await.unwrap();
    assert_eq!(r.failed_calls, 0);
    type Row = (f32, f32, Option<f32>, Option<f32>, Option<f32>, f32);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT r.reward, r.rubric, r.citation, r.format, r.search, r.advantage
         FROM trajectory_rewards r JOIN trajectories t ON t.id = r.trajectory_id
         WHERE t.run_id = $1 AND r.recipe = 'drtulu'",
    )
    .bind(fx.run)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 8);
    for (reward, rubric, citation, format, search, _) in &rows {
        assert!((0.0..=1.0).contains(reward) && (0.0..=1.0).contains(rubric));
        // Every answer cites s1, which was retrieved and supports the claim.
        assert!(citation.unwrap() > 0.5, "citation {citation:?}");
        assert_eq!(*format, Some(1.0));
        assert!((search.unwrap() - 1.0 / 3.0).abs() < 1e-6);
        let want = 0.5 * f64::from(*rubric) + 0.2 * f64::from(citation.unwrap()) + 0.2 + 0.1 / 3.0;
        assert!((f64::from(*reward) - want).abs() < 1e-5);
    }
    // The lexical judge is labelled as such.
    let kinds: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT judge_kind FROM stage_scores s JOIN trajectories t ON t.id = s.trajectory_id WHERE t.run_id = $1",
    )
    .bind(fx.run)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(kinds, vec!["lexical".to_string()]);
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn judge_command_rescores_a_stored_run(pool: PgPool) {
    use clap::Parser;
    let fx = fixture(&pool, "ss-grpo", &["strong", "weak"], &[]).await;
    let db_name = pool.connect_options().get_database().unwrap().to_string();
    let mut url = url::Url::parse(&std::env::var("DATABASE_URL").unwrap()).unwrap();
    url.set_path(&format!("/{db_name}"));
    let cli = orchestrator::cli::Cli::parse_from([
        "orchestrator",
        "judge",
        "--database-url",
        url.as_str(),
        "--run",
        &fx.run.to_string(),
        "--step",
        "0",
        "--generate",
    ]);
    let code = orchestrator::commands::run(cli).await.unwrap();
    assert_eq!(code, std::process::ExitCode::SUCCESS);
    assert_eq!(count(&pool, STAGE_ROWS, fx.run).await, 4 * 4);
    let model: String = sqlx::query_scalar(
        "SELECT DISTINCT judge_model FROM stage_scores s JOIN trajectories t ON t.id = s.trajectory_id WHERE t.run_id = $1",
    )
    .bind(fx.run)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(model, "lexical-v1", "the smoke preset judges lexically");
}

#[tokio::test]
async fn lexical_scores_are_deterministic_and_invert_negatives() {
    use orchestrator::domain::judge::{Origin, Rubric, ScoreMode, TraceView};
    let judge = LexicalJudge::new("lexical-v1");
    let text = "The enzyme binds the receptor <cite id=\"zz\">x</cite>".to_string();
    let view = TraceView {
        stage_text: [String::new(), String::new(), String::new(), text.clone()],
        answer: Some(text),
        ..TraceView::default()
    };
    let r = |neg: bool, terms: &[&str]| Rubric {
        id: Uuid::now_v7(),
        stage: Stage::Answer,
        title: String::new(),
        description: "d".into(),
        weight: 1.0,
        negative: neg,
        key_terms: terms.iter().map(|s| s.to_string()).collect(),
        origin: Origin::Generated,
    };
    let rubrics = vec![
        r(false, &["enzyme", "receptor"]),
        r(false, &["kinase"]),
        r(true, &["enzyme"]),
    ];
    let a = judge
        .score("q", &view, &rubrics, ScoreMode::Stagewise)
        .await
        .unwrap();
    let b = judge
        .score("q", &view, &rubrics, ScoreMode::Stagewise)
        .await
        .unwrap();
    assert_eq!(a, b);
    // Full coverage but a fabricated citation (zz was never retrieved): one level lower.
    assert_eq!(a.scores[0].score, 1);
    assert!(a.scores[0].justification.contains("zz"));
    assert_eq!(a.scores[1].score, 0);
    // A negative rubric whose flaw is present scores 2, contributing 0 after inversion.
    assert_eq!(a.scores[2].score, 2);
    let means = orchestrator::domain::judge::score::stage_means(&rubrics, &a.scores);
    assert!((means[3].unwrap() - 0.5 / 3.0).abs() < 1e-12);
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn rubrics_init_grounds_persistent_rubrics_in_search_results(pool: PgPool) {
    use clap::Parser;
    let tmp = tempfile::tempdir().unwrap();
    let world = orchestrator::domain::data::world::generate(5, 80, 3);
    orchestrator::domain::data::world::write(&world, &tmp.path().join("world")).unwrap();
    let idx = tmp.path().join("idx");
    orchestrator::infra::tools::local_search::LocalIndex::build(&world.docs, Some(&idx)).unwrap();
    // Strip the world's own rubrics so that init has to write them.
    let tasks_path = tmp.path().join("tasks.jsonl");
    let text = std::fs::read_to_string(tmp.path().join("world/tasks.jsonl")).unwrap();
    let stripped: Vec<String> = text
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("rubrics");
            v.to_string()
        })
        .collect();
    std::fs::write(&tasks_path, stripped.join("\n")).unwrap();

    let db_name = pool.connect_options().get_database().unwrap().to_string();
    let mut url = url::Url::parse(&std::env::var("DATABASE_URL").unwrap()).unwrap();
    url.set_path(&format!("/{db_name}"));
    let args = |extra: &[&str]| {
        let mut a = vec![
            "orchestrator".to_string(),
            "rubrics".into(),
            "init".into(),
            "--database-url".into(),
            url.to_string(),
            "--tasks".into(),
            tasks_path.display().to_string(),
            "--index".into(),
            idx.display().to_string(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        orchestrator::cli::Cli::parse_from(a)
    };
    let code = orchestrator::commands::run(args(&[])).await.unwrap();
    assert_eq!(code, std::process::ExitCode::SUCCESS);
    let rows: Vec<serde_json::Value> =
        sqlx::query_scalar("SELECT persistent_rubrics FROM tasks ORDER BY external_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 3);
    for r in &rows {
        let items = r.as_array().unwrap();
        assert!(!items.is_empty(), "{r}");
        for it in items {
            // Grounded: every rubric names the snippets it came from.
            assert!(!it["evidence"].as_array().unwrap().is_empty());
            assert!(it["description"].as_str().unwrap().contains("sources"));
        }
    }
    // A second run keeps them; a rollout-style upsert of the rubric-less file does not wipe them.
    let before = rows.clone();
    orchestrator::commands::run(args(&[])).await.unwrap();
    let new = orchestrator::domain::data::tasks::load(&tasks_path).unwrap();
    let rows2: Vec<db::tasks::NewTask> = new
        .iter()
        .map(|t| db::tasks::NewTask {
            source: t.source.clone(),
            external_id: t.external_id.clone(),
            prompt: t.query.clone(),
            answer_format: "long".into(),
            persistent_rubrics: serde_json::json!([]),
            metadata: t.metadata.clone(),
        })
        .collect();
    db::tasks::upsert(&pool, &rows2).await.unwrap();
    let after: Vec<serde_json::Value> =
        sqlx::query_scalar("SELECT persistent_rubrics FROM tasks ORDER BY external_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(before, after);
    // An unknown search tool is refused by name.
    let e = orchestrator::commands::run(args(&["--tool", "bing"]))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("bing") && e.contains("google_search"), "{e}");
}

#[tokio::test]
async fn llm_ground_maps_tiers_to_weights_and_claims_to_verdicts() {
    use orchestrator::domain::judge::Claim;
    let srv = FakeJudge::start().await;
    let judge = llm_judge(&srv.url(), Duration::from_secs(5));
    let g = judge
        .ground("q", &[("s1".into(), "text".into())])
        .await
        .unwrap();
    let ans = &g.per_stage[3];
    assert_eq!(ans.len(), 2);
    assert_eq!((ans[0].weight, ans[1].weight), (3.0, 2.0));
    assert!(ans[0].description.contains("(sources: s1)"));
    assert_eq!(g.usage.prompt_tokens, 100);

    let claims = vec![
        Claim {
            text: "a".into(),
            ids: vec!["s1".into()],
        },
        Claim {
            text: "b".into(),
            ids: vec![],
        },
    ];
    let snippets = std::collections::HashMap::from([("s1".to_string(), "text".to_string())]);
    let (v, _) = judge.claims("q", &claims, &snippets).await.unwrap();
    assert_eq!(v.len(), 2);
    assert!(v.iter().all(|c| c.support == 1.0 && c.relevance == 1.0));
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn the_circuit_breaker_writes_nothing_for_a_dead_judge_and_judges_once_it_answers(
    pool: PgPool,
) {
    use orchestrator::pipeline::judging::{StepError, judge_step_guarded};
    let judge_srv = FakeJudge::start().await;
    *judge_srv.state.always_status.write().unwrap() = Some(500);
    let judge = llm_judge(&judge_srv.url(), Duration::from_secs(5));
    let fx = fixture(&pool, "full", &["strong", "fair", "weak"], &[]).await;
    let opts = StepOptions::for_recipe(Recipe::Full, Lambda::default(), false);
    let err = judge_step_guarded(&pool, &judge, &opts, fx.run, 0, 0.2)
        .await
        .unwrap_err();
    match &err {
        StepError::JudgeDown {
            failed,
            calls,
            last_error,
            ..
        } => {
            // 3 stagewise + 3 answer-only fallback scoring calls per task, all failed.
            assert_eq!((*failed, *calls), (12, 12));
            assert!(last_error.contains("500"), "{last_error}");
        }
        other => panic!("expected JudgeDown, got {other}"),
    }
    assert!(
        err.to_string().contains("12 of 12 scoring calls failed"),
        "{err}"
    );
    // Nothing of the step was written: no stage scores, rewards or buffers, and the step is
    // still unjudged, so a resumed run judges it again.
    assert_eq!(count(&pool, STAGE_ROWS, fx.run).await, 0);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM rubric_buffers WHERE run_id = $1",
            fx.run
        )
        .await,
        0
    );
    assert!(
        !db::pipeline::is_judged(&pool, fx.run, 0, judge.model())
            .await
            .unwrap()
    );
    // The judge answers again: the same step is judged and stored.
    *judge_srv.state.always_status.write().unwrap() = None;
    let r = judge_step_guarded(&pool, &judge, &opts, fx.run, 0, 0.2)
        .await
        .unwrap();
    assert_eq!(r.failed, 0);
    assert_eq!(count(&pool, STAGE_ROWS, fx.run).await, 6 * 4);
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn a_trajectory_whose_scoring_failed_is_left_out_of_its_groups_statistics(pool: PgPool) {
    let judge_srv = FakeJudge::start().await;
    // The marker is in one trajectory's answer: its stagewise call and its answer-only fallback
    // both fail, so it has no score at all.
    *judge_srv.state.fail_score_marker.write().unwrap() = Some("FAILME".into());
    let judge = llm_judge(&judge_srv.url(), Duration::from_secs(5));
    let fx = fixture(&pool, "full", &["strong", "weak", "fairFAILME"], &[]).await;
    let opts = StepOptions::for_recipe(Recipe::Full, Lambda::default(), false);
    let r = judge_step(&pool, &judge, &opts, fx.run, 0).await.unwrap();
    assert_eq!(r.failed, 2, "one per task");
    for task in 0..2 {
        let t = &fx.trajectories[task * 3..task * 3 + 3];
        let failed = stage_scores(&pool, t[2].id).await;
        assert!(failed.iter().all(|r| r.4 == "failed" && r.3 == 0.0));
        // With the failed one left out, the two scored rollouts are a group of two: their
        // advantages are exactly +1 and -1 in every stage where they differ (a zero R = 0 from
        // the failure would have shifted both).
        let (a, b) = (
            stage_scores(&pool, t[0].id).await,
            stage_scores(&pool, t[1].id).await,
        );
        for k in 0..4 {
            if (a[k].2 - b[k].2).abs() > 1e-6 {
                assert!((a[k].3 + b[k].3).abs() < 1e-4, "{a:?} {b:?}");
                assert!((a[k].3.abs() - 1.0).abs() < 1e-3, "{a:?} {b:?}");
            }
        }
    }
    // And it never reaches a train batch.
    let (batch, stats) = orchestrator::pipeline::batch::build(
        &pool,
        fx.run,
        0,
        judge.model(),
        orchestrator::domain::config::CutCredit::Whole.into(),
    )
    .await
    .unwrap();
    assert_eq!(stats.failed_scoring, 2);
    assert_eq!(batch.seqs.len(), 4);
}

#[tokio::test]
async fn a_run_does_not_start_against_a_judge_that_does_not_answer() {
    use orchestrator::domain::config::{Config, Overrides};
    use orchestrator::pipeline::setup::probe_judge;
    // A closed port: bind, read the address, drop the listener.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let cfg = |url: &str| {
        Config::load(
            "smoke",
            &Overrides {
                sets: vec![
                    "judge.kind=llm".into(),
                    format!("judge.urls=[\"{url}\"]"),
                    "judge.model=fake-judge".into(),
                    "retry.max_retries=0".into(),
                ],
                ..Default::default()
            },
        )
        .unwrap()
    };
    let err = probe_judge(&cfg(&dead)).await.unwrap_err().to_string();
    assert!(
        err.contains("the judge does not answer") && err.contains(&dead),
        "{err}"
    );
    let live = FakeJudge::start().await;
    probe_judge(&cfg(&live.url())).await.unwrap();
}

/// Chinese text is read as two-character words, not whole clauses: a Chinese report that says
/// what a Chinese rubric asks in its own words and order scores as its English counterpart does,
/// and unrelated reports score 0 in both languages. (Before, a Chinese rubric's terms were whole
/// clauses, found only in a report that copied them.)
#[tokio::test]
async fn lexical_judge_scores_chinese_reports_like_english_ones() {
    use orchestrator::domain::judge::lexical::{key_terms, terms};
    use orchestrator::domain::judge::{Origin, Rubric, ScoreMode, TraceView};
    let rubric = |title: &str, description: &str| Rubric {
        id: Uuid::now_v7(),
        stage: Stage::Answer,
        title: title.into(),
        description: description.into(),
        weight: 1.0,
        negative: false,
        key_terms: vec![],
        origin: Origin::Generated,
    };
    let zh = rubric(
        "人口老龄化对经济增长的影响",
        "指出劳动力供给减少和养老支出上升",
    );
    let en = rubric(
        "Effect of population ageing on economic growth",
        "Points to a shrinking labour supply and rising pension costs",
    );
    let keys = key_terms(&zh);
    assert!(
        keys.iter().all(|t| t.chars().count() <= 2),
        "words, not clauses: {keys:?}"
    );
    assert_eq!(terms("GPT-4模型的性能"), vec!["gpt", "模型", "性能"]);
    let judge = LexicalJudge::new("lexical-v1");
    let score = |rubric: &Rubric, report: &str| {
        let view = TraceView {
            stage_text: [
                String::new(),
                String::new(),
                String::new(),
                report.to_string(),
            ],
            answer: Some(report.to_string()),
            ..TraceView::default()
        };
        let (judge, rubric) = (judge.clone(), rubric.clone());
        async move {
            judge
                .score("q", &view, &[rubric], ScoreMode::Stagewise)
                .await
                .unwrap()
                .scores[0]
                .score
        }
    };
    let zh_on =
        "随着老龄化程度加深，劳动人口占比下降，经济增长因此放缓；这种影响在未来十年会更明显。";
    let zh_off = "今天天气晴朗，适合去公园散步，晚上可以看电影。";
    let en_on = "As ageing deepens, the working population shrinks and economic growth slows; the effect will be larger in the next decade.";
    let en_off =
        "The weather is sunny today, a good day for a walk in the park and a film tonight.";
    assert_eq!(score(&zh, zh_on).await, 2);
    assert_eq!(score(&en, en_on).await, 2);
    assert_eq!(score(&zh, zh_off).await, 0);
    assert_eq!(score(&en, en_off).await, 0);
}

/// A research-world rollout: searches, receives the snippets `docs` (none: "No results"), and
/// answers `answer`.
fn world_rollout(run: Uuid, task: Uuid, i: i32, docs: &[&str], answer: &str) -> Trajectory {
    let output = if docs.is_empty() {
        "<tool_output>\nNo results.\n</tool_output>".to_string()
    } else {
        let mut o = String::from("<tool_output>");
        for d in docs {
            o.push_str(&format!(
                "<snippet id={d}>\nTitle: {d}\nSnippet: a page of the world\n</snippet>\n"
            ));
        }
        o + "</tool_output>"
    };
    let segments = vec![
        segment(
            SegmentKind::Model,
            Some(Stage::Plan),
            "<structured_plan>find the gene, then the protein</structured_plan>",
        ),
        segment(
            SegmentKind::Model,
            Some(Stage::Research),
            "<call_tool name=\"google_search\">KASUROX5 gene</call_tool>",
        ),
        segment(SegmentKind::ToolOutput, None, &output),
        segment(
            SegmentKind::Model,
            Some(Stage::Review),
            "<review>ready</review>",
        ),
        segment(
            SegmentKind::Model,
            Some(Stage::Answer),
            &format!("<answer>{answer}</answer>"),
        ),
    ];
    stored_trajectory(
        run,
        task,
        i,
        segments,
        serde_json::json!({"answer": answer, "tool_calls": [{"name": "google_search"}]}),
    )
}

/// A run of `recipe` on `task` at step 0 holding one `world_rollout` per (retrieved, answer).
async fn run_with_rollouts(
    pool: &sqlx::PgPool,
    exp: Uuid,
    name: &str,
    recipe: &str,
    task: Uuid,
    rollouts: &[(&[&str], &str, f32, f32)],
) -> (Uuid, Vec<Trajectory>) {
    let run = db::runs::create_run(pool, exp, name, recipe, &serde_json::json!({}), 1)
        .await
        .unwrap();
    db::runs::begin_step(pool, run, 0, 0, &[task])
        .await
        .unwrap();
    let trajs: Vec<Trajectory> = rollouts
        .iter()
        .enumerate()
        .map(|(i, (docs, answer, _, _))| world_rollout(run, task, i as i32, docs, answer))
        .collect();
    db::trajectories::insert_batch(pool, &trajs).await.unwrap();
    (run, trajs)
}

/// `judge.research_evidence`: each task's buffer also holds persistent Research rubrics from its
/// evidence chain, so R2 is the share of the chain the rollout retrieved, not R4 broadcast, and
/// SS-GRPO credits a rollout that found the evidence but answered wrong above one that found
/// nothing. Off (the paper's A.4.1), the same step broadcasts R4 to Research.
#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn evidence_rubrics_give_research_its_own_score(pool: PgPool) {
    let judge = LexicalJudge::new("lexical-v1");
    let task = db::tasks::upsert(
        &pool,
        &[db::tasks::NewTask {
            source: "world".into(),
            external_id: "w17-00003".into(),
            prompt: "Which compound is bound by the protein that the KASUROX5 gene encodes?".into(),
            answer_format: "exact".into(),
            persistent_rubrics: serde_json::json!([
                {"title": "protein", "description": "Identifies Tammimor as the protein encoded by KASUROX5",
                 "weight": 1.0, "key_terms": ["Tammimor"], "evidence": ["gene-00704"]},
                {"title": "compound", "description": "States that Tammimor binds Selboveine",
                 "weight": 1.0, "key_terms": ["Selboveine"], "evidence": ["protein-00704"]}
            ]),
            metadata: serde_json::json!({}),
        }],
    )
    .await
    .unwrap()[0];
    let exp = db::runs::create_experiment(&pool, "exp", "smoke", &serde_json::json!({}))
        .await
        .unwrap();
    // (retrieved, answer, R2 with the evidence rubrics, R4)
    let rollouts: [(&[&str], &str, f32, f32); 4] = [
        (
            &["gene-00704", "protein-00704"],
            "Tammimor binds Selboveine.",
            1.0,
            1.0,
        ),
        (
            &["gene-00704", "protein-00704"],
            "It binds nothing known.",
            1.0,
            0.0,
        ),
        (
            &["gene-00704", "gene-00011"],
            "Tammimor, which binds Kobershiine.",
            0.5,
            0.5,
        ),
        (&[], "It binds nothing known.", 0.0, 0.0),
    ];
    let mut research_adv = Vec::new();
    for on in [true, false] {
        let (run, trajs) = run_with_rollouts(
            &pool,
            exp,
            &format!("ss-grpo-{on}"),
            "ss-grpo",
            task,
            &rollouts,
        )
        .await;
        let mut opts = StepOptions::for_recipe(Recipe::SsGrpo, Lambda::default(), false);
        // Only the persistent rubrics: R2 is then exactly the share of the chain retrieved.
        opts.group.generate = false;
        opts.research_evidence = on;
        let r = judge_step(&pool, &judge, &opts, run, 0).await.unwrap();
        assert_eq!(r.failed_calls, 0);
        let mut adv = Vec::new();
        for (t, (_, _, r2, r4)) in trajs.iter().zip(&rollouts) {
            let rows = stage_scores(&pool, t.id).await;
            let (research, answer) = (&rows[1], &rows[3]);
            assert_eq!((research.0, answer.0), (1, 3));
            assert!((answer.1 - r4).abs() < 1e-6, "R4 {} != {r4}", answer.1);
            let want = if on { *r2 } else { *r4 };
            assert!(
                (research.1 - want).abs() < 1e-6,
                "on={on}: R2 {} != {want}",
                research.1
            );
            adv.push(research.3);
        }
        research_adv.push(adv);
        let stored: Vec<(i16, String, Vec<String>)> = sqlx::query_as(
            "SELECT r.stage, b.state, r.key_terms FROM rubric_buffers b JOIN rubrics r ON r.id = b.rubric_id
             WHERE b.run_id = $1 AND r.stage = 1 ORDER BY r.created_at, r.id",
        )
        .bind(run)
        .fetch_all(&pool)
        .await
        .unwrap();
        if on {
            let keys: Vec<&str> = stored.iter().map(|s| s.2[0].as_str()).collect();
            assert_eq!(keys.len(), 2);
            assert!(keys.contains(&"gene-00704") && keys.contains(&"protein-00704"));
            assert!(stored.iter().all(|s| s.1 == "persistent"));
        } else {
            assert!(stored.is_empty(), "{stored:?}");
        }
    }
    // With the evidence rubrics the wrong answer that found the evidence (rollout 1) gets
    // Research credit above the rollout that found nothing (3); broadcast, the two are equal.
    let (on, off) = (&research_adv[0], &research_adv[1]);
    assert!(on[1] > on[3] + 0.1, "{on:?}");
    assert!((off[1] - off[3]).abs() < 1e-6, "{off:?}");
    // The answer-only DR Tulu recipe ignores the option: it judges no Research stage, and its
    // judge would find the ids in the answer's citations instead.
    let (run, _) = run_with_rollouts(&pool, exp, "drtulu-on", "drtulu", task, &rollouts).await;
    let mut opts = StepOptions::for_recipe(Recipe::Drtulu, Lambda::default(), false);
    opts.research_evidence = true;
    judge_step(&pool, &judge, &opts, run, 0).await.unwrap();
    let research: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM rubric_buffers b JOIN rubrics r ON r.id = b.rubric_id
         WHERE b.run_id = $1 AND r.stage = 1",
    )
    .bind(run)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(research, 0);
}
