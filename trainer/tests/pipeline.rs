//! The experiment pipeline against a real `trainer serve` (tiny model, CPU) and real Postgres:
//! the orchestrator process is SIGKILLed mid-run and resumed, and the trainer is killed and
//! restarted mid-run; in both cases every step completes exactly once, with consistent row
//! counts and policy versions, and the trainer ends at the run's last version.
#![allow(clippy::disallowed_methods)] // reads Postgres directly to check what the product stored
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../../orchestrator/tests/common/browser.rs"]
mod browser;
mod common;

use sqlx::PgPool;
use trainer::service::{AppState, load};
use uuid::Uuid;

const STEPS: i64 = 4;
const TASKS: i64 = 2;
const N: i64 = 2;
/// World tasks held out of training and evaluated at versions 0, 2 and 4.
const HELD_OUT: i64 = 3;

/// Tokenizer + random tiny Qwen3 whose vocabulary covers the scaffold's tags.
fn model_dir(tmp: &Path, world: &Path) -> PathBuf {
    let corpus = world.join("corpus.jsonl");
    let tok = tmp.join("tok");
    trainer::smallmodel::train_tokenizer(&corpus, 400, &tok).unwrap();
    let cfg = tmp.join("config.json");
    std::fs::write(
        &cfg,
        serde_json::json!({
            "vocab_size": 0, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "max_position_embeddings": 4096, "rope_theta": 10000.0, "tie_word_embeddings": true
        })
        .to_string(),
    )
    .unwrap();
    let out = tmp.join("model");
    trainer::smallmodel::init_model(&cfg, &tok, &out, 3).unwrap();
    out
}

struct Trainer {
    state: Arc<AppState>,
    task: tokio::task::JoinHandle<()>,
}

/// `trainer serve` in-process on `addr` (port 0: any), restorable, checkpointing under `ckpt`.
async fn start_trainer(model: &Path, ckpt: &Path, addr: &str) -> (Trainer, String) {
    let mut train = trainer::train::TrainConfig::default();
    train.optim.lr = 1e-3;
    train.loss.kl_coef = 0.0;
    let opts =
        load::LoadOptions::from_config(model.to_path_buf(), &train, None, tch::Device::Cpu, 5);
    let listener = loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let bound = listener.local_addr().unwrap();
    let (state, task) = common::serve_on(listener, opts, Some(ckpt.to_path_buf()), None, None);
    (Trainer { state, task }, bound.to_string())
}

/// The split world: 12 training tasks, and held-out tasks about lineages no training task
/// mentions (one more than the held-out subset draws).
fn write_world(dir: &Path) {
    let world =
        orchestrator::domain::data::world::generate_split(23, 60, 12, HELD_OUT as usize + 1);
    orchestrator::domain::data::world::write(&world, dir).unwrap();
}

/// The run configuration as a TOML file over the smoke preset.
fn config_file(tmp: &Path, world: &Path, model: &Path, db: &str, url: &str) -> PathBuf {
    let text = format!(
        r#"
[experiment]
steps = {STEPS}
seed = 9
[database]
url = "{db}"
max_connections = 8
[policy]
urls = ["{url}"]
[trainer]
url = "{url}"
[rollout]
n = {N}
tasks_per_step = {TASKS}
max_tool_calls = 2
max_tokens = 48
[retry]
max_retries = 8
min_delay_ms = 100
max_delay_ms = 1000
[data]
tasks = "{tasks}"
index = "{index}"
tokenizer = "{model}"
world_seed = 23
world_docs = 60
world_tasks = 12
world_held_out = {WORLD_HELD_OUT}
[pipeline]
max_staleness = 1
checkpoint_every = 2
max_inflight = 8
admission_max_waiting = 64
trainer_wait_secs = 120
[reflection]
candidates = 2
max_tokens = 24
window = 1
wait_secs = 120
[eval]
held_out = {HELD_OUT}
every = 2
[tracking]
tensorboard_dir = "{tb}"
poll_secs = 1
"#,
        tb = tmp.join("tb").display(),
        WORLD_HELD_OUT = HELD_OUT + 1,
        tasks = world.join("tasks.jsonl").display(),
        index = world.join("index").display(),
        model = model.display(),
    );
    let p = tmp.join("run.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// Replace the first `from` in the run's config file with `to` (the file must hold `from`).
fn edit_config(file: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.contains(from), "{} holds no {from:?}", file.display());
    std::fs::write(file, text.replacen(from, to, 1)).unwrap();
}

fn db_url(pool: &PgPool) -> String {
    let base = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| orchestrator::domain::config::DEFAULT_DATABASE_URL.to_string());
    let name = pool.connect_options().get_database().unwrap().to_string();
    let mut u = url::Url::parse(&base).unwrap();
    u.set_path(&name);
    u.to_string()
}

