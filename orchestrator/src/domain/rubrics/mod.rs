//! Evolving rubric buffers per task (method.md A.4.1, A.4.5, B.5): persistent Answer rubrics
//! (never pruned), active rubrics per stage with caps, and inactive ones kept for the record.
//! New rubrics join the active set before scoring; pruning moves zero-variance rubrics out, then
//! keeps the top ones by variance (ties: the newer). RLER mode (DR Tulu) keeps K_max active
//! Answer rubrics with weights +1 / -1. Optionally (`judge.research_evidence`, off by default)
//! persistent Research rubrics from a task's evidence chain. Storage is in `db::rubrics`.

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::domain::data::tasks::RubricSpec;
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

/// Persistent Research rubrics from a task's evidence chain (`judge.research_evidence`): one per
/// distinct document its positive Answer rubrics name as `evidence`, in chain order, met when
/// the Research stage retrieved that document. Its id is the key term: a retrieved snippet is
/// shown to the model (and so sits in the Research stage's text) as `<snippet id=ID>`, so a
/// judge finds it there and nowhere else. Weight 1 each: R2 is the share of the chain retrieved.
///
/// A deviation from method.md A.4.1, where persistent rubrics are Answer-only and every
/// Research rubric is generated by contrasting the group: with the 4-layer smoke policy the
/// group's Research texts rarely differ by a term the generator can name, so R2 took R4 in
/// 84-89% of trajectories and SS-GRPO's credit was nearly the terminal broadcast (BENCHMARKS.md,
/// issue 25 session 36). Tasks without evidence ids (DR Tulu's, DeepResearch Bench's) get none.
pub fn evidence_rubrics(specs: &[RubricSpec]) -> Vec<Rubric> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for spec in specs.iter().filter(|s| s.weight > 0.0) {
        for doc in &spec.evidence {
            let doc = doc.trim();
            if doc.is_empty() || !seen.insert(doc.to_string()) {
                continue;
            }
            let fact = if spec.title.trim().is_empty() {
                spec.description.trim()
            } else {
                spec.title.trim()
            };
            out.push(
                NewRubric {
                    title: format!("Research retrieves {doc}"),
                    description: format!(
                        "The Research stage retrieved the document {doc} (shown as a snippet with that id), the evidence for: {fact}."
                    ),
                    weight: 1.0,
                    negative: false,
                    key_terms: vec![doc.to_string()],
                }
                .into_rubric(Stage::Research, Origin::Persistent),
            );
        }
    }
    out
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
    fn evidence_rubrics_follow_the_chain_once_per_document() {
        let spec = |title: &str, weight: f32, evidence: &[&str]| RubricSpec {
            title: title.into(),
            description: format!("states the {title}"),
            weight,
            key_terms: vec![],
            evidence: evidence.iter().map(|e| e.to_string()).collect(),
        };
        let specs = vec![
            spec("protein", 1.0, &["gene-00146"]),
            spec("tissue", 1.0, &["protein-00146"]),
            // The same document again (two facts of one page): one rubric.
            spec("compound", 1.0, &["protein-00146", " "]),
            // A penalty names no document to retrieve.
            spec("made-up city", -1.0, &["institute-00999"]),
            spec("city", 2.0, &["institute-00146"]),
        ];
        let got = evidence_rubrics(&specs);
        let keys: Vec<&str> = got.iter().map(|r| r.key_terms[0].as_str()).collect();
        assert_eq!(keys, ["gene-00146", "protein-00146", "institute-00146"]);
        for r in &got {
            assert_eq!(r.stage, Stage::Research);
            assert_eq!(r.origin, Origin::Persistent);
            assert_eq!((r.weight, r.negative, r.key_terms.len()), (1.0, false, 1));
        }
        assert!(got[1].description.contains("evidence for: tissue"));
        // Tasks without evidence ids (DR Tulu's rows) get none.
        assert!(evidence_rubrics(&[spec("x", 1.0, &[])]).is_empty());
        // They are persistent: pruning never moves them, whatever their variance.
        let mut b = RubricBuffer::with_persistent(got.clone(), 0);
        let var: HashMap<Uuid, f64> = got.iter().map(|r| (r.id, 0.0)).collect();
        assert!(b.prune(BufferPolicy::PAPER, &var, 1).is_empty());
        assert_eq!(b.scoring_set().len(), 3);
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
