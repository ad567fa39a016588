//! A loopback fake of an OpenAI-compatible inference server (vLLM dialect) for tests and
//! benchmarks: axum on 127.0.0.1:0, token ids and logprobs in completions, scripted replies,
//! and injectable faults (429, 500, delays past the client timeout, truncated and invalid JSON).
//! Tests only: the product never talks to it unless a test points it there.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};
use tokio::sync::Mutex;

/// What the next request (of any generating route) suffers.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    Status(u16),
    /// Sleep before answering normally.
    Delay(Duration),
    /// A 200 whose JSON body is cut in half.
    Truncated,
    /// A 200 whose body is not JSON at all.
    Garbage,
}

/// A scripted completion: the text and token ids the fake returns for the next request.
#[derive(Debug, Clone, PartialEq)]
pub struct Scripted {
    pub text: String,
    pub token_ids: Vec<u32>,
    pub finish_reason: String,
    pub stop_reason: Option<String>,
}

impl Scripted {
    /// A reply of `text` in the toy tokenisation, with the stop reason a server would report when
    /// `text` ends in a tool call or an answer.
    pub fn reply(text: &str, finish: &str) -> Self {
        let stop = ["</call_tool>", "</answer>"]
            .iter()
            .find(|s| text.ends_with(**s))
            .map(|s| s.to_string());
        Self {
            text: text.into(),
            token_ids: toy_tokenize(text),
            finish_reason: finish.into(),
            stop_reason: stop,
        }
    }
}

/// The rollout codec matching the fake's toy tokenizer, so scripted ids and our encoding agree.
pub struct ToyCodec;

impl orchestrator::pipeline::rollout::TokenCodec for ToyCodec {
    fn render_prompt(
        &self,
        system: &str,
        user: &str,
    ) -> Result<String, orchestrator::pipeline::rollout::CodecError> {
        Ok(format!("<|system|>{system}<|user|>{user}<|assistant|>"))
    }
    fn encode(&self, text: &str) -> Result<Vec<u32>, orchestrator::pipeline::rollout::CodecError> {
        Ok(toy_tokenize(text))
    }
    fn decode(&self, ids: &[u32]) -> Result<String, orchestrator::pipeline::rollout::CodecError> {
        Ok(toy_detokenize(ids))
    }
}

#[derive(Debug, Clone)]
pub struct Features {
    pub tokenize: bool,
    pub token_ids: bool,
    pub logprobs: bool,
    pub chat: bool,
    pub embeddings: bool,
    pub health: bool,
}

impl Default for Features {
    fn default() -> Self {
        Self {
            tokenize: true,
            token_ids: true,
            logprobs: true,
            chat: true,
            embeddings: true,
            health: true,
        }
    }
}

#[derive(Default)]
pub struct FakeState {
    pub faults: Mutex<VecDeque<Fault>>,
    pub scripted: Mutex<VecDeque<Scripted>>,
    pub chat_replies: Mutex<VecDeque<String>>,
    pub features: std::sync::RwLock<Features>,
    pub requests: AtomicU64,
    pub completions: AtomicU64,
    pub model: String,
    /// Constant latency added to every generating request.
    pub latency: std::sync::RwLock<Duration>,
    /// Bodies of completion requests, for assertions.
    pub last_bodies: Mutex<Vec<Value>>,
    /// The `Authorization` header of every chat request (None when absent), when recording.
    pub chat_auth: Mutex<Vec<Option<String>>>,
    pub record_bodies: std::sync::atomic::AtomicBool,
    /// When set and nothing is scripted: the reply is turn k of this list, where k is the number
    /// of `</tool_output>` already in the (toy-tokenised) prompt. Lets thousands of concurrent
    /// agent trajectories run without a shared script.
    pub auto_turns: std::sync::RwLock<Vec<String>>,
    /// When set: a prompt that asks for a reflection (it names `<reflection_takeaways>`) gets
    /// choice i = entry i % len, ahead of the script and auto turns.
    pub reflection_replies: std::sync::RwLock<Vec<String>>,
    /// Misbehave: return scripted replies whole even past `max_tokens`.
    pub ignore_max_tokens: std::sync::atomic::AtomicBool,
}

pub struct FakeServer {
    pub addr: SocketAddr,
    pub state: Arc<FakeState>,
    _server: super::loopback::Loopback,
}

impl FakeServer {
    pub async fn start() -> Self {
        Self::start_with(Features::default()).await
    }

