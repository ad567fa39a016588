//! The service suite of `trainer serve`, written against its HTTP surface alone so that the
//! same tests run against one in-process server (tests/serve.rs) and against the launcher with
//! two gloo ranks on CPU (tests/serve_ranks.rs, `--nproc-per-node 2`): generation through the
//! orchestrator's own client (token ids and logprobs equal the forward pass read back through
//! `prompt_logprobs`, greedy tokens are its argmax); train steps follow the sign of the
//! advantage and a concurrent step gets 409; LoRA publishing to a fake vLLM makes exactly the
//! load and unload calls and keeps the previous version on failure; checkpoint + restart
//! continues with parameters identical to a run that never stopped; published full weights
//! and a restored policy reach a second server; settings are applied, echoed and checked on
//! every step.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;

pub use super::common::post_json;
use super::common::{model_dir, plain, serve_in_process, tiny_config};
use trainer::publish::{PublishConfig, PublishTarget, Publisher, ServerKind};
use trainer::service::{AppState, load};

/// The suite's tests as `#[tokio::test]`s against `$launch` (invoked at a test crate's root,
/// where `serve_suite` is declared).
macro_rules! suite_tests {
    ($launch:expr) => {
        $crate::serve_suite::suite_tests!(@each $launch;
            generation_through_the_orchestrator_client_matches_the_forward_pass,
            train_steps_over_http_follow_the_advantage_sign_and_refuse_concurrency,
            publishing_records_exact_calls_and_keeps_the_previous_version_on_failure,
            checkpoint_restart_next_step_equals_a_run_that_never_stopped,
            a_policy_server_receives_published_full_weights_and_the_restored_policy,
            settings_are_applied_echoed_and_checked_on_every_step,
            a_request_extending_a_finished_one_reuses_its_keys_and_values,
        );
    };
    (@each $launch:expr; $($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            $crate::serve_suite::$name($launch).await;
        }
    )*};
}
pub(crate) use suite_tests;

/// How a server under test runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    /// On the test's runtime, one process.
    InProcess,
    /// The same with the policy on a device (tests/cuda.rs: the GPU).
    InProcessOn(tch::Device),
    /// `trainer serve --nproc-per-node N`: the launcher and N ranks (gloo, one thread each).
    Ranks(usize),
}

impl Launch {
    /// An in-process server on the same device as this launch.
    pub fn serving(self) -> Self {
        match self {
            Launch::InProcessOn(d) => Launch::InProcessOn(d),
            _ => Launch::InProcess,
        }
    }
}

/// Versions published to inference servers (`--publish-*`).
#[derive(Debug, Clone)]
pub struct Publish {
    pub root: PathBuf,
    pub name: String,
    pub window: usize,
    pub url: String,
}

/// What a server under test trains: lr 0.05, no clipping, no KL, seed 11, LoRA r 4 / alpha 8
/// on every projection when `lora`.
#[derive(Debug, Clone, Default)]
pub struct Opts {
    pub lora: bool,
    pub checkpoint_dir: Option<PathBuf>,
    pub resume: bool,
    pub publish: Option<Publish>,
    /// Parameters in bf16 from the start (`trainer serve --dtype bf16`; in-process only).
    pub bf16: bool,
}

/// A running server; dropping it stops a launched one (SIGTERM to the launcher, which stops
/// its ranks). An in-process one keeps serving until the test's runtime ends.
pub struct Running {
    pub url: String,
    child: Option<Child>,
    log: Option<PathBuf>,
    _state: Option<Arc<AppState>>,
}

