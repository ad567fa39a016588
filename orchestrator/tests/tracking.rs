//! Experiment trackers end to end. TensorBoard: the hand-written event files are read back by
//! TensorBoard's own `EventAccumulator` (tags, steps, values to float32 precision). MLflow: a
//! real `mlflow server` (sqlite store) receives a live run's metrics, parameters, tags and final
//! status, and a resumed run continues the same MLflow run; a loopback fake MLflow that fails
//! for a while shows that tracker errors are counted and retried, never lost, and that the
//! token travels only as a Bearer header. The run side is real: a run registered from the smoke
//! preset in Postgres, its `step_metrics` written by the stages' own metric producers (judging
//! report, batch statistics, reflection job, trainer step), followed by `pipeline::tracking`.
//!
//! Needs the Python of `.venv` (scripts/python-env.sh: tensorboard, mlflow); set ORCH_PYTHON
//! to use another interpreter.
#![allow(clippy::disallowed_methods)] // reads Postgres directly to check what the product stored
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code fails loudly"
)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use common::database::db_url;
use common::python::python;
use orchestrator::domain::config::{Config, Overrides};
use orchestrator::domain::tracking::{EndStatus, Point};
use orchestrator::infra::db;
use orchestrator::infra::llm::RetryPolicy;
use orchestrator::infra::tracking::mlflow::MlflowClient;
use orchestrator::infra::tracking::tensorboard::EventWriter;
use orchestrator::pipeline::run::{PlannedRun, RunStatus, mark, register_experiment};
use orchestrator::pipeline::tracking::{RUN_ID_TAG, TrackStats, follow};
use serde_json::{Value, json};

const READ_BACK: &str = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
ea.Reload()
print(json.dumps({t: [[e.step, e.value, e.wall_time] for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}))
"#;

/// tag -> [(step, value, wall_time)] as TensorBoard reads the event files of `dir`.
fn tensorboard_read(dir: &Path) -> BTreeMap<String, Vec<(i64, f64, f64)>> {
    let out = Command::new(python())
        .args(["-c", READ_BACK])
        .arg(dir)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "reading the events with tensorboard failed (run scripts/python-env.sh, or set ORCH_PYTHON to a Python with tensorboard):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: BTreeMap<String, Vec<(i64, f64, f64)>> = serde_json::from_slice(&out.stdout).unwrap();
    v
}

/// The last value TensorBoard holds for each step of `tag`.
fn last_by_step(tb: &BTreeMap<String, Vec<(i64, f64, f64)>>, tag: &str) -> BTreeMap<i64, f64> {
    tb.get(tag)
        .unwrap_or_else(|| panic!("no tag {tag} in {:?}", tb.keys().collect::<Vec<_>>()))
        .iter()
        .map(|(s, v, _)| (*s, *v))
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1.0)
}

#[test]
fn tensorboard_reads_back_what_the_writer_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = EventWriter::create(dir.path()).unwrap();
    w.write_scalars(0, 1_700_000_000.25, &[("a/first", 0.5), ("b", -3.0)])
        .unwrap();
    let mut points = Vec::new();
    for step in [3i64, 1, 2, 1000] {
        for (k, tag) in ["critic/score/mean", "stage/reward/plan", "timing_s/gen"]
            .iter()
            .enumerate()
        {
            points.push(Point {
                step,
                tag: tag.to_string(),
                value: 0.1 * step as f64 + k as f64 + 1e-9,
                wall_ms: 1_700_000_100_000 + step,
            });
        }
    }
    assert_eq!(w.write_points(&points).unwrap(), 4, "one event per step");
    // Written a second time: a later value of a step reaches TensorBoard too.
    w.write_scalars(3, 1_700_000_200.0, &[("a/first", 7.0)])
        .unwrap();
    drop(w);
    let tb = tensorboard_read(dir.path());
    assert_eq!(
        tb.keys().cloned().collect::<Vec<_>>(),
        [
            "a/first",
            "b",
            "critic/score/mean",
            "stage/reward/plan",
            "timing_s/gen"
        ]
    );
    assert_eq!(tb["a/first"].len(), 2);
    assert_eq!(
        (tb["a/first"][0].0, tb["a/first"][0].1, tb["a/first"][0].2),
        (0, 0.5, 1_700_000_000.25)
    );
    assert_eq!((tb["a/first"][1].0, tb["a/first"][1].1), (3, 7.0));
    assert_eq!(tb["b"][0].1, -3.0);
    for (k, tag) in ["critic/score/mean", "stage/reward/plan", "timing_s/gen"]
        .iter()
        .enumerate()
    {
        let got = &tb[*tag];
        let steps: Vec<i64> = got.iter().map(|x| x.0).collect();
        assert_eq!(steps, [1, 2, 3, 1000], "{tag}: events in step order");
        for (step, value, wall) in got {
            let want = 0.1 * *step as f64 + k as f64 + 1e-9;
            assert_eq!(*value, f64::from(want as f32), "{tag}@{step}: float32");
            assert!(close(*wall, (1_700_000_100_000 + step) as f64 / 1000.0));
        }
    }
}