    pub async fn start_with(features: Features) -> Self {
        let state = Arc::new(FakeState {
            model: "policy".to_string(),
            features: std::sync::RwLock::new(features),
            ..Default::default()
        });
        let app = router(state.clone());
        let server = super::loopback::Loopback::serve(app).await;
        let addr = server.addr;
        Self {
            addr,
            state,
            _server: server,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A client of `role` for this server alone, without retries.
    pub fn client(
        &self,
        role: orchestrator::infra::llm::Role,
        model: &str,
    ) -> orchestrator::infra::llm::LlmClient {
        let pool = orchestrator::infra::llm::EndpointPool::new(
            role,
            model,
            &[self.url()],
            64,
            Duration::from_secs(5),
            3,
        );
        orchestrator::infra::llm::LlmClient::new(
            orchestrator::infra::llm::build_http(Duration::from_secs(2)).unwrap(),
            Arc::new(pool),
            orchestrator::infra::llm::RetryPolicy::none(),
        )
    }

    pub async fn push_fault(&self, f: Fault) {
        self.state.faults.lock().await.push_back(f);
    }

    pub async fn push_scripted(&self, s: Scripted) {
        self.state.scripted.lock().await.push_back(s);
    }

    pub async fn push_chat(&self, content: impl Into<String>) {
        self.state
            .chat_replies
            .lock()
            .await
            .push_back(content.into());
    }

    /// Keep the body of every completion and chat request from now on (`state.last_bodies`).
    pub fn record_bodies(&self) {
        self.state.record_bodies.store(true, Ordering::SeqCst);
    }

    pub fn set_latency(&self, d: Duration) {
        *self.state.latency.write().unwrap() = d;
    }

    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::SeqCst)
    }

    pub fn completions(&self) -> u64 {
        self.state.completions.load(Ordering::SeqCst)
    }
}

pub fn router(state: Arc<FakeState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route(
            "/version",
            get(|| async { Json(json!({"version": "fake-0.1"})) }),
        )
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/embeddings", post(embeddings))
        .with_state(state)
}

async fn health(State(s): State<Arc<FakeState>>) -> StatusCode {
    if s.features.read().unwrap().health {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn models(State(s): State<Arc<FakeState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{"id": s.model, "object": "model"}]}))
}

/// Byte-level toy tokenizer: token id = byte value + 10.
pub fn toy_tokenize(text: &str) -> Vec<u32> {
    text.bytes().map(|b| u32::from(b) + 10).collect()
}

