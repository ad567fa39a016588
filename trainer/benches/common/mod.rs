//! What the trainer's benches share: `trainer serve` in-process on a loopback port, and a
//! completion request to it.

use std::path::Path;
use std::sync::Arc;

use trainer::service::{AppState, ServeConfig, load};

/// `trainer serve` of the model in `dir` (no KL, seed 1) on an ephemeral loopback port, on the
/// current runtime, with `prefix_cache_tokens` of prefix cache: its URL and state.
pub async fn serve(dir: &Path, prefix_cache_tokens: usize) -> (String, Arc<AppState>) {
    let train = trainer::train::TrainConfig {
        loss: trainer::loss::PolicyLossConfig {
            kl_coef: 0.0,
            ..Default::default()
        },
        ..Default::default()
    };
    let loaded = load::load(&load::LoadOptions::from_config(
        dir.to_path_buf(),
        &train,
        None,
        tch::Device::Cpu,
        1,
    ))
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = AppState::new(
        loaded.policy,
        loaded.tokenizer,
        loaded.chat_template,
        loaded.eos,
        ServeConfig {
            bind: addr,
            served_name: "policy".into(),
            checkpoint_dir: None,
            checkpoint_every: 0,
            max_body_bytes: 4096 << 20,
            prefix_cache_tokens,
            decode_attention: trainer::model::DecodeAttention::Auto,
            kv_cache_kind: None,
            max_model_len: loaded.max_model_len,
            api_token: None,
        },
        None,
    );
    let app = trainer::service::router(state.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), state)
}

/// POST a `/v1/completions` request `body` to the server at `url`: its JSON reply.
pub async fn complete(
    http: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> serde_json::Value {
    http.post(format!("{url}/v1/completions"))
        .json(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}
