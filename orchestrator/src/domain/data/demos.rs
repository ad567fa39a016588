//! Demonstration files for off-policy guidance (`credit.guidance_demos`): the SFT rows that
//! `orchestrator sft-data` writes (`{"id", "messages", "segments": [{"kind", "text"}]}`), read
//! back as one demonstration per task id. A demonstration is its turns: the model text of each
//! turn (ending in a tool call, the last in the answer) and the tool output that followed it.
//! Rows whose id carries a `#` (the reflection rows `sft-data` derives from a task's row) are
//! not demonstrations of a task and are skipped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::tasks::TaskError;

/// One turn of a demonstration.
#[derive(Debug, Clone, PartialEq)]
pub struct DemoTurn {
    /// What the policy would have written in this turn.
    pub model: String,
    /// The tool output the teacher saw after it, as recorded (`None` after the last turn).
    pub tool_output: Option<String>,
}

/// One task's demonstration, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Demo {
    pub turns: Vec<DemoTurn>,
}

#[derive(Deserialize)]
struct Row {
    id: String,
    segments: Vec<RowSegment>,
}

#[derive(Deserialize)]
struct RowSegment {
    kind: String,
    text: String,
}

/// The turns of one row's segments: consecutive model segments join into one turn; a
/// `tool_output` segment closes the turn before it. Refused (the message names the segment):
/// an unknown kind, a tool output with no model text before it, a row without model text, and
/// a last turn followed by a tool output (a demonstration ends in its answer).
fn turns(segments: &[RowSegment]) -> Result<Vec<DemoTurn>, String> {
    let mut out: Vec<DemoTurn> = Vec::new();
    let mut open = String::new();
    for (i, s) in segments.iter().enumerate() {
        match s.kind.as_str() {
            "model" => open.push_str(&s.text),
            "tool_output" => {
                if open.is_empty() {
                    return Err(format!(
                        "segment {i}: a tool output with no model text before it"
                    ));
                }
                out.push(DemoTurn {
                    model: std::mem::take(&mut open),
                    tool_output: Some(s.text.clone()),
                });
            }
            other => {
                return Err(format!(
                    "segment {i}: kind `{other}`; allowed: model, tool_output"
                ));
            }
        }
    }
    if open.is_empty() {
        return Err(if out.is_empty() {
            "no model text".into()
        } else {
            "the last segment is a tool output; a demonstration ends in its answer".into()
        });
    }
    out.push(DemoTurn {
        model: open,
        tool_output: None,
    });
    Ok(out)
}

/// Read a demonstration file into task id -> demonstration; the error names the line. A task id
/// given twice is refused (which one would guide is then a guess).
pub fn load(path: &Path) -> Result<HashMap<String, Demo>, TaskError> {
    let text = std::fs::read_to_string(path).map_err(|e| TaskError::Read {
        path: path.into(),
        message: e.to_string(),
    })?;
    parse(&text, path)
}

fn parse(text: &str, path: &Path) -> Result<HashMap<String, Demo>, TaskError> {
    let err = |line: usize, message: String| TaskError::Row {
        path: PathBuf::from(path),
        line,
        message,
    };
    let mut out = HashMap::new();
    for (line, row) in crate::domain::jsonl::rows::<Row>(text) {
        let row = row.map_err(|e| err(line, e.to_string()))?;
        if row.id.contains('#') {
            continue;
        }
        let turns = turns(&row.segments).map_err(|m| err(line, format!("`{}`: {m}", row.id)))?;
        if out.insert(row.id.clone(), Demo { turns }).is_some() {
            return Err(err(
                line,
                format!("task id `{}` has a demonstration already", row.id),
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("demos.jsonl")
    }

    #[test]
    fn rows_become_turns_and_reflection_rows_are_skipped() {
        let text = r#"{"id":"t1","messages":[],"segments":[{"kind":"model","text":"<plan>x</plan><call_tool name=\"s\">q</call_tool>"},{"kind":"tool_output","text":"\n<tool_output>a</tool_output>\n"},{"kind":"model","text":"<review>r</review>"},{"kind":"model","text":"<answer>y</answer>"}]}
{"id":"t1#reflect","messages":[],"segments":[{"kind":"model","text":"z"}]}
"#;
        let d = parse(text, p()).unwrap();
        assert_eq!(d.len(), 1);
        let t = &d["t1"].turns;
        assert_eq!(t.len(), 2);
        assert!(t[0].model.ends_with("</call_tool>"));
        assert_eq!(
            t[0].tool_output.as_deref(),
            Some("\n<tool_output>a</tool_output>\n")
        );
        assert_eq!(t[1].model, "<review>r</review><answer>y</answer>");
        assert_eq!(t[1].tool_output, None);
    }

    #[test]
    fn malformed_rows_are_refused_with_their_line() {
        for (text, want) in [
            (
                r#"{"id":"a","segments":[{"kind":"tool_output","text":"o"}]}"#,
                "line 1: `a`: segment 0: a tool output with no model text before it",
            ),
            (
                r#"{"id":"a","segments":[{"kind":"injected","text":"o"}]}"#,
                "kind `injected`; allowed: model, tool_output",
            ),
            (
                r#"{"id":"a","segments":[{"kind":"model","text":"m"},{"kind":"tool_output","text":"o"}]}"#,
                "ends in its answer",
            ),
            (r#"{"id":"a","segments":[]}"#, "no model text"),
            (
                "{\"id\":\"a\",\"segments\":[{\"kind\":\"model\",\"text\":\"m\"}]}\n{\"id\":\"a\",\"segments\":[{\"kind\":\"model\",\"text\":\"m\"}]}",
                "line 2: task id `a` has a demonstration already",
            ),
            (r#"{"segments":[]}"#, "line 1"),
        ] {
            let e = parse(text, p()).unwrap_err().to_string();
            assert!(e.contains(want), "{e} lacks {want}");
        }
    }
}
