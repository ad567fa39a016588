//! The per-task judge procedure of one step (method.md A.4.2, B.5): generate rubrics by
//! contrasting the task's rollouts, add them to the buffer, score every rollout (one call each,
//! or DR Tulu's one call per (rollout, rubric); all in flight together), turn scores into stage
//! scores with the documented fallbacks (RubricEM's weighted mean, or DR Tulu's signed points),
//! then prune the buffer by discrimination. Failures never lose a trajectory: a failed
//! generation means no new rubrics; a failed scoring call falls back to an answer-only call, then
//! to R = 0 (per rubric: that rubric scores 0, DR Tulu's rule); every call, failed or not, is
//! returned for the record.

use std::collections::HashMap;

use futures::future::join_all;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::citation::{CitationReward, citation_reward, split_claims};
use super::score::{
    AnswerScore, ScoreSource, finalize, rubric_points, rubric_variances, stage_means,
};
use super::{Granularity, Judge, Rubric, RubricScore, ScoreMode, TraceView, Usage};
use crate::domain::credit::STAGES;
use crate::domain::rubrics::{BufferPolicy, RubricBuffer};
use crate::domain::trajectory::Stage;

/// What kind of judge call a record is (the `judge_calls.kind` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    Generate,
    Score,
    /// The answer-only call made after a failed stagewise scoring call.
    ScoreFallback,
    Claims,
    Ground,
    /// Grading reflection candidates (method.md A.6.2).
    Reflect,
}

impl CallKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CallKind::Generate => "generate",
            CallKind::Score => "score",
            CallKind::ScoreFallback => "score_fallback",
            CallKind::Claims => "claims",
            CallKind::Ground => "ground",
            CallKind::Reflect => "reflect",
        }
    }
}

/// One judge call for the record: what it cost and how it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRecord {
    pub kind: CallKind,
    pub trajectory_id: Option<Uuid>,
    pub usage: Usage,
    pub error: Option<String>,
}

