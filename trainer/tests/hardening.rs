//! `trainer serve` refuses every malformed request before it touches the policy, and no refused
//! request disables the server: the probes of the hardening issue, scaled to a tiny CPU model
//! with 64 positions. Over-long and overflowing generation lengths are refused (and the
//! generation worker stops a sequence at the position limit even when asked directly); an
//! over-long train sequence is refused by the step and by the dry run alike; a batch whose task
//! part is invalid leaves the weights as they were, reflection part included; adapters with a
//! wrong shape, dtype, a missing or an extra tensor are refused whole and leave the served and
//! trained adapter as it was; full weights with another context length or a non-float tensor
//! are refused. After each refusal `/health`, `/v1/state`, generation and training still work.
//! A server whose policy cannot be trusted says so on `/health` (503) and refuses work until a
//! restore rebuilds it; with an API token every route but `/health` needs it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{Server, post_json};
use trainer::model::Fwd;
use trainer::service::load;

/// The tiny model's position limit (`max_position_embeddings`).
const MAX_POS: usize = 64;

fn tiny_config(max_pos: usize) -> serde_json::Value {
    serde_json::json!({
        "vocab_size": 0, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "max_position_embeddings": max_pos, "rope_theta": 10000.0, "tie_word_embeddings": true
    })
}

/// The tokenizer directory (`tmp/tok`), trained once per test.
fn tokenizer(tmp: &Path) -> PathBuf {
    let tok = tmp.join("tok");
    if tok.join("tokenizer.json").exists() {
        return tok;
    }
    let corpus = tmp.join("corpus.jsonl");
    let mut lines = String::new();
    for i in 0..200 {
        lines.push_str(
            &serde_json::json!({"text": format!("gene TN{i} binds receptor {i}; <answer>yes</answer> study {i} in yeast")})
                .to_string(),
        );
        lines.push('\n');
    }
    std::fs::write(&corpus, lines).unwrap();
    trainer::smallmodel::train_tokenizer(&corpus, 300, &tok).unwrap();
    tok
}

/// A random tiny Qwen3 in HF layout under `tmp/name`.
fn model_dir(tmp: &Path, name: &str, max_pos: usize, seed: i64) -> PathBuf {
    let tok = tokenizer(tmp);
    let cfg = tmp.join(format!("{name}-config.json"));
    std::fs::write(&cfg, tiny_config(max_pos).to_string()).unwrap();
    let out = tmp.join(name);
    trainer::smallmodel::init_model(&cfg, &tok, &out, seed).unwrap();
    std::fs::canonicalize(out).unwrap()
}

fn lora() -> trainer::model::LoraConfig {
    trainer::model::LoraConfig {
        r: 4,
        alpha: 8.0,
        dropout: 0.0,
        targets: trainer::model::LoraTarget::ALL.to_vec(),
    }
}

fn options(dir: &Path, lora: Option<&trainer::model::LoraConfig>) -> load::LoadOptions {
    let mut train = trainer::train::TrainConfig::default();
    train.optim.lr = 0.05;
    train.optim.max_grad_norm = 0.0;
    train.loss.kl_coef = 0.0;
    load::LoadOptions::from_config(dir.to_path_buf(), &train, lora, tch::Device::Cpu, 11)
}

async fn start(dir: &Path, lora: Option<trainer::model::LoraConfig>) -> Server {
    start_with(dir, lora, None, None).await
}

async fn start_with(
    dir: &Path,
    lora: Option<trainer::model::LoraConfig>,
    ckpt: Option<PathBuf>,
    api_token: Option<trainer::service::ApiToken>,
) -> Server {
    common::serve_in_process(options(dir, lora.as_ref()), ckpt, None, api_token).await
}

