//! Which tasks a step rolls out: a deterministic function of (seed, step), so a resumed run
//! picks exactly the tasks the interrupted one would have, with no generator state to save.
//! Tasks are visited in epochs; each epoch is a fresh seeded permutation of the whole set, cut
//! into whole steps: the last `num_tasks % per_step` tasks of an epoch's permutation wait for a
//! later epoch (a data loader's `drop_last`), so no step straddles two epochs and a step never
//! holds a task twice (its trajectories are keyed by task and sample).
//! Recipes with the meta-policy use the windowed curriculum (method.md A.7) on top: windows of
//! 2K steps, K new batches then their replay in the same order; the position is a function of
//! the step, so it is part of every checkpoint by construction. `Inject` says which of the
//! bank's items each phase's training prompts carry (`reflection.inject`).

use crate::domain::bank::{Retrieved, Reuse};
use crate::domain::data::world::Rng;

/// Indices (into the task list) of the `per_step` tasks of `step`, distinct within the step.
pub fn tasks_for_step(num_tasks: usize, per_step: usize, seed: u64, step: u32) -> Vec<usize> {
    if num_tasks == 0 || per_step == 0 {
        return Vec::new();
    }
    let per_step = per_step.min(num_tasks);
    let steps_per_epoch = num_tasks / per_step;
    let epoch = step as usize / steps_per_epoch;
    let start = (step as usize % steps_per_epoch) * per_step;
    permutation(num_tasks, seed, epoch as u64)[start..start + per_step].to_vec()
}

/// The `k` task indices (ascending) held out of training for evaluation: a seeded random pick,
/// independent of the training permutations, so every recipe of an experiment holds out the
/// same tasks.
pub fn held_out(num_tasks: usize, k: usize, seed: u64) -> Vec<usize> {
    let mut v = permutation(num_tasks, seed ^ 0x5EED_E7A1_0000_0001, u64::MAX);
    v.truncate(k.min(num_tasks));
    v.sort_unstable();
    v
}

/// The phase of a curriculum step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// A fresh batch: cross-episode retrieval; its trajectories are reflected on.
    New,
    /// The replay of the new batch K steps earlier: within-episode retrieval.
    Replay,
}

/// Which bank items a training prompt carries (`reflection.inject`). The curriculum's phases
/// decide the kind a step would draw on; the setting keeps or drops each kind. The bank is
/// written either way, and evaluations choose their own reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Inject {
    /// RubricEM's (method.md A.7): new steps cross-episode, replays within-episode, a replayed
    /// question without an item falling back to cross-episode.
    #[default]
    Curriculum,
    /// New steps cross-episode; replays carry nothing.
    Cross,
    /// Replays carry their own question's item; new steps and a replay's miss carry nothing.
    Within,
    /// No training prompt carries a block (the curriculum and the bank remain).
    None,
}

impl Inject {
    pub fn is_curriculum(&self) -> bool {
        *self == Inject::Curriculum
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Inject::Curriculum => "curriculum",
            Inject::Cross => "cross",
            Inject::Within => "within",
            Inject::None => "none",
        }
    }

    /// The memory a step of `phase` draws on.
    pub fn reuse(self, phase: Phase) -> Reuse {
        match (self, phase) {
            (Inject::Curriculum | Inject::Cross, Phase::New) => Reuse::Cross,
            (Inject::Curriculum | Inject::Within, Phase::Replay) => Reuse::Within,
            _ => Reuse::None,
        }
    }

    /// Whether a replayed question without an item of its own falls back to cross-episode.
    pub fn falls_back(self) -> bool {
        self == Inject::Curriculum
    }

    /// What a training prompt of `phase` carries of what the bank served for it (asked with
    /// [`Inject::reuse`]): a kind this setting leaves out, e.g. the cross-episode fallback of
    /// a replayed question under `within`, becomes nothing.
    pub fn keep(self, phase: Phase, got: Retrieved) -> Retrieved {
        let want = self.reuse(phase);
        let mode = got.mode();
        if mode == Reuse::None || mode == want || (self.falls_back() && want == Reuse::Within) {
            got
        } else {
            Retrieved::Nothing
        }
    }
}

/// Where a step sits in the windowed curriculum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub window: u32,
    pub phase: Phase,
    /// Index of the new batch this step rolls out (fed to [`tasks_for_step`]); a replay step
    /// has the index of the step it replays.
    pub batch: u32,
}

