//! A loopback fake of a benchmark grader (an OpenAI-compatible `/v1/chat/completions`) that reads
//! the grader prompts of `prompts/eval/` the way a judge would and answers in each protocol's
//! format by rules the test sets, never by comparing the answer with the rubric's own text:
//! - criterion (HealthBench): met when the graded response contains a word the test marked as
//!   the evidence of that criterion (`evidence`), else not met;
//! - three_class (SimpleQA): A when the predicted answer equals the gold target (case aside), C
//!   when it says "don't know", else B;
//! - equivalence: `correct: yes` under the same rule as A; cot_qa (WebWalker): `GRADE: CORRECT`
//!   under the same rule;
//! - verdict (ResearchRubrics): Satisfied when the evidence word is present;
//! - coverage (ResearchQA): "Completely" for items whose evidence word is present, else
//!   "Not at all";
//! - race (DRB): scores article 1 with `race_target` and article 2 with `race_reference` on
//!   every criterion listed;
//! - clean: the article with `[n]` markers removed;
//! - ingredients (SQA): 2 for criteria whose evidence word is present, else 0; precision: the
//!   paragraphs containing the `irrelevant` word;
//! - citations (SQA): every sentence is a claim; a cited source supports it when the source's
//!   quote contains every number of the sentence (a title-only source supports any cited
//!   sentence, as the protocol tells judges to do for relevant titles);
//! - facts / dedupe / fact_support (DRB FACT): sentences with `[n]` markers and the URL of `[n]`
//!   in the reference list; identical statements merged; supported when the page contains
//!   every number of the statement, unknown when the page is empty or "not found".
//!
//! It also serves web pages at `/page/{name}` (the `pages` map; 404 otherwise) for FACT's
//! fetches.
//!
//! Faults are queued (garbage, truncated JSON, a refusal, HTTP 500); latency and peak concurrency
//! are measurable for benchmarks. A `script` closure can replace the rules. Tests and benches
//! only.
#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    Garbage,
    Truncated,
    Refusal,
    Status(u16),
}

#[derive(Default)]
pub struct GraderState {
    pub faults: std::sync::Mutex<VecDeque<Fault>>,
    /// Every reply is this fault (a judge that never answers usefully).
    pub always: std::sync::RwLock<Option<Fault>>,
    /// criterion text -> the word whose presence in the response makes it met.
    pub evidence: std::sync::RwLock<BTreeMap<String, String>>,
    /// What a policy (non-grader) prompt gets: a chat baseline's answer.
    pub policy_reply: std::sync::RwLock<String>,
    pub race_target: std::sync::RwLock<f64>,
    pub race_reference: std::sync::RwLock<f64>,
    /// A paragraph containing this word is irrelevant (SQA answer precision).
    pub irrelevant: std::sync::RwLock<String>,
    /// name -> HTML served at `/page/{name}`.
    pub pages: std::sync::RwLock<BTreeMap<String, String>>,
    pub latency: std::sync::RwLock<Duration>,
    pub requests: AtomicU64,
    pub by_kind: std::sync::Mutex<BTreeMap<String, u64>>,
    pub in_flight: AtomicUsize,
    pub peak_in_flight: AtomicUsize,
}

pub struct FakeGrader {
    pub addr: SocketAddr,
    pub state: Arc<GraderState>,
    _server: super::loopback::Loopback,
}

impl FakeGrader {
    pub async fn start() -> Self {
        let state = Arc::new(GraderState::default());
        *state.race_target.write().unwrap() = 6.0;
        *state.race_reference.write().unwrap() = 4.0;
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/page/{name}", get(page))
            .route(
                "/v1/models",
                get(|| async { Json(json!({"object": "list", "data": [{"id": "grader"}]})) }),
            )
            .with_state(state.clone());
        let server = super::loopback::Loopback::serve(app).await;
        let addr = server.addr;
        FakeGrader {
            addr,
            state,
            _server: server,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn evidence(&self, criterion: &str, word: &str) {
        self.state
            .evidence
            .write()
            .unwrap()
            .insert(criterion.to_string(), word.to_lowercase());
    }

    pub fn page(&self, name: &str, html: &str) {
        self.state
            .pages
            .write()
            .unwrap()
            .insert(name.to_string(), html.to_string());
    }

    pub fn push_fault(&self, f: Fault) {
        self.state.faults.lock().unwrap().push_back(f);
    }

    pub fn set_always(&self, f: Option<Fault>) {
        *self.state.always.write().unwrap() = f;
    }

    pub fn set_latency(&self, d: Duration) {
        *self.state.latency.write().unwrap() = d;
    }

    pub fn calls(&self, kind: &str) -> u64 {
        *self.state.by_kind.lock().unwrap().get(kind).unwrap_or(&0)
    }

    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::SeqCst)
    }
}