async fn get(url: &str) -> (u16, String) {
    let r = trainer::publish::http_client()
        .get(url)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

fn message(e: &serde_json::Value) -> String {
    e["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// `/health` and `/v1/state` answer 200, and a short greedy completion and a train step work.
async fn assert_alive(s: &Server) {
    let (code, body) = get(&format!("{}/health", s.url)).await;
    assert_eq!(code, 200, "health: {body}");
    let (code, body) = get(&format!("{}/v1/state", s.url)).await;
    assert_eq!(code, 200, "state: {body}");
    let (code, r) = complete(s, &[5, 6, 7], 4).await;
    assert_eq!(code, 200, "generation: {r}");
    let version = state_version(s).await;
    let r = post_batch(&s.url, "", &batch(s, &seqs(2, 20), &[1.0, -1.0])).await;
    assert_eq!(r.0, 200, "train step: {}", r.1);
    assert_eq!(r.1["policy_version"].as_i64(), Some(version + 1));
}

async fn state_version(s: &Server) -> i64 {
    let (_, body) = get(&format!("{}/v1/state", s.url)).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["policy_version"].as_i64().unwrap()
}

async fn complete(s: &Server, prompt: &[u32], max_tokens: u64) -> (u16, serde_json::Value) {
    post_json(
        &format!("{}/v1/completions", s.url),
        serde_json::json!({"model": "policy", "prompt": prompt, "max_tokens": max_tokens,
                           "temperature": 0.0, "ignore_eos": true, "return_token_ids": true}),
    )
    .await
}

fn forward_logprobs(s: &Server, tokens: &[u32]) -> Vec<f32> {
    let p = s.state.policy.lock().unwrap();
    let seq: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
    p.trainer.logprobs(&[seq], Fwd::POLICY).remove(0)
}

/// Every trainable tensor of the policy (LoRA tensors, or all weights of a full fine-tune).
fn params(s: &Server) -> Vec<(String, Vec<f32>)> {
    let p = s.state.policy.lock().unwrap();
    p.trainer
        .model
        .trainable()
        .into_iter()
        .map(|(n, t)| {
            let v = Vec::<f32>::try_from(t.detach().flatten(0, -1).to_kind(tch::Kind::Float));
            (n, v.unwrap())
        })
        .collect()
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

fn wire_seq(s: &Server, tokens: &[u32], adv: Vec<f32>, phase: wire::Phase) -> wire::WireSequence {
    let n = tokens.len();
    let counted = n.min(8);
    wire::WireSequence {
        unlikelihood: Vec::new(),
        tokens: tokens.to_vec(),
        loss_mask: (0..n).map(|k| k >= n - counted).collect(),
        stages: (0..n)
            .map(|k| if k >= n - counted { 1 } else { -1 })
            .collect(),
        behaviour_logprobs: if n <= MAX_POS {
            forward_logprobs(s, tokens)
        } else {
            vec![0.0; n]
        },
        advantages: adv,
        group_id: 0,
        policy_version: 0,
        phase,
        off_policy: false,
    }
}

fn batch(s: &Server, xs: &[Vec<u32>], adv: &[f32]) -> wire::Batch {
    wire::Batch {
        policy_version: 0,
        rl: true,
        seqs: xs
            .iter()
            .zip(adv)
            .map(|(t, a)| wire_seq(s, t, vec![*a], wire::Phase::Task))
            .collect(),
    }
}

async fn post_batch(url: &str, query: &str, b: &wire::Batch) -> (u16, serde_json::Value) {
    let r = trainer::publish::http_client()
        .post(format!("{url}/v1/train_step?{query}"))
        .body(b.encode().unwrap())
        .send()
        .await
        .unwrap();
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(serde_json::Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generation_lengths_are_checked_without_overflow_against_the_position_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path(), "model", MAX_POS, 3);
    let s = start(&dir, Some(lora())).await;
    let prompt = [5u32, 6, 7];
    // max_tokens = 2^64 - 1 with ignore_eos: the sum with the prompt overflows.
    let (code, e) = complete(&s, &prompt, u64::MAX).await;
    assert_eq!(code, 400, "{e}");
    let msg = message(&e);
    assert!(
        msg.contains(&u64::MAX.to_string()) && msg.contains(&MAX_POS.to_string()),
        "{msg}"
    );
    // One past the limit is refused; exactly the limit runs to it.
    let (code, e) = complete(&s, &prompt, (MAX_POS - prompt.len() + 1) as u64).await;
    assert_eq!(code, 400, "{e}");
    assert!(message(&e).contains("64"), "{e}");
    let (code, r) = complete(&s, &prompt, (MAX_POS - prompt.len()) as u64).await;
    assert_eq!(code, 200, "{r}");
    assert_eq!(
        r["choices"][0]["token_ids"].as_array().unwrap().len(),
        MAX_POS - prompt.len()
    );
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    // max_tokens = 0 is refused by name (vLLM's rule), as is a prompt as long as the context.
    let (code, e) = complete(&s, &prompt, 0).await;
    assert_eq!(code, 400, "{e}");
    assert!(message(&e).contains("max_tokens = 0"), "{e}");
    let long: Vec<u32> = (0..MAX_POS as u32).map(|k| k % 200 + 5).collect();
    let (code, e) = complete(&s, &long, 1).await;
    assert_eq!(code, 400, "{e}");
    // repetition_detection out of its ranges is refused naming the value and the limit; its
    // max_pattern_size 0 is vLLM's "off" and runs.
    for (rule, needle) in [
        (
            serde_json::json!({"max_pattern_size": 8, "min_count": 1}),
            "min_count = 1; allowed: 2..=4096",
        ),
        (
            serde_json::json!({"max_pattern_size": 4097, "min_count": 2}),
            "max_pattern_size = 4097 (allowed 0..=4096)",
        ),
        (
            serde_json::json!({"max_pattern_size": 4, "min_pattern_size": 5, "min_count": 2}),
            "min_pattern_size = 5 (allowed 0..=max_pattern_size)",
        ),
    ] {
        let (code, e) = post_json(
            &format!("{}/v1/completions", s.url),
            serde_json::json!({"model": "policy", "prompt": [5, 6, 7], "max_tokens": 4,
                               "repetition_detection": rule}),
        )
        .await;
        assert_eq!(code, 400, "{e}");
        assert!(message(&e).contains(needle), "{e}");
    }
    let (code, r) = post_json(
        &format!("{}/v1/completions", s.url),
        serde_json::json!({"model": "policy", "prompt": [5, 6, 7], "max_tokens": 4,
                           "temperature": 0.0, "ignore_eos": true,
                           "repetition_detection": {"max_pattern_size": 0, "min_count": 0}}),
    )
    .await;
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    // The chat route shares the check.
    let (code, e) = post_json(
        &format!("{}/v1/chat/completions", s.url),
        serde_json::json!({"model": "policy", "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": u64::MAX}),
    )
    .await;
    assert_eq!(code, 400, "{e}");
    assert_alive(&s).await;
}

/// A generation worker on its own thread over a fresh tiny model (LoRA or full), as
/// `trainer serve` runs it: the job sender, the thread and the policy it serves.
struct Worker {
    tx: tokio::sync::mpsc::Sender<trainer::service::generate::GenJob>,
    thread: std::thread::JoinHandle<()>,
    policy: Arc<std::sync::Mutex<trainer::service::Policy>>,
}

impl Worker {
    fn start(tmp: &Path, lora: Option<&trainer::model::LoraConfig>) -> Self {
        use trainer::service::generate::{GenStats, run_worker};
        let dir = model_dir(tmp, "model", MAX_POS, 3);
        let loaded = load::load(&options(&dir, lora)).unwrap();
        let policy = Arc::new(std::sync::Mutex::new(loaded.policy));
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let tok = Arc::new(loaded.tokenizer);
        let stats = Arc::new(GenStats::default());
        let p = policy.clone();
        let thread = std::thread::spawn(move || {
            run_worker(p, tok, vec![], stats, rx, 1 << 17, Default::default())
        });
        Self { tx, thread, policy }
    }

    /// One job, answered.
    fn ask(
        &self,
        prompt: Vec<u32>,
        params: trainer::service::generate::GenParams,
    ) -> Result<Vec<trainer::service::generate::Sample>, String> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.tx
            .blocking_send(trainer::service::generate::GenJob {
                prompt,
                params,
                reply,
            })
            .unwrap();
        rx.blocking_recv().expect("the worker answers")
    }

    fn stop(self) {
        drop(self.tx);
        self.thread.join().unwrap();
    }
}

/// The generation worker itself never decodes past the position limit, even for a job that
/// skipped the request checks: it ends the sample with `length` at the limit, and refuses a
/// prompt longer than the limit with an error, and keeps serving.
#[test]
fn the_generation_worker_stops_at_the_position_limit() {
    use trainer::service::generate::GenParams;
    let tmp = tempfile::tempdir().unwrap();
    let w = Worker::start(tmp.path(), Some(&lora()));
    let params = GenParams {
        max_tokens: usize::MAX,
        temperature: 0.0,
        top_p: 1.0,
        n: 2,
        stop: vec![],
        seed: Some(1),
        include_stop_str_in_output: false,
        skip_special_tokens: true,
        ignore_eos: true,
        repetition: None,
    };
    let job = |prompt: Vec<u32>, params: GenParams| w.ask(prompt, params);
    let prompt: Vec<u32> = (0..60).map(|k| k % 200 + 5).collect();
    let samples = job(prompt, params.clone()).unwrap();
    assert_eq!(samples.len(), 2);
    for smp in &samples {
        assert_eq!(smp.token_ids.len(), MAX_POS - 60);
        assert_eq!(smp.finish_reason, "length");
    }
    let long: Vec<u32> = (0..MAX_POS as u32 + 1).map(|k| k % 200 + 5).collect();
    let e = job(long, params.clone()).unwrap_err();
    assert!(e.contains("65") && e.contains("64"), "{e}");
    // Still serving, and the policy lock is sound.
    let ok = job(
        vec![5, 6, 7],
        GenParams {
            max_tokens: 3,
            ..params
        },
    )
    .unwrap();
    assert_eq!(ok[0].token_ids.len(), 3);
    assert!(!w.policy.is_poisoned());
    w.stop();
}

/// vLLM's `repetition_detection` in the worker: greedy samples of a random model, once without
/// the rule and once with it, from the same prompt. With it, a sample is the one without it cut
/// at the first token where the rule fires (finish reason `repetition`), and unchanged where it
/// never fires; a random model's greedy text loops, so at least one sample must be cut.
#[test]
fn the_generation_worker_ends_a_loop_where_the_repetition_rule_fires() {
    use trainer::service::generate::{GenParams, RepetitionDetection};
    let tmp = tempfile::tempdir().unwrap();
    let w = Worker::start(tmp.path(), None);
    let job = |prompt: Vec<u32>, params: GenParams| w.ask(prompt, params).unwrap();
    let rule = RepetitionDetection {
        max_pattern_size: 8,
        min_pattern_size: 1,
        min_count: 3,
    };
    let plain = GenParams {
        max_tokens: 48,
        temperature: 0.0,
        top_p: 1.0,
        n: 1,
        stop: vec![],
        seed: Some(3),
        include_stop_str_in_output: false,
        skip_special_tokens: true,
        ignore_eos: true,
        repetition: None,
    };
    let mut cut = 0;
    for first in [5u32, 40, 77, 120, 150] {
        let prompt: Vec<u32> = (0..8).map(|k| first + k).collect();
        let free = job(prompt.clone(), plain.clone()).remove(0);
        let stopped = job(
            prompt,
            GenParams {
                repetition: Some(rule),
                ..plain.clone()
            },
        )
        .remove(0);
        match (1..=free.token_ids.len()).find(|&n| rule.hit(&free.token_ids[..n])) {
            Some(at) => {
                cut += 1;
                assert_eq!(stopped.token_ids, free.token_ids[..at]);
                assert_eq!(stopped.logprobs, free.logprobs[..at]);
                assert_eq!(stopped.finish_reason, "repetition");
                assert_eq!(
                    stopped.stop_reason,
                    Some(serde_json::json!("repetition_detected"))
                );
            }
            None => {
                assert_eq!(stopped.token_ids, free.token_ids);
                assert_eq!(stopped.finish_reason, free.finish_reason);
            }
        }
    }
    assert!(cut > 0, "no greedy sample of the random model looped");
    w.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_long_train_sequence_is_refused_by_the_step_and_the_dry_run() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path(), "model", MAX_POS, 3);
    let s = start(&dir, Some(lora())).await;
    let before = params(&s);
    // 66 tokens on a 64-position model (the issue's 4,098 on 4,096).
    let long: Vec<u32> = (0..MAX_POS as u32 + 2).map(|k| k % 200 + 5).collect();
    let b = wire::Batch {
        policy_version: 0,
        rl: true,
        seqs: vec![wire_seq(&s, &long, vec![1.0], wire::Phase::Task)],
    };
    for query in ["dry_run=true", "expect_version=0", ""] {
        let (code, e) = post_batch(&s.url, query, &b).await;
        assert_eq!(code, 400, "{query}: {e}");
        let msg = message(&e);
        assert!(
            msg.contains("66 tokens") && msg.contains("64"),
            "{query}: {msg}"
        );
    }
    // SFT batches are held to the same limit.
    let mut sft = b.clone();
    sft.rl = false;
    let (code, e) = post_batch(&s.url, "dry_run=true", &sft).await;
    assert_eq!(code, 400, "{e}");
    assert_eq!(params(&s), before, "a refused step changed the weights");
    assert_eq!(state_version(&s).await, 0);
    // A sequence of exactly the limit trains.
    let fits: Vec<u32> = long[..MAX_POS].to_vec();
    let b = wire::Batch {
        policy_version: 0,
        rl: true,
        seqs: vec![wire_seq(&s, &fits, vec![1.0], wire::Phase::Task)],
    };
    let (code, r) = post_batch(&s.url, "expect_version=0", &b).await;
    assert_eq!(code, 200, "{r}");
    assert_alive(&s).await;
}

/// A batch is validated whole before any optimizer step: a valid reflection part with an
/// invalid task part changes nothing (so a retry with `expect_version=0` trains on the weights
/// the client knows), and the dry run refuses it with the same message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_a_valid_reflection_part_and_an_invalid_task_part_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path(), "model", MAX_POS, 3);
    let s = start(&dir, Some(lora())).await;
    let xs = seqs(3, 20);
    let before = params(&s);
    let reflection = wire_seq(&s, &xs[0], vec![1.0], wire::Phase::Reflection);
    // Task sequences that only fail deep inside the step today: a token outside the
    // vocabulary; a counted token whose stage has no advantage (2 stage advantages, stage 3).
    let mut bad_token = wire_seq(&s, &xs[1], vec![-1.0], wire::Phase::Task);
    bad_token.tokens[3] = 100_000;
    let mut bad_stage = wire_seq(&s, &xs[2], vec![0.5, -0.5], wire::Phase::Task);
    let n = bad_stage.stages.len();
    bad_stage.stages[n - 1] = 3;
    for (bad, what) in [(bad_token, "100000"), (bad_stage, "stage 3")] {
        let b = wire::Batch {
            policy_version: 0,
            rl: true,
            seqs: vec![reflection.clone(), bad],
        };
        let (dry, e1) = post_batch(&s.url, "dry_run=true", &b).await;
        let (real, e2) = post_batch(&s.url, "expect_version=0", &b).await;
        assert_eq!((dry, real), (400, 400), "{e1} / {e2}");
        assert_eq!(
            message(&e1),
            message(&e2),
            "the dry run checks what the step checks"
        );
        assert!(message(&e2).contains(what), "{e2}");
        assert_eq!(
            params(&s),
            before,
            "a refused batch changed the weights ({what})"
        );
        assert_eq!(state_version(&s).await, 0);
    }
    // The retry at version 0 trains from the weights as they were.
    let good = wire::Batch {
        policy_version: 0,
        rl: true,
        seqs: vec![
            reflection,
            wire_seq(&s, &xs[1], vec![-1.0], wire::Phase::Task),
        ],
    };
    let (code, r) = post_batch(&s.url, "expect_version=0", &good).await;
    assert_eq!(code, 200, "{r}");
    assert_ne!(params(&s), before);
    assert_alive(&s).await;
}

/// Tensors by name, as safetensors files hold them.
type Named = Vec<(String, tch::Tensor)>;

/// Writes an adapter directory: PEFT config with rank `r` and the given tensors.
fn write_adapter(dir: &Path, r: i64, tensors: &[(String, tch::Tensor)]) {
    std::fs::create_dir_all(dir).unwrap();
    trainer::model::weights::write_file(&dir.join("adapter_model.safetensors"), tensors).unwrap();
    let cfg = serde_json::json!({
        "peft_type": "LORA", "r": r, "lora_alpha": 8.0, "lora_dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                           "down_proj"],
        "bias": "none",
    });
    std::fs::write(dir.join("adapter_config.json"), cfg.to_string()).unwrap();
}

async fn load_adapter(s: &Server, name: &str, dir: &Path) -> (u16, serde_json::Value) {
    post_json(
        &format!("{}/v1/load_lora_adapter", s.url),
        serde_json::json!({"lora_name": name, "lora_path": dir.display().to_string()}),
    )
    .await
}

/// The served greedy continuation of a fixed prompt and the policy's log-probs of a fixed
/// sequence: what "the server's output" means below.
async fn output(s: &Server) -> (serde_json::Value, Vec<f32>) {
    let (code, r) = complete(s, &[5, 6, 7, 8], 6).await;
    assert_eq!(code, 200, "{r}");
    (
        r["choices"][0]["token_ids"].clone(),
        forward_logprobs(s, &seqs(1, 20)[0]),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapters_are_checked_whole_and_swapped_in_only_when_complete() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path(), "model", MAX_POS, 3);
    let s = start(&dir, Some(lora())).await;
    // A good adapter: the served adapter's names and shapes, other (non-zero) values.
    let good: Named = {
        let p = s.state.policy.lock().unwrap();
        p.trainer
            .model
            .lora_tensors()
            .into_iter()
            .enumerate()
            .map(|(k, (n, t))| {
                let v = tch::Tensor::arange(t.numel() as i64, (tch::Kind::Float, tch::Device::Cpu))
                    .view(t.size().as_slice())
                    .sin()
                    * (0.05 + 0.001 * k as f64);
                (n, v)
            })
            .collect()
    };
    let with = |f: &dyn Fn(&mut Named)| {
        let mut v: Named = good.iter().map(|(n, t)| (n.clone(), t.copy())).collect();
        f(&mut v);
        v
    };
    let first_a = good[0].0.clone();
    let cases: Vec<(&str, i64, Named, Vec<String>)> = vec![
        (
            "shape",
            4,
            with(&|v| v[0].1 = tch::Tensor::zeros([4, 16], tch::kind::FLOAT_CPU)),
            vec![first_a.clone(), "[4, 16]".into(), "[4, 32]".into()],
        ),
        ("rank", 8, with(&|_| {}), vec!["[8, 32]".into()]),
        (
            "missing",
            4,
            with(&|v| {
                let _ = v.remove(5);
            }),
            vec![good[5].0.clone(), "missing".into()],
        ),
        (
            "extra",
            4,
            with(&|v| {
                v.push((
                    "base_model.model.model.layers.9.mlp.up_proj.lora_A.weight".into(),
                    tch::Tensor::zeros([4, 32], tch::kind::FLOAT_CPU),
                ))
            }),
            vec!["layers.9.mlp.up_proj".into()],
        ),
        (
            "dtype",
            4,
            with(&|v| v[1].1 = v[1].1.to_kind(tch::Kind::Int64)),
            vec![good[1].0.clone(), "Int64".into()],
        ),
        (
            "non-finite",
            4,
            with(&|v| v[2].1 = v[2].1.full_like(f64::NAN)),
            vec![good[2].0.clone(), "finite".into()],
        ),
    ];
    let before = params(&s);
    let out0 = output(&s).await;
    for (what, r, tensors, want) in cases {
        let d = tmp.path().join(format!("adapter-{what}"));
        write_adapter(&d, r, &tensors);
        let (code, e) = load_adapter(&s, what, &d).await;
        assert_eq!(code, 400, "{what}: {e}");
        let msg = message(&e);
        for w in &want {
            assert!(msg.contains(w.as_str()), "{what}: {msg} lacks {w}");
        }
        assert_eq!(
            params(&s),
            before,
            "{what}: a refused adapter changed the policy"
        );
        assert_eq!(
            output(&s).await,
            out0,
            "{what}: a refused adapter changed the output"
        );
        let (_, models) = get(&format!("{}/v1/models", s.url)).await;
        assert!(!models.contains(what), "{what} is served: {models}");
    }
    // After the refusals, training still moves what the server outputs.
    assert_alive(&s).await;
    let out1 = output(&s).await;
    assert_ne!(
        out1.1, out0.1,
        "training no longer changes the served policy"
    );

    // The good adapter loads whole: the policy holds exactly its tensors, and training
    // (optimizer restarted on them) changes the output again.
    let d = tmp.path().join("adapter-good");
    write_adapter(&d, 4, &good);
    let (code, r) = load_adapter(&s, "good", &d).await;
    assert_eq!(code, 200, "{r}");
    let loaded = params(&s);
    assert_eq!(loaded.len(), good.len());
    for ((n, got), (m, want)) in loaded.iter().zip(&good) {
        assert_eq!(n, m);
        assert_eq!(
            got,
            &Vec::<f32>::try_from(want.flatten(0, -1)).unwrap(),
            "{n}"
        );
    }
    let out2 = output(&s).await;
    assert_ne!(out2.1, out1.1);
    assert_alive(&s).await;
    assert_ne!(output(&s).await.1, out2.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_weights_with_another_context_or_a_non_float_tensor_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path(), "model", MAX_POS, 3);
    let s = start(&dir, None).await;
    let out0 = output(&s).await;
    // Same tensor shapes, a shorter context (the issue's 1,024 vs 4,096).
    let short = model_dir(tmp.path(), "short", 32, 4);
    // Same config, one tensor stored as integers.
    let ints = model_dir(tmp.path(), "ints", MAX_POS, 5);
    {
        let f = ints.join("model.safetensors");
        let mut t = trainer::model::weights::read_file(&f, tch::Device::Cpu, None, None).unwrap();
        let w = t.get_mut("model.norm.weight").unwrap();
        *w = w.to_kind(tch::Kind::Int64);
        let v: Vec<(String, tch::Tensor)> = t.into_iter().collect();
        trainer::model::weights::write_file(&f, &v).unwrap();
    }
    let http = format!("{}/start_weight_update", s.url);
    for (d, want) in [
        (&short, vec!["max_position_embeddings", "32", "64"]),
        (&ints, vec!["model.norm.weight", "Int64"]),
    ] {
        post_json(&http, serde_json::json!({})).await;
        let (code, e) = post_json(
            &format!("{}/update_weights", s.url),
            serde_json::json!({"update_info": {"path": d.display().to_string()}}),
        )
        .await;
        assert_eq!(code, 400, "{}: {e}", d.display());
        let msg = message(&e);
        for w in want {
            assert!(msg.contains(w), "{msg} lacks {w}");
        }
        post_json(
            &format!("{}/finish_weight_update", s.url),
            serde_json::json!({}),
        )
        .await;
        assert_eq!(
            output(&s).await,
            out0,
            "a refused update changed the output"
        );
    }
    // The advertised context is still the model's, and a request up to it is served.
    let (_, models) = get(&format!("{}/v1/models", s.url)).await;
    let models: serde_json::Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["max_model_len"], MAX_POS);
    let (code, r) = complete(&s, &[5, 6, 7], (MAX_POS - 3) as u64).await;
    assert_eq!(code, 200, "{r}");
    assert_alive(&s).await;
}

