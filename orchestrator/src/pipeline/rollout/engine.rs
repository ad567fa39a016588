//! One trajectory, token-in/token-out: generate until `</call_tool>` or `</answer>`, run the
//! tool, append its output tokens (no loss), continue; at most `max_tool_calls` calls and a token
//! budget; a forced final-answer turn when a budget runs out or the model stops without
//! answering. Afterwards every model token gets exactly one stage (method.md A.2.4) and the
//! trajectory is split into segments of one kind and one stage. `replay` builds the same
//! trajectory from a demonstration's turns (off-policy guidance) without the policy server.
//!
//! Finish reasons (stored in `trajectories.finish_reason`) are the constants of
//! `domain::trajectory::finish`: `answer`, `forced_answer`, `length` (the token budget ran out
//! before a closed answer), `repetition` (with `rollout.repetition_detection`, the server
//! stopped a turn in a verbatim loop: the attempt ends there, unanswered), `error` and
//! `prompt_too_long`.

use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use uuid::Uuid;

use super::codec::{CodecError, TokenCodec};
use crate::domain::scaffold::{self, Parsed, Scaffold};
pub use crate::domain::trajectory::TEACHER;
use crate::domain::trajectory::{Segment, SegmentKind, Trajectory, finish};
use crate::infra::llm::{CompletionRequest, FinishReason, LlmClient, LlmError};
use crate::infra::tools::runner::{ToolResult, ToolRunner};

pub use crate::domain::util::{mix_seed, task_key};

/// Stop strings: a turn ends right after a tool call or the answer.
pub const STOPS: &[&str] = &["</call_tool>", "</call>", "</answer>"];

use crate::domain::config::RolloutConfig;

#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error("rollout cancelled")]
    Cancelled,
}

/// What to roll out.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutTask {
    pub task_id: Uuid,
    /// Sampling seed material: `task_key(source, external_id)`, the same in every database and
    /// distinct for two tasks that ask the same question.
    pub key: u64,
    pub system: String,
    pub user: String,
}

impl RolloutTask {
    /// The task rows of a task file with their database ids, under one system prompt.
    pub fn from_rows(
        rows: &[crate::domain::data::tasks::TaskRow],
        ids: &[Uuid],
        system: &str,
    ) -> Vec<RolloutTask> {
        rows.iter()
            .zip(ids)
            .map(|(t, id)| RolloutTask {
                task_id: *id,
                key: task_key(&t.source, &t.external_id),
                system: system.to_string(),
                user: crate::infra::prompts::user_message(&t.query, t.format),
            })
            .collect()
    }
}

/// Where the trajectory belongs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RolloutSlot {
    pub run_id: Uuid,
    pub step: i32,
    pub sample_index: i32,
    pub policy_version: i32,
}

pub use crate::domain::rollout::{ExecutedCall, Rollout};

#[derive(Debug, Clone)]
struct Piece {
    kind: SegmentKind,
    ids: Vec<u32>,
    logprobs: Option<Vec<f32>>,
    text: String,
}

/// The growing trajectory: the token context sent to the server, the pieces in order, and the
/// length of the text the scaffold parser sees (model and injected text; tool outputs excluded).
struct Transcript {
    context: Vec<u32>,
    pieces: Vec<Piece>,
    parse_len: usize,
}

impl Transcript {
    /// Append a piece; returns its start offset in the parsed text.
    fn push(&mut self, p: Piece) -> usize {
        let start = self.parse_len;
        self.context.extend_from_slice(&p.ids);
        if p.kind != SegmentKind::ToolOutput {
            self.parse_len += p.text.len();
        }
        self.pieces.push(p);
        start
    }

    /// Whether the model or an injection has opened the answer.
    fn answer_opened(&self) -> bool {
        self.pieces
            .iter()
            .any(|p| p.kind != SegmentKind::ToolOutput && p.text.contains("<answer>"))
    }

    /// Cut the loop `rule` stopped the last model piece on (its `min_count` copies) from the
    /// piece and the context; the piece's text is decoded again from the tokens kept. Returns
    /// the tokens cut (0 when the piece does not end in such a loop).
    fn cut_loop(
        &mut self,
        rule: &crate::domain::config::RepetitionDetection,
        codec: &dyn TokenCodec,
    ) -> Result<usize, CodecError> {
        let Some(last) = self.pieces.last_mut() else {
            return Ok(0);
        };
        if last.kind != SegmentKind::Model {
            return Ok(0);
        }
        let Some(n) = rule.loop_len(&last.ids) else {
            return Ok(0);
        };
        let keep = last.ids.len() - n;
        last.ids.truncate(keep);
        if let Some(l) = last.logprobs.as_mut() {
            l.truncate(keep);
        }
        let text = codec.decode(&last.ids)?;
        self.parse_len = self.parse_len - last.text.len() + text.len();
        last.text = text;
        self.context.truncate(self.context.len() - n);
        Ok(n)
    }
}

