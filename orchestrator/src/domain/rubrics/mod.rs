//! Evolving rubric buffers per task (method.md A.4.1, A.4.5, B.5): persistent Answer rubrics
//! (never pruned), active rubrics per stage with caps, and inactive ones kept for the record.
//! New rubrics join the active set before scoring; pruning moves zero-variance rubrics out, then
//! keeps the top ones by variance (ties: the newer). RLER mode (DR Tulu) keeps K_max active
//! Answer rubrics with weights +1 / -1. Storage is in `db::rubrics`.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::domain::judge::{NewRubric, Origin, Rubric};
use crate::domain::trajectory::Stage;

/// The paper's per-stage active caps (Plan, Research, Review, Answer).
pub const PAPER_CAPS: [usize; 4] = [3, 2, 2, 3];
/// DR Tulu's active-rubric cap.
pub const RLER_K_MAX: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Persistent,
    Active,
    Inactive,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Persistent => "persistent",
            State::Active => "active",
            State::Inactive => "inactive",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "persistent" => Some(State::Persistent),
            "active" => Some(State::Active),
            "inactive" => Some(State::Inactive),
            _ => None,
        }
    }
}

/// How a buffer evolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum BufferPolicy {
    /// RubricEM: rubrics for every stage, active caps per stage.
    Stagewise { caps: [usize; 4] },
    /// DR Tulu RLER: Answer rubrics only, at most `k_max` active, weights +1 / -1.
    Rler { k_max: usize },
}

impl BufferPolicy {
    pub const PAPER: Self = BufferPolicy::Stagewise { caps: PAPER_CAPS };
    pub const RLER: Self = BufferPolicy::Rler { k_max: RLER_K_MAX };

    /// Stages that receive generated rubrics.
    pub fn stages(&self) -> &'static [Stage] {
        match self {
            BufferPolicy::Stagewise { .. } => &Stage::ALL,
            BufferPolicy::Rler { .. } => &[Stage::Answer],
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub rubric: Rubric,
    pub state: State,
    /// Variance of its contributions in the last group it scored.
    pub variance: Option<f64>,
    /// Step it was added or last changed state.
    pub updated_step: i32,
    /// Step it was created (ties in pruning keep the newer).
    pub created_step: i32,
}

/// One task's buffer within one run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RubricBuffer {
    pub entries: Vec<Entry>,
}

impl RubricBuffer {
    /// Seed a buffer with a task's persistent Answer rubrics.
    pub fn with_persistent(rubrics: Vec<Rubric>, step: i32) -> Self {
        Self {
            entries: rubrics
                .into_iter()
                .map(|rubric| Entry {
                    rubric,
                    state: State::Persistent,
                    variance: None,
                    updated_step: step,
                    created_step: step,
                })
                .collect(),
        }
    }

    /// Rubrics a trajectory is scored against: persistent and active, in buffer order.
    pub fn scoring_set(&self) -> Vec<Rubric> {
        self.entries
            .iter()
            .filter(|e| e.state != State::Inactive)
            .map(|e| e.rubric.clone())
            .collect()
    }

    /// Active rubrics of a stage.
    pub fn active(&self, stage: Stage) -> impl Iterator<Item = &Entry> {
        self.entries
            .iter()
            .filter(move |e| e.state == State::Active && e.rubric.stage == stage)
    }

    /// Add newly generated rubrics as active (before scoring); RLER sets weights to ±1.
    /// Returns the rubrics added.
    pub fn add_generated(
        &mut self,
        policy: BufferPolicy,
        per_stage: [Vec<NewRubric>; 4],
        step: i32,
    ) -> Vec<Rubric> {
        let mut added = Vec::new();
        for (k, list) in per_stage.into_iter().enumerate() {
            let stage = Stage::ALL[k];
            if !policy.stages().contains(&stage) {
                continue;
            }
            for mut nr in list {
                if let BufferPolicy::Rler { .. } = policy {
                    nr.weight = 1.0; // polarity carries the sign: +1 positive, -1 negative
                }
                let r = nr.into_rubric(stage, Origin::Generated);
                added.push(r.clone());
                self.entries.push(Entry {
                    rubric: r,
                    state: State::Active,
                    variance: None,
                    updated_step: step,
                    created_step: step,
                });
            }
        }
        added
    }

