//! Publishing a new policy to inference servers after each step. The adapter (or full weights)
//! is already written to `root/NAME-vN` atomically (see `checkpoint::write_dir_atomically`);
//! here each server is told to load it under the versioned name `NAME-vN` (vLLM
//! `/v1/load_lora_adapter`, SGLang `/load_lora_adapter`; full weights through vLLM's native
//! disk weight-transfer API or SGLang's `/update_weights_from_disk`), with retries. Versions that
//! fall out of the staleness window are unloaded and their directories removed. A failed load
//! is reported and the previous version stays in service. This file is reqwest's and backon's
//! only door in the trainer (`dist::vllm`'s weight-transfer requests go through it too).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerKind {
    Vllm,
    Sglang,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PublishTarget {
    pub url: String,
    pub kind: ServerKind,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PublishConfig {
    /// Where versioned adapter / weight directories are written (must be readable by the
    /// servers at the same absolute path).
    pub root: PathBuf,
    /// Adapter name prefix: versions are served as `NAME-vN`.
    pub name: String,
    /// Versions kept loaded (the newest and the ones rollouts may still be finishing on).
    pub window: usize,
    /// Retries per call after the first attempt.
    pub retries: u32,
    pub targets: Vec<PublishTarget>,
    /// LoRA adapters (else full weights).
    pub lora: bool,
}

/// What one publish did (the `published` of the train-step and restore replies).
pub use wire::Published;

#[derive(Debug)]
pub struct Publisher {
    http: reqwest::Client,
    cfg: PublishConfig,
    /// (version, name, dir) currently loaded, oldest first.
    live: VecDeque<(i64, String, PathBuf)>,
    /// A tensor route for full weights (`--publish-route nccl`); `None`: the disk route and
    /// LoRA hot-loading. Behind a mutex so the publisher stays `Sync` (a route is only `Send`);
    /// taken out while a push runs.
    route: std::sync::Mutex<Option<Box<dyn TensorRoute>>>,
    has_route: bool,
}

/// A route that carries a version's full weights as tensors instead of a directory (vLLM's
/// NCCL weight-transfer engine: `dist::vllm::NcclRoute`). `push` blocks; the publisher calls it
/// on a blocking thread inside the runtime.
pub trait TensorRoute: Send + std::fmt::Debug {
    /// Push `params` (HF names, as served) as `version` to every server of `urls`.
    fn push(
        &mut self,
        http: &reqwest::Client,
        urls: &[String],
        version: i64,
        params: &[(String, tch::Tensor)],
    ) -> Result<(), String>;
}

/// `POST url+route` with a JSON body: `Err` names the transport error or the HTTP status with
/// the start of the reply (for `dist::vllm`, whose requests go through this door too).
pub async fn post_json(
    http: &reqwest::Client,
    url: &str,
    route: &str,
    body: &serde_json::Value,
) -> Result<(), String> {
    let resp = http
        .post(format!("{}{route}", url.trim_end_matches('/')))
        .json(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    let text: String = resp
        .text()
        .await
        .unwrap_or_default()
        .chars()
        .take(300)
        .collect();
    Err(format!("HTTP {status}: {text}"))
}

/// `GET url+route` as JSON: `Err` names the transport error or the HTTP status.
pub async fn get_json(
    http: &reqwest::Client,
    url: &str,
    route: &str,
) -> Result<serde_json::Value, String> {
    let resp = http
        .get(format!("{}{route}", url.trim_end_matches('/')))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("HTTP {}", resp.status()));
    }
    resp.json().await.map_err(|e| e.to_string())
}

/// Ask a server what it is: SGLang answers `/get_server_info`, vLLM does not.
pub async fn detect_kind(http: &reqwest::Client, url: &str) -> ServerKind {
    match http
        .get(format!("{}/get_server_info", url.trim_end_matches('/')))
        .timeout(Duration::from_secs(5))
        .send()
        .await
    {
        Ok(r) if r.status().is_success() => ServerKind::Sglang,
        _ => ServerKind::Vllm,
    }
}

/// The trainer's HTTP client (connect and whole-request timeouts are mandatory).
// The trainer's one HTTP client builder: this is its door (clippy.toml).
#[allow(clippy::disallowed_methods)]
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap_or_default()
}

impl Publisher {
    pub fn new(cfg: PublishConfig) -> Self {
        let http = http_client();
        Self {
            http,
            cfg,
            live: VecDeque::new(),
            route: std::sync::Mutex::new(None),
            has_route: false,
        }
    }

    /// Publish full weights through `route` (vLLM's NCCL weight-transfer engine) instead of
    /// directories.
    pub fn with_route(mut self, route: Box<dyn TensorRoute>) -> Self {
        self.route = std::sync::Mutex::new(Some(route));
        self.has_route = true;
        self
    }

    /// Whether versions go out as tensors over NCCL ([`Publisher::publish_tensors`]) rather
    /// than as directories ([`Publisher::publish`]).
    pub fn uses_nccl(&self) -> bool {
        self.has_route && !self.cfg.lora
    }

