//! Tool calls as values: what the model asked for (`ToolArgs`), what a tool returned
//! (`Snippet`, with its stable content-hash id) and how results are shown to the model
//! (`format_output`). The runner and the back-ends that execute calls live in `infra::tools`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What the model asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolArgs {
    pub query: String,
    pub attrs: BTreeMap<String, String>,
}

impl ToolArgs {
    /// Whitespace-collapsed query and sorted attributes: the cache key's content.
    pub fn normalized(&self) -> String {
        let q = self.query.split_whitespace().collect::<Vec<_>>().join(" ");
        let attrs: Vec<String> = self
            .attrs
            .iter()
            .map(|(k, v)| format!("{}={}", k.to_ascii_lowercase(), v.trim()))
            .collect();
        format!("{q}\u{1f}{}", attrs.join("\u{1f}"))
    }
}

/// One retrieved item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snippet {
    pub id: String,
    pub title: String,
    pub url: Option<String>,
    pub text: String,
}

impl Snippet {
    /// A snippet with its stable content-hash id (same content, same id, across runs).
    pub fn new(
        tool: &str,
        title: impl Into<String>,
        url: Option<String>,
        text: impl Into<String>,
    ) -> Self {
        let (title, text) = (title.into(), text.into());
        let h = crate::domain::util::sha256_hex(
            format!(
                "{tool}\u{1f}{}\u{1f}{title}\u{1f}{text}",
                url.as_deref().unwrap_or("")
            )
            .as_bytes(),
        );
        Self {
            id: h[..10].to_string(),
            title,
            url,
            text,
        }
    }
}

/// Render snippets as the model sees them.
pub fn format_output(snippets: &[Snippet], error: Option<&str>) -> String {
    let mut s = String::from("<tool_output>");
    if let Some(e) = error {
        s.push_str(&format!("\nError: {e}\n"));
    } else if snippets.is_empty() {
        s.push_str("\nNo results.\n");
    }
    for sn in snippets {
        s.push_str(&format!("<snippet id={}>\nTitle: {}\n", sn.id, sn.title));
        if let Some(u) = &sn.url {
            s.push_str(&format!("URL: {u}\n"));
        }
        s.push_str(&format!("Snippet: {}\n</snippet>\n", sn.text));
    }
    s.push_str("</tool_output>");
    s
}

/// The result of one executed call, ready to be shown to the model and stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    pub tool: String,
    pub args: ToolArgs,
    pub snippets: Vec<Snippet>,
    pub error: Option<String>,
    pub cached: bool,
    pub latency: Duration,
    /// `<tool_output>…</tool_output>` as appended to the trajectory.
    pub output_text: String,
}
