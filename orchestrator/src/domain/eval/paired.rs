//! Before/after comparison of one policy's evaluation on a fixed task subset: the mean of each
//! version and their difference with its spread over tasks (the paired standard error: the
//! same tasks are scored at both versions, so task difficulty cancels out of the spread).

use std::collections::BTreeMap;
use std::fmt;

/// One figure (a score or an exact-match rate) at two versions over the tasks scored at both.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Paired {
    /// Tasks with a value at both versions.
    pub tasks: usize,
    pub before: f64,
    pub after: f64,
    /// Mean of the per-task differences (= after - before).
    pub diff: f64,
    /// Standard error of that mean: sample standard deviation of the differences / sqrt(tasks);
    /// 0 with one task.
    pub se: f64,
}

impl Paired {
    /// Pair the per-task values of two versions by task key; tasks without a value at either
    /// version are left out. `None` when no task has both.
    pub fn of<K: Ord>(before: &BTreeMap<K, f64>, after: &BTreeMap<K, f64>) -> Option<Paired> {
        let pairs: Vec<(f64, f64)> = before
            .iter()
            .filter_map(|(k, b)| after.get(k).map(|a| (*b, *a)))
            .filter(|(b, a)| b.is_finite() && a.is_finite())
            .collect();
        if pairs.is_empty() {
            return None;
        }
        let n = pairs.len() as f64;
        let mean = |f: &dyn Fn(&(f64, f64)) -> f64| pairs.iter().map(f).sum::<f64>() / n;
        let diff = mean(&|p| p.1 - p.0);
        let se = if pairs.len() > 1 {
            let var = pairs
                .iter()
                .map(|p| (p.1 - p.0 - diff).powi(2))
                .sum::<f64>()
                / (n - 1.0);
            (var / n).sqrt()
        } else {
            0.0
        };
        Some(Paired {
            tasks: pairs.len(),
            before: mean(&|p| p.0),
            after: mean(&|p| p.1),
            diff,
            se,
        })
    }

    /// The difference with its spread as a report cell: `+0.1250 ± 0.0500 (16)` (tasks last).
    pub fn change(&self) -> String {
        format!("{:+.4} ± {:.4} ({})", self.diff, self.se, self.tasks)
    }
}

impl fmt::Display for Paired {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:.4} -> {:.4} ({:+.4} ± {:.4} over {} tasks)",
            self.before, self.after, self.diff, self.se, self.tasks
        )
    }
}

/// Mean and sample standard deviation of per-seed figures (`None` for the deviation of one).
pub fn mean_sd(xs: &[f64]) -> Option<(f64, Option<f64>)> {
    if xs.is_empty() {
        return None;
    }
    let n = xs.len() as f64;
    let m = xs.iter().sum::<f64>() / n;
    let sd = (xs.len() > 1)
        .then(|| (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt());
    Some((m, sd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_difference_and_its_standard_error() {
        let before = BTreeMap::from([("a", 0.0), ("b", 0.5), ("c", 1.0), ("d", 0.25)]);
        // d has no value after; e none before: both left out.
        let after = BTreeMap::from([("a", 0.5), ("b", 0.5), ("c", 1.0), ("e", 1.0)]);
        let p = Paired::of(&before, &after).unwrap();
        assert_eq!(p.tasks, 3);
        assert!((p.before - 0.5).abs() < 1e-12);
        assert!((p.after - 2.0 / 3.0).abs() < 1e-12);
        // differences 0.5, 0, 0: mean 1/6, sample variance 1/12, se sqrt(1/36) = 1/6.
        assert!((p.diff - 1.0 / 6.0).abs() < 1e-12);
        assert!((p.se - 1.0 / 6.0).abs() < 1e-12);
        assert_eq!(
            p.to_string(),
            "0.5000 -> 0.6667 (+0.1667 ± 0.1667 over 3 tasks)"
        );
    }

    #[test]
    fn no_common_task_is_none_and_one_task_has_no_spread() {
        let a = BTreeMap::from([(1, 0.2)]);
        assert_eq!(Paired::of(&a, &BTreeMap::from([(2, 0.3)])), None);
        let p = Paired::of(&a, &BTreeMap::from([(1, 0.3), (2, 1.0)])).unwrap();
        assert_eq!((p.tasks, p.se), (1, 0.0));
        assert!((p.diff - 0.1).abs() < 1e-12);
    }

    #[test]
    fn mean_and_spread_of_seeds() {
        assert_eq!(mean_sd(&[]), None);
        assert_eq!(mean_sd(&[0.5]), Some((0.5, None)));
        let (m, sd) = mean_sd(&[0.1, 0.3]).unwrap();
        assert!((m - 0.2).abs() < 1e-12);
        assert!((sd.unwrap() - 0.02f64.sqrt()).abs() < 1e-12);
    }
}
