//! The OpenAI-compatible surface of `trainer serve` (vLLM dialect): `/v1/models`,
//! `/v1/completions` (token-id or text prompts, `return_token_ids`, sampled-token `logprobs`,
//! `prompt_logprobs` (each prompt token's log-prob and rank, and the k most likely),
//! `return_tokens_as_token_ids`, stop strings, temperature, top-p, n, max_tokens, seed),
//! `/v1/chat/completions` (the model's chat template), `/tokenize`, `/detokenize`, and
//! `/v1/load_lora_adapter` (makes an adapter directory the served and trained policy under a
//! name, after checking it whole; the optimizer restarts on the new adapter's tensors). Every
//! generation request is held to the context with overflow-checked lengths.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::generate::{GenJob, GenParams, RepetitionDetection, Sample};
use super::{ApiError, ApiResult, AppState};

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Prompt {
    Ids(Vec<u32>),
    Text(String),
    Batch(Vec<Vec<u32>>),
}

fn default_one() -> f32 {
    1.0
}
fn default_n() -> usize {
    1
}
fn default_max() -> usize {
    16
}

#[derive(Debug, Deserialize)]
struct CompletionBody {
    model: String,
    prompt: Prompt,
    #[serde(default = "default_max")]
    max_tokens: usize,
    #[serde(default = "default_one")]
    temperature: f32,
    #[serde(default = "default_one")]
    top_p: f32,
    #[serde(default = "default_n")]
    n: usize,
    #[serde(default)]
    stop: Option<StopField>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    include_stop_str_in_output: bool,
    #[serde(default = "yes")]
    skip_special_tokens: bool,
    #[serde(default)]
    return_token_ids: bool,
    #[serde(default)]
    return_tokens_as_token_ids: bool,
    #[serde(default)]
    logprobs: Option<u32>,
    /// vLLM's extension: per prompt token, its log-prob and rank plus the k most likely.
    #[serde(default)]
    prompt_logprobs: Option<u32>,
    #[serde(default)]
    ignore_eos: bool,
    /// vLLM's (>= 0.17) loop stop: finish reason `repetition`.
    #[serde(default)]
    repetition_detection: Option<RepetitionDetection>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    fn into_vec(self) -> Vec<String> {
        match self {
            StopField::One(s) => vec![s],
            StopField::Many(v) => v,
        }
    }
}

#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    content: String,
}

#[derive(Debug, Deserialize)]
struct ChatBody {
    model: String,
    messages: Vec<ChatMessage>,
    #[serde(default = "default_max")]
    max_tokens: usize,
    #[serde(default = "default_one")]
    temperature: f32,
    #[serde(default = "default_one")]
    top_p: f32,
    #[serde(default = "default_n")]
    n: usize,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    stop: Option<StopField>,
    #[serde(default)]
    repetition_detection: Option<RepetitionDetection>,
}

const MAX_N: usize = 64;
/// The largest loop block and copy count `repetition_detection` may ask for.
const MAX_PATTERN: usize = 4096;
/// The most `prompt_logprobs` alternatives a request may ask for (vLLM's `max_logprobs`).
const MAX_PROMPT_LOGPROBS: u32 = 20;

fn check_model(s: &AppState, model: &str) -> ApiResult<()> {
    let names = s.served_names();
    if names.iter().any(|n| n == model) {
        Ok(())
    } else {
        Err(ApiError::not_found(format!(
            "model `{model}` is not served; served: {}",
            names.join(", ")
        )))
    }
}