async fn scalar(pool: &PgPool, sql: &str, run: Uuid) -> i64 {
    sqlx::query_scalar(sql)
        .bind(run)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Everything a finished run must satisfy, whatever happened on the way.
async fn check_run(pool: &PgPool, run: Uuid, state: &AppState) {
    check_run_at(pool, run, state, 1).await;
}

/// [`check_run`] for a run whose staleness bound is `staleness`.
async fn check_run_at(pool: &PgPool, run: Uuid, state: &AppState, staleness: i32) {
    let completed = scalar(
        pool,
        "SELECT count(*) FROM steps WHERE run_id = $1 AND status = 'completed'",
        run,
    )
    .await;
    assert_eq!(completed, STEPS, "every step completed");
    let trajs = scalar(
        pool,
        "SELECT count(*) FROM trajectories WHERE run_id = $1",
        run,
    )
    .await;
    assert_eq!(trajs, STEPS * TASKS * N, "no trajectory lost or duplicated");
    let per_step_ok = scalar(
        pool,
        "SELECT count(*) FROM (SELECT step FROM trajectories WHERE run_id = $1
                               GROUP BY step HAVING count(*) = 4) s",
        run,
    )
    .await;
    assert_eq!(per_step_ok, STEPS);
    let scores = scalar(
        pool,
        "SELECT count(*) FROM stage_scores s JOIN trajectories t ON t.id = s.trajectory_id
         WHERE t.run_id = $1",
        run,
    )
    .await;
    assert_eq!(scores, trajs * 4, "four stage scores per trajectory, once");
    let dup_judgments = scalar(
        pool,
        "SELECT count(*) - count(DISTINCT (j.trajectory_id, j.rubric_id)) FROM judgments j
         JOIN trajectories t ON t.id = j.trajectory_id WHERE t.run_id = $1",
        run,
    )
    .await;
    assert_eq!(dup_judgments, 0);
    // Staleness bound k: step s is rolled out by version s - k to s.
    let bad_versions: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM trajectories WHERE run_id = $1
         AND NOT (policy_version BETWEEN step - $2 AND step)",
    )
    .bind(run)
    .bind(staleness)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        bad_versions, 0,
        "policy versions respect the staleness bound"
    );
    let versions: Vec<(i32, f64)> = sqlx::query_as(
        "SELECT step, value FROM step_metrics WHERE run_id = $1 AND name = 'train/policy_version'
         ORDER BY step",
    )
    .bind(run)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(
        versions,
        (0..STEPS as i32)
            .map(|s| (s, f64::from(s + 1)))
            .collect::<Vec<_>>(),
        "step s trained version s + 1"
    );
    let version = state.policy.lock().unwrap().version;
    assert_eq!(version, STEPS, "the trainer holds exactly the run's steps");
    // The run's [trainer] settings were sent, echoed and stored; the trainer holds them.
    let (stored, hash): (serde_json::Value, String) =
        sqlx::query_as("SELECT trainer_settings, trainer_settings_hash FROM runs WHERE id = $1")
            .bind(run)
            .fetch_one(pool)
            .await
            .unwrap();
    let held = state.policy.lock().unwrap().settings.clone();
    assert_eq!(hash, held.hash());
    assert_eq!(stored, serde_json::to_value(&held).unwrap());
    let cfg = orchestrator::domain::config::Config::load(
        "smoke",
        &orchestrator::domain::config::Overrides::default(),
    )
    .unwrap();
    assert_eq!(
        held, cfg.trainer.settings,
        "the smoke preset's [trainer] table"
    );
    check_reflections(pool, run).await;
    check_evaluations(pool, run).await;
}

/// The held-out subset is evaluated exactly once at versions 0, 2 and 4 (initial, every 2,
/// final), whole, and none of its tasks is ever trained on.
async fn check_evaluations(pool: &PgPool, run: Uuid) {
    let evals: Vec<(i32, String, i32, i32, i32)> = sqlx::query_as(
        "SELECT policy_version, subset, tasks, judged, failed FROM evaluations
         WHERE run_id = $1 ORDER BY policy_version",
    )
    .bind(run)
    .fetch_all(pool)
    .await
    .unwrap();
    let h = HELD_OUT as i32;
    assert_eq!(
        evals,
        [0, 2, 4]
            .map(|v| (v, "held-out".to_string(), h, h, 0))
            .to_vec(),
        "one whole evaluation per due version, every answer judged"
    );
    let per_eval: Vec<i64> = sqlx::query_scalar(
        "SELECT count(*) FROM evaluation_results WHERE run_id = $1
         GROUP BY policy_version ORDER BY policy_version",
    )
    .bind(run)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(
        per_eval,
        vec![HELD_OUT; 3],
        "one result per task and version"
    );
    let same_tasks = scalar(
        pool,
        "SELECT count(DISTINCT task_id) FROM evaluation_results WHERE run_id = $1",
        run,
    )
    .await;
    assert_eq!(
        same_tasks, HELD_OUT,
        "the same fixed tasks at every version"
    );
    let trained_on = scalar(
        pool,
        "SELECT count(*) FROM evaluation_results e JOIN steps s ON s.run_id = e.run_id
         WHERE e.run_id = $1 AND e.task_id = ANY (s.task_ids)",
        run,
    )
    .await;
    assert_eq!(
        trained_on, 0,
        "held-out tasks never appear in a training step"
    );
    let from_split: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT t.external_id FROM evaluation_results e JOIN tasks t ON t.id = e.task_id
         WHERE e.run_id = $1 ORDER BY 1",
    )
    .bind(run)
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(
        from_split.len() == HELD_OUT as usize && from_split.iter().all(|id| id.contains("-h")),
        "the held-out subset is drawn from the split world's held-out tasks: {from_split:?}"
    );
    // The run's closing line: first and last version, each figure paired over the tasks,
    // agreeing with the stored summaries (one sample per task).
    let c = orchestrator::pipeline::evaluate::change(pool, run, "held-out")
        .await
        .unwrap()
        .expect("two versions evaluated");
    assert_eq!((c.first, c.last), (0, 4));
    let stored: Vec<(Option<f64>, Option<f64>)> = sqlx::query_as(
        "SELECT score, exact FROM evaluations WHERE run_id = $1 AND policy_version IN (0, 4)
         ORDER BY policy_version",
    )
    .bind(run)
    .fetch_all(pool)
    .await
    .unwrap();
    let score = c.score.expect("scored at both versions");
    assert_eq!(score.tasks, HELD_OUT as usize);
    assert!(
        (score.before - stored[0].0.unwrap()).abs() < 1e-9,
        "{c} vs {stored:?}"
    );
    assert!(
        (score.after - stored[1].0.unwrap()).abs() < 1e-9,
        "{c} vs {stored:?}"
    );
    assert!((score.diff - (score.after - score.before)).abs() < 1e-9);
    if let (Some(e), Some(b), Some(a)) = (c.exact, stored[0].1, stored[1].1) {
        assert!(
            (e.before - b).abs() < 1e-9 && (e.after - a).abs() < 1e-9,
            "{c}"
        );
    }
    assert!(
        c.to_string().starts_with("held-out v0 -> v4: score "),
        "{c}"
    );
    let timed: Vec<i32> = sqlx::query_scalar(
        "SELECT step FROM step_metrics WHERE run_id = $1 AND name = 'time/eval_s' ORDER BY step",
    )
    .bind(run)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(
        timed,
        vec![1, 3],
        "evaluation time after the steps making v2 and v4"
    );
}