impl Running {
    /// The launcher's log so far (empty in-process).
    pub fn log(&self) -> String {
        self.log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let t0 = Instant::now();
        while matches!(child.try_wait(), Ok(None)) {
            if t0.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn lora() -> trainer::model::LoraConfig {
    trainer::model::LoraConfig {
        r: 4,
        alpha: 8.0,
        dropout: 0.0,
        targets: trainer::model::LoraTarget::ALL.to_vec(),
    }
}

/// Start a server on the model directory `dir` as `launch` says.
pub async fn start(launch: Launch, dir: &Path, o: Opts) -> Running {
    match launch {
        Launch::InProcess | Launch::InProcessOn(_) => {
            let device = match launch {
                Launch::InProcessOn(d) => d,
                _ => tch::Device::Cpu,
            };
            let mut train = trainer::train::TrainConfig::default();
            train.optim.lr = 0.05;
            train.optim.max_grad_norm = 0.0;
            train.loss.kl_coef = 0.0;
            let lora = o.lora.then(lora);
            let mut opts = load::LoadOptions {
                resume_from: if o.resume {
                    o.checkpoint_dir.clone()
                } else {
                    None
                },
                ..load::LoadOptions::from_config(
                    dir.to_path_buf(),
                    &train,
                    lora.as_ref(),
                    device,
                    11,
                )
            };
            if o.bf16 {
                opts.settings.param_dtype = wire::settings::ParamDtype::Bf16;
            }
            let publisher = o.publish.map(|p| {
                Publisher::new(PublishConfig {
                    root: p.root,
                    name: p.name,
                    window: p.window,
                    retries: 0,
                    targets: vec![PublishTarget {
                        url: p.url,
                        kind: ServerKind::Vllm,
                    }],
                    lora: o.lora,
                })
            });
            let s = serve_in_process(opts, o.checkpoint_dir, publisher, None).await;
            Running {
                url: s.url,
                child: None,
                log: None,
                _state: Some(s.state),
            }
        }
        Launch::Ranks(n) => start_ranks(n, dir, &o).await,
    }
}

/// One `trainer serve --nproc-per-node n`, healthy with every rank started. It binds port 0 and
/// the test reads the port the system gave it from the server's own log: a port picked free and
/// released beforehand can be taken by another test's server first, whose health check would
/// then answer for this one, and two tests would train one policy.
async fn start_ranks(n: usize, dir: &Path, o: &Opts) -> Running {
    static LAUNCHED: AtomicUsize = AtomicUsize::new(0);
    let log = dir.parent().unwrap_or(dir).join(format!(
        "serve-{}.log",
        LAUNCHED.fetch_add(1, Ordering::Relaxed)
    ));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainer"));
    cmd.args(["serve", "--device", "cpu", "--threads", "1"])
        .args(["--lr", "0.05", "--max-grad-norm", "0", "--seed", "11"])
        .arg("--model")
        .arg(dir)
        .args(["--bind", "127.0.0.1:0"])
        .arg("--nproc-per-node")
        .arg(n.to_string())
        .args(["--dist-timeout-secs", "60"]);
    if o.lora {
        cmd.args(["--lora-r", "4", "--lora-alpha", "8"]);
    }
    if let Some(ck) = &o.checkpoint_dir {
        cmd.arg("--checkpoint-dir").arg(ck);
    }
    if o.resume {
        cmd.arg("--resume");
    }
    if let Some(p) = &o.publish {
        cmd.arg("--publish-url")
            .arg(&p.url)
            .arg("--publish-dir")
            .arg(&p.root)
            .arg("--publish-name")
            .arg(&p.name)
            .arg("--publish-window")
            .arg(p.window.to_string())
            .args(["--publish-retries", "0"]);
    }
    for k in [
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    ] {
        cmd.env_remove(k);
    }
    let child = cmd
        .env("RUST_LOG", "trainer=info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut r = Running {
        url: String::new(),
        child: Some(child),
        log: Some(log),
        _state: None,
    };
    r.url = format!("http://{}", listening_addr(&mut r).await);
    wait_healthy(&r).await;
    // Every rank is up (the launcher logs each start): the suite runs against a group.
    let log = plain(&r.log());
    for rank in 0..n {
        assert!(
            log.lines()
                .any(|l| l.contains("rank started") && l.contains(&format!("rank={rank} "))),
            "rank {rank} of {n} did not start:\n{log}"
        );
    }
    r
}

/// The address this launcher's own server logs that it listens on; its exit first, or two
/// minutes, fails the test.
async fn listening_addr(r: &mut Running) -> String {
    let t0 = Instant::now();
    loop {
        let log = plain(&r.log());
        let addr = log
            .lines()
            .find(|l| l.contains("trainer serve listening"))
            .and_then(|l| l.split("addr=").nth(1))
            .and_then(|rest| rest.split_whitespace().next());
        if let Some(addr) = addr {
            return addr.to_string();
        }
        let child = r.child.as_mut().expect("a launched server has a child");
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the launcher exited ({status}) before its server listened:\n{log}");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the launcher's server never listened:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_healthy(r: &Running) {
    let t0 = Instant::now();
    loop {
        let ok = trainer::publish::http_client()
            .get(format!("{}/health", r.url))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .is_ok_and(|x| x.status().is_success());
        if ok {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{} never became healthy:\n{}",
            r.url,
            r.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn get_json(url: &str) -> serde_json::Value {
    trainer::publish::http_client()
        .get(url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// vLLM's `prompt_logprobs` of `tokens` (k alternatives): per position after the first, the
/// token's log-prob, its rank and the alternatives' (id, log-prob, rank).
pub async fn prompt_logprobs(
    url: &str,
    tokens: &[u32],
    k: u32,
) -> Vec<(f32, i64, Vec<(u32, f32, i64)>)> {
    let (code, r) = post_json(
        &format!("{url}/v1/completions"),
        serde_json::json!({"model": "policy", "prompt": tokens, "max_tokens": 1,
                           "temperature": 0.0, "prompt_logprobs": k}),
    )
    .await;
    assert_eq!(code, 200, "{r}");
    let p = r["choices"][0]["prompt_logprobs"].as_array().unwrap();
    assert_eq!(p.len(), tokens.len(), "one entry per prompt token");
    assert!(p[0].is_null(), "the first token has no log-prob");
    p.iter()
        .zip(tokens)
        .skip(1)
        .map(|(e, t)| {
            let m = e.as_object().unwrap();
            let own = &m[&t.to_string()];
            let mut alts: Vec<(u32, f32, i64)> = m
                .iter()
                .map(|(id, v)| {
                    (
                        id.parse().unwrap(),
                        v["logprob"].as_f64().unwrap() as f32,
                        v["rank"].as_i64().unwrap(),
                    )
                })
                .collect();
            alts.sort_by_key(|a| a.2);
            (
                own["logprob"].as_f64().unwrap() as f32,
                own["rank"].as_i64().unwrap(),
                alts,
            )
        })
        .collect()
}

/// The served policy's per-token log-probs of `tokens` (entry t is log p(tokens[t] | prefix),
/// entry 0 is 0), read through `prompt_logprobs`.
pub async fn forward_logprobs(url: &str, tokens: &[u32]) -> Vec<f32> {
    let mut out = vec![0.0];
    out.extend(
        prompt_logprobs(url, tokens, 0)
            .await
            .into_iter()
            .map(|p| p.0),
    );
    out
}

fn orchestrator_client(url: &str) -> orchestrator::infra::llm::LlmClient {
    let pool = orchestrator::infra::llm::EndpointPool::new(
        orchestrator::infra::llm::Role::Policy,
        "policy",
        &[url.to_string()],
        64,
        Duration::from_secs(60),
        3,
    );
    orchestrator::infra::llm::LlmClient::new(
        orchestrator::infra::llm::build_http(Duration::from_secs(5)).unwrap(),
        Arc::new(pool),
        orchestrator::infra::llm::RetryPolicy::none(),
    )
}

pub async fn generation_through_the_orchestrator_client_matches_the_forward_pass(launch: Launch) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path());
    let s = start(
        launch,
        &dir,
        Opts {
            lora: true,
            ..Opts::default()
        },
    )
    .await;
    let client = orchestrator_client(&s.url);
    let features =
        orchestrator::infra::llm::detect_all(&client, orchestrator::infra::llm::Role::Policy)
            .await
            .unwrap();
    let f = &features[0];
    assert!(f.tokenize && f.token_id_prompts && f.return_token_ids && f.logprobs);
    assert!(f.models.contains(&"policy".to_string()));
    assert_eq!(
        f.version.as_deref(),
        Some(concat!("trainer-serve ", env!("CARGO_PKG_VERSION")))
    );

    let prompt = client
        .tokenize(None, "gene TN5 binds receptor")
        .await
        .unwrap();
    assert!(!prompt.is_empty());
    let mut req = orchestrator::infra::llm::CompletionRequest::new("policy", prompt.clone(), 24);
    req.seed = Some(7);
    req.n = 3;
    let (c, _) = client.complete("s1", &req).await.unwrap();
    assert_eq!(c.choices.len(), 3);
    for ch in &c.choices {
        assert!(!ch.token_ids.is_empty() && ch.token_ids.len() <= 24);
        assert_eq!(ch.logprobs.len(), ch.token_ids.len());
        assert_forward(&s.url, &prompt, &ch.token_ids, &ch.logprobs).await;
    }
    // Seeded requests are reproducible whatever runs beside them.
    let (again, _) = client.complete("s2", &req).await.unwrap();
    assert_eq!(again.choices[0].token_ids, c.choices[0].token_ids);
    // Greedy decoding follows the argmax of the forward pass: every greedy token ranks first.
    let mut greedy = orchestrator::infra::llm::CompletionRequest::new("policy", prompt.clone(), 5);
    greedy.temperature = 0.0;
    let (g, _) = client.complete("s3", &greedy).await.unwrap();
    let mut all = prompt.clone();
    all.extend(&g.choices[0].token_ids);
    let scored = prompt_logprobs(&s.url, &all, 2).await;
    for (i, (lp, rank, alts)) in scored.iter().enumerate().skip(prompt.len() - 1) {
        assert_eq!(*rank, 1, "greedy token {i} is not the argmax: {alts:?}");
        assert_eq!(alts[0].1, *lp);
    }
    // Detokenize and chat answer; an unknown model and a bad n are refused by name.
    let text = client.detokenize(&prompt).await.unwrap();
    assert!(text.contains("TN5"), "{text}");
    let (code, chat) = post_json(
        &format!("{}/v1/chat/completions", s.url),
        serde_json::json!({"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    )
    .await;
    assert_eq!(code, 200, "{chat}");
    assert_eq!(chat["choices"][0]["message"]["role"], "assistant");
    let (code, _) = post_json(
        &format!("{}/v1/completions", s.url),
        serde_json::json!({"model": "nope", "prompt": [1, 2]}),
    )
    .await;
    assert_eq!(code, 404);
    let (code, e) = post_json(
        &format!("{}/v1/completions", s.url),
        serde_json::json!({"model": "policy", "prompt": [1, 2], "n": 1000}),
    )
    .await;
    assert_eq!(code, 400);
    assert!(e.to_string().contains("n = 1000"), "{e}");
    let (code, e) = post_json(
        &format!("{}/v1/completions", s.url),
        serde_json::json!({"model": "policy", "prompt": [1, 2], "prompt_logprobs": 21}),
    )
    .await;
    assert_eq!(code, 400);
    assert!(e.to_string().contains("prompt_logprobs = 21"), "{e}");
}

/// A batch where sequence i gets advantage `adv[i]` on its last 8 tokens; behaviour logprobs
/// are the served policy's, so every ratio starts at 1.
pub async fn batch(url: &str, seqs: &[Vec<u32>], adv: &[f32]) -> wire::Batch {
    let mut out = Vec::new();
    for (i, (t, a)) in seqs.iter().zip(adv).enumerate() {
        let n = t.len();
        out.push(wire::WireSequence {
            unlikelihood: Vec::new(),
            tokens: t.clone(),
            loss_mask: (0..n).map(|k| k >= n - 8).collect(),
            stages: (0..n).map(|k| if k >= n - 8 { 3 } else { -1 }).collect(),
            behaviour_logprobs: forward_logprobs(url, t).await,
            advantages: vec![*a],
            group_id: i as u32,
            policy_version: 0,
            phase: wire::Phase::Task,
            off_policy: false,
        });
    }
    wire::Batch {
        policy_version: 0,
        rl: true,
        seqs: out,
    }
}

fn masked_mean(lp: &[f32]) -> f32 {
    lp[lp.len() - 8..].iter().sum::<f32>() / 8.0
}

pub async fn post_batch(url: &str, b: &wire::Batch) -> reqwest::Response {
    trainer::publish::http_client()
        .post(format!("{url}/v1/train_step"))
        .body(b.encode().unwrap())
        .send()
        .await
        .unwrap()
}

pub fn seqs(n: usize, len: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            (0..len)
                .map(|k| ((i * 31 + k * 7) % 250 + 5) as u32)
                .collect()
        })
        .collect()
}

pub async fn train_steps_over_http_follow_the_advantage_sign_and_refuse_concurrency(
    launch: Launch,
) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path());
    let s = start(
        launch,
        &dir,
        Opts {
            lora: true,
            ..Opts::default()
        },
    )
    .await;
    let xs = seqs(2, 24);
    let mut before = Vec::new();
    for t in &xs {
        before.push(masked_mean(&forward_logprobs(&s.url, t).await));
    }
    let r = post_batch(&s.url, &batch(&s.url, &xs, &[1.0, -1.0]).await).await;
    assert_eq!(r.status(), 200);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["policy_version"], 1);
    assert!(body["metrics"]["tokens"].as_i64().unwrap() > 0);
    let mut after = Vec::new();
    for t in &xs {
        after.push(masked_mean(&forward_logprobs(&s.url, t).await));
    }
    assert!(
        after[0] > before[0],
        "positive advantage raised: {before:?} -> {after:?}"
    );
    assert!(
        after[1] < before[1],
        "negative advantage lowered: {before:?} -> {after:?}"
    );

    // Two steps at once: exactly one runs, the other gets 409.
    let big = batch(&s.url, &seqs(24, 200), &[0.5; 24]).await;
    let (a, b) = tokio::join!(post_batch(&s.url, &big), post_batch(&s.url, &big));
    let mut codes = [a.status().as_u16(), b.status().as_u16()];
    codes.sort();
    assert_eq!(codes, [200, 409]);

    // Garbage bodies are a 400 naming the problem; the version did not move.
    let r = trainer::publish::http_client()
        .post(format!("{}/v1/train_step", s.url))
        .body(vec![1u8; 40])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("bad magic"));
    let st = get_json(&format!("{}/v1/state", s.url)).await;
    assert_eq!(st["policy_version"], 2);
    assert_eq!(st["mode"], "lora");
}

#[derive(Default)]
pub struct FakeVllm {
    pub calls: Mutex<Vec<(String, serde_json::Value)>>,
    pub fail_loads_from: Mutex<Option<String>>,
}

/// A loopback fake of vLLM's LoRA endpoints that records every call and checks that the
/// adapter directory it is pointed at is complete.
pub async fn fake_vllm() -> (String, Arc<FakeVllm>) {
    let st = Arc::new(FakeVllm::default());
    async fn load(State(s): State<Arc<FakeVllm>>, Json(b): Json<serde_json::Value>) -> StatusCode {
        let name = b["lora_name"].as_str().unwrap_or("").to_string();
        let path = PathBuf::from(b["lora_path"].as_str().unwrap_or(""));
        // vLLM reads the directory when asked: it must be complete.
        assert!(path.join("adapter_model.safetensors").exists());
        assert!(path.join("adapter_config.json").exists());
        s.calls.lock().unwrap().push(("load".into(), b));
        if s.fail_loads_from.lock().unwrap().as_deref() == Some(name.as_str()) {
            return StatusCode::INTERNAL_SERVER_ERROR;
        }
        StatusCode::OK
    }
    async fn unload(
        State(s): State<Arc<FakeVllm>>,
        Json(b): Json<serde_json::Value>,
    ) -> StatusCode {
        s.calls.lock().unwrap().push(("unload".into(), b));
        StatusCode::OK
    }
    let app = axum::Router::new()
        .route("/v1/load_lora_adapter", post(load))
        .route("/v1/unload_lora_adapter", post(unload))
        .with_state(st.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), st)
}

pub async fn publishing_records_exact_calls_and_keeps_the_previous_version_on_failure(
    launch: Launch,
) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path());
    let (vurl, fake) = fake_vllm().await;
    let root = tmp.path().join("published");
    std::fs::create_dir_all(&root).unwrap();
    let root = std::fs::canonicalize(&root).unwrap();
    let s = start(
        launch,
        &dir,
        Opts {
            lora: true,
            publish: Some(Publish {
                root: root.clone(),
                name: "pol".into(),
                window: 2,
                url: vurl,
            }),
            ..Opts::default()
        },
    )
    .await;
    let xs = seqs(2, 20);
    for v in 1..=3 {
        let b = batch(&s.url, &xs, &[1.0, -1.0]).await;
        let r: serde_json::Value = post_batch(&s.url, &b).await.json().await.unwrap();
        assert_eq!(r["published"]["name"], format!("pol-v{v}"), "{r}");
        assert_eq!(r["published"]["failed"].as_array().unwrap().len(), 0);
    }
    let calls = fake.calls.lock().unwrap().clone();
    let seen: Vec<(String, String, Option<String>)> = calls
        .iter()
        .map(|(k, b)| {
            (
                k.clone(),
                b["lora_name"].as_str().unwrap().to_string(),
                b["lora_path"].as_str().map(str::to_string),
            )
        })
        .collect();
    let path = |v: i64| Some(root.join(format!("pol-v{v}")).display().to_string());
    assert_eq!(
        seen,
        vec![
            ("load".into(), "pol-v1".into(), path(1)),
            ("load".into(), "pol-v2".into(), path(2)),
            ("load".into(), "pol-v3".into(), path(3)),
            ("unload".into(), "pol-v1".into(), None),
        ]
    );
    assert!(
        !root.join("pol-v1").exists(),
        "unloaded versions are removed"
    );
    assert!(root.join("pol-v3/adapter_model.safetensors").exists());
    // The served names follow the window.
    let models = get_json(&format!("{}/v1/models", s.url)).await;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["policy", "pol-v2", "pol-v3"]);