/// A server marked unhealthy (a step that could not be undone) or with its policy lock
/// poisoned answers 503 on `/health` naming why and refuses work that reads or changes the
/// policy, still answers `/v1/state`, and a restore (which rebuilds the policy) repairs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_server_says_so_refuses_work_and_a_restore_repairs_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path(), "model", MAX_POS, 3);
    let s = start_with(&dir, Some(lora()), Some(tmp.path().join("ckpt")), None).await;
    let client = orchestrator::infra::llm::trainer::TrainerClient::new(
        trainer::publish::http_client(),
        &s.url,
    );
    assert!(client.health().await);
    let b = batch(&s, &seqs(2, 20), &[1.0, -1.0]);
    type Break = Box<dyn Fn(&Server)>;
    let breaks: Vec<(&str, Break)> = vec![
        (
            "could not be undone",
            Box::new(|s: &Server| {
                s.state
                    .mark_unhealthy("train step failed: its state could not be undone (test)")
            }),
        ),
        (
            "poisoned",
            Box::new(|s: &Server| {
                let p = s.state.policy.clone();
                let r = std::thread::spawn(move || {
                    let _held = p.lock().unwrap();
                    panic!("a panic while the policy is held (test)");
                })
                .join();
                assert!(r.is_err());
            }),
        ),
    ];
    for (why, break_it) in breaks {
        break_it(&s);
        let (code, body) = get(&format!("{}/health", s.url)).await;
        assert_eq!(code, 503, "{body}");
        assert!(body.contains(why), "{body}");
        assert!(!client.health().await, "the orchestrator sees it");
        let (code, e) = post_batch(&s.url, "", &b).await;
        assert_eq!(code, 503, "{e}");
        assert!(message(&e).contains(why), "{e}");
        assert_eq!(post_batch(&s.url, "dry_run=true", &b).await.0, 503);
        assert_eq!(complete(&s, &[5, 6, 7], 2).await.0, 503);
        let (code, e) = post_json(&format!("{}/v1/checkpoint", s.url), serde_json::json!({})).await;
        assert_eq!(code, 503, "no checkpoint of unknown weights: {e}");
        assert_eq!(get(&format!("{}/v1/state", s.url)).await.0, 200);
        let r = client.restore(None, "run-after").await.unwrap();
        assert_eq!(r.policy_version, wire::PolicyVersion(0));
        assert!(client.health().await, "{why}: a restore repairs it");
        assert!(!s.state.policy.is_poisoned());
        assert_alive(&s).await;
    }
}