/// The smoke preset's recipe is `full`: with window K = 1, steps 0 and 2 are new batches whose
/// reflection candidates (2 per task) train as Phase A of steps 1 and 3, exactly one step later;
/// a failed job (the policy server was down) leaves no candidates behind.
async fn check_reflections(pool: &PgPool, run: Uuid) {
    let jobs: Vec<(i32, String)> =
        sqlx::query_as("SELECT step, status FROM reflection_jobs WHERE run_id = $1 ORDER BY step")
            .bind(run)
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(
        jobs.iter().map(|j| j.0).collect::<Vec<_>>(),
        vec![0, 2],
        "one job per new-batch step: {jobs:?}"
    );
    for (step, status) in &jobs {
        let rows = scalar(
            pool,
            &format!("SELECT count(*) FROM reflections WHERE run_id = $1 AND step = {step}"),
            run,
        )
        .await;
        let on_time = scalar(
            pool,
            &format!(
                "SELECT count(*) FROM reflections WHERE run_id = $1 AND step = {step}
                 AND trained_step = {}",
                step + 1
            ),
            run,
        )
        .await;
        match status.as_str() {
            "done" => {
                assert_eq!(rows, TASKS * 2, "m = 2 candidates per task of step {step}");
                assert_eq!(
                    on_time,
                    rows,
                    "step {step}'s candidates train at step {}",
                    step + 1
                );
                let seqs: f64 = sqlx::query_scalar(
                    "SELECT value FROM step_metrics WHERE run_id = $1 AND step = $2
                     AND name = 'batch/reflection_sequences'",
                )
                .bind(run)
                .bind(step + 1)
                .fetch_one(pool)
                .await
                .unwrap();
                // Candidate groups whose utilities are all equal (zero advantages) are left
                // out of Phase A; the rest train.
                let dropped: f64 = sqlx::query_scalar(
                    "SELECT value FROM step_metrics WHERE run_id = $1 AND step = $2
                     AND name = 'train/reflection_groups_dropped'",
                )
                .bind(run)
                .bind(step + 1)
                .fetch_one(pool)
                .await
                .unwrap();
                assert_eq!(seqs as i64 + 2 * dropped as i64, rows);
                let phase_a: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM step_metrics WHERE run_id = $1 AND step = $2
                     AND name LIKE 'train/reflection/%'",
                )
                .bind(run)
                .bind(step + 1)
                .fetch_one(pool)
                .await
                .unwrap();
                assert_eq!(
                    phase_a > 0,
                    seqs > 0.0,
                    "the trainer ran Phase A at step {} exactly when it had candidates",
                    step + 1
                );
            }
            "failed" => assert_eq!(rows, 0),
            other => panic!("job of step {step} left {other}"),
        }
    }
    let replay: Vec<(i32, f64)> = sqlx::query_as(
        "SELECT step, value FROM step_metrics WHERE run_id = $1 AND name = 'curriculum/phase'
         ORDER BY step",
    )
    .bind(run)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(replay, vec![(0, 0.0), (1, 1.0), (2, 0.0), (3, 1.0)]);
    // A replay rolls out exactly the tasks of the step it replays.
    let same: i64 = scalar(
        pool,
        "SELECT count(*) FROM steps a JOIN steps b ON b.run_id = a.run_id AND b.step = a.step + 1
         WHERE a.run_id = $1 AND a.step IN (0, 2) AND a.task_ids = b.task_ids",
        run,
    )
    .await;
    assert_eq!(same, 2);
}

