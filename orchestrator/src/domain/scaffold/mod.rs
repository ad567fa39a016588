//! The four-stage scaffold (Plan, Research, Review, Answer) as the policy writes it: a tolerant
//! parser for its tags (`parse`, or `parse_as` for another scaffold's rules), stage spans over
//! model text, and the SFT rejection rules (`sft`). This module is the only user of quick-xml.

pub mod parse;
pub mod sft;

pub use parse::{
    Citation, Element, MAX_UNCLOSED_TEXT, ParseIssue, Parsed, Plan, Review, SelfRubric,
    ToolCallTag, canonical_tag, elements, extract_boxed, normalize_tool_name, parse, parse_as,
    parse_self_rubric,
};

use serde::{Deserialize, Serialize};

/// Which agent scaffold the policy runs; baselines run on the same engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scaffold {
    /// Plan, Research, Review, Answer with self-rubrics (default).
    #[default]
    Rubricem,
    /// DR Tulu's think / call_tool / answer / cite grammar.
    Drtulu,
    /// Plain ReAct.
    React,
}

impl Scaffold {
    /// Whether the scaffold's prompt asks for a `<structured_plan>`: only RubricEM's does, so
    /// only a RubricEM trajectory without one is malformed (DR Tulu's and ReAct's prompts ask
    /// for think / call_tool / answer / cite only, method.md B.1).
    pub fn requires_plan(self) -> bool {
        self == Scaffold::Rubricem
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Scaffold::Rubricem => "rubricem",
            Scaffold::Drtulu => "drtulu",
            Scaffold::React => "react",
        }
    }
}

impl std::str::FromStr for Scaffold {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "rubricem" => Ok(Scaffold::Rubricem),
            "drtulu" => Ok(Scaffold::Drtulu),
            "react" => Ok(Scaffold::React),
            _ => Err(format!("{s:?}; allowed: rubricem, drtulu, react")),
        }
    }
}

impl std::fmt::Display for Scaffold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The response-format suffix appended to the user query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AnswerFormat {
    Exact,
    Short,
    Long,
}

impl AnswerFormat {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "exact" | "exact_answer" => Some(Self::Exact),
            "short" | "short_form" => Some(Self::Short),
            "long" | "long_form" => Some(Self::Long),
            _ => None,
        }
    }
}

/// How a tool is advertised to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// Free text listing accepted attributes, e.g. `limit, year (2019-2024), fieldsOfStudy`.
    #[serde(default)]
    pub attributes: String,
}