/// Which grader template a prompt came from.
fn kind(prompt: &str) -> &'static str {
    if prompt.contains("\"criteria_met\"") {
        "criterion"
    } else if prompt.contains("Reply with only the letter A, B or C") {
        "three_class"
    } else if prompt.contains("GRADE: INCORRECT") {
        "cot_qa"
    } else if prompt.contains("correct: yes|no") {
        "equivalence"
    } else if prompt.contains("\"verdict\"") {
        "verdict"
    } else if prompt.contains("one label per line") {
        "coverage"
    } else if prompt.contains("article_1_score") {
        "race"
    } else if prompt.contains("Remove every citation marker") {
        "clean"
    } else if prompt.contains("Check how well the citations of one report section") {
        "citations"
    } else if prompt.contains("Find every statement in the report below that carries a citation") {
        "facts"
    } else if prompt.contains("were all cited to the same web page") {
        "dedupe"
    } else if prompt.contains("Below is the content of a web page") {
        "fact_support"
    } else if prompt.contains("\"scores\"") {
        "ingredients"
    } else if prompt.contains("irrelevant_paragraphs") {
        "precision"
    } else {
        "unknown"
    }
}

/// Text between a `# Name` heading and the next `# ` heading.
fn section<'a>(prompt: &'a str, name: &str) -> &'a str {
    let head = format!("# {name}\n");
    let Some(i) = prompt.find(&head) else {
        return "";
    };
    let rest = &prompt[i + head.len()..];
    let end = rest.find("\n# ").unwrap_or(rest.len());
    rest[..end].trim()
}

fn line_after<'a>(prompt: &'a str, label: &str) -> &'a str {
    prompt
        .lines()
        .find_map(|l| l.strip_prefix(label))
        .unwrap_or("")
        .trim()
}