/// Metrics of one step as the stages record them (the stages' own producers).
fn stage_metrics(step: i32, reward: f64) -> Vec<(String, f64)> {
    use orchestrator::pipeline::batch::BatchStats;
    use orchestrator::pipeline::judging::StepReport;
    let report = StepReport {
        trajectories: 8,
        calls: 12,
        cost_usd: 0.25,
        mean_reward: reward,
        mean_stage_score: [0.1, 0.2, 0.3, reward],
        new_rubrics: 3,
        ..Default::default()
    };
    let mut m = report.metrics();
    let stats = BatchStats {
        tokens: 4000,
        groups: 2,
        groups_dropped: 1,
        staleness: 1.0,
        ..Default::default()
    };
    m.extend(stats.metrics());
    let train = wire::api::StepMetrics {
        loss: 0.125,
        kl: 0.01,
        clip_fraction: 0.05,
        entropy: 1.5,
        grad_norm: 0.75,
        lr: 2e-4,
        ..Default::default()
    };
    for (k, x) in orchestrator::infra::llm::trainer::named_metrics(&train) {
        m.push((format!("train/{k}"), x));
    }
    let job = orchestrator::domain::reflection::JobReport {
        candidates: 8,
        valid: 6,
        bank_writes: 2,
        ..Default::default()
    };
    m.extend(job.metrics());
    m.extend([
        ("time/rollout_s".to_string(), 10.0 + f64::from(step)),
        ("rollout/trajectories".to_string(), 8.0),
        ("rollout/model_tokens".to_string(), 800.0),
        ("rollout/parse_failures".to_string(), 1.0),
        ("rollout/tool_calls/research".to_string(), 5.0),
        ("brand/new metric:x".to_string(), 42.0),
    ]);
    m
}

/// The names the trackers must show for [`stage_metrics`], with the value at `reward`.
const EXPECTED_TAGS: &[&str] = &[
    "critic/score/mean",
    "stage/reward/answer",
    "stage/reward/plan",
    "stage/rubrics_active/plan",
    "stage/advantage_std/research",
    "stage/tool_calls/research",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/pg_clipfrac",
    "actor/entropy",
    "actor/grad_norm",
    "actor/lr",
    "perf/total_num_tokens",
    "timing_s/gen",
    "response_length/mean",
    "rubric/judge/cost_usd",
    "rubric/buffer/new",
    "rubric/train/groups_dropped",
    "rubric/pipeline/staleness",
    "rubric/reflection/valid_fraction",
    "rubric/rollout/parse_failures",
    "brand/new metric_x",
];

fn smoke_config(sets: &[String]) -> Config {
    Config::load(
        "smoke",
        &Overrides {
            sets: sets.to_vec(),
            ..Default::default()
        },
    )
    .unwrap()
}

async fn record(pool: &sqlx::PgPool, run: &PlannedRun, step: i32, reward: f64) {
    db::metrics::record(pool, run.id, step, &stage_metrics(step, reward))
        .await
        .unwrap();
}

/// `mlflow server` on a free loopback port (sqlite store), killed with its workers on drop.
struct MlflowServer {
    child: std::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl MlflowServer {
    fn start() -> Self {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mlflow = python().with_file_name("mlflow");
        let child = Command::new(&mlflow)
            .args(["server", "--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--workers", "1"])
            .arg("--backend-store-uri")
            .arg(format!(
                "sqlite:///{}",
                dir.path().join("mlflow.db").display()
            ))
            .arg("--default-artifact-root")
            .arg(dir.path().join("artifacts"))
            .stdout(std::fs::File::create(dir.path().join("server.log")).unwrap())
            .stderr(std::fs::File::create(dir.path().join("server.err")).unwrap())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} ({e}); run scripts/python-env.sh (mlflow)",
                    mlflow.display()
                )
            });
        Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        }
    }

    async fn wait_ready(&mut self) {
        let http = orchestrator::infra::llm::build_http(Duration::from_secs(2)).unwrap();
        for _ in 0..240 {
            if let Ok(Some(st)) = self.child.try_wait() {
                let err = std::fs::read_to_string(self._dir.path().join("server.err"))
                    .unwrap_or_default();
                panic!("mlflow server exited with {st}:\n{err}");
            }
            if let Ok(r) = http.get(format!("{}/health", self.url)).send().await
                && r.status().is_success()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        panic!("mlflow server did not answer within 120 s");
    }
}

