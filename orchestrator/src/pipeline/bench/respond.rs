//! What is evaluated: the project's agent (any scaffold, any OpenAI-compatible policy endpoint,
//! a chosen tool set), a plain chat model without tools, or an answers file of another system.
//! Each produces one response per item, stored as soon as it exists.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::json;

use crate::domain::bench::cite::Source;
use crate::domain::bench::text::{Extract, extract};
use crate::domain::bench::{Benchmark, Item, Turn};
use crate::infra::chat::AnswerFormat;
use crate::infra::db::bench::ResponseRow;
use crate::infra::llm::{ChatMessage, ChatRequest, LlmClient};
use crate::pipeline::rollout::{RolloutCtx, RolloutSlot, RolloutTask};

/// The rollout-slot step of benchmark rollouts (seeds depend on the item only).
const BENCH_SEED_STEP: i32 = 0x4245;

/// Who answers the items.
#[derive(Clone)]
pub enum Responder {
    /// The project's agent: a scaffold with tools on a policy endpoint.
    Agent {
        ctx: Box<RolloutCtx>,
        /// The scaffold's system prompt with the tool list.
        system: String,
        policy_version: i32,
    },
    /// A plain chat model answering the benchmark's conversation as is (no tools).
    Chat {
        client: LlmClient,
        system: Option<String>,
        temperature: f32,
        max_tokens: u32,
        seed: Option<u64>,
    },
    /// Published answers of another system, by item id.
    Answers(Arc<HashMap<String, String>>),
}

impl Responder {
    pub fn kind(&self) -> &'static str {
        match self {
            Responder::Agent { .. } => "agent",
            Responder::Chat { .. } => "chat",
            Responder::Answers(_) => "answers",
        }
    }

    /// Produce `item`'s response. Never fails: a failure is a recorded outcome (no answer, the
    /// error named).
    pub async fn respond(&self, bench: Benchmark, run_id: uuid::Uuid, item: &Item) -> ResponseRow {
        let t0 = std::time::Instant::now();
        let mut row = ResponseRow {
            item_id: item.id.clone(),
            answer: None,
            raw: None,
            trajectory: None,
            finish_reason: "error".into(),
            model_tokens: 0,
            tool_calls: 0,
            seconds: 0.0,
            error: None,
        };
        match self {
            Responder::Answers(map) => match map.get(&item.id) {
                Some(a) => {
                    row.raw = Some(a.clone());
                    row.answer = Some(graded_text(bench, a));
                    row.finish_reason = "answers_file".into();
                }
                None => {
                    row.finish_reason = "missing".into();
                    row.error = Some(format!("the answers file has no row with id `{}`", item.id));
                }
            },
            Responder::Chat {
                client,
                system,
                temperature,
                max_tokens,
                seed,
            } => {
                let mut messages: Vec<ChatMessage> = system
                    .iter()
                    .map(|s| ChatMessage::system(s.clone()))
                    .collect();
                messages.extend(item.prompt.iter().map(|t| ChatMessage {
                    role: t.role.clone(),
                    content: t.content.clone(),
                }));
                let req = ChatRequest {
                    model: client.model().to_string(),
                    messages,
                    temperature: *temperature,
                    max_tokens: *max_tokens,
                    response_format: None,
                    seed: *seed,
                    stop: vec![],
                };
                match client.chat(&req).await {
                    Ok((c, _)) => {
                        row.answer = Some(graded_text(bench, &c.content));
                        row.raw = Some(c.content);
                        row.finish_reason = format!("{:?}", c.finish_reason).to_lowercase();
                        row.model_tokens = c.usage.completion_tokens.min(i32::MAX as u64) as i32;
                    }
                    Err(e) => row.error = Some(format!("policy: {e}")),
                }
            }
            Responder::Agent {
                ctx,
                system,
                policy_version,
            } => {
                let task = RolloutTask {
                    task_id: item_uuid(run_id, &item.id),
                    key: crate::domain::util::task_key(bench.as_str(), &item.id),
                    system: system.clone(),
                    user: crate::infra::prompts::user_message(&agent_question(item), format(bench)),
                };
                let slot = RolloutSlot {
                    run_id,
                    step: BENCH_SEED_STEP,
                    sample_index: 0,
                    policy_version: *policy_version,
                };
                match ctx.run(&task, slot).await {
                    Ok(r) => {
                        let answer = if bench.short_answer() {
                            r.parsed.boxed.clone().or(r.parsed.answer.clone())
                        } else {
                            r.parsed.answer.clone()
                        };
                        row.answer = answer.map(|a| graded_text(bench, &a));
                        row.finish_reason = r.trajectory.finish_reason.clone();
                        row.model_tokens = r.trajectory.num_model_tokens() as i32;
                        row.tool_calls = r.calls.len() as i32;
                        row.raw = Some(
                            r.trajectory
                                .segments
                                .iter()
                                .map(|s| s.text.as_str())
                                .collect(),
                        );
                        row.trajectory = Some(json!({
                            "segments": r.trajectory.segments.iter().map(|s| json!({
                                "kind": s.kind, "stage": s.stage, "text": s.text,
                            })).collect::<Vec<_>>(),
                            "parsed": r.trajectory.parsed,
                            "calls": r.calls.iter().map(|c| json!({
                                "stage": c.stage, "tool": c.result.tool,
                                "ok": c.result.error.is_none(),
                            })).collect::<Vec<_>>(),
                            // What the answer's citations can point at (the citation graders'
                            // quotes and FACT's pages when not re-fetched).
                            "sources": trace_sources(&r.calls),
                        }));
                        if let Some(e) = r.error {
                            row.error = Some(format!("policy server: {e}"));
                            row.answer = None;
                        } else if row.answer.is_none() {
                            row.error = Some("the agent wrote no answer".into());
                        }
                    }
                    Err(e) => row.error = Some(format!("rollout: {e}")),
                }
            }
        }
        row.seconds = t0.elapsed().as_secs_f64();
        row
    }
}