fn reply(state: &GraderState, kind: &str, prompt: &str) -> String {
    let evidence = state.evidence.read().unwrap().clone();
    let has = |text: &str, criterion: &str| {
        evidence
            .get(criterion.trim())
            .is_some_and(|w| text.to_lowercase().contains(w))
    };
    match kind {
        "criterion" => {
            let conv = section(prompt, "Conversation");
            let response = conv.rsplit("assistant: ").next().unwrap_or("");
            let crit = section(prompt, "Criterion");
            let crit = crit.split_once("] ").map(|x| x.1).unwrap_or(crit);
            let met = has(response, crit);
            format!(
                "Here is my assessment.\n```json\n{{\"explanation\": \"checked\", \"criteria_met\": {met}}}\n```"
            )
        }
        "verdict" => {
            let doc = section(prompt, "Document");
            let crit = line_after(section(prompt, "Criterion"), "Title: ");
            let (v, s) = if has(doc, crit) {
                ("Satisfied", 1.0)
            } else {
                ("Not Satisfied", 0.0)
            };
            json!({"verdict": v, "score": s, "confidence": 0.9, "reasoning": "r", "evidence_quotes": [], "missing_elements": []}).to_string()
        }
        "cot_qa" => {
            let gold = line_after(prompt, "TRUE ANSWER: ");
            let pred = line_after(prompt, "STUDENT ANSWER: ");
            let ok = gold.eq_ignore_ascii_case(pred);
            format!(
                "The student says {pred}; the true answer is {gold}.\nGRADE: {}",
                if ok { "CORRECT" } else { "INCORRECT" }
            )
        }
        "three_class" | "equivalence" => {
            let gold = line_after(
                prompt,
                if kind == "three_class" {
                    "Gold target: "
                } else {
                    "Reference answer(s): "
                },
            );
            let pred = line_after(
                prompt,
                if kind == "three_class" {
                    "Predicted answer: "
                } else {
                    "Response: "
                },
            );
            let correct = gold.split(" / ").any(|g| g.eq_ignore_ascii_case(pred));
            if kind == "three_class" {
                if correct {
                    "A".into()
                } else if pred.to_lowercase().contains("don't know") {
                    "C".into()
                } else {
                    "B".into()
                }
            } else {
                format!(
                    "extracted_final_answer: {pred}\nreasoning: compared\ncorrect: {}",
                    if correct { "yes" } else { "no" }
                )
            }
        }
        "coverage" => {
            let response = section(prompt, "Response");
            section(prompt, "Rubric items")
                .lines()
                .filter_map(|l| l.split_once(". ").map(|x| x.1))
                .map(|item| {
                    if has(response, item) {
                        "Completely"
                    } else {
                        "Not at all"
                    }
                })
                .collect::<Vec<_>>()
                .join("\n")
        }
        "race" => {
            let t = *state.race_target.read().unwrap();
            let r = *state.race_reference.read().unwrap();
            let crit: Value = serde_json::Deserializer::from_str(section(
                prompt,
                "Criteria (grouped by dimension)",
            ))
            .into_iter::<Value>()
            .next()
            .and_then(Result::ok)
            .unwrap_or(json!({}));
            let mut out = serde_json::Map::new();
            if let Value::Object(dims) = crit {
                for (d, list) in dims {
                    let rows: Vec<Value> = list
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .iter()
                        .map(|c| json!({"criterion": c["criterion"], "analysis": "a", "article_1_score": t, "article_2_score": r}))
                        .collect();
                    out.insert(d, Value::Array(rows));
                }
            }
            format!("```json\n{}\n```", Value::Object(out))
        }
        "clean" => {
            let article = prompt
                .split_once("return the cleaned article only, without any comment.")
                .map(|x| x.1)
                .or_else(|| prompt.split_once("without any comment.").map(|x| x.1))
                .unwrap_or("")
                .trim();
            article.replace("[1]", "").replace("[2]", "")
        }
        "ingredients" => {
            let report = section(prompt, "Report");
            let scores: Vec<Value> = numbered(section(prompt, "Criteria"))
                .into_iter()
                .map(|(i, c)| {
                    let c = c.split(" (examples:").next().unwrap_or(&c).to_string();
                    json!({"criteria_idx": i, "reasoning": "r", "score": if has(report, &c) { 2 } else { 0 }, "evidence": ""})
                })
                .collect();
            json!({ "scores": scores }).to_string()
        }
        "precision" => {
            let word = state.irrelevant.read().unwrap().clone();
            let list: Vec<Value> = section(prompt, "Report")
                .split("\n\n")
                .filter(|p| !word.is_empty() && p.to_lowercase().contains(&word))
                .map(|p| json!({"reason": "off topic", "answer_text": p.trim()}))
                .collect();
            json!({ "irrelevant_paragraphs": list }).to_string()
        }
        "citations" => {
            let text = section(prompt, "Section");
            let sources: Vec<(String, String)> = section(prompt, "Cited sources")
                .lines()
                .take_while(|l| !l.starts_with("For every statement"))
                .filter_map(|l| l.split_once(": "))
                .map(|(id, q)| (id.trim().to_string(), q.trim().to_string()))
                .collect();
            let claims: Vec<Value> = text
                .split(". ")
                .filter(|x| !x.trim().is_empty())
                .map(|sentence| {
                    let nums = numbers(&unbracketed(sentence));
                    let (mut sup, mut non) = (vec![], vec![]);
                    for (id, quote) in &sources {
                        let marker = if id.starts_with('[') { id.clone() } else { format!("[{id}]") };
                        if !sentence.contains(&marker) {
                            continue;
                        }
                        let ok = quote.starts_with("Content unavailable")
                            || (!nums.is_empty() && nums.iter().all(|n| quote.contains(n.as_str())));
                        if ok { sup.push(id.clone()) } else { non.push(id.clone()) }
                    }
                    json!({"text": sentence, "supporting": sup, "non_supporting": non, "is_fully_supported": !sup.is_empty()})
                })
                .collect();
            json!({ "claims": claims }).to_string()
        }
        "facts" => {
            let report = section(prompt, "Report");
            let (body, refs) = report.split_once("\nReferences\n").unwrap_or((report, ""));
            let url_of = |n: &str| {
                refs.lines()
                    .find(|l| l.starts_with(&format!("[{n}]")))
                    .and_then(|l| l.split_whitespace().find(|w| w.starts_with("http")))
                    .unwrap_or("")
                    .to_string()
            };
            let mut out = vec![];
            for sentence in body.split(['.', '\n']) {
                let mut fact = sentence.to_string();
                let mut ids = vec![];
                while let Some(a) = fact.find('[') {
                    let Some(b) = fact[a..].find(']') else { break };
                    ids.push(fact[a + 1..a + b].to_string());
                    fact.replace_range(a..a + b + 1, "");
                }
                for id in ids {
                    out.push(json!({"fact": fact.trim(), "ref_idx": id, "url": url_of(&id)}));
                }
            }
            Value::Array(out).to_string()
        }
        "dedupe" => {
            let mut seen = std::collections::BTreeSet::new();
            let keep: Vec<usize> = numbered(section(prompt, "Statements"))
                .into_iter()
                .filter(|(_, f)| seen.insert(f.to_lowercase()))
                .map(|(i, _)| i)
                .collect();
            json!(keep).to_string()
        }
        "fact_support" => {
            let page = section(prompt, "Page");
            let dead = page.trim().is_empty() || page.to_lowercase().contains("not found");
            let out: Vec<Value> = numbered(section(prompt, "Statements"))
                .into_iter()
                .map(|(i, f)| {
                    let nums = numbers(&f);
                    let r = if dead {
                        "unknown"
                    } else if !nums.is_empty() && nums.iter().all(|n| page.contains(n.as_str())) {
                        "supported"
                    } else {
                        "unsupported"
                    };
                    json!({"idx": i, "result": r})
                })
                .collect();
            Value::Array(out).to_string()
        }
        _ => state.policy_reply.read().unwrap().clone(),
    }
}

