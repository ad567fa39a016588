//! The one HTTP client towards inference servers: builds the only `reqwest::Client`, sends
//! token-in/token-out completions, structured chat, embeddings and tokenizer calls through an
//! [`EndpointPool`] with retries and failover, and validates every response.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::endpoints::{Endpoint, EndpointPool, Role};
use super::error::{LlmError, excerpt};
use super::retry::RetryPolicy;
use super::types::*;
use crate::domain::config::{EndpointPoolConfig, HealthConfig, RetryConfig};

/// Build the process's HTTP client. Every request also carries its own timeout.
#[allow(clippy::disallowed_methods)] // the HTTP-client door (clippy.toml)
pub fn build_http(connect_timeout: Duration) -> Result<reqwest::Client, LlmError> {
    reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(4096)
        .tcp_nodelay(true)
        .user_agent(concat!("rubricem-orchestrator/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| LlmError::Request {
            endpoint: "-".into(),
            message: e.to_string(),
        })
}

/// A client for fetching arbitrary web pages: every host name resolves through the SSRF guard,
/// every redirect hop is checked (IP literals never reach a resolver), and redirects are capped.
#[allow(clippy::disallowed_methods)] // the HTTP-client door (clippy.toml)
pub fn build_guarded_http(
    guard: Arc<crate::infra::tools::ssrf::AddressGuard>,
    connect_timeout: Duration,
    max_redirects: usize,
) -> Result<reqwest::Client, LlmError> {
    let policy_guard = guard.clone();
    let policy = reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() >= max_redirects {
            let err = format!("more than {max_redirects} redirects");
            return attempt.error(err);
        }
        match policy_guard.check_url(attempt.url()) {
            Ok(()) => attempt.follow(),
            Err(e) => attempt.error(e),
        }
    });
    reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .dns_resolver(Arc::new(crate::infra::tools::ssrf::GuardedResolver(guard)))
        .redirect(policy)
        .no_proxy()
        .user_agent(concat!("rubricem-browse/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| LlmError::Request {
            endpoint: "-".into(),
            message: e.to_string(),
        })
}

/// Where the time of one call went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timing {
    /// From the call to its return.
    pub total: Duration,
    /// Waiting for the server: send until the whole body was read, summed over attempts.
    pub network: Duration,
    /// Waiting for a concurrency slot on an endpoint, summed over attempts.
    pub queued: Duration,
    /// Attempts made (1 = no retry).
    pub attempts: u32,
}

impl Timing {
    /// Time spent in the client itself: routing, serialisation, parsing, validation, and backoff
    /// sleeps between attempts.
    pub fn overhead(&self) -> Duration {
        self.total
            .saturating_sub(self.network)
            .saturating_sub(self.queued)
    }
}

/// A bearer token read from the environment at start-up. It is sent only in the
/// `Authorization` header (marked sensitive) and never printed: `Debug` shows `ApiKey(***)`.
#[derive(Clone)]
pub struct ApiKey(Arc<str>);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

impl ApiKey {
    /// The key in environment variable `var`; an unset or empty variable is an error naming it.
    pub fn from_env(var: &str) -> Result<Self, LlmError> {
        match super::secrets::env_key(var) {
            Some(v) => Ok(Self(Arc::from(v))),
            None => Err(LlmError::MissingApiKey {
                var: var.to_string(),
            }),
        }
    }

    /// The key named by an optional `api_key_env` setting.
    pub fn from_setting(var: Option<&str>) -> Result<Option<Self>, LlmError> {
        var.map(Self::from_env).transpose()
    }
}

/// A client for one role's endpoint pool. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LlmClient {
    http: reqwest::Client,
    pool: Arc<EndpointPool>,
    retry: RetryPolicy,
    /// Model name used instead of the pool's (a published policy version, e.g. `policy-v7`).
    model: Option<Arc<str>>,
    /// Sent as `Authorization: Bearer` on every request (hosted APIs); self-hosted servers need none.
    api_key: Option<ApiKey>,
}

struct Attempt<T> {
    value: T,
    /// Send until the body was read.
    network: Duration,
}

