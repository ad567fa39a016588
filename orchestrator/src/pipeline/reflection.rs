//! The reflection job (method.md A.6): for each task of a judged new-query step, one trajectory
//! (picked by `domain::reflection::pick`) is shown to the shared policy, which writes m
//! candidates; the judge grades the valid ones; utilities become GRPO advantages (trained one
//! step later as Phase A, `sequences`) and the best valid candidate goes to the rubric bank.
//! Everything is committed in one transaction per job.

use std::collections::HashSet;
use std::sync::Arc;

use futures::future::join_all;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::bank::{BankError, BankItem, question_hash};
use crate::domain::config::BatchCredit;
use crate::domain::judge::group::{CallKind, CallRecord};
use crate::domain::judge::{Judge, JudgeError, TraceView};
pub use crate::domain::reflection::{
    Blocks, JobReport, STOP, Settings, Utility, best_valid, group_advantages, parse, pick,
    trajectory_text, utility,
};
use crate::domain::trajectory::Trajectory;
use crate::domain::util::mix_seed;
use crate::infra::db::bank::ReflectionRow;
use crate::infra::db::{self, DbError};
use crate::infra::llm::{CompletionRequest, LlmClient, LlmError};
use crate::pipeline::bank::Bank;
use crate::pipeline::rollout::codec::{CodecError, TokenCodec};

