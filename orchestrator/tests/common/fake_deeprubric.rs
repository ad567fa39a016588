//! A loopback fake of the LLM DeepRubric's stages call (an OpenAI-compatible
//! `/v1/chat/completions`) that reads the prompts of `prompts/deeprubric/` and answers by fixed
//! rules, never by echoing what the validation expects:
//! - root: the seed page's first sentence as the summary, the next two as information points;
//! - statements: the first sentence of each passage shown (at most 3);
//! - gate: branch while the node's depth is below 2;
//! - sub-queries: two, "mechanism of ..." and "risks of ..." over the node's first words;
//! - compose: the first (up to) 5 leaves with statements; 4 factual rubrics whose evidence is the
//!   first statement of their leaf, copied, one logical rubric, and a sixth with a negative
//!   weight and no justification;
//! - verify: REVISE when the question mentions a `revise` marker word (repaired question, five
//!   rubrics), DROP for a `drop` marker, else KEEP.
//!
//! Faults (garbage replies) are queued; latency and calls per kind are measurable. Tests only.
#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

#[derive(Default)]
pub struct DrState {
    pub garbage: std::sync::Mutex<VecDeque<&'static str>>,
    pub revise_marker: std::sync::RwLock<String>,
    pub drop_marker: std::sync::RwLock<String>,
    pub latency: std::sync::RwLock<Duration>,
    pub requests: AtomicU64,
    pub by_kind: std::sync::Mutex<BTreeMap<String, u64>>,
}

pub struct FakeDr {
    pub addr: SocketAddr,
    pub state: Arc<DrState>,
    _server: super::loopback::Loopback,
}

impl FakeDr {
    pub async fn start() -> Self {
        let state = Arc::new(DrState::default());
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route(
                "/v1/models",
                get(|| async { Json(json!({"object": "list", "data": [{"id": "dr"}]})) }),
            )
            .with_state(state.clone());
        let server = super::loopback::Loopback::serve(app).await;
        FakeDr {
            addr: server.addr,
            state,
            _server: server,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn calls(&self, kind: &str) -> u64 {
        *self.state.by_kind.lock().unwrap().get(kind).unwrap_or(&0)
    }

    /// The next reply of `kind` is garbage (then the rules again).
    pub fn garbage_once(&self, kind: &'static str) {
        self.state.garbage.lock().unwrap().push_back(kind);
    }
}

fn kind(prompt: &str) -> &'static str {
    if prompt.contains("its information points") {
        "root"
    } else if prompt.contains("Extract the factual statements") {
        "statements"
    } else if prompt.contains("should branch into sub-questions") {
        "gate"
    } else if prompt.contains("Propose at most") {
        "subqueries"
    } else if prompt.contains("You turn an evidence tree into one training task") {
        "compose"
    } else if prompt.contains("You audit a training task") {
        "verify"
    } else {
        "unknown"
    }
}

fn section<'a>(prompt: &'a str, head: &str) -> &'a str {
    let Some(i) = prompt.find(head) else {
        return "";
    };
    let rest = &prompt[i + head.len()..];
    let rest = rest.split_once('\n').map_or(rest, |x| x.1);
    let end = rest.find("\n# ").unwrap_or(rest.len());
    rest[..end].trim()
}

/// The JSON value a prompt block starts with (text after it ignored).
fn first_value(text: &str) -> Value {
    serde_json::Deserializer::from_str(text)
        .into_iter::<Value>()
        .next()
        .and_then(Result::ok)
        .unwrap_or(json!({}))
}

fn first_sentence(text: &str) -> String {
    let s = text.split(". ").next().unwrap_or(text).trim();
    let s = s.trim_end_matches('.');
    format!("{s}.")
}