/// With a token every route but `/health` needs `Authorization: Bearer <token>` (401 with
/// `WWW-Authenticate` otherwise, before anything runs); the orchestrator's trainer client sends
/// it and never prints it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guards_every_route_but_health() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path(), "model", MAX_POS, 3);
    let secret = "trainer-secret-0123456789";
    let token = trainer::service::ApiToken::new(secret).unwrap();
    let s = start_with(&dir, Some(lora()), None, Some(token)).await;
    let http = trainer::publish::http_client();
    let (code, body) = get(&format!("{}/health", s.url)).await;
    assert_eq!((code, body.as_str()), (200, "ok"));
    for (method, path) in [
        ("GET", "/v1/state"),
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/train_step"),
        ("POST", "/v1/restore"),
        ("POST", "/update_weights"),
        ("GET", "/no/such/route"),
    ] {
        let url = format!("{}{path}", s.url);
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        for auth in [None, Some("Bearer wrong-token-0123456789"), Some(secret)] {
            let mut rb = http.request(m.clone(), &url).body("{}");
            if let Some(a) = auth {
                rb = rb.header("authorization", a);
            }
            let r = rb.send().await.unwrap();
            assert_eq!(r.status(), 401, "{method} {path} with {auth:?}");
            assert_eq!(r.headers()["www-authenticate"], "Bearer");
            let e: serde_json::Value = r.json().await.unwrap();
            assert!(!e.to_string().contains(secret));
        }
    }
    // The right token, with the scheme in any case.
    for scheme in ["Bearer", "bearer"] {
        let r = http
            .get(format!("{}/v1/state", s.url))
            .header("authorization", format!("{scheme} {secret}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{scheme}");
    }
    // A refused train step trained nothing.
    let b = batch(&s, &seqs(2, 20), &[1.0, -1.0]);
    let r = http
        .post(format!("{}/v1/train_step", s.url))
        .body(b.encode().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(s.state.policy.lock().unwrap().version, 0);
    // The orchestrator's client: without the token it is refused; with it, it trains.
    use orchestrator::infra::llm::trainer::TrainerClient;
    let bare = TrainerClient::new(http.clone(), &s.url).with_api_token(None);
    assert!(bare.health().await);
    let e = bare.state().await.unwrap_err().to_string();
    assert!(e.contains("401"), "{e}");
    let client = TrainerClient::new(http.clone(), &s.url).with_api_token(Some(secret));
    assert!(!format!("{client:?}").contains(secret));
    assert_eq!(
        client.state().await.unwrap().policy_version,
        wire::PolicyVersion(0)
    );
    let r = client.train_step(&b, 0, None).await.unwrap();
    assert_eq!(r.policy_version, wire::PolicyVersion(1));
    let restored = client.restore(None, "run-1").await.unwrap();
    assert_eq!(restored.policy_version, wire::PolicyVersion(0));
}
