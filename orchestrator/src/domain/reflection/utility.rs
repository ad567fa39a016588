//! From the reflection judge's grades to utilities, the bank's pick and GRPO advantages over one
//! candidate group (method.md A.6.2).

use crate::domain::judge::ReflectionGrade;

/// A candidate's utility and the parts it was made of.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Utility {
    pub grade: ReflectionGrade,
    /// `(0.4 DA + 0.3 Spec) / 0.7`
    pub within: f64,
    /// `(0.4 DA + 0.3 Scope) / 0.7`
    pub cross: f64,
    /// `(within + cross) / 2`
    pub u: f64,
}

/// method.md A.6.2 (PROPOSED mapping): within- and cross-episode usefulness from the three
/// dimensions, averaged. Dimensions are clamped to [0, 1].
pub fn utility(g: ReflectionGrade) -> Utility {
    let c = |x: f64| {
        if x.is_finite() {
            x.clamp(0.0, 1.0)
        } else {
            0.0
        }
    };
    let (da, spec, scope) = (c(g.diagnostic_accuracy), c(g.specificity), c(g.scope));
    let within = (0.4 * da + 0.3 * spec) / 0.7;
    let cross = (0.4 * da + 0.3 * scope) / 0.7;
    Utility {
        grade: g,
        within,
        cross,
        u: 0.5 * (within + cross),
    }
}

/// The best valid candidate (`None` = invalid): highest utility, ties to the lowest index; only
/// if it reaches `accept` (0 accepts any valid one).
pub fn best_valid(us: &[Option<f64>], accept: f64) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, u) in us.iter().enumerate() {
        if let Some(u) = *u
            && best.is_none_or(|(_, b)| u > b)
        {
            best = Some((i, u));
        }
    }
    best.filter(|&(_, u)| u >= accept).map(|(i, _)| i)
}

/// GRPO advantages over one candidate group: `(u - mean) / (std + 1e-6)`; all zero when the
/// group has no spread.
pub fn group_advantages(us: &[f64]) -> Vec<f64> {
    let n = us.len() as f64;
    if us.is_empty() {
        return vec![];
    }
    let mean = us.iter().sum::<f64>() / n;
    let var = us.iter().map(|u| (u - mean).powi(2)).sum::<f64>() / n;
    let std = var.sqrt();
    if std < 1e-9 {
        return vec![0.0; us.len()];
    }
    us.iter().map(|u| (u - mean) / (std + 1e-6)).collect()
}
