//! An MLflow tracking server over its REST API (`/api/2.0/mlflow/...`): find or create the
//! experiment, find a run by tag or create it, log metrics in batches of at most 1,000 and
//! parameters in batches of at most 100 (`runs/log-batch`), and set the run's final status.
//! Requests go through the project's HTTP builder with a per-request timeout and the shared
//! retry policy (429, 408, 5xx, connection errors). A token, when the server wants one, comes
//! from `MLFLOW_TRACKING_TOKEN` only, is sent as `Authorization: Bearer`, and is registered so
//! that no error text can carry it.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use super::TrackingError;
use crate::domain::tracking::{MLFLOW_MAX_METRICS, MLFLOW_MAX_PARAMS, Point};
use crate::infra::llm::{RetryPolicy, error::excerpt, secrets};

/// The environment variable the token is read from.
pub const TOKEN_ENV: &str = "MLFLOW_TRACKING_TOKEN";

/// A client for one MLflow server.
#[derive(Clone)]
pub struct MlflowClient {
    http: reqwest::Client,
    base: String,
    /// Shown in messages: the base URL without credentials.
    shown: String,
    token: Option<String>,
    retry: RetryPolicy,
    timeout: Duration,
}

impl std::fmt::Debug for MlflowClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MlflowClient")
            .field("base", &self.shown)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish()
    }
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error_code: String,
    #[serde(default)]
    message: String,
}

