//! MCP client (the official Rust SDK, rmcp): tools served by any MCP server over streamable
//! HTTP attach by URL. The model's `<call_tool name=… attr=…>query</call_tool>` is mapped onto
//! each tool's JSON input schema, and the server's content (text, JSON lists of results or
//! structured content) onto snippets.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::{RoleClient, RunningService, ServiceExt};
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::{Map, Value};

use super::runner::{Snippet, Tool, ToolArgs, ToolError};
use crate::infra::chat::ToolSpec;

#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("MCP server {url}: could not connect and initialise: {message}")]
    Connect { url: String, message: String },
    #[error("MCP server {url}: listing tools failed: {message}")]
    List { url: String, message: String },
    #[error("MCP server {url}: no response within {after:?}")]
    Timeout { url: String, after: Duration },
}

/// One connected MCP server and the tools it lists.
pub struct McpServer {
    url: String,
    client: RunningService<RoleClient, ClientConfig>,
    tools: Vec<rmcp::model::Tool>,
    timeout: Duration,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("url", &self.url)
            .field("tools", &self.tool_names())
            .finish_non_exhaustive()
    }
}

/// rmcp's reqwest is built without a bundled crypto provider; the process uses rustls' ring
/// provider (the one our own reqwest links). Installing it twice is harmless.
fn ensure_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl McpServer {
    /// Connect (streamable HTTP), initialise the session and list every tool.
    pub async fn connect(url: &str, timeout: Duration) -> Result<Arc<Self>, McpError> {
        ensure_crypto_provider();
        let timed = |after| McpError::Timeout {
            url: url.to_string(),
            after,
        };
        let transport = StreamableHttpClientTransport::from_uri(url.to_string());
        let info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("rubricem-orchestrator", env!("CARGO_PKG_VERSION")),
        );
        let client = tokio::time::timeout(timeout, info.serve(transport))
            .await
            .map_err(|_| timed(timeout))?
            .map_err(|e| McpError::Connect {
                url: url.to_string(),
                message: crate::domain::util::error_chain(&e),
            })?;
        let tools = tokio::time::timeout(timeout, client.list_all_tools())
            .await
            .map_err(|_| timed(timeout))?
            .map_err(|e| McpError::List {
                url: url.to_string(),
                message: crate::domain::util::error_chain(&e),
            })?;
        tracing::info!(url, tools = tools.len(), "MCP server attached");
        Ok(Arc::new(Self {
            url: url.to_string(),
            client,
            tools,
            timeout,
        }))
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn tool_names(&self) -> Vec<String> {
        self.tools.iter().map(|t| t.name.to_string()).collect()
    }

    /// Every listed tool as a [`Tool`] for the runner.
    pub fn tools(self: &Arc<Self>) -> Vec<Arc<dyn Tool>> {
        (0..self.tools.len())
            .map(|index| {
                Arc::new(McpTool {
                    server: self.clone(),
                    index,
                }) as Arc<dyn Tool>
            })
            .collect()
    }
}

/// One tool of an MCP server.
pub struct McpTool {
    server: Arc<McpServer>,
    index: usize,
}

impl McpTool {
    fn def(&self) -> &rmcp::model::Tool {
        &self.server.tools[self.index]
    }
}

impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.def().name
    }

    fn spec(&self) -> ToolSpec {
        let def = self.def();
        let query = query_property(&def.input_schema);
        let attributes = schema_properties(&def.input_schema)
            .filter(|(k, _)| Some(*k) != query.as_deref())
            .map(
                |(k, v)| match v.get("description").and_then(Value::as_str) {
                    Some(d) => format!("{k} ({d})"),
                    None => k.to_string(),
                },
            )
            .collect::<Vec<_>>()
            .join(", ");
        ToolSpec {
            name: def.name.to_string(),
            description: def
                .description
                .as_deref()
                .unwrap_or("a tool served over MCP")
                .to_string(),
            attributes,
        }
    }

    fn call<'a>(&'a self, args: &'a ToolArgs) -> BoxFuture<'a, Result<Vec<Snippet>, ToolError>> {
        Box::pin(async move {
            let def = self.def();
            let name = def.name.to_string();
            let arguments =
                map_arguments(&def.input_schema, args).map_err(|message| ToolError::BadArgs {
                    tool: name.clone(),
                    message,
                })?;
            let params = CallToolRequestParams::new(name.clone()).with_arguments(arguments);
            let after = self.server.timeout;
            let result = tokio::time::timeout(after, self.server.client.call_tool(params))
                .await
                .map_err(|_| ToolError::Timeout {
                    tool: name.clone(),
                    after,
                })?
                .map_err(|e| ToolError::Failed {
                    tool: name.clone(),
                    message: crate::domain::util::error_chain(&e),
                })?;
            let texts: Vec<&str> = result
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
                .collect();
            if result.is_error == Some(true) {
                return Err(ToolError::Failed {
                    tool: name,
                    message: texts.join("\n"),
                });
            }
            Ok(content_to_snippets(
                &name,
                &texts,
                result.structured_content.as_ref(),
            ))
        })
    }
}

