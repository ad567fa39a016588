//! The trainer service's HTTP API as the pipeline uses it (`trainer serve`): state, train steps
//! with the compact `wire` batch, checkpoints into a sub-directory, restore, health, and the
//! queue depth of inference servers for admission control. Lives here because reqwest does.
//! When `TRAINER_API_TOKEN` is set (a trainer bound beyond loopback requires it), every request
//! carries it as `Authorization: Bearer`; the token is registered with `secrets` and never
//! printed.

use std::sync::Arc;
use std::time::Duration;

/// The environment variable holding the trainer's API token (the same one `trainer serve`
/// reads).
pub const TOKEN_ENV: &str = "TRAINER_API_TOKEN";

#[derive(Debug, thiserror::Error)]
pub enum TrainerError {
    /// Connection refused, reset, timed out: the trainer is down or restarting.
    #[error("trainer at {url} unreachable: {message}")]
    Unreachable { url: String, message: String },
    /// 409: a step is running, or the policy is not at the expected version.
    #[error("trainer at {url} refused ({what}): {message}")]
    Conflict {
        url: String,
        what: &'static str,
        message: String,
    },
    #[error("trainer at {url} answered {status} to {what}: {message}")]
    Status {
        url: String,
        what: &'static str,
        status: u16,
        message: String,
    },
    #[error("trainer at {url}: unreadable answer to {what}: {message}")]
    Body {
        url: String,
        what: &'static str,
        message: String,
    },
    #[error("train batch could not be encoded: {0}")]
    Wire(#[from] wire::WireError),
}

impl TrainerError {
    /// Worth waiting for the trainer and trying again (after re-synchronising it).
    pub fn is_transient(&self) -> bool {
        match self {
            TrainerError::Unreachable { .. } | TrainerError::Conflict { .. } => true,
            TrainerError::Status { status, .. } => *status >= 500,
            TrainerError::Body { .. } | TrainerError::Wire(_) => false,
        }
    }
}

/// `GET /v1/state` as the trainer writes it (`wire::api`), train and LoRA configs as JSON.
pub type TrainerState = wire::api::StateReply;
pub use wire::PolicyVersion;
pub use wire::api::{Published, StepMetrics, TrainReply};

/// A step's metrics as `(name, value)` pairs in the trainer's field order (finite values only).
pub fn named_metrics(m: &StepMetrics) -> Vec<(String, f64)> {
    match serde_json::to_value(m) {
        Ok(serde_json::Value::Object(map)) => map
            .into_iter()
            .filter_map(|(k, v)| v.as_f64().filter(|x| x.is_finite()).map(|x| (k, x)))
            .collect(),
        _ => Vec::new(),
    }
}

/// The versioned model name the inference servers now serve, when the trainer published.
pub fn published_name(published: Option<&Published>) -> Option<String> {
    published?.served_name().map(str::to_string)
}

/// Seconds the trainer spent publishing (0 when it did not publish).
pub fn publish_seconds(reply: &TrainReply) -> f64 {
    reply.published.as_ref().map_or(0.0, |p| p.seconds)
}

/// What a restore answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Restored {
    pub policy_version: PolicyVersion,
    /// The adapter name the servers now serve the restored policy under (LoRA publishing);
    /// `None`: ask for the servers' own model name.
    pub published_name: Option<String>,
}

/// The trainer's API token: sent only in the (sensitive) `Authorization` header; `Debug` shows
/// `TrainerToken(***)`.
#[derive(Clone)]
struct TrainerToken(Arc<str>);

impl std::fmt::Debug for TrainerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TrainerToken(***)")
    }
}

#[derive(Debug, Clone)]
pub struct TrainerClient {
    http: reqwest::Client,
    url: String,
    token: Option<TrainerToken>,
}

impl TrainerClient {
    /// A client for the trainer at `url`, sending the token of `TRAINER_API_TOKEN` when set.
    pub fn new(http: reqwest::Client, url: &str) -> Self {
        Self {
            http,
            url: url.trim_end_matches('/').to_string(),
            token: None,
        }
        .with_api_token(super::secrets::env_key(TOKEN_ENV).as_deref())
    }