#[derive(Debug, thiserror::Error)]
pub enum ReflectionError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("policy server: {0}")]
    Policy(#[from] LlmError),
    #[error("reflection judge: {0}")]
    Judge(#[from] JudgeError),
    #[error("bank: {0}")]
    Bank(#[from] BankError),
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error("cannot render the reflection prompt: {0}")]
    Prompt(String),
    #[error("task {0} of a stored trajectory is missing from `tasks`")]
    MissingTask(Uuid),
}

/// The reflection prompt's system and user messages.
pub fn prompt(question: &str, trajectory: &str) -> Result<(String, String), ReflectionError> {
    crate::infra::prompts::reflection_prompt(question, trajectory)
        .map_err(|e| ReflectionError::Prompt(e.to_string()))
}

/// Everything a reflection job needs.
#[derive(Clone)]
pub struct Reflector {
    pub pool: PgPool,
    pub run_id: Uuid,
    pub seed: u64,
    pub client: LlmClient,
    pub codec: Arc<dyn TokenCodec>,
    pub judge: Arc<dyn Judge>,
    pub bank: Arc<Bank>,
    pub settings: Settings,
}

struct TaskOutcome {
    task_id: Uuid,
    rows: Vec<ReflectionRow>,
    bank: Option<BankItem>,
    call: CallRecord,
    tokens: usize,
}

impl Reflector {
    /// Reflect on a judged step: generate, grade, and commit candidates + bank writes in one
    /// transaction. `policy_version` is the version that generates (recorded for staleness).
    pub async fn run_job(
        &self,
        step: i32,
        policy_version: i32,
    ) -> Result<JobReport, ReflectionError> {
        let t0 = std::time::Instant::now();
        db::bank::start_job(&self.pool, self.run_id, step).await?;
        // Choose first, then read only the chosen trajectory of each task (1 of n).
        let members = db::trajectories::members_of_step(&self.pool, self.run_id, step).await?;
        let ids: Vec<Uuid> = members.iter().map(|(task, _)| *task).collect();
        let tasks = db::tasks::get_many(&self.pool, &ids).await?;
        let mut chosen: Vec<Uuid> = Vec::with_capacity(members.len());
        for (task, ids) in &members {
            let key = tasks
                .get(task)
                .ok_or(ReflectionError::MissingTask(*task))?
                .seed_key();
            chosen.push(ids[pick(ids.len(), self.seed, step, key)]);
        }
        let mut trajs = db::trajectories::get_many(&self.pool, &chosen).await?;
        trajs.sort_by_key(|t| t.task_id); // task order, as `members` (ids are distinct per task)
        let mut futs = Vec::with_capacity(trajs.len());
        for t in &trajs {
            let task = tasks
                .get(&t.task_id)
                .ok_or(ReflectionError::MissingTask(t.task_id))?;
            futs.push(self.reflect_one(step, policy_version, &task.prompt, task.seed_key(), t));
        }
        let mut outcomes = Vec::with_capacity(futs.len());
        for r in join_all(futs).await {
            outcomes.push(r?);
        }
        let rows: Vec<ReflectionRow> = outcomes.iter().flat_map(|o| o.rows.clone()).collect();
        let bank: Vec<BankItem> = outcomes.iter().filter_map(|o| o.bank.clone()).collect();
        db::bank::commit_job(&self.pool, self.run_id, step, &rows, &bank).await?;
        let mut conn = self.pool.acquire().await.map_err(DbError::from)?;
        for o in &outcomes {
            db::judging::insert_calls(
                &mut conn,
                self.run_id,
                step,
                Some(o.task_id),
                std::slice::from_ref(&o.call),
                self.judge.model(),
                self.judge.kind(),
            )
            .await?;
        }
        drop(conn);
        for it in &bank {
            self.bank.insert_cached(it.clone())?;
        }
        let us: Vec<f64> = rows.iter().filter_map(|r| r.score.map(f64::from)).collect();
        Ok(JobReport {
            tasks: outcomes.len(),
            candidates: rows.len(),
            valid: rows.iter().filter(|r| r.valid).count(),
            bank_writes: bank.len(),
            mean_utility: if us.is_empty() {
                0.0
            } else {
                us.iter().sum::<f64>() / us.len() as f64
            },
            best_utility: bank.iter().map(|b| f64::from(b.score)).fold(0.0, f64::max),
            tokens: outcomes.iter().map(|o| o.tokens).sum(),
            judge_prompt_tokens: outcomes
                .iter()
                .map(|o| u64::from(o.call.usage.prompt_tokens))
                .sum(),
            judge_completion_tokens: outcomes
                .iter()
                .map(|o| u64::from(o.call.usage.completion_tokens))
                .sum(),
            judge_cost_usd: outcomes.iter().map(|o| o.call.usage.cost_usd).sum(),
            seconds: t0.elapsed().as_secs_f64(),
        })
    }

    async fn reflect_one(
        &self,
        step: i32,
        policy_version: i32,
        question: &str,
        key: u64,
        t: &Trajectory,
    ) -> Result<TaskOutcome, ReflectionError> {
        let s = &self.settings;
        let (system, user) = prompt(question, &trajectory_text(t, s.max_trajectory_chars))?;
        let prompt_ids = self
            .codec
            .encode(&self.codec.render_prompt(&system, &user)?)?;
        let mut req =
            CompletionRequest::new(self.client.model(), prompt_ids.clone(), s.max_tokens.max(1));
        req.n = s.candidates.max(1);
        req.temperature = s.temperature;
        req.top_p = s.top_p;
        req.seed = Some(mix_seed(
            mix_seed(self.seed ^ 0x2ef1_ec75, step as u64),
            key,
        ));
        req.stop = vec![STOP.to_string()];
        let session = format!("reflection-{}", t.id);
        let (comp, _) = self.client.complete(&session, &req).await?;
        let texts: Vec<String> = comp.choices.iter().map(|c| c.text.clone()).collect();
        let blocks: Vec<Option<Blocks>> = texts.iter().map(|x| parse(x)).collect();
        // Only valid candidates are graded; invalid ones score 0 without a judge call.
        let valid_idx: Vec<usize> = (0..texts.len()).filter(|&i| blocks[i].is_some()).collect();
        let valid_texts: Vec<String> = valid_idx.iter().map(|&i| texts[i].clone()).collect();
        let findings = db::judging::findings(&self.pool, t.id, self.judge.model()).await?;
        let view = TraceView::from_trajectory(t);
        let (grades, usage) = if valid_texts.is_empty() {
            (vec![], crate::domain::judge::Usage::default())
        } else {
            self.judge
                .reflect(question, &view, &findings, &valid_texts)
                .await?
        };
        let mut utilities: Vec<Option<Utility>> = vec![None; texts.len()];
        for (&i, g) in valid_idx.iter().zip(grades) {
            utilities[i] = Some(utility(g));
        }
        let us: Vec<f64> = utilities.iter().map(|u| u.map_or(0.0, |u| u.u)).collect();
        let adv = group_advantages(&us);
        let best = best_valid(
            &utilities.iter().map(|u| u.map(|u| u.u)).collect::<Vec<_>>(),
            s.accept_threshold,
        );
        let prompt_i32: Vec<i32> = prompt_ids.iter().map(|&x| x as i32).collect();
        let mut rows = Vec::with_capacity(texts.len());
        let mut tokens = 0;
        for (i, c) in comp.choices.iter().enumerate() {
            tokens += c.token_ids.len();
            let util = match utilities[i] {
                Some(u) => json!({
                    "diagnostic_accuracy": u.grade.diagnostic_accuracy,
                    "specificity": u.grade.specificity,
                    "scope": u.grade.scope,
                    "within": u.within,
                    "cross": u.cross,
                    "u": u.u,
                }),
                None => json!({"invalid": true, "u": 0.0}),
            };
            rows.push(ReflectionRow {
                id: Uuid::now_v7(),
                step,
                task_id: t.task_id,
                source_trajectory_id: Some(t.id),
                candidate_index: i as i32,
                prompt_token_ids: prompt_i32.clone(),
                token_ids: c.token_ids.iter().map(|&x| x as i32).collect(),
                logprobs: c.logprobs.clone(),
                text: c.text.clone(),
                valid: blocks[i].is_some(),
                score: Some(us[i] as f32),
                utility: util,
                judge_model: Some(self.judge.model().to_string()),
                judge_kind: Some(self.judge.kind().as_str().to_string()),
                advantage: Some(adv[i] as f32),
                policy_version,
                trained_step: None,
            });
        }
        let bank = match best {
            Some(b) => {
                let Some(bl) = &blocks[b] else {
                    return Err(ReflectionError::Prompt(
                        "internal: the best candidate has no parsed blocks".into(),
                    ));
                };
                let emb = self
                    .bank
                    .embed(&[question.to_string()])
                    .await?
                    .into_iter()
                    .next()
                    .unwrap_or_default();
                Some(BankItem {
                    task_id: t.task_id,
                    question: question.to_string(),
                    question_sha256: question_hash(question),
                    embedding: emb,
                    rubrics: bl.rubrics.clone(),
                    takeaways: bl.takeaways.clone(),
                    score: us[b] as f32,
                    step,
                    reflection_id: Some(rows[b].id),
                })
            }
            None => None,
        };
        Ok(TaskOutcome {
            task_id: t.task_id,
            rows,
            bank,
            call: CallRecord {
                kind: CallKind::Reflect,
                trajectory_id: Some(t.id),
                usage,
                error: None,
            },
            tokens,
        })
    }
}

/// The deferred (Phase A) wire sequences of stored candidates: prompt + candidate tokens, loss
/// on the candidate tokens only, stage -1, one GRPO advantage, group = the candidate group.
pub fn sequences(rows: &[ReflectionRow], first_group: u32) -> Vec<wire::WireSequence> {
    let mut groups: Vec<(i32, Uuid)> = Vec::new();
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        if r.token_ids.is_empty() {
            continue;
        }
        let key = (r.step, r.task_id);
        let g = match groups.iter().position(|k| *k == key) {
            Some(g) => g,
            None => {
                groups.push(key);
                groups.len() - 1
            }
        };
        let n_prompt = r.prompt_token_ids.len();
        let n = n_prompt + r.token_ids.len();
        let mut tokens = Vec::with_capacity(n);
        tokens.extend(r.prompt_token_ids.iter().map(|&x| x as u32));
        tokens.extend(r.token_ids.iter().map(|&x| x as u32));
        let mut loss_mask = vec![false; n_prompt];
        loss_mask.resize(n, true);
        let mut behaviour = vec![0.0f32; n_prompt];
        if r.logprobs.len() == r.token_ids.len() {
            behaviour.extend_from_slice(&r.logprobs);
        } else {
            behaviour.resize(n, 0.0);
        }
        out.push(wire::WireSequence {
            unlikelihood: Vec::new(),
            tokens,
            loss_mask,
            stages: vec![-1; n],
            behaviour_logprobs: behaviour,
            advantages: vec![r.advantage.unwrap_or(0.0)],
            group_id: first_group + g as u32,
            policy_version: r.policy_version,
            phase: wire::Phase::Reflection,
            off_policy: false,
        });
    }
    out
}

