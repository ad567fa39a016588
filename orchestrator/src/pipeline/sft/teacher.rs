//! SFT data from a teacher endpoint (method.md A.3): a chat model behind any OpenAI-compatible
//! `/v1/chat/completions` writes scaffold trajectories one round per call. Round 1 gets the
//! first-round prompt (scratchpad, structured plan, exactly one tool call); later rounds get the
//! later-round prompt with the trajectory so far (scratchpad, state evaluation, then a call or
//! review + answer). Each call stops at `</call_tool>` or `</answer>`; the tool it names runs
//! through the same [`ToolRunner`] as rollouts and its output is appended. The loop ends at an
//! answer, a missing call, an exhausted budget or `max_rounds`. Then the A.3 post-processing
//! (`<scratchpad>` to `<think>`, tool-name normalisation) and rejection rules apply, and a kept
//! trajectory becomes one ChatML row with the agent's own system prompt and tool spans masked.

use futures::StreamExt;

use super::{SftMessage, SftRow, SftSegment, SftStats};
use crate::domain::scaffold::parse::parse;
use crate::domain::scaffold::sft::{Round, check, postprocess};
use crate::infra::chat::{AnswerFormat, ToolSpec};
use crate::infra::llm::{ChatMessage, ChatRequest, LlmClient};
use crate::infra::tools::runner::ToolRunner;

const FIRST: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/sft/teacher_first.jinja"
));
const LATER: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/sft/teacher_later.jinja"
));
const USER: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/sft/teacher_user.jinja"
));

/// Each round ends at the first of these (the server drops the match; it is restored).
pub const STOPS: [&str; 2] = ["</call_tool>", "</answer>"];

#[derive(Debug, thiserror::Error)]
pub enum TeacherError {
    #[error("cannot render the teacher prompt `{name}`: {message}")]
    Prompt { name: &'static str, message: String },
}

/// How the teacher is sampled and how long a trajectory may run.
#[derive(Debug, Clone, PartialEq)]
pub struct TeacherSettings {
    /// Rounds (API calls) per trajectory; A.3 stops after 10.
    pub max_rounds: u32,
    /// Tool calls per trajectory (the agent's budget).
    pub max_tool_calls: u32,
    pub temperature: f32,
    /// Completion tokens per round.
    pub max_tokens: u32,
    /// Trajectories written at once.
    pub concurrency: usize,
}

impl Default for TeacherSettings {
    fn default() -> Self {
        Self {
            max_rounds: 10,
            max_tool_calls: 10,
            temperature: 0.7,
            max_tokens: 4096,
            concurrency: 8,
        }
    }
}

/// One question for the teacher.
#[derive(Debug, Clone, PartialEq)]
pub struct TeacherTask {
    pub id: String,
    pub query: String,
    pub format: AnswerFormat,
}

/// The teacher loop over one client and one tool runner.
pub struct Teacher<'a> {
    pub client: &'a LlmClient,
    pub tools: &'a ToolRunner,
    /// The agent's system prompt written into each row (not the teacher's prompts).
    pub system: String,
    pub settings: TeacherSettings,
}

fn render(name: &'static str, source: &str, ctx: minijinja::Value) -> Result<String, TeacherError> {
    crate::infra::prompts::render(source, ctx)
        .map(|s| s.trim().to_string())
        .map_err(|e| TeacherError::Prompt {
            name,
            message: e.to_string(),
        })
}

/// Restore the stop sequence the server dropped: an open `<call_tool …>` or `<answer>` at the
/// end of a round is closed. Text after the first complete call or answer is cut (nothing may
/// follow either).
pub fn close_round(text: &str) -> String {
    let mut t = text.trim_end().to_string();
    for (open, close) in [("<call_tool", "</call_tool>"), ("<answer>", "</answer>")] {
        if let Some(i) = t.rfind(open)
            && !t[i..].contains(close)
        {
            t.push_str(close);
        }
    }
    let ends: Vec<usize> = STOPS
        .iter()
        .filter_map(|s| t.find(s).map(|i| i + s.len()))
        .collect();
    if let Some(end) = ends.into_iter().min() {
        t.truncate(end);
    }
    t
}

