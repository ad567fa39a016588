//! The four-stage scaffold (Plan, Research, Review, Answer) as the policy writes it: a tolerant
//! parser for its tags (`parse`), stage spans over model text, and the SFT rejection rules
//! (`sft`). This module is the only user of quick-xml.

pub mod parse;
pub mod sft;

pub use parse::{
    Citation, Element, ParseIssue, Parsed, Plan, Review, SelfRubric, ToolCallTag, canonical_tag,
    extract_boxed, normalize_tool_name, parse, parse_self_rubric,
};
