//! The MCP client against a real MCP server (rmcp's streamable-HTTP server on loopback): tools
//! are listed and advertised, calls map attributes onto the input schema, JSON results become
//! snippets, tool errors reach the model as tool output.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orchestrator::infra::tools::mcp::McpServer;
use orchestrator::infra::tools::runner::{ToolArgs, ToolLimits, ToolRunner};
use rmcp::ErrorData;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};

#[derive(Clone, Default)]
struct Papers {
    calls: Arc<Mutex<Vec<(String, Value)>>>,
}

fn obj(v: Value) -> serde_json::Map<String, Value> {
    v.as_object().cloned().unwrap()
}

impl ServerHandler for Papers {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(vec![
            Tool::new(
                "snippet_search",
                "Search paper passages.",
                obj(json!({"type": "object", "properties": {
                    "query": {"type": "string"},
                    "year": {"type": "string", "description": "e.g. 2019-2024"},
                    "limit": {"type": "integer"}}, "required": ["query"]})),
            ),
            Tool::new(
                "browse_webpage",
                "Fetch a page.",
                obj(json!({"type": "object", "properties": {
                    "url": {"type": "string"}}, "required": ["url"]})),
            ),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = Value::Object(request.arguments.clone().unwrap_or_default());
        self.calls
            .lock()
            .unwrap()
            .push((request.name.to_string(), args.clone()));
        let result = match request.name.as_ref() {
            "snippet_search" => {
                let n = args["limit"].as_i64().unwrap_or(2);
                let data: Vec<Value> = (0..n)
                    .map(|i| json!({"paper": {"title": format!("Paper {i}")},
                        "snippet": {"text": format!("{} passage {i}", args["query"].as_str().unwrap())}}))
                    .collect();
                CallToolResult::success(vec![ContentBlock::text(json!({"data": data}).to_string())])
            }
            _ if args["url"].as_str() == Some("https://down.example") => {
                CallToolResult::error(vec![ContentBlock::text("upstream returned 503")])
            }
            _ => CallToolResult::success(vec![ContentBlock::text(format!(
                "Page text of {}",
                args["url"].as_str().unwrap()
            ))]),
        };
        Ok(result.into())
    }
}

async fn serve(handler: Papers) -> String {
    let service = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let app = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/mcp")
}

fn call(query: &str, attrs: &[(&str, &str)]) -> ToolArgs {
    ToolArgs {
        query: query.into(),
        attrs: attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
    }
}

#[tokio::test]
async fn mcp_tools_attach_by_url_and_answer_as_snippets() {
    let handler = Papers::default();
    let url = serve(handler.clone()).await;
    let server = McpServer::connect(&url, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(server.tool_names(), ["snippet_search", "browse_webpage"]);

    let mut runner = ToolRunner::new(None);
    for tool in server.tools() {
        let name = tool.name().to_string();
        runner.register(&name, tool, ToolLimits::default());
    }
    let specs = runner.specs();
    let search = specs.iter().find(|s| s.name == "snippet_search").unwrap();
    assert_eq!(search.description, "Search paper passages.");
    assert!(
        search.attributes.contains("year (e.g. 2019-2024)"),
        "{search:?}"
    );
    assert!(!search.attributes.contains("query"), "{search:?}");

    let r = runner
        .run(
            "snippet_search",
            call("graphene", &[("year", "2019-2024"), ("limit", "3")]),
        )
        .await;
    assert_eq!(r.error, None);
    assert_eq!(r.snippets.len(), 3);
    assert_eq!(r.snippets[1].title, "Paper 1");
    assert_eq!(r.snippets[1].text, "graphene passage 1");
    assert!(
        r.output_text
            .contains(&format!("<snippet id={}>", r.snippets[0].id))
    );

    let page = runner
        .run("browse_webpage", call("https://example.org/a", &[]))
        .await;
    assert_eq!(page.snippets[0].text, "Page text of https://example.org/a");

    let down = runner
        .run("browse_webpage", call("https://down.example", &[]))
        .await;
    assert!(down.snippets.is_empty());
    assert!(
        down.output_text.contains("upstream returned 503"),
        "{}",
        down.output_text
    );

    // A bad attribute never reaches the server; the model sees why.
    let bad = runner
        .run("snippet_search", call("x", &[("limit", "lots")]))
        .await;
    assert!(
        bad.output_text.contains("limit=\"lots\""),
        "{}",
        bad.output_text
    );

    let calls = handler.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        vec![
            (
                "snippet_search".to_string(),
                json!({"query": "graphene", "year": "2019-2024", "limit": 3})
            ),
            (
                "browse_webpage".to_string(),
                json!({"url": "https://example.org/a"})
            ),
            (
                "browse_webpage".to_string(),
                json!({"url": "https://down.example"})
            ),
        ]
    );
}

#[tokio::test]
async fn an_unreachable_server_is_a_clear_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    drop(listener);
    let err = McpServer::connect(&url, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&url), "{err}");
}

#[tokio::test]
async fn the_run_tool_set_attaches_mcp_servers_by_url() {
    use orchestrator::infra::tools::setup::{SetupError, ToolSetup, build};
    let url = serve(Papers::default()).await;
    let setup = ToolSetup {
        mcp_urls: vec![url],
        ..ToolSetup::default()
    };
    let runner = build(&setup, None).await.unwrap();
    assert_eq!(runner.names(), ["browse_webpage", "snippet_search"]);
    let none = build(&ToolSetup::default(), None).await.unwrap_err();
    assert!(matches!(none, SetupError::Empty), "{none}");
}