/// The request's sampling values and lengths: prompt plus `max_tokens` (added with overflow
/// checked) within `context`, the tokens the server serves.
fn check_params(prompt_len: usize, p: &GenParams, context: usize) -> ApiResult<()> {
    let bad = |m: String| Err(ApiError::BadRequest(m));
    if p.n == 0 || p.n > MAX_N {
        return bad(format!("n = {} is out of range; allowed: 1..={MAX_N}", p.n));
    }
    if !((0.0..=100.0).contains(&p.temperature) && p.top_p > 0.0 && p.top_p <= 1.0) {
        return bad(format!(
            "temperature = {} (allowed 0..=100) or top_p = {} (allowed (0, 1]) out of range",
            p.temperature, p.top_p
        ));
    }
    if prompt_len == 0 {
        return bad("empty prompt".into());
    }
    if p.max_tokens == 0 {
        return bad("max_tokens = 0; allowed: at least 1".into());
    }
    if let Some(r) = p.repetition.filter(|r| r.max_pattern_size > 0) {
        if r.max_pattern_size > MAX_PATTERN || r.min_pattern_size > r.max_pattern_size {
            return bad(format!(
                "repetition_detection: max_pattern_size = {} (allowed 0..={MAX_PATTERN}), \
                 min_pattern_size = {} (allowed 0..=max_pattern_size)",
                r.max_pattern_size, r.min_pattern_size
            ));
        }
        if !(2..=MAX_PATTERN).contains(&r.min_count) {
            return bad(format!(
                "repetition_detection: min_count = {}; allowed: 2..={MAX_PATTERN}",
                r.min_count
            ));
        }
    }
    match prompt_len.checked_add(p.max_tokens) {
        Some(total) if total <= context => Ok(()),
        _ => bad(format!(
            "prompt ({prompt_len} tokens) + max_tokens ({}) exceeds the context of {context} \
             tokens",
            p.max_tokens
        )),
    }
}

/// Check the request against the limits (the advertised context and the model's own position
/// limit, whichever is smaller; the vocabulary), then generate.
async fn run(s: &AppState, prompt: Vec<u32>, params: GenParams) -> ApiResult<Vec<Sample>> {
    s.ensure_healthy()?;
    let limits = s.limits()?;
    check_params(
        prompt.len(),
        &params,
        s.cfg.max_model_len.min(limits.max_positions),
    )?;
    let vocab = limits.vocab;
    if let Some(t) = prompt.iter().find(|&&t| i64::from(t) >= vocab) {
        return Err(ApiError::bad_request(format!(
            "token id {t} is out of range; the vocabulary has {vocab} ids"
        )));
    }
    let (tx, rx) = oneshot::channel();
    s.gen_tx
        .send(GenJob {
            prompt,
            params,
            reply: tx,
        })
        .await
        .map_err(|_| worker_stopped())?;
    match rx.await {
        Ok(Ok(samples)) => Ok(samples),
        Ok(Err(e)) => Err(ApiError::Internal(e)),
        Err(_) => Err(worker_stopped()),
    }
}

fn worker_stopped() -> ApiError {
    ApiError::Unavailable("generation worker stopped".into())
}

fn encode(s: &AppState, text: &str, special: bool) -> ApiResult<Vec<u32>> {
    s.tokenizer
        .encode(text, special)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| ApiError::bad_request(format!("cannot tokenize: {e}")))
}

async fn completions(
    State(s): State<Arc<AppState>>,
    Json(b): Json<CompletionBody>,
) -> ApiResult<Json<Value>> {
    check_model(&s, &b.model)?;
    let prompt = match b.prompt {
        Prompt::Ids(ids) => ids,
        Prompt::Batch(mut v) if v.len() == 1 => v.remove(0),
        Prompt::Batch(v) => {
            return Err(ApiError::bad_request(format!(
                "{} prompts in one request; send one prompt per request",
                v.len()
            )));
        }
        Prompt::Text(t) => encode(&s, &t, false)?,
    };
    let params = GenParams {
        max_tokens: b.max_tokens,
        temperature: b.temperature,
        top_p: b.top_p,
        n: b.n,
        stop: b.stop.map(StopField::into_vec).unwrap_or_default(),
        seed: b.seed,
        include_stop_str_in_output: b.include_stop_str_in_output,
        skip_special_tokens: b.skip_special_tokens,
        ignore_eos: b.ignore_eos,
        repetition: b.repetition_detection,
    };
    if let Some(k) = b.prompt_logprobs.filter(|&k| k > MAX_PROMPT_LOGPROBS) {
        return Err(ApiError::bad_request(format!(
            "prompt_logprobs = {k}; allowed: 0..={MAX_PROMPT_LOGPROBS}"
        )));
    }
    let n_prompt = prompt.len();
    let scored = b.prompt_logprobs.map(|k| (prompt.clone(), k));
    let samples = run(&s, prompt, params).await?;
    // Scored after generation checked the prompt (length, vocabulary), under the policy as it
    // is then: a train step between the two would make them differ by a version.
    let prompt_lps = match scored {
        Some((ids, k)) => Some(prompt_logprobs(&s, ids, k).await?),
        None => None,
    };
    let mut completion_tokens = 0;
    let choices: Vec<Value> = samples
        .into_iter()
        .enumerate()
        .map(|(i, smp)| {
            completion_tokens += smp.token_ids.len();
            let mut c = json!({
                "index": i, "text": smp.text, "finish_reason": smp.finish_reason,
                "stop_reason": smp.stop_reason,
            });
            if b.return_token_ids {
                c["token_ids"] = json!(smp.token_ids);
            }
            if b.logprobs.is_some() {
                let tokens: Vec<String> = smp
                    .token_ids
                    .iter()
                    .map(|t| {
                        if b.return_tokens_as_token_ids {
                            format!("token_id:{t}")
                        } else {
                            s.tokenizer.decode(&[*t], false).unwrap_or_default()
                        }
                    })
                    .collect();
                c["logprobs"] = json!({"tokens": tokens, "token_logprobs": smp.logprobs});
            }
            if let Some(p) = &prompt_lps {
                c["prompt_logprobs"] = p.clone();
            }
            c
        })
        .collect();
    Ok(Json(json!({
        "id": format!("cmpl-{}", s.stats.generated_tokens.load(std::sync::atomic::Ordering::Relaxed)),
        "object": "text_completion",
        "model": b.model,
        "choices": choices,
        "usage": {"prompt_tokens": n_prompt, "completion_tokens": completion_tokens,
                  "total_tokens": n_prompt + completion_tokens},
    })))
}

