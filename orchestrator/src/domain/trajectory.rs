//! The trajectory contract shared by rollout, judging, credit assignment, storage and the train
//! batch: prompt token ids plus ordered segments of model / tool-output / injected tokens.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The four scaffold stages, in order. Stored as smallint 0..=3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    Plan = 0,
    Research = 1,
    Review = 2,
    Answer = 3,
}

impl Stage {
    pub const ALL: [Stage; 4] = [Stage::Plan, Stage::Research, Stage::Review, Stage::Answer];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn from_index(i: i64) -> Option<Stage> {
        match i {
            0 => Some(Stage::Plan),
            1 => Some(Stage::Research),
            2 => Some(Stage::Review),
            3 => Some(Stage::Answer),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Plan => "plan",
            Stage::Research => "research",
            Stage::Review => "review",
            Stage::Answer => "answer",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentKind {
    /// Sampled by the policy: carries behaviour logprobs, a stage, and gets loss.
    Model,
    /// Tool results appended between turns: no loss, no advantage.
    ToolOutput,
    /// Text the orchestrator inserted (forced-answer nudges, bank examples): no loss.
    Injected,
}

impl SegmentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SegmentKind::Model => "model",
            SegmentKind::ToolOutput => "tool_output",
            SegmentKind::Injected => "injected",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "model" => Some(SegmentKind::Model),
            "tool_output" => Some(SegmentKind::ToolOutput),
            "injected" => Some(SegmentKind::Injected),
            _ => None,
        }
    }
}

/// A maximal run of tokens with one kind and (for model tokens) one stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub kind: SegmentKind,
    pub stage: Option<Stage>,
    pub token_ids: Vec<u32>,
    /// One behaviour logprob per token for model segments; `None` otherwise.
    pub logprobs: Option<Vec<f32>>,
    pub text: String,
    /// The policy version that sampled these tokens (model segments).
    pub policy_version: Option<i32>,
}

/// The `server` of a replayed demonstration (off-policy guidance, `credit.guidance_demos`): no
/// policy server sampled it, and its model tokens' behaviour log-probs are 0 ("not recorded").
pub const TEACHER: &str = "teacher";

/// The values of `Trajectory::finish_reason` (`trajectories.finish_reason`), written by
/// `pipeline::rollout::engine` and read wherever a finish reason decides something.
pub mod finish {
    /// The model closed `</answer>` on its own.
    pub const ANSWER: &str = "answer";
    /// It closed `</answer>` in the forced final turn.
    pub const FORCED_ANSWER: &str = "forced_answer";
    /// The token budget ran out before a closed answer (e.g. a tag never closed).
    pub const LENGTH: &str = "length";
    /// The policy server stopped a turn in a verbatim loop (`rollout.repetition_detection`);
    /// the attempt ends there, as a budget cut would have later.
    pub const REPETITION: &str = "repetition";
    /// Whether a trajectory ended without an answer because it was cut (the token budget or a
    /// loop stop): what DAPO's overlong filtering leaves out of the loss.
    pub fn is_cut(reason: &str) -> bool {
        reason == LENGTH || reason == REPETITION
    }
    /// The policy server failed after retries (what was generated is kept).
    pub const ERROR: &str = "error";
    /// The prompt alone was over `rollout.max_prompt_tokens`; nothing was generated.
    pub const PROMPT_TOO_LONG: &str = "prompt_too_long";
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    pub id: Uuid,
    pub run_id: Uuid,
    pub step: i32,
    pub task_id: Uuid,
    pub sample_index: i32,
    pub policy_version: i32,
    pub server: String,
    pub server_version: Option<String>,
    pub prompt_token_ids: Vec<u32>,
    pub segments: Vec<Segment>,
    pub finish_reason: String,
    pub parsed: serde_json::Value,
    pub timings: serde_json::Value,
}

impl Trajectory {
    pub fn num_model_tokens(&self) -> usize {
        self.segments
            .iter()
            .filter(|s| s.kind == SegmentKind::Model)
            .map(|s| s.token_ids.len())
            .sum()
    }

    pub fn num_tool_tokens(&self) -> usize {
        self.segments
            .iter()
            .filter(|s| s.kind == SegmentKind::ToolOutput)
            .map(|s| s.token_ids.len())
            .sum()
    }

    /// Check the invariants storage relies on: model segments have one logprob per token and a
    /// stage; other segments have neither.
    pub fn validate(&self) -> Result<(), String> {
        for (i, s) in self.segments.iter().enumerate() {
            match s.kind {
                SegmentKind::Model => {
                    let n = s.logprobs.as_ref().map(Vec::len);
                    if n != Some(s.token_ids.len()) {
                        return Err(format!(
                            "segment {i}: {} logprobs for {} model tokens",
                            n.unwrap_or(0),
                            s.token_ids.len()
                        ));
                    }
                }
                _ => {
                    if s.stage.is_some() {
                        return Err(format!(
                            "segment {i}: a {} segment has a stage",
                            s.kind.as_str()
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}