fn reply(state: &DrState, kind: &str, prompt: &str) -> String {
    match kind {
        "statements" => {
            // Passage blocks: "[id] title" then the text.
            let passages = section(prompt, "# Passages");
            let stmts: Vec<String> = passages
                .split("\n\n")
                .filter_map(|b| b.split_once('\n').map(|x| x.1))
                .filter(|t| t.split_whitespace().count() >= 4)
                .take(3)
                .map(first_sentence)
                .collect();
            json!({ "statements": stmts }).to_string()
        }
        "root" => {
            // The page's text (after its title line): the first sentence summarises, the next
            // two are the information points.
            let page = section(prompt, "# Page");
            let body = page.split_once("\n\n").map_or(page, |x| x.1);
            let sentences: Vec<String> = body
                .split(". ")
                .filter(|x| x.split_whitespace().count() >= 4)
                .take(3)
                .map(first_sentence)
                .collect();
            json!({"summary": sentences.first(), "information_points": sentences.get(1..).unwrap_or(&[])})
                .to_string()
        }
        "gate" => {
            let depth: u32 = prompt
                .split("(depth ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|d| d.parse().ok())
                .unwrap_or(9);
            json!({"branch": depth < 2, "reason": format!("depth {depth}")}).to_string()
        }
        "subqueries" => {
            let node = section(prompt, "# Node");
            let short: Vec<&str> = node.split_whitespace().take(4).collect();
            let short = short.join(" ");
            json!({"sub_queries": [format!("mechanism of {short}"), format!("risks of {short}")]})
                .to_string()
        }
        "compose" => {
            let tree = first_value(section(prompt, "# Tree"));
            let root = tree["nodes"][0]["query"]
                .as_str()
                .unwrap_or("the topic")
                .to_string();
            let leaves: Vec<(String, String)> = tree["leaves"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .filter_map(|l| {
                    Some((
                        l["id"].as_str()?.to_string(),
                        l["statements"][0].as_str()?.to_string(),
                    ))
                })
                .take(5)
                .collect();
            let selected: Vec<&str> = leaves.iter().map(|(id, _)| id.as_str()).collect();
            let mut rubrics: Vec<Value> = (0..4)
                .map(|i| {
                    let (id, st) = &leaves[i % leaves.len()];
                    json!({"id": format!("R{}", i + 1), "type": "factual",
                           "description": format!("States finding {} reported for {id}", i + 1),
                           "weight": 0.2, "source_leaf_ids": [id], "evidence": [st]})
                })
                .collect();
            rubrics.push(json!({"id": "R5", "type": "logical",
                "description": "Compares the strength of the evidence across the selected studies",
                "weight": 0.3, "source_leaf_ids": selected.clone(), "evidence": []}));
            rubrics.push(json!({"id": "R6", "type": "logical",
                "description": "Claims the question is settled beyond doubt",
                "weight": -0.3, "source_leaf_ids": [selected[0]], "evidence": []}));
            json!({
                "question": format!("What does current research show about {root}, and how consistent are the findings across studies?"),
                "selected_leaf_ids": selected,
                "selection_trace": selected.iter().map(|l| json!({"leaf_id": l, "reason": "distinct facet"})).collect::<Vec<_>>(),
                "merge_trace": [{"inputs": selected, "output": "merged", "rationale": "common topic"}],
                "rubrics": rubrics,
            })
            .to_string()
        }
        "verify" => {
            let q = section(prompt, "# Question").to_lowercase();
            let revise = state.revise_marker.read().unwrap().clone();
            let drop = state.drop_marker.read().unwrap().clone();
            if !drop.is_empty() && q.contains(&drop) {
                return json!({"decision": "DROP", "error_tags": ["scope/merge overreach"],
                    "major_issues": [{"type": "scope", "severity": "high", "description": "too broad"}],
                    "justification": "not salvageable"}).to_string();
            }
            if !revise.is_empty() && q.contains(&revise) {
                let rubrics: Vec<Value> =
                    serde_json::from_value(first_value(section(prompt, "# Rubrics")))
                        .unwrap_or_default();
                let revised: Vec<Value> = rubrics
                    .into_iter()
                    .filter(|r| r["weight"].as_f64().unwrap_or(0.0) > 0.0)
                    .map(|mut r| {
                        r["description"] = json!(format!(
                            "{} (tightened)",
                            r["description"].as_str().unwrap_or("")
                        ));
                        r
                    })
                    .collect();
                return json!({"decision": "REVISE", "error_tags": ["question-rubric mismatch"],
                    "major_issues": [], "justification": "rubrics too loose",
                    "revised_question": "Which mechanisms explain the reported effects, and where do the studies disagree?",
                    "revised_rubrics": revised}).to_string();
            }
            json!({"decision": "KEEP", "error_tags": [], "major_issues": [], "justification": "sound"}).to_string()
        }
        _ => "{}".into(),
    }
}

async fn chat(State(state): State<Arc<DrState>>, Json(body): Json<Value>) -> Json<Value> {
    state.requests.fetch_add(1, Ordering::SeqCst);
    let latency = *state.latency.read().unwrap();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let prompt = super::loopback::last_message(&body);
    let k = kind(&prompt);
    super::loopback::tally(&state.by_kind, k);
    let garbage = {
        let mut q = state.garbage.lock().unwrap();
        match q.iter().position(|x| *x == k) {
            Some(i) => {
                q.remove(i);
                true
            }
            None => false,
        }
    };
    let content = if garbage {
        "Sure! Here is what I think, without any JSON.".to_string()
    } else {
        reply(&state, k, &prompt)
    };
    Json(super::loopback::completion(
        &body,
        &content,
        prompt.len() / 4,
        content.len() / 4,
    ))
}