/// vLLM's `prompt_logprobs` value: `null` for the first token, then per token an object keyed
/// by token id (the token itself and the `k` most likely) of `{logprob, rank, decoded_token}`.
async fn prompt_logprobs(s: &Arc<AppState>, prompt: Vec<u32>, k: u32) -> ApiResult<Value> {
    let st = s.clone();
    let positions = tokio::task::spawn_blocking(move || -> ApiResult<_> {
        let p = st.policy.lock().map_err(|_| ApiError::poisoned())?;
        let seq: Vec<i64> = prompt.iter().map(|&t| i64::from(t)).collect();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            p.trainer
                .prompt_logprobs(&seq, i64::from(k), crate::model::Fwd::POLICY)
        }))
        .map_err(|_| ApiError::Internal("the forward pass for prompt_logprobs failed".into()))
    })
    .await??;
    let entry = |id: u32, logprob: f32, rank: i64| {
        json!({"logprob": logprob, "rank": rank,
               "decoded_token": s.tokenizer.decode(&[id], false).unwrap_or_default()})
    };
    let mut out = vec![Value::Null];
    for pos in positions {
        let mut m = serde_json::Map::new();
        for (r, &(id, lp)) in pos.top.iter().enumerate() {
            m.insert(id.to_string(), entry(id, lp, r as i64 + 1));
        }
        // The token itself, with the value the trainer trains on.
        m.insert(
            pos.token.to_string(),
            entry(pos.token, pos.logprob, pos.rank),
        );
        out.push(Value::Object(m));
    }
    Ok(Value::Array(out))
}

fn render_chat(s: &AppState, messages: &[ChatMessage]) -> ApiResult<String> {
    let Some(tmpl) = &s.chat_template else {
        return Err(ApiError::bad_request(
            "the model directory has no chat template (tokenizer_config.json chat_template)",
        ));
    };
    let msgs: Vec<(&str, &str)> = messages
        .iter()
        .map(|m| (m.role.as_str(), m.content.as_str()))
        .collect();
    crate::chat::render(tmpl, &msgs, true)
        .map_err(|e| ApiError::bad_request(format!("chat template: {e}")))
}

async fn chat(State(s): State<Arc<AppState>>, Json(b): Json<ChatBody>) -> ApiResult<Json<Value>> {
    check_model(&s, &b.model)?;
    let text = render_chat(&s, &b.messages)?;
    let prompt = encode(&s, &text, false)?;
    let params = GenParams {
        max_tokens: b.max_tokens,
        temperature: b.temperature,
        top_p: b.top_p,
        n: b.n,
        stop: b.stop.map(StopField::into_vec).unwrap_or_default(),
        seed: b.seed,
        include_stop_str_in_output: false,
        skip_special_tokens: true,
        ignore_eos: false,
        repetition: b.repetition_detection,
    };
    let n_prompt = prompt.len();
    let samples = run(&s, prompt, params).await?;
    let completion_tokens: usize = samples.iter().map(|x| x.token_ids.len()).sum();
    let choices: Vec<Value> = samples
        .into_iter()
        .enumerate()
        .map(|(i, smp)| {
            json!({"index": i, "message": {"role": "assistant", "content": smp.text},
                   "finish_reason": smp.finish_reason})
        })
        .collect();
    Ok(Json(json!({
        "id": "chatcmpl-trainer", "object": "chat.completion", "model": b.model,
        "choices": choices,
        "usage": {"prompt_tokens": n_prompt, "completion_tokens": completion_tokens,
                  "total_tokens": n_prompt + completion_tokens},
    })))
}