fn orchestrator_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir.join("orchestrator");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p orchestrator` (cargo test --workspace does)",
        bin.display()
    );
    bin
}

async fn wait_for_ok<F, Fut>(_what: &str, limit: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t0 = Instant::now();
    while !f().await {
        if t0.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    true
}

async fn wait_for<F, Fut>(what: &str, limit: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t0 = Instant::now();
    while !f().await {
        assert!(t0.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn sigkill_mid_step_then_resume_loses_and_duplicates_nothing(pool: PgPool) {
    let tmp = tempfile::tempdir().unwrap();
    let world = tmp.path().join("world");
    write_world(&world);
    let model = model_dir(tmp.path(), &world);
    let (tr, addr) = start_trainer(&model, &tmp.path().join("ckpt"), "127.0.0.1:0").await;
    let url = format!("http://{addr}");
    let db = db_url(&pool);
    let cfg = config_file(tmp.path(), &world, &model, &db, &url);
    let bin = orchestrator_bin();
    let log = tmp.path().join("orchestrator.log");
    let spawn = |extra: &[&str]| {
        let mut c = std::process::Command::new(&bin);
        c.arg("run")
            .arg("--experiment")
            .arg("smoke")
            .arg("--config")
            .arg(&cfg)
            .args(extra)
            .env("DATABASE_URL", &db)
            .env_remove("ORCH_SET")
            .env_remove("ORCH_STEPS")
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap());
        c.spawn().unwrap()
    };
    let mut child = spawn(&[]);
    // Kill while step 1 or 2 is in flight (step 0 trained, a later step rolling out or judging).
    let started = wait_for_ok("step 1 to start", Duration::from_secs(240), || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM steps WHERE step >= 1 AND status <> 'completed'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
            > 0
    })
    .await;
    assert!(
        started,
        "the orchestrator never reached step 1: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(!status.success());
    let (exp, run): (Uuid, Uuid) = sqlx::query_as("SELECT experiment_id, id FROM runs")
        .fetch_one(&pool)
        .await
        .unwrap();
    let before: i64 = scalar(
        &pool,
        "SELECT count(*) FROM steps WHERE run_id = $1 AND status = 'completed'",
        run,
    )
    .await;
    assert!(before < STEPS, "killed before the end");
    // Wait off the runtime: the in-process trainer runs on this (current-thread) runtime.
    let resumed = spawn(&["--resume", &exp.to_string()]);
    let out = tokio::task::spawn_blocking(move || resumed.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "resume failed: {stdout}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(stdout.contains("completed, 4 of 4 steps"), "{stdout}");
    check_run(&pool, run, &tr.state).await;
    let done = scalar(
        &pool,
        "SELECT count(*) FROM reflection_jobs WHERE run_id = $1 AND status = 'done'",
        run,
    )
    .await;
    assert_eq!(
        done, 2,
        "the killed process's reflection work was redone, not lost"
    );
    let status: String = sqlx::query_scalar("SELECT status FROM runs WHERE id = $1")
        .bind(run)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status, "completed");
    // The final policy, exported with its model card: `orchestrator export` writes the card
    // from Postgres, `trainer export` the weights from the version's checkpoint.
    let export_dir = tmp.path().join("export");
    let mut export = std::process::Command::new(&bin);
    export
        .arg("export")
        .arg("--run")
        .arg(run.to_string())
        .arg("--out")
        .arg(&export_dir)
        .arg("--trainer-bin")
        .arg(env!("CARGO_BIN_EXE_trainer"))
        .arg("--checkpoint-root")
        .arg(tmp.path().join("ckpt"))
        .env("DATABASE_URL", &db);
    let out = tokio::task::spawn_blocking(move || export.output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        out.status.success(),
        "export failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let card = std::fs::read_to_string(export_dir.join("README.md")).unwrap();
    assert!(
        card.contains("## Evaluation") && card.contains("| **held-out** | **4** |"),
        "{card}"
    );
    assert!(card.contains("## Resolved configuration") && card.contains("[rollout]"));
    let weights =
        trainer::model::weights::read_model_dir(&export_dir, tch::Device::Cpu, tch::Kind::Float)
            .unwrap();
    assert!(!weights.is_empty());
    assert!(export_dir.join("tokenizer_config.json").exists());
    // The run was followed into TensorBoard event files under verl's names (issue 23 item 3).
    let mut events = Vec::new();
    let mut stack = vec![tmp.path().join("tb")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("events.out.tfevents.")
            {
                events.extend(std::fs::read(&p).unwrap());
            }
        }
    }
    let has = |tag: &str| events.windows(tag.len()).any(|w| w == tag.as_bytes());
    assert!(
        has("critic/score/mean") && has("actor/kl_loss") && has("timing_s/gen"),
        "event files hold the mapped metrics ({} bytes)",
        events.len()
    );
    dashboard_shows_the_run(&pool, exp, run).await;
    tr.task.abort();
}

/// The dashboard on this real run (4 trained steps, evaluations at versions 0, 2 and 4,
/// reflections and a bank): every page renders in chromium without errors, each stored metric
/// is one drawn series, and the evaluation, reflection and bank pages show what was stored.
async fn dashboard_shows_the_run(pool: &PgPool, exp: Uuid, run: Uuid) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = orchestrator::pipeline::dashboard::router(pool.clone(), None);
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let traj: Uuid = sqlx::query_scalar(
        "SELECT id FROM trajectories WHERE run_id = $1 ORDER BY step DESC, sample_index LIMIT 1",
    )
    .bind(run)
    .fetch_one(pool)
    .await
    .unwrap();
    let names = scalar(
        pool,
        "SELECT count(DISTINCT name) FROM step_metrics WHERE run_id = $1",
        run,
    )
    .await;
    let subsets = scalar(
        pool,
        "SELECT count(DISTINCT subset) FROM evaluations WHERE run_id = $1",
        run,
    )
    .await;
    let reflections = scalar(
        pool,
        "SELECT count(*) FROM reflections WHERE run_id = $1",
        run,
    )
    .await;
    let pages = [
        ("runs", "#/".to_string()),
        ("metrics", format!("#/run/{run}")),
        ("steps", format!("#/run/{run}/steps")),
        ("step", format!("#/run/{run}/step/3")),
        ("trajectory", format!("#/trajectory/{traj}")),
        ("evaluations", format!("#/run/{run}/evaluations")),
        ("rubrics", format!("#/run/{run}/rubrics")),
        ("reflections", format!("#/run/{run}/reflections")),
        ("bank", format!("#/run/{run}/bank")),
        ("config", format!("#/run/{run}/config")),
        ("experiment", format!("#/experiment/{exp}")),
    ];
    let out = browser::workspace().join("target/dashboard-screens/pipeline-run");
    let report = browser::browse(&format!("http://{addr}"), &out, &pages).await;
    for (name, _) in &pages {
        let p = &report["pages"][name];
        for key in ["console", "errors", "failed", "errorText"] {
            assert_eq!(p[key], serde_json::json!([]), "{name}: {p}");
        }
    }
    let charts = report["pages"]["metrics"]["charts"].as_array().unwrap();
    let series: i64 = charts.iter().map(|c| c["series"].as_i64().unwrap()).sum();
    assert_eq!(series, names, "one series per stored metric");
    for c in charts {
        assert!(c["inked"].as_i64().unwrap() > 500, "{c}");
        assert!(c["points"].as_i64().unwrap() >= 1, "{c}");
    }
    assert!(
        charts.iter().any(|c| c["points"].as_i64().unwrap() == 4),
        "four trained steps on the x axis"
    );
    let evals = report["pages"]["evaluations"]["charts"].as_array().unwrap();
    assert_eq!(
        evals.len() as i64,
        subsets,
        "one chart per evaluated subset"
    );
    assert!(
        evals.iter().all(|c| c["points"] == 3),
        "versions 0, 2, 4: {evals:?}"
    );
    let text = report["pages"]["reflections"]["text"].as_str().unwrap();
    assert!(
        reflections > 0 && !text.contains("No reflection candidates"),
        "{text}"
    );
    let items = scalar(
        pool,
        "SELECT count(*) FROM rubric_bank WHERE run_id = $1",
        run,
    )
    .await;
    let bank = report["pages"]["bank"]["text"].as_str().unwrap();
    assert!(bank.contains(&format!("\n{items} items\n")), "{bank}");
    server.abort();
}

/// A test's world, its tiny model, an in-process trainer (any port, checkpointing under
/// `ckpt`) and the run's config file pointing at both.
struct Fixture {
    _tmp: tempfile::TempDir,
    model: PathBuf,
    ckpt: PathBuf,
    trainer: Trainer,
    addr: String,
    file: PathBuf,
}

async fn fixture(pool: &PgPool) -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let world = tmp.path().join("world");
    write_world(&world);
    let model = model_dir(tmp.path(), &world);
    let ckpt = tmp.path().join("ckpt");
    let (trainer, addr) = start_trainer(&model, &ckpt, "127.0.0.1:0").await;
    let file = config_file(
        tmp.path(),
        &world,
        &model,
        &db_url(pool),
        &format!("http://{addr}"),
    );
    Fixture {
        _tmp: tmp,
        model,
        ckpt,
        trainer,
        addr,
        file,
    }
}

/// A run of the `full` recipe on the smoke preset overlaid with `file`, built in-process.
async fn full_recipe_run(
    pool: &PgPool,
    file: PathBuf,
) -> (
    Uuid,
    orchestrator::pipeline::Pipeline,
    orchestrator::domain::config::Config,
) {
    use orchestrator::domain::config::{Config, Overrides};
    let cfg = Config::load(
        "smoke",
        &Overrides {
            file: Some(file),
            ..Default::default()
        },
    )
    .unwrap();
    let exp = orchestrator::infra::db::runs::create_experiment(pool, "t", "smoke", &cfg.snapshot())
        .await
        .unwrap();
    let run =
        orchestrator::infra::db::runs::create_run(pool, exp, "full", "full", &cfg.snapshot(), 9)
            .await
            .unwrap();
    let p = full_recipe_pipeline(pool, &cfg, run).await;
    (run, p, cfg)
}

/// The in-process pipeline of an existing `full` run (a fresh start or a resume).
async fn full_recipe_pipeline(
    pool: &PgPool,
    cfg: &orchestrator::domain::config::Config,
    run: Uuid,
) -> orchestrator::pipeline::Pipeline {
    let common = orchestrator::pipeline::setup::common(cfg, pool)
        .await
        .unwrap();
    orchestrator::pipeline::setup::pipeline(
        cfg,
        pool,
        &common,
        run,
        orchestrator::domain::config::Recipe::Full,
        cfg.experiment.seed,
    )
    .await
    .unwrap()
}

/// Run an in-process pipeline to its end (no cancellation) within `limit`.
async fn run_to_end(
    p: orchestrator::pipeline::Pipeline,
    limit: Duration,
) -> orchestrator::pipeline::Outcome {
    tokio::time::timeout(
        limit,
        Arc::new(p).run(
            tokio_util::sync::CancellationToken::new(),
            indicatif::ProgressBar::hidden(),
        ),
    )
    .await
    .expect("run finished in time")
    .unwrap()
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn trainer_killed_and_restarted_mid_run_the_run_completes(pool: PgPool) {
    let Fixture {
        _tmp,
        model,
        ckpt,
        trainer: first,
        addr,
        file,
    } = fixture(&pool).await;
    let (run, p, _) = full_recipe_run(&pool, file).await;
    let cancel = tokio_util::sync::CancellationToken::new();
    let job = tokio::spawn(Arc::new(p).run(cancel.clone(), indicatif::ProgressBar::hidden()));
    // Kill the trainer once a checkpoint exists (after step 1) and step 2 is under way.
    wait_for("step 1 trained", Duration::from_secs(240), || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM checkpoints")
            .fetch_one(&pool)
            .await
            .unwrap()
            > 0
    })
    .await;
    first.task.abort();
    drop(first);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A fresh process: base weights, no session; the pipeline must restore and replay.
    let (second, _) = start_trainer(&model, &ckpt, &addr).await;
    let outcome = tokio::time::timeout(Duration::from_secs(300), job)
        .await
        .expect("run finished in time")
        .unwrap()
        .unwrap();
    assert_eq!(outcome.completed, STEPS as u32);
    assert!(!outcome.interrupted);
    check_run(&pool, run, &second.state).await;
    let session = second.state.policy.lock().map(|p| p.version).unwrap();
    assert_eq!(session, STEPS);
    second.task.abort();
}

/// `max_staleness = 0` is strictly sequential: every step rolls out on the policy trained on all
/// steps before it, and a step's reflection job finishes (inline, timed) before the next step's
/// rollout starts, instead of running beside it.
#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn strictly_sequential_mode_finishes_each_reflection_before_the_next_rollout(pool: PgPool) {
    let Fixture {
        _tmp,
        trainer: tr,
        file,
        ..
    } = fixture(&pool).await;
    edit_config(&file, "max_staleness = 1", "max_staleness = 0");
    let (run, p, cfg) = full_recipe_run(&pool, file).await;
    assert_eq!(cfg.pipeline.max_staleness, 0);
    let outcome = run_to_end(p, Duration::from_secs(300)).await;
    assert_eq!(outcome.completed, STEPS as u32);
    check_run(&pool, run, &tr.state).await;
    let versions: Vec<(i32, i32)> =
        sqlx::query_as("SELECT step, policy_version FROM steps WHERE run_id = $1 ORDER BY step")
            .bind(run)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        versions,
        (0..STEPS as i32).map(|s| (s, s)).collect::<Vec<_>>(),
        "every step rolls out on the policy trained on all steps before it"
    );
    // Reflection jobs (new-batch steps 0 and 2) end before the next step's rollout begins.
    let order: Vec<(i32, bool)> = sqlx::query_as(
        "SELECT j.step, j.finished_at <= s.started_at
         FROM reflection_jobs j JOIN steps s ON s.run_id = j.run_id AND s.step = j.step + 1
         WHERE j.run_id = $1 ORDER BY j.step",
    )
    .bind(run)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(order, vec![(0, true), (2, true)]);
    assert_eq!(
        overlapping_steps(&pool, run).await,
        vec![0.0; STEPS as usize]
    );
    let inline: Vec<(i32, f64)> = sqlx::query_as(
        "SELECT step, value FROM step_metrics
         WHERE run_id = $1 AND name = 'time/reflection_inline_s' ORDER BY step",
    )
    .bind(run)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(inline.len(), STEPS as usize);
    for (s, secs) in inline {
        assert_eq!(
            secs > 0.0,
            s % 2 == 0,
            "step {s}: inline reflection {secs} s"
        );
    }
    // A crash during the final evaluation: the run is complete but v4 was never stored. The
    // resumed run trains nothing and evaluates v4 exactly once.
    sqlx::query("DELETE FROM evaluations WHERE run_id = $1 AND policy_version = 4")
        .bind(run)
        .execute(&pool)
        .await
        .unwrap();
    let again = full_recipe_pipeline(&pool, &cfg, run).await;
    let outcome = run_to_end(again, Duration::from_secs(120)).await;
    assert_eq!(
        (outcome.completed, outcome.completed_now),
        (STEPS as u32, 0)
    );
    check_run(&pool, run, &tr.state).await;
    tr.task.abort();
}

/// `rollout/overlapping_steps` by step: the earlier steps still rolling out when each started.
async fn overlapping_steps(pool: &PgPool, run: Uuid) -> Vec<f64> {
    sqlx::query_scalar(
        "SELECT value FROM step_metrics WHERE run_id = $1 AND name = 'rollout/overlapping_steps'
         ORDER BY step",
    )
    .bind(run)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// `pipeline.overlap_rollouts` with `max_staleness = 2`: a step may start before the one before
/// it is committed (its staleness bound allows that at once), and it then runs in the same pool
/// of trajectory slots beside it. The run still commits, judges and trains every step exactly
/// once and in order, within the staleness bound.
#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn overlapping_rollouts_start_a_step_beside_the_one_before_and_keep_the_order(pool: PgPool) {
    let Fixture {
        _tmp,
        trainer: tr,
        file,
        ..
    } = fixture(&pool).await;
    edit_config(
        &file,
        "max_staleness = 1",
        "max_staleness = 2\noverlap_rollouts = true",
    );
    let (run, p, cfg) = full_recipe_run(&pool, file.clone()).await;
    assert!(cfg.pipeline.overlap_rollouts);
    let outcome = run_to_end(p, Duration::from_secs(300)).await;
    assert_eq!(outcome.completed, STEPS as u32);
    check_run_at(&pool, run, &tr.state, 2).await;
    // Steps commit in order: each step's rollout metrics (written when it is committed) come
    // after the previous step's.
    let committed: Vec<(i32, bool)> = sqlx::query_as(
        "SELECT m.step, m.recorded_at > p.recorded_at FROM step_metrics m
         JOIN step_metrics p ON p.run_id = m.run_id AND p.step = m.step - 1
              AND p.name = 'time/rollout_s'
         WHERE m.run_id = $1 AND m.name = 'time/rollout_s' ORDER BY m.step",
    )
    .bind(run)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        committed,
        (1..STEPS as i32).map(|s| (s, true)).collect::<Vec<_>>()
    );
    // Some step started while the one before it was still rolling out, and says so.
    let early: Vec<i32> = sqlx::query_scalar(
        "SELECT s.step FROM steps s
         JOIN step_metrics p ON p.run_id = s.run_id AND p.step = s.step - 1
              AND p.name = 'time/rollout_s'
         WHERE s.run_id = $1 AND s.started_at < p.recorded_at ORDER BY s.step",
    )
    .bind(run)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(!early.is_empty(), "no step started beside the one before");
    let behind = overlapping_steps(&pool, run).await;
    for s in &early {
        assert!(behind[*s as usize] >= 1.0, "step {s}: {behind:?}");
    }
    tr.task.abort();
}

/// `trainer.reflection_lr_scale = 0` leaves Phase A out of a `full` run: the reflection jobs
/// still run and write the bank, but no candidate is assigned to a step or sent, the trainer
/// runs no Phase A, and the run completes with a version per step.
#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn phase_a_left_out_at_rate_scale_zero_the_bank_is_still_written(pool: PgPool) {
    let Fixture {
        _tmp,
        trainer: tr,
        addr,
        file,
        ..
    } = fixture(&pool).await;
    let url = format!("http://{addr}");
    let text = std::fs::read_to_string(&file).unwrap();
    let text = text.replace(
        &format!("[trainer]\nurl = \"{url}\"\n"),
        &format!("[trainer]\nurl = \"{url}\"\nreflection_lr_scale = 0.0\n"),
    );
    assert!(text.contains("reflection_lr_scale = 0.0"));
    std::fs::write(&file, text).unwrap();
    let (run, p, cfg) = full_recipe_run(&pool, file).await;
    assert_eq!(cfg.trainer.settings.reflection_lr_scale, 0.0);
    let outcome = run_to_end(p, Duration::from_secs(300)).await;
    assert_eq!(outcome.completed, STEPS as u32);
    let done = scalar(
        &pool,
        "SELECT count(*) FROM reflection_jobs WHERE run_id = $1 AND status = 'done'",
        run,
    )
    .await;
    let candidates = scalar(
        &pool,
        "SELECT count(*) FROM reflections WHERE run_id = $1",
        run,
    )
    .await;
    assert!(
        done > 0 && candidates > 0,
        "jobs {done}, candidates {candidates}"
    );
    let trained = scalar(
        &pool,
        "SELECT count(*) FROM reflections WHERE run_id = $1 AND trained_step IS NOT NULL",
        run,
    )
    .await;
    assert_eq!(trained, 0, "no candidate assigned to a step");
    let sent: Vec<f64> = sqlx::query_scalar(
        "SELECT value FROM step_metrics WHERE run_id = $1
         AND name = 'batch/reflection_sequences' ORDER BY step",
    )
    .bind(run)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(sent, vec![0.0; STEPS as usize]);
    let phase_a = scalar(
        &pool,
        "SELECT count(*) FROM step_metrics WHERE run_id = $1 AND name LIKE 'train/reflection/%'",
        run,
    )
    .await;
    assert_eq!(phase_a, 0, "the trainer ran no Phase A");
    let banked = scalar(
        &pool,
        "SELECT count(*) FROM reflections WHERE run_id = $1 AND valid",
        run,
    )
    .await;
    let bank = scalar(
        &pool,
        "SELECT count(*) FROM rubric_bank WHERE run_id = $1",
        run,
    )
    .await;
    assert_eq!(
        bank > 0,
        banked > 0,
        "valid candidates {banked}, bank items {bank}"
    );
    assert_eq!(tr.state.policy.lock().map(|p| p.version).unwrap(), STEPS);
    tr.task.abort();
}

/// Off-policy guidance (`credit.guidance_demos`) on a real run: the offline teacher's
/// demonstrations (`orchestrator sft-data`) join their tasks' groups as one more member each
/// (server `teacher`, sample index n), are judged with the policy's samples, and are trained
/// on with a positive advantage where the policy's samples score below them, while the step's
/// reward metrics stay the policy's own.
#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn guidance_demonstrations_join_their_groups_and_are_trained(pool: PgPool) {
    let tmp = tempfile::tempdir().unwrap();
    let world = tmp.path().join("world");
    write_world(&world);
    let model = model_dir(tmp.path(), &world);
    // Prompt (~1,800 tokens at this vocabulary) and a demonstration overrun the shared 4,096
    // positions; RoPE has no weights, so raising the limit changes nothing else.
    let cfg_path = model.join("config.json");
    let mut mcfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    mcfg["max_position_embeddings"] = serde_json::json!(8192);
    std::fs::write(&cfg_path, mcfg.to_string()).unwrap();
    let (tr, addr) = start_trainer(&model, &tmp.path().join("ckpt"), "127.0.0.1:0").await;
    let db = db_url(&pool);
    let file = config_file(tmp.path(), &world, &model, &db, &format!("http://{addr}"));
    // A budget the demonstrations fit (the shared file's 48 tokens is for speed): the teacher
    // keeps 4 of the 12 tasks here, each about 2,000 completion tokens at this 400-token
    // vocabulary.
    let text =
        std::fs::read_to_string(&file)
            .unwrap()
            .replacen("max_tokens = 48", "max_tokens = 2304", 1);
    std::fs::write(&file, &text).unwrap();
    use orchestrator::domain::config::{Config, Overrides, Recipe};
    let load = |file: &Path| {
        Config::load(
            "smoke",
            &Overrides {
                file: Some(file.to_path_buf()),
                ..Default::default()
            },
        )
        .unwrap()
    };
    // The world's index, which the teacher searches.
    orchestrator::pipeline::setup::ensure_world(&load(&file)).unwrap();
    let demos = tmp.path().join("demos.jsonl");
    let mut sft = std::process::Command::new(orchestrator_bin());
    sft.args(["sft-data", "--experiment", "smoke", "--config"])
        .arg(&file)
        .arg("--out")
        .arg(&demos)
        .env("DATABASE_URL", &db)
        .env_remove("ORCH_SET");
    let out = tokio::task::spawn_blocking(move || sft.output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        out.status.success(),
        "sft-data: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = std::fs::read_to_string(&demos).unwrap().lines().count();
    assert!(written > 0, "the teacher wrote demonstrations");
    std::fs::write(
        &file,
        format!(
            "{text}\n[credit]\nguidance_demos = \"{}\"\n",
            demos.display()
        ),
    )
    .unwrap();
    let cfg = load(&file);
    assert_eq!(cfg.credit.guidance_demos.as_deref(), Some(demos.as_path()));
    let exp =
        orchestrator::infra::db::runs::create_experiment(&pool, "g", "smoke", &cfg.snapshot())
            .await
            .unwrap();
    let run = orchestrator::infra::db::runs::create_run(
        &pool,
        exp,
        "ss-grpo",
        "ss-grpo",
        &cfg.snapshot(),
        9,
    )
    .await
    .unwrap();
    let common = orchestrator::pipeline::setup::common(&cfg, &pool)
        .await
        .unwrap();
    assert!(!common.guidance.is_empty());
    let p = orchestrator::pipeline::setup::pipeline(
        &cfg,
        &pool,
        &common,
        run,
        Recipe::SsGrpo,
        cfg.experiment.seed,
    )
    .await
    .unwrap();
    let outcome = run_to_end(p, Duration::from_secs(600)).await;
    assert_eq!(outcome.completed, STEPS as u32);

    let metric = |name: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_as::<_, (i32, f64)>(
                "SELECT step, value FROM step_metrics WHERE run_id = $1 AND name = $2
                 ORDER BY step",
            )
            .bind(run)
            .bind(name)
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    // Each step's demonstrations are stored, one per guided task, as member n of its group.
    let teacher: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT step, count(*) FROM trajectories WHERE run_id = $1 AND server = 'teacher'
         GROUP BY step ORDER BY step",
    )
    .bind(run)
    .fetch_all(&pool)
    .await
    .unwrap();
    let added = metric("rollout/guidance").await;
    assert_eq!(added.len(), STEPS as usize);
    assert_eq!(
        teacher,
        added
            .iter()
            .filter(|(_, v)| *v > 0.0)
            .map(|&(s, v)| (s, v as i64))
            .collect::<Vec<_>>()
    );
    let total: i64 = teacher.iter().map(|x| x.1).sum();
    assert!(
        total > 0,
        "some demonstrations fit the budget: added {added:?}, over budget {:?}, failed {:?}",
        metric("rollout/guidance_over_budget").await,
        metric("rollout/guidance_failed").await
    );
    let misplaced = scalar(
        &pool,
        "SELECT count(*) FROM trajectories t WHERE t.run_id = $1 AND t.server = 'teacher'
         AND (t.sample_index <> 2 OR (SELECT count(*) FROM trajectories o
              WHERE o.run_id = t.run_id AND o.step = t.step AND o.task_id = t.task_id
              AND o.server <> 'teacher') <> 2)",
        run,
    )
    .await;
    assert_eq!(misplaced, 0, "member n of a group of n policy samples");
    let judged = scalar(
        &pool,
        "SELECT count(*) FROM stage_scores s JOIN trajectories t ON t.id = s.trajectory_id
         WHERE t.run_id = $1 AND t.server = 'teacher'",
        run,
    )
    .await;
    assert_eq!(judged, total * 4, "four stage scores per demonstration");
    let mismatched = scalar(
        &pool,
        "SELECT count(*) FROM trajectories WHERE run_id = $1 AND server = 'teacher'
         AND (parsed->'guidance'->>'tool_output_mismatch')::int <> 0",
        run,
    )
    .await;
    assert_eq!(
        mismatched, 0,
        "the replay's tools return what the teacher saw"
    );
    // The teacher answers from the evidence; the random policy does not: its demonstrations
    // score above the policy's samples and are trained on with a positive advantage.
    let reward = metric("reward/mean").await;
    let guided = metric("reward/guidance").await;
    assert!(!guided.is_empty());
    for (s, g) in &guided {
        let own = reward.iter().find(|(t, _)| t == s).unwrap().1;
        assert!(*g > own, "step {s}: demonstrations {g} vs policy {own}");
    }
    let trained: f64 = metric("batch/guidance").await.iter().map(|x| x.1).sum();
    assert!(trained > 0.0, "demonstrations were in the trained batches");
    let adv = metric("batch/guidance_advantage").await;
    assert!(adv.iter().all(|(_, a)| *a > 0.0), "{adv:?}");
    // The trainer took every step; the policy's samples are what the trajectory count says.
    let own = scalar(
        &pool,
        "SELECT count(*) FROM trajectories WHERE run_id = $1 AND server <> 'teacher'",
        run,
    )
    .await;
    assert_eq!(own, STEPS * TASKS * N);
    assert_eq!(tr.state.policy.lock().unwrap().version, STEPS);
    tr.task.abort();
}