/// What a finished transcript leaves for [`RolloutCtx::finish`].
struct Ended {
    id: Uuid,
    started: Instant,
    prompt_ids: Vec<u32>,
    pieces: Vec<Piece>,
    calls: Vec<ToolResult>,
    /// Model-text offsets of the executed calls.
    call_offsets: Vec<usize>,
    server: String,
    reason: &'static str,
    turns: u32,
    loop_cut: usize,
    gen_ms: u128,
    tool_ms: u128,
    error: Option<String>,
}

/// Everything a rollout needs.
#[derive(Clone)]
pub struct RolloutCtx {
    pub client: LlmClient,
    pub codec: Arc<dyn TokenCodec>,
    pub tools: Arc<ToolRunner>,
    /// Budgets and sampling, as the experiment's `[rollout]` table (evaluation may override
    /// the temperature).
    pub cfg: RolloutConfig,
    /// Sampling seed material (the experiment seed); `None`: unseeded sampling. A trajectory's
    /// seed mixes it with the task's key (`RolloutTask::key`: its source and external id, not
    /// the database id) and the slot's step and sample, so the same experiment draws the same
    /// samples in any database.
    pub seed: Option<u64>,
    /// The scaffold the policy was prompted with (`data.scaffold`): the finished trajectory is
    /// parsed by its rules (a DR Tulu trajectory needs no plan).
    pub scaffold: Scaffold,
}

impl std::fmt::Debug for RolloutCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RolloutCtx")
            .field("cfg", &self.cfg)
            .field("seed", &self.seed)
            .field("scaffold", &self.scaffold)
            .finish_non_exhaustive()
    }
}

enum Turn {
    Answered,
    Tool,
    Stopped,
    Length,
    Looped,
}

impl RolloutCtx {
    async fn generate(
        &self,
        session: &str,
        context: &[u32],
        max_tokens: u32,
        seed: Option<u64>,
    ) -> Result<(Piece, FinishReason, String), LlmError> {
        let mut req =
            CompletionRequest::new(self.client.model(), context.to_vec(), max_tokens.max(1));
        req.temperature = self.cfg.temperature;
        req.top_p = self.cfg.top_p;
        // One seed per (trajectory, turn): the n samples of a group must differ, and a rerun of
        // the same step must reproduce them.
        req.seed = seed.map(|s| mix_seed(s, context.len() as u64));
        req.stop = STOPS.iter().map(|s| s.to_string()).collect();
        req.repetition_detection = self.cfg.repetition_detection;
        let (comp, _timing) = self.client.complete(session, &req).await?;
        let endpoint = comp.endpoint.clone();
        let choice = comp
            .choices
            .into_iter()
            .next()
            .ok_or_else(|| LlmError::InvalidBody {
                endpoint: endpoint.clone(),
                reason: "no choice".into(),
                excerpt: String::new(),
            })?;
        Ok((
            Piece {
                kind: SegmentKind::Model,
                ids: choice.token_ids,
                logprobs: Some(choice.logprobs),
                text: choice.text,
            },
            choice.finish_reason,
            endpoint,
        ))
    }

    fn inject(&self, text: &str) -> Result<Piece, CodecError> {
        Ok(Piece {
            kind: SegmentKind::Injected,
            ids: self.codec.encode(text)?,
            logprobs: None,
            text: text.to_string(),
        })
    }