impl LlmClient {
    pub fn new(http: reqwest::Client, pool: Arc<EndpointPool>, retry: RetryPolicy) -> Self {
        Self {
            http,
            pool,
            retry,
            model: None,
            api_key: None,
        }
    }

    /// The same client sending `key` as a bearer token.
    pub fn with_api_key(mut self, key: Option<ApiKey>) -> Self {
        self.api_key = key;
        self
    }

    /// Add the bearer token, if any, to a request for one of this client's endpoints.
    pub fn authorize(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(k) => rb.bearer_auth(&*k.0),
            None => rb,
        }
    }

    /// The same client (same endpoints, health and limits) asking for another model name.
    pub fn with_model(&self, model: &str) -> Self {
        Self {
            model: Some(Arc::from(model)),
            ..self.clone()
        }
    }

    /// A client for a configured pool; its API key, when `api_key_env` names one, is read from
    /// the environment now (an unset variable is an error naming it).
    /// A client for `role` on the endpoints of `pool`, with the experiment's retry and health
    /// settings, over its own HTTP client ([`build_http`], 10 s connect timeout).
    pub fn for_role(
        cfg: &crate::domain::config::Config,
        role: Role,
        pool: &EndpointPoolConfig,
    ) -> Result<Self, LlmError> {
        let http = build_http(Duration::from_secs(10))?;
        Self::from_config(http, role, pool, &cfg.retry, &cfg.health)
    }

    pub fn from_config(
        http: reqwest::Client,
        role: Role,
        cfg: &EndpointPoolConfig,
        retry: &RetryConfig,
        health: &HealthConfig,
    ) -> Result<Self, LlmError> {
        let key = ApiKey::from_setting(cfg.api_key_env.as_deref())?;
        let pool = EndpointPool::new(
            role,
            cfg.model.clone(),
            &cfg.urls,
            cfg.max_concurrency as usize,
            Duration::from_secs(cfg.timeout_secs),
            health.failures_before_unhealthy,
        );
        Ok(Self::new(http, Arc::new(pool), RetryPolicy::from_config(retry)).with_api_key(key))
    }

    pub fn pool(&self) -> &Arc<EndpointPool> {
        &self.pool
    }

    pub fn model(&self) -> &str {
        self.model.as_deref().unwrap_or(&self.pool.model)
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub fn retry_policy(&self) -> RetryPolicy {
        self.retry
    }

    pub fn with_retry_policy(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Token-in/token-out completion. `session` keeps all turns of one trajectory on one server.
    /// Every choice is validated: token ids present, one logprob per token id, and where the
    /// server also reports `token_id:N` strings they agree with the ids.
    ///
    /// Cancel-safe: dropping the future abandons the request and frees its slot.
    pub async fn complete(
        &self,
        session: &str,
        req: &CompletionRequest,
    ) -> Result<(Completion, Timing), LlmError> {
        let body = encode(req)?;
        let expected = req.n as usize;
        self.call(Some(session), |ep| {
            let body = body.clone();
            async move {
                let a = self
                    .send_json::<RawCompletion>(&ep, "/v1/completions", body)
                    .await?;
                let value = validate_completion(a.value, &ep.url, expected)?;
                Ok(Attempt {
                    value,
                    network: a.network,
                })
            }
        })
        .await
    }

    /// Chat completion (judges). Returns the assistant message's content.
    pub async fn chat(&self, req: &ChatRequest) -> Result<(ChatCompletion, Timing), LlmError> {
        let body = encode(req)?;
        self.call(None, |ep| {
            let body = body.clone();
            async move {
                let a = self
                    .send_json::<RawChat>(&ep, "/v1/chat/completions", body)
                    .await?;
                Ok(Attempt {
                    value: validate_chat(a.value, &ep.url)?,
                    network: a.network,
                })
            }
        })
        .await
    }

    /// Chat with JSON-schema structured output, parsed into `T` and checked by `validate`.
    /// Unparseable or invalid content counts as a retryable invalid body, so a judge that
    /// answers garbage is asked again before the error is returned.
    pub async fn chat_structured<T, V>(
        &self,
        req: &ChatRequest,
        validate: V,
    ) -> Result<(Structured<T>, Timing), LlmError>
    where
        T: DeserializeOwned,
        V: Fn(&T) -> Result<(), String>,
    {
        let body = encode(req)?;
        let validate = &validate;
        let (mut s, timing) = self
            .call(None, |ep| {
                let body = body.clone();
                async move {
                    let a = self
                        .send_json::<RawChat>(&ep, "/v1/chat/completions", body)
                        .await?;
                    let chat = validate_chat(a.value, &ep.url)?;
                    let value: T =
                        serde_json::from_str(strip_fences(&chat.content)).map_err(|e| {
                            LlmError::InvalidBody {
                                endpoint: ep.url.clone(),
                                reason: format!("content is not the requested JSON: {e}"),
                                excerpt: excerpt(chat.content.as_bytes()),
                            }
                        })?;
                    validate(&value).map_err(|reason| LlmError::InvalidBody {
                        endpoint: ep.url.clone(),
                        reason,
                        excerpt: excerpt(chat.content.as_bytes()),
                    })?;
                    let value = Structured {
                        value,
                        raw: chat,
                        attempts: 0,
                    };
                    Ok(Attempt {
                        value,
                        network: a.network,
                    })
                }
            })
            .await?;
        s.attempts = timing.attempts;
        Ok((s, timing))
    }

    /// `/v1/embeddings`, one vector per input in input order.
    pub async fn embed(&self, inputs: &[String]) -> Result<Vec<Vec<f32>>, LlmError> {
        let body = encode(&EmbeddingRequest {
            model: &self.pool.model,
            input: inputs,
        })?;
        let n = inputs.len();
        let (v, _) = self
            .call(None, |ep| {
                let body = body.clone();
                async move {
                    let a = self
                        .send_json::<RawEmbeddings>(&ep, "/v1/embeddings", body)
                        .await?;
                    let raw = a.value;
                    if raw.data.len() != n {
                        return Err(LlmError::InvalidBody {
                            endpoint: ep.url.clone(),
                            reason: format!("{} embeddings for {n} inputs", raw.data.len()),
                            excerpt: String::new(),
                        });
                    }
                    let mut data = raw.data;
                    data.sort_by_key(|d| d.index);
                    let value = data.into_iter().map(|d| d.embedding).collect();
                    Ok(Attempt {
                        value,
                        network: a.network,
                    })
                }
            })
            .await?;
        Ok(v)
    }

    /// `/tokenize` on the server (no special tokens added).
    pub async fn tokenize(&self, session: Option<&str>, text: &str) -> Result<Vec<u32>, LlmError> {
        let body = encode(&TokenizeRequest {
            model: &self.pool.model,
            prompt: text,
            add_special_tokens: false,
        })?;
        let (v, _) = self
            .call(session, |ep| {
                let body = body.clone();
                async move {
                    let a = self
                        .send_json::<RawTokenize>(&ep, "/tokenize", body)
                        .await?;
                    Ok(Attempt {
                        value: a.value.tokens,
                        network: a.network,
                    })
                }
            })
            .await?;
        Ok(v)
    }

    /// `/detokenize` on the server.
    pub async fn detokenize(&self, tokens: &[u32]) -> Result<String, LlmError> {
        let body = encode(&DetokenizeRequest {
            model: &self.pool.model,
            tokens,
        })?;
        let (v, _) = self
            .call(None, |ep| {
                let body = body.clone();
                async move {
                    let a = self
                        .send_json::<RawDetokenize>(&ep, "/detokenize", body)
                        .await?;
                    Ok(Attempt {
                        value: a.value.prompt,
                        network: a.network,
                    })
                }
            })
            .await?;
        Ok(v)
    }

    /// `/v1/models` of one endpoint, without retries.
    pub async fn models(&self, endpoint: &Endpoint) -> Result<Vec<String>, LlmError> {
        let raw: RawModels = self.get_json(endpoint, "/v1/models").await?;
        Ok(raw.data.into_iter().map(|m| m.id).collect())
    }

    /// Probe every endpoint once (`/health`, else `/v1/models`) and set its health flag.
    pub async fn probe_health(&self) {
        let probes = self.pool.endpoints().iter().map(|ep| async move {
            let ok = match self.get_status(ep, "/health").await {
                Ok(200..=299) => true,
                Ok(404) => self.models(ep).await.is_ok(),
                _ => false,
            };
            ep.set_healthy(ok);
        });
        futures::future::join_all(probes).await;
    }

    /// Probe health every `interval` until `cancel` fires. Shutdown does not need to wait for it.
    pub fn spawn_health_probes(
        &self,
        interval: Duration,
        cancel: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let client = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tick.tick() => client.probe_health().await,
                }
            }
        })
    }

    /// Run one logical call: pick an endpoint (sticky per session, next one on each retry), hold
    /// a concurrency slot, send, record the outcome for health, retry what is retryable.
    async fn call<'a, T, F, Fut>(
        &'a self,
        session: Option<&'a str>,
        op: F,
    ) -> Result<(T, Timing), LlmError>
    where
        F: Fn(Arc<Endpoint>) -> Fut,
        Fut: std::future::Future<Output = Result<Attempt<T>, LlmError>>,
    {
        use std::sync::atomic::{AtomicU32, Ordering};
        let start = Instant::now();
        let attempts = AtomicU32::new(0);
        // (network, queued) summed over attempts. A failed attempt's whole duration counts as
        // network time: it was spent waiting on the server.
        let waited = std::sync::Mutex::new((Duration::ZERO, Duration::ZERO));
        let (op, attempts_ref, waited_ref) = (&op, &attempts, &waited);
        let result = self
            .retry
            .run(
                || async move {
                    let n = attempts_ref.fetch_add(1, Ordering::Relaxed);
                    let ep = self.pool.select(session, n)?;
                    let q0 = Instant::now();
                    let _slot = ep.acquire().await?;
                    let queued = q0.elapsed();
                    let t0 = Instant::now();
                    let res = op(ep.clone()).await;
                    ep.record(
                        res.as_ref().map(|_| ()),
                        self.pool.failures_before_unhealthy,
                    );
                    let network = match &res {
                        Ok(a) => a.network,
                        Err(_) => t0.elapsed(),
                    };
                    if let Ok(mut w) = waited_ref.lock() {
                        w.0 += network;
                        w.1 += queued;
                    }
                    res
                },
                |e, delay| {
                    tracing::warn!(role = self.pool.role.as_str(), error = %e, ?delay, "retrying");
                },
            )
            .await;
        let (network, queued) = waited.lock().map(|w| *w).unwrap_or_default();
        let attempt = result?;
        let timing = Timing {
            total: start.elapsed(),
            network,
            queued,
            attempts: attempts.load(Ordering::Relaxed),
        };
        Ok((attempt.value, timing))
    }

    async fn send_json<R: DeserializeOwned>(
        &self,
        ep: &Endpoint,
        path: &str,
        body: bytes::Bytes,
    ) -> Result<Attempt<R>, LlmError> {
        let url = format!("{}{path}", ep.url);
        let t0 = Instant::now();
        let resp = self
            .authorize(self.http.post(&url))
            .timeout(self.pool.timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| map_reqwest(e, &ep.url, self.pool.timeout))?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| map_reqwest(e, &ep.url, self.pool.timeout))?;
        let network = t0.elapsed();
        if !status.is_success() {
            return Err(LlmError::Status {
                endpoint: ep.url.clone(),
                status: status.as_u16(),
                excerpt: excerpt(&bytes),
            });
        }
        let value = serde_json::from_slice(&bytes).map_err(|e| LlmError::InvalidBody {
            endpoint: ep.url.clone(),
            reason: e.to_string(),
            excerpt: excerpt(&bytes),
        })?;
        Ok(Attempt { value, network })
    }

    async fn get_json<R: DeserializeOwned>(
        &self,
        ep: &Endpoint,
        path: &str,
    ) -> Result<R, LlmError> {
        let resp = self
            .authorize(self.http.get(format!("{}{path}", ep.url)))
            .timeout(self.pool.timeout)
            .send()
            .await
            .map_err(|e| map_reqwest(e, &ep.url, self.pool.timeout))?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| map_reqwest(e, &ep.url, self.pool.timeout))?;
        if !status.is_success() {
            return Err(LlmError::Status {
                endpoint: ep.url.clone(),
                status: status.as_u16(),
                excerpt: excerpt(&bytes),
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| LlmError::InvalidBody {
            endpoint: ep.url.clone(),
            reason: e.to_string(),
            excerpt: excerpt(&bytes),
        })
    }

    async fn get_status(&self, ep: &Endpoint, path: &str) -> Result<u16, LlmError> {
        let resp = self
            .authorize(self.http.get(format!("{}{path}", ep.url)))
            .timeout(self.pool.timeout.min(Duration::from_secs(10)))
            .send()
            .await
            .map_err(|e| map_reqwest(e, &ep.url, self.pool.timeout))?;
        Ok(resp.status().as_u16())
    }

    /// POST a JSON body to one endpoint without retries; used by feature detection.
    pub(crate) async fn post_once<B: Serialize, R: DeserializeOwned>(
        &self,
        ep: &Endpoint,
        path: &str,
        body: &B,
    ) -> Result<R, LlmError> {
        Ok(self.send_json(ep, path, encode(body)?).await?.value)
    }
}

