//! Credit assignment: stage scores R in [0, 1] become per-stage advantages. SS-GRPO returns
//! G = Λ R with a causal stage-dependence matrix Λ, per-stage group normalisation (population
//! std, ε); the Baseline-RL terminal broadcast (every stage gets the Answer score); and the DR
//! Tulu composite reward (rubric, citation, format, search) for the RLER recipe
//! (shared/spec/method.md A.5, B.6, B.7).

use serde::{Deserialize, Serialize};

use crate::domain::trajectory::{SegmentKind, Stage, Trajectory};

/// Number of scaffold stages (Plan, Research, Review, Answer).
pub const STAGES: usize = 4;

/// The paper's Λ (method.md A.5.1): G1 = R1 + .4R2 + .6R3 + .8R4, G2 = R2 + .4R3 + .8R4,
/// G3 = R3 + .8R4, G4 = R4.
pub const PAPER_LAMBDA: [[f64; STAGES]; STAGES] = [
    [1.0, 0.4, 0.6, 0.8],
    [0.0, 1.0, 0.4, 0.8],
    [0.0, 0.0, 1.0, 0.8],
    [0.0, 0.0, 0.0, 1.0],
];

/// Population-std epsilon of the group normalisation (open-instruct's convention).
pub const EPS: f64 = 1e-8;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CreditError {
    #[error("Λ[{row}][{col}] = {value}: {why}")]
    Lambda {
        row: usize,
        col: usize,
        value: f64,
        why: &'static str,
    },
    #[error("stage score R[{rollout}][{stage}] = {value} is outside [0, 1]")]
    Score {
        rollout: usize,
        stage: usize,
        value: f64,
    },
    #[error("a group needs at least one rollout")]
    EmptyGroup,
}

/// A validated causal stage-dependence matrix: upper-triangular, unit diagonal, finite,
/// non-negative weights.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "[[f64; STAGES]; STAGES]", into = "[[f64; STAGES]; STAGES]")]
pub struct Lambda([[f64; STAGES]; STAGES]);

impl TryFrom<[[f64; STAGES]; STAGES]> for Lambda {
    type Error = CreditError;
    fn try_from(m: [[f64; STAGES]; STAGES]) -> Result<Self, CreditError> {
        for (row, r) in m.iter().enumerate() {
            for (col, &value) in r.iter().enumerate() {
                let why = if !value.is_finite() {
                    Some("not finite")
                } else if col < row && value != 0.0 {
                    Some("below the diagonal must be 0 (a stage cannot credit earlier stages)")
                } else if col == row && value != 1.0 {
                    Some("the diagonal must be 1")
                } else if value < 0.0 {
                    Some("weights must be >= 0")
                } else {
                    None
                };
                if let Some(why) = why {
                    return Err(CreditError::Lambda {
                        row,
                        col,
                        value,
                        why,
                    });
                }
            }
        }
        Ok(Self(m))
    }
}

impl From<Lambda> for [[f64; STAGES]; STAGES] {
    fn from(l: Lambda) -> Self {
        l.0
    }
}

impl Default for Lambda {
    fn default() -> Self {
        Self(PAPER_LAMBDA)
    }
}

impl Lambda {
    pub fn identity() -> Self {
        let mut m = [[0.0; STAGES]; STAGES];
        for (k, row) in m.iter_mut().enumerate() {
            row[k] = 1.0;
        }
        Self(m)
    }

    pub fn matrix(&self) -> &[[f64; STAGES]; STAGES] {
        &self.0
    }

    /// G = Λ R for one rollout.
    pub fn returns(&self, r: &[f64; STAGES]) -> [f64; STAGES] {
        let mut g = [0.0; STAGES];
        for (k, gk) in g.iter_mut().enumerate() {
            *gk = (k..STAGES).map(|j| self.0[k][j] * r[j]).sum();
        }
        g
    }
}

/// How stage scores become returns.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum CreditMode {
    /// SS-GRPO: G = Λ R, normalised per stage.
    StageStructured { lambda: Lambda },
    /// Baseline-RL: every stage gets the Answer score R4 (GRPO with terminal broadcast).
    Terminal,
}

/// Per-stage advantages of one group (a task's n rollouts).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupAdvantages {
    /// [rollout][stage]
    pub advantages: Vec<[f64; STAGES]>,
    pub returns: Vec<[f64; STAGES]>,
    /// Population std of the returns per stage.
    pub std: [f64; STAGES],
    /// All four stage stds are 0: the group carries no signal (PROPOSED: drop it).
    pub degenerate: bool,
}

fn check_scores(r: &[[f64; STAGES]]) -> Result<(), CreditError> {
    if r.is_empty() {
        return Err(CreditError::EmptyGroup);
    }
    for (i, row) in r.iter().enumerate() {
        for (k, &v) in row.iter().enumerate() {
            if !(0.0..=1.0).contains(&v) {
                return Err(CreditError::Score {
                    rollout: i,
                    stage: k,
                    value: v,
                });
            }
        }
    }
    Ok(())
}

