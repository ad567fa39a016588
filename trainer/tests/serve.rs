//! `trainer serve` on CPU with a tiny model created here: generation through the orchestrator's
//! own client (feature detection passes; token ids and logprobs equal the trainer's forward to
//! 1e-4); train steps over HTTP with the wire batch move log-probs by the sign of the advantage,
//! and a concurrent step gets 409; publishing to a fake vLLM records exactly the load and unload
//! calls, keeps the previous version on failure, and never leaves a partial directory;
//! checkpoint + restart continues with parameters identical to a run that never stopped; a
//! second `trainer serve` receives published full weights (and a restored policy) through
//! vLLM's disk weight-transfer API.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use common::{Server, model_dir, tiny_config};
use trainer::model::Fwd;
use trainer::publish::{PublishConfig, PublishTarget, Publisher, ServerKind};
use trainer::service::load;

fn lora() -> trainer::model::LoraConfig {
    trainer::model::LoraConfig {
        r: 4,
        alpha: 8.0,
        dropout: 0.0,
        targets: trainer::model::LoraTarget::ALL.to_vec(),
    }
}

async fn start(
    dir: &Path,
    lora: Option<trainer::model::LoraConfig>,
    ckpt: Option<PathBuf>,
    resume: bool,
    publisher: Option<Publisher>,
) -> Server {
    let mut train = trainer::train::TrainConfig::default();
    train.optim.lr = 0.05;
    train.optim.max_grad_norm = 0.0;
    train.loss.kl_coef = 0.0;
    let opts = load::LoadOptions {
        resume_from: if resume { ckpt.clone() } else { None },
        ..load::LoadOptions::from_config(
            dir.to_path_buf(),
            &train,
            lora.as_ref(),
            tch::Device::Cpu,
            11,
        )
    };
    common::serve_in_process(opts, ckpt, publisher, None).await
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

/// The trainer's own per-token log-probs of `tokens` (entry t is log p(tokens[t] | prefix)).
fn forward_logprobs(s: &Server, tokens: &[u32]) -> Vec<f32> {
    let p = s.state.policy.lock().unwrap();
    let seq: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
    p.trainer.logprobs(&[seq], Fwd::POLICY).remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generation_through_the_orchestrator_client_matches_the_forward_pass() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path());
    let s = start(&dir, Some(lora()), None, false, None).await;
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
        let mut all = prompt.clone();
        all.extend(&ch.token_ids);
        let want = forward_logprobs(&s, &all);
        for (i, lp) in ch.logprobs.iter().enumerate() {
            let w = want[prompt.len() + i];
            assert!(
                (lp - w).abs() < 1e-4,
                "token {i}: served {lp} vs forward {w}"
            );
        }
    }
    // Seeded requests are reproducible whatever runs beside them.
    let (again, _) = client.complete("s2", &req).await.unwrap();
    assert_eq!(again.choices[0].token_ids, c.choices[0].token_ids);
    // Greedy decoding follows the argmax of the forward pass.
    let mut greedy = orchestrator::infra::llm::CompletionRequest::new("policy", prompt.clone(), 5);
    greedy.temperature = 0.0;
    let (g, _) = client.complete("s3", &greedy).await.unwrap();
    {
        let p = s.state.policy.lock().unwrap();
        let mut ctx: Vec<i64> = prompt.iter().map(|&t| i64::from(t)).collect();
        for &t in &g.choices[0].token_ids {
            let ids = tch::Tensor::from_slice(&ctx).view([1, -1]);
            let logits = p.trainer.model.logits(&ids, Fwd::POLICY);
            let arg = logits
                .select(1, ctx.len() as i64 - 1)
                .argmax(-1, false)
                .int64_value(&[0]);
            assert_eq!(arg, i64::from(t));
            ctx.push(arg);
        }
    }
    // Detokenize and chat answer; an unknown model and a bad n are refused by name.
    let text = client.detokenize(&prompt).await.unwrap();
    assert!(text.contains("TN5"), "{text}");
    let http = trainer::publish::http_client();
    let chat: serde_json::Value = http
        .post(format!("{}/v1/chat/completions", s.url))
        .json(&serde_json::json!({"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(chat["choices"][0]["message"]["role"], "assistant");
    let r = http
        .post(format!("{}/v1/completions", s.url))
        .json(&serde_json::json!({"model": "nope", "prompt": [1, 2]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = http
        .post(format!("{}/v1/completions", s.url))
        .json(&serde_json::json!({"model": "policy", "prompt": [1, 2], "n": 1000}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("n = 1000"));
}

/// A batch where sequence i gets advantage `adv[i]` on its last 8 tokens; behaviour logprobs
/// are the current policy's, so every ratio starts at 1.
fn batch(s: &Server, seqs: &[Vec<u32>], adv: &[f32]) -> wire::Batch {
    wire::Batch {
        policy_version: 0,
        rl: true,
        seqs: seqs
            .iter()
            .zip(adv)
            .enumerate()
            .map(|(i, (t, a))| {
                let n = t.len();
                let lp = forward_logprobs(s, t);
                wire::WireSequence {
                    tokens: t.clone(),
                    loss_mask: (0..n).map(|k| k >= n - 8).collect(),
                    stages: (0..n).map(|k| if k >= n - 8 { 3 } else { -1 }).collect(),
                    behaviour_logprobs: lp,
                    advantages: vec![*a],
                    group_id: i as u32,
                    policy_version: 0,
                    phase: wire::Phase::Task,
                }
            })
            .collect(),
    }
}

fn masked_mean(lp: &[f32]) -> f32 {
    lp[lp.len() - 8..].iter().sum::<f32>() / 8.0
}

async fn post_batch(url: &str, b: &wire::Batch) -> reqwest::Response {
    trainer::publish::http_client()
        .post(format!("{url}/v1/train_step"))
        .body(b.encode().unwrap())
        .send()
        .await
        .unwrap()
}

fn seqs(n: usize, len: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            (0..len)
                .map(|k| ((i * 31 + k * 7) % 250 + 5) as u32)
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn train_steps_over_http_follow_the_advantage_sign_and_refuse_concurrency() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path());
    let s = start(&dir, Some(lora()), None, false, None).await;
    let xs = seqs(2, 24);
    let before: Vec<f32> = xs
        .iter()
        .map(|t| masked_mean(&forward_logprobs(&s, t)))
        .collect();
    let r = post_batch(&s.url, &batch(&s, &xs, &[1.0, -1.0])).await;
    assert_eq!(r.status(), 200);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["policy_version"], 1);
    assert!(body["metrics"]["tokens"].as_i64().unwrap() > 0);
    let after: Vec<f32> = xs
        .iter()
        .map(|t| masked_mean(&forward_logprobs(&s, t)))
        .collect();
    assert!(
        after[0] > before[0],
        "positive advantage raised: {before:?} -> {after:?}"
    );
    assert!(
        after[1] < before[1],
        "negative advantage lowered: {before:?} -> {after:?}"
    );

    // Two steps at once: exactly one runs, the other gets 409.
    let big = batch(&s, &seqs(24, 200), &[0.5; 24]);
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
    let st: serde_json::Value = reqwest::get(format!("{}/v1/state", s.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(st["policy_version"], 2);
    assert_eq!(st["mode"], "lora");
}

#[derive(Default)]
struct FakeVllm {
    calls: Mutex<Vec<(String, serde_json::Value)>>,
    fail_loads_from: Mutex<Option<String>>,
}

async fn fake_vllm() -> (String, Arc<FakeVllm>) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_records_exact_calls_and_keeps_the_previous_version_on_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path());
    let (vurl, fake) = fake_vllm().await;
    let root = tmp.path().join("published");
    std::fs::create_dir_all(&root).unwrap();
    let root = std::fs::canonicalize(&root).unwrap();
    let publisher = Publisher::new(PublishConfig {
        root: root.clone(),
        name: "pol".into(),
        window: 2,
        retries: 0,
        targets: vec![PublishTarget {
            url: vurl,
            kind: ServerKind::Vllm,
        }],
        lora: true,
    });
    let s = start(&dir, Some(lora()), None, false, Some(publisher)).await;
    let xs = seqs(2, 20);
    for v in 1..=3 {
        let r: serde_json::Value = post_batch(&s.url, &batch(&s, &xs, &[1.0, -1.0]))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(r["published"]["name"], format!("pol-v{v}"));
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
    let models: serde_json::Value = reqwest::get(format!("{}/v1/models", s.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["policy", "pol-v2", "pol-v3"]);

    // A failed load is reported; nothing is unloaded, v2 and v3 stay.
    *fake.fail_loads_from.lock().unwrap() = Some("pol-v4".into());
    let r: serde_json::Value = post_batch(&s.url, &batch(&s, &xs, &[1.0, -1.0]))
        .await
        .json()
        .await
        .unwrap();
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

#[test]
fn a_crash_mid_write_never_leaves_a_published_directory_incomplete() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("pol-v7");
    // The writer dies half-way: nothing appears under the final name, no temporary remains.
    let e = trainer::checkpoint::write_dir_atomically(&dst, |d| {
        std::fs::write(d.join("adapter_model.safetensors"), b"half").unwrap();
        Err(trainer::TrainerError::Config("killed".into()))
    })
    .unwrap_err();
    assert!(e.to_string().contains("killed"));
    assert!(!dst.exists());
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    // A process killed outright leaves its temporary; start-up cleaning removes it, and the
    // final name never existed.
    std::fs::create_dir_all(tmp.path().join(".pol-v8.tmp-4242")).unwrap();
    assert_eq!(trainer::checkpoint::clean_partial(tmp.path()), 1);
    assert!(!tmp.path().join("pol-v8").exists());
    // Replacing an existing directory swaps it whole.
    trainer::checkpoint::write_dir_atomically(&dst, |d| {
        std::fs::write(d.join("a"), b"1").map_err(trainer::TrainerError::io(d))
    })
    .unwrap();
    trainer::checkpoint::write_dir_atomically(&dst, |d| {
        std::fs::write(d.join("b"), b"2").map_err(trainer::TrainerError::io(d))
    })
    .unwrap();
    assert!(!dst.join("a").exists() && dst.join("b").exists());
}

fn lora_params(s: &Server) -> Vec<(String, Vec<f32>)> {
    let p = s.state.policy.lock().unwrap();
    p.trainer
        .model
        .lora_tensors()
        .into_iter()
        .map(|(n, t)| (n, Vec::<f32>::try_from(t.flatten(0, -1)).unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_restart_next_step_equals_a_run_that_never_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path());
    let xs = seqs(3, 20);
    let adv = [1.0, -0.5, 0.25];

    // A run that never stops: three steps.
    let straight = start(&dir, Some(lora()), None, false, None).await;
    let batches: Vec<wire::Batch> = vec![batch(&straight, &xs, &adv); 3];
    for b in &batches {
        assert_eq!(post_batch(&straight.url, b).await.status(), 200);
    }
    let want = lora_params(&straight);

    // Two steps, checkpoint, "crash", restart from the checkpoint, third step.
    let ck = tmp.path().join("ckpt");
    let first = start(&dir, Some(lora()), Some(ck.clone()), false, None).await;
    for b in &batches[..2] {
        assert_eq!(post_batch(&first.url, b).await.status(), 200);
    }
    let r = trainer::publish::http_client()
        .post(format!("{}/v1/checkpoint", first.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    drop(first);
    let second = start(&dir, Some(lora()), Some(ck.clone()), true, None).await;
    {
        let p = second.state.policy.lock().unwrap();
        assert_eq!((p.version, p.trainer.opt.step), (2, 2));
    }
    let r: serde_json::Value = post_batch(&second.url, &batches[2])
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(r["policy_version"], 3);
    let got = lora_params(&second);
    assert_eq!(got.len(), want.len());
    for ((n, a), (_, b)) in got.iter().zip(&want) {
        assert_eq!(a, b, "{n} differs after restart");
    }
}

#[test]
fn batched_decode_equals_one_sequence_at_a_time() {
    let cfg: trainer::model::Qwen3Config = serde_json::from_value(serde_json::json!({
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "max_position_embeddings": 128, "rope_theta": 10000.0, "tie_word_embeddings": false
    }))
    .unwrap();
    let m = trainer::model::Qwen3::random(cfg, 5, 0.3, tch::Device::Cpu, tch::Kind::Float).unwrap();
    let prompts: Vec<Vec<i64>> = vec![vec![1, 2, 3], vec![4, 5, 6, 7, 8, 9, 10], vec![11]];
    let prefill = |c: &mut trainer::model::KvCache, p: &[i64]| {
        m.forward_cached(&tch::Tensor::from_slice(p).view([1, -1]), c, Fwd::POLICY)
    };
    let mut one: Vec<trainer::model::KvCache> = Vec::new();
    let mut many: Vec<trainer::model::KvCache> = Vec::new();
    for p in &prompts {
        let mut a = trainer::model::KvCache::new(2);
        let mut b = trainer::model::KvCache::new(2);
        let _ = prefill(&mut a, p);
        let _ = prefill(&mut b, p);
        one.push(a);
        many.push(b);
    }
    for step in 0..4i64 {
        let toks: Vec<i64> = (0..3).map(|i| (step * 13 + i * 7) % 64).collect();
        let batched = tch::no_grad(|| m.decode_step(&toks, &mut many, Fwd::POLICY));
        for (i, t) in toks.iter().enumerate() {
            let single = m.forward_cached(
                &tch::Tensor::from_slice(&[*t]).view([1, 1]),
                &mut one[i],
                Fwd::POLICY,
            );
            let diff = (batched.get(i as i64) - single.view([-1]))
                .abs()
                .max()
                .double_value(&[]);
            assert!(diff < 1e-5, "step {step} row {i}: {diff}");
            assert_eq!(many[i].seq_len(), one[i].seq_len());
        }
    }
}

/// Records every POST path and body; answers /get_server_info only when it plays SGLang.
async fn recording_server(sglang: bool) -> (String, Arc<Mutex<Vec<(String, serde_json::Value)>>>) {
    let calls: Arc<Mutex<Vec<(String, serde_json::Value)>>> = Arc::default();
    let rec = calls.clone();
    let mut app = axum::Router::new().fallback(
        move |method: axum::http::Method, uri: axum::http::Uri, body: axum::body::Bytes| {
            let rec = rec.clone();
            async move {
                if method != axum::http::Method::POST {
                    return StatusCode::NOT_FOUND; // like vLLM for routes it does not have
                }
                let v = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                rec.lock().unwrap().push((uri.path().to_string(), v));
                StatusCode::OK
            }
        },
    );
    if sglang {
        app = app.route(
            "/get_server_info",
            axum::routing::get(|| async { Json(serde_json::json!({"version": "fake"})) }),
        );
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_and_full_weight_publishing_speak_each_servers_api() {
    let (vurl, vcalls) = recording_server(false).await;
    let (surl, scalls) = recording_server(true).await;
    let http = trainer::publish::http_client();
    assert_eq!(
        trainer::publish::detect_kind(&http, &vurl).await,
        ServerKind::Vllm
    );
    assert_eq!(
        trainer::publish::detect_kind(&http, &surl).await,
        ServerKind::Sglang
    );
    let tmp = tempfile::tempdir().unwrap();
    let targets = vec![
        PublishTarget {
            url: vurl,
            kind: ServerKind::Vllm,
        },
        PublishTarget {
            url: surl,
            kind: ServerKind::Sglang,
        },
    ];
    // Full weights: vLLM's disk weight transfer, SGLang's update from disk.
    let mut full = Publisher::new(PublishConfig {
        root: tmp.path().join("full"),
        name: "pol".into(),
        window: 1,
        retries: 0,
        targets: targets.clone(),
        lora: false,
    });
    std::fs::create_dir_all(full.dir_of(1)).unwrap();
    let r = full.publish(1).await;
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    let dir = full.dir_of(1).display().to_string();
    let v: Vec<(String, serde_json::Value)> = vcalls.lock().unwrap().drain(..).collect();
    assert_eq!(
        v,
        vec![
            ("/start_weight_update".to_string(), serde_json::json!({})),
            (
                "/update_weights".to_string(),
                serde_json::json!({"update_info": {"path": dir}})
            ),
            (
                "/finish_weight_update".to_string(),
                serde_json::json!({"weight_version": "v1"})
            ),
        ]
    );
    let sg: Vec<(String, serde_json::Value)> = scalls.lock().unwrap().drain(..).collect();
    assert_eq!(
        sg,
        vec![(
            "/update_weights_from_disk".to_string(),
            serde_json::json!({"model_path": dir})
        )]
    );
    // LoRA on SGLang: its own load/unload paths (no /v1 prefix); window 1 unloads v1 at v2.
    let mut lora = Publisher::new(PublishConfig {
        root: tmp.path().join("lora"),
        name: "pol".into(),
        window: 1,
        retries: 0,
        targets: targets[1..].to_vec(),
        lora: true,
    });
    for v in 1..=2 {
        std::fs::create_dir_all(lora.dir_of(v)).unwrap();
        assert!(lora.publish(v).await.failed.is_empty());
    }
    let sg: Vec<(String, String)> = scalls
        .lock()
        .unwrap()
        .iter()
        .map(|(p, b)| (p.clone(), b["lora_name"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(
        sg,
        vec![
            ("/load_lora_adapter".to_string(), "pol-v1".to_string()),
            ("/load_lora_adapter".to_string(), "pol-v2".to_string()),
            ("/unload_lora_adapter".to_string(), "pol-v1".to_string()),
        ]
    );
}

async fn post_json(url: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let r = trainer::publish::http_client()
        .post(url)
        .json(&body)
        .send()
        .await
        .unwrap();
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(serde_json::Value::Null))
}

async fn served_version(url: &str) -> i64 {
    let st: serde_json::Value = reqwest::get(format!("{url}/v1/state"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    st["policy_version"].as_i64().unwrap()
}

/// The split layout: one `trainer serve` trains and publishes full weights to a second one that
/// only serves (where a vLLM server would stand). After each step the server's log-probs equal
/// the trainer's; a restore puts the restored weights on the server and retires the old
/// versions; the weight-transfer API refuses out-of-order calls, relative paths and a model of
/// another architecture.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_server_receives_published_full_weights_and_the_restored_policy() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path());
    let server = start(&dir, None, None, false, None).await;
    let root = std::fs::canonicalize(tmp.path()).unwrap().join("published");
    let publisher = Publisher::new(PublishConfig {
        root: root.clone(),
        name: "policy".into(),
        window: 2,
        retries: 0,
        targets: vec![PublishTarget {
            url: server.url.clone(),
            kind: ServerKind::Vllm,
        }],
        lora: false,
    });
    let ckpt = tmp.path().join("ckpt");
    let trainer = start(&dir, None, Some(ckpt), false, Some(publisher)).await;
    let xs = seqs(2, 20);
    let initial: Vec<Vec<f32>> = xs.iter().map(|t| forward_logprobs(&server, t)).collect();
    for v in 1..=3 {
        let r: serde_json::Value = post_batch(&trainer.url, &batch(&trainer, &xs, &[1.0, -1.0]))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(r["policy_version"], v);
        let p = &r["published"];
        assert_eq!(p["lora"], false);
        assert_eq!(p["loaded"], serde_json::json!([server.url]), "{p}");
        assert_eq!(served_version(&server.url).await, v);
        for t in &xs {
            let (a, b) = (forward_logprobs(&trainer, t), forward_logprobs(&server, t));
            let gap = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(gap < 1e-5, "server lags the trainer at v{v}: {gap}");
        }
    }
    assert_ne!(forward_logprobs(&server, &xs[0]), initial[0]);
    // Full weights keep the server's own model name.
    let models: serde_json::Value = reqwest::get(format!("{}/v1/models", server.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
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
        let got = forward_logprobs(&server, t);
        let gap = got
            .iter()
            .zip(want)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(gap < 1e-5, "restored weights not served: {gap}");
    }
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
    let (got, want) = (forward_logprobs(&server, &xs[0]), &initial[0]);
    let gap = got
        .iter()
        .zip(want)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
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

async fn post_batch_query(url: &str, query: &str, b: &wire::Batch) -> (u16, serde_json::Value) {
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
    reqwest::get(format!("{url}/v1/settings"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// `POST /v1/settings` and `GET /v1/settings`, and the hash check of train steps: the settings
/// are echoed with their hash; a step (or dry run) under another hash is 409 naming both; a
/// structural change at version 0 rebuilds the policy (here: a full fine-tune with a KL term,
/// whose reference is a frozen copy of the model directory, and the KL grows once the policy
/// moved); at a later version it is 409 and changes nothing; a bad value is 400 naming the
/// field; a non-structural change applies in place, and a restore rebuilds with it; a
/// checkpoint of another fine-tune mode is refused; an empty RL batch is an empty step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_are_applied_echoed_and_checked_on_every_step() {
    use wire::settings::{Finetune, ReferencePolicy, TrainSettings};
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path());
    let s = start(&dir, None, Some(tmp.path().join("ckpt")), false, None).await;
    let url = &s.url;

    // The flags' settings: full fine-tune, no KL, lr 0.05.
    let flags = get_settings(url).await;
    assert_eq!(flags.hash, flags.settings.hash());
    assert_eq!(flags.settings.lr, 0.05);
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
    let b = batch(&s, &xs, &[1.0, -1.0]);
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
        let b = batch(&s, &xs, &[1.0, -1.0]);
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
    let st: serde_json::Value = reqwest::get(format!("{url}/v1/state"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
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
    let st: serde_json::Value = reqwest::get(format!("{url}/v1/state"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
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
    let st: serde_json::Value = reqwest::get(format!("{url}/v1/state"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
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
    let st: serde_json::Value = reqwest::get(format!("{url}/v1/state"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
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
}
