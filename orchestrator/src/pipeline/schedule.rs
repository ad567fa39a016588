//! Which tasks a step rolls out: a deterministic function of (seed, step), so a resumed run
//! picks exactly the tasks the interrupted one would have, with no generator state to save.
//! Tasks are visited in epochs; each epoch is a fresh seeded permutation of the whole set.

use crate::data::world::Rng;

/// Indices (into the task list) of the `per_step` tasks of `step`.
pub fn tasks_for_step(num_tasks: usize, per_step: usize, seed: u64, step: u32) -> Vec<usize> {
    if num_tasks == 0 || per_step == 0 {
        return Vec::new();
    }
    let per_step = per_step.min(num_tasks);
    let start = step as usize * per_step;
    (start..start + per_step)
        .map(|k| {
            let epoch = k / num_tasks;
            permutation(num_tasks, seed, epoch as u64)[k % num_tasks]
        })
        .collect()
}

/// A Fisher-Yates permutation of 0..n seeded by (seed, epoch).
fn permutation(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut rng = Rng::new(seed ^ epoch.wrapping_mul(0xA24B_AED4_963E_E407));
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.below(i + 1);
        v.swap(i, j);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_cover_every_task_once_and_repeat_deterministically() {
        let (n, per) = (10, 4);
        let mut seen = Vec::new();
        for s in 0..5 {
            let t = tasks_for_step(n, per, 3, s);
            assert_eq!(t.len(), per);
            assert_eq!(
                t,
                tasks_for_step(n, per, 3, s),
                "same seed and step, same tasks"
            );
            seen.extend(t);
        }
        // Steps 0..5 cover 20 slots = two whole epochs.
        let mut first: Vec<usize> = seen[..10].to_vec();
        first.sort_unstable();
        assert_eq!(first, (0..10).collect::<Vec<_>>());
        let mut second: Vec<usize> = seen[10..20].to_vec();
        second.sort_unstable();
        assert_eq!(second, (0..10).collect::<Vec<_>>());
        assert_ne!(tasks_for_step(n, per, 3, 0), tasks_for_step(n, per, 4, 0));
        assert!(tasks_for_step(0, 4, 1, 0).is_empty());
        assert_eq!(
            tasks_for_step(3, 8, 1, 0).len(),
            3,
            "capped at the task count"
        );
    }
}
