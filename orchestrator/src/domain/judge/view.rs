//! What a judge reads of a trajectory: the text of each stage (model text with the tool outputs
//! it received), the final answer, the snippets it retrieved, and its tool-call count.

use std::collections::HashMap;

use crate::domain::trajectory::{SegmentKind, Stage, Trajectory};

/// A trajectory as the judge sees it. Built once per trajectory and shared by every call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TraceView {
    /// Per stage: the model's text in that stage, with each tool output placed after the call
    /// that produced it (tool outputs belong to the stage of the turn before them).
    pub stage_text: [String; 4],
    /// The text inside `<answer>` (with its `<cite>` tags), if the model answered.
    pub answer: Option<String>,
    /// The `<answer>` was opened but never closed (the budget cut it).
    pub answer_unclosed: bool,
    /// Snippets the trajectory retrieved, by id.
    pub snippets: HashMap<String, String>,
    /// Tool calls the model made before answering.
    pub tool_calls: u32,
}

impl TraceView {
    /// Build from a stored trajectory; `parsed` is the scaffold parse stored with it.
    pub fn from_trajectory(t: &Trajectory) -> Self {
        let mut v = TraceView::default();
        let mut stage = Stage::Plan;
        for s in &t.segments {
            if let Some(st) = s.stage {
                stage = st;
            }
            if s.kind == SegmentKind::ToolOutput {
                v.snippets.extend(parse_snippets(&s.text));
            }
            v.stage_text[stage.index()].push_str(&s.text);
        }
        v.answer = t
            .parsed
            .get("answer")
            .and_then(|a| a.as_str())
            .map(str::to_string);
        v.answer_unclosed = t.parsed.get("answer_closed").and_then(|c| c.as_bool()) == Some(false);
        v.tool_calls = t
            .parsed
            .get("tool_calls")
            .and_then(|c| c.as_array())
            .map_or(0, |c| c.len() as u32);
        v
    }

    /// The answer as DR Tulu's reward code extracts it: a closed `<answer>…</answer>` only
    /// (drtulu.md 2.4); `None` means rubric and citation rewards are 0 without a judge call.
    pub fn extracted_answer(&self) -> Option<&str> {
        self.answer.as_deref().filter(|_| !self.answer_unclosed)
    }

    /// The text a rubric of `stage` is judged on in `mode`.
    pub fn text_for(&self, stage: Stage, mode: super::ScoreMode) -> &str {
        match mode {
            super::ScoreMode::AnswerOnly => self.answer.as_deref().unwrap_or(""),
            super::ScoreMode::Stagewise => &self.stage_text[stage.index()],
        }
    }

    /// The stage texts with headers, each cut to at most `max_chars` (head and tail kept).
    pub fn render(&self, max_chars: usize) -> String {
        let mut s = String::new();
        for st in Stage::ALL {
            s.push_str(&format!("### Stage {} ({})\n", st.index() + 1, st.as_str()));
            let t = self.stage_text[st.index()].trim();
            if t.is_empty() {
                s.push_str("(empty)\n\n");
            } else {
                s.push_str(&clip_middle(t, max_chars));
                s.push_str("\n\n");
            }
        }
        s
    }
}

/// Keep the head and tail of `text` within `max` bytes (on char boundaries), marking the cut.
pub fn clip_middle(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let half = max / 2;
    let mut a = half;
    while !text.is_char_boundary(a) {
        a -= 1;
    }
    let mut b = text.len() - half;
    while !text.is_char_boundary(b) {
        b += 1;
    }
    format!(
        "{}\n[... {} bytes omitted ...]\n{}",
        &text[..a],
        b - a,
        &text[b..]
    )
}

/// `<snippet id=X>…</snippet>` blocks of a tool output (the runner's format), id to body.
pub fn parse_snippets(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("<snippet id=") {
        let after = &rest[open + "<snippet id=".len()..];
        let Some(gt) = after.find('>') else { break };
        let id = after[..gt].trim().trim_matches(|c| c == '"' || c == '\'');
        let body_start = &after[gt + 1..];
        let end = body_start.find("</snippet>").unwrap_or(body_start.len());
        if !id.is_empty() {
            out.push((id.to_string(), body_start[..end].trim().to_string()));
        }
        rest = &body_start[end..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snippets_are_parsed_from_runner_output() {
        let sn = crate::domain::tool::Snippet {
            id: "S1".into(),
            title: "T".into(),
            url: None,
            text: "body text".into(),
        };
        let out = crate::domain::tool::format_output(&[sn], None);
        let got = parse_snippets(&out);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "S1");
        assert!(got[0].1.contains("body text"));
    }

    #[test]
    fn clip_keeps_head_and_tail_on_char_boundaries() {
        let t = "é".repeat(100);
        let c = clip_middle(&t, 51);
        assert!(c.starts_with('é') && c.ends_with('é') && c.contains("omitted"));
        assert_eq!(clip_middle("short", 10), "short");
    }
}