impl Drop for MlflowServer {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

fn finished(stats: Option<TrackStats>) -> TrackStats {
    let stats = stats.expect("the follower finished in time");
    assert_eq!(stats.errors, 0, "{stats:?}");
    assert_eq!((stats.unsent, stats.dropped), (0, 0), "{stats:?}");
    stats
}

/// A run followed live into TensorBoard and a real MLflow server, paused, resumed (the same
/// MLflow run, a second event file) and finished; then exported post hoc by
/// `orchestrator track` into a fresh directory and MLflow experiment.
#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn a_followed_run_reaches_tensorboard_and_mlflow_and_resumes_into_the_same_run(
    pool: sqlx::PgPool,
) {
    let mut server = MlflowServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let tb_root = tmp.path().join("tb");
    let cfg = smoke_config(&[
        format!(
            "tracking.tensorboard_dir={:?}",
            tb_root.display().to_string()
        ),
        format!("tracking.mlflow_url={:?}", server.url),
        "tracking.poll_secs=1".into(),
    ]);
    let (_, runs) = register_experiment(&pool, &cfg, "smoke").await.unwrap();
    let run = runs[0].clone();
    server.wait_ready().await;

    let follower = follow(&pool, &cfg, run.id, &run.name, run.recipe.as_str()).unwrap();
    record(&pool, &run, 0, 0.5).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    record(&pool, &run, 1, 0.75).await;
    // A rerun of step 0 overwrites its reward: the trackers get the new value.
    db::metrics::record(&pool, run.id, 0, &[("reward/mean".into(), 0.625)])
        .await
        .unwrap();
    let first = finished(follower.finish(EndStatus::Killed).await);
    assert!(first.polls >= 2, "{first:?}");
    assert_eq!(first.event_files.len(), 1);
    let run_dir = first.event_files[0].parent().unwrap().to_path_buf();
    assert!(
        run_dir.starts_with(tb_root.join("smoke")),
        "{}",
        run_dir.display()
    );
    let mlflow_run = first.mlflow_run.clone().unwrap();

    // Resumed: the same MLflow run continues, a second event file joins the first.
    let follower = follow(&pool, &cfg, run.id, &run.name, run.recipe.as_str()).unwrap();
    record(&pool, &run, 2, 0.875).await;
    mark(&pool, run.id, RunStatus::Completed, None)
        .await
        .unwrap();
    let second = finished(follower.finish(EndStatus::Finished).await);
    assert_eq!(second.mlflow_run.as_deref(), Some(mlflow_run.as_str()));
    assert_eq!(second.event_files.len(), 1);
    assert_eq!(second.event_files[0].parent().unwrap(), run_dir);

    // TensorBoard, as TensorBoard reads it.
    let tb = tensorboard_read(&run_dir);
    for tag in EXPECTED_TAGS {
        assert!(
            tb.contains_key(*tag),
            "TensorBoard lacks {tag}: {:?}",
            tb.keys()
        );
    }
    assert!(
        !tb.keys()
            .any(|k| k.starts_with("reward/") || k.starts_with("train/")),
        "our raw names are mapped: {:?}",
        tb.keys()
    );
    let score = last_by_step(&tb, "critic/score/mean");
    assert_eq!(score, BTreeMap::from([(0, 0.625), (1, 0.75), (2, 0.875)]));
    assert_eq!(last_by_step(&tb, "response_length/mean")[&1], 100.0);
    assert_eq!(
        last_by_step(&tb, "actor/lr")[&2],
        f64::from(2e-4f32),
        "float32"
    );

    // MLflow, read back through its REST API.
    let client = MlflowClient::new(&server.url, RetryPolicy::none()).unwrap();
    let exp = client.experiment_id("smoke").await.unwrap();
    assert_eq!(
        client
            .find_run(&exp, RUN_ID_TAG, &run.id.to_string())
            .await
            .unwrap()
            .as_deref(),
        Some(mlflow_run.as_str())
    );
    let got = client
        .get("runs/get", json!({ "run_id": mlflow_run }))
        .await
        .unwrap();
    assert_eq!(got["run"]["info"]["status"], "FINISHED");
    assert_eq!(got["run"]["info"]["run_name"], run.name);
    let kv = |field: &str| -> BTreeMap<String, String> {
        got["run"]["data"][field]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| {
                (
                    x["key"].as_str().unwrap().to_string(),
                    x["value"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let params = kv("params");
    assert_eq!(params["rollout.n"], cfg.rollout.n.to_string());
    assert_eq!(params["experiment.name"], "smoke");
    assert!(params.len() > 40, "the whole config: {}", params.len());
    assert_eq!(kv("tags")["rubricem.recipe"], run.recipe.as_str());
    let latest: BTreeMap<String, f64> = got["run"]["data"]["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["key"].as_str().unwrap().to_string(),
                m["value"].as_f64().unwrap(),
            )
        })
        .collect();
    for tag in EXPECTED_TAGS {
        assert!(
            latest.contains_key(*tag),
            "MLflow lacks {tag}: {:?}",
            latest.keys()
        );
    }
    assert_eq!(
        latest["critic/score/mean"], 0.875,
        "the latest step's value"
    );
    let history = client
        .get(
            "metrics/get-history",
            json!({ "run_id": mlflow_run, "metric_key": "critic/score/mean" }),
        )
        .await
        .unwrap();
    let mut hist: Vec<(i64, i64, f64)> = history["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["step"].as_i64().unwrap(),
                m["timestamp"].as_i64().unwrap(),
                m["value"].as_f64().unwrap(),
            )
        })
        .collect();
    hist.sort_by_key(|h| (h.0, h.1));
    let last: BTreeMap<i64, f64> = hist.iter().map(|h| (h.0, h.2)).collect();
    assert_eq!(last, BTreeMap::from([(0, 0.625), (1, 0.75), (2, 0.875)]));

    // Post hoc: the whole run, by EXPERIMENT/NAME, into a fresh directory and experiment.
    let out_dir = tmp.path().join("posthoc");
    let out = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .args(["track", "--run", &format!("smoke/{}", run.name)])
        .arg("--tensorboard")
        .arg(&out_dir)
        .args([
            "--mlflow-url",
            &server.url,
            "--mlflow-experiment",
            "posthoc",
        ])
        .args(["--database-url", &db_url(&pool).await])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "orchestrator track failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let files: Vec<PathBuf> = walk(&out_dir);
    assert_eq!(files.len(), 1, "{files:?}");
    let post = tensorboard_read(files[0].parent().unwrap());
    assert_eq!(
        post.keys().collect::<Vec<_>>(),
        tb.keys().collect::<Vec<_>>()
    );
    assert_eq!(last_by_step(&post, "critic/score/mean"), score);
    let exp = client.experiment_id("posthoc").await.unwrap();
    let posthoc_run = client
        .find_run(&exp, RUN_ID_TAG, &run.id.to_string())
        .await
        .unwrap()
        .expect("the export made a run");
    let got = client
        .get("runs/get", json!({ "run_id": posthoc_run }))
        .await
        .unwrap();
    assert_eq!(got["run"]["info"]["status"], "FINISHED", "from runs.status");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// What the fake MLflow saw.
#[derive(Default)]
struct FakeState {
    /// `runs/log-batch` requests still to refuse with 503.
    fail_log_batch: Mutex<u32>,
    metrics: Mutex<Vec<Value>>,
    params: Mutex<Vec<Value>>,
    statuses: Mutex<Vec<String>>,
    auth: Mutex<Vec<String>>,
    calls: Mutex<BTreeMap<String, u64>>,
}

fn fake_mlflow(state: Arc<FakeState>) -> axum::Router {
    use axum::routing::{get, post};
    type S = State<Arc<FakeState>>;
    fn seen(s: &FakeState, h: &HeaderMap, kind: &str) {
        common::loopback::tally(&s.calls, kind);
        if let Some(a) = h.get("authorization") {
            s.auth.lock().unwrap().push(a.to_str().unwrap().to_string());
        }
    }
    axum::Router::new()
        .route(
            "/api/2.0/mlflow/experiments/get-by-name",
            get(|State(s): S, h: HeaderMap| async move {
                seen(&s, &h, "get-by-name");
                (
                    StatusCode::NOT_FOUND,
                    Json(json!({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no"})),
                )
            }),
        )
        .route(
            "/api/2.0/mlflow/experiments/create",
            post(|State(s): S, h: HeaderMap| async move {
                seen(&s, &h, "create-experiment");
                Json(json!({"experiment_id": "7"}))
            }),
        )
        .route(
            "/api/2.0/mlflow/runs/search",
            post(|State(s): S, h: HeaderMap| async move {
                seen(&s, &h, "search");
                Json(json!({}))
            }),
        )
        .route(
            "/api/2.0/mlflow/runs/create",
            post(|State(s): S, h: HeaderMap| async move {
                seen(&s, &h, "create-run");
                Json(json!({"run": {"info": {"run_id": "r1"}}}))
            }),
        )
        .route(
            "/api/2.0/mlflow/runs/log-batch",
            post(
                |State(s): S, h: HeaderMap, Json(b): Json<Value>| async move {
                    seen(&s, &h, "log-batch");
                    {
                        let mut f = s.fail_log_batch.lock().unwrap();
                        if *f > 0 {
                            *f -= 1;
                            return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({})));
                        }
                    }
                    if let Some(m) = b["metrics"].as_array() {
                        s.metrics.lock().unwrap().extend(m.iter().cloned());
                    }
                    if let Some(p) = b["params"].as_array() {
                        s.params.lock().unwrap().extend(p.iter().cloned());
                    }
                    (StatusCode::OK, Json(json!({})))
                },
            ),
        )
        .route(
            "/api/2.0/mlflow/runs/update",
            post(
                |State(s): S, h: HeaderMap, Json(b): Json<Value>| async move {
                    seen(&s, &h, "update");
                    s.statuses
                        .lock()
                        .unwrap()
                        .push(b["status"].as_str().unwrap_or("").to_string());
                    Json(json!({}))
                },
            ),
        )
        .with_state(state)
}

/// MLflow refusing every write for a while: the run is not held up, the errors are counted,
/// and every value arrives once it answers again; the export command sends its token only as
/// a Bearer header and never prints it.
#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn a_failing_mlflow_loses_nothing_and_the_token_stays_in_the_header(pool: sqlx::PgPool) {
    let state = Arc::new(FakeState::default());
    // The first poll's request and its 3 retries, then the next poll's and its 3 retries.
    *state.fail_log_batch.lock().unwrap() = 8;
    let fake = common::loopback::Loopback::serve(fake_mlflow(state.clone())).await;
    let url = format!("http://{}", fake.addr);
    let cfg = smoke_config(&[
        format!("tracking.mlflow_url={url:?}"),
        "tracking.poll_secs=1".into(),
    ]);
    let (_, runs) = register_experiment(&pool, &cfg, "smoke").await.unwrap();
    let run = runs[0].clone();
    record(&pool, &run, 0, 0.5).await;
    let follower = follow(&pool, &cfg, run.id, &run.name, run.recipe.as_str()).unwrap();
    let t0 = std::time::Instant::now();
    record(&pool, &run, 1, 0.25).await;
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "recording is not held up by the tracker"
    );
    // Until the fake has refused its 8 writes (the follower retries them poll after poll).
    for _ in 0..200 {
        if *state.fail_log_batch.lock().unwrap() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = follower.finish(EndStatus::Failed).await.unwrap();
    assert!(stats.errors >= 2, "{stats:?}");
    assert_eq!((stats.unsent, stats.dropped), (0, 0), "{stats:?}");
    let metrics = state.metrics.lock().unwrap().clone();
    let per_step = |step: i64| {
        metrics
            .iter()
            .filter(|m| m["step"] == step)
            .map(|m| m["key"].as_str().unwrap().to_string())
            .collect::<std::collections::BTreeSet<_>>()
    };
    let names = stage_metrics(0, 0.0).len() + 1; // + response_length/mean
    assert_eq!(per_step(0).len(), names);
    assert_eq!(per_step(1).len(), names);
    assert!(
        metrics
            .iter()
            .all(|m| m["timestamp"].as_i64().unwrap() > 1_600_000_000_000)
    );
    assert_eq!(*state.statuses.lock().unwrap(), ["FAILED"]);
    assert!(!state.params.lock().unwrap().is_empty());
    assert!(state.auth.lock().unwrap().is_empty(), "no token, no header");

    // The export command with a token in the environment (run off the test's runtime, which
    // serves the fake).
    let token = "mlflow-tok-0123456789abcdef";
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_orchestrator"));
    cmd.args(["track", "--run", &run.id.to_string(), "--mlflow-url", &url])
        .args(["--database-url", &db_url(&pool).await])
        .env("MLFLOW_TRACKING_TOKEN", token)
        .env("RUST_LOG", "debug");
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(!text.contains(token), "the token leaked: {text}");
    let auth = state.auth.lock().unwrap().clone();
    assert!(!auth.is_empty());
    assert!(
        auth.iter().all(|a| a == &format!("Bearer {token}")),
        "{auth:?}"
    );
}