    // A failed load is reported; nothing is unloaded, v2 and v3 stay.
    *fake.fail_loads_from.lock().unwrap() = Some("pol-v4".into());
    let b = batch(&s.url, &xs, &[1.0, -1.0]).await;
    let r: serde_json::Value = post_batch(&s.url, &b).await.json().await.unwrap();
    assert_eq!(r["published"]["failed"].as_array().unwrap().len(), 1);
    assert!(
        r["published"]["failed"][0][1]
            .as_str()
            .unwrap()
            .contains("500")
    );
    let calls = fake.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 5, "one failed load, no unload");
    assert!(root.join("pol-v2").exists() && root.join("pol-v3").exists());
}

/// The adapter tensors of a LoRA checkpoint directory, by name.
pub fn adapter(dir: &Path) -> Vec<(String, Vec<f32>)> {
    let mut t = tch::Tensor::read_safetensors(dir.join("adapter_model.safetensors")).unwrap();
    t.sort_by(|a, b| a.0.cmp(&b.0));
    t.into_iter()
        .map(|(n, x)| {
            let v = Vec::<f32>::try_from(x.to_kind(tch::Kind::Float).flatten(0, -1)).unwrap();
            (n, v)
        })
        .collect()
}

pub async fn checkpoint(url: &str) -> PathBuf {
    let (code, r) = post_json(&format!("{url}/v1/checkpoint"), serde_json::json!({})).await;
    assert_eq!(code, 200, "{r}");
    PathBuf::from(r["checkpoint"].as_str().unwrap())
}

