//! The SFT rejection rules of method.md A.3 over a multi-round teacher trajectory, and its
//! post-processing (`<scratchpad>` to `<think>`, tool-name normalisation).

use serde::{Deserialize, Serialize};

use super::parse::{ParseIssue, normalize_tool_name, parse};

/// One round of a teacher trajectory: its model text and whether the tool backend failed on the
/// call that ended it.
#[derive(Debug, Clone, PartialEq)]
pub struct Round<'a> {
    pub text: &'a str,
    pub tool_error: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum Rejection {
    /// The final round has no closed `</answer>`.
    NoAnswer,
    /// A non-final round, or round 1 (which may never answer), does not end in a parseable
    /// tool call (name and query).
    MissingToolCall { round: usize },
    /// Round 1 lacks `<structured_plan>` with `<deep_analysis>` and `<rubric>`.
    MissingPlan { missing: Vec<String> },
    /// A later round lacks `<state_evaluation>`.
    MissingStateEvaluation { round: usize },
    /// Unclosed or stray tags.
    Malformed {
        round: usize,
        issues: Vec<ParseIssue>,
    },
    /// Two or more consecutive rounds whose tool call failed in the backend.
    ConsecutiveToolErrors { from_round: usize },
}

impl Rejection {
    /// The rule's name, as its serialised `rule` tag (the key rejections are counted under).
    pub fn name(&self) -> &'static str {
        match self {
            Rejection::NoAnswer => "no_answer",
            Rejection::MissingToolCall { .. } => "missing_tool_call",
            Rejection::MissingPlan { .. } => "missing_plan",
            Rejection::MissingStateEvaluation { .. } => "missing_state_evaluation",
            Rejection::Malformed { .. } => "malformed",
            Rejection::ConsecutiveToolErrors { .. } => "consecutive_tool_errors",
        }
    }
}

/// Every rule the trajectory breaks; empty means keep it.
pub fn check(rounds: &[Round<'_>]) -> Vec<Rejection> {
    let mut out = Vec::new();
    let Some(last) = rounds.len().checked_sub(1) else {
        return vec![Rejection::NoAnswer];
    };
    for (k, r) in rounds.iter().enumerate() {
        let p = parse(r.text, &|_| true);
        if !p.issues.is_empty() {
            out.push(Rejection::Malformed {
                round: k,
                issues: p.issues.clone(),
            });
        }
        // Round 1 must end in a call even when it is the only round: its prompt forbids an
        // answer, so a one-round trajectory answered from memory.
        if k < last || k == 0 {
            let ok = p
                .tool_calls
                .last()
                .is_some_and(|t| t.closed && !t.name.is_empty() && !t.query.is_empty());
            if !ok || p.answer.is_some() {
                out.push(Rejection::MissingToolCall { round: k });
            }
        } else if !(p.answer.is_some() && p.answer_closed) {
            out.push(Rejection::NoAnswer);
        }
        if k == 0 {
            let plan = p.plan.as_ref();
            let mut missing = Vec::new();
            if plan.is_none() {
                missing.push("structured_plan".to_string());
            }
            if plan
                .and_then(|pl| pl.deep_analysis.as_ref())
                .is_none_or(|s| s.is_empty())
            {
                missing.push("deep_analysis".to_string());
            }
            if plan
                .and_then(|pl| pl.rubric.as_ref())
                .is_none_or(|r| r.raw.is_empty())
            {
                missing.push("rubric".to_string());
            }
            if !missing.is_empty() {
                out.push(Rejection::MissingPlan { missing });
            }
        } else if p.state_evaluations.is_empty() {
            out.push(Rejection::MissingStateEvaluation { round: k });
        }
    }
    if let Some(w) = rounds
        .windows(2)
        .position(|w| w[0].tool_error && w[1].tool_error)
    {
        out.push(Rejection::ConsecutiveToolErrors { from_round: w });
    }
    out
}

/// Teacher post-processing: `<scratchpad>` becomes `<think>`, and `call_tool` names are
/// normalised (`google_web_search` -> `google_search`, `Scholar_Search` -> `snippet_search`).
pub fn postprocess(text: &str) -> String {
    let text = text
        .replace("<scratchpad>", "<think>")
        .replace("</scratchpad>", "</think>");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(i) = rest.find("<call_tool") {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let Some(end) = tail.find('>') else {
            out.push_str(tail);
            rest = "";
            break;
        };
        let tag = &tail[..=end];
        out.push_str(&rewrite_name(tag));
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    out
}

fn rewrite_name(tag: &str) -> String {
    for q in ['"', '\''] {
        let key = format!("name={q}");
        if let Some(s) = tag.find(&key) {
            let vs = s + key.len();
            if let Some(len) = tag[vs..].find(q) {
                let name = &tag[vs..vs + len];
                return format!(
                    "{}{}{}",
                    &tag[..vs],
                    normalize_tool_name(name),
                    &tag[vs + len..]
                );
            }
        }
    }
    tag.to_string()
}