/// What of a step's reflection sequences trains, and how many candidate groups are dropped:
/// a degenerate group (every candidate the same utility: all advantages 0) would only add KL
/// and dilute the token mean, as a degenerate task group would, so it leaves; then each
/// remaining negative advantage is multiplied by `credit.reflection_negative_advantage_scale`
/// (after the test, so a group with signal keeps every member in the loss's token count).
pub fn trained(
    mut refl: Vec<wire::WireSequence>,
    credit: &BatchCredit,
) -> (Vec<wire::WireSequence>, usize) {
    let live: HashSet<u32> = refl
        .iter()
        .filter(|q| q.advantages.iter().any(|&a| a != 0.0))
        .map(|q| q.group_id)
        .collect();
    let groups: HashSet<u32> = refl.iter().map(|q| q.group_id).collect();
    refl.retain(|q| live.contains(&q.group_id));
    for q in &mut refl {
        for a in &mut q.advantages {
            *a = credit.trained_reflection_advantage(*a);
        }
    }
    (refl, groups.len() - live.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "<reflection_rubrics>\nCritical Requirement: x\n</reflection_rubrics>\n<reflection_takeaways>\n- check the date\n</reflection_takeaways>";

    #[test]
    fn deferred_sequences_train_reflection_tokens_only() {
        let row = |task: u128, i: i32, adv: f32| ReflectionRow {
            id: Uuid::now_v7(),
            step: 2,
            task_id: Uuid::from_u128(task),
            source_trajectory_id: None,
            candidate_index: i,
            prompt_token_ids: vec![1, 2, 3],
            token_ids: vec![4, 5],
            logprobs: vec![-0.5, -0.25],
            text: GOOD.into(),
            valid: true,
            score: Some(0.5),
            utility: json!({}),
            judge_model: None,
            judge_kind: None,
            advantage: Some(adv),
            policy_version: 2,
            trained_step: Some(3),
        };
        let seqs = sequences(&[row(1, 0, 1.0), row(1, 1, -1.0), row(2, 0, 0.0)], 10);
        assert_eq!(seqs.len(), 3);
        assert_eq!(seqs[0].tokens, vec![1, 2, 3, 4, 5]);
        assert_eq!(seqs[0].loss_mask, vec![false, false, false, true, true]);
        assert_eq!(seqs[0].behaviour_logprobs, vec![0.0, 0.0, 0.0, -0.5, -0.25]);
        assert_eq!(seqs[0].advantages, vec![1.0]);
        assert_eq!(seqs[0].stages, vec![-1; 5]);
        assert_eq!(
            (seqs[0].group_id, seqs[1].group_id, seqs[2].group_id),
            (10, 10, 11)
        );
        assert!(seqs.iter().all(|s| s.phase == wire::Phase::Reflection));
    }

    #[test]
    fn trained_drops_degenerate_groups_then_scales_the_negative_advantages() {
        let seq = |group: u32, adv: f32| wire::WireSequence {
            unlikelihood: Vec::new(),
            tokens: vec![1, 2, 3],
            loss_mask: vec![false, true, true],
            stages: vec![-1; 3],
            behaviour_logprobs: vec![0.0, -0.5, -0.5],
            advantages: vec![adv],
            group_id: group,
            policy_version: 1,
            phase: wire::Phase::Reflection,
            off_policy: false,
        };
        // Group 0 has signal (one valid candidate above three invalid ones), group 1 none.
        let batch = || {
            vec![
                seq(0, 1.5),
                seq(0, -0.5),
                seq(0, -0.5),
                seq(0, -0.5),
                seq(1, 0.0),
                seq(1, 0.0),
            ]
        };
        let advs =
            |s: &[wire::WireSequence]| -> Vec<f32> { s.iter().map(|q| q.advantages[0]).collect() };
        let (plain, dropped) = trained(batch(), &BatchCredit::default());
        assert_eq!(dropped, 1);
        assert_eq!(advs(&plain), [1.5, -0.5, -0.5, -0.5]);
        let with = |reflection_negative_scale| BatchCredit {
            reflection_negative_scale,
            ..BatchCredit::default()
        };
        let (half, _) = trained(batch(), &with(0.5));
        assert_eq!(advs(&half), [1.5, -0.25, -0.25, -0.25]);
        // Positive candidates alone: the invalid ones stay in the batch at advantage 0.
        let (psr, dropped) = trained(batch(), &with(0.0));
        assert_eq!((psr.len(), dropped), (4, 1));
        assert_eq!(advs(&psr), [1.5, 0.0, 0.0, 0.0]);
        // The task side's scale is not the reflection one.
        let task_only = BatchCredit {
            negative_scale: 0.0,
            ..BatchCredit::default()
        };
        assert_eq!(advs(&trained(batch(), &task_only).0), advs(&plain));
    }
}
