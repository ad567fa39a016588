//! From raw 0/1/2 rubric scores to stage scores R in [0, 1]: negative inversion, weighted means,
//! the documented fallbacks for empty stages and failed calls (method.md A.4.4); DR Tulu's
//! signed points score (method.md B.2, unclipped as its code leaves it) and HealthBench's
//! clipped one.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{Rubric, RubricScore};
use crate::domain::credit::STAGES;

/// c_r: 2 → 1, 1 → 0.5, 0 → 0 for a positive rubric; inverted for a negative one.
pub fn contribution(score: u8, negative: bool) -> f64 {
    let s = f64::from(score.min(2));
    if negative { (2.0 - s) / 2.0 } else { s / 2.0 }
}

/// How a trajectory's stage scores were obtained (the `stage_scores.source` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreSource {
    /// Every stage had rubrics and was scored.
    Judged,
    /// Some stage had no rubric (or the stagewise call failed but the answer was scored): that
    /// stage took the Answer score R4 (terminal broadcast).
    Broadcast,
    /// No score could be obtained: R = 0 everywhere.
    Failed,
}

impl ScoreSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ScoreSource::Judged => "judged",
            ScoreSource::Broadcast => "broadcast",
            ScoreSource::Failed => "failed",
        }
    }
}

/// How a trajectory's Answer score is aggregated from its rubric scores.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerScore {
    /// RubricEM (method.md A.4.4): weighted mean of contributions, a negative rubric inverted
    /// (`(2 − s)/2`), weights magnitudes on {1, 2, 3}; R in [0, 1].
    #[default]
    WeightedMean,
    /// DR Tulu (method.md B.2): `S = Σ w·s/2 / max(Σ_{w>0} w, 1)` with signed weights (a
    /// negative rubric subtracts its weight when its flaw is present); not clipped, as DR Tulu's
    /// code leaves it, so S ≤ 1 and may be negative. See [`rubric_points`].
    SignedPoints,
    /// DeepRubric (method.md C.5): `S = Σ w·s / Σ |w|` over the answer rubrics with signed
    /// weights and scores normalised to [0, 1]; a negative rubric subtracts when its flaw is
    /// present. See [`abs_weighted_points`].
    AbsWeighted,
}

/// Weighted mean of contributions per stage; `None` for a stage with no scored rubric.
pub fn stage_means(rubrics: &[Rubric], scores: &[RubricScore]) -> [Option<f64>; STAGES] {
    let by_id: HashMap<Uuid, &Rubric> = rubrics.iter().map(|r| (r.id, r)).collect();
    let mut num = [0.0; STAGES];
    let mut den = [0.0; STAGES];
    for s in scores {
        if let Some(r) = by_id.get(&s.rubric_id) {
            let w = f64::from(r.weight.abs());
            num[r.stage.index()] += w * contribution(s.score, r.negative);
            den[r.stage.index()] += w;
        }
    }
    std::array::from_fn(|k| (den[k] > 0.0).then(|| (num[k] / den[k]).clamp(0.0, 1.0)))
}

/// Complete a trajectory's stage scores: a stage without rubrics takes R4; without R4 every
/// stage is 0 (method.md A.4.4, PROPOSED semantics).
pub fn finalize(means: [Option<f64>; STAGES]) -> ([f64; STAGES], ScoreSource) {
    match means[STAGES - 1] {
        None => ([0.0; STAGES], ScoreSource::Failed),
        Some(r4) => {
            let source = if means.iter().all(Option::is_some) {
                ScoreSource::Judged
            } else {
                ScoreSource::Broadcast
            };
            (std::array::from_fn(|k| means[k].unwrap_or(r4)), source)
        }
    }
}

/// Population variance of each rubric's contributions across a group (for pruning), keyed by
/// rubric id. Rubrics missing from some trajectory's scores use the trajectories that have them.
pub fn rubric_variances(rubrics: &[Rubric], group: &[Vec<RubricScore>]) -> HashMap<Uuid, f64> {
    let neg: HashMap<Uuid, bool> = rubrics.iter().map(|r| (r.id, r.negative)).collect();
    let mut vals: HashMap<Uuid, Vec<f64>> = HashMap::new();
    for scores in group {
        for s in scores {
            if let Some(&n) = neg.get(&s.rubric_id) {
                vals.entry(s.rubric_id)
                    .or_default()
                    .push(contribution(s.score, n));
            }
        }
    }
    vals.into_iter()
        .map(|(id, v)| {
            let n = v.len() as f64;
            let mean = v.iter().sum::<f64>() / n;
            (id, v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n)
        })
        .collect()
}

/// DR Tulu's rubric score (method.md B.2; `longform_rubric_rewards.py`, drtulu.md 2.3):
/// `Σ w·met / max(Σ_{w>0} w, 1)` over `(points, met)` pairs with `met` in [0, 1] and negative
/// points for penalties. Not clipped: DR Tulu's code leaves it signed (at most 1, negative when
/// penalties outweigh what was met), and so does this recipe.
pub fn signed_points(items: &[(f64, f64)]) -> f64 {
    let positive: f64 = items.iter().map(|(w, _)| w.max(0.0)).sum();
    let got: f64 = items.iter().map(|(w, m)| w * m.clamp(0.0, 1.0)).sum();
    got / positive.max(1.0)
}

/// HealthBench's points score: [`signed_points`] clipped to [0, 1] (HealthBench's rule).
pub fn points_score(items: &[(f64, f64)]) -> f64 {
    signed_points(items).clamp(0.0, 1.0)
}