pub async fn checkpoint_restart_next_step_equals_a_run_that_never_stopped(launch: Launch) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path());
    let xs = seqs(3, 20);
    let adv = [1.0, -0.5, 0.25];
    let opts = |ck: &str, resume: bool| Opts {
        lora: true,
        checkpoint_dir: Some(tmp.path().join(ck)),
        resume,
        ..Opts::default()
    };

    // A run that never stops: three steps.
    let straight = start(launch, &dir, opts("straight", false)).await;
    let b = batch(&straight.url, &xs, &adv).await;
    for _ in 0..3 {
        assert_eq!(post_batch(&straight.url, &b).await.status(), 200);
    }
    let want = adapter(&checkpoint(&straight.url).await);
    drop(straight);

    // Two steps, checkpoint, "crash", restart from the checkpoint, third step.
    let first = start(launch, &dir, opts("ckpt", false)).await;
    for _ in 0..2 {
        assert_eq!(post_batch(&first.url, &b).await.status(), 200);
    }
    checkpoint(&first.url).await;
    drop(first);
    let second = start(launch, &dir, opts("ckpt", true)).await;
    let st = get_json(&format!("{}/v1/state", second.url)).await;
    assert_eq!(
        (st["policy_version"].as_i64(), st["optimizer_step"].as_i64()),
        (Some(2), Some(2))
    );
    let r: serde_json::Value = post_batch(&second.url, &b).await.json().await.unwrap();
    assert_eq!(r["policy_version"], 3);
    let got = adapter(&checkpoint(&second.url).await);
    assert_eq!(got.len(), want.len());
    assert!(!got.is_empty());
    for ((n, a), (_, b)) in got.iter().zip(&want) {
        assert_eq!(a, b, "{n} differs after restart");
    }
}