pub fn toy_detokenize(ids: &[u32]) -> String {
    let bytes: Vec<u8> = ids
        .iter()
        .map(|i| (i.saturating_sub(10)).min(255) as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

async fn tokenize(State(s): State<Arc<FakeState>>, Json(body): Json<Value>) -> Response {
    if !s.features.read().unwrap().tokenize {
        return StatusCode::NOT_FOUND.into_response();
    }
    let text = body["prompt"].as_str().unwrap_or_default();
    let tokens = toy_tokenize(text);
    Json(json!({"tokens": tokens, "count": tokens.len(), "max_model_len": 32768})).into_response()
}

async fn detokenize(Json(body): Json<Value>) -> Json<Value> {
    let ids: Vec<u32> = serde_json::from_value(body["tokens"].clone()).unwrap_or_default();
    Json(json!({"prompt": toy_detokenize(&ids)}))
}

/// Apply the next fault, if any. Returns a response to send instead of the normal one.
async fn fault(s: &FakeState, ok_body: &Value) -> Option<Response> {
    s.requests.fetch_add(1, Ordering::SeqCst);
    let latency = *s.latency.read().unwrap();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let f = s.faults.lock().await.pop_front()?;
    match f {
        Fault::Status(code) => Some(
            (
                StatusCode::from_u16(code).unwrap(),
                format!("{{\"error\":\"injected {code}\"}}"),
            )
                .into_response(),
        ),
        Fault::Delay(d) => {
            tokio::time::sleep(d).await;
            None
        }
        Fault::Truncated => {
            let text = ok_body.to_string();
            let cut = &text[..text.len() / 2];
            Some(
                (
                    StatusCode::OK,
                    [("content-type", "application/json")],
                    cut.to_string(),
                )
                    .into_response(),
            )
        }
        Fault::Garbage => Some(
            (
                StatusCode::OK,
                [("content-type", "application/json")],
                "<html>upstream exploded</html>",
            )
                .into_response(),
        ),
    }
}

/// Synthetic generation: token i = (last prompt token + 1 + i) mod 50000 + 10, logprob -0.01 * (i+1).
fn synthetic(prompt: &[u32], max_tokens: usize) -> (Vec<u32>, Vec<f32>) {
    let last = prompt.last().copied().unwrap_or(0);
    let ids: Vec<u32> = (0..max_tokens)
        .map(|i| (last + 1 + i as u32) % 50_000 + 10)
        .collect();
    let lps: Vec<f32> = (0..max_tokens).map(|i| -0.01 * (i as f32 + 1.0)).collect();
    (ids, lps)
}

async fn completions(State(s): State<Arc<FakeState>>, Json(body): Json<Value>) -> Response {
    s.completions.fetch_add(1, Ordering::SeqCst);
    if s.record_bodies.load(Ordering::Relaxed) {
        s.last_bodies.lock().await.push(body.clone());
    }
    let prompt: Vec<u32> = match serde_json::from_value(body["prompt"].clone()) {
        Ok(p) => p,
        Err(_) => {
            return (
                StatusCode::BAD_REQUEST,
                "{\"error\":\"prompt must be token ids\"}",
            )
                .into_response();
        }
    };
    let max_tokens = body["max_tokens"].as_u64().unwrap_or(16) as usize;
    let n = body["n"].as_u64().unwrap_or(1) as usize;
    let features = s.features.read().unwrap().clone();
    let mut choices = Vec::new();
    // The prompt's text is needed only to route reflection and auto-turn replies: decode it once.
    let auto = s.auto_turns.read().unwrap().clone();
    let refl = s.reflection_replies.read().unwrap().clone();
    let prompt_text = if refl.is_empty() && auto.is_empty() {
        String::new()
    } else {
        toy_detokenize(&prompt)
    };
    for index in 0..n {
        let asks_reflection = !refl.is_empty() && prompt_text.contains("<reflection_takeaways>");
        let next = if asks_reflection {
            Some(Scripted::reply(&refl[index % refl.len()], "stop"))
        } else {
            None
        };
        let next = match next {
            Some(x) => Some(x),
            None => s.scripted.lock().await.pop_front(),
        };
        let next = match next {
            Some(x) => Some(x),
            None if !auto.is_empty() => {
                let done = prompt_text.matches("</tool_output>").count();
                Some(Scripted::reply(&auto[done.min(auto.len() - 1)], "stop"))
            }
            None => None,
        };
        let (ids, lps, text, finish, stop) = match next {
            Some(sc)
                if sc.token_ids.len() > max_tokens
                    && !s.ignore_max_tokens.load(Ordering::Relaxed) =>
            {
                // Like a real server: cut at max_tokens.
                let ids = sc.token_ids[..max_tokens].to_vec();
                let lps: Vec<f32> = (0..ids.len()).map(|i| -0.05 - 0.001 * i as f32).collect();
                let text = toy_detokenize(&ids);
                (ids, lps, text, "length".to_string(), None)
            }
            Some(sc) => {
                let lps: Vec<f32> = (0..sc.token_ids.len())
                    .map(|i| -0.05 - 0.001 * i as f32)
                    .collect();
                (sc.token_ids, lps, sc.text, sc.finish_reason, sc.stop_reason)
            }
            None => {
                let (ids, lps) = synthetic(&prompt, max_tokens);
                let text = toy_detokenize(&ids);
                (ids, lps, text, "length".to_string(), None)
            }
        };
        let mut choice =
            json!({"index": index, "text": text, "finish_reason": finish, "stop_reason": stop});
        if features.token_ids {
            choice["token_ids"] = json!(ids);
        }
        if features.logprobs {
            let want_ids = body["return_tokens_as_token_ids"]
                .as_bool()
                .unwrap_or(false)
                && features.token_ids;
            let tokens: Vec<String> = ids
                .iter()
                .map(|i| {
                    if want_ids {
                        format!("token_id:{i}")
                    } else {
                        toy_detokenize(&[*i])
                    }
                })
                .collect();
            choice["logprobs"] = json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": null, "text_offset": []});
        }
        choices.push(choice);
    }
    let completion_tokens: usize = choices
        .iter()
        .map(|c| c["token_ids"].as_array().map_or(0, |a| a.len()))
        .sum();
    let resp = json!({
        "id": "cmpl-fake", "object": "text_completion", "created": 0, "model": s.model,
        "choices": choices,
        "usage": {"prompt_tokens": prompt.len(), "completion_tokens": completion_tokens},
    });
    if let Some(r) = fault(&s, &resp).await {
        return r;
    }
    Json(resp).into_response()
}

async fn chat(
    State(s): State<Arc<FakeState>>,
    headers: axum::http::HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if !s.features.read().unwrap().chat {
        return StatusCode::NOT_FOUND.into_response();
    }
    if s.record_bodies.load(Ordering::Relaxed) {
        s.last_bodies.lock().await.push(body);
        let auth = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        s.chat_auth.lock().await.push(auth);
    }
    let content = s
        .chat_replies
        .lock()
        .await
        .pop_front()
        .unwrap_or_else(|| "{}".to_string());
    let resp = json!({
        "id": "chat-fake", "object": "chat.completion", "model": s.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5},
    });
    if let Some(r) = fault(&s, &resp).await {
        return r;
    }
    Json(resp).into_response()
}

async fn embeddings(State(s): State<Arc<FakeState>>, Json(body): Json<Value>) -> Response {
    if !s.features.read().unwrap().embeddings {
        return StatusCode::NOT_FOUND.into_response();
    }
    let inputs: Vec<String> = serde_json::from_value(body["input"].clone()).unwrap_or_default();
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let v: Vec<f32> = (0..8).map(|k| ((t.len() + k) % 7) as f32 / 7.0).collect();
            json!({"index": i, "object": "embedding", "embedding": v})
        })
        .collect();
    let resp = json!({"object": "list", "data": data, "model": s.model});
    if let Some(r) = fault(&s, &resp).await {
        return r;
    }
    Json(resp).into_response()
}