impl MlflowClient {
    /// A client for the server at `url`, its token (if any) from [`TOKEN_ENV`].
    pub fn new(url: &str, retry: RetryPolicy) -> Result<Self, TrackingError> {
        let parsed = url::Url::parse(url).map_err(|_| TrackingError::BadUrl { url: url.into() })?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
            return Err(TrackingError::BadUrl { url: url.into() });
        }
        let shown = crate::domain::util::redact_url(url);
        let http = crate::infra::llm::build_http(Duration::from_secs(10)).map_err(|e| {
            TrackingError::Http {
                endpoint: shown.clone(),
                message: e.to_string(),
            }
        })?;
        Ok(Self {
            http,
            base: url.trim_end_matches('/').to_string(),
            shown,
            token: secrets::env_key(TOKEN_ENV),
            retry,
            timeout: Duration::from_secs(15),
        })
    }

    /// The same client with another per-request timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The server's base URL, without credentials.
    pub fn url(&self) -> &str {
        &self.shown
    }

    /// One request, retried; the reply's JSON body.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Value,
    ) -> Result<Value, TrackingError> {
        let endpoint = format!("{}/api/2.0/mlflow/{path}", self.shown.trim_end_matches('/'));
        let url = format!("{}/api/2.0/mlflow/{path}", self.base);
        let op = || {
            let (url, endpoint, body, method) = (&url, &endpoint, &body, method.clone());
            async move {
                let mut req = self.http.request(method.clone(), url).timeout(self.timeout);
                req = if method == reqwest::Method::GET {
                    req.query(&query_pairs(body))
                } else {
                    req.json(body)
                };
                if let Some(t) = &self.token {
                    req = req.bearer_auth(t);
                }
                let http_err = |e: reqwest::Error| TrackingError::Http {
                    endpoint: endpoint.clone(),
                    message: secrets::redact(&e.without_url().to_string()).into_owned(),
                };
                let resp = req.send().await.map_err(http_err)?;
                let status = resp.status();
                let bytes = resp.bytes().await.map_err(http_err)?;
                if !status.is_success() {
                    let (code, message) = match serde_json::from_slice::<ErrorBody>(&bytes) {
                        Ok(b) => (b.error_code, excerpt(b.message.as_bytes())),
                        Err(_) => (String::new(), excerpt(&bytes)),
                    };
                    return Err(TrackingError::Status {
                        endpoint: endpoint.clone(),
                        status: status.as_u16(),
                        code,
                        message,
                    });
                }
                if bytes.iter().all(u8::is_ascii_whitespace) {
                    return Ok(Value::Object(Default::default()));
                }
                serde_json::from_slice(&bytes).map_err(|e| TrackingError::Decode {
                    endpoint: endpoint.clone(),
                    message: e.to_string(),
                })
            }
        };
        self.retry
            .run_when(op, TrackingError::is_retryable, |e, d| {
                let delay_ms = d.as_millis() as u64;
                tracing::debug!(error = %e, delay_ms, "MLflow request retried");
            })
            .await
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value, TrackingError> {
        self.call(reqwest::Method::POST, path, body).await
    }

    fn field<'a>(&self, v: &'a Value, pointer: &str, what: &str) -> Result<&'a str, TrackingError> {
        v.pointer(pointer)
            .and_then(Value::as_str)
            .ok_or_else(|| TrackingError::Decode {
                endpoint: self.shown.clone(),
                message: format!("{what}: no `{pointer}` in the reply"),
            })
    }

    /// The id of experiment `name`, created when missing.
    pub async fn experiment_id(&self, name: &str) -> Result<String, TrackingError> {
        let missing = |e: &TrackingError| {
            matches!(e, TrackingError::Status { status, code, .. }
                if *status == 404 || code == "RESOURCE_DOES_NOT_EXIST")
        };
        let get = || {
            self.call(
                reqwest::Method::GET,
                "experiments/get-by-name",
                json!({ "experiment_name": name }),
            )
        };
        match get().await {
            Ok(v) => {
                return Ok(self
                    .field(&v, "/experiment/experiment_id", "experiments/get-by-name")?
                    .to_string());
            }
            Err(e) if missing(&e) => {}
            Err(e) => return Err(e),
        }
        match self
            .post("experiments/create", json!({ "name": name }))
            .await
        {
            Ok(v) => Ok(self
                .field(&v, "/experiment_id", "experiments/create")?
                .to_string()),
            // Created by someone else meanwhile.
            Err(TrackingError::Status { code, .. }) if code == "RESOURCE_ALREADY_EXISTS" => {
                let v = get().await?;
                Ok(self
                    .field(&v, "/experiment/experiment_id", "experiments/get-by-name")?
                    .to_string())
            }
            Err(e) => Err(e),
        }
    }

    /// The newest run of `experiment_id` whose tag `key` is `value`, if any.
    pub async fn find_run(
        &self,
        experiment_id: &str,
        key: &str,
        value: &str,
    ) -> Result<Option<String>, TrackingError> {
        let filter = format!("tags.`{key}` = '{}'", value.replace('\'', "\\'"));
        let v = self
            .post(
                "runs/search",
                json!({
                    "experiment_ids": [experiment_id],
                    "filter": filter,
                    "max_results": 1,
                    "order_by": ["attributes.start_time DESC"],
                }),
            )
            .await?;
        Ok(v.pointer("/runs/0/info/run_id")
            .and_then(Value::as_str)
            .map(str::to_string))
    }

    /// Create a run named `name` with `tags`; its id.
    pub async fn create_run(
        &self,
        experiment_id: &str,
        name: &str,
        start_ms: i64,
        tags: &[(String, String)],
    ) -> Result<String, TrackingError> {
        let tags: Vec<Value> = tags
            .iter()
            .map(|(k, v)| json!({ "key": k, "value": v }))
            .collect();
        let v = self
            .post(
                "runs/create",
                json!({
                    "experiment_id": experiment_id,
                    "run_name": name,
                    "start_time": start_ms,
                    "tags": tags,
                }),
            )
            .await?;
        Ok(self
            .field(&v, "/run/info/run_id", "runs/create")?
            .to_string())
    }

    /// Set a run's status (`RUNNING`, `FINISHED`, `FAILED`, `KILLED`), with an end time for a
    /// terminal one.
    pub async fn set_status(
        &self,
        run_id: &str,
        status: &str,
        end_ms: Option<i64>,
    ) -> Result<(), TrackingError> {
        let mut body = json!({ "run_id": run_id, "status": status });
        if let Some(t) = end_ms {
            body["end_time"] = json!(t);
        }
        self.post("runs/update", body).await.map(|_| ())
    }

    /// Log `points` as metrics (key = tag, timestamp = wall time, step), in requests of at
    /// most [`MLFLOW_MAX_METRICS`]. Returns the requests sent. A failed request fails the call;
    /// the requests before it are logged (MLflow keeps every value, so resending is harmless).
    pub async fn log_metrics(
        &self,
        run_id: &str,
        points: &[Point],
    ) -> Result<usize, TrackingError> {
        let mut requests = 0;
        for chunk in points.chunks(MLFLOW_MAX_METRICS) {
            let metrics: Vec<Value> = chunk
                .iter()
                .map(|p| {
                    json!({"key": p.tag, "value": p.value, "timestamp": p.wall_ms, "step": p.step})
                })
                .collect();
            self.post(
                "runs/log-batch",
                json!({ "run_id": run_id, "metrics": metrics }),
            )
            .await?;
            requests += 1;
        }
        Ok(requests)
    }

    /// Log parameters (key, value) in requests of at most [`MLFLOW_MAX_PARAMS`]. MLflow refuses
    /// to change a logged parameter, so this is for a run's first start only.
    pub async fn log_params(
        &self,
        run_id: &str,
        params: &[(String, String)],
    ) -> Result<(), TrackingError> {
        for chunk in params.chunks(MLFLOW_MAX_PARAMS) {
            let params: Vec<Value> = chunk
                .iter()
                .map(|(k, v)| json!({ "key": k, "value": v }))
                .collect();
            self.post(
                "runs/log-batch",
                json!({ "run_id": run_id, "params": params }),
            )
            .await?;
        }
        Ok(())
    }

    /// A GET of the REST API, for read-back (`runs/get`, `metrics/get-history`).
    pub async fn get(&self, path: &str, query: Value) -> Result<Value, TrackingError> {
        self.call(reqwest::Method::GET, path, query).await
    }
}

/// A flat JSON object as query pairs.
fn query_pairs(v: &Value) -> Vec<(String, String)> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, x)| {
                    let s = match x {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    (k.clone(), s)
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_urls_are_refused_and_debug_hides_the_token() {
        assert!(matches!(
            MlflowClient::new("ftp://x", RetryPolicy::none()),
            Err(TrackingError::BadUrl { .. })
        ));
        let mut c = MlflowClient::new("http://u:pw@127.0.0.1:1/", RetryPolicy::none()).unwrap();
        c.token = Some("tok-0123456789".into());
        let d = format!("{c:?}");
        assert!(!d.contains("tok-0123456789") && !d.contains("pw@"), "{d}");
        assert_eq!(c.url(), "http://u:***@127.0.0.1:1/");
    }

    #[test]
    fn retryable_statuses() {
        let st = |status| TrackingError::Status {
            endpoint: "e".into(),
            status,
            code: String::new(),
            message: String::new(),
        };
        assert!(st(503).is_retryable() && st(429).is_retryable());
        assert!(!st(400).is_retryable() && !st(404).is_retryable());
    }
}