/// `N. text` lines of a prompt block.
fn numbered(block: &str) -> Vec<(usize, String)> {
    block
        .lines()
        .filter_map(|l| {
            let (n, t) = l.trim().split_once(". ")?;
            Some((n.parse().ok()?, t.trim().to_string()))
        })
        .collect()
}

/// A text without its `[...]` markers.
fn unbracketed(text: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in text.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            c if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// The digit runs of a text.
fn numbers(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter(|x| !x.is_empty())
        .map(str::to_string)
        .collect()
}

async fn page(
    State(state): State<Arc<GraderState>>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Response {
    match state.pages.read().unwrap().get(&name) {
        Some(html) => (
            [(axum::http::header::CONTENT_TYPE, "text/html")],
            html.clone(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "not found").into_response(),
    }
}

async fn chat(State(state): State<Arc<GraderState>>, Json(body): Json<Value>) -> Response {
    state.requests.fetch_add(1, Ordering::SeqCst);
    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    state.peak_in_flight.fetch_max(now, Ordering::SeqCst);
    let latency = *state.latency.read().unwrap();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let prompt = super::loopback::last_message(&body);
    let k = kind(&prompt);
    super::loopback::tally(&state.by_kind, k);
    let fault = state
        .always
        .read()
        .unwrap()
        .clone()
        .or_else(|| state.faults.lock().unwrap().pop_front());
    let content = match fault {
        Some(Fault::Status(s)) => {
            state.in_flight.fetch_sub(1, Ordering::SeqCst);
            return (
                StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                "fault",
            )
                .into_response();
        }
        Some(Fault::Garbage) => "lorem ipsum, no verdict here".to_string(),
        Some(Fault::Truncated) => {
            let full = reply(&state, k, &prompt);
            full.chars().take(full.chars().count() / 2).collect()
        }
        Some(Fault::Refusal) => "I'm sorry, but I can't help with that.".to_string(),
        None => reply(&state, k, &prompt),
    };
    state.in_flight.fetch_sub(1, Ordering::SeqCst);
    Json(super::loopback::completion(
        &body,
        &content,
        prompt.len() / 4,
        20,
    ))
    .into_response()
}