/// Mean and population std of a column.
fn mean_std(xs: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let n = xs.clone().count().max(1) as f64;
    let mean = xs.clone().sum::<f64>() / n;
    let var = xs.map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// Advantages for one group of rollouts from their stage scores R (rows: rollouts).
pub fn group_advantages(
    mode: CreditMode,
    scores: &[[f64; STAGES]],
) -> Result<GroupAdvantages, CreditError> {
    check_scores(scores)?;
    let returns: Vec<[f64; STAGES]> = scores
        .iter()
        .map(|r| match mode {
            CreditMode::StageStructured { lambda } => lambda.returns(r),
            CreditMode::Terminal => [r[STAGES - 1]; STAGES],
        })
        .collect();
    let mut advantages = vec![[0.0; STAGES]; returns.len()];
    let mut std = [0.0; STAGES];
    for k in 0..STAGES {
        let (mean, sd) = mean_std(returns.iter().map(|g| g[k]));
        std[k] = sd;
        for (a, g) in advantages.iter_mut().zip(&returns) {
            // A zero-variance stage gives exactly zero advantage (no ε blow-up of rounding).
            a[k] = if sd == 0.0 {
                0.0
            } else {
                (g[k] - mean) / (sd + EPS)
            };
        }
    }
    Ok(GroupAdvantages {
        advantages,
        returns,
        degenerate: std.iter().all(|&s| s == 0.0),
        std,
    })
}

/// Per-token view of one trajectory for the train batch (method.md Part D.2): over the prompt
/// and every segment in order, the stage index of each token (-1 where it has none), its
/// advantage (its stage's advantage for model tokens, 0 elsewhere) and whether it counts in the
/// loss (model tokens only; prompt, tool-output and injected tokens never do).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenCredit {
    pub stage: Vec<i8>,
    pub advantage: Vec<f32>,
    pub loss_mask: Vec<bool>,
}

pub fn token_credit(t: &Trajectory, advantages: &[f64; STAGES]) -> TokenCredit {
    let n = t.prompt_token_ids.len() + t.segments.iter().map(|s| s.token_ids.len()).sum::<usize>();
    let mut c = TokenCredit {
        stage: Vec::with_capacity(n),
        advantage: Vec::with_capacity(n),
        loss_mask: Vec::with_capacity(n),
    };
    let mut push = |len: usize, stage: Option<Stage>| {
        let (k, a, m) = match stage {
            Some(s) => (s.index() as i8, advantages[s.index()] as f32, true),
            None => (-1, 0.0, false),
        };
        c.stage.extend(std::iter::repeat_n(k, len));
        c.advantage.extend(std::iter::repeat_n(a, len));
        c.loss_mask.extend(std::iter::repeat_n(m, len));
    };
    push(t.prompt_token_ids.len(), None);
    for s in &t.segments {
        // Only model tokens carry a stage; a model segment without one (never written by the
        // engine) is treated as the Plan stage rather than silently dropped from the loss.
        let stage = match s.kind {
            SegmentKind::Model => Some(s.stage.unwrap_or(Stage::Plan)),
            SegmentKind::ToolOutput | SegmentKind::Injected => None,
        };
        push(s.token_ids.len(), stage);
    }
    c
}

/// Weights of the DR Tulu composite reward (method.md B.6).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompositeWeights {
    pub rubric: f64,
    pub citation: f64,
    pub format: f64,
    pub search: f64,
}

impl CompositeWeights {
    /// 0.5 rubric + 0.2 citation + 0.2 format + 0.1 search.
    pub const WITH_CITATION: Self = Self {
        rubric: 0.5,
        citation: 0.2,
        format: 0.2,
        search: 0.1,
    };
    /// 0.6 rubric + 0.2 format + 0.2 search.
    pub const WITHOUT_CITATION: Self = Self {
        rubric: 0.6,
        citation: 0.0,
        format: 0.2,
        search: 0.2,
    };
}

/// What the composite reward is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CompositeInputs {
    /// Rubric score: DR Tulu's signed points sum, at most 1 and negative when penalties
    /// outweigh (method.md B.2; not clipped, as DR Tulu's code). Ignored without an answer.
    pub rubric: f64,
    /// Citation reward 0.6·F1 + 0.4·R_fmt in [0, 1] (0 when no answer).
    pub citation: f64,
    pub has_answer: bool,
    pub has_cite: bool,
    pub has_tool_query: bool,
    /// Valid tool-call queries before the answer.
    pub search_queries: u32,
}

/// r_fmt = 0.5·has_answer + 0.3·has_cite + 0.2·has_tool_query.
pub fn format_reward(i: &CompositeInputs) -> f64 {
    0.5 * f64::from(u8::from(i.has_answer))
        + 0.3 * f64::from(u8::from(i.has_cite))
        + 0.2 * f64::from(u8::from(i.has_tool_query))
}

/// r_search = min(queries / 3, 1).
pub fn search_reward(queries: u32) -> f64 {
    (f64::from(queries) / 3.0).min(1.0)
}

/// The DR Tulu final reward. Without an answer the rubric and citation terms are 0.
pub fn composite_reward(i: &CompositeInputs, citation_on: bool) -> f64 {
    let w = if citation_on {
        CompositeWeights::WITH_CITATION
    } else {
        CompositeWeights::WITHOUT_CITATION
    };
    let (rubric, citation) = if i.has_answer {
        (i.rubric, i.citation)
    } else {
        (0.0, 0.0)
    };
    w.rubric * rubric
        + w.citation * citation
        + w.format * format_reward(i)
        + w.search * search_reward(i.search_queries)
}

/// Whether a group's scalar rewards have zero population std: the group carries no signal and
/// DR Tulu removes it from the batch (method.md B.7). An empty or one-rollout group is one.
pub fn zero_std(rewards: &[f64]) -> bool {
    mean_std(rewards.iter().copied()).1 == 0.0
}

/// Sequence-level GRPO advantages for scalar rewards (the DR Tulu recipe): population std,
/// ε = 1e-8; a zero-std group gives zeros.
pub fn scalar_advantages(rewards: &[f64]) -> Vec<f64> {
    let (mean, sd) = mean_std(rewards.iter().copied());
    rewards
        .iter()
        .map(|r| {
            if sd == 0.0 {
                0.0
            } else {
                (r - mean) / (sd + EPS)
            }
        })
        .collect()
}
