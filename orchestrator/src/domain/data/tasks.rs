//! Task files. One JSON object per line, in either of two shapes:
//!
//! - ours: `{"id", "query" | "prompt", "answer_format": "exact"|"short"|"long", "answer"?,
//!   "rubrics"?: [{"title", "description", "weight", "key_terms"?, "evidence"?}], ...}` — the
//!   research world writes this shape;
//! - DR Tulu RL rows: `{"messages": [{"role": "user", "content": …}], "ground_truth": "<JSON
//!   string or object with rubrics>", "question_type"?, "source"?}`.
//!
//! Unknown extra fields are kept in `metadata`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::domain::scaffold::AnswerFormat;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RubricSpec {
    #[serde(default)]
    pub title: String,
    pub description: String,
    #[serde(default = "one")]
    pub weight: f32,
    #[serde(default)]
    pub key_terms: Vec<String>,
    #[serde(default)]
    pub evidence: Vec<String>,
}

fn one() -> f32 {
    1.0
}

#[derive(Debug, Clone, PartialEq)]
pub struct TaskRow {
    pub source: String,
    pub external_id: String,
    pub query: String,
    pub format: AnswerFormat,
    pub answer: Option<String>,
    pub rubrics: Vec<RubricSpec>,
    pub metadata: serde_json::Value,
}

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("cannot read {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{path} line {line}: {message}")]
    Row {
        path: PathBuf,
        line: usize,
        message: String,
    },
}

fn str_field<'a>(v: &'a serde_json::Value, keys: &[&str]) -> Option<&'a str> {
    keys.iter().find_map(|k| v.get(*k).and_then(|x| x.as_str()))
}

/// Parse one line (either shape).
pub fn parse_row(v: &serde_json::Value, default_source: &str) -> Result<TaskRow, String> {
    if !v.is_object() {
        return Err("expected a JSON object".into());
    }
    let drtulu = v.get("messages").is_some();
    let query = if drtulu {
        v["messages"]
            .as_array()
            .and_then(|m| m.iter().rev().find(|x| x["role"] == "user"))
            .and_then(|x| x["content"].as_str())
            .ok_or("`messages` has no user message with string content")?
            .to_string()
    } else {
        str_field(v, &["query", "prompt", "question"])
            .ok_or("missing `query` (or `prompt`/`question`)")?
            .to_string()
    };
    if query.trim().is_empty() {
        return Err("empty query".into());
    }
    let fmt_raw = str_field(v, &["answer_format", "question_type"]).unwrap_or("long");
    let format = AnswerFormat::parse(fmt_raw)
        .ok_or_else(|| format!("answer_format `{fmt_raw}` is not one of exact, short, long"))?;
    let rubric_value = if drtulu {
        match v.get("ground_truth") {
            Some(serde_json::Value::String(s)) => serde_json::from_str::<serde_json::Value>(s)
                .map_err(|e| format!("ground_truth is not JSON: {e}"))?
                .get("rubrics")
                .cloned(),
            Some(obj) => obj.get("rubrics").cloned(),
            None => None,
        }
    } else {
        v.get("rubrics").cloned()
    };
    let rubrics: Vec<RubricSpec> = match rubric_value {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(r) => serde_json::from_value(r).map_err(|e| format!("rubrics: {e}"))?,
    };
    let external_id = str_field(v, &["id", "_id", "example_id"])
        .map(str::to_string)
        .unwrap_or_else(|| crate::domain::util::sha256_hex(query.as_bytes())[..16].to_string());
    let answer = str_field(v, &["answer"]).map(str::to_string);
    let source = str_field(v, &["source"])
        .unwrap_or(default_source)
        .to_string();
    let mut metadata = v.clone();
    if let Some(m) = metadata.as_object_mut() {
        for k in [
            "messages",
            "ground_truth",
            "rubrics",
            "query",
            "prompt",
            "question",
        ] {
            m.remove(k);
        }
    }
    Ok(TaskRow {
        source,
        external_id,
        query,
        format,
        answer,
        rubrics,
        metadata,
    })
}

/// Read a task file; the error names the line and what is wrong with it.
pub fn load(path: &Path) -> Result<Vec<TaskRow>, TaskError> {
    let text = std::fs::read_to_string(path).map_err(|e| TaskError::Read {
        path: path.into(),
        message: e.to_string(),
    })?;
    let source = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("tasks")
        .to_string();
    let mut out = Vec::new();
    for (line, value) in crate::domain::jsonl::rows::<serde_json::Value>(&text) {
        let row = value
            .map_err(|e| e.to_string())
            .and_then(|v| parse_row(&v, &source))
            .map_err(|message| TaskError::Row {
                path: path.into(),
                line,
                message,
            })?;
        out.push(row);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_shape_and_world_tasks() {
        let w = crate::domain::data::world::generate(2, 60, 3);
        for t in &w.tasks {
            let v = serde_json::to_value(t).unwrap_or_default();
            let row = parse_row(&v, "world").unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(row.query, t.query);
            assert_eq!(row.rubrics.len(), t.rubrics.len());
            assert_eq!(row.rubrics[0].evidence, t.rubrics[0].evidence);
            assert_eq!(row.answer.as_deref(), Some(t.answer.as_str()));
            assert_eq!(row.external_id, t.id);
        }
    }

    #[test]
    fn drtulu_rows() {
        let v = serde_json::json!({
            "source": "sqa", "question_type": "long_form", "dataset": "general_rubric",
            "messages": [{"role": "user", "content": "What is X?"}],
            "ground_truth": "{\"query\": \"What is X?\", \"rubrics\": [{\"description\": \"Cites a primary source\", \"title\": \"Citation\", \"weight\": 3}]}"
        });
        let row = parse_row(&v, "f").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(row.query, "What is X?");
        assert_eq!(row.format, AnswerFormat::Long);
        assert_eq!(row.rubrics[0].weight, 3.0);
        assert_eq!(row.source, "sqa");
        assert_eq!(row.metadata["dataset"], "general_rubric");
        assert_eq!(
            row.external_id.len(),
            16,
            "content-derived id when none is given"
        );
    }

    #[test]
    fn bad_rows_are_named() {
        for (v, want) in [
            (
                serde_json::json!({"answer_format": "long"}),
                "missing `query`",
            ),
            (
                serde_json::json!({"query": "q", "answer_format": "essay"}),
                "essay",
            ),
            (
                serde_json::json!({"messages": [{"role": "system", "content": "s"}]}),
                "no user message",
            ),
            (
                serde_json::json!({"messages": [{"role": "user", "content": "q"}], "ground_truth": "{broken"}),
                "not JSON",
            ),
            (
                serde_json::json!({"query": "q", "rubrics": [{"title": "no description"}]}),
                "rubrics",
            ),
        ] {
            let e = parse_row(&v, "f").unwrap_err();
            assert!(e.contains(want), "{e} should mention {want}");
        }
    }
}