fn encode<B: Serialize>(body: &B) -> Result<bytes::Bytes, LlmError> {
    serde_json::to_vec(body)
        .map(bytes::Bytes::from)
        .map_err(|e| LlmError::Request {
            endpoint: "-".into(),
            message: format!("cannot encode request body: {e}"),
        })
}

fn map_reqwest(e: reqwest::Error, endpoint: &str, timeout: Duration) -> LlmError {
    if e.is_timeout() {
        LlmError::Timeout {
            endpoint: endpoint.to_string(),
            after: timeout,
        }
    } else if e.is_connect() || e.is_request() || e.is_body() || e.is_decode() {
        // Connection refused/reset, or the connection died mid-body: transient.
        LlmError::Connect {
            endpoint: endpoint.to_string(),
            message: crate::domain::util::error_chain(&e),
        }
    } else if e.is_builder() {
        LlmError::Request {
            endpoint: endpoint.to_string(),
            message: crate::domain::util::error_chain(&e),
        }
    } else {
        LlmError::Connect {
            endpoint: endpoint.to_string(),
            message: crate::domain::util::error_chain(&e),
        }
    }
}

/// Judges sometimes wrap JSON in a Markdown fence even in JSON mode.
fn strip_fences(s: &str) -> &str {
    let t = s.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return t;
    };
    let rest = rest.strip_prefix("json").unwrap_or(rest);
    rest.strip_suffix("```").unwrap_or(rest).trim()
}