fn schema_properties(schema: &Map<String, Value>) -> impl Iterator<Item = (&str, &Value)> {
    schema
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|p| p.iter().map(|(k, v)| (k.as_str(), v)))
}

fn prop_type(v: &Value) -> &str {
    match v.get("type") {
        Some(Value::String(t)) => t,
        // ["string", "null"] and the like: the first non-null type.
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("string"),
        _ => "string",
    }
}

/// Which property receives the call's body: `query`, else the first required string, else the
/// first string property (`url` for a browse tool).
pub fn query_property(schema: &Map<String, Value>) -> Option<String> {
    let strings: Vec<&str> = schema_properties(schema)
        .filter(|(_, v)| prop_type(v) == "string")
        .map(|(k, _)| k)
        .collect();
    if strings.contains(&"query") {
        return Some("query".into());
    }
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    strings
        .iter()
        .find(|k| required.contains(k))
        .or_else(|| strings.first())
        .map(|k| k.to_string())
}

/// Map a call onto the tool's input schema: the body to the query property, each attribute to
/// the property of the same name (case- and `_`-insensitive), converted to its declared type.
pub fn map_arguments(
    schema: &Map<String, Value>,
    args: &ToolArgs,
) -> Result<Map<String, Value>, String> {
    let canon = |s: &str| s.replace(['_', '-'], "").to_ascii_lowercase();
    let mut out = Map::new();
    if let Some(q) = query_property(schema) {
        out.insert(q, Value::String(args.query.trim().to_string()));
    } else if !args.query.trim().is_empty() {
        return Err("this tool takes no text argument; pass attributes only".into());
    }
    for (key, raw) in &args.attrs {
        let Some((name, prop)) = schema_properties(schema).find(|(k, _)| canon(k) == canon(key))
        else {
            let known: Vec<&str> = schema_properties(schema).map(|(k, _)| k).collect();
            return Err(format!(
                "unknown attribute `{key}`; accepted: {}",
                known.join(", ")
            ));
        };
        let bad = |want: &str| format!("attribute {key}={raw:?} is not {want}");
        let raw = raw.trim();
        let value = match prop_type(prop) {
            "integer" => Value::from(raw.parse::<i64>().map_err(|_| bad("an integer"))?),
            "number" => {
                let x = raw.parse::<f64>().map_err(|_| bad("a number"))?;
                serde_json::Number::from_f64(x)
                    .map(Value::Number)
                    .ok_or_else(|| bad("a finite number"))?
            }
            "boolean" => Value::Bool(match raw.to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" => true,
                "false" | "0" | "no" => false,
                _ => return Err(bad("a boolean")),
            }),
            "array" => Value::Array(
                raw.split(',')
                    .map(|s| Value::String(s.trim().to_string()))
                    .filter(|v| v.as_str().is_some_and(|s| !s.is_empty()))
                    .collect(),
            ),
            _ => Value::String(raw.to_string()),
        };
        out.insert(name.to_string(), value);
    }
    Ok(out)
}

const LIST_KEYS: [&str; 6] = [
    "results",
    "data",
    "organic",
    "snippets",
    "items",
    "documents",
];
const TEXT_KEYS: [&str; 6] = ["text", "snippet", "content", "abstract", "body", "markdown"];
const TITLE_KEYS: [&str; 3] = ["title", "name", "paperTitle"];
const URL_KEYS: [&str; 3] = ["url", "link", "href"];

fn first_str<'v>(o: &'v Map<String, Value>, keys: &[&str]) -> Option<&'v str> {
    keys.iter().find_map(|k| match o.get(*k)? {
        Value::String(s) if !s.trim().is_empty() => Some(s.as_str()),
        // Semantic Scholar nests: {"snippet": {"text": ...}, "paper": {"title": ...}}
        Value::Object(inner) => first_str(inner, keys),
        _ => None,
    })
}

