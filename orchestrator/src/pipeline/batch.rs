//! From a judged step in Postgres to the trainer's `wire` batch: per sequence the prompt and
//! segment tokens, the loss mask and stage of every token (`credit::token_credit`), behaviour
//! log-probs, the four stage advantages, the group (task) and the policy version. Built only
//! from stored rows, so a replay after a crash sends byte-identical batches.

use std::collections::HashMap;

use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::trajectory::{SegmentKind, Trajectory};
use crate::infra::db::DbError;

/// Advantage statistics of a batch, per stage (over model tokens' sequences).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchStats {
    pub sequences: usize,
    pub tokens: usize,
    pub loss_tokens: usize,
    /// Sequences whose four advantages are all zero (degenerate groups).
    pub zero_advantage: usize,
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
/// learn from); groups are numbered by task in stored order.
pub async fn build(
    pool: &PgPool,
    run_id: Uuid,
    step: i32,
    judge_model: &str,
) -> Result<(wire::Batch, BatchStats), DbError> {
    let trajs = crate::infra::db::trajectories::list_for_step(pool, run_id, step).await?;
    let adv = crate::pipeline::judging::load_advantages(pool, run_id, step, judge_model).await?;
    Ok(assemble(&trajs, &adv, step))
}

pub fn assemble(
    trajs: &[Trajectory],
    adv: &HashMap<Uuid, [f64; 4]>,
    step: i32,
) -> (wire::Batch, BatchStats) {
    let mut groups: HashMap<Uuid, u32> = HashMap::new();
    let mut seqs = Vec::with_capacity(trajs.len());
    let mut stats = BatchStats::default();
    let mut sums = [[0.0f64; 3]; 4]; // n, sum, sum of squares
    let mut min_version = i32::MAX;
    let mut stale = 0.0;
    for t in trajs {
        if t.num_model_tokens() == 0 {
            continue;
        }
        let next = groups.len() as u32;
        let g = *groups.entry(t.task_id).or_insert(next);
        let a = adv.get(&t.id).copied().unwrap_or([0.0; 4]);
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
