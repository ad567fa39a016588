//! From a judged step in Postgres to the trainer's `wire` batch: per sequence the prompt and
//! segment tokens, the loss mask and stage of every token (`credit::token_credit`), behaviour
//! log-probs, the four stage advantages, the group (task) and the policy version. Built only
//! from stored rows, so a replay after a crash sends byte-identical batches.

use std::collections::{HashMap, HashSet};

use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::trajectory::{SegmentKind, Trajectory, finish};
use crate::infra::db::DbError;

/// Advantage statistics of a batch, per stage (over model tokens' sequences).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchStats {
    pub sequences: usize,
    pub tokens: usize,
    pub loss_tokens: usize,
    /// Sequences whose four advantages are all zero (in groups that were kept).
    pub zero_advantage: usize,
    /// Groups kept in the batch.
    pub groups: usize,
    /// Degenerate groups left out: every member's advantages are all zero (all rewards equal,
    /// per stage), so they would add only KL and dilute the token mean (method.md A.5.2, B.7).
    pub groups_dropped: usize,
    /// Trajectories left out because their scoring failed (never trained on as R = 0).
    pub failed_scoring: usize,
    /// Cut trajectories (`finish_reason` `length` or `repetition`) left out of the loss by
    /// `credit.overlong_filter` (their rewards still count in their group's advantages).
    pub overlong_filtered: usize,
    pub mean_abs_advantage: [f64; 4],
    pub std_advantage: [f64; 4],
    /// Mean of `step - policy_version` over sequences (how stale the behaviour policy was).
    pub staleness: f64,
}

impl BatchStats {
    pub fn metrics(&self) -> Vec<(String, f64)> {
        let mut m = vec![
            ("batch/sequences".to_string(), self.sequences as f64),
            ("batch/tokens".to_string(), self.tokens as f64),
            ("batch/loss_tokens".to_string(), self.loss_tokens as f64),
            (
                "batch/zero_advantage".to_string(),
                self.zero_advantage as f64,
            ),
            ("pipeline/staleness".to_string(), self.staleness),
            ("train/groups".to_string(), self.groups as f64),
            (
                "train/groups_dropped".to_string(),
                self.groups_dropped as f64,
            ),
            (
                "train/failed_scoring".to_string(),
                self.failed_scoring as f64,
            ),
            (
                "train/overlong_filtered".to_string(),
                self.overlong_filtered as f64,
            ),
        ];
        for (k, s) in crate::domain::trajectory::Stage::ALL.iter().enumerate() {
            m.push((
                format!("advantage/mean_abs/{}", s.as_str()),
                self.mean_abs_advantage[k],
            ));
            m.push((
                format!("advantage/std/{}", s.as_str()),
                self.std_advantage[k],
            ));
        }
        m
    }
}

/// One wire sequence from a trajectory and its stage advantages.
pub fn sequence(t: &Trajectory, adv: &[f64; 4], group: u32) -> wire::WireSequence {
    let credit = crate::domain::credit::token_credit(t, adv);
    let mut behaviour = Vec::with_capacity(credit.stage.len());
    behaviour.resize(t.prompt_token_ids.len(), 0.0f32);
    for s in &t.segments {
        match (&s.kind, &s.logprobs) {
            (SegmentKind::Model, Some(lp)) if lp.len() == s.token_ids.len() => {
                behaviour.extend_from_slice(lp)
            }
            _ => behaviour.resize(behaviour.len() + s.token_ids.len(), 0.0),
        }
    }
    let mut tokens = t.prompt_token_ids.clone();
    for s in &t.segments {
        tokens.extend_from_slice(&s.token_ids);
    }
    wire::WireSequence {
        tokens,
        loss_mask: credit.loss_mask,
        stages: credit.stage,
        behaviour_logprobs: behaviour,
        advantages: adv.iter().map(|&a| a as f32).collect(),
        group_id: group,
        policy_version: t.policy_version,
        phase: wire::Phase::Task,
    }
}

/// The RL batch of a judged step. Trajectories without model tokens are left out (nothing to
/// learn from); groups are numbered by task in stored order. `overlong_filter`: see
/// [`assemble`].
pub async fn build(
    pool: &PgPool,
    run_id: Uuid,
    step: i32,
    judge_model: &str,
    overlong_filter: bool,
) -> Result<(wire::Batch, BatchStats), DbError> {
    let trajs = crate::infra::db::trajectories::list_for_step(pool, run_id, step).await?;
    let adv = crate::pipeline::judging::load_advantages(pool, run_id, step, judge_model).await?;
    let failed = crate::infra::db::judging::failed_scoring(pool, run_id, step, judge_model).await?;
    Ok(assemble(&trajs, &adv, &failed, step, overlong_filter))
}

