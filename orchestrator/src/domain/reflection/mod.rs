//! The reflection meta-policy (method.md A.6): for each task of a new-query step, one of its
//! trajectories (uniform, seeded) is shown to the shared policy, which writes m post-mortem
//! candidates (`<reflection_rubrics>` + `<reflection_takeaways>`); the judge grades the valid ones
//! on diagnostic accuracy, specificity and scope with the trajectory's findings in view; the
//! utilities become GRPO advantages over the m candidates (trained one step later, on
//! reflection tokens only) and the best valid candidate is written to the rubric bank.
//!
//! This module holds the maths and types (`parse`: validity, `utility`: grades to utilities and
//! advantages); the job that generates, grades and stores candidates is
//! `pipeline::reflection`.

pub mod demo;
pub mod parse;
pub mod utility;

pub use parse::{Blocks, STOP, parse};
pub use utility::{Utility, best_valid, group_advantages, utility};

use crate::domain::trajectory::Trajectory;
use crate::domain::util::mix_seed;

/// Which of a task's trajectories is reflected on: uniform, from the run seed, step and task
/// (its `task_key`; no score or length selection, method.md A.6.1).
pub fn pick(n: usize, seed: u64, step: i32, task: u64) -> usize {
    if n == 0 {
        return 0;
    }
    (mix_seed(mix_seed(seed ^ 0x5eed_2ef1, step as u64), task) % n as u64) as usize
}

/// The raw trajectory the reflection reads: every segment's text in order (model text and tool
/// outputs), cut to `max_chars` with head and tail kept so the answer stays visible.
pub fn trajectory_text(t: &Trajectory, max_chars: usize) -> String {
    let full: String = t.segments.iter().map(|s| s.text.as_str()).collect();
    crate::domain::judge::view::clip_middle(&full, max_chars)
}

/// Sampling settings of the meta-policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub candidates: u32,
    pub temperature: f32,
    pub top_p: f32,
    pub max_tokens: u32,
    pub accept_threshold: f64,
    pub max_trajectory_chars: usize,
}

impl Settings {
    pub fn from_config(c: &crate::domain::config::ReflectionConfig) -> Self {
        Self {
            candidates: c.candidates,
            temperature: c.temperature,
            top_p: c.top_p,
            max_tokens: c.max_tokens,
            accept_threshold: c.accept_threshold,
            max_trajectory_chars: c.max_trajectory_chars,
        }
    }
}

/// What a job did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobReport {
    pub tasks: usize,
    pub candidates: usize,
    pub valid: usize,
    pub bank_writes: usize,
    pub mean_utility: f64,
    pub best_utility: f64,
    pub tokens: usize,
    pub judge_prompt_tokens: u64,
    pub judge_completion_tokens: u64,
    pub judge_cost_usd: f64,
    pub seconds: f64,
}

impl JobReport {
    pub fn metrics(&self) -> Vec<(String, f64)> {
        vec![
            ("reflection/tasks".into(), self.tasks as f64),
            ("reflection/candidates".into(), self.candidates as f64),
            (
                "reflection/valid_fraction".into(),
                self.valid as f64 / (self.candidates.max(1)) as f64,
            ),
            ("reflection/bank_writes".into(), self.bank_writes as f64),
            ("reflection/utility_mean".into(), self.mean_utility),
            ("reflection/utility_best".into(), self.best_utility),
            ("reflection/tokens".into(), self.tokens as f64),
            (
                "reflection/judge_prompt_tokens".into(),
                self.judge_prompt_tokens as f64,
            ),
            (
                "reflection/judge_completion_tokens".into(),
                self.judge_completion_tokens as f64,
            ),
            ("reflection/judge_cost_usd".into(), self.judge_cost_usd),
            ("time/reflection_s".into(), self.seconds),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::judge::ReflectionGrade;

    const GOOD: &str = "<reflection_rubrics>\nCritical Requirement: x\n</reflection_rubrics>\n<reflection_takeaways>\n- check the date\n</reflection_takeaways>";

    #[test]
    fn validity_needs_both_blocks_closed_and_non_empty() {
        let b = parse(GOOD).unwrap();
        assert_eq!(b.rubrics, "Critical Requirement: x");
        assert_eq!(b.takeaways, "- check the date");
        assert!(parse("<reflection_rubrics>x</reflection_rubrics>").is_none());
        assert!(parse("<reflection_takeaways>y</reflection_takeaways>").is_none());
        assert!(parse("<reflection_rubrics> \n </reflection_rubrics><reflection_takeaways>y</reflection_takeaways>").is_none());
        assert!(
            parse("<reflection_rubrics>x</reflection_rubrics><reflection_takeaways>y").is_none()
        );
        assert!(parse("").is_none());
    }

    #[test]
    fn utility_combines_within_and_cross() {
        let u = utility(ReflectionGrade {
            diagnostic_accuracy: 1.0,
            specificity: 0.5,
            scope: 0.0,
        });
        assert!((u.within - (0.4 + 0.15) / 0.7).abs() < 1e-12);
        assert!((u.cross - 0.4 / 0.7).abs() < 1e-12);
        assert!((u.u - 0.5 * (u.within + u.cross)).abs() < 1e-12);
        // Equal to the single weighted total when spec == scope.
        let v = utility(ReflectionGrade {
            diagnostic_accuracy: 0.6,
            specificity: 0.3,
            scope: 0.3,
        });
        assert!((v.within - v.cross).abs() < 1e-12 && (v.u - v.within).abs() < 1e-12);
        assert!((v.u - (0.4 * 0.6 + 0.3 * 0.3) / 0.7).abs() < 1e-12);
        // Out-of-range and NaN dimensions are clamped.
        let w = utility(ReflectionGrade {
            diagnostic_accuracy: f64::NAN,
            specificity: 7.0,
            scope: -1.0,
        });
        assert!((w.within - 0.3 / 0.7).abs() < 1e-12 && w.cross == 0.0);
    }

    #[test]
    fn best_valid_skips_invalid_breaks_ties_low_and_gates() {
        assert_eq!(
            best_valid(&[None, Some(0.2), Some(0.9), Some(0.9)], 0.0),
            Some(2)
        );
        assert_eq!(best_valid(&[None, None], 0.0), None);
        assert_eq!(best_valid(&[Some(0.0)], 0.0), Some(0));
        assert_eq!(best_valid(&[Some(0.4), Some(0.3)], 0.5), None);
    }

    #[test]
    fn advantages_are_group_normalised() {
        let a = group_advantages(&[0.0, 0.5, 1.0]);
        assert!((a.iter().sum::<f64>()).abs() < 1e-9);
        assert!(a[0] < 0.0 && a[2] > 0.0);
        assert_eq!(group_advantages(&[0.3, 0.3]), vec![0.0, 0.0]);
    }

    #[test]
    fn pick_is_deterministic_and_covers_the_group() {
        let task = crate::domain::util::task_key("world", "w17-h00000");
        assert_eq!(pick(8, 1, 3, task), pick(8, 1, 3, task));
        let seen: std::collections::BTreeSet<usize> =
            (0..200).map(|s| pick(4, 7, s, task)).collect();
        assert_eq!(seen.len(), 4);
    }
}
