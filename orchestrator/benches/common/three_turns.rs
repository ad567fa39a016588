//! The 3-turn scaffold trajectory the rollout benches replay (plan + call, research + call,
//! review + answer) and the instant search tool its calls hit (three synthetic snippets).
#![allow(dead_code, reason = "each bench uses the part it needs")]
#![allow(clippy::unwrap_used, reason = "benchmark code fails loudly")]

use std::sync::Arc;

use futures::future::BoxFuture;
use orchestrator::infra::tools::runner::{
    Snippet, Tool, ToolArgs, ToolError, ToolLimits, ToolRunner,
};

/// The fake policy's auto turns: turn k answers a prompt holding k tool outputs.
pub const TURNS: [&str; 3] = [
    "<think>The question needs a mechanism and a use case; plan two searches.</think><structured_plan><deep_analysis>two parts</deep_analysis><rubric>Knowledge checklist:\n- mechanism\n- use</rubric><research_plan>search mechanism, then uses</research_plan></structured_plan><call_tool name=\"google_search\">mechanism of the enzyme</call_tool>",
    "<think>Mechanism found.</think><state_evaluation>mechanism covered; uses missing</state_evaluation><call_tool name=\"google_search\">uses of the enzyme in sequencing</call_tool>",
    "<think>Enough.</think><state_evaluation>all covered</state_evaluation><review><rubric_review>both items supported</rubric_review><writing_plan>two sentences</writing_plan></review><answer>It cuts and pastes <cite id=\"a\">DNA</cite>, and is used in sequencing.</answer>",
];

/// A `google_search` that answers at once with three snippets echoing the query.
pub struct InstantSearch;

impl Tool for InstantSearch {
    fn name(&self) -> &str {
        "google_search"
    }
    fn spec(&self) -> orchestrator::infra::chat::ToolSpec {
        orchestrator::infra::chat::ToolSpec {
            name: "google_search".into(),
            description: "x".into(),
            attributes: String::new(),
        }
    }
    fn call<'a>(&'a self, a: &'a ToolArgs) -> BoxFuture<'a, Result<Vec<Snippet>, ToolError>> {
        Box::pin(async move {
            Ok((0..3)
                .map(|i| {
                    Snippet::new(
                        "g",
                        format!("t{i}"),
                        None,
                        format!("{} evidence {i} sentence about the topic.", a.query),
                    )
                })
                .collect())
        })
    }
}

/// A tool runner with [`InstantSearch`] allowing `concurrency` calls at once.
pub fn runner(concurrency: usize) -> ToolRunner {
    let mut tools = ToolRunner::new(None);
    tools.register(
        "google_search",
        Arc::new(InstantSearch),
        ToolLimits {
            max_concurrency: concurrency,
            ..Default::default()
        },
    );
    tools
}

/// Process CPU seconds so far (user + system, from /proc/self/stat).
pub fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0 // utime + stime, USER_HZ = 100
}

/// In the child [`spawn_fake`] starts (this executable with `--serve LATENCY_MS`): serve the fake
/// policy (auto turns [`TURNS`], the given reflection replies) until the parent closes stdin, then
/// return true. Returns false at once in the parent.
pub fn serve_if_child(reflection_replies: &[&str]) -> bool {
    let args: Vec<String> = std::env::args().collect();
    let Some(i) = args.iter().position(|a| a == "--serve") else {
        return false;
    };
    let latency_ms: u64 = args[i + 1].parse().unwrap();
    let replies: Vec<String> = reflection_replies.iter().map(|s| s.to_string()).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let server = super::fake_openai::FakeServer::start().await;
        server.set_latency(std::time::Duration::from_millis(latency_ms));
        *server.state.auto_turns.write().unwrap() = TURNS.iter().map(|s| s.to_string()).collect();
        if !replies.is_empty() {
            *server.state.reflection_replies.write().unwrap() = replies;
        }
        println!("{}", server.url());
        let mut line = String::new();
        let _ = tokio::task::spawn_blocking(move || std::io::stdin().read_line(&mut line)).await;
    });
    true
}

/// Start this bench executable again as `--serve LATENCY_MS` (the fake policy server in a child
/// process, so CPU figures are the parent's alone); returns the child and the URL it printed.
/// The child serves until its stdin is closed.
pub fn spawn_fake(latency_ms: u64) -> (std::process::Child, String) {
    use std::io::{BufRead, BufReader};
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--serve", &latency_ms.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut url = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut url)
        .unwrap();
    (child, url.trim().to_string())
}