async fn served_version(url: &str) -> i64 {
    get_json(&format!("{url}/v1/state")).await["policy_version"]
        .as_i64()
        .unwrap()
}

fn max_gap(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

/// The split layout: a `trainer serve` (launched as `launch` says) trains and publishes full
/// weights to a second one, in-process, that only serves (where a vLLM server would stand).
/// After each step the server's log-probs equal the trainer's; a restore puts the restored
/// weights on the server and retires the old versions; the weight-transfer API refuses
/// out-of-order calls, relative paths and a model of another architecture.
pub async fn a_policy_server_receives_published_full_weights_and_the_restored_policy(
    launch: Launch,
) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path());
    // The serving side runs in-process, on the trainer's device (the same dtype, so the
    // log-probs compare to fp32 noise).
    let server = start(launch.serving(), &dir, Opts::default()).await;
    let root = std::fs::canonicalize(tmp.path()).unwrap().join("published");
    let trainer = start(
        launch,
        &dir,
        Opts {
            checkpoint_dir: Some(tmp.path().join("ckpt")),
            publish: Some(Publish {
                root: root.clone(),
                name: "policy".into(),
                window: 2,
                url: server.url.clone(),
            }),
            ..Opts::default()
        },
    )
    .await;
    let xs = seqs(2, 20);
    let mut initial = Vec::new();
    for t in &xs {
        initial.push(forward_logprobs(&server.url, t).await);
    }
    for v in 1..=3 {
        let b = batch(&trainer.url, &xs, &[1.0, -1.0]).await;
        let r: serde_json::Value = post_batch(&trainer.url, &b).await.json().await.unwrap();
        assert_eq!(r["policy_version"], v, "{r}");
        let p = &r["published"];
        assert_eq!(p["lora"], false);
        assert_eq!(p["loaded"], serde_json::json!([server.url]), "{p}");
        assert_eq!(served_version(&server.url).await, v);
        for t in &xs {
            let gap = max_gap(
                &forward_logprobs(&trainer.url, t).await,
                &forward_logprobs(&server.url, t).await,
            );
            assert!(gap < 1e-5, "server lags the trainer at v{v}: {gap}");
        }
    }
    assert_ne!(forward_logprobs(&server.url, &xs[0]).await, initial[0]);
    // Full weights keep the server's own model name.
    let models = get_json(&format!("{}/v1/models", server.url)).await;
    assert_eq!(models["data"][0]["id"], "policy");
    assert!(root.join("policy-v3/model.safetensors").exists());
    assert!(!root.join("policy-v1").exists(), "window 2 keeps v2, v3");

    // Restore to the model as loaded: the server serves it again, old versions are retired.
    let (code, r) = post_json(
        &format!("{}/v1/restore", trainer.url),
        serde_json::json!({"session": "run-2"}),
    )
    .await;
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["policy_version"], 0);
    assert_eq!(r["published"]["version"], 0);
    assert_eq!(served_version(&server.url).await, 0);
    for (t, want) in xs.iter().zip(&initial) {
        let gap = max_gap(&forward_logprobs(&server.url, t).await, want);
        assert!(gap < 1e-5, "restored weights not served: {gap}");
    }
    // The trainer's own ranks were restored too: its log-probs are the initial ones.
    let gap = max_gap(&forward_logprobs(&trainer.url, &xs[0]).await, &initial[0]);
    assert!(gap < 1e-5, "the trainer was not restored: {gap}");
    let mut left: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, vec!["policy-v0"]);

    // The API's refusals, each naming the problem.
    let up = format!("{}/update_weights", server.url);
    let good = root.join("policy-v0").display().to_string();
    let (code, e) = post_json(&up, serde_json::json!({"update_info": {"path": good}})).await;
    assert_eq!(code, 400);
    assert!(e.to_string().contains("start_weight_update"), "{e}");
    post_json(
        &format!("{}/start_weight_update", server.url),
        serde_json::json!({}),
    )
    .await;
    let (code, e) = post_json(
        &up,
        serde_json::json!({"update_info": {"path": "policy-v0"}}),
    )
    .await;
    assert_eq!(code, 400);
    assert!(e.to_string().contains("absolute"), "{e}");
    let other = tmp.path().join("other");
    let mut cfg = tiny_config();
    cfg["hidden_size"] = serde_json::json!(16);
    cfg["head_dim"] = serde_json::json!(4);
    let cfg_path = tmp.path().join("other-config.json");
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    trainer::smallmodel::init_model(&cfg_path, &tmp.path().join("tok"), &other, 3).unwrap();
    let other = std::fs::canonicalize(other).unwrap().display().to_string();
    let (code, e) = post_json(&up, serde_json::json!({"update_info": {"path": other}})).await;
    assert_eq!(code, 400);
    assert!(e.to_string().contains("does not match"), "{e}");
    // Refused updates changed nothing.
    let gap = max_gap(&forward_logprobs(&server.url, &xs[0]).await, &initial[0]);
    assert!(
        gap < 1e-5,
        "a refused update changed the served weights: {gap}"
    );
    let (code, _) = post_json(
        &format!("{}/v1/unload_lora_adapter", server.url),
        serde_json::json!({"lora_name": "nope"}),
    )
    .await;
    assert_eq!(code, 404);
}

