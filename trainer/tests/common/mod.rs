//! Helpers shared by the trainer's integration tests: a tiny random Qwen3 with its tokenizer
//! in Hugging Face layout, a free loopback port, and `trainer serve` in-process.
#![allow(dead_code)]

pub mod cases;
pub mod ranks;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use trainer::publish::Publisher;
use trainer::service::{ApiToken, AppState, ServeConfig, load};

pub fn tiny_config() -> serde_json::Value {
    serde_json::json!({
        "vocab_size": 0, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "max_position_embeddings": 512, "rope_theta": 10000.0, "tie_word_embeddings": true
    })
}

/// Tokenizer + random tiny Qwen3 in HF layout.
pub fn model_dir(tmp: &Path) -> PathBuf {
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
    let tok = tmp.join("tok");
    trainer::smallmodel::train_tokenizer(&corpus, 300, &tok).unwrap();
    let cfg = tmp.join("config.json");
    std::fs::write(&cfg, tiny_config().to_string()).unwrap();
    let out = tmp.join("model");
    trainer::smallmodel::init_model(&cfg, &tok, &out, 3).unwrap();
    out
}

/// A free TCP port on 127.0.0.1 for a child process to bind later, taken below the kernel's
/// ephemeral range. A port picked by binding `:0` and released lies inside that range, where any
/// process's next outgoing connection or `bind(:0)` may take it before the child binds it: in
/// one CI run a gloo rank's own connection took its HTTP port. Below the range only an explicit
/// bind can, so each candidate is checked by binding it, and a counter keeps one test process
/// from handing out the same port twice.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const FLOOR: u32 = 10_000;
    let ceiling = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .filter(|&low| low > FLOOR + 1_000 && low <= 65_536)
        .unwrap_or(32_768);
    let span = ceiling - FLOOR;
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let port = (FLOOR + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {FLOOR}..{ceiling}");
}

/// A `trainer serve` running in-process.
pub struct Server {
    pub url: String,
    pub state: Arc<AppState>,
}

/// `trainer serve` on an ephemeral 127.0.0.1 port, served on the test's runtime: the policy of
/// `opts` (kept for `POST /v1/restore`), checkpoints under `checkpoint_dir`, versions published
/// through `publisher`, and `api_token` required when given.
pub async fn serve_in_process(
    opts: load::LoadOptions,
    checkpoint_dir: Option<PathBuf>,
    publisher: Option<Publisher>,
    api_token: Option<ApiToken>,
) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (state, _task) = serve_on(listener, opts, checkpoint_dir, publisher, api_token);
    Server {
        url: format!("http://{addr}"),
        state,
    }
}

/// `trainer serve` on `listener`, on the current runtime, with the task serving it (abort it to
/// take the server down as a crash would).
pub fn serve_on(
    listener: tokio::net::TcpListener,
    opts: load::LoadOptions,
    checkpoint_dir: Option<PathBuf>,
    publisher: Option<Publisher>,
    api_token: Option<ApiToken>,
) -> (Arc<AppState>, tokio::task::JoinHandle<()>) {
    let loaded = load::load(&opts).unwrap();
    let addr = listener.local_addr().unwrap();
    let state = AppState::new(
        loaded.policy,
        loaded.tokenizer,
        loaded.chat_template,
        loaded.eos,
        ServeConfig {
            bind: addr,
            served_name: "policy".into(),
            checkpoint_dir,
            checkpoint_every: 0,
            max_body_bytes: 64 << 20,
            prefix_cache_tokens: 1 << 17,
            decode_attention: trainer::model::DecodeAttention::Auto,
            kv_cache_kind: None,
            max_model_len: loaded.max_model_len,
            api_token,
        },
        publisher,
    );
    state.set_load_options(opts);
    let app = trainer::service::router(state.clone());
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (state, task)
}

/// An RL sequence of `tokens`: the first 3 are prompt, the rest answer tokens spread over the
/// four stages in order, behaviour log-prob -3 each, stage advantages `adv`.
pub fn seq(tokens: Vec<i64>, adv: Vec<f32>) -> trainer::train::Sequence {
    let n = tokens.len();
    trainer::train::Sequence {
        unlikelihood: Vec::new(),
        loss_mask: (0..n).map(|t| t >= 3).collect(),
        stages: (0..n)
            .map(|t| {
                if t < 3 {
                    -1
                } else {
                    ((t - 3) * 4 / (n - 3)) as i8
                }
            })
            .collect(),
        behaviour_logprobs: vec![-3.0; n],
        advantages: adv,
        tokens,
        off_policy: false,
    }
}

/// POST `body` as JSON to `url`: the status and the JSON reply (null when it is not JSON).
pub async fn post_json(url: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let r = trainer::publish::http_client()
        .post(url)
        .json(&body)
        .send()
        .await
        .unwrap();
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(serde_json::Value::Null))
}

/// `text` without ANSI colour sequences (the ranks' logs).
pub fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
