//! Assembling the tool set of a run from its switches: a local BM25 index standing in for the
//! web tools, the real web tools (Serper, Semantic Scholar, guarded browsing), and every tool of
//! each configured MCP server. One place, shared by `rollout` and the pipeline.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::runner::{ToolCache, ToolLimits, ToolRunner};

/// Which tools a run gets.
#[derive(Debug, Clone, Default)]
pub struct ToolSetup {
    /// A local index (from `index build`) served as `google_search` and `snippet_search`.
    pub index: Option<PathBuf>,
    /// The one name the local index is served under (`google_search` or `snippet_search`);
    /// `None`: both (ad-hoc commands).
    pub index_tool: Option<String>,
    /// Snippets a local search returns unless the call asks for `num` (`None`: 5).
    pub index_k: Option<usize>,
    /// Real web tools: `google_search` (Serper, `SERPER_API_KEY`), `snippet_search`
    /// (Semantic Scholar, `S2_API_KEY` optional) and `browse_webpage` behind the SSRF guard.
    pub web: bool,
    /// Streamable-HTTP MCP servers whose tools are attached by name.
    pub mcp_urls: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Index(#[from] super::IndexError),
    #[error(transparent)]
    Tool(#[from] super::runner::ToolError),
    #[error(transparent)]
    Browse(#[from] super::browse::BrowseError),
    #[error(transparent)]
    Mcp(#[from] super::mcp::McpError),
    #[error("no tools configured: give a local index, the web tools or an MCP server URL")]
    Empty,
}

pub const SERPER_URL: &str = "https://google.serper.dev";
pub const S2_URL: &str = "https://api.semanticscholar.org";
/// Environment variables holding the web tools' keys.
pub const SERPER_KEY_ENV: &str = "SERPER_API_KEY";
pub const S2_KEY_ENV: &str = "S2_API_KEY";

/// Build the runner. Later sources win on a name clash (an MCP server's `google_search`
/// replaces the local stand-in), and the clash is logged.
pub async fn build(
    setup: &ToolSetup,
    cache: Option<Arc<dyn ToolCache>>,
) -> Result<ToolRunner, SetupError> {
    let mut runner = ToolRunner::new(cache);
    let add = |runner: &mut ToolRunner, name: &str, tool, limits| {
        if runner.names().iter().any(|n| n == name) {
            tracing::warn!(tool = name, "tool registered twice; the later source wins");
        }
        runner.register(name, tool, limits);
    };
    if let Some(dir) = &setup.index {
        let index = Arc::new(super::LocalIndex::open(dir)?);
        let both = [
            ("google_search", "web search; returns snippets with ids."),
            ("snippet_search", "search passages of scientific papers."),
        ];
        let names: Vec<(&str, &str)> = match setup.index_tool.as_deref() {
            None => both.to_vec(),
            Some("google_search") => vec![(
                "google_search",
                "search the local corpus; returns snippets with ids.",
            )],
            Some(_) => vec![(
                "snippet_search",
                "search passages of the local corpus; returns snippets with ids.",
            )],
        };
        for (name, desc) in names {
            let tool = Arc::new(super::search_apis::LocalSearch {
                index: index.clone(),
                description: desc.into(),
                default_k: setup.index_k.unwrap_or(5),
            });
            add(&mut runner, name, tool, ToolLimits::default());
        }
    }
    if setup.web {
        let limits = ToolLimits {
            max_concurrency: 16,
            min_interval: Duration::from_millis(20),
            timeout: Duration::from_secs(30),
        };
        let google = Arc::new(super::search_apis::GoogleSearch::new(
            SERPER_URL,
            SERPER_KEY_ENV,
        )?);
        add(&mut runner, "google_search", google, limits);
        let s2 = Arc::new(super::search_apis::SnippetSearch::new(S2_URL, S2_KEY_ENV)?);
        add(&mut runner, "snippet_search", s2, limits);
        let browser = Arc::new(super::browse::Browser::new(
            super::ssrf::AddressGuard::new(Vec::new()),
            2 << 20,
            Duration::from_secs(20),
        )?);
        add(&mut runner, "browse_webpage", browser, limits);
    }
    for url in &setup.mcp_urls {
        let server = super::mcp::McpServer::connect(url, Duration::from_secs(30)).await?;
        for tool in server.tools() {
            let name = tool.name().to_string();
            add(&mut runner, &name, tool, ToolLimits::default());
        }
    }
    if runner.names().is_empty() {
        return Err(SetupError::Empty);
    }
    Ok(runner)
}
