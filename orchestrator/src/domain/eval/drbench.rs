//! DeepResearch Bench (RACE) criteria: per task, dimension weights (comprehensiveness, insight,
//! instruction following, readability) and weighted criteria within each dimension. A report's
//! score is `Σ_d W_d · Σ_i w_i s_i / Σ_i w_i` over judge scores s in [0, 10]; RACE reports it
//! relative to a reference report as `target / (target + reference)`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use uuid::Uuid;

use crate::domain::judge::{Origin, Rubric};
use crate::domain::trajectory::Stage;

/// Weights must sum to 1 within this tolerance.
pub const WEIGHT_TOLERANCE: f64 = 1e-3;

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Criterion {
    pub criterion: String,
    #[serde(default)]
    pub explanation: String,
    pub weight: f64,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TaskCriteria {
    pub id: u64,
    pub prompt: String,
    pub dimension_weight: BTreeMap<String, f64>,
    pub criterions: BTreeMap<String, Vec<Criterion>>,
}

#[derive(Debug, thiserror::Error)]
pub enum DrbError {
    #[error("cannot read {path}: {message}")]
    Read { path: String, message: String },
    #[error("{path} line {line}: {message}")]
    Row {
        path: String,
        line: usize,
        message: String,
    },
    #[error("task {id}: {message}")]
    Weights { id: u64, message: String },
    #[error("task {id}: {message}")]
    Scores { id: u64, message: String },
}

impl TaskCriteria {
    /// Dimension weights sum to 1, every dimension has criteria whose weights sum to 1.
    pub fn validate(&self) -> Result<(), DrbError> {
        let err = |message: String| DrbError::Weights {
            id: self.id,
            message,
        };
        let total: f64 = self.dimension_weight.values().sum();
        if (total - 1.0).abs() > WEIGHT_TOLERANCE {
            return Err(err(format!(
                "dimension weights sum to {total}; allowed: 1 ± {WEIGHT_TOLERANCE}"
            )));
        }
        for (dim, w) in &self.dimension_weight {
            let cs = self
                .criterions
                .get(dim)
                .filter(|c| !c.is_empty())
                .ok_or_else(|| err(format!("dimension `{dim}` (weight {w}) has no criteria")))?;
            let s: f64 = cs.iter().map(|c| c.weight).sum();
            if (s - 1.0).abs() > WEIGHT_TOLERANCE || cs.iter().any(|c| c.weight < 0.0) {
                return Err(err(format!(
                    "criteria of `{dim}` have weights summing to {s}; allowed: non-negative, sum 1 ± {WEIGHT_TOLERANCE}"
                )));
            }
        }
        Ok(())
    }

    /// Weighted score of one report from per-criterion scores (`scores[dim][i]` in [0, 10]).
    pub fn score(&self, scores: &BTreeMap<String, Vec<f64>>) -> Result<f64, DrbError> {
        let mut total = 0.0;
        for (dim, w) in &self.dimension_weight {
            let cs = self.criterions.get(dim).map_or(&[][..], Vec::as_slice);
            let s = scores.get(dim).ok_or_else(|| DrbError::Scores {
                id: self.id,
                message: format!("no scores for dimension `{dim}`"),
            })?;
            if s.len() != cs.len() {
                return Err(DrbError::Scores {
                    id: self.id,
                    message: format!(
                        "`{dim}` has {} criteria but {} scores were given",
                        cs.len(),
                        s.len()
                    ),
                });
            }
            if let Some(bad) = s.iter().find(|x| !(0.0..=10.0).contains(*x)) {
                return Err(DrbError::Scores {
                    id: self.id,
                    message: format!("score {bad} in `{dim}` is out of range; allowed: 0..=10"),
                });
            }
            let den: f64 = cs.iter().map(|c| c.weight).sum();
            let num: f64 = cs.iter().zip(s).map(|(c, x)| c.weight * x).sum();
            total += w * if den > 0.0 { num / den } else { 0.0 };
        }
        Ok(total)
    }

    /// The criteria as Answer-stage dataset rubrics weighted `W_d · w_i`.
    pub fn to_rubrics(&self) -> Vec<Rubric> {
        let mut out = Vec::new();
        for (dim, cs) in &self.criterions {
            let w = self.dimension_weight.get(dim).copied().unwrap_or(0.0);
            for c in cs {
                out.push(Rubric {
                    id: Uuid::now_v7(),
                    stage: Stage::Answer,
                    title: format!("{dim}: {}", c.criterion),
                    description: c.explanation.clone(),
                    weight: (w * c.weight) as f32,
                    negative: false,
                    key_terms: vec![],
                    origin: Origin::Dataset,
                });
            }
        }
        out
    }
}

/// RACE's relative score: `target / (target + reference)` (0.5 when equal; 0 when both are 0).
pub fn race(target: f64, reference: f64) -> f64 {
    if target + reference <= 0.0 {
        0.0
    } else {
        target / (target + reference)
    }
}

/// Load and validate `criteria.jsonl`.
pub fn load(path: &Path) -> Result<Vec<TaskCriteria>, DrbError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| DrbError::Read {
        path: p.clone(),
        message: e.to_string(),
    })?;
    let mut out = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let t: TaskCriteria = serde_json::from_str(line).map_err(|e| DrbError::Row {
            path: p.clone(),
            line: i + 1,
            message: e.to_string(),
        })?;
        t.validate()?;
        out.push(t);
    }
    Ok(out)
}
