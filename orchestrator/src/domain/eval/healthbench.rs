//! HealthBench-style points rubrics: `Points: N, Item: text` lines (negative points are
//! penalties), scored as `Σ points·met / Σ positive points`, clipped to [0, 1] — the same rule
//! as DR Tulu's rubric score (`judge::score::points_score`). Rows are the chat-format rubric
//! writer data in ../shared/data/healthbench_rubrics.

use std::path::Path;

use uuid::Uuid;

use crate::domain::judge::{Origin, Rubric};
use crate::domain::trajectory::Stage;

#[derive(Debug, Clone, PartialEq)]
pub struct PointsItem {
    pub points: f64,
    pub item: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PointsRow {
    pub id: String,
    /// The last user message (the question the rubric grades).
    pub question: String,
    pub items: Vec<PointsItem>,
}

#[derive(Debug, thiserror::Error)]
pub enum PointsError {
    #[error("cannot read {path}: {message}")]
    Read { path: String, message: String },
    #[error("{path} line {line}: {message}")]
    Row {
        path: String,
        line: usize,
        message: String,
    },
}

/// Parse `Points: N, Item: text` lines; blank lines are skipped, anything else is an error
/// naming the line.
pub fn parse_points(text: &str) -> Result<Vec<PointsItem>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() {
            continue;
        }
        let bad = || {
            format!(
                "rubric line {}: expected `Points: N, Item: text`, got {l:?}",
                i + 1
            )
        };
        let rest = l.strip_prefix("Points:").ok_or_else(bad)?;
        let (num, item) = rest.split_once(',').ok_or_else(bad)?;
        let points: f64 = num.trim().parse().map_err(|_| bad())?;
        let item = item
            .trim()
            .strip_prefix("Item:")
            .ok_or_else(bad)?
            .trim()
            .to_string();
        if item.is_empty() || !points.is_finite() {
            return Err(bad());
        }
        out.push(PointsItem { points, item });
    }
    Ok(out)
}

/// Load a chat-format JSONL of rubric rows (`messages` with the rubric as the last assistant
/// message).
pub fn load(path: &Path) -> Result<Vec<PointsRow>, PointsError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| PointsError::Read {
        path: p.clone(),
        message: e.to_string(),
    })?;
    let mut rows = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let err = |message: String| PointsError::Row {
            path: p.clone(),
            line: i + 1,
            message,
        };
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| err(e.to_string()))?;
        let msgs = v["messages"]
            .as_array()
            .ok_or_else(|| err("missing `messages`".into()))?;
        let last = |role: &str| {
            msgs.iter()
                .rev()
                .find(|m| m["role"] == role)
                .and_then(|m| m["content"].as_str())
        };
        let rubric = last("assistant").ok_or_else(|| err("no assistant message".into()))?;
        rows.push(PointsRow {
            id: v["prompt_id"].as_str().unwrap_or_default().to_string(),
            question: last("user").unwrap_or_default().to_string(),
            items: parse_points(rubric).map_err(err)?,
        });
    }
    Ok(rows)
}

/// The items as Answer-stage dataset rubrics: negative points make negative rubrics; the weight
/// is the magnitude of the points.
pub fn to_rubrics(items: &[PointsItem]) -> Vec<Rubric> {
    items
        .iter()
        .map(|it| Rubric {
            id: Uuid::now_v7(),
            stage: Stage::Answer,
            title: String::new(),
            description: it.item.clone(),
            weight: it.points.abs() as f32,
            negative: it.points < 0.0,
            key_terms: vec![],
            origin: Origin::Dataset,
        })
        .collect()
}

/// HealthBench score from per-item "met" values in [0, 1] (a judge's 0/1/2 maps to 0, 0.5, 1).
pub fn score(items: &[PointsItem], met: &[f64]) -> f64 {
    let pairs: Vec<(f64, f64)> = items.iter().zip(met).map(|(i, m)| (i.points, *m)).collect();
    crate::domain::judge::score::points_score(&pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_names_bad_lines() {
        let items =
            parse_points("Points: 5, Item: a, with comma\n\nPoints: -2.5, Item: b").unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].item, "a, with comma");
        assert_eq!(items[1].points, -2.5);
        let e = parse_points("Points: x, Item: a").unwrap_err();
        assert!(e.contains("rubric line 1"), "{e}");
    }

    #[test]
    fn penalties_and_clipping() {
        let items =
            parse_points("Points: 6, Item: a\nPoints: 4, Item: b\nPoints: -5, Item: c").unwrap();
        assert_eq!(score(&items, &[1.0, 1.0, 0.0]), 1.0);
        assert_eq!(score(&items, &[1.0, 0.0, 0.0]), 0.6);
        assert_eq!(score(&items, &[1.0, 0.0, 1.0]), 0.1);
        assert_eq!(score(&items, &[0.0, 0.0, 1.0]), 0.0);
        assert_eq!(score(&items, &[0.5, 0.5, 0.0]), 0.5);
    }
}