#[derive(Debug, Deserialize)]
struct TokenizeBody {
    prompt: String,
    #[serde(default = "yes")]
    add_special_tokens: bool,
}

async fn tokenize(
    State(s): State<Arc<AppState>>,
    Json(b): Json<TokenizeBody>,
) -> ApiResult<Json<Value>> {
    let ids = encode(&s, &b.prompt, b.add_special_tokens)?;
    Ok(Json(
        json!({"tokens": ids, "count": ids.len(), "max_model_len": s.cfg.max_model_len}),
    ))
}

#[derive(Debug, Deserialize)]
struct DetokenizeBody {
    tokens: Vec<u32>,
}

async fn detokenize(
    State(s): State<Arc<AppState>>,
    Json(b): Json<DetokenizeBody>,
) -> ApiResult<Json<Value>> {
    let t = s
        .tokenizer
        .decode(&b.tokens, false)
        .map_err(|e| ApiError::bad_request(format!("cannot detokenize: {e}")))?;
    Ok(Json(json!({"prompt": t})))
}

async fn models(State(s): State<Arc<AppState>>) -> Json<Value> {
    let data: Vec<Value> = s
        .served_names()
        .into_iter()
        .map(|n| json!({"id": n, "object": "model", "owned_by": "trainer", "max_model_len": s.cfg.max_model_len}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

#[derive(Debug, Deserialize)]
struct LoadLora {
    lora_name: String,
    lora_path: String,
}

/// Make an adapter directory the served and trained adapter: read and checked whole against
/// the model first (`lora::stage_adapter`: names, shapes, dtype, finite values; nothing missing,
/// nothing extra) without holding the policy, then swapped in at once with a fresh optimizer.
/// A refused adapter (400) changes nothing.
async fn load_lora(
    State(s): State<Arc<AppState>>,
    Json(b): Json<LoadLora>,
) -> ApiResult<Json<Value>> {
    s.ensure_healthy()?;
    // A train step on this process would race the swap.
    let Ok(_guard) = s.training.try_lock() else {
        return Err(ApiError::conflict("a train step is running"));
    };
    let st = s.clone();
    let path = std::path::PathBuf::from(&b.lora_path);
    let refuse = |e: String| ApiError::bad_request(format!("cannot load {}: {e}", b.lora_path));
    let res = tokio::task::spawn_blocking(move || -> ApiResult<()> {
        let (projections, device) = {
            let p = st.policy.lock().map_err(|_| ApiError::poisoned())?;
            p.single_rank_only("loading an adapter")
                .map_err(ApiError::Conflict)?;
            if p.trainer.reference.is_some() {
                return Err(ApiError::bad_request(
                    "this policy is a full fine-tune with a frozen reference copy (KL term); an \
                     adapter cannot be trained against it",
                ));
            }
            let m = &p.trainer.model;
            (m.projection_shapes(), m.device)
        };
        // Read and check the adapter without holding the policy: generation goes on meanwhile.
        let staged = crate::model::lora::stage_adapter(&projections, device, &path)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let mut p = st.policy.lock().map_err(|_| ApiError::poisoned())?;
        if p.trainer.model.projection_shapes() != projections {
            return Err(ApiError::conflict(
                "the policy changed while the adapter was read; send the request again",
            ));
        }
        let cfg = staged.attach(&mut p.trainer.model);
        p.weights_changed();
        // The optimizer held the previous adapter's tensors: start it afresh on the new ones.
        let params = p.trainer.model.trainable();
        p.trainer.opt = crate::optim::AdamW::new(params, p.trainer.cfg.optim.clone());
        p.lora = Some(cfg);
        Ok(())
    })
    .await;
    match res? {
        Ok(()) => {}
        Err(ApiError::BadRequest(e)) => return Err(refuse(e)),
        Err(e) => return Err(e),
    }
    s.add_alias(b.lora_name.clone(), 8);
    Ok(Json(json!({"loaded": b.lora_name})))
}

pub(super) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/v1/load_lora_adapter", post(load_lora))
}
