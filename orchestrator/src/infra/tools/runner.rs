//! The Tool trait and the runner that executes calls: per-tool concurrency and rate limits,
//! timeouts, a Postgres result cache keyed by tool + normalised arguments (reruns are
//! reproducible and free), and formatting as `<tool_output><snippet id=…>` with stable
//! content-hash ids. Failures become tool output the model sees, and are recorded.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use tokio::sync::{Mutex, Semaphore};

use crate::infra::chat::ToolSpec;

pub use crate::domain::tool::{Snippet, ToolArgs, ToolResult, format_output};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ToolError {
    #[error("unknown tool `{name}`; available: {available}")]
    Unknown { name: String, available: String },
    #[error("{tool}: missing configuration: {what}")]
    Config { tool: String, what: String },
    #[error("{tool} failed: {message}")]
    Failed { tool: String, message: String },
    #[error("{tool} timed out after {after:?}")]
    Timeout { tool: String, after: Duration },
    #[error("{tool}: {message}")]
    BadArgs { tool: String, message: String },
}

pub trait Tool: Send + Sync {
    fn name(&self) -> &str;
    /// How the tool is advertised in the system prompt.
    fn spec(&self) -> ToolSpec;
    fn call<'a>(&'a self, args: &'a ToolArgs) -> BoxFuture<'a, Result<Vec<Snippet>, ToolError>>;
}

/// Per-tool limits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ToolLimits {
    pub max_concurrency: usize,
    /// Minimum spacing between call starts (0 = no rate limit).
    pub min_interval: Duration,
    pub timeout: Duration,
}

impl Default for ToolLimits {
    fn default() -> Self {
        Self {
            max_concurrency: 32,
            min_interval: Duration::ZERO,
            timeout: Duration::from_secs(60),
        }
    }
}

struct Entry {
    tool: Arc<dyn Tool>,
    limits: ToolLimits,
    slots: Arc<Semaphore>,
    next_start: Mutex<Instant>,
}

/// Where cached results live. Postgres in production (`db::tool_cache`); tests may use memory.
pub trait ToolCache: Send + Sync {
    fn get<'a>(&'a self, tool: &'a str, key: &'a str) -> BoxFuture<'a, Option<Vec<Snippet>>>;
    fn put<'a>(
        &'a self,
        tool: &'a str,
        key: &'a str,
        args: &'a ToolArgs,
        snippets: &'a [Snippet],
    ) -> BoxFuture<'a, ()>;
}

/// Executes tool calls by name.
pub struct ToolRunner {
    tools: HashMap<String, Entry>,
    cache: Option<Arc<dyn ToolCache>>,
}

impl std::fmt::Debug for ToolRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolRunner")
            .field("tools", &self.names())
            .finish_non_exhaustive()
    }
}

impl ToolRunner {
    pub fn new(cache: Option<Arc<dyn ToolCache>>) -> Self {
        Self {
            tools: HashMap::new(),
            cache,
        }
    }

    /// Register a tool under its own name (or an alias, e.g. local_search serving `google_search`).
    pub fn register(&mut self, name: &str, tool: Arc<dyn Tool>, limits: ToolLimits) {
        self.tools.insert(
            name.to_string(),
            Entry {
                tool,
                slots: Arc::new(Semaphore::new(limits.max_concurrency.max(1))),
                limits,
                next_start: Mutex::new(Instant::now()),
            },
        );
    }

    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.tools.keys().cloned().collect();
        v.sort();
        v
    }

    /// Specs for the system prompt, named as registered.
    pub fn specs(&self) -> Vec<ToolSpec> {
        let mut v: Vec<ToolSpec> = self
            .tools
            .iter()
            .map(|(n, e)| ToolSpec {
                name: n.clone(),
                ..e.tool.spec()
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Execute one call. Never fails: errors are returned inside the result and its text.
    pub async fn run(&self, name: &str, args: ToolArgs) -> ToolResult {
        let start = Instant::now();
        let outcome = self.run_inner(name, &args).await;
        let latency = start.elapsed();
        let (snippets, error, cached) = match outcome {
            Ok((s, cached)) => (s, None, cached),
            // A tool error may quote what the server answered: keys are redacted here, before
            // the text is logged or stored.
            Err(e) => (
                Vec::new(),
                Some(crate::infra::llm::secrets::redact(&e.to_string()).into_owned()),
                false,
            ),
        };
        if let Some(e) = &error {
            tracing::warn!(tool = name, error = %e, "tool call failed");
        }
        let output_text = format_output(&snippets, error.as_deref());
        ToolResult {
            tool: name.to_string(),
            args,
            snippets,
            error,
            cached,
            latency,
            output_text,
        }
    }

    async fn run_inner(
        &self,
        name: &str,
        args: &ToolArgs,
    ) -> Result<(Vec<Snippet>, bool), ToolError> {
        let entry = self.tools.get(name).ok_or_else(|| ToolError::Unknown {
            name: name.to_string(),
            available: self.names().join(", "),
        })?;
        if args.query.trim().is_empty() {
            return Err(ToolError::BadArgs {
                tool: name.into(),
                message: "empty query".into(),
            });
        }
        let key = crate::domain::util::sha256_hex(args.normalized().as_bytes());
        if let Some(cache) = &self.cache
            && let Some(hit) = cache.get(name, &key).await
        {
            return Ok((hit, true));
        }
        let _slot = entry.slots.acquire().await.map_err(|_| ToolError::Failed {
            tool: name.into(),
            message: "tool runner is shutting down".into(),
        })?;
        if !entry.limits.min_interval.is_zero() {
            let wait = {
                let mut next = entry.next_start.lock().await;
                let now = Instant::now();
                let at = (*next).max(now);
                *next = at + entry.limits.min_interval;
                at - now
            };
            tokio::time::sleep(wait).await;
        }
        let snippets = tokio::time::timeout(entry.limits.timeout, entry.tool.call(args))
            .await
            .map_err(|_| ToolError::Timeout {
                tool: name.into(),
                after: entry.limits.timeout,
            })??;
        if let Some(cache) = &self.cache {
            cache.put(name, &key, args, &snippets).await;
        }
        Ok((snippets, false))
    }
}

/// An in-memory cache (tests, and runs without a database).
#[derive(Default)]
pub struct MemoryCache(Mutex<HashMap<(String, String), Vec<Snippet>>>);

impl ToolCache for MemoryCache {
    fn get<'a>(&'a self, tool: &'a str, key: &'a str) -> BoxFuture<'a, Option<Vec<Snippet>>> {
        Box::pin(async move {
            self.0
                .lock()
                .await
                .get(&(tool.to_string(), key.to_string()))
                .cloned()
        })
    }
    fn put<'a>(
        &'a self,
        tool: &'a str,
        key: &'a str,
        _args: &'a ToolArgs,
        snippets: &'a [Snippet],
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.0
                .lock()
                .await
                .insert((tool.to_string(), key.to_string()), snippets.to_vec());
        })
    }
}