    /// Push version `version`'s full weights (`params`: HF names, as served) to every server
    /// over NCCL; connects on the first call. A failure leaves the servers on their previous
    /// version and is reported per server, like a failed disk publish. The push runs on a
    /// blocking thread (tensors are not `Sync`, and the broadcast blocks).
    pub async fn publish_tensors(
        &mut self,
        version: i64,
        params: Vec<(String, tch::Tensor)>,
    ) -> Published {
        let t0 = Instant::now();
        let urls: Vec<String> = self.cfg.targets.iter().map(|t| t.url.clone()).collect();
        let mut out = Published {
            version: version.into(),
            name: self.name_of(version),
            lora: false,
            ..Published::default()
        };
        let route = self
            .route
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let pushed = match route {
            None => Err("this publisher has no tensor route".to_string()),
            Some(mut route) => {
                let (http, targets) = (self.http.clone(), urls.clone());
                // A blocking-pool thread runs inside the runtime, where the route's push can
                // drive its requests.
                let joined = tokio::task::spawn_blocking(move || {
                    let r = route.push(&http, &targets, version, &params);
                    (route, r)
                })
                .await;
                match joined {
                    Ok((route, r)) => {
                        *self
                            .route
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(route);
                        r
                    }
                    Err(e) => Err(format!("the NCCL publish task failed: {e}")),
                }
            }
        };
        match pushed {
            Ok(()) => out.loaded = urls,
            Err(e) => {
                tracing::error!(version, error = %e, "NCCL publish failed; the previous version stays in service");
                out.failed = urls.into_iter().map(|u| (u, e.clone())).collect();
            }
        }
        out.seconds = t0.elapsed().as_secs_f64();
        out
    }

    pub fn config(&self) -> &PublishConfig {
        &self.cfg
    }

    pub fn name_of(&self, version: i64) -> String {
        format!("{}-v{version}", self.cfg.name)
    }

    pub fn dir_of(&self, version: i64) -> PathBuf {
        self.cfg.root.join(self.name_of(version))
    }

    async fn post(&self, url: &str, path: &str, body: serde_json::Value) -> Result<(), String> {
        let full = format!("{}{path}", url.trim_end_matches('/'));
        let op = || async {
            let r = self
                .http
                .post(&full)
                .json(&body)
                .send()
                .await
                .map_err(|e| format!("{full}: {e}"))?;
            let status = r.status();
            if status.is_success() {
                Ok(())
            } else {
                let text = r.text().await.unwrap_or_default();
                Err(format!(
                    "{full}: HTTP {status}: {}",
                    text.chars().take(300).collect::<String>()
                ))
            }
        };
        op.retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(100))
                .with_max_delay(Duration::from_secs(5))
                .with_max_times(self.cfg.retries as usize),
        )
        .sleep(tokio::time::sleep)
        .notify(|e: &String, d| tracing::warn!(error = %e, retry_in = ?d, "publish call failed"))
        .await
    }

    async fn load(
        &self,
        t: &PublishTarget,
        name: &str,
        dir: &Path,
        version: i64,
    ) -> Result<(), String> {
        let path = dir.display().to_string();
        match (self.cfg.lora, t.kind) {
            (true, ServerKind::Vllm) => {
                self.post(
                    &t.url,
                    "/v1/load_lora_adapter",
                    json!({"lora_name": name, "lora_path": path}),
                )
                .await
            }
            (true, ServerKind::Sglang) => {
                self.post(
                    &t.url,
                    "/load_lora_adapter",
                    json!({"lora_name": name, "lora_path": path}),
                )
                .await
            }
            (false, ServerKind::Vllm) => {
                self.post(&t.url, "/start_weight_update", json!({})).await?;
                self.post(
                    &t.url,
                    "/update_weights",
                    json!({"update_info": {"path": path}}),
                )
                .await?;
                self.post(
                    &t.url,
                    "/finish_weight_update",
                    json!({"weight_version": format!("v{version}")}),
                )
                .await
            }
            (false, ServerKind::Sglang) => {
                self.post(
                    &t.url,
                    "/update_weights_from_disk",
                    json!({"model_path": path}),
                )
                .await
            }
        }
    }

    async fn unload(&self, t: &PublishTarget, name: &str) -> Result<(), String> {
        let path = match t.kind {
            ServerKind::Vllm => "/v1/unload_lora_adapter",
            ServerKind::Sglang => "/unload_lora_adapter",
        };
        self.post(&t.url, path, json!({"lora_name": name})).await
    }

    /// Forget every live version: unload the adapters from the servers and remove their
    /// directories. Called when the policy is replaced (a restore), whose version numbers
    /// start again and would otherwise collide with the old ones. Returns the names retired.
    pub async fn retire_all(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Some((_, old, old_dir)) = self.live.pop_front() {
            self.retire(&old, &old_dir).await;
            out.push(old);
        }
        out
    }

    /// Unload one version's adapter from every server (LoRA) and remove its directory.
    async fn retire(&self, name: &str, dir: &Path) {
        if self.cfg.lora {
            for t in &self.cfg.targets {
                if let Err(e) = self.unload(t, name).await {
                    tracing::warn!(server = %t.url, adapter = %name, error = %e, "unload failed");
                }
            }
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Load version `version` (already written at `dir_of(version)`) on every server, then
    /// unload what left the window. With no targets it only records the version.
    pub async fn publish(&mut self, version: i64) -> Published {
        let t0 = Instant::now();
        let name = self.name_of(version);
        let dir = self.dir_of(version);
        let mut out = Published {
            version: version.into(),
            name: name.clone(),
            dir: dir.clone(),
            lora: self.cfg.lora,
            ..Published::default()
        };
        for t in &self.cfg.targets {
            match self.load(t, &name, &dir, version).await {
                Ok(()) => out.loaded.push(t.url.clone()),
                Err(e) => {
                    tracing::error!(server = %t.url, version, error = %e, "publish failed; the previous version stays in service");
                    out.failed.push((t.url.clone(), e));
                }
            }
        }
        if out.failed.is_empty() {
            self.live.push_back((version, name, dir));
            while self.live.len() > self.cfg.window.max(1) {
                let Some((_, old, old_dir)) = self.live.pop_front() else {
                    break;
                };
                self.retire(&old, &old_dir).await;
                out.unloaded.push(old);
            }
        }
        out.seconds = t0.elapsed().as_secs_f64();
        out
    }
}