/// The distinct snippets the agent's tool calls returned, by id.
fn trace_sources(calls: &[crate::domain::rollout::ExecutedCall]) -> Vec<Source> {
    let mut seen = std::collections::HashSet::new();
    calls
        .iter()
        .flat_map(|c| c.result.snippets.iter())
        .filter(|s| seen.insert(s.id.clone()))
        .map(|s| Source {
            id: s.id.clone(),
            title: s.title.clone(),
            url: s.url.clone(),
            text: s.text.clone(),
        })
        .collect()
}

/// The sources stored with a response's trajectory (none for answers files and chat).
pub fn stored_sources(trajectory: Option<&serde_json::Value>) -> Vec<Source> {
    trajectory
        .and_then(|t| t.get("sources"))
        .and_then(|s| serde_json::from_value(s.clone()).ok())
        .unwrap_or_default()
}

/// A stable task id for an item (its rollouts carry it, the same when the run resumes).
/// Sampling seeds key on the benchmark and the item's id (`domain::util::task_key`), not on
/// this id, so two runs with one seed sample the same answers.
fn item_uuid(run_id: uuid::Uuid, item_id: &str) -> uuid::Uuid {
    let digest = crate::domain::util::sha256(format!("{run_id}/{item_id}").as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_random_bytes(bytes).into_uuid()
}

/// The answer format the agent is asked for: an exact answer on short-answer benchmarks, a long
/// cited report otherwise.
fn format(bench: Benchmark) -> AnswerFormat {
    if bench.short_answer() {
        AnswerFormat::Exact
    } else {
        AnswerFormat::Long
    }
}

/// The question the agent gets: a multi-turn conversation is flattened into one user message
/// (earlier turns as `Patient:` / `Physician:` lines, then the last user turn), as DR Tulu's
/// HealthBench loader does (benchmarks.md §1).
pub fn agent_question(item: &Item) -> String {
    let turns: &[Turn] = &item.prompt;
    match turns {
        [] => String::new(),
        [one] => one.content.clone(),
        _ => {
            let (last, earlier) = turns.split_last().unwrap_or((&turns[0], &[]));
            let mut s = String::from("Conversation so far:\n");
            for t in earlier {
                let who = if t.role == "user" {
                    "Patient"
                } else {
                    "Physician"
                };
                s.push_str(&format!("{who}: {}\n", t.content.trim()));
            }
            s.push_str(&format!(
                "\nSearch for the information needed and answer the last message: {}",
                last.content.trim()
            ));
            s
        }
    }
}

/// The text the graders see: for short-answer benchmarks the protocol's extraction (the
/// `<answer>` contents, then the first `\boxed{}`, then an `Exact Answer:` line); the whole
/// answer otherwise.
pub fn graded_text(bench: Benchmark, text: &str) -> String {
    if bench.short_answer() {
        extract(
            text,
            &[Extract::AnswerTag, Extract::Boxed, Extract::ExactAnswerLine],
        )
    } else {
        extract(text, &[Extract::AnswerTag])
    }
}