pub async fn post_batch_query(url: &str, query: &str, b: &wire::Batch) -> (u16, serde_json::Value) {
    let r = trainer::publish::http_client()
        .post(format!("{url}/v1/train_step?{query}"))
        .body(b.encode().unwrap())
        .send()
        .await
        .unwrap();
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(serde_json::Value::Null))
}

async fn get_settings(url: &str) -> wire::SettingsReply {
    serde_json::from_value(get_json(&format!("{url}/v1/settings")).await).unwrap()
}

/// `POST /v1/settings` and `GET /v1/settings`, and the hash check of train steps: the settings
/// are echoed with their hash; a step (or dry run) under another hash is 409 naming both; a
/// structural change at version 0 rebuilds the policy (here: a full fine-tune with a KL term,
/// whose reference is a frozen copy of the model directory, and the KL grows once the policy
/// moved); at a later version it is 409 and changes nothing; a bad value is 400 naming the
/// field; a non-structural change applies in place, and a restore rebuilds with it; a
/// checkpoint of another fine-tune mode is refused; an empty RL batch is an empty step.
pub async fn settings_are_applied_echoed_and_checked_on_every_step(launch: Launch) {
    use wire::settings::{Finetune, ReferencePolicy, TrainSettings};
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path());
    let s = start(
        launch,
        &dir,
        Opts {
            checkpoint_dir: Some(tmp.path().join("ckpt")),
            ..Opts::default()
        },
    )
    .await;
    let url = &s.url;

    // The flags' settings: full fine-tune, no KL, lr 0.05, no clipping.
    let flags = get_settings(url).await;
    assert_eq!(flags.hash, flags.settings.hash());
    assert_eq!(
        (flags.settings.lr, flags.settings.max_grad_norm),
        (0.05, 0.0)
    );
    assert_eq!(
        (flags.settings.kl_beta, flags.settings.reference),
        (0.0, ReferencePolicy::None)
    );
    assert_eq!(flags.policy_version, wire::PolicyVersion(0));

    // The papers' setting on a tiny model: full fine-tune, KL3 to the initial weights.
    let want = TrainSettings {
        lr: 0.05,
        max_grad_norm: 0.0,
        kl_beta: 0.5,
        reference: ReferencePolicy::Initial,
        finetune: Finetune::Full,
        micro_batch_tokens: 4096,
        minibatches_per_step: 2,
        ..TrainSettings::default()
    };
    let (code, r) = post_json(
        &format!("{url}/v1/settings"),
        serde_json::to_value(&want).unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{r}");
    let r: wire::SettingsReply = serde_json::from_value(r).unwrap();
    assert_eq!(r.settings, want);
    assert_eq!(r.hash, want.hash());
    assert!(r.rebuilt, "KL on is structural: rebuilt at version 0");
    let got = get_settings(url).await;
    assert_eq!(
        (got.settings, got.hash.as_str()),
        (want.clone(), r.hash.as_str())
    );
    let hash = r.hash;

    // A step under other settings is refused, naming both hashes; the dry run too.
    let xs = seqs(2, 24);
    let b = batch(url, &xs, &[1.0, -1.0]).await;
    let other = "0123456789abcdef";
    for query in [
        format!("settings_hash={other}"),
        format!("settings_hash={other}&dry_run=true"),
    ] {
        let (code, e) = post_batch_query(url, &query, &b).await;
        assert_eq!(code, 409, "{query}: {e}");
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(msg.contains(other) && msg.contains(&hash), "{msg}");
    }
    let (code, e) = post_batch_query(url, &format!("settings_hash={hash}&dry_run=true"), &b).await;
    assert_eq!(code, 200, "{e}");

    // Under the held settings it trains: two minibatches, and the KL to the frozen initial
    // weights grows once the policy moved.
    let mut kls = Vec::new();
    for v in 1..=2 {
        let b = batch(url, &xs, &[1.0, -1.0]).await;
        let (code, r) = post_batch_query(
            url,
            &format!("expect_version={}&settings_hash={hash}", v - 1),
            &b,
        )
        .await;
        assert_eq!(code, 200, "{r}");
        let r: wire::TrainReply = serde_json::from_value(r).unwrap();
        assert_eq!(r.settings_hash.as_deref(), Some(hash.as_str()));
        assert_eq!(r.metrics.minibatches, 2);
        kls.push(r.metrics.kl);
    }
    // (Step 1's first minibatch is at the reference; its second already moved.)
    assert!(
        kls[1] > 1e-4 && kls[1] > kls[0],
        "the policy moved: {kls:?}"
    );

    // A structural change at version 2 is refused and changes nothing.
    let lora = TrainSettings {
        finetune: Finetune::Lora,
        ..want.clone()
    };
    let (code, e) = post_json(
        &format!("{url}/v1/settings"),
        serde_json::to_value(&lora).unwrap(),
    )
    .await;
    assert_eq!(code, 409, "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("version 2") && msg.contains("restore"),
        "{msg}"
    );
    assert_eq!(get_settings(url).await.hash, hash);
    let st = get_json(&format!("{url}/v1/state")).await;
    assert_eq!(
        (st["mode"].as_str(), st["policy_version"].as_i64()),
        (Some("full"), Some(2))
    );

    // A bad value is 400 naming the field; so is an unknown field. Nothing changed.
    let mut bad = serde_json::to_value(&want).unwrap();
    bad["clip_low"] = serde_json::json!(1.5);
    let (code, e) = post_json(&format!("{url}/v1/settings"), bad).await;
    assert_eq!(code, 400, "{e}");
    assert!(e.to_string().contains("trainer.clip_low = 1.5"), "{e}");
    let mut bad = serde_json::to_value(&want).unwrap();
    bad["learning_rate"] = serde_json::json!(1e-3);
    let (code, e) = post_json(&format!("{url}/v1/settings"), bad).await;
    assert_eq!(code, 400, "{e}");
    assert!(e.to_string().contains("learning_rate"), "{e}");
    assert_eq!(get_settings(url).await.hash, hash);

    let (code, ck) = post_json(&format!("{url}/v1/checkpoint"), serde_json::json!({})).await;
    assert_eq!(code, 200, "{ck}");
    let full_ck = ck["relative"].as_str().unwrap().to_string();

    // A non-structural change applies in place at version 2 (moments and step kept).
    let slower = TrainSettings {
        lr: 0.01,
        clip_high: 0.3,
        minibatches_per_step: 1,
        ..want.clone()
    };
    let (code, r) = post_json(
        &format!("{url}/v1/settings"),
        serde_json::to_value(&slower).unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{r}");
    let r: wire::SettingsReply = serde_json::from_value(r).unwrap();
    assert!(!r.rebuilt);
    assert_eq!(
        (r.hash, r.policy_version),
        (slower.hash(), wire::PolicyVersion(2))
    );
    let st = get_json(&format!("{url}/v1/state")).await;
    assert_eq!(st["optimizer_step"], 4, "two steps of two minibatches");
    assert_eq!(st["train_config"]["optim"]["lr"], 0.01);
    assert_eq!(st["train_config"]["loss"]["clip_high"], 0.3);
    let (code, _) = post_batch_query(url, &format!("settings_hash={hash}"), &b).await;
    assert_eq!(code, 409, "the old hash no longer trains");

    // A restore rebuilds with the settings now held; a structural change is then allowed.
    let (code, r) = post_json(&format!("{url}/v1/restore"), serde_json::json!({})).await;
    assert_eq!(code, 200, "{r}");
    let got = get_settings(url).await;
    assert_eq!(
        (got.hash, got.policy_version),
        (slower.hash(), wire::PolicyVersion(0))
    );
    let st = get_json(&format!("{url}/v1/state")).await;
    assert_eq!(st["train_config"]["optim"]["lr"], 0.01);
    let mut lora = TrainSettings {
        finetune: Finetune::Lora,
        ..slower.clone()
    };
    lora.lora.r = 4;
    let (code, r) = post_json(
        &format!("{url}/v1/settings"),
        serde_json::to_value(&lora).unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["rebuilt"], true);
    let st = get_json(&format!("{url}/v1/state")).await;
    assert_eq!(
        (st["mode"].as_str(), st["lora"]["r"].as_i64()),
        (Some("lora"), Some(4))
    );

    // A checkpoint of another fine-tune mode than the held settings is refused.
    let (code, e) = post_json(
        &format!("{url}/v1/restore"),
        serde_json::json!({"checkpoint": full_ck}),
    )
    .await;
    assert_eq!(code, 409, "{e}");
    assert!(e.to_string().contains("full fine-tune"), "{e}");
    assert_eq!(served_version(url).await, 0);

    // An RL batch with nothing to learn from is an empty step: the version advances.
    let empty = wire::Batch {
        policy_version: 0,
        rl: true,
        seqs: vec![],
    };
    let (code, r) = post_batch_query(url, &format!("settings_hash={}", lora.hash()), &empty).await;
    assert_eq!(code, 200, "{r}");
    assert_eq!(
        (
            r["policy_version"].as_i64(),
            r["metrics"]["tokens"].as_i64()
        ),
        (Some(1), Some(0))
    );
    // The group trains under the LoRA settings: the adapter moves the served log-probs.
    let before = forward_logprobs(url, &xs[0]).await;
    let b = batch(url, &xs, &[1.0, -1.0]).await;
    let (code, r) = post_batch_query(url, &format!("settings_hash={}", lora.hash()), &b).await;
    assert_eq!(code, 200, "{r}");
    assert_ne!(forward_logprobs(url, &xs[0]).await, before);
}

/// `vllm:prefix_cache_hits_total` from `/metrics`.
async fn prefix_hits(url: &str) -> u64 {
    let text = trainer::publish::http_client()
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("vllm:prefix_cache_hits_total "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Greedy `max_tokens` tokens after `prompt` (end-of-sequence ignored): ids and logprobs.
async fn greedy(url: &str, prompt: &[u32], max_tokens: usize) -> (Vec<u32>, Vec<f32>) {
    let (code, r) = post_json(
        &format!("{url}/v1/completions"),
        serde_json::json!({"model": "policy", "prompt": prompt, "max_tokens": max_tokens,
                           "temperature": 0.0, "ignore_eos": true, "return_token_ids": true,
                           "logprobs": 0}),
    )
    .await;
    assert_eq!(code, 200, "{r}");
    let c = &r["choices"][0];
    let ids: Vec<u32> = serde_json::from_value(c["token_ids"].clone()).unwrap();
    let lps: Vec<f32> = serde_json::from_value(c["logprobs"]["token_logprobs"].clone()).unwrap();
    (ids, lps)
}

/// The sampled tokens' logprobs equal the served policy's forward pass over the whole
/// sequence (read through `prompt_logprobs`, which never uses the prefix cache).
async fn assert_forward(url: &str, prompt: &[u32], ids: &[u32], lps: &[f32]) {
    let mut all = prompt.to_vec();
    all.extend(ids);
    let want = forward_logprobs(url, &all).await;
    for (i, lp) in lps.iter().enumerate() {
        let w = want[prompt.len() + i];
        assert!(
            (lp - w).abs() < 1e-4,
            "token {i}: served {lp} vs forward {w}"
        );
    }
}

/// A rollout's next turn (its context, the tokens generated, a tool's output) reuses the keys
/// and values of the finished turn: the prefix cache counts exactly the tokens it held (the
/// prompt and every generated token but the last, never fed) and the new turn's tokens and
/// logprobs are the forward pass's. After a train step the entry is not reused (other weights)
/// and the answer follows the new weights.
pub async fn a_request_extending_a_finished_one_reuses_its_keys_and_values(launch: Launch) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path());
    let s = start(
        launch,
        &dir,
        Opts {
            lora: true,
            ..Opts::default()
        },
    )
    .await;
    let context: Vec<u32> = (0..40).map(|k| (k * 37 % 250 + 5) as u32).collect();
    let h0 = prefix_hits(&s.url).await;
    let (ids1, lps1) = greedy(&s.url, &context, 12).await;
    assert_eq!(prefix_hits(&s.url).await, h0, "nothing to reuse yet");
    let mut turn2 = context.clone();
    turn2.extend(&ids1);
    turn2.extend((0..20).map(|k| (k * 13 % 250 + 5) as u32));
    let h1 = prefix_hits(&s.url).await;
    let (ids2, lps2) = greedy(&s.url, &turn2, 12).await;
    assert_eq!(
        prefix_hits(&s.url).await - h1,
        (context.len() + ids1.len() - 1) as u64,
        "the finished turn's context and tokens were reused"
    );
    assert_forward(&s.url, &context, &ids1, &lps1).await;
    assert_forward(&s.url, &turn2, &ids2, &lps2).await;

    // New weights: the entries of the old ones are not reused.
    let xs = seqs(2, 24);
    let b = batch(&s.url, &xs, &[1.0, -1.0]).await;
    assert_eq!(post_batch(&s.url, &b).await.status(), 200);
    let h2 = prefix_hits(&s.url).await;
    let (ids3, lps3) = greedy(&s.url, &turn2, 12).await;
    assert_eq!(prefix_hits(&s.url).await, h2, "no reuse across weights");
    assert_forward(&s.url, &turn2, &ids3, &lps3).await;
    assert_ne!(lps3, lps2, "the step changed the policy");
}
