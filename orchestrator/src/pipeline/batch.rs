//! From a judged step in Postgres to the trainer's `wire` batch: per sequence the prompt and
//! segment tokens, the loss mask and stage of every token (`credit::token_credit`), behaviour
//! log-probs, the four stage advantages, the group (task) and the policy version, and, with
//! `trainer.loop_unlikelihood`, which tokens of a loop-stopped attempt's loop the trainer's
//! unlikelihood term pushes down. Built only from stored rows, so a replay after a crash sends
//! byte-identical batches.

use std::collections::{HashMap, HashSet};

use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::config::{BatchCredit, CutCredit, RepetitionDetection};
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
    /// Loop-stopped trajectories whose tokens before the loop were left out of the loss
    /// (`credit.loop_tokens_only`), and the loop tokens they kept.
    pub loop_only: usize,
    pub loop_only_tokens: usize,
    /// Loop-stopped trajectories in which the rule found no closing loop (a server that stops
    /// by another rule): trained whole, as before, and counted.
    pub loop_not_found: usize,
    /// Loop-stopped trajectories whose loop's repeated copies carry the unlikelihood term
    /// (`trainer.loop_unlikelihood`), and those tokens.
    pub unlikelihood: usize,
    pub unlikelihood_tokens: usize,
    /// Loop-stopped trajectories trained with a negative advantage at some stage (what
    /// `credit.loop_negative_advantage_scale` puts in the batch under positive-only credit).
    pub loop_negative: usize,
    pub mean_abs_advantage: [f64; 4],
    pub std_advantage: [f64; 4],
    /// Mean of `step - policy_version` over sequences (how stale the behaviour policy was).
    pub staleness: f64,
    /// Demonstrations trained on (off-policy guidance: server `teacher`) and their mean
    /// advantage (over the four stages and the demonstrations).
    pub guidance: usize,
    pub guidance_advantage: f64,
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
            ("train/loop_only".to_string(), self.loop_only as f64),
            (
                "train/loop_only_tokens".to_string(),
                self.loop_only_tokens as f64,
            ),
            (
                "train/loop_not_found".to_string(),
                self.loop_not_found as f64,
            ),
            ("batch/unlikelihood".to_string(), self.unlikelihood as f64),
            (
                "batch/unlikelihood_tokens".to_string(),
                self.unlikelihood_tokens as f64,
            ),
            ("train/loop_negative".to_string(), self.loop_negative as f64),
        ];
        if self.guidance > 0 {
            m.push(("batch/guidance".to_string(), self.guidance as f64));
            m.push((
                "batch/guidance_advantage".to_string(),
                self.guidance_advantage,
            ));
        }
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
        unlikelihood: Vec::new(),
        stages: credit.stage,
        behaviour_logprobs: behaviour,
        advantages: adv.iter().map(|&a| a as f32).collect(),
        group_id: group,
        policy_version: t.policy_version,
        phase: wire::Phase::Task,
        // A demonstration (`credit.guidance_demos`): no policy server sampled it.
        off_policy: t.server == crate::domain::trajectory::TEACHER,
    }
}

/// The RL batch of a judged step. Trajectories without model tokens are left out (nothing to
/// learn from); groups are numbered by task in stored order. `credit`: see [`assemble`].
pub async fn build(
    pool: &PgPool,
    run_id: Uuid,
    step: i32,
    judge_model: &str,
    credit: BatchCredit,
) -> Result<(wire::Batch, BatchStats), DbError> {
    let trajs = crate::infra::db::trajectories::list_for_step(pool, run_id, step).await?;
    let adv = crate::pipeline::judging::load_advantages(pool, run_id, step, judge_model).await?;
    let failed = crate::infra::db::judging::failed_scoring(pool, run_id, step, judge_model).await?;
    Ok(assemble(&trajs, &adv, &failed, step, credit))
}

