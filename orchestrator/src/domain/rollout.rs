//! A finished rollout as the stages exchange it: the trajectory, what the scaffold parser made of
//! its text, and the tool calls it executed with their stages. Produced by `pipeline::rollout`,
//! stored by `infra::db::rollouts`.

use crate::domain::scaffold::Parsed;
use crate::domain::tool::ToolResult;
use crate::domain::trajectory::{Stage, Trajectory};

/// A tool call as executed, with its stage.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutedCall {
    pub result: ToolResult,
    pub stage: Stage,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rollout {
    pub trajectory: Trajectory,
    pub parsed: Parsed,
    pub calls: Vec<ExecutedCall>,
    /// The policy-server error that ended the rollout early, if any.
    pub error: Option<String>,
}
