//! Start-up feature detection: does a server offer what its role needs? The error names exactly
//! what is missing, e.g. "`/tokenize` (HTTP 404)" or "`return_token_ids` on /v1/completions".

use serde::Serialize;

use super::client::LlmClient;
use super::endpoints::{Endpoint, Role};
use super::error::LlmError;
use super::types::{
    ChatMessage, ChatRequest, CompletionRequest, RawChat, RawCompletion, RawEmbeddings,
    RawTokenize, TokenizeRequest,
};

/// What one endpoint was found to offer.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ServerFeatures {
    pub endpoint: String,
    pub models: Vec<String>,
    pub tokenize: bool,
    pub token_id_prompts: bool,
    pub return_token_ids: bool,
    pub logprobs: bool,
    pub chat: bool,
    pub embeddings: bool,
    /// `/version` when the server has it (vLLM).
    pub version: Option<String>,
}

fn describe(e: &LlmError) -> String {
    match e {
        LlmError::Status { status, .. } => format!("HTTP {status}"),
        LlmError::InvalidBody { reason, .. } => format!("invalid answer: {reason}"),
        other => other.to_string(),
    }
}

/// Probe one endpoint for `role` and fail with every missing feature listed.
pub async fn detect(
    client: &LlmClient,
    endpoint: &Endpoint,
    role: Role,
) -> Result<ServerFeatures, LlmError> {
    let model = client.model().to_string();
    let mut f = ServerFeatures {
        endpoint: endpoint.url.clone(),
        ..Default::default()
    };
    let mut missing = Vec::new();

    match client.models(endpoint).await {
        Ok(models) => {
            if !models.contains(&model) {
                missing.push(format!(
                    "model `{model}` in /v1/models (served: {})",
                    if models.is_empty() {
                        "none".to_string()
                    } else {
                        models.join(", ")
                    }
                ));
            }
            f.models = models;
        }
        // Nothing answers at all: no point probing further.
        Err(e @ (LlmError::Connect { .. } | LlmError::Timeout { .. })) => return Err(e),
        Err(e) => missing.push(format!("`/v1/models` ({})", describe(&e))),
    }
    f.version = version(client, endpoint).await;

    match role {
        Role::Policy => {
            let probe_text = "feature probe";
            let ids = match client
                .post_once::<_, RawTokenize>(
                    endpoint,
                    "/tokenize",
                    &TokenizeRequest {
                        model: &model,
                        prompt: probe_text,
                        add_special_tokens: false,
                    },
                )
                .await
            {
                Ok(t) if !t.tokens.is_empty() => {
                    f.tokenize = true;
                    t.tokens
                }
                Ok(_) => {
                    missing.push("`/tokenize` (returned no tokens)".into());
                    vec![1, 2, 3]
                }
                Err(e) => {
                    missing.push(format!("`/tokenize` ({})", describe(&e)));
                    vec![1, 2, 3]
                }
            };
            let mut req = CompletionRequest::new(model.clone(), ids, 4);
            req.temperature = 1.0;
            match client
                .post_once::<_, RawCompletion>(endpoint, "/v1/completions", &req)
                .await
            {
                Ok(raw) => {
                    f.token_id_prompts = true;
                    match raw.choices.first() {
                        None => missing.push("choices in /v1/completions responses".into()),
                        Some(c) => {
                            let from_strings = c
                                .logprobs
                                .as_ref()
                                .and_then(|l| l.tokens.as_ref())
                                .is_some_and(|t| {
                                    !t.is_empty() && t.iter().all(|s| s.starts_with("token_id:"))
                                });
                            f.return_token_ids = c.token_ids.is_some() || from_strings;
                            if !f.return_token_ids {
                                missing.push(
                                    "`return_token_ids` on /v1/completions (no choices[].token_ids; vLLM >= 0.10.2 or SGLang with return_token_ids)".into(),
                                );
                            }
                            let lp = c.logprobs.as_ref().and_then(|l| l.token_logprobs.as_ref());
                            let n_ids = c.token_ids.as_ref().map(Vec::len);
                            f.logprobs = match (lp, n_ids) {
                                (Some(lp), Some(n)) => {
                                    lp.len() == n && lp.iter().all(Option::is_some)
                                }
                                (Some(lp), None) => !lp.is_empty(),
                                _ => false,
                            };
                            if !f.logprobs {
                                missing.push(
                                    "sampled-token `logprobs` on /v1/completions, one per returned token id".into(),
                                );
                            }
                        }
                    }
                }
                Err(e) => missing.push(format!(
                    "token-id prompts on `/v1/completions` ({})",
                    describe(&e)
                )),
            }
        }
        Role::Judge | Role::Teacher => {
            let req = ChatRequest {
                model: model.clone(),
                messages: vec![ChatMessage::user("Reply with {}")],
                temperature: 0.0,
                max_tokens: 8,
                response_format: None,
                seed: None,
                stop: Vec::new(),
            };
            match client
                .post_once::<_, RawChat>(endpoint, "/v1/chat/completions", &req)
                .await
            {
                Ok(c) if !c.choices.is_empty() => f.chat = true,
                Ok(_) => missing.push("choices in /v1/chat/completions responses".into()),
                Err(e) => missing.push(format!("`/v1/chat/completions` ({})", describe(&e))),
            }
        }
        Role::Embeddings => {
            let input = vec!["feature probe".to_string()];
            let req = super::types::EmbeddingRequest {
                model: &model,
                input: &input,
            };
            match client
                .post_once::<_, RawEmbeddings>(endpoint, "/v1/embeddings", &req)
                .await
            {
                Ok(e) if e.data.len() == 1 && !e.data[0].embedding.is_empty() => {
                    f.embeddings = true
                }
                Ok(_) => missing.push("one non-empty vector per input from /v1/embeddings".into()),
                Err(e) => missing.push(format!("`/v1/embeddings` ({})", describe(&e))),
            }
        }
    }

    if missing.is_empty() {
        Ok(f)
    } else {
        Err(LlmError::MissingFeatures {
            endpoint: endpoint.url.clone(),
            role: role.as_str(),
            missing,
        })
    }
}

async fn version(client: &LlmClient, endpoint: &Endpoint) -> Option<String> {
    let resp = client
        .authorize(client.http().get(format!("{}/version", endpoint.url)))
        .timeout(std::time::Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let v: serde_json::Value = resp.json().await.ok()?;
    v.get("version")
        .and_then(|s| s.as_str())
        .map(str::to_string)
}

/// Detect every endpoint of a client's pool; the first failure is returned.
pub async fn detect_all(client: &LlmClient, role: Role) -> Result<Vec<ServerFeatures>, LlmError> {
    let mut out = Vec::new();
    for ep in client.pool().endpoints() {
        out.push(detect(client, ep, role).await?);
    }
    Ok(out)
}