    /// Run one trajectory to the end. Policy-server failures end it with finish reason `error`
    /// (what was generated is kept and returned); only codec failures are errors.
    pub async fn run(
        &self,
        task: &RolloutTask,
        slot: RolloutSlot,
    ) -> Result<Rollout, RolloutError> {
        let started = Instant::now();
        let id = Uuid::now_v7();
        let session = id.to_string();
        let traj_seed = self.seed.map(|s| {
            let slot_key = ((slot.step as u64) << 32) | slot.sample_index as u32 as u64;
            mix_seed(mix_seed(s, task.key), slot_key)
        });
        let prompt_text = self.codec.render_prompt(&task.system, &task.user)?;
        let prompt_ids = self.codec.encode(&prompt_text)?;
        let mut tr = Transcript {
            context: prompt_ids.clone(),
            pieces: Vec::new(),
            parse_len: 0,
        };
        let mut calls: Vec<ToolResult> = Vec::new();
        let mut call_offsets: Vec<usize> = Vec::new(); // model-text offsets of executed calls
        let mut server = String::new();
        let mut error = None;
        let mut turns = 0u32;
        let mut gen_ms = 0u128;
        let mut tool_ms = 0u128;
        let budget = self.cfg.max_tokens;
        let normal_budget = budget
            .saturating_sub(self.cfg.forced_answer_budget())
            .max(1);
        let mut forced = false;
        let mut loop_cut = 0usize; // tokens of a stopped loop cut before a forced answer
        let mut reason = finish::LENGTH;
        let too_long = self
            .cfg
            .max_prompt_tokens
            .is_some_and(|m| prompt_ids.len() > m as usize);
        if too_long {
            reason = finish::PROMPT_TOO_LONG;
        }

        // A prompt over the limit generates nothing (checked once, before the first turn).
        loop {
            if too_long {
                break;
            }
            let used = (tr.context.len() - prompt_ids.len()) as u32;
            let cap = if forced { budget } else { normal_budget };
            if used >= cap {
                if forced {
                    break;
                }
                // Normal budget exhausted: force the answer with the reserve.
                forced = true;
                tr.push(self.inject("\n<answer>\n")?);
                continue;
            }
            let t0 = Instant::now();
            let (piece, fr, endpoint) = match self
                .generate(&session, &tr.context, cap - used, traj_seed)
                .await
            {
                Ok(x) => x,
                Err(e) => {
                    error = Some(e.to_string());
                    reason = finish::ERROR;
                    break;
                }
            };
            gen_ms += t0.elapsed().as_millis();
            // A server that returns more than asked must not break the budget.
            let (piece, fr) = if piece.ids.len() > (cap - used) as usize {
                let keep = (cap - used) as usize;
                let ids = piece.ids[..keep].to_vec();
                let logprobs = piece.logprobs.map(|l| l[..keep.min(l.len())].to_vec());
                let text = self.codec.decode(&ids)?;
                (
                    Piece {
                        kind: SegmentKind::Model,
                        ids,
                        logprobs,
                        text,
                    },
                    FinishReason::Length,
                )
            } else {
                (piece, fr)
            };
            turns += 1;
            server = endpoint;
            let turn_text = piece.text.clone();
            let piece_start = tr.push(piece);
            let trimmed = turn_text.trim_end();
            let kind = if trimmed.ends_with("</answer>") {
                Turn::Answered
            } else if fr == FinishReason::Stop
                && (trimmed.ends_with("</call_tool>") || trimmed.ends_with("</call>"))
            {
                Turn::Tool
            } else if fr == FinishReason::Length {
                Turn::Length
            } else if fr == FinishReason::Repetition {
                Turn::Looped
            } else {
                Turn::Stopped
            };
            match kind {
                Turn::Answered => {
                    reason = if forced {
                        finish::FORCED_ANSWER
                    } else {
                        finish::ANSWER
                    };
                    break;
                }
                Turn::Length => {
                    if forced {
                        break;
                    }
                    continue; // the budget check above forces the answer
                }
                Turn::Looped => {
                    // Before the answer, with answer_after_loop: cut the copies and force the
                    // answer. Otherwise the trajectory ends: a model looping inside its answer
                    // mostly loops again, and the attempt is what a budget cut would have made
                    // of it, less the loop.
                    if self.cfg.answer_after_loop
                        && !forced
                        && !tr.answer_opened()
                        && let Some(rule) = self.cfg.repetition_detection
                    {
                        loop_cut += tr.cut_loop(&rule, self.codec.as_ref())?;
                        forced = true;
                        tr.push(self.inject("\n<answer>\n")?);
                        continue;
                    }
                    reason = finish::REPETITION;
                    break;
                }
                Turn::Stopped => {
                    if forced {
                        break;
                    }
                    forced = true;
                    tr.push(self.inject("\n<answer>\n")?);
                }
                Turn::Tool => {
                    if forced {
                        break;
                    }
                    let parsed_turn = scaffold::parse(&turn_text, &|_| true);
                    let Some(call) = parsed_turn.tool_calls.last().cloned() else {
                        forced = true;
                        tr.push(self.inject("\n<answer>\n")?);
                        continue;
                    };
                    let output = if calls.len() as u32 >= self.cfg.max_tool_calls {
                        forced = true;
                        format!(
                            "\n<tool_output>\nError: the budget of {} tool calls is used up. Write your review and final answer now.\n</tool_output>\n",
                            self.cfg.max_tool_calls
                        )
                    } else {
                        let t1 = Instant::now();
                        let res = self.tools.run(&call.name, call.args()).await;
                        tool_ms += t1.elapsed().as_millis();
                        let text = format!("\n{}\n", res.output_text);
                        call_offsets.push(piece_start + call.span.start);
                        calls.push(res);
                        text
                    };
                    let ids = self.codec.encode(&output)?;
                    tr.push(Piece {
                        kind: SegmentKind::ToolOutput,
                        ids,
                        logprobs: None,
                        text: output,
                    });
                }
            }
        }

        self.finish(
            task,
            slot,
            Ended {
                id,
                started,
                prompt_ids,
                pieces: tr.pieces,
                calls,
                call_offsets,
                server,
                reason,
                turns,
                loop_cut,
                gen_ms,
                tool_ms,
                error,
            },
        )
    }

