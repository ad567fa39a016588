//! Search tools backed by external APIs and by the local index:
//! - `google_search` against a Serper-compatible API (`SERPER_API_KEY` from the environment);
//! - `snippet_search` against Semantic Scholar's snippet search, forwarding `limit`, `year` and
//!   `fieldsOfStudy` (DR Tulu's client silently drops the last two);
//! - `local_search`, which can be registered under the production names to stand in offline.
//!
//! API keys are read from the environment only, never logged or stored.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use super::local_search::LocalIndex;
use super::runner::{Snippet, Tool, ToolArgs, ToolError};
use crate::infra::chat::ToolSpec;

fn http() -> Result<reqwest::Client, ToolError> {
    crate::infra::llm::build_http(Duration::from_secs(10)).map_err(|e| ToolError::Config {
        tool: "http".into(),
        what: e.to_string(),
    })
}

fn clamp_num(args: &ToolArgs, key: &str, default: usize, max: usize) -> usize {
    args.attrs
        .get(key)
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(default)
        .clamp(1, max)
}

/// Serper-compatible Google search.
pub struct GoogleSearch {
    http: reqwest::Client,
    base_url: String,
    key_env: String,
}

impl GoogleSearch {
    /// `base_url` e.g. `https://google.serper.dev`; the key is read from `key_env` at call time.
    pub fn new(base_url: &str, key_env: &str) -> Result<Self, ToolError> {
        Ok(Self {
            http: http()?,
            base_url: base_url.trim_end_matches('/').into(),
            key_env: key_env.into(),
        })
    }
}