/// Windowed curriculum with `k` new batches per window.
pub fn windowed(step: u32, k: u32) -> Slot {
    let k = k.max(1);
    let window = step / (2 * k);
    let pos = step % (2 * k);
    if pos < k {
        Slot {
            window,
            phase: Phase::New,
            batch: window * k + pos,
        }
    } else {
        Slot {
            window,
            phase: Phase::Replay,
            batch: window * k + pos - k,
        }
    }
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
    fn inject_keeps_or_drops_each_phase_s_kind() {
        use Phase::{New, Replay};
        let got: Vec<(Reuse, Reuse, bool)> = [
            Inject::Curriculum,
            Inject::Cross,
            Inject::Within,
            Inject::None,
        ]
        .iter()
        .map(|i| (i.reuse(New), i.reuse(Replay), i.falls_back()))
        .collect();
        assert_eq!(
            got,
            vec![
                (Reuse::Cross, Reuse::Within, true),
                (Reuse::Cross, Reuse::None, false),
                (Reuse::None, Reuse::Within, false),
                (Reuse::None, Reuse::None, false),
            ]
        );
        assert_eq!(Inject::default(), Inject::Curriculum);
    }

    #[test]
    fn inject_drops_the_kinds_it_leaves_out_and_the_fallback_outside_the_curriculum() {
        use Phase::{New, Replay};
        let item = |q: &str| crate::domain::bank::BankItem {
            task_id: uuid::Uuid::from_u128(1),
            question: q.into(),
            question_sha256: crate::domain::bank::question_hash(q),
            embedding: vec![1.0],
            rubrics: "r".into(),
            takeaways: "t".into(),
            score: 0.5,
            step: 0,
            reflection_id: None,
        };
        let within = Retrieved::Within(item("a"));
        let cross = Retrieved::Cross(vec![(item("b"), 0.9)]);
        let kept = |i: Inject, p: Phase, r: &Retrieved| i.keep(p, r.clone()).mode();
        // The curriculum keeps what it asked for, and the cross-episode fallback of a replay.
        assert_eq!(kept(Inject::Curriculum, New, &cross), Reuse::Cross);
        assert_eq!(kept(Inject::Curriculum, Replay, &within), Reuse::Within);
        assert_eq!(kept(Inject::Curriculum, Replay, &cross), Reuse::Cross);
        // `within`: a replay's own item only; its fallback and new steps carry nothing.
        assert_eq!(kept(Inject::Within, Replay, &within), Reuse::Within);
        assert_eq!(kept(Inject::Within, Replay, &cross), Reuse::None);
        assert_eq!(kept(Inject::Within, New, &cross), Reuse::None);
        // `cross`: new steps only.
        assert_eq!(kept(Inject::Cross, New, &cross), Reuse::Cross);
        assert_eq!(kept(Inject::Cross, Replay, &within), Reuse::None);
        assert_eq!(kept(Inject::Cross, Replay, &cross), Reuse::None);
        // `none`: nothing, whatever was served.
        for p in [New, Replay] {
            for r in [&within, &cross] {
                assert_eq!(kept(Inject::None, p, r), Reuse::None);
            }
        }
        assert_eq!(
            Inject::Within.keep(Replay, within.clone()),
            within,
            "a kept item is unchanged"
        );
    }

    #[test]
    fn windowed_curriculum_over_two_windows() {
        let k = 3;
        let got: Vec<(u32, Phase, u32)> = (0..12)
            .map(|s| {
                let x = windowed(s, k);
                (x.window, x.phase, x.batch)
            })
            .collect();
        use Phase::{New, Replay};
        assert_eq!(
            got,
            vec![
                (0, New, 0),
                (0, New, 1),
                (0, New, 2),
                (0, Replay, 0),
                (0, Replay, 1),
                (0, Replay, 2),
                (1, New, 3),
                (1, New, 4),
                (1, New, 5),
                (1, Replay, 3),
                (1, Replay, 4),
                (1, Replay, 5),
            ]
        );
        // A replay rolls out exactly the tasks of the new step it replays, K steps later.
        for s in 0..12u32 {
            let x = windowed(s, k);
            if x.phase == Replay {
                let src = windowed(s - k, k);
                assert_eq!(src.phase, New);
                assert_eq!(
                    tasks_for_step(50, 4, 9, x.batch),
                    tasks_for_step(50, 4, 9, src.batch)
                );
            }
        }
        // New batches walk the plain schedule without gaps.
        let news: Vec<u32> = (0..12)
            .map(|s| windowed(s, k))
            .filter(|x| x.phase == New)
            .map(|x| x.batch)
            .collect();
        assert_eq!(news, (0..6).collect::<Vec<_>>());
    }

    #[test]
    fn held_out_is_a_fixed_seeded_pick() {
        let a = held_out(96, 8, 17);
        assert_eq!(a.len(), 8);
        assert!(
            a.windows(2).all(|w| w[0] < w[1]),
            "ascending, distinct: {a:?}"
        );
        assert!(a.iter().all(|&i| i < 96));
        assert_eq!(a, held_out(96, 8, 17), "same seed, same subset");
        assert_ne!(a, held_out(96, 8, 18), "another seed, another subset");
        assert_ne!(a, (0..8).collect::<Vec<_>>(), "not simply the first tasks");
        // A larger pick extends the smaller one (same permutation prefix).
        let b = held_out(96, 12, 17);
        assert!(a.iter().all(|i| b.contains(i)));
        assert_eq!(
            held_out(5, 9, 1),
            vec![0, 1, 2, 3, 4],
            "capped at the task count"
        );
        assert!(held_out(0, 3, 1).is_empty());
    }

    #[test]
    fn epochs_cover_every_task_once_and_repeat_deterministically() {
        let (n, per) = (12, 4);
        let mut seen = Vec::new();
        for s in 0..6 {
            let t = tasks_for_step(n, per, 3, s);
            assert_eq!(t.len(), per);
            assert_eq!(
                t,
                tasks_for_step(n, per, 3, s),
                "same seed and step, same tasks"
            );
            seen.extend(t);
        }
        // Steps 0..6 cover 24 slots = two whole epochs, each a different permutation.
        for epoch in seen.chunks(12) {
            let mut e = epoch.to_vec();
            e.sort_unstable();
            assert_eq!(e, (0..12).collect::<Vec<_>>());
        }
        assert_ne!(seen[..12], seen[12..]);
        assert_ne!(tasks_for_step(n, per, 3, 0), tasks_for_step(n, per, 4, 0));
        assert!(tasks_for_step(0, 4, 1, 0).is_empty());
        assert_eq!(
            tasks_for_step(3, 8, 1, 0).len(),
            3,
            "capped at the task count"
        );
    }

    /// How many different tasks `v` holds.
    fn distinct(v: &[usize]) -> usize {
        let mut d = v.to_vec();
        d.sort_unstable();
        d.dedup();
        d.len()
    }

    /// Session 55: 260 tasks, 8 a step, seed 19. Step 32 took the last 4 of the first epoch's
    /// permutation and the first 4 of the second's, one task came twice, and inserting its
    /// trajectories failed the run on the (run, step, task, sample) key.
    #[test]
    fn a_step_never_holds_a_task_twice_across_epochs() {
        let cases = [(260, 8), (10, 4), (7, 3), (5, 5), (9, 2)];
        assert!(
            cases.iter().any(|&(n, per)| n % per != 0),
            "the cases include task counts no step size divides"
        );
        for (n, per) in cases {
            let per_epoch = n / per;
            for seed in 0..40u64 {
                for step in 0..(3 * per_epoch as u32 + 2) {
                    let t = tasks_for_step(n, per, seed, step);
                    assert_eq!(
                        distinct(&t),
                        per,
                        "n {n} per {per} seed {seed} step {step}: {t:?}"
                    );
                    assert!(t.iter().all(|&i| i < n));
                }
                // A whole epoch is `per_epoch` steps of distinct tasks; the next starts afresh.
                let epoch: Vec<usize> = (0..per_epoch as u32)
                    .flat_map(|s| tasks_for_step(n, per, seed, s))
                    .collect();
                assert_eq!(distinct(&epoch), per_epoch * per);
            }
        }
        // The rule before session 55 (slots k = step * per_step.., epoch k / n) gave the failed
        // run's step a repeated task; this one gives it 8 distinct tasks of the second epoch.
        let before: Vec<usize> = (32 * 8..33 * 8)
            .map(|k: usize| permutation(260, 19, (k / 260) as u64)[k % 260])
            .collect();
        assert!(distinct(&before) < 8, "the recorded collision: {before:?}");
        assert_eq!(tasks_for_step(260, 8, 19, 32), permutation(260, 19, 1)[..8]);
    }
}