impl Teacher<'_> {
    fn first_prompt(&self, specs: &[ToolSpec]) -> Result<String, TeacherError> {
        render(
            "sft/teacher_first.jinja",
            FIRST,
            minijinja::context! { tools => specs, max_tool_calls => self.settings.max_tool_calls },
        )
    }

    fn later_prompt(&self, specs: &[ToolSpec], calls_left: u32) -> Result<String, TeacherError> {
        render(
            "sft/teacher_later.jinja",
            LATER,
            minijinja::context! { tools => specs, calls_left => calls_left },
        )
    }

    /// One trajectory, or the name of the rule it broke (`teacher_error` when the endpoint
    /// failed after its retries; the error is logged).
    pub async fn teach(&self, task: &TeacherTask) -> Result<Result<SftRow, String>, TeacherError> {
        let specs = self.tools.specs();
        let s = &self.settings;
        let question = crate::infra::prompts::user_message(&task.query, task.format);
        let mut texts: Vec<(String, bool)> = Vec::new();
        let mut segments: Vec<SftSegment> = Vec::new();
        let mut trace = String::new();
        for round in 0..s.max_rounds.max(1) {
            // Every round before this one ended in a call (any other round ends the loop).
            let calls_left = s.max_tool_calls.saturating_sub(round);
            let system = if round == 0 {
                self.first_prompt(&specs)?
            } else {
                self.later_prompt(&specs, calls_left)?
            };
            let user = render(
                "sft/teacher_user.jinja",
                USER,
                minijinja::context! { question => question, trace => trace.trim() },
            )?;
            let req = ChatRequest {
                model: self.client.model().to_string(),
                messages: vec![ChatMessage::system(system), ChatMessage::user(user)],
                temperature: s.temperature,
                max_tokens: s.max_tokens,
                response_format: None,
                seed: None,
                stop: STOPS.iter().map(|x| x.to_string()).collect(),
            };
            let reply = match self.client.chat(&req).await {
                Ok((c, _)) => c.content,
                Err(e) => {
                    tracing::warn!(task = %task.id, round, error = %e, "teacher call failed");
                    return Ok(Err("teacher_error".into()));
                }
            };
            let text = close_round(&postprocess(&reply));
            let p = parse(&text, &|_| true);
            let call = p
                .tool_calls
                .last()
                .filter(|c| c.closed && p.answer.is_none())
                .cloned();
            segments.push(SftSegment {
                kind: "model",
                text: text.clone(),
            });
            let Some(call) = call.filter(|_| calls_left > 0) else {
                // An answer, a round without a usable call, or a call past the budget: the
                // trajectory ends here and the rules decide.
                texts.push((text, false));
                break;
            };
            let res = self.tools.run(&call.name, call.args()).await;
            let output = format!("\n{}\n", res.output_text);
            trace.push_str(&text);
            trace.push_str(&output);
            texts.push((text, res.error.is_some()));
            segments.push(SftSegment {
                kind: "tool_output",
                text: output,
            });
        }
        let rounds: Vec<Round<'_>> = texts
            .iter()
            .map(|(t, e)| Round {
                text: t,
                tool_error: *e,
            })
            .collect();
        if let Some(rule) = check(&rounds).first() {
            return Ok(Err(rule.name().to_string()));
        }
        let assistant: String = segments.iter().map(|s| s.text.as_str()).collect();
        Ok(Ok(SftRow {
            id: task.id.clone(),
            messages: vec![
                SftMessage {
                    role: "system",
                    content: self.system.clone(),
                },
                SftMessage {
                    role: "user",
                    content: question,
                },
                SftMessage {
                    role: "assistant",
                    content: assistant,
                },
            ],
            segments,
        }))
    }

    /// Teach every task, `concurrency` at a time; rows keep the task order.
    pub async fn run(
        &self,
        tasks: &[TeacherTask],
        progress: Option<&indicatif::ProgressBar>,
    ) -> Result<(Vec<SftRow>, SftStats), TeacherError> {
        let mut stats = SftStats {
            tasks: tasks.len(),
            ..Default::default()
        };
        let mut rows = Vec::new();
        let mut outcomes = futures::stream::iter(tasks)
            .map(|t| self.teach(t))
            .buffered(self.settings.concurrency.max(1));
        while let Some(o) = outcomes.next().await {
            match o? {
                Ok(r) => rows.push(r),
                Err(rule) => *stats.rejected.entry(rule).or_default() += 1,
            }
            if let Some(pb) = progress {
                pb.inc(1);
            }
        }
        stats.written = rows.len();
        Ok((rows, stats))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_round_restores_dropped_stops_and_cuts_trailing_text() {
        assert_eq!(
            close_round("<scratchpad>x</scratchpad><call_tool name=\"google_search\">q"),
            "<scratchpad>x</scratchpad><call_tool name=\"google_search\">q</call_tool>"
        );
        assert_eq!(close_round("<answer>yes"), "<answer>yes</answer>");
        // Servers that keep the stop string: unchanged; text after the first stop is cut.
        assert_eq!(
            close_round("<call_tool name=\"a\">q</call_tool> and then <answer>x</answer>"),
            "<call_tool name=\"a\">q</call_tool>"
        );
        assert_eq!(close_round("no tags  \n"), "no tags");
    }

    #[test]
    fn prompts_render_with_tools_and_budget() {
        let runner = ToolRunner::new(None);
        let client = LlmClient::new(
            crate::infra::llm::build_http(std::time::Duration::from_secs(1)).unwrap(),
            std::sync::Arc::new(crate::infra::llm::EndpointPool::new(
                crate::infra::llm::Role::Policy,
                "teacher",
                &[],
                1,
                std::time::Duration::from_secs(1),
                1,
            )),
            crate::infra::llm::RetryPolicy::none(),
        );
        let t = Teacher {
            client: &client,
            tools: &runner,
            system: "SYS".into(),
            settings: TeacherSettings::default(),
        };
        let specs = vec![ToolSpec {
            name: "google_search".into(),
            description: "web search".into(),
            attributes: String::new(),
        }];
        let first = t.first_prompt(&specs).unwrap();
        assert!(first.contains("FIRST round") && first.contains("google_search: web search"));
        assert!(first.contains("at most 10 calls"));
        let later = t.later_prompt(&specs, 0).unwrap();
        assert!(later.contains("no tool calls are left") && later.contains("Tool calls left: 0"));
        let later = t.later_prompt(&specs, 3).unwrap();
        assert!(!later.contains("no tool calls are left"));
    }
}