fn invalid(endpoint: &str, reason: String) -> LlmError {
    LlmError::InvalidBody {
        endpoint: endpoint.to_string(),
        reason,
        excerpt: String::new(),
    }
}

fn validate_completion(
    raw: RawCompletion,
    endpoint: &str,
    expected: usize,
) -> Result<Completion, LlmError> {
    if raw.choices.len() != expected {
        return Err(invalid(
            endpoint,
            format!("{} choices for n = {expected}", raw.choices.len()),
        ));
    }
    let mut raw_choices = raw.choices;
    raw_choices.sort_by_key(|c| c.index);
    let mut choices = Vec::with_capacity(raw_choices.len());
    for c in raw_choices {
        let idx = c.index;
        let lp = c.logprobs.ok_or_else(|| {
            invalid(
                endpoint,
                format!("choice {idx} has no logprobs (request had logprobs = 0)"),
            )
        })?;
        // Ids from `token_id:N` strings, when the server sends them that way.
        let from_strings: Option<Vec<u32>> = lp.tokens.as_ref().and_then(|toks| {
            toks.iter()
                .map(|t| t.strip_prefix("token_id:").and_then(|n| n.parse().ok()))
                .collect()
        });
        let token_ids = match (c.token_ids, from_strings) {
            (Some(ids), Some(s)) if ids != s => {
                return Err(invalid(
                    endpoint,
                    format!("choice {idx}: token_ids disagree with logprobs.tokens"),
                ));
            }
            (Some(ids), _) => ids,
            (None, Some(s)) => s,
            (None, None) => {
                return Err(invalid(endpoint, format!("choice {idx} has no token_ids")));
            }
        };
        let logprobs: Vec<f32> = lp
            .token_logprobs
            .ok_or_else(|| invalid(endpoint, format!("choice {idx} has no token_logprobs")))?
            .into_iter()
            .map(|x| x.unwrap_or(f32::NAN))
            .collect();
        if logprobs.len() != token_ids.len() {
            return Err(invalid(
                endpoint,
                format!(
                    "choice {idx}: {} logprobs for {} token ids",
                    logprobs.len(),
                    token_ids.len()
                ),
            ));
        }
        if let Some(bad) = logprobs.iter().position(|x| !x.is_finite() || *x > 1e-3) {
            return Err(invalid(
                endpoint,
                format!(
                    "choice {idx}: logprob {} at position {bad} is not a log-probability",
                    logprobs[bad]
                ),
            ));
        }
        let stop_reason = match c.stop_reason {
            Some(serde_json::Value::String(s)) => Some(s),
            Some(serde_json::Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        choices.push(CompletionChoice {
            text: c.text,
            token_ids,
            logprobs,
            finish_reason: FinishReason::parse(c.finish_reason.as_deref()),
            stop_reason,
        });
    }
    Ok(Completion {
        model: raw.model,
        choices,
        usage: raw.usage.unwrap_or_default(),
        endpoint: endpoint.to_string(),
    })
}

fn validate_chat(raw: RawChat, endpoint: &str) -> Result<ChatCompletion, LlmError> {
    let choice = raw
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| invalid(endpoint, "chat response has no choices".into()))?;
    let content = choice
        .message
        .content
        .ok_or_else(|| invalid(endpoint, "chat response has no message content".into()))?;
    Ok(ChatCompletion {
        model: raw.model,
        content,
        finish_reason: FinishReason::parse(choice.finish_reason.as_deref()),
        usage: raw.usage.unwrap_or_default(),
        endpoint: endpoint.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_are_stripped() {
        assert_eq!(strip_fences("```json\n{\"a\":1}\n```"), "{\"a\":1}");
        assert_eq!(strip_fences(" {\"a\":1} "), "{\"a\":1}");
    }

    fn raw(json: serde_json::Value) -> RawCompletion {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn completion_ids_from_either_source() {
        let r = raw(
            serde_json::json!({"choices":[{"index":0,"text":"ab","token_ids":[5,6],
            "logprobs":{"tokens":["token_id:5","token_id:6"],"token_logprobs":[-0.5,-1.0]},
            "finish_reason":"stop","stop_reason":"</answer>"}]}),
        );
        let c = validate_completion(r, "e", 1).unwrap();
        assert_eq!(c.choices[0].token_ids, vec![5, 6]);
        assert_eq!(c.choices[0].stop_reason.as_deref(), Some("</answer>"));
        let r = raw(serde_json::json!({"choices":[{"text":"ab",
            "logprobs":{"tokens":["token_id:7","token_id:8"],"token_logprobs":[-0.5,-1.0]},
            "finish_reason":"length"}]}));
        let c = validate_completion(r, "e", 1).unwrap();
        assert_eq!(c.choices[0].token_ids, vec![7, 8]);
        assert_eq!(c.choices[0].finish_reason, FinishReason::Length);
    }

    #[test]
    fn completion_mismatches_are_invalid() {
        let r = raw(serde_json::json!({"choices":[{"token_ids":[5,6],
            "logprobs":{"token_logprobs":[-0.5]}}]}));
        let e = validate_completion(r, "e", 1).err().unwrap().to_string();
        assert!(e.contains("1 logprobs for 2 token ids"), "{e}");
        let r = raw(serde_json::json!({"choices":[{"token_ids":[5],
            "logprobs":{"tokens":["token_id:9"],"token_logprobs":[-0.5]}}]}));
        assert!(validate_completion(r, "e", 1).is_err());
        let r = raw(serde_json::json!({"choices":[{"text":"x"}]}));
        let e = validate_completion(r, "e", 1).err().unwrap().to_string();
        assert!(e.contains("no logprobs"), "{e}");
        let r = raw(serde_json::json!({"choices":[{"token_ids":[5],
            "logprobs":{"token_logprobs":[0.7]}}]}));
        assert!(validate_completion(r, "e", 1).is_err(), "positive logprob");
        let r = raw(serde_json::json!({"choices":[]}));
        assert!(validate_completion(r, "e", 1).is_err());
    }
}