fn object_to_snippet(tool: &str, o: &Map<String, Value>) -> Option<Snippet> {
    let text = first_str(o, &TEXT_KEYS)?;
    let title = first_str(o, &TITLE_KEYS)
        .or_else(|| {
            o.get("paper")
                .and_then(Value::as_object)
                .and_then(|p| first_str(p, &TITLE_KEYS))
        })
        .unwrap_or("");
    let url = first_str(o, &URL_KEYS).map(str::to_string);
    Some(Snippet::new(tool, title, url, text))
}

fn json_to_snippets(tool: &str, v: &Value) -> Option<Vec<Snippet>> {
    let items = match v {
        Value::Array(a) => a,
        Value::Object(o) => match LIST_KEYS
            .iter()
            .find_map(|k| o.get(*k).and_then(Value::as_array))
        {
            Some(a) => a,
            None => return object_to_snippet(tool, o).map(|s| vec![s]),
        },
        _ => return None,
    };
    let out: Vec<Snippet> = items
        .iter()
        .filter_map(Value::as_object)
        .filter_map(|o| object_to_snippet(tool, o))
        .collect();
    (!out.is_empty() || items.is_empty()).then_some(out)
}

/// Server content to snippets: structured content or JSON text with a list of results becomes
/// one snippet per result; any other text becomes one snippet per text block.
pub fn content_to_snippets(tool: &str, texts: &[&str], structured: Option<&Value>) -> Vec<Snippet> {
    if let Some(s) = structured.and_then(|v| json_to_snippets(tool, v)) {
        return s;
    }
    let mut out = Vec::new();
    for t in texts {
        match serde_json::from_str::<Value>(t)
            .ok()
            .and_then(|v| json_to_snippets(tool, &v))
        {
            Some(s) => out.extend(s),
            None if !t.trim().is_empty() => out.push(Snippet::new(tool, "", None, t.trim())),
            None => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn schema() -> Map<String, Value> {
        serde_json::json!({
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "year": {"type": "string", "description": "e.g. 2019-2024"},
                "limit": {"type": "integer"},
                "fields_of_study": {"type": "array", "items": {"type": "string"}},
                "exact": {"type": "boolean"}
            },
            "required": ["query"]
        })
        .as_object()
        .cloned()
        .unwrap_or_default()
    }

    fn args(q: &str, attrs: &[(&str, &str)]) -> ToolArgs {
        ToolArgs {
            query: q.into(),
            attrs: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    #[test]
    fn arguments_follow_the_schema_types() {
        let m = map_arguments(
            &schema(),
            &args(
                " protein folding ",
                &[
                    ("limit", "3"),
                    ("fieldsOfStudy", "Biology, Medicine"),
                    ("exact", "no"),
                ],
            ),
        )
        .unwrap();
        assert_eq!(
            Value::Object(m),
            serde_json::json!({"query": "protein folding", "limit": 3,
                "fields_of_study": ["Biology", "Medicine"], "exact": false})
        );
    }

    #[test]
    fn bad_attributes_name_the_value_and_the_choices() {
        let e = map_arguments(&schema(), &args("q", &[("limit", "many")])).unwrap_err();
        assert!(e.contains("limit=\"many\"") && e.contains("integer"), "{e}");
        let e = map_arguments(&schema(), &args("q", &[("colour", "red")])).unwrap_err();
        assert!(e.contains("colour") && e.contains("fields_of_study"), "{e}");
    }

    #[test]
    fn the_body_goes_to_the_first_required_string() {
        let s = serde_json::json!({"properties": {"max_chars": {"type": "integer"},
            "url": {"type": "string"}}, "required": ["url"]});
        assert_eq!(
            query_property(s.as_object().unwrap()).as_deref(),
            Some("url")
        );
    }

    #[test]
    fn json_results_become_snippets() {
        let text = r#"{"data": [{"snippet": {"text": "Alpha helix"}, "paper": {"title": "P1"}},
            {"title": "P2", "snippet": "Beta sheet", "link": "https://x.org/2"}]}"#;
        let s = content_to_snippets("snippet_search", &[text], None);
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].title.as_str(), s[0].text.as_str()),
            ("P1", "Alpha helix")
        );
        assert_eq!(s[1].url.as_deref(), Some("https://x.org/2"));
        let plain = content_to_snippets("browse", &["Just a page."], None);
        assert_eq!(plain.len(), 1);
        assert_eq!(plain[0].text, "Just a page.");
    }
}