/// A rubric's signed weight: its magnitude, negated for a negative rubric.
pub fn signed_weight(r: &Rubric) -> f64 {
    let w = f64::from(r.weight.abs());
    if r.negative { -w } else { w }
}

/// DR Tulu's signed points score of one trajectory's rubric scores: each scored rubric counts
/// `signed weight × raw/2` (a judge's 2 on a negative rubric means its flaw is fully present, so
/// its weight is subtracted); `None` when no rubric was scored.
pub fn rubric_points(rubrics: &[Rubric], scores: &[RubricScore]) -> Option<f64> {
    let by_id: HashMap<Uuid, &Rubric> = rubrics.iter().map(|r| (r.id, r)).collect();
    let items: Vec<(f64, f64)> = scores
        .iter()
        .filter_map(|s| {
            by_id
                .get(&s.rubric_id)
                .map(|r| (signed_weight(r), f64::from(s.score.min(2)) / 2.0))
        })
        .collect();
    (!items.is_empty()).then(|| signed_points(&items))
}

/// DeepRubric's rubric score `Σ w·s / Σ |w|` (signed weights, scores on `0..=scale`
/// normalised by the scale: 4 for DeepRubric's judge, 2 for ours); `None` without a scored
/// rubric.
pub fn abs_weighted_points(rubrics: &[Rubric], scores: &[RubricScore], scale: u8) -> Option<f64> {
    let scale = scale.max(1);
    let by_id: HashMap<Uuid, &Rubric> = rubrics.iter().map(|r| (r.id, r)).collect();
    let items: Vec<(f64, f64)> = scores
        .iter()
        .filter_map(|s| {
            by_id.get(&s.rubric_id).map(|r| {
                (
                    signed_weight(r),
                    f64::from(s.score.min(scale)) / f64::from(scale),
                )
            })
        })
        .collect();
    let denom: f64 = items.iter().map(|(w, _)| w.abs()).sum();
    (denom > 0.0).then(|| items.iter().map(|(w, s)| w * s).sum::<f64>() / denom)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::judge::Origin;
    use crate::domain::trajectory::Stage;

    fn rubric(stage: Stage, weight: f32, negative: bool) -> Rubric {
        Rubric {
            id: Uuid::now_v7(),
            stage,
            title: String::new(),
            description: "d".into(),
            weight,
            negative,
            key_terms: vec![],
            origin: Origin::Generated,
        }
    }

    fn score(r: &Rubric, s: u8) -> RubricScore {
        RubricScore {
            rubric_id: r.id,
            score: s,
            justification: String::new(),
        }
    }

    #[test]
    fn weighted_mean_inverts_negatives() {
        let a = rubric(Stage::Answer, 3.0, false);
        let b = rubric(Stage::Answer, 1.0, true);
        // a fully met (1.0, w 3), b's flaw fully present (0.0, w 1): 3/4.
        let m = stage_means(&[a.clone(), b.clone()], &[score(&a, 2), score(&b, 2)]);
        assert_eq!(m[3], Some(0.75));
        assert_eq!(m[0], None);
        let (r, src) = finalize(m);
        assert_eq!(r, [0.75; 4]);
        assert_eq!(src, ScoreSource::Broadcast);
    }

    #[test]
    fn missing_answer_score_zeroes_everything() {
        let (r, src) = finalize([Some(1.0), Some(1.0), None, None]);
        assert_eq!(r, [0.0; 4]);
        assert_eq!(src, ScoreSource::Failed);
        let (r, src) = finalize([Some(0.5), Some(1.0), Some(0.0), Some(0.25)]);
        assert_eq!(r, [0.5, 1.0, 0.0, 0.25]);
        assert_eq!(src, ScoreSource::Judged);
    }

    #[test]
    fn variance_uses_contributions() {
        let a = rubric(Stage::Plan, 1.0, true);
        let g = vec![vec![score(&a, 0)], vec![score(&a, 2)]];
        // contributions 1 and 0: variance 0.25.
        assert_eq!(rubric_variances(std::slice::from_ref(&a), &g)[&a.id], 0.25);
    }

    #[test]
    fn signed_points_subtract_penalties_without_clipping() {
        let a = rubric(Stage::Answer, 3.0, false);
        let b = rubric(Stage::Answer, 2.0, true);
        // a half met (3 · 0.5), b's flaw fully present (−2 · 1): (1.5 − 2) / 3.
        let s = rubric_points(&[a.clone(), b.clone()], &[score(&a, 1), score(&b, 2)]).unwrap();
        assert!((s - (-0.5 / 3.0)).abs() < 1e-12);
        // RubricEM's inverted mean of the same scores: (3 · 0.5 + 2 · 0) / 5 = 0.3.
        let m = stage_means(&[a.clone(), b.clone()], &[score(&a, 1), score(&b, 2)]);
        assert_eq!(m[3], Some(0.3));
        // Only a flaw that is absent: nothing subtracted, denominator floored at 1.
        assert_eq!(
            rubric_points(std::slice::from_ref(&b), &[score(&b, 0)]),
            Some(0.0)
        );
        assert_eq!(rubric_points(&[a], &[]), None);
        assert_eq!(signed_points(&[(5.0, 0.0), (-9.0, 1.0)]), -9.0 / 5.0);
    }

    #[test]
    fn points_score_clips_and_floors_denominator() {
        assert_eq!(points_score(&[(5.0, 1.0), (5.0, 0.0)]), 0.5);
        assert_eq!(points_score(&[(5.0, 0.0), (-9.0, 1.0)]), 0.0);
        assert_eq!(points_score(&[(0.5, 1.0)]), 0.5);
        assert_eq!(points_score(&[]), 0.0);
    }
}
