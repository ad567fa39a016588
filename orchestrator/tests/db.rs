//! The Postgres store on real Postgres: migrations verified, trajectories round-tripped through
//! binary COPY, bulk upserts, and the analysis queries of scripts/sql on fixture rows.
//! Each test gets a fresh database from `#[sqlx::test]` (needs DATABASE_URL).
#![allow(clippy::disallowed_methods)] // reads Postgres directly to check what the product stored
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "test and benchmark code fails loudly"
)]

mod common;

use orchestrator::domain::trajectory::{Segment, SegmentKind, Stage, Trajectory};
use orchestrator::infra::db::lease::{LeaseError, RunLease, acquire};
use orchestrator::infra::db::{self, DbError, MIGRATOR};
use sqlx::{PgPool, Row};
use uuid::Uuid;

/// `scripts/NAME` of the repository.
fn script(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts")
        .join(name)
}

/// An evaluation result of `task_id`'s sample with the given score and exact match (a stopped
/// answer, one tool call, no rubric items); callers set other fields with `..`.
fn result_row(
    task_id: Uuid,
    sample_index: i32,
    score: Option<f64>,
    exact: Option<bool>,
) -> db::evaluations::ResultRow {
    db::evaluations::ResultRow {
        task_id,
        sample_index,
        finish_reason: "stop".into(),
        answer: None,
        parsed: serde_json::json!({}),
        num_model_tokens: 10,
        tool_calls: 1,
        parse_failed: false,
        score,
        rubric_scores: serde_json::json!([]),
        exact,
        error: None,
    }
}

/// An evaluation summary of `run_id` at `version` on `subset` with the given counts.
fn eval_row(
    run_id: Uuid,
    version: i32,
    subset: &str,
    (tasks, samples, judged, failed): (i32, i32, i32, i32),
) -> db::evaluations::EvalRow {
    db::evaluations::EvalRow {
        run_id,
        policy_version: version,
        subset: subset.into(),
        judge_model: "lexical-v1".into(),
        tasks,
        samples,
        score: None,
        exact: None,
        judged,
        failed,
        parse_failures: 0,
        model_tokens: 10 * i64::from(tasks * samples),
        judge_cost_usd: 0.0,
        seconds: 1.0,
    }
}