    /// Replay a demonstration as this task's trajectory (off-policy guidance,
    /// `credit.guidance_demos`): each turn's model text is encoded as the policy's tokens
    /// would be, and each tool call in it is executed by this context's tools, so the
    /// trajectory, its parse and its executed calls are built exactly as a sampled one's.
    /// Its model tokens carry behaviour log-prob 0, which the trainer reads as "not recorded"
    /// (no truncated importance weight; the ratio is against the step's own policy). The
    /// server is [`TEACHER`]; `parsed.guidance.tool_output_mismatch` counts the turns whose
    /// tool output differs from the one recorded in the demonstration (a different index or
    /// tool settings), or that end in no call to run (the recorded output then stands). A
    /// demonstration that does not end in `</answer>` finishes as `length`.
    pub async fn replay(
        &self,
        task: &RolloutTask,
        slot: RolloutSlot,
        demo: &crate::domain::data::demos::Demo,
    ) -> Result<Rollout, RolloutError> {
        let started = Instant::now();
        let prompt_text = self.codec.render_prompt(&task.system, &task.user)?;
        let prompt_ids = self.codec.encode(&prompt_text)?;
        let mut tr = Transcript {
            context: prompt_ids.clone(),
            pieces: Vec::new(),
            parse_len: 0,
        };
        let mut calls: Vec<ToolResult> = Vec::new();
        let mut call_offsets: Vec<usize> = Vec::new();
        let mut tool_ms = 0u128;
        let mut mismatched = 0usize;
        let mut reason = finish::LENGTH;
        for turn in &demo.turns {
            let ids = self.codec.encode(&turn.model)?;
            let text = self.codec.decode(&ids)?;
            let piece_start = tr.push(Piece {
                kind: SegmentKind::Model,
                logprobs: Some(vec![0.0; ids.len()]),
                ids,
                text: text.clone(),
            });
            let Some(recorded) = &turn.tool_output else {
                if text.trim_end().ends_with("</answer>") {
                    reason = finish::ANSWER;
                }
                break;
            };
            let parsed_turn = scaffold::parse(&text, &|_| true);
            let Some(call) = parsed_turn.tool_calls.last().cloned() else {
                // The recorded output stands: there is no call to run again.
                mismatched += 1;
                let ids = self.codec.encode(recorded)?;
                tr.push(Piece {
                    kind: SegmentKind::ToolOutput,
                    ids,
                    logprobs: None,
                    text: recorded.clone(),
                });
                continue;
            };
            let t1 = Instant::now();
            let res = self.tools.run(&call.name, call.args()).await;
            tool_ms += t1.elapsed().as_millis();
            let output = format!("\n{}\n", res.output_text);
            if &output != recorded {
                mismatched += 1;
            }
            call_offsets.push(piece_start + call.span.start);
            calls.push(res);
            let ids = self.codec.encode(&output)?;
            tr.push(Piece {
                kind: SegmentKind::ToolOutput,
                ids,
                logprobs: None,
                text: output,
            });
        }
        let mut out = self.finish(
            task,
            slot,
            Ended {
                id: Uuid::now_v7(),
                started,
                prompt_ids,
                pieces: tr.pieces,
                calls,
                call_offsets,
                server: TEACHER.to_string(),
                reason,
                turns: demo.turns.len() as u32,
                loop_cut: 0,
                gen_ms: 0,
                tool_ms,
                error: None,
            },
        )?;
        out.trajectory.parsed["guidance"] = json!({ "tool_output_mismatch": mismatched });
        Ok(out)
    }