    /// The same client sending `token` (none: no `Authorization` header).
    pub fn with_api_token(mut self, token: Option<&str>) -> Self {
        self.token = token.map(|t| {
            super::secrets::register(t);
            TrainerToken(Arc::from(t))
        });
        self
    }

    /// A request to `path` on the trainer, with the token when there is one.
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let rb = self.http.request(method, format!("{}{path}", self.url));
        match &self.token {
            Some(t) => rb.bearer_auth(&*t.0),
            None => rb,
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    fn unreachable(&self, e: &reqwest::Error) -> TrainerError {
        TrainerError::Unreachable {
            url: self.url.clone(),
            message: crate::domain::util::error_chain(e),
        }
    }

    async fn answer<T: serde::de::DeserializeOwned>(
        &self,
        what: &'static str,
        resp: reqwest::Response,
    ) -> Result<T, TrainerError> {
        let status = resp.status();
        let body = resp.bytes().await.map_err(|e| self.unreachable(&e))?;
        if status.is_success() {
            return serde_json::from_slice(&body).map_err(|e| TrainerError::Body {
                url: self.url.clone(),
                what,
                message: e.to_string(),
            });
        }
        let message = serde_json::from_slice::<wire::api::ErrorBody>(&body)
            .ok()
            .map(|b| b.error.message)
            .unwrap_or_else(|| String::from_utf8_lossy(&body).chars().take(300).collect());
        let message = super::secrets::redact(&message).into_owned();
        if status.as_u16() == 409 {
            return Err(TrainerError::Conflict {
                url: self.url.clone(),
                what,
                message,
            });
        }
        Err(TrainerError::Status {
            url: self.url.clone(),
            what,
            status: status.as_u16(),
            message,
        })
    }

    pub async fn health(&self) -> bool {
        matches!(
            self.request(reqwest::Method::GET, "/health")
                .timeout(Duration::from_secs(5))
                .send()
                .await,
            Ok(r) if r.status().is_success()
        )
    }

    pub async fn state(&self) -> Result<TrainerState, TrainerError> {
        let resp = self
            .request(reqwest::Method::GET, "/v1/state")
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        self.answer("state", resp).await
    }

    /// The optimisation settings the trainer holds.
    pub async fn settings(&self) -> Result<wire::SettingsReply, TrainerError> {
        let resp = self
            .request(reqwest::Method::GET, "/v1/settings")
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        self.answer("settings", resp).await
    }

    /// Send the run's optimisation settings; the trainer applies them (rebuilding the policy
    /// when they change its structure at version 0) and echoes what it now holds. A reply whose
    /// hash is not the settings' own is an error: the trainer would train with something else.
    pub async fn apply_settings(
        &self,
        settings: &wire::TrainSettings,
    ) -> Result<wire::SettingsReply, TrainerError> {
        let resp = self
            .request(reqwest::Method::POST, "/v1/settings")
            .json(settings)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        let reply: wire::SettingsReply = self.answer("settings", resp).await?;
        let want = settings.hash();
        if reply.hash != want || reply.settings.hash() != want {
            return Err(TrainerError::Body {
                url: self.url.clone(),
                what: "settings",
                message: format!(
                    "the trainer echoed settings hash {} (recomputed {}) for settings hash {want}",
                    reply.hash,
                    reply.settings.hash()
                ),
            });
        }
        Ok(reply)
    }

    /// One train step; refused unless the policy is at `expect_version` and, when
    /// `settings_hash` is given, the trainer holds settings with that hash.
    pub async fn train_step(
        &self,
        batch: &wire::Batch,
        expect_version: i64,
        settings_hash: Option<&str>,
    ) -> Result<TrainReply, TrainerError> {
        let body = batch.encode()?;
        let mut path = format!("/v1/train_step?expect_version={expect_version}");
        if let Some(h) = settings_hash {
            path.push_str("&settings_hash=");
            path.push_str(h);
        }
        let resp = self
            .request(reqwest::Method::POST, &path)
            .header("content-type", "application/octet-stream")
            .body(body)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        self.answer("train step", resp).await
    }

    /// Save weights and optimizer under `--checkpoint-dir/subdir`; returns the checkpoint's path
    /// relative to the trainer's checkpoint root.
    pub async fn checkpoint(&self, subdir: &str) -> Result<String, TrainerError> {
        let resp = self
            .request(reqwest::Method::POST, "/v1/checkpoint")
            .json(&wire::api::CheckpointRequest {
                subdir: Some(subdir.to_string()),
            })
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        let v: wire::api::CheckpointReply = self.answer("checkpoint", resp).await?;
        v.relative.ok_or_else(|| TrainerError::Body {
            url: self.url.clone(),
            what: "checkpoint",
            message: format!(
                "no relative path in the reply for {}",
                v.checkpoint.display()
            ),
        })
    }

    /// Load a checkpoint (relative path) or, with `None`, the model as started; the trainer
    /// remembers `session` so a later restart can be told apart. A trainer that publishes
    /// puts the restored weights on its servers before it answers.
    pub async fn restore(
        &self,
        checkpoint: Option<&str>,
        session: &str,
    ) -> Result<Restored, TrainerError> {
        let resp = self
            .request(reqwest::Method::POST, "/v1/restore")
            .json(&wire::api::RestoreRequest {
                checkpoint: checkpoint.map(str::to_string),
                session: Some(session.to_string()),
            })
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        let v: wire::api::RestoreReply = self.answer("restore", resp).await?;
        Ok(Restored {
            policy_version: v.policy_version,
            published_name: published_name(v.published.as_ref()),
        })
    }
}

/// Requests waiting in an inference server's queue, from its Prometheus `/metrics` (vLLM
/// `vllm:num_requests_waiting`, SGLang `sglang:num_queue_reqs`, TGI `tgi_queue_size`; summed
/// over label sets). `None` when the server exposes none of them or cannot be reached.
pub async fn queue_depth(http: &reqwest::Client, base_url: &str) -> Option<f64> {
    let text = http
        .get(format!("{}/metrics", base_url.trim_end_matches('/')))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    parse_queue_depth(&text)
}

pub fn parse_queue_depth(text: &str) -> Option<f64> {
    const NAMES: [&str; 3] = [
        "vllm:num_requests_waiting",
        "sglang:num_queue_reqs",
        "tgi_queue_size",
    ];
    let mut total = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some(name) = NAMES.iter().find(|n| {
            line.strip_prefix(**n)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        }) else {
            continue;
        };
        let rest = &line[name.len()..];
        let value = match rest.rfind('}') {
            Some(i) => &rest[i + 1..],
            None => rest,
        };
        if let Some(v) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            *total.get_or_insert(0.0) += v;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_depth_from_each_server_kind() {
        let vllm = "# HELP x\nvllm:num_requests_waiting{model_name=\"a\"} 3.0\nvllm:num_requests_waiting{model_name=\"b\"} 2\nvllm:num_requests_running 9\n";
        assert_eq!(parse_queue_depth(vllm), Some(5.0));
        assert_eq!(parse_queue_depth("sglang:num_queue_reqs 7\n"), Some(7.0));
        assert_eq!(parse_queue_depth("tgi_queue_size 1\n"), Some(1.0));
        assert_eq!(parse_queue_depth("vllm:num_requests_running 4\n"), None);
        assert_eq!(
            parse_queue_depth("vllm:num_requests_waiting_extra 4\n"),
            None
        );
    }

    #[test]
    fn only_a_fully_loaded_adapter_changes_the_served_name() {
        let p = |v: serde_json::Value| {
            published_name(serde_json::from_value::<Published>(v).ok().as_ref())
        };
        let ok =
            serde_json::json!({"name": "policy-v3", "loaded": ["u"], "failed": [], "lora": true});
        assert_eq!(p(ok.clone()), Some("policy-v3".into()));
        let mut full = ok.clone();
        full["lora"] = false.into();
        assert_eq!(p(full), None, "full weights keep the server's own name");
        let mut failed = ok.clone();
        failed["failed"] = serde_json::json!([["u2", "HTTP 500"]]);
        assert_eq!(p(failed), None);
        let mut none = ok;
        none["loaded"] = serde_json::json!([]);
        assert_eq!(p(none), None);
        assert_eq!(published_name(None), None);
    }
}