/// Runs a script with `args`, asserting it succeeds; its standard output.
fn run_ok(script: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a script that must refuse its arguments, and checks that its message says `message`.
fn assert_refused(script: &std::path::Path, args: &[&str], message: &str) {
    let out = std::process::Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted {args:?}: {stderr}");
    assert!(stderr.contains(message), "{message:?} not in: {stderr}");
}

fn sql_file(name: &str) -> String {
    let path = script("sql").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The rows of one of the README's queries (`scripts/sql/<name>`) on the test database.
async fn sql_rows(pool: &PgPool, name: &str) -> Vec<sqlx::postgres::PgRow> {
    sqlx::query(&sql_file(name))
        .fetch_all(pool)
        .await
        .unwrap_or_else(|e| panic!("scripts/sql/{name}: {e}"))
}

async fn task(pool: &PgPool, ext: &str) -> Uuid {
    task_with(pool, ext, serde_json::json!({})).await
}

async fn task_with(pool: &PgPool, ext: &str, metadata: serde_json::Value) -> Uuid {
    let t = db::tasks::NewTask {
        source: "fixture".into(),
        external_id: ext.into(),
        prompt: format!("question {ext}"),
        answer_format: "long".into(),
        persistent_rubrics: serde_json::json!([]),
        metadata,
    };
    db::tasks::upsert(pool, &[t]).await.unwrap()[0]
}

async fn run(pool: &PgPool, name: &str) -> Uuid {
    let exp = db::runs::create_experiment(pool, "exp", "smoke", &serde_json::json!({}))
        .await
        .unwrap();
    db::runs::create_run(pool, exp, name, "full", &serde_json::json!({}), 1)
        .await
        .unwrap()
}

fn seg(kind: SegmentKind, stage: Option<Stage>, ids: Vec<u32>) -> Segment {
    let logprobs =
        (kind == SegmentKind::Model).then(|| ids.iter().map(|i| -(*i as f32) / 1000.0).collect());
    Segment {
        kind,
        stage,
        text: format!("{} tokens", ids.len()),
        token_ids: ids,
        logprobs,
        policy_version: (kind == SegmentKind::Model).then_some(3),
    }
}

fn traj(
    run_id: Uuid,
    step: i32,
    task_id: Uuid,
    sample: i32,
    answer_tokens: usize,
    citations: serde_json::Value,
) -> Trajectory {
    Trajectory {
        id: Uuid::now_v7(),
        run_id,
        step,
        task_id,
        sample_index: sample,
        policy_version: 3,
        server: "http://127.0.0.1:8000".into(),
        server_version: Some("0.33.0".into()),
        prompt_token_ids: vec![1, 2, 3],
        segments: vec![
            seg(SegmentKind::Model, Some(Stage::Plan), vec![10, 11]),
            seg(SegmentKind::Model, Some(Stage::Research), vec![12]),
            seg(SegmentKind::ToolOutput, None, vec![13, 14, 15]),
            seg(SegmentKind::Model, Some(Stage::Review), vec![16]),
            seg(
                SegmentKind::Model,
                Some(Stage::Answer),
                (0..answer_tokens as u32).map(|i| 100 + i).collect(),
            ),
        ],
        finish_reason: "stop".into(),
        parsed: serde_json::json!({ "citations": citations }),
        timings: serde_json::json!({"rollout_ms": 12}),
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn applied_migrations_match_the_binary(pool: PgPool) {
    db::check_migrations(&pool, "postgres://u:pw@h/db")
        .await
        .unwrap();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM stages")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 4);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn migration_drift_is_detected(pool: PgPool) {
    let v = MIGRATOR.iter().next().unwrap().version;
    sqlx::query("UPDATE _sqlx_migrations SET checksum = '\\x00'::bytea WHERE version = $1")
        .bind(v)
        .execute(&pool)
        .await
        .unwrap();
    let err = db::check_migrations(&pool, "postgres://u:pw@h/db")
        .await
        .unwrap_err();
    assert!(matches!(err, DbError::ChecksumMismatch { .. }), "{err}");
    assert!(!err.to_string().contains("pw"), "password leaked: {err}");

    sqlx::query("INSERT INTO _sqlx_migrations (version, description, installed_on, success, checksum, execution_time) VALUES (99991231000000, 'future', now(), true, '\\x00'::bytea, 0)")
        .execute(&pool).await.unwrap();
    let err = db::check_migrations(&pool, "x").await.unwrap_err();
    assert!(
        matches!(err, DbError::UnknownMigrations { ref unknown, .. } if unknown == &vec![99991231000000]),
        "{err}"
    );

    sqlx::query("DELETE FROM _sqlx_migrations")
        .execute(&pool)
        .await
        .unwrap();
    let err = db::check_migrations(&pool, "x").await.unwrap_err();
    assert!(matches!(err, DbError::NotMigrated { .. }), "{err}");
    assert!(err.to_string().contains("orchestrator migrate"));
}

#[tokio::test]
async fn unreachable_database_names_url_without_password_and_hint() {
    // A port with no listener.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://alice:s3cret@127.0.0.1:{port}/rubricem");
    let err = db::open(&url, 1).await.unwrap_err().to_string();
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(!err.contains("s3cret"), "{err}");
    assert!(err.contains("scripts/setup.sh"), "{err}");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn trajectories_round_trip_exactly(pool: PgPool) {
    let run_id = run(&pool, "r").await;
    let task_id = task(&pool, "t1").await;
    db::runs::begin_step(&pool, run_id, 0, 3, &[task_id])
        .await
        .unwrap();
    let mut t = traj(
        run_id,
        0,
        task_id,
        0,
        5,
        serde_json::json!([{"id": "a1", "known": true}]),
    );
    t.segments[0].text = "nul\0 and unicode é ✓".into();
    t.segments[0].logprobs = Some(vec![-0.125, -3.5e-8]);
    db::trajectories::insert_batch(&pool, std::slice::from_ref(&t))
        .await
        .unwrap();
    let back = db::trajectories::get(&pool, t.id).await.unwrap().unwrap();
    assert_eq!(
        back.segments[0].text, "nul\u{FFFD} and unicode é ✓",
        "NUL replaced, rest kept"
    );
    let mut expect = t.clone();
    expect.segments[0].text = back.segments[0].text.clone();
    assert_eq!(back, expect);
    assert_eq!(
        db::trajectories::count_for_step(&pool, run_id, 0)
            .await
            .unwrap(),
        1
    );
    let (m, tool): (i32, i32) =
        sqlx::query_as("SELECT num_model_tokens, num_tool_tokens FROM trajectories WHERE id = $1")
            .bind(t.id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((m, tool), (9, 3));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_bad_batch_writes_nothing(pool: PgPool) {
    let run_id = run(&pool, "r").await;
    let task_id = task(&pool, "t1").await;
    db::runs::begin_step(&pool, run_id, 0, 0, &[])
        .await
        .unwrap();
    let good = traj(run_id, 0, task_id, 0, 2, serde_json::json!([]));
    let mut bad = traj(run_id, 0, task_id, 1, 2, serde_json::json!([]));
    bad.segments[0].logprobs = Some(vec![-1.0]); // 1 logprob for 2 tokens
    let err = db::trajectories::insert_batch(&pool, &[good.clone(), bad])
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("1 logprobs for 2 model tokens"),
        "{err}"
    );
    assert_eq!(
        db::trajectories::count_for_step(&pool, run_id, 0)
            .await
            .unwrap(),
        0
    );

    // A duplicate (same run/step/task/sample) aborts the whole batch too.
    db::trajectories::insert_batch(&pool, std::slice::from_ref(&good))
        .await
        .unwrap();
    let mut dup = traj(run_id, 0, task_id, 0, 2, serde_json::json!([]));
    dup.id = Uuid::now_v7();
    let other = traj(run_id, 0, task_id, 5, 2, serde_json::json!([]));
    assert!(
        db::trajectories::insert_batch(&pool, &[other, dup])
            .await
            .is_err()
    );
    assert_eq!(
        db::trajectories::count_for_step(&pool, run_id, 0)
            .await
            .unwrap(),
        1
    );
    let segs: i64 = sqlx::query_scalar("SELECT count(*) FROM trajectory_segments")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(segs, 5, "only the first good trajectory's segments exist");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn task_upsert_is_idempotent_and_ordered(pool: PgPool) {
    let mk = |ext: &str, p: &str| db::tasks::NewTask {
        source: "s".into(),
        external_id: ext.into(),
        prompt: p.into(),
        answer_format: "short".into(),
        persistent_rubrics: serde_json::json!([{"title": "r"}]),
        metadata: serde_json::json!({"k": 1}),
    };
    let a = db::tasks::upsert(&pool, &[mk("b", "B"), mk("a", "A")])
        .await
        .unwrap();
    let b = db::tasks::upsert(&pool, &[mk("a", "A2"), mk("b", "B")])
        .await
        .unwrap();
    assert_eq!(a[0], b[1]);
    assert_eq!(a[1], b[0]);
    let prompt: String = sqlx::query_scalar("SELECT prompt FROM tasks WHERE id = $1")
        .bind(a[1])
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(prompt, "A2");
    let hash: String = sqlx::query_scalar("SELECT prompt_sha256 FROM tasks WHERE id = $1")
        .bind(a[1])
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(hash, orchestrator::domain::util::sha256_hex(b"A2"));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn metrics_upsert_and_reject_non_finite(pool: PgPool) {
    let run_id = run(&pool, "r").await;
    db::metrics::record(
        &pool,
        run_id,
        0,
        &[("reward/plan".into(), 0.5), ("kl".into(), 0.01)],
    )
    .await
    .unwrap();
    db::metrics::record(&pool, run_id, 0, &[("reward/plan".into(), 0.75)])
        .await
        .unwrap();
    db::metrics::record(&pool, run_id, 1, &[("reward/plan".into(), 0.8)])
        .await
        .unwrap();
    assert_eq!(
        db::metrics::fetch(&pool, run_id, "reward/plan")
            .await
            .unwrap(),
        vec![(0, 0.75), (1, 0.8)]
    );
    let err = db::metrics::record(&pool, run_id, 2, &[("kl".into(), f64::NAN)])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("`kl`"), "{err}");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn run_status_transitions(pool: PgPool) {
    let run_id = run(&pool, "r").await;
    db::runs::set_run_status(&pool, run_id, "running", None)
        .await
        .unwrap();
    db::runs::set_run_status(&pool, run_id, "completed", None)
        .await
        .unwrap();
    let r = db::runs::get_run(&pool, run_id).await.unwrap().unwrap();
    assert_eq!(r.status, "completed");
    assert!(
        db::runs::set_run_status(&pool, run_id, "exploded", None)
            .await
            .is_err(),
        "CHECK constraint"
    );
    assert!(
        db::runs::set_run_status(&pool, Uuid::now_v7(), "running", None)
            .await
            .is_err()
    );
}

/// Fixture for the analysis queries: one run, one step, one task, four trajectories with known
/// scores, tool calls, rubric judgments and citations.
struct Fixture {
    run_id: Uuid,
    trajs: Vec<Uuid>,
    rubrics: Vec<Uuid>,
}

async fn fixture(pool: &PgPool) -> Fixture {
    let run_id = run(pool, "fixture-run").await;
    let task_id = task(pool, "q").await;
    db::runs::begin_step(pool, run_id, 0, 3, &[task_id])
        .await
        .unwrap();
    db::runs::begin_step(pool, run_id, 1, 4, &[task_id])
        .await
        .unwrap();
    let citations = [
        serde_json::json!([{"id": "a", "known": true}, {"id": "b", "known": false}]),
        serde_json::json!([{"id": "c", "known": true}]),
        serde_json::json!([]),
        serde_json::json!([{"id": "d", "known": true}, {"id": "e", "known": true}, {"id": "f", "known": false}]),
    ];
    let lengths = [10usize, 20, 30, 40];
    let batch: Vec<Trajectory> = (0..4)
        .map(|i| {
            traj(
                run_id,
                0,
                task_id,
                i as i32,
                lengths[i],
                citations[i].clone(),
            )
        })
        .collect();
    db::trajectories::insert_batch(pool, &batch).await.unwrap();
    // One trajectory at step 1 so trends have two points.
    let later = traj(run_id, 1, task_id, 0, 50, serde_json::json!([]));
    db::trajectories::insert_batch(pool, std::slice::from_ref(&later))
        .await
        .unwrap();
    let mut trajs: Vec<Uuid> = batch.iter().map(|t| t.id).collect();
    trajs.push(later.id);

    // Stage scores: plan = 0.25 * i, answer = 0.2 + 0.2 * i (rises with length).
    for (i, id) in trajs.iter().enumerate().take(4) {
        for (stage, score) in [(0i16, 0.25 * i as f32), (3i16, 0.2 + 0.2 * i as f32)] {
            sqlx::query("INSERT INTO stage_scores (trajectory_id, stage, judge_model, score) VALUES ($1, $2, 'lexical-v1', $3)")
                .bind(id).bind(stage).bind(score).execute(pool).await.unwrap();
        }
    }
    sqlx::query("INSERT INTO stage_scores (trajectory_id, stage, judge_model, score) VALUES ($1, 0, 'lexical-v1', 1.0)")
        .bind(trajs[4]).execute(pool).await.unwrap();

    // Tool calls: research stage google_search x3 (one error, one cached), answer stage browse x1.
    let calls = [
        (trajs[0], 1i16, "google_search", None::<&str>, false, 100),
        (trajs[0], 1, "google_search", Some("timeout"), false, 300),
        (trajs[1], 1, "google_search", None, true, 0),
        (trajs[2], 3, "browse_webpage", None, false, 50),
    ];
    for (k, (tid, stage, tool, error, cached, lat)) in calls.iter().enumerate() {
        sqlx::query("INSERT INTO tool_calls (id, trajectory_id, ordinal, stage, tool, arguments, error, cached, latency_ms) VALUES ($1, $2, $3, $4, $5, '{}', $6, $7, $8)")
            .bind(Uuid::now_v7()).bind(tid).bind(k as i32).bind(stage).bind(tool).bind(error).bind(cached).bind(lat)
            .execute(pool).await.unwrap();
    }

    // Rubrics: r0 discriminates (scores 0,1,2,1), r1 is constant (2,2,2,2).
    let mut rubrics = Vec::new();
    for (k, desc) in ["names the mechanism", "is written in English"]
        .iter()
        .enumerate()
    {
        let rid = Uuid::now_v7();
        sqlx::query("INSERT INTO rubrics (id, task_id, stage, origin, description, negative) VALUES ($1, $2, 3, 'generated', $3, $4)")
            .bind(rid).bind(task_id).bind(desc).bind(k == 1).execute(pool).await.unwrap();
        rubrics.push(rid);
    }
    let scores = [[0.0f32, 2.0], [1.0, 2.0], [2.0, 2.0], [1.0, 2.0]];
    for (i, tid) in trajs.iter().enumerate().take(4) {
        for (k, rid) in rubrics.iter().enumerate() {
            sqlx::query("INSERT INTO judgments (id, trajectory_id, rubric_id, stage, score, judge_model, judge_kind) VALUES ($1, $2, $3, 3, $4, 'lexical-v1', 'lexical')")
                .bind(Uuid::now_v7()).bind(tid).bind(rid).bind(scores[i][k]).execute(pool).await.unwrap();
        }
    }
    Fixture {
        run_id,
        trajs,
        rubrics,
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn sql_stage_score_trends(pool: PgPool) {
    let f = fixture(&pool).await;
    let rows = sql_rows(&pool, "stage_score_trends.sql").await;
    let got: Vec<(i32, String, f64, i64)> = rows
        .iter()
        .map(|r| {
            (
                r.get("step"),
                r.get("stage"),
                r.get("mean_score"),
                r.get("trajectories"),
            )
        })
        .collect();
    let want = [
        (0, "plan", 0.375, 4),
        (0, "answer", 0.5, 4),
        (1, "plan", 1.0, 1),
    ];
    assert_eq!(got.len(), want.len(), "{got:?}");
    for (g, w) in got.iter().zip(want) {
        assert_eq!((g.0, g.1.as_str(), g.3), (w.0, w.1, w.3), "{got:?}");
        assert!((g.2 - w.2).abs() < 1e-6, "{got:?}"); // scores are real (float4)
    }
    assert!(rows.iter().all(|r| r.get::<Uuid, _>("run_id") == f.run_id));
    assert!(
        rows.iter()
            .all(|r| r.get::<String, _>("judge") == "lexical-v1")
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn sql_tool_use_per_stage(pool: PgPool) {
    fixture(&pool).await;
    let rows = sql_rows(&pool, "tool_use_per_stage.sql").await;
    let got: Vec<(String, String, i64, f64, i64, i64, f64)> = rows
        .iter()
        .map(|r| {
            (
                r.get("stage"),
                r.get("tool"),
                r.get("calls"),
                r.get("calls_per_trajectory"),
                r.get("errors"),
                r.get("cache_hits"),
                r.get("mean_latency_ms"),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "research".into(),
                "google_search".into(),
                3,
                0.75,
                1,
                1,
                400.0 / 3.0
            ),
            (
                "answer".into(),
                "browse_webpage".into(),
                1,
                0.25,
                0,
                0,
                50.0
            ),
        ]
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn sql_rubric_score_variance(pool: PgPool) {
    let f = fixture(&pool).await;
    let rows = sql_rows(&pool, "rubric_score_variance.sql").await;
    let got: Vec<(Uuid, i64, f64, f64, bool)> = rows
        .iter()
        .map(|r| {
            (
                r.get("rubric_id"),
                r.get("judged"),
                r.get("mean_score"),
                r.get("variance"),
                r.get("negative"),
            )
        })
        .collect();
    // r0 scores 0,1,2,1: mean 1, population variance 0.5; r1 constant: variance 0.
    assert_eq!(
        got,
        vec![
            (f.rubrics[0], 4, 1.0, 0.5, false),
            (f.rubrics[1], 4, 2.0, 0.0, true)
        ]
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn sql_citation_validity(pool: PgPool) {
    fixture(&pool).await;
    let rows = sql_rows(&pool, "citation_validity.sql").await;
    let got: Vec<(i32, i64, i64, i64, Option<f64>, i64)> = rows
        .iter()
        .map(|r| {
            (
                r.get("step"),
                r.get("trajectories"),
                r.get("citations"),
                r.get("valid_citations"),
                r.get("valid_fraction"),
                r.get("trajectories_without_citations"),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![(0, 4, 6, 4, Some(4.0 / 6.0), 1), (1, 1, 0, 0, None, 1)]
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn sql_answer_length_vs_reward(pool: PgPool) {
    let f = fixture(&pool).await;
    let rows = sql_rows(&pool, "answer_length_vs_reward.sql").await;
    let got: Vec<(i32, i64, f64, f64)> = rows
        .iter()
        .map(|r| {
            (
                r.get("length_quartile"),
                r.get("trajectories"),
                r.get("mean_answer_tokens"),
                r.get("mean_reward"),
            )
        })
        .collect();
    assert_eq!(got.len(), 4);
    for (q, (quart, n, len, reward)) in got.iter().enumerate() {
        assert_eq!(*quart as usize, q + 1);
        assert_eq!(*n, 1);
        assert_eq!(*len, 10.0 * (q + 1) as f64);
        assert!((reward - (0.2 + 0.2 * q as f64)).abs() < 1e-6, "{reward}");
    }
    let corr: f64 = rows[0].get("length_reward_corr");
    assert!(
        (corr - 1.0).abs() < 1e-9,
        "perfectly linear fixture: {corr}"
    );
    assert_eq!(f.trajs.len(), 5);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn sql_budget_cuts_by_hops(pool: PgPool) {
    let run_id = run(&pool, "cuts").await;
    let mut ids = Vec::new();
    for (ext, metadata) in [
        ("two-hop", serde_json::json!({"hops": 2})),
        ("four-hop", serde_json::json!({"hops": 4})),
        ("no-hops", serde_json::json!({})),
    ] {
        ids.push(task_with(&pool, ext, metadata).await);
    }
    // Steps 0-3: steps 0 and 1 are the first half, 2 and 3 the second. Per step, which of the
    // two samples of the two-hop and four-hop tasks were cut (at the budget; the second sample
    // at step 3 by the loop stop); the task without hops is rolled out once, at step 0, and not
    // cut.
    let cut: [[[bool; 2]; 2]; 4] = [
        [[false, false], [true, false]],
        [[false, false], [false, false]],
        [[false, false], [true, true]],
        [[false, true], [false, true]],
    ];
    for (step, per_task) in cut.iter().enumerate() {
        let step = step as i32;
        db::runs::begin_step(&pool, run_id, step, step, &ids)
            .await
            .unwrap();
        let mut batch = Vec::new();
        for (k, samples) in per_task.iter().enumerate() {
            for (i, is_cut) in samples.iter().enumerate() {
                let mut t = traj(run_id, step, ids[k], i as i32, 4, serde_json::json!([]));
                if *is_cut {
                    t.finish_reason = if (step, i) == (3, 1) {
                        "repetition"
                    } else {
                        "length"
                    }
                    .into();
                }
                batch.push(t);
            }
        }
        if step == 0 {
            batch.push(traj(run_id, 0, ids[2], 0, 4, serde_json::json!([])));
        }
        db::trajectories::insert_batch(&pool, &batch).await.unwrap();
    }
    let rows = sql_rows(&pool, "budget_cuts_by_hops.sql").await;
    // hops, then trajectories and cut share in the first half of the steps and in the second.
    type CutRow = (String, i64, Option<f64>, i64, Option<f64>);
    let got: Vec<CutRow> = rows
        .iter()
        .map(|r| {
            (
                r.get("hops"),
                r.get("early_trajectories"),
                r.get("early_cut_share"),
                r.get("late_trajectories"),
                r.get("late_cut_share"),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("2".into(), 4, Some(0.0), 4, Some(0.25)),
            ("4".into(), 4, Some(0.25), 4, Some(0.75)),
            ("none".into(), 1, Some(0.0), 0, None),
        ]
    );
    assert!(rows.iter().all(|r| r.get::<Uuid, _>("run_id") == run_id));
    assert!(rows.iter().all(|r| r.get::<String, _>("recipe") == "full"));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn sql_eval_by_hops(pool: PgPool) {
    let run_id = run(&pool, "evals").await;
    let two_a = task_with(&pool, "two-a", serde_json::json!({"hops": 2})).await;
    let two_b = task_with(&pool, "two-b", serde_json::json!({"hops": 2})).await;
    let four = task_with(&pool, "four", serde_json::json!({"hops": 4})).await;
    let bare = task_with(&pool, "bare", serde_json::json!({})).await;
    // A rubric item as the lexical judge writes it, lowered or not for unretrieved citations.
    let item = |lowered: bool| {
        let note = if lowered {
            "1/1 key terms present [x]; missing []; lowered one level: cites ids never retrieved (gene-1)"
        } else {
            "1/1 key terms present [x]; missing []"
        };
        serde_json::json!({"title": "t", "score": if lowered { 1 } else { 2 }, "justification": note})
    };
    // (task, finish reason, score, exact, tool calls, rubric items) per answer.
    type Answer = (
        Uuid,
        &'static str,
        Option<f64>,
        Option<bool>,
        i32,
        Vec<serde_json::Value>,
    );
    let versions: [(i32, Vec<Answer>); 2] = [
        (
            0,
            vec![
                (
                    two_a,
                    "stop",
                    Some(0.5),
                    Some(true),
                    2,
                    vec![item(true), item(false)],
                ),
                (
                    two_b,
                    "stop",
                    Some(0.5),
                    Some(false),
                    2,
                    vec![item(true), item(true)],
                ),
                (four, "repetition", Some(0.0), None, 4, vec![]),
                (bare, "stop", Some(1.0), None, 1, vec![item(false)]),
            ],
        ),
        (
            4,
            vec![
                (
                    two_a,
                    "stop",
                    Some(1.0),
                    Some(true),
                    2,
                    vec![item(false), item(false)],
                ),
                (two_b, "length", Some(0.0), Some(false), 3, vec![]),
                (
                    four,
                    "stop",
                    Some(0.2),
                    None,
                    4,
                    vec![item(true), item(false)],
                ),
                (bare, "stop", Some(0.0), None, 0, vec![item(false)]),
            ],
        ),
    ];
    for (version, answers) in versions {
        let results: Vec<db::evaluations::ResultRow> = answers
            .into_iter()
            .map(
                |(task_id, finish, score, exact, calls, items)| db::evaluations::ResultRow {
                    finish_reason: finish.into(),
                    tool_calls: calls,
                    rubric_scores: serde_json::Value::Array(items),
                    ..result_row(task_id, 0, score, exact)
                },
            )
            .collect();
        let summary = eval_row(run_id, version, "held-out", (4, 1, 3, 1));
        db::evaluations::record(&pool, &summary, &results)
            .await
            .unwrap();
    }
    let rows = sql_rows(&pool, "eval_by_hops.sql").await;
    // hops, version, answers, mean score, exact, exact known, cut, tool calls, lowered share.
    type EvalHopRow = (String, i32, i64, Option<f64>, i64, i64, i64, f64, f64);
    let got: Vec<EvalHopRow> = rows
        .iter()
        .map(|r| {
            (
                r.get("hops"),
                r.get("policy_version"),
                r.get("answers"),
                r.get("mean_score"),
                r.get("exact"),
                r.get("exact_known"),
                r.get("cut"),
                r.get("tool_calls"),
                r.get("uncited_lowered_share"),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            // v0: two answered, one exact, 3 of 4 items lowered over the two (0.5 and 1.0).
            ("2".into(), 0, 2, Some(0.5), 1, 2, 0, 2.0, 0.75),
            // v4: one cut (scored 0, not exact), one exact with nothing lowered.
            ("2".into(), 4, 2, Some(0.5), 1, 2, 1, 2.5, 0.0),
            ("4".into(), 0, 1, Some(0.0), 0, 0, 1, 4.0, 0.0),
            ("4".into(), 4, 1, Some(0.2), 0, 0, 0, 4.0, 0.5),
            ("none".into(), 0, 1, Some(1.0), 0, 0, 0, 1.0, 0.0),
            ("none".into(), 4, 1, Some(0.0), 0, 0, 0, 0.0, 0.0),
        ]
    );
    assert!(
        rows.iter()
            .all(|r| r.get::<String, _>("subset") == "held-out")
    );
    assert!(rows.iter().all(|r| r.get::<Uuid, _>("run_id") == run_id));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn sql_training_windows(pool: PgPool) {
    let run_id = run(&pool, "windows").await;
    // Steps 0-12 roll out 32 attempts each: window 0 is steps 0-11, window 1 steps 12-13. The
    // rollout records a loop stop on even steps only and a budget cut at step 12 alone (a finish
    // reason absent from a step is no attempt ending that way); no demonstrations are recorded.
    // Step 13 carries the trainer's figures alone (no rollout): its missing finish reasons are
    // unknown, not zero.
    for step in 0..=12 {
        let mut m = vec![
            ("reward/answer".to_string(), f64::from(step) / 8.0),
            ("rollout/trajectories".to_string(), 32.0),
            ("rollout/parse_failures".to_string(), f64::from(step % 3)),
            ("batch/sequences".to_string(), 30.0),
            (
                "train/null_sequences".to_string(),
                10.0 + f64::from(step % 2),
            ),
            ("time/train_s".to_string(), 50.0),
            ("time/rollout_s".to_string(), 40.0 + f64::from(step)),
        ];
        if step % 2 == 0 {
            m.push(("rollout/finish/repetition".to_string(), 2.0));
        }
        if step == 12 {
            m.push(("rollout/finish/length".to_string(), 1.0));
        }
        db::metrics::record(&pool, run_id, step, &m).await.unwrap();
    }
    db::metrics::record(&pool, run_id, 13, &[("time/train_s".to_string(), 62.0)])
        .await
        .unwrap();
    let rows = sql_rows(&pool, "training_windows.sql").await;
    // window, first and last step, steps; answer reward; attempts, loop stops, cuts, parse
    // failures, demonstrations; rows and null rows per step; train and rollout s per step.
    type Counts = (f64, f64, f64, f64, Option<f64>);
    type WindowRow = (i32, i32, i32, i64, f64, Counts, f64, f64, f64, f64);
    let got: Vec<WindowRow> = rows
        .iter()
        .map(|r| {
            (
                r.get("window"),
                r.get("first_step"),
                r.get("last_step"),
                r.get("steps"),
                r.get("answer_reward"),
                (
                    r.get("attempts"),
                    r.get("loop_stops"),
                    r.get("budget_cuts"),
                    r.get("parse_failures"),
                    r.get("demonstrations"),
                ),
                r.get("rows_per_step"),
                r.get("null_rows_per_step"),
                r.get("train_s_per_step"),
                r.get("rollout_s_per_step"),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            // answer: (0 + ... + 11) / 8 / 12; parse failures 4 × (0 + 1 + 2); rollout 40 + 5.5
            (
                0,
                0,
                11,
                12,
                0.6875,
                (384.0, 12.0, 0.0, 12.0, None),
                30.0,
                10.5,
                50.0,
                45.5
            ),
            // step 13 counts as a step and in the train seconds, nowhere else
            (
                1,
                12,
                13,
                2,
                1.5,
                (32.0, 2.0, 1.0, 0.0, None),
                30.0,
                10.0,
                56.0,
                52.0
            ),
        ]
    );
    assert!(rows.iter().all(|r| r.get::<Uuid, _>("run_id") == run_id));
    assert!(rows.iter().all(|r| r.get::<String, _>("recipe") == "full"));
}

/// scripts/sql/rl_time.sql: the span of the `time/train_s` records, less the evaluations' wall
/// time (`time/eval_s`, on the step that made the version) of the steps before the last; the
/// final evaluation, on the last step, lies after the span and is not subtracted.
#[sqlx::test(migrator = "MIGRATOR")]
async fn sql_rl_time(pool: PgPool) {
    let run_id = run(&pool, "timed").await;
    // Steps 0-6, one a minute (the span is 6 minutes); other metrics' times do not count. Step 3
    // made version 4, evaluated in 90 s; step 6 made the final version, evaluated in 99 s (its
    // record lands after the final evaluation, as a run writes it).
    for step in 0..=6 {
        let mut m = vec![
            ("time/train_s".to_string(), 30.0),
            ("reward/answer".to_string(), 0.5),
        ];
        match step {
            3 => m.push(("time/eval_s".to_string(), 90.0)),
            6 => m.push(("time/eval_s".to_string(), 99.0)),
            _ => {}
        }
        db::metrics::record(&pool, run_id, step, &m).await.unwrap();
    }
    let lone = run(&pool, "lone").await;
    db::metrics::record(
        &pool,
        lone,
        0,
        &[
            ("time/train_s".to_string(), 5.0),
            ("time/eval_s".to_string(), 40.0),
        ],
    )
    .await
    .unwrap();
    sqlx::query(
        "UPDATE step_metrics
         SET recorded_at = $1::timestamptz + make_interval(secs => step * 60)
             + CASE WHEN name = 'time/eval_s' THEN interval '50 seconds' ELSE interval '0' END",
    )
    .bind("2026-01-01 00:00:00+00")
    .execute(&pool)
    .await
    .unwrap();
    let rows = sql_rows(&pool, "rl_time.sql").await;
    // run, steps, span, versions inside, their minutes, RL minutes, seconds a step.
    type TimeRow = (Uuid, i64, f64, i64, f64, f64, Option<f64>);
    let got: Vec<TimeRow> = rows
        .iter()
        .map(|r| {
            (
                r.get("run_id"),
                r.get("steps"),
                r.get("span_minutes"),
                r.get("evaluated_versions"),
                r.get("eval_minutes_inside"),
                r.get("rl_minutes"),
                r.get("seconds_per_step"),
            )
        })
        .collect();
    let timed = got.iter().find(|g| g.0 == run_id).unwrap();
    // 6 minutes less 1.5 inside: 4.5 minutes over the 6 steps after the first, 45 s each.
    assert_eq!(timed.1, 7);
    assert!((timed.2 - 6.0).abs() < 1e-9, "span {}", timed.2);
    assert_eq!(
        timed.3, 1,
        "only version 4's evaluation lies inside the span"
    );
    assert!((timed.4 - 1.5).abs() < 1e-9, "evaluations {}", timed.4);
    assert!((timed.5 - 4.5).abs() < 1e-9, "rl {}", timed.5);
    assert!(
        (timed.6.unwrap() - 45.0).abs() < 1e-9,
        "per step {:?}",
        timed.6
    );
    let single = got.iter().find(|g| g.0 == lone).unwrap();
    assert_eq!((single.1, single.3, single.6), (1, 0, None));
    assert!(single.2.abs() < 1e-9 && single.5.abs() < 1e-9);
}

/// scripts/loop-onset.py over fixture trajectories: the rule runs per turn over model tokens only
/// (a tool output neither counts nor joins turns), and the table's figures are hand-computed.
#[sqlx::test(migrator = "MIGRATOR")]
async fn loop_onset_script_replays_the_rule_on_stored_tokens(pool: PgPool) {
    let run_id = run(&pool, "loops").await;
    let task_id = task(&pool, "t").await;
    db::runs::begin_step(&pool, run_id, 0, 0, &[task_id])
        .await
        .unwrap();
    let with = |sample: i32, finish: &str, segments: Vec<Segment>| {
        let mut t = traj(run_id, 0, task_id, sample, 0, serde_json::json!([]));
        t.segments = segments;
        t.finish_reason = finish.into();
        t
    };
    let model = |ids: Vec<u32>| seg(SegmentKind::Model, Some(Stage::Answer), ids);
    let looping: Vec<u32> = [7, 8].repeat(20);
    let batch = vec![
        // Cut: 3 tokens, a tool output that repeats one token (not the model's), then a
        // 2-token block 20 times. Four copies end at model token 3 + 8 = 11 of 43.
        with(
            0,
            "length",
            vec![
                model(vec![1, 2, 3]),
                seg(SegmentKind::ToolOutput, None, vec![9; 6]),
                model(looping),
            ],
        ),
        // Answered, 20 distinct tokens: never stopped.
        with(1, "answer", vec![model((10..30).collect())]),
        // Answered after a loop it left (one token 6 times): stopped at its 4th token.
        with(2, "answer", vec![model(vec![5, 5, 5, 5, 5, 5, 40, 41, 42])]),
    ];
    let recovered = batch[2].id;
    db::trajectories::insert_batch(&pool, &batch).await.unwrap();
    sqlx::query(
        "INSERT INTO trajectory_rewards (trajectory_id, judge_model, recipe, reward, rubric, advantage)
         VALUES ($1, 'lexical-v1', 'full', 0.5, 0.5, 0.1)",
    )
    .bind(recovered)
    .execute(&pool)
    .await
    .unwrap();
    let url = common::database::db_url(&pool).await;
    let script = script("loop-onset.py");
    let run = run_id.to_string();
    let stdout = run_ok(
        &script,
        &[&run, "--period", "4", "--repeats", "4,8", "--db", &url],
    );
    // 43 + 20 + 9 model tokens, 43 of them in the cut attempt.
    assert!(
        stdout.contains("3 trajectories of 1 run(s): 1 cut at the budget (0.33), holding 43 of 72 model tokens (0.60)"),
        "{stdout}"
    );
    // Four copies: the cut attempt stops at 11 of 43 (0.26), saving 32 (0.74 of 43, 0.44 of
    // 72); the recovered answer (reward 0.5) would be stopped too.
    assert!(
        stdout.contains("| 4 | 4 | 1 / 1 | 0.26 | 0.74 / 0.44 | 1 / 2 (1) |"),
        "{stdout}"
    );
    // Eight copies of a block of up to 4: the cut attempt at 3 + 16 = 19 (0.44), saving 24;
    // the six-fold token is not enough.
    assert!(
        stdout.contains("| 4 | 8 | 1 / 1 | 0.44 | 0.56 / 0.33 | 0 / 2 (0) |"),
        "{stdout}"
    );
    // --probs: the stored probabilities (the fixture's logprob of token t is -t/1000) of the
    // one attempt that loops 8 times: tokens 1-3 before the loop, the first copy (7, 8), and
    // seven more copies; 1 - p of each region over the attempt's total, figured by hand.
    let stdout = run_ok(
        &script,
        &[
            &run,
            "--period",
            "4",
            "--repeats",
            "4,8",
            "--probs",
            "--by-step",
            "2",
            "--db",
            &url,
        ],
    );
    for row in [
        "1 looping attempts (period <= 4, 8 copies)",
        "| before the loop | 3 | 0.998 | 0.002 | 0.048 |",
        "| the loop's first copy | 2 | 0.993 | 0.007 | 0.119 |",
        "| the later copies | 14 | 0.993 | 0.007 | 0.833 |",
        // --by-step 2: all three attempts are of step 0, one of them loops 8 times.
        "| 0-1 | 3 | 1 (0.33) | 0.998 | 0.993 | 0.993 |",
    ] {
        assert!(stdout.contains(row), "{row}\n{stdout}");
    }
    let id = run_id.to_string();
    assert_refused(&script, &[&id, "--repeats", "1"], "--repeats = 1");
    assert_refused(
        &script,
        &[&id, "--by-step", "2"],
        "--by-step = 2; allowed: 1 to 10000, with --probs",
    );
}

/// Hostile model output: a NUL byte in a tool call's query, attributes, output, error and
/// snippet ids (and in the parsed JSON) is stored as U+FFFD instead of failing the whole run's
/// write (Postgres text and jsonb refuse NUL).
#[sqlx::test(migrator = "MIGRATOR")]
async fn nul_bytes_in_tool_calls_are_stored_not_fatal(pool: PgPool) {
    use orchestrator::domain::rollout::{ExecutedCall, Rollout};
    use orchestrator::domain::tool::{Snippet, ToolArgs, ToolResult};
    let run_id = run(&pool, "r").await;
    let task_id = task(&pool, "t1").await;
    db::runs::begin_step(&pool, run_id, 0, 3, &[task_id])
        .await
        .unwrap();
    let mut t = traj(run_id, 0, task_id, 0, 3, serde_json::json!([]));
    t.parsed = serde_json::json!({"answer": "a\0b", "k\0": ["x\0"]});
    let result = ToolResult {
        tool: "google\0search".into(),
        args: ToolArgs {
            query: "q\0uery".into(),
            attrs: [("k\0".to_string(), "v\0".to_string())]
                .into_iter()
                .collect(),
        },
        snippets: vec![Snippet {
            id: "s\0-0".into(),
            title: "t".into(),
            url: None,
            text: "x".into(),
        }],
        error: Some("bad\0thing".into()),
        cached: false,
        latency: std::time::Duration::from_millis(3),
        output_text: "<tool_output>\0</tool_output>".into(),
    };
    let rollout = Rollout {
        trajectory: t.clone(),
        parsed: orchestrator::domain::scaffold::parse::parse("", &|_| false),
        calls: vec![ExecutedCall {
            result,
            stage: Stage::Research,
        }],
        error: None,
    };
    db::rollouts::insert(&pool, &[rollout]).await.unwrap();
    let (tool, args, out, err, ids): (String, serde_json::Value, String, String, Vec<String>) =
        sqlx::query_as(
            "SELECT tool, arguments, output_text, error, snippet_ids FROM tool_calls
             WHERE trajectory_id = $1",
        )
        .bind(t.id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(tool, "google\u{FFFD}search");
    assert_eq!(args["query"], "q\u{FFFD}uery");
    assert_eq!(args["attrs"]["k\u{FFFD}"], "v\u{FFFD}");
    assert_eq!(out, "<tool_output>\u{FFFD}</tool_output>");
    assert_eq!(err, "bad\u{FFFD}thing");
    assert_eq!(ids, ["s\u{FFFD}-0"]);
    let back = db::trajectories::get(&pool, t.id).await.unwrap().unwrap();
    assert_eq!(back.parsed["answer"], "a\u{FFFD}b");
}

/// A lease taken or refused at once (no grace): what a test of who holds a run wants.
async fn lease_now(pool: &PgPool, run_id: Uuid, holder: &str) -> Result<RunLease, LeaseError> {
    acquire(pool, run_id, holder, std::time::Duration::ZERO).await
}

/// One orchestrator per run: a second lease on a held run is refused naming the holder; once
/// the first is released (or its process dies and its connection closes) the run can be taken.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_second_orchestrator_on_a_run_is_refused_naming_the_holder(pool: PgPool) {
    use std::time::{Duration, Instant};
    let run_id = run(&pool, "r").await;
    let first = lease_now(&pool, run_id, "orchestrator pid 1 on host-a")
        .await
        .unwrap();
    let err = lease_now(&pool, run_id, "orchestrator pid 2 on host-b")
        .await
        .unwrap_err();
    assert!(matches!(err, LeaseError::Held { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&run_id.to_string()) && msg.contains("orchestrator pid 1 on host-a"),
        "{msg}"
    );
    // A live holder is refused after the grace, not waited on for ever.
    let t = Instant::now();
    let err = acquire(&pool, run_id, "pid 2", Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(err, LeaseError::Held { .. }), "{err}");
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    // Another run is free.
    let other = run(&pool, "r2").await;
    lease_now(&pool, other, "pid 2")
        .await
        .unwrap()
        .release()
        .await;
    first.release().await;
    let again = lease_now(&pool, run_id, "orchestrator pid 2 on host-b")
        .await
        .unwrap();
    // A holder that goes away without releasing (its connection closes) frees the run too.
    drop(again);
    let mut ok = false;
    for _ in 0..50 {
        if let Ok(l) = lease_now(&pool, run_id, "pid 3").await {
            l.release().await;
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "a dropped lease is released when its connection closes");
}

/// A holder whose connection ends while another claimant waits (a SIGKILLed orchestrator whose
/// backend has not yet read the closed socket when `--resume` starts) is not reported as holding
/// the run: the claimant waits up to the grace and takes it the moment it is free.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_run_freed_within_the_grace_is_taken_not_refused(pool: PgPool) {
    use orchestrator::infra::db::lease::HELD_GRACE;
    use std::time::{Duration, Instant};
    let run_id = run(&pool, "r").await;
    let dying = lease_now(&pool, run_id, "orchestrator pid 1 on host-a")
        .await
        .unwrap();
    let freed = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        drop(dying); // closes its connection without unlocking, as a killed process does
    });
    let t = Instant::now();
    let lease = acquire(&pool, run_id, "orchestrator pid 2 on host-a", HELD_GRACE)
        .await
        .expect("a run freed within the grace is taken");
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(600) && waited < HELD_GRACE,
        "took the run after {waited:?}"
    );
    freed.await.unwrap();
    let row: (String,) = sqlx::query_as("SELECT holder FROM run_leases WHERE run_id = $1")
        .bind(run_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(row.0, "orchestrator pid 2 on host-a");
    lease.release().await;
}

/// Two orchestrators sharing an experiment's runs: a run the other holds is reported held (not
/// an error), a run the other completed meanwhile is reported completed, and a free run is taken.
#[sqlx::test(migrator = "MIGRATOR")]
async fn orchestrators_sharing_an_experiment_take_only_free_unfinished_runs(pool: PgPool) {
    use orchestrator::pipeline::run::{Claim, RunStatus, claim, mark};
    let run_id = run(&pool, "full-s17").await;
    let other = lease_now(&pool, run_id, "orchestrator pid 1 on host-a")
        .await
        .unwrap();
    match claim(&pool, run_id).await.unwrap() {
        Claim::Held(e) => assert!(e.to_string().contains("pid 1 on host-a"), "{e}"),
        c => panic!("a held run was {c:?}"),
    }
    mark(&pool, run_id, RunStatus::Completed, None)
        .await
        .unwrap();
    other.release().await;
    assert!(matches!(
        claim(&pool, run_id).await.unwrap(),
        Claim::Completed
    ));
    // The completed run's lease was given back: the next claimant is not refused.
    lease_now(&pool, run_id, "pid 3")
        .await
        .unwrap()
        .release()
        .await;
    let free = run(&pool, "full-s18").await;
    let Claim::Mine(lease) = claim(&pool, free).await.unwrap() else {
        panic!("a free run was not taken");
    };
    assert!(matches!(claim(&pool, free).await.unwrap(), Claim::Held(_)));
    lease.release().await;
}

/// `scripts/seen-tasks.py` keeps the rows of a task file that every run of an experiment trained
/// on (or any run, with --any), read from the runs' trajectories in Postgres.
#[sqlx::test(migrator = "MIGRATOR")]
async fn seen_tasks_script_keeps_the_tasks_an_experiment_trained_on(pool: PgPool) {
    let exp = db::runs::create_experiment(&pool, "seen", "smoke", &serde_json::json!({}))
        .await
        .unwrap();
    let mut runs = Vec::new();
    for name in ["a", "b"] {
        runs.push(
            db::runs::create_run(&pool, exp, name, "full", &serde_json::json!({}), 1)
                .await
                .unwrap(),
        );
    }
    // Another experiment's run trained on t4: never counted.
    let other = run(&pool, "other").await;
    let mut t = Vec::new();
    for ext in ["t1", "t2", "t3", "t4"] {
        t.push(task(&pool, ext).await);
    }
    // Run a trained on t1 and t2, run b on t2 and t3.
    for (run_id, trained) in [
        (runs[0], vec![t[0], t[1]]),
        (runs[1], vec![t[1], t[2]]),
        (other, vec![t[3]]),
    ] {
        db::runs::begin_step(&pool, run_id, 0, 0, &trained)
            .await
            .unwrap();
        let batch: Vec<_> = trained
            .iter()
            .enumerate()
            .map(|(i, &task_id)| traj(run_id, 0, task_id, i as i32, 4, serde_json::json!([])))
            .collect();
        db::trajectories::insert_batch(&pool, &batch).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let tasks = dir.path().join("tasks.jsonl");
    std::fs::write(
        &tasks,
        ["t1", "t2", "t3", "t4", "t5"]
            .iter()
            .map(|id| format!("{{\"id\":\"{id}\",\"query\":\"q {id}\"}}\n"))
            .collect::<String>(),
    )
    .unwrap();
    let url = common::database::db_url(&pool).await;
    let script = script("seen-tasks.py");
    let kept = |any: bool| {
        let out_file = dir
            .path()
            .join(if any { "any.jsonl" } else { "every.jsonl" });
        let exp = exp.to_string();
        let (tasks, out) = (tasks.display().to_string(), out_file.display().to_string());
        let mut argv = vec![exp.as_str(), &tasks, &out, "--db", &url];
        if any {
            argv.push("--any");
        }
        run_ok(&script, &argv);
        std::fs::read_to_string(out_file)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(kept(false), ["\"t2\""], "trained on by both runs");
    assert_eq!(
        kept(true),
        ["\"t1\"", "\"t2\"", "\"t3\""],
        "by either run, in file order"
    );
    assert_refused(&script, &["not-a-uuid", "a", "b"], "not a UUID");
}

/// `scripts/seen-task-probe.py --summary` compares probes' version-0 `seen` evaluations with the
/// first, paired over tasks (per-task means over samples); other versions and subsets are not
/// read.
#[sqlx::test(migrator = "MIGRATOR")]
async fn seen_task_probe_summary_pairs_each_probe_with_the_reference_over_tasks(pool: PgPool) {
    let t = [
        task(&pool, "t1").await,
        task(&pool, "t2").await,
        task(&pool, "t3").await,
    ];
    // Per probe, per task: two samples' (score, exact).
    type Samples = [(f64, Option<bool>); 2];
    let (f, tr) = (Some(false), Some(true));
    let probes: [(&str, [Samples; 3]); 3] = [
        (
            "ref",
            [
                [(0.2, f), (0.4, tr)],
                [(0.5, None), (0.5, None)],
                [(0.0, f), (0.2, f)],
            ],
        ),
        (
            "new",
            [
                [(0.6, tr), (0.4, tr)],
                [(0.5, None), (0.7, None)],
                [(0.2, f), (0.2, tr)],
            ],
        ),
        (
            "same",
            [
                [(0.2, f), (0.4, tr)],
                [(0.5, None), (0.5, None)],
                [(0.0, f), (0.2, f)],
            ],
        ),
    ];
    let mut args = Vec::new();
    for (label, samples) in probes {
        let run_id = run(&pool, label).await;
        let exp: Uuid = sqlx::query_scalar("SELECT experiment_id FROM runs WHERE id = $1")
            .bind(run_id)
            .fetch_one(&pool)
            .await
            .unwrap();
        args.push(format!("{label}={exp}"));
        // Version 0 of `seen` is read; version 1 and another subset at version 0 (all 1.0) not.
        for (version, subset, all_one) in [(0, "seen", false), (1, "seen", true), (0, "x", true)] {
            let results: Vec<db::evaluations::ResultRow> = samples
                .iter()
                .zip(t)
                .flat_map(|(s, task_id)| {
                    s.iter().enumerate().map(move |(i, &(score, exact))| {
                        result_row(
                            task_id,
                            i as i32,
                            Some(if all_one { 1.0 } else { score }),
                            exact,
                        )
                    })
                })
                .collect();
            let summary = eval_row(run_id, version, subset, (3, 2, 6, 0));
            db::evaluations::record(&pool, &summary, &results)
                .await
                .unwrap();
        }
    }
    let url = common::database::db_url(&pool).await;
    let script = script("seen-task-probe.py");
    let summary = |subset: &str| {
        let mut argv = vec!["--db", url.as_str(), "--subset", subset, "--summary"];
        argv.extend(args.iter().map(String::as_str));
        run_ok(&script, &argv)
    };
    let text = summary("seen");
    // Score: reference 1.8/6, new 2.6/6; per-task changes +0.2, +0.1, +0.1 (mean 0.133, sd
    // 0.0577, s.e. 0.0333). Exact over known answers (t1, t3): 1/4 and 3/4, per-task +0.5, +0.5.
    assert!(text.contains("Tasks scored: 3 (reference: ref)"), "{text}");
    assert!(text.contains("| ref | "), "{text}");
    assert!(
        text.contains("| 0.4333 | +0.133 ± 0.033 (3 tasks) | 0.750 | +0.500 ± 0.000 |"),
        "{text}"
    );
    assert!(
        text.contains("| 0.3000 | +0.000 ± 0.000 (3 tasks) | 0.250 | +0.000 ± 0.000 |"),
        "{text}"
    );
    assert!(
        text.contains("Score change over 2 runs: +0.067 ± 0.094 (mean ± sd)"),
        "{text}"
    );

    // --subset reads that subset instead (`x` is 1.0 everywhere: no change).
    let text = summary("x");
    assert!(
        text.contains("| 1.0000 | +0.000 ± 0.000 (3 tasks) |"),
        "{text}"
    );
    assert!(!text.contains("+0.133"), "{text}");

    assert_refused(
        &script,
        &["--summary", "ref=not-a-uuid"],
        "ref=not-a-uuid: 'not-a-uuid' is not a UUID",
    );
    assert_refused(
        &script,
        &["--subset", "x'y", "--summary", &args[0]],
        "--subset = \"x'y\"; allowed: 1 to 40 of A-Z a-z 0-9 _ -",
    );
    // --models: each directory must hold weights, labels must differ, and --eval is needed.
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().display().to_string();
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    std::fs::write(model.join("model.safetensors"), "").unwrap();
    let model = model.display().to_string();
    let (eval, pool_file) = (format!("{empty}/eval.jsonl"), format!("{empty}/pool.jsonl"));
    std::fs::write(&eval, "").unwrap();
    for (a, b, message) in [
        (
            &empty,
            &model,
            format!("--models a={empty}: no model.safetensors in {empty}"),
        ),
        (
            &model,
            &model,
            "--models labels repeat: ['a', 'a']".to_string(),
        ),
    ] {
        let b_label = if a == b { "a" } else { "b" };
        let (a, b) = (format!("a={a}"), format!("{b_label}={b}"));
        let argv: [&str; 7] = ["--models", &a, &b, "--eval", &eval, "--pool", &pool_file];
        assert_refused(&script, &argv, &message);
    }
    assert_refused(
        &script,
        &["--models", "a=x", "--pool", &pool_file],
        "--models needs --eval and --pool",
    );
}