    /// Stage spans over model + injected text (tool outputs excluded), the pieces split at
    /// them, and the trajectory with its parse and executed calls.
    fn finish(
        &self,
        task: &RolloutTask,
        slot: RolloutSlot,
        ended: Ended,
    ) -> Result<Rollout, RolloutError> {
        let Ended {
            id,
            started,
            prompt_ids,
            pieces,
            calls,
            call_offsets,
            server,
            reason,
            turns,
            loop_cut,
            gen_ms,
            tool_ms,
            error,
        } = ended;
        let parse_text: String = pieces
            .iter()
            .filter(|p| p.kind != SegmentKind::ToolOutput)
            .map(|p| p.text.as_str())
            .collect();
        let known: std::collections::HashSet<String> = calls
            .iter()
            .flat_map(|c| c.snippets.iter().map(|s| s.id.clone()))
            .collect();
        let parsed = scaffold::parse_as(self.scaffold, &parse_text, &|id| known.contains(id));
        let mut segments = Vec::new();
        let mut offset = 0usize;
        for p in &pieces {
            match p.kind {
                SegmentKind::Model => {
                    segments.extend(self.split_by_stage(
                        p,
                        offset,
                        &parsed,
                        slot.policy_version,
                    )?);
                }
                SegmentKind::ToolOutput | SegmentKind::Injected => segments.push(Segment {
                    kind: p.kind,
                    stage: None,
                    token_ids: p.ids.clone(),
                    logprobs: None,
                    text: p.text.clone(),
                    policy_version: None,
                }),
            }
            if p.kind != SegmentKind::ToolOutput {
                offset += p.text.len();
            }
        }
        let executed: Vec<ExecutedCall> = calls
            .into_iter()
            .zip(call_offsets)
            .map(|(result, off)| ExecutedCall {
                result,
                stage: parsed.stage_at(off),
            })
            .collect();
        let mut parsed_json = parsed.to_json();
        parsed_json["turns"] = json!(turns);
        if loop_cut > 0 {
            parsed_json["loop_cut_tokens"] = json!(loop_cut);
        }
        let trajectory = Trajectory {
            id,
            run_id: slot.run_id,
            step: slot.step,
            task_id: task.task_id,
            sample_index: slot.sample_index,
            policy_version: slot.policy_version,
            server,
            server_version: None,
            prompt_token_ids: prompt_ids,
            segments,
            finish_reason: reason.to_string(),
            parsed: parsed_json,
            timings: json!({
                "total_ms": started.elapsed().as_millis() as u64,
                "generate_ms": gen_ms as u64,
                "tools_ms": tool_ms as u64,
            }),
        };
        Ok(Rollout {
            trajectory,
            parsed,
            calls: executed,
            error,
        })
    }

    /// Split one model piece at the stage boundaries that fall inside it. The token at which a
    /// boundary falls is found by binary search on decoded-prefix length, so token ids are never
    /// re-tokenised: every id keeps its logprob and lands in exactly one segment.
    fn split_by_stage(
        &self,
        p: &Piece,
        start: usize,
        parsed: &Parsed,
        policy_version: i32,
    ) -> Result<Vec<Segment>, CodecError> {
        let end = start + p.text.len();
        let mut cuts: Vec<usize> = vec![0];
        for span in parsed.stage_spans.iter().skip(1) {
            let b = span.start;
            if b > start && b < end {
                let rel = b - start;
                // Smallest i such that decode(ids[..i]) reaches the boundary.
                let (mut lo, mut hi) = (0usize, p.ids.len());
                while lo < hi {
                    let mid = (lo + hi) / 2;
                    if self.codec.decode(&p.ids[..mid])?.len() >= rel {
                        hi = mid
                    } else {
                        lo = mid + 1
                    }
                }
                if lo > *cuts.last().unwrap_or(&0) && lo < p.ids.len() {
                    cuts.push(lo);
                }
            }
        }
        cuts.push(p.ids.len());
        let logprobs = p.logprobs.clone().unwrap_or_default();
        let mut out = Vec::new();
        for w in cuts.windows(2) {
            let (a, b) = (w[0], w[1]);
            if a == b {
                continue;
            }
            let prefix = if a == 0 {
                0
            } else {
                self.codec.decode(&p.ids[..a])?.len()
            };
            let stage = parsed.stage_at(start + prefix);
            let text = self.codec.decode(&p.ids[a..b])?;
            out.push(Segment {
                kind: SegmentKind::Model,
                stage: Some(stage),
                token_ids: p.ids[a..b].to_vec(),
                logprobs: Some(logprobs.get(a..b).map(<[f32]>::to_vec).unwrap_or_default()),
                text,
                policy_version: Some(policy_version),
            });
        }
        Ok(out)
    }
}