/// The batch of a judged step. Left out: trajectories whose scoring failed or that have no
/// stored advantages (never trained on as R = 0), trajectories without model tokens, with
/// `overlong_filter` the trajectories cut by the token budget or a loop stop (`finish::is_cut`:
/// `length`, `repetition`; their advantages were computed with them in the group, so the
/// others' credit is unchanged), and degenerate groups (every remaining member's advantages all
/// zero). Groups are numbered by task in stored order.
pub fn assemble(
    trajs: &[Trajectory],
    adv: &HashMap<Uuid, [f64; 4]>,
    failed: &HashSet<Uuid>,
    step: i32,
    overlong_filter: bool,
) -> (wire::Batch, BatchStats) {
    let mut stats = BatchStats::default();
    // Groups by task, in stored order, of the trajectories that can be trained on.
    let mut order: Vec<Uuid> = Vec::new();
    let mut members: HashMap<Uuid, Vec<(&Trajectory, [f64; 4])>> = HashMap::new();
    for t in trajs {
        let a = match adv.get(&t.id) {
            Some(a) if !failed.contains(&t.id) => *a,
            _ => {
                stats.failed_scoring += 1;
                continue;
            }
        };
        if t.num_model_tokens() == 0 {
            continue;
        }
        if overlong_filter && finish::is_cut(&t.finish_reason) {
            stats.overlong_filtered += 1;
            continue;
        }
        if !members.contains_key(&t.task_id) {
            order.push(t.task_id);
        }
        members.entry(t.task_id).or_default().push((t, a));
    }
    let mut kept: Vec<(&Trajectory, [f64; 4])> = Vec::new();
    for task in &order {
        let group = &members[task];
        if group.iter().all(|(_, a)| a.iter().all(|&x| x == 0.0)) {
            stats.groups_dropped += 1;
        } else {
            kept.extend(group.iter().copied());
        }
    }
    let mut groups: HashMap<Uuid, u32> = HashMap::new();
    let mut seqs = Vec::with_capacity(kept.len());
    let mut sums = [[0.0f64; 3]; 4]; // n, sum, sum of squares
    let mut min_version = i32::MAX;
    let mut stale = 0.0;
    for (t, a) in kept {
        let next = groups.len() as u32;
        let g = *groups.entry(t.task_id).or_insert(next);
        let seq = sequence(t, &a, g);
        if seq.tokens.len() < 2 {
            continue;
        }
        stats.sequences += 1;
        stats.tokens += seq.tokens.len();
        stats.loss_tokens += seq.loss_mask.iter().filter(|&&m| m).count();
        if a.iter().all(|&x| x == 0.0) {
            stats.zero_advantage += 1;
        }
        for ((sum, x), mean_abs) in sums.iter_mut().zip(a).zip(&mut stats.mean_abs_advantage) {
            sum[0] += 1.0;
            sum[1] += x;
            sum[2] += x * x;
            *mean_abs += x.abs();
        }
        min_version = min_version.min(t.policy_version);
        stale += f64::from(step - t.policy_version);
        seqs.push(seq);
    }
    stats.groups = groups.len();
    if stats.sequences > 0 {
        let n = stats.sequences as f64;
        for (k, sum) in sums.iter().enumerate() {
            stats.mean_abs_advantage[k] /= n;
            let mean = sum[1] / n;
            stats.std_advantage[k] = (sum[2] / n - mean * mean).max(0.0).sqrt();
        }
        stats.staleness = stale / n;
    }
    let batch = wire::Batch {
        policy_version: if min_version == i32::MAX {
            0
        } else {
            min_version
        },
        rl: true,
        seqs,
    };
    (batch, stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::trajectory::Segment;

    fn traj(task: Uuid) -> Trajectory {
        Trajectory {
            id: Uuid::now_v7(),
            run_id: Uuid::nil(),
            step: 3,
            task_id: task,
            sample_index: 0,
            policy_version: 3,
            server: String::new(),
            server_version: None,
            prompt_token_ids: vec![1, 2],
            segments: vec![Segment {
                kind: SegmentKind::Model,
                stage: Some(crate::domain::trajectory::Stage::Answer),
                token_ids: vec![3, 4, 5],
                logprobs: Some(vec![-0.5; 3]),
                text: "abc".into(),
                policy_version: Some(3),
            }],
            finish_reason: "stop".into(),
            parsed: serde_json::Value::Null,
            timings: serde_json::Value::Null,
        }
    }

    #[test]
    fn degenerate_groups_and_failed_scoring_never_reach_the_batch() {
        let (a, b, c) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        // Task a: a real group; task b: all rewards equal (all advantages 0); task c: one member
        // failed scoring, the other has no stored advantages at all.
        let ta = [traj(a), traj(a)];
        let tb = [traj(b), traj(b)];
        let tc = [traj(c), traj(c)];
        let mut adv = HashMap::new();
        adv.insert(ta[0].id, [1.0, 0.5, 0.0, 1.0]);
        adv.insert(ta[1].id, [-1.0, -0.5, 0.0, -1.0]);
        adv.insert(tb[0].id, [0.0; 4]);
        adv.insert(tb[1].id, [0.0; 4]);
        adv.insert(tc[0].id, [1.0; 4]);
        let failed: HashSet<Uuid> = [tc[0].id].into_iter().collect();
        let all: Vec<Trajectory> = ta.iter().chain(&tb).chain(&tc).cloned().collect();
        let (batch, stats) = assemble(&all, &adv, &failed, 3, false);
        assert_eq!(batch.seqs.len(), 2, "only task a's group is trained on");
        assert!(batch.seqs.iter().all(|s| s.group_id == 0));
        assert_eq!(stats.groups, 1);
        assert_eq!(stats.groups_dropped, 1);
        assert_eq!(stats.failed_scoring, 2);
        let m: HashMap<String, f64> = stats.metrics().into_iter().collect();
        assert_eq!(m["train/groups_dropped"], 1.0);
        assert_eq!(m["train/failed_scoring"], 2.0);

        // Every group degenerate: nothing to train.
        let (batch, stats) = assemble(&tb, &adv, &HashSet::new(), 3, false);
        assert!(batch.seqs.is_empty());
        assert_eq!((stats.groups, stats.groups_dropped), (0, 1));
    }

    #[test]
    fn overlong_filtering_leaves_budget_cut_trajectories_out_of_the_loss_only_when_asked() {
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        // Task a: two finished members and one cut by the budget (reward 0, so the finished
        // ones carry positive advantages computed against it). Task b: one finished member at
        // advantage 0 and one stopped in a loop (`repetition`, a cut too): once the cut one is
        // out, the group is degenerate.
        let mut ta = [traj(a), traj(a), traj(a)];
        ta[2].finish_reason = finish::LENGTH.into();
        let mut tb = [traj(b), traj(b)];
        tb[1].finish_reason = finish::REPETITION.into();
        let mut adv = HashMap::new();
        adv.insert(ta[0].id, [0.7; 4]);
        adv.insert(ta[1].id, [0.7; 4]);
        adv.insert(ta[2].id, [-1.4; 4]);
        adv.insert(tb[0].id, [0.0; 4]);
        adv.insert(tb[1].id, [-0.5; 4]);
        let all: Vec<Trajectory> = ta.iter().chain(&tb).cloned().collect();

        let (off, s_off) = assemble(&all, &adv, &HashSet::new(), 3, false);
        assert_eq!(
            off.seqs.len(),
            5,
            "without the filter every member is trained on"
        );
        assert_eq!((s_off.overlong_filtered, s_off.groups), (0, 2));

        let (on, s_on) = assemble(&all, &adv, &HashSet::new(), 3, true);
        assert_eq!(s_on.overlong_filtered, 2);
        assert_eq!(
            s_on.groups, 1,
            "task b is degenerate without its cut member"
        );
        assert_eq!(s_on.groups_dropped, 1);
        assert_eq!(on.seqs.len(), 2);
        // The finished members keep the advantages computed with the cut one in the group.
        assert!(on.seqs.iter().all(|q| q.advantages == vec![0.7f32; 4]));
        let m: HashMap<String, f64> = s_on.metrics().into_iter().collect();
        assert_eq!(m["train/overlong_filtered"], 2.0);
    }
}