/// How a group is judged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupConfig {
    pub policy: BufferPolicy,
    pub mode: ScoreMode,
    /// Propose new rubrics this step (off for `orchestrator judge` re-scoring).
    pub generate: bool,
    /// Compute the DR Tulu citation reward (claim-level judge calls).
    pub citation: bool,
    /// One scoring call per trajectory, or one per (trajectory, rubric) as DR Tulu.
    pub granularity: Granularity,
    /// How the Answer score is aggregated: RubricEM's weighted mean or DR Tulu's signed points.
    pub answer_score: AnswerScore,
    /// The per-rubric scale: 2 (0/1/2), or 4 (DeepRubric's 0-4, per-rubric granularity only).
    pub point_scale: u8,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TrajectoryJudgment {
    pub trajectory_id: Uuid,
    pub scores: Vec<RubricScore>,
    /// Stage scores R in [0, 1] (the `stage_scores` rows).
    pub stage_scores: [f64; STAGES],
    pub source: ScoreSource,
    pub citation: Option<CitationReward>,
    /// The rubric score a scalar reward uses: R4 under the weighted mean; under
    /// [`AnswerScore::SignedPoints`] DR Tulu's signed, unclipped score (R4 keeps it clipped to
    /// [0, 1] for the stage rows). 0 when the trajectory could not be scored.
    pub rubric_score: f64,
    /// The scale of `scores` (2 or 4, [`GroupConfig::point_scale`]).
    pub point_scale: u8,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GroupJudgment {
    /// Rubrics created this step (to be stored).
    pub new_rubrics: Vec<Rubric>,
    /// The rubric set every trajectory was scored against.
    pub scored_against: Vec<Rubric>,
    pub trajectories: Vec<TrajectoryJudgment>,
    pub variances: HashMap<Uuid, f64>,
    /// Rubric ids moved to inactive by pruning.
    pub pruned: Vec<Uuid>,
    pub calls: Vec<CallRecord>,
}

fn record(kind: CallKind, t: Option<Uuid>, r: Result<Usage, &super::JudgeError>) -> CallRecord {
    match r {
        Ok(usage) => CallRecord {
            kind,
            trajectory_id: t,
            usage,
            error: None,
        },
        Err(e) => CallRecord {
            kind,
            trajectory_id: t,
            usage: Usage {
                attempts: match e {
                    super::JudgeError::Llm { attempts, .. } => *attempts,
                    _ => 1,
                },
                ..Usage::default()
            },
            error: Some(crate::domain::util::error_chain(e)),
        },
    }
}

/// Score one trajectory; on failure retry with the Answer rubrics only, answer-only.
async fn score_one(
    judge: &dyn Judge,
    question: &str,
    id: Uuid,
    view: &TraceView,
    rubrics: &[Rubric],
    mode: ScoreMode,
) -> (Vec<RubricScore>, bool, Vec<CallRecord>) {
    let mut calls = Vec::new();
    match judge.score(question, view, rubrics, mode).await {
        Ok(s) => {
            calls.push(record(CallKind::Score, Some(id), Ok(s.usage)));
            (s.scores, true, calls)
        }
        Err(e) => {
            tracing::warn!(trajectory = %id, error = %crate::domain::util::error_chain(&e), "stagewise scoring failed; falling back to the answer score");
            calls.push(record(CallKind::Score, Some(id), Err(&e)));
            let answer: Vec<Rubric> = rubrics
                .iter()
                .filter(|r| r.stage == Stage::Answer)
                .cloned()
                .collect();
            if answer.is_empty() {
                return (vec![], false, calls);
            }
            match judge
                .score(question, view, &answer, ScoreMode::AnswerOnly)
                .await
            {
                Ok(s) => {
                    calls.push(record(CallKind::ScoreFallback, Some(id), Ok(s.usage)));
                    (s.scores, false, calls)
                }
                Err(e) => {
                    tracing::warn!(trajectory = %id, error = %crate::domain::util::error_chain(&e), "answer-only fallback failed; R = 0");
                    calls.push(record(CallKind::ScoreFallback, Some(id), Err(&e)));
                    (vec![], false, calls)
                }
            }
        }
    }
}

/// DR Tulu's granularity: one call per rubric, all in flight together. A call that failed after
/// the client's retries leaves the trajectory unscored (no scores: source `failed`, kept out of
/// the group's advantages, its errors in the call records), never a 0 for that rubric: DR Tulu
/// scores a failed judge call 0, which would train on the judge's outage as if it were the
/// policy's. Answer-only without an extracted answer (none, or never closed): every rubric
/// scores 0 without a call, as DR Tulu's reward code does (that 0 is the policy's). Returns the
/// scores, whether they count as a full scoring (for the variance statistics), and the call
/// records.
async fn score_per_rubric(
    judge: &dyn Judge,
    question: &str,
    id: Uuid,
    view: &TraceView,
    rubrics: &[Rubric],
    mode: ScoreMode,
    scale: u8,
) -> (Vec<RubricScore>, bool, Vec<CallRecord>) {
    if mode == ScoreMode::AnswerOnly && view.extracted_answer().is_none() {
        let scores = rubrics
            .iter()
            .map(|r| RubricScore {
                rubric_id: r.id,
                score: 0,
                justification: "no <answer>…</answer> to judge: scored 0 without a call".into(),
            })
            .collect();
        return (scores, true, vec![]);
    }
    let results = join_all(
        rubrics
            .iter()
            .map(|r| judge.score_rubric_on(question, view, r, mode, scale)),
    )
    .await;
    let mut calls = Vec::with_capacity(rubrics.len());
    let mut scores = Vec::with_capacity(rubrics.len());
    let mut ok = 0usize;
    for (r, res) in rubrics.iter().zip(results) {
        match res {
            Ok((s, usage)) => {
                ok += 1;
                calls.push(record(CallKind::Score, Some(id), Ok(usage)));
                scores.push(s);
            }
            Err(e) => {
                let why = crate::domain::util::error_chain(&e);
                tracing::warn!(trajectory = %id, rubric = %r.id, error = %why, "rubric scoring failed; the trajectory is left unscored");
                calls.push(record(CallKind::Score, Some(id), Err(&e)));
            }
        }
    }
    if ok < rubrics.len() {
        return (vec![], false, calls);
    }
    (scores, true, calls)
}

/// Stage scores, their source and the reward's rubric score of one trajectory.
fn aggregate(
    how: AnswerScore,
    rubrics: &[Rubric],
    scores: &[RubricScore],
    scale: u8,
) -> ([f64; STAGES], ScoreSource, f64) {
    match how {
        AnswerScore::WeightedMean => {
            let (r, source) = finalize(stage_means(rubrics, scores));
            (r, source, r[STAGES - 1])
        }
        AnswerScore::SignedPoints | AnswerScore::AbsWeighted => {
            let answer: Vec<Rubric> = rubrics
                .iter()
                .filter(|r| r.stage == Stage::Answer)
                .cloned()
                .collect();
            let signed = if how == AnswerScore::AbsWeighted {
                crate::domain::judge::score::abs_weighted_points(&answer, scores, scale)
            } else {
                rubric_points(&answer, scores)
            };
            let mut means = stage_means(rubrics, scores);
            means[STAGES - 1] = signed.map(|s| s.clamp(0.0, 1.0));
            let (r, source) = finalize(means);
            let rubric = if source == ScoreSource::Failed {
                0.0
            } else {
                signed.unwrap_or(0.0)
            };
            (r, source, rubric)
        }
    }
}

/// Judge one task's group of rollouts and evolve its buffer in place.
pub async fn judge_group(
    judge: &dyn Judge,
    buffer: &mut RubricBuffer,
    cfg: GroupConfig,
    question: &str,
    group: &[(Uuid, TraceView)],
    step: i32,
) -> GroupJudgment {
    let mut calls = Vec::new();
    let mut new_rubrics = Vec::new();
    if cfg.generate && group.len() >= 2 {
        let views: Vec<TraceView> = group.iter().map(|(_, v)| v.clone()).collect();
        let existing = buffer.scoring_set();
        match judge
            .generate(question, &views, &existing, cfg.policy.stages())
            .await
        {
            Ok(g) => {
                calls.push(record(CallKind::Generate, None, Ok(g.usage)));
                new_rubrics = buffer.add_generated(cfg.policy, g.per_stage, step);
            }
            Err(e) => {
                tracing::warn!(error = %crate::domain::util::error_chain(&e), "rubric generation failed; no new rubrics this step");
                calls.push(record(CallKind::Generate, None, Err(&e)));
            }
        }
    }
    let rubrics = buffer.scoring_set();
    // The 0-4 scale is asked per rubric only; a per-trajectory call grades 0/1/2.
    let scale = match cfg.granularity {
        Granularity::PerRubric => cfg.point_scale.clamp(2, 4),
        Granularity::PerTrajectory => 2,
    };
    let scored = join_all(group.iter().map(|(id, v)| {
        let rubrics = &rubrics;
        async move {
            match cfg.granularity {
                Granularity::PerTrajectory => {
                    score_one(judge, question, *id, v, rubrics, cfg.mode).await
                }
                Granularity::PerRubric => {
                    score_per_rubric(judge, question, *id, v, rubrics, cfg.mode, scale).await
                }
            }
        }
    }))
    .await;
    let citations = if cfg.citation {
        join_all(group.iter().map(|(id, v)| async move {
            // Claims of the answer DR Tulu extracts (a closed one); none: no claims, no call.
            let claims = split_claims(v.extracted_answer().unwrap_or(""));
            let known = |x: &str| v.snippets.contains_key(x);
            match judge.claims(question, &claims, &v.snippets).await {
                Ok((verdicts, usage)) => (
                    Some(citation_reward(&claims, &verdicts, &known)),
                    record(CallKind::Claims, Some(*id), Ok(usage)),
                ),
                Err(e) => (None, record(CallKind::Claims, Some(*id), Err(&e))),
            }
        }))
        .await
    } else {
        vec![]
    };

    let mut trajectories = Vec::with_capacity(group.len());
    let mut full_groups = Vec::new();
    for (i, ((id, _), (scores, full, mut c))) in group.iter().zip(scored).enumerate() {
        calls.append(&mut c);
        let (stage_scores, mut source, rubric_score) =
            aggregate(cfg.answer_score, &rubrics, &scores, scale);
        if !full && source != ScoreSource::Failed {
            source = ScoreSource::Broadcast;
        }
        if full {
            full_groups.push(scores.clone());
        }
        let citation = citations.get(i).and_then(|(c, rec)| {
            calls.push(rec.clone());
            *c
        });
        trajectories.push(TrajectoryJudgment {
            trajectory_id: *id,
            scores,
            stage_scores,
            source,
            citation,
            rubric_score,
            point_scale: scale,
        });
    }
    let variances = rubric_variances(&rubrics, &full_groups);
    let pruned = buffer.prune(cfg.policy, &variances, step);
    GroupJudgment {
        new_rubrics,
        scored_against: rubrics,
        trajectories,
        variances,
        pruned,
        calls,
    }
}