    /// Prune after scoring with each rubric's contribution variance over the group. Zero
    /// variance (or no statistics) moves an active rubric to inactive; then each stage keeps its
    /// cap by variance, ties to the newer. Persistent rubrics never move. Returns ids moved.
    pub fn prune(
        &mut self,
        policy: BufferPolicy,
        variances: &HashMap<Uuid, f64>,
        step: i32,
    ) -> Vec<Uuid> {
        for e in &mut self.entries {
            if let Some(&v) = variances.get(&e.rubric.id) {
                e.variance = Some(v);
            }
        }
        let mut moved = Vec::new();
        let groups: Vec<(Option<Stage>, usize)> = match policy {
            BufferPolicy::Stagewise { caps } => Stage::ALL
                .iter()
                .map(|&s| (Some(s), caps[s.index()]))
                .collect(),
            BufferPolicy::Rler { k_max } => vec![(None, k_max)],
        };
        for (stage, cap) in groups {
            let mut idx: Vec<usize> = (0..self.entries.len())
                .filter(|&i| {
                    let e = &self.entries[i];
                    e.state == State::Active && stage.is_none_or(|s| e.rubric.stage == s)
                })
                .collect();
            // Zero variance first (a rubric not scored this round has no statistics: it stays).
            idx.retain(|&i| {
                let e = &self.entries[i];
                match variances.get(&e.rubric.id) {
                    Some(&v) if v <= 0.0 => {
                        moved.push(e.rubric.id);
                        false
                    }
                    _ => true,
                }
            });
            // Then the top `cap` by variance, ties to the newer (later created, later added).
            idx.sort_by(|&a, &b| {
                let (ea, eb) = (&self.entries[a], &self.entries[b]);
                let va = variances.get(&ea.rubric.id).copied().unwrap_or(0.0);
                let vb = variances.get(&eb.rubric.id).copied().unwrap_or(0.0);
                vb.total_cmp(&va)
                    .then(eb.created_step.cmp(&ea.created_step))
                    .then(b.cmp(&a))
            });
            moved.extend(idx.iter().skip(cap).map(|&i| self.entries[i].rubric.id));
        }
        for e in &mut self.entries {
            if moved.contains(&e.rubric.id) {
                e.state = State::Inactive;
                e.updated_step = step;
            }
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(n: usize) -> Vec<NewRubric> {
        (0..n)
            .map(|i| NewRubric {
                title: format!("r{i}"),
                description: format!("d{i}"),
                weight: 2.0,
                negative: i % 2 == 1,
                key_terms: vec![],
            })
            .collect()
    }

    #[test]
    fn caps_keep_top_by_variance_and_drop_zero_variance() {
        let mut b = RubricBuffer::with_persistent(
            vec![
                NewRubric {
                    title: "p".into(),
                    description: "p".into(),
                    weight: 3.0,
                    negative: false,
                    key_terms: vec![],
                }
                .into_rubric(Stage::Answer, Origin::Persistent),
            ],
            0,
        );
        let added = b.add_generated(BufferPolicy::PAPER, [new(4), new(1), vec![], new(5)], 1);
        assert_eq!(added.len(), 10);
        assert_eq!(b.scoring_set().len(), 11);
        let plan: Vec<Uuid> = b.active(Stage::Plan).map(|e| e.rubric.id).collect();
        let ans: Vec<Uuid> = b.active(Stage::Answer).map(|e| e.rubric.id).collect();
        let mut var = HashMap::new();
        for (i, id) in plan.iter().enumerate() {
            var.insert(*id, [0.1, 0.3, 0.2, 0.0][i]);
        }
        for (i, id) in ans.iter().enumerate() {
            var.insert(*id, [0.0, 0.0, 0.5, 0.5, 0.1][i]);
        }
        // The persistent rubric has zero variance and still stays.
        var.insert(b.entries[0].rubric.id, 0.0);
        b.prune(BufferPolicy::PAPER, &var, 1);
        let plan_after: Vec<Uuid> = b.active(Stage::Plan).map(|e| e.rubric.id).collect();
        assert_eq!(plan_after, vec![plan[0], plan[1], plan[2]]);
        let ans_after: Vec<Uuid> = b.active(Stage::Answer).map(|e| e.rubric.id).collect();
        assert_eq!(ans_after, vec![ans[2], ans[3], ans[4]]);
        assert_eq!(b.entries[0].state, State::Persistent);
        // The research rubric had no statistics this round: it stays active.
        assert_eq!(b.active(Stage::Research).count(), 1);
    }

    #[test]
    fn variance_ties_keep_the_newer() {
        let mut b = RubricBuffer::default();
        b.add_generated(BufferPolicy::PAPER, [vec![], new(2), vec![], vec![]], 1);
        b.add_generated(BufferPolicy::PAPER, [vec![], new(1), vec![], vec![]], 2);
        let ids: Vec<Uuid> = b.active(Stage::Research).map(|e| e.rubric.id).collect();
        let var: HashMap<Uuid, f64> = ids.iter().map(|id| (*id, 0.25)).collect();
        b.prune(BufferPolicy::PAPER, &var, 2);
        let kept: Vec<Uuid> = b.active(Stage::Research).map(|e| e.rubric.id).collect();
        assert_eq!(kept, vec![ids[1], ids[2]]);
    }

    #[test]
    fn rler_keeps_k_max_answer_rubrics_with_unit_weights() {
        let mut b = RubricBuffer::default();
        let added = b.add_generated(BufferPolicy::RLER, [new(3), vec![], vec![], new(8)], 1);
        assert_eq!(added.len(), 8, "only Answer rubrics are taken in RLER mode");
        assert!(
            added
                .iter()
                .all(|r| r.weight == 1.0 && r.stage == Stage::Answer)
        );
        let var: HashMap<Uuid, f64> = added
            .iter()
            .enumerate()
            .map(|(i, r)| (r.id, i as f64 * 0.01))
            .collect();
        b.prune(BufferPolicy::RLER, &var, 1);
        let kept: Vec<Uuid> = b.active(Stage::Answer).map(|e| e.rubric.id).collect();
        assert_eq!(kept.len(), RLER_K_MAX);
        assert_eq!(kept, added[3..].iter().map(|r| r.id).collect::<Vec<_>>());
    }
}