impl Tool for GoogleSearch {
    fn name(&self) -> &str {
        "google_search"
    }
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "google_search".into(),
            description: "web search; returns result snippets with titles and URLs.".into(),
            attributes: "num (results, default 5), gl (country), hl (language)".into(),
        }
    }
    fn call<'a>(&'a self, args: &'a ToolArgs) -> BoxFuture<'a, Result<Vec<Snippet>, ToolError>> {
        Box::pin(async move {
            let key = crate::infra::llm::secrets::env_key(&self.key_env).ok_or_else(|| {
                ToolError::Config {
                    tool: "google_search".into(),
                    what: format!("environment variable {} is not set", self.key_env),
                }
            })?;
            let mut body = serde_json::json!({
                "q": args.query.chars().take(2048).collect::<String>(),
                "num": clamp_num(args, "num", 5, 20),
            });
            for k in ["gl", "hl"] {
                if let Some(v) = args.attrs.get(k) {
                    body[k] = serde_json::Value::String(v.clone());
                }
            }
            let resp = self
                .http
                .post(format!("{}/search", self.base_url))
                .header("X-API-KEY", key)
                .json(&body)
                .send()
                .await
                .map_err(|e| ToolError::Failed {
                    tool: "google_search".into(),
                    message: e.to_string(),
                })?;
            let status = resp.status();
            let v: serde_json::Value = resp.json().await.map_err(|e| ToolError::Failed {
                tool: "google_search".into(),
                message: format!("HTTP {status}, unreadable body: {e}"),
            })?;
            if !status.is_success() {
                return Err(ToolError::Failed {
                    tool: "google_search".into(),
                    message: format!("HTTP {status}: {v}"),
                });
            }
            Ok(v["organic"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|o| {
                            Snippet::new(
                                "google_search",
                                o["title"].as_str().unwrap_or_default(),
                                o["link"].as_str().map(str::to_string),
                                o["snippet"].as_str().unwrap_or_default(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default())
        })
    }
}

/// Semantic Scholar snippet search.
pub struct SnippetSearch {
    http: reqwest::Client,
    base_url: String,
    key_env: String,
}

impl SnippetSearch {
    /// `base_url` e.g. `https://api.semanticscholar.org`; the key (optional) from `key_env`.
    pub fn new(base_url: &str, key_env: &str) -> Result<Self, ToolError> {
        Ok(Self {
            http: http()?,
            base_url: base_url.trim_end_matches('/').into(),
            key_env: key_env.into(),
        })
    }
}

impl Tool for SnippetSearch {
    fn name(&self) -> &str {
        "snippet_search"
    }
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "snippet_search".into(),
            description: "search passages of scientific papers.".into(),
            attributes: "limit (default 5), year (e.g. 2019-2024), fieldsOfStudy (comma-separated)"
                .into(),
        }
    }
    fn call<'a>(&'a self, args: &'a ToolArgs) -> BoxFuture<'a, Result<Vec<Snippet>, ToolError>> {
        Box::pin(async move {
            let mut query: Vec<(String, String)> = vec![
                ("query".into(), args.query.clone()),
                ("limit".into(), clamp_num(args, "limit", 5, 100).to_string()),
            ];
            for (attr, param) in [
                ("year", "year"),
                ("fieldsOfStudy", "fieldsOfStudy"),
                ("fieldsofstudy", "fieldsOfStudy"),
            ] {
                if let Some(v) = args.attrs.get(attr) {
                    query.push((param.into(), v.clone()));
                }
            }
            let mut req = self
                .http
                .get(format!("{}/graph/v1/snippet/search", self.base_url))
                .query(&query);
            if let Some(key) = crate::infra::llm::secrets::env_key(&self.key_env) {
                req = req.header("x-api-key", key);
            }
            let resp = req.send().await.map_err(|e| ToolError::Failed {
                tool: "snippet_search".into(),
                message: e.to_string(),
            })?;
            let status = resp.status();
            let v: serde_json::Value = resp.json().await.map_err(|e| ToolError::Failed {
                tool: "snippet_search".into(),
                message: format!("HTTP {status}, unreadable body: {e}"),
            })?;
            if !status.is_success() {
                return Err(ToolError::Failed {
                    tool: "snippet_search".into(),
                    message: format!("HTTP {status}: {v}"),
                });
            }
            Ok(v["data"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter(|d| d["snippet"]["snippetKind"].as_str() != Some("title"))
                        .map(|d| {
                            let url = d["paper"]["corpusId"]
                                .as_u64()
                                .map(|id| format!("https://www.semanticscholar.org/c/{id}"));
                            Snippet::new(
                                "snippet_search",
                                d["paper"]["title"].as_str().unwrap_or_default(),
                                url,
                                d["snippet"]["text"].as_str().unwrap_or_default(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default())
        })
    }
}

/// BM25 over a local corpus, advertised under whatever name it is registered as.
pub struct LocalSearch {
    pub index: Arc<LocalIndex>,
    pub description: String,
    pub default_k: usize,
}

impl Tool for LocalSearch {
    fn name(&self) -> &str {
        "local_search"
    }
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "local_search".into(),
            description: self.description.clone(),
            attributes: "num (results)".into(),
        }
    }
    fn call<'a>(&'a self, args: &'a ToolArgs) -> BoxFuture<'a, Result<Vec<Snippet>, ToolError>> {
        Box::pin(async move {
            let k = args
                .attrs
                .get("num")
                .or_else(|| args.attrs.get("limit"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(self.default_k)
                .clamp(1, 50);
            let index = self.index.clone();
            let q = args.query.clone();
            let hits = tokio::task::spawn_blocking(move || index.search(&q, k))
                .await
                .map_err(|e| ToolError::Failed {
                    tool: "local_search".into(),
                    message: e.to_string(),
                })?
                .map_err(|e| ToolError::Failed {
                    tool: "local_search".into(),
                    message: e.to_string(),
                })?;
            Ok(hits
                .into_iter()
                .map(|h| {
                    // The document id doubles as the snippet id, so rubric evidence can be matched.
                    Snippet {
                        id: h.id,
                        title: h.title,
                        url: h.url,
                        text: h.text,
                    }
                })
                .collect())
        })
    }
}