/// The batch of a judged step. Left out: trajectories whose scoring failed or that have no
/// stored advantages (never trained on as R = 0), trajectories without model tokens, with
/// [`CutCredit::Drop`] the trajectories cut by the token budget or a loop stop
/// (`finish::is_cut`: `length`, `repetition`; their advantages were computed with them in the
/// group, so the others' credit is unchanged), and degenerate groups (every remaining member's
/// advantages all zero). With [`CutCredit::LoopOnly`] a loop-stopped trajectory's tokens before
/// its loop leave the loss. With `credit.unlikelihood` the tokens of its loop after the loop's
/// first copy (each later copy, the decision to repeat included) are marked for the trainer's
/// unlikelihood term; the first copy is text the attempt wrote once. Negative advantages are
/// multiplied by `credit.negative_scale` (a loop-stopped trajectory's by
/// `credit.loop_negative_scale` when set) after the degenerate-group test (a group with signal
/// keeps its members, a scaled-away member still counts in the loss's token normaliser); the
/// advantage statistics are of what is trained. Groups are numbered by task in stored order.
pub fn assemble(
    trajs: &[Trajectory],
    adv: &HashMap<Uuid, [f64; 4]>,
    failed: &HashSet<Uuid>,
    step: i32,
    credit: impl Into<BatchCredit>,
) -> (wire::Batch, BatchStats) {
    let credit = credit.into();
    let cut = credit.cut;
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
        if cut == CutCredit::Drop && finish::is_cut(&t.finish_reason) {
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
        let looped = t.finish_reason == finish::REPETITION;
        let a = credit.trained_advantages(a, looped);
        if looped && a.iter().any(|&x| x < 0.0) {
            stats.loop_negative += 1;
        }
        let next = groups.len() as u32;
        let g = *groups.entry(t.task_id).or_insert(next);
        let mut seq = sequence(t, &a, g);
        if seq.tokens.len() < 2 {
            continue;
        }
        if let Some(rule) = credit.loop_rule()
            && looped
        {
            match loop_tokens(t, &rule) {
                Some(n) => {
                    let start = seq.loss_mask.len() - n;
                    if let CutCredit::LoopOnly(_) = cut {
                        seq.loss_mask[..start].fill(false);
                        stats.loop_only += 1;
                        stats.loop_only_tokens += n;
                    }
                    if credit.unlikelihood.is_some() {
                        // The block size: the loop is `min_count` copies of it.
                        let block = n / rule.min_count.max(1) as usize;
                        let marks: Vec<bool> = (0..seq.loss_mask.len())
                            .map(|i| i >= start + block && seq.loss_mask[i])
                            .collect();
                        let k = marks.iter().filter(|&&m| m).count();
                        if k > 0 {
                            seq.unlikelihood = marks;
                            stats.unlikelihood += 1;
                            stats.unlikelihood_tokens += k;
                        }
                    }
                }
                None => stats.loop_not_found += 1,
            }
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
        if t.server == crate::domain::trajectory::TEACHER {
            stats.guidance += 1;
            stats.guidance_advantage += a.iter().sum::<f64>() / 4.0;
        }
        min_version = min_version.min(t.policy_version);
        stale += f64::from(step - t.policy_version);
        seqs.push(seq);
    }
    stats.groups = groups.len();
    if stats.guidance > 0 {
        stats.guidance_advantage /= stats.guidance as f64;
    }
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

/// The tokens of the loop that closes a loop-stopped trajectory: the rule's span over the model
/// tokens of its final turn (its trailing model segments, which may span stages). `None` when
/// the trajectory does not end in model tokens closing such a loop.
fn loop_tokens(t: &Trajectory, rule: &RepetitionDetection) -> Option<usize> {
    let start = t
        .segments
        .iter()
        .rposition(|s| s.kind != SegmentKind::Model)
        .map_or(0, |i| i + 1);
    let turn: Vec<u32> = t.segments[start..]
        .iter()
        .flat_map(|s| s.token_ids.iter().copied())
        .collect();
    rule.loop_len(&turn)
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
        let (batch, stats) = assemble(&all, &adv, &failed, 3, CutCredit::Whole);
        assert_eq!(batch.seqs.len(), 2, "only task a's group is trained on");
        assert!(batch.seqs.iter().all(|s| s.group_id == 0));
        assert_eq!(stats.groups, 1);
        assert_eq!(stats.groups_dropped, 1);
        assert_eq!(stats.failed_scoring, 2);
        let m: HashMap<String, f64> = stats.metrics().into_iter().collect();
        assert_eq!(m["train/groups_dropped"], 1.0);
        assert_eq!(m["train/failed_scoring"], 2.0);

        // Every group degenerate: nothing to train.
        let (batch, stats) = assemble(&tb, &adv, &HashSet::new(), 3, CutCredit::Whole);
        assert!(batch.seqs.is_empty());
        assert_eq!((stats.groups, stats.groups_dropped), (0, 1));
    }

    #[test]
    fn demonstrations_are_trained_with_their_group_and_counted_apart() {
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        // Task a: two samples and a demonstration that scored above them; task b: a
        // demonstration in a group whose members all scored alike (dropped with it).
        let mut ta = [traj(a), traj(a), traj(a)];
        ta[2].server = crate::domain::trajectory::TEACHER.into();
        ta[2].sample_index = 2;
        ta[2].segments[0].logprobs = Some(vec![0.0; 3]);
        let mut tb = [traj(b), traj(b)];
        tb[1].server = crate::domain::trajectory::TEACHER.into();
        let mut adv = HashMap::new();
        adv.insert(ta[0].id, [-0.5; 4]);
        adv.insert(ta[1].id, [-1.0; 4]);
        adv.insert(ta[2].id, [1.5, 1.0, 1.5, 2.0]);
        adv.insert(tb[0].id, [0.0; 4]);
        adv.insert(tb[1].id, [0.0; 4]);
        let all: Vec<Trajectory> = ta.iter().chain(&tb).cloned().collect();
        let (batch, stats) = assemble(&all, &adv, &HashSet::new(), 3, CutCredit::Whole);
        assert_eq!(batch.seqs.len(), 3);
        assert!(batch.seqs.iter().all(|s| s.group_id == 0));
        // The demonstration's tokens go out with behaviour log-prob 0 ("not recorded"), marked
        // off-policy; the policy's own samples are not.
        assert_eq!(batch.seqs[2].behaviour_logprobs, vec![0.0; 5]);
        let off: Vec<bool> = batch.seqs.iter().map(|s| s.off_policy).collect();
        assert_eq!(off, vec![false, false, true]);
        assert_eq!(batch.seqs[2].advantages, vec![1.5, 1.0, 1.5, 2.0]);
        assert_eq!((stats.guidance, stats.groups_dropped), (1, 1));
        assert!((stats.guidance_advantage - 1.5).abs() < 1e-12);
        let m: HashMap<String, f64> = stats.metrics().into_iter().collect();
        assert_eq!(m["batch/guidance"], 1.0);
        // Without demonstrations the metrics do not name them.
        let (_, stats) = assemble(&ta[..2], &adv, &HashSet::new(), 3, CutCredit::Whole);
        let m: HashMap<String, f64> = stats.metrics().into_iter().collect();
        assert_eq!(stats.guidance, 0);
        assert!(!m.contains_key("batch/guidance"));
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

        let (off, s_off) = assemble(&all, &adv, &HashSet::new(), 3, CutCredit::Whole);
        assert_eq!(
            off.seqs.len(),
            5,
            "without the filter every member is trained on"
        );
        assert_eq!((s_off.overlong_filtered, s_off.groups), (0, 2));

        let (on, s_on) = assemble(&all, &adv, &HashSet::new(), 3, CutCredit::Drop);
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

    /// One group of four with a loop, and the rule that finds it: member 0 finished; member 1
    /// planned, searched (tool output), then looped over a 2-token block three times in a
    /// final turn whose segments span Research and Answer; member 2 was cut by the budget;
    /// member 3 was stopped by a server whose rule this is not (no closing loop found).
    /// Advantages 1.5, -1.0, -0.5, 0.0.
    fn loop_group() -> (
        [Trajectory; 4],
        HashMap<Uuid, [f64; 4]>,
        RepetitionDetection,
    ) {
        use crate::domain::trajectory::Stage;
        let rule = RepetitionDetection {
            max_pattern_size: 4,
            min_pattern_size: 1,
            min_count: 3,
        };
        let model = |stage, ids: Vec<u32>| Segment {
            kind: SegmentKind::Model,
            stage: Some(stage),
            logprobs: Some(vec![-0.1; ids.len()]),
            token_ids: ids,
            text: String::new(),
            policy_version: Some(3),
        };
        let a = Uuid::now_v7();
        let mut t = [traj(a), traj(a), traj(a), traj(a)];
        t[1].finish_reason = finish::REPETITION.into();
        t[1].segments = vec![
            model(Stage::Plan, vec![10, 11, 12]),
            Segment {
                kind: SegmentKind::ToolOutput,
                stage: None,
                token_ids: vec![20, 21],
                logprobs: None,
                text: String::new(),
                policy_version: None,
            },
            model(Stage::Research, vec![13, 7, 8, 7]),
            model(Stage::Answer, vec![8, 7, 8]),
        ];
        t[2].finish_reason = finish::LENGTH.into();
        t[3].finish_reason = finish::REPETITION.into();
        let mut adv = HashMap::new();
        for (x, v) in t.iter().zip([1.5, -1.0, -0.5, 0.0]) {
            adv.insert(x.id, [v; 4]);
        }
        (t, adv, rule)
    }

    #[test]
    fn loop_only_credit_keeps_a_loop_stopped_attempts_loop_and_nothing_before_it() {
        let (t, adv, rule) = loop_group();
        let (whole, s_whole) = assemble(&t, &adv, &HashSet::new(), 3, CutCredit::Whole);
        let (looped, s_loop) = assemble(&t, &adv, &HashSet::new(), 3, CutCredit::LoopOnly(rule));
        // prompt 2 + plan 3 + tool 2 + research 4 + answer 3
        let mask = |b: &wire::Batch| b.seqs[1].loss_mask.clone();
        let (f, tr) = (false, true);
        assert_eq!(
            mask(&whole),
            [f, f, tr, tr, tr, f, f, tr, tr, tr, tr, tr, tr, tr]
        );
        assert_eq!(
            mask(&looped),
            [f, f, f, f, f, f, f, f, tr, tr, tr, tr, tr, tr],
            "the six loop tokens (7 8 x 3) only, across the stage boundary"
        );
        // The loop's tokens keep their own stages' advantages.
        assert_eq!(looped.seqs[1].advantages, vec![-1.0f32; 4]);
        assert_eq!(looped.seqs[1].stages, whole.seqs[1].stages);
        // Everything else as without it: the finished member, the budget cut, and the loop the
        // rule does not find (trained whole and counted).
        for k in [0, 2, 3] {
            assert_eq!(looped.seqs[k], whole.seqs[k], "member {k}");
        }
        assert_eq!((s_whole.loop_only, s_whole.loop_not_found), (0, 0));
        assert_eq!(
            (
                s_loop.loop_only,
                s_loop.loop_only_tokens,
                s_loop.loop_not_found
            ),
            (1, 6, 1)
        );
        assert_eq!(s_loop.loss_tokens, s_whole.loss_tokens - 4);
        let m: HashMap<String, f64> = s_loop.metrics().into_iter().collect();
        assert_eq!(
            (
                m["train/loop_only"],
                m["train/loop_only_tokens"],
                m["train/loop_not_found"]
            ),
            (1.0, 6.0, 1.0)
        );
    }

    #[test]
    fn a_negative_advantage_scale_shrinks_the_negative_stage_advantages_and_nothing_else() {
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        // Task a: stage advantages of both signs (SS-GRPO); task b: a degenerate group.
        let t = [traj(a), traj(a), traj(a), traj(b), traj(b)];
        let rows = [
            [0.5, -1.0, 2.0, -0.25],
            [-0.5, 1.0, -2.0, 0.25],
            [-1.5, -0.5, 0.0, -3.0],
            [0.0; 4],
            [0.0; 4],
        ];
        let adv: HashMap<Uuid, [f64; 4]> = t.iter().map(|x| x.id).zip(rows).collect();
        let none = HashSet::new();
        let with = |negative_scale| BatchCredit {
            negative_scale,
            ..CutCredit::Whole.into()
        };
        let (plain, s_plain) = assemble(&t, &adv, &none, 3, CutCredit::Whole);
        let (one, s_one) = assemble(&t, &adv, &none, 3, with(1.0));
        assert_eq!((one, s_one.clone()), (plain.clone(), s_plain.clone()));
        let (half, _) = assemble(&t, &adv, &none, 3, with(0.5));
        let (psr, s_psr) = assemble(&t, &adv, &none, 3, with(0.0));
        let advs = |b: &wire::Batch| -> Vec<Vec<f32>> {
            b.seqs.iter().map(|s| s.advantages.clone()).collect()
        };
        assert_eq!(
            advs(&half),
            [
                vec![0.5, -0.5, 2.0, -0.125],
                vec![-0.25, 1.0, -1.0, 0.25],
                vec![-0.75, -0.25, 0.0, -1.5]
            ]
        );
        assert_eq!(
            advs(&psr),
            [
                vec![0.5, 0.0, 2.0, 0.0],
                vec![0.0, 1.0, 0.0, 0.25],
                vec![0.0, 0.0, 0.0, 0.0]
            ]
        );
        // The same members, tokens and loss masks: the all-negative member stays in the batch
        // (in the loss's token count) with advantage 0; the degenerate group is dropped as before.
        assert_eq!((s_psr.sequences, s_psr.groups_dropped), (3, 1));
        assert_eq!((s_plain.zero_advantage, s_psr.zero_advantage), (0, 1));
        for (p, q) in plain.seqs.iter().zip(&psr.seqs) {
            assert_eq!((&p.tokens, &p.loss_mask), (&q.tokens, &q.loss_mask));
        }
        // The statistics are of what is trained: mean |A| of the Answer stage (0.25 + 0.25 +
        // 3.0) / 3 plain, 0.25 / 3 with the negatives scaled away.
        let approx = |x: f64, y: f64| (x - y).abs() < 1e-12;
        assert!(approx(s_plain.mean_abs_advantage[3], 3.5 / 3.0));
        assert!(approx(s_psr.mean_abs_advantage[3], 0.25 / 3.0));
    }

    #[test]
    fn a_loop_negative_scale_applies_to_loop_stopped_attempts_alone() {
        let (t, adv, rule) = loop_group();
        let none = HashSet::new();
        let psr = |cut, loop_negative_scale| BatchCredit {
            cut,
            negative_scale: 0.0,
            loop_negative_scale,
            ..BatchCredit::default()
        };
        let advs =
            |b: &wire::Batch| -> Vec<f32> { b.seqs.iter().map(|s| s.advantages[0]).collect() };
        // Absent: every negative advantage takes `negative_scale`, the loop's included.
        let (plain, s_plain) = assemble(&t, &adv, &none, 3, psr(CutCredit::Whole, None));
        assert_eq!(advs(&plain), [1.5, 0.0, 0.0, 0.0]);
        assert_eq!(s_plain.loop_negative, 0);
        // Set: the loop-stopped member (-1.0) keeps a quarter; the budget cut (-0.5) takes
        // `negative_scale` as before; the other loop-stopped member's 0 stays 0.
        let (quarter, s_quarter) = assemble(&t, &adv, &none, 3, psr(CutCredit::Whole, Some(0.25)));
        assert_eq!(advs(&quarter), [1.5, -0.25, 0.0, 0.0]);
        assert_eq!(s_quarter.loop_negative, 1);
        let m: HashMap<String, f64> = s_quarter.metrics().into_iter().collect();
        assert_eq!(m["train/loop_negative"], 1.0);
        // Tokens and loss masks are the plain batch's: only the advantage changes.
        for (p, q) in plain.seqs.iter().zip(&quarter.seqs) {
            assert_eq!((&p.tokens, &p.loss_mask), (&q.tokens, &q.loss_mask));
        }
        // With the loop's tokens alone in the loss, the scaled advantage lands on them.
        let (on_loop, s_on_loop) = assemble(
            &t,
            &adv,
            &none,
            3,
            psr(CutCredit::LoopOnly(rule), Some(0.25)),
        );
        assert_eq!(advs(&on_loop), [1.5, -0.25, 0.0, 0.0]);
        assert_eq!(on_loop.seqs[1].loss_mask.iter().filter(|&&m| m).count(), 6);
        assert_eq!((s_on_loop.loop_only, s_on_loop.loop_negative), (1, 1));
        // At 1 the loop keeps its whole advantage.
        let (full, _) = assemble(&t, &adv, &none, 3, psr(CutCredit::Whole, Some(1.0)));
        assert_eq!(advs(&full), [1.5, -1.0, 0.0, 0.0]);
    }

    #[test]
    fn loop_unlikelihood_marks_a_loop_stopped_attempts_repeated_copies_and_nothing_else() {
        let (t, adv, rule) = loop_group();
        let none = HashSet::new();
        let (whole, _) = assemble(&t, &adv, &none, 3, CutCredit::Whole);
        let on = |cut| BatchCredit {
            cut,
            unlikelihood: Some(rule),
            ..BatchCredit::default()
        };
        let (marked, stats) = assemble(&t, &adv, &none, 3, on(CutCredit::Whole));
        // prompt 2 + plan 3 + tool 2 + research 4 + answer 3: the loop is the last six tokens,
        // its first copy (7 8) is left unmarked, the two after it are marked.
        let (f, tr) = (false, true);
        assert_eq!(
            marked.seqs[1].unlikelihood,
            [f, f, f, f, f, f, f, f, f, f, tr, tr, tr, tr]
        );
        // The loss mask, advantages and stages are the whole attempt's, as without it.
        assert_eq!(marked.seqs[1].loss_mask, whole.seqs[1].loss_mask);
        assert_eq!(marked.seqs[1].advantages, whole.seqs[1].advantages);
        for k in [0, 2, 3] {
            assert_eq!(marked.seqs[k], whole.seqs[k], "member {k}");
        }
        assert_eq!(
            (
                stats.unlikelihood,
                stats.unlikelihood_tokens,
                stats.loop_not_found
            ),
            (1, 4, 1)
        );
        assert_eq!(
            (stats.loop_only, stats.loss_tokens),
            (
                0,
                whole
                    .seqs
                    .iter()
                    .map(|s| s.loss_mask.iter().filter(|&&m| m).count())
                    .sum()
            )
        );
        let m: HashMap<String, f64> = stats.metrics().into_iter().collect();
        assert_eq!(
            (m["batch/unlikelihood"], m["batch/unlikelihood_tokens"]),
            (1.0, 4.0)
        );

        // With the loop-only credit the loop alone is in the loss, and the same copies marked.
        let (both, s_both) = assemble(&t, &adv, &none, 3, on(CutCredit::LoopOnly(rule)));
        assert_eq!(
            both.seqs[1].loss_mask,
            [f, f, f, f, f, f, f, f, tr, tr, tr, tr, tr, tr]
        );
        assert_eq!(both.seqs[1].unlikelihood, marked.seqs[1].unlikelihood);
        assert_eq!(
            (
                s_both.loop_only,
                s_both.unlikelihood_tokens,
                s_both.loop_not_found
            ),
            (1, 4, 1)
        );

        // The marks reach the trainer: the wire carries them (loss-mask byte 2).
        let back = wire::Batch::decode(&marked.encode().unwrap()).unwrap();
        assert_eq!(back, marked);
        assert!(back.seqs[0].unlikelihood.is_empty());
    }
}
