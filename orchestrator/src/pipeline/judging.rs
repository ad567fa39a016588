//! Judging one stored step: load its trajectories, tasks and rubric buffers, judge every task's
//! group concurrently, turn stage scores into advantages with the recipe's credit, and write
//! rubrics, buffers, judgments, stage scores, rewards, the call log and step metrics in one
//! transaction (re-judging a step overwrites, never duplicates).

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use futures::future::join_all;
use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::config::Recipe;
use crate::domain::credit::{
    CompositeInputs, CreditMode, Lambda, STAGES, composite_reward, format_reward, group_advantages,
    scalar_advantages, search_reward, zero_std,
};
use crate::domain::data::tasks::RubricSpec;
use crate::domain::judge::group::{GroupConfig, GroupJudgment, judge_group};
use crate::domain::judge::score::{AnswerScore, ScoreSource};
use crate::domain::judge::{Granularity, Judge, Origin, Rubric, ScoreMode, TraceView};
use crate::domain::rubrics::{BufferPolicy, RubricBuffer, evidence_rubrics};
use crate::domain::trajectory::{Stage, TEACHER};
use crate::infra::db::{self, DbError, judging};

/// How scores become advantages.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Credit {
    /// Per-stage advantages (SS-GRPO or terminal broadcast).
    Stage(CreditMode),
    /// DR Tulu's composite scalar reward, GRPO-normalised and broadcast to every stage.
    Composite { citation: bool },
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepOptions {
    pub recipe: Recipe,
    pub group: GroupConfig,
    pub credit: Credit,
    /// `judge.research_evidence`: seed each task's buffer with persistent Research rubrics from
    /// its evidence chain too ([`crate::domain::rubrics::evidence_rubrics`]); off in every
    /// recipe's paper settings, and ignored by the answer-only recipes (DR Tulu, DeepRubric),
    /// which judge no Research stage.
    pub research_evidence: bool,
}

impl StepOptions {
    /// The paper's settings for a recipe: ablation recipes share the stagewise judge and differ
    /// in credit (Baseline-RL and +Meta-Policy broadcast R4; +SS-GRPO and Full use Λ); DR Tulu
    /// (method.md B.2-B.7) judges the extracted answer only, one call per (trajectory, rubric),
    /// scores it with the signed points sum (persistent rubrics keep their dataset weights),
    /// evolves RLER buffers (K_max = 5) and uses the composite reward.
    pub fn for_recipe(recipe: Recipe, lambda: Lambda, citation: bool) -> Self {
        let stagewise = |credit| StepOptions {
            recipe,
            group: GroupConfig {
                policy: BufferPolicy::PAPER,
                mode: ScoreMode::Stagewise,
                generate: true,
                citation: false,
                granularity: Granularity::PerTrajectory,
                answer_score: AnswerScore::WeightedMean,
                point_scale: 2,
            },
            credit: Credit::Stage(credit),
            research_evidence: false,
        };
        match recipe {
            Recipe::BaselineRl | Recipe::MetaPolicy => stagewise(CreditMode::Terminal),
            Recipe::SsGrpo | Recipe::Full => stagewise(CreditMode::StageStructured { lambda }),
            Recipe::Drtulu => StepOptions {
                recipe,
                group: GroupConfig {
                    policy: BufferPolicy::RLER,
                    mode: ScoreMode::AnswerOnly,
                    generate: true,
                    citation,
                    granularity: Granularity::PerRubric,
                    answer_score: AnswerScore::SignedPoints,
                    point_scale: 2,
                },
                credit: Credit::Composite { citation },
                research_evidence: false,
            },
            // DeepRubric (method.md C.5): the task's fixed rubrics only (nothing generated),
            // judged per rubric on the answer, Σ w·s / Σ |w|, the paper's composite reward.
            Recipe::Deeprubric => StepOptions {
                recipe,
                group: GroupConfig {
                    policy: BufferPolicy::RLER,
                    mode: ScoreMode::AnswerOnly,
                    generate: false,
                    citation,
                    granularity: Granularity::PerRubric,
                    answer_score: AnswerScore::AbsWeighted,
                    // DeepRubric's judge grades each criterion 0-4 (method.md C.5).
                    point_scale: 4,
                },
                credit: Credit::Composite { citation },
                research_evidence: false,
            },
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("run {run} step {step} has no stored trajectories")]
    Empty { run: Uuid, step: i32 },
    #[error("task {0} of a stored trajectory is missing from `tasks`")]
    MissingTask(Uuid),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("credit assignment failed for task {task}: {source}")]
    Credit {
        task: Uuid,
        source: crate::domain::credit::CreditError,
    },
    /// The circuit breaker: too many scoring calls failed; nothing of the step was written.
    #[error(
        "{failed} of {calls} scoring calls failed after their retries (limit {limit}); last \
         error: {last_error}"
    )]
    JudgeDown {
        failed: usize,
        calls: usize,
        limit: f64,
        last_error: String,
    },
}

/// What judging a step did, for logs, metrics and the CLI.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepReport {
    pub trajectories: usize,
    pub groups: usize,
    pub degenerate_groups: usize,
    pub mean_stage_score: [f64; STAGES],
    pub mean_reward: f64,
    /// Demonstrations judged with the groups (off-policy guidance, server `teacher`), and
    /// their mean reward (as `mean_reward`). The other means are of the policy's samples.
    pub guidance: usize,
    pub guidance_reward: f64,
    pub broadcast: usize,
    pub failed: usize,
    pub calls: usize,
    pub failed_calls: usize,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost_usd: f64,
    pub new_rubrics: usize,
    pub pruned: usize,
    pub active_rubrics: [usize; STAGES],
    /// Wall time of the judge calls (all groups in flight together).
    pub judge_seconds: f64,
    /// Wall time of the whole step: load, judge, credit, write.
    pub seconds: f64,
}

impl StepReport {
    /// Step metrics (long format) under `judge/`, `reward/` and `rubrics/`.
    pub fn metrics(&self) -> Vec<(String, f64)> {
        let mut m = vec![
            ("judge/trajectories".into(), self.trajectories as f64),
            (
                "judge/degenerate_groups".into(),
                self.degenerate_groups as f64,
            ),
            ("judge/broadcast".into(), self.broadcast as f64),
            ("judge/failed".into(), self.failed as f64),
            ("judge/calls".into(), self.calls as f64),
            ("judge/failed_calls".into(), self.failed_calls as f64),
            ("judge/prompt_tokens".into(), self.prompt_tokens as f64),
            (
                "judge/completion_tokens".into(),
                self.completion_tokens as f64,
            ),
            ("judge/cost_usd".into(), self.cost_usd),
            ("judge/seconds".into(), self.seconds),
            ("judge/call_seconds".into(), self.judge_seconds),
            ("reward/mean".into(), self.mean_reward),
            ("rubrics/new".into(), self.new_rubrics as f64),
            ("rubrics/pruned".into(), self.pruned as f64),
        ];
        if self.guidance > 0 {
            m.push(("reward/guidance".into(), self.guidance_reward));
        }
        for s in Stage::ALL {
            m.push((
                format!("reward/{}", s.as_str()),
                self.mean_stage_score[s.index()],
            ));
            m.push((
                format!("rubrics/active_{}", s.as_str()),
                self.active_rubrics[s.index()] as f64,
            ));
        }
        m
    }
}

/// Persistent Answer rubrics from a task's stored specs, as RubricEM weighs them. Weights map
/// onto {1, 2, 3} (rounded magnitude, clamped); a negative weight makes a negative rubric
/// (method.md A.4.4, PROPOSED).
pub fn persistent_rubrics(specs: &serde_json::Value) -> Vec<Rubric> {
    persistent_rubrics_as(AnswerScore::WeightedMean, specs)
}

/// Persistent Answer rubrics for a scoring rule. RubricEM's weighted mean: weights on
/// {1, 2, 3} (see [`persistent_rubrics`]). DR Tulu's signed points: the dataset weight as given
/// (method.md B.2, B.3: `ground_truth.rubrics[].weight` is used unchanged), its magnitude as the
/// weight and its sign as the polarity (a negative weight is a penalty).
pub fn persistent_rubrics_as(score: AnswerScore, specs: &serde_json::Value) -> Vec<Rubric> {
    answer_rubrics(score, &parse_specs(specs))
}

/// A task's stored rubric specs; none when they do not parse.
fn parse_specs(specs: &serde_json::Value) -> Vec<RubricSpec> {
    serde_json::from_value(specs.clone()).unwrap_or_default()
}

/// See [`persistent_rubrics_as`].
fn answer_rubrics(score: AnswerScore, specs: &[RubricSpec]) -> Vec<Rubric> {
    specs
        .iter()
        .filter(|s| !s.description.trim().is_empty())
        .map(|s| Rubric {
            id: Uuid::now_v7(),
            stage: Stage::Answer,
            title: s.title.clone(),
            description: s.description.clone(),
            weight: match score {
                AnswerScore::WeightedMean => s.weight.abs().round().clamp(1.0, 3.0),
                AnswerScore::SignedPoints | AnswerScore::AbsWeighted => s.weight.abs(),
            },
            negative: s.weight < 0.0,
            key_terms: s.key_terms.clone(),
            origin: Origin::Persistent,
        })
        .collect()
}

struct Done {
    task: Uuid,
    buffer: RubricBuffer,
    fresh_persistent: Vec<Rubric>,
    judged: GroupJudgment,
    rows: Vec<judging::StageRow>,
    rewards: Vec<judging::RewardRow>,
    degenerate: bool,
}

/// Judge a stored step and write the results.
pub async fn judge_step(
    pool: &PgPool,
    judge: &dyn Judge,
    opts: &StepOptions,
    run_id: Uuid,
    step: i32,
) -> Result<StepReport, StepError> {
    judge_step_guarded(pool, judge, opts, run_id, step, 1.0).await
}

/// Judge a stored step and write the results, unless more than `max_failure_rate` of its
/// scoring calls (stagewise and fallback scoring) failed after their retries: then nothing is
/// written (rubric buffers untouched, the step stays unjudged) and [`StepError::JudgeDown`]
/// names the count and the last error, so the step can be judged again once the judge answers.
pub async fn judge_step_guarded(
    pool: &PgPool,
    judge: &dyn Judge,
    opts: &StepOptions,
    run_id: Uuid,
    step: i32,
    max_failure_rate: f64,
) -> Result<StepReport, StepError> {
    let t0 = Instant::now();
    let trajs = db::trajectories::list_for_step(pool, run_id, step).await?;
    if trajs.is_empty() {
        return Err(StepError::Empty { run: run_id, step });
    }
    let mut groups: BTreeMap<Uuid, Vec<(Uuid, TraceView)>> = BTreeMap::new();
    for t in &trajs {
        groups
            .entry(t.task_id)
            .or_default()
            .push((t.id, TraceView::from_trajectory(t)));
    }
    let task_ids: Vec<Uuid> = groups.keys().copied().collect();
    let tasks = db::tasks::get_many(pool, &task_ids).await?;
    let mut buffers = judging::load_buffers(pool, run_id, &task_ids).await?;

    let jobs = groups.into_iter().map(|(task, group)| {
        let (buffer, fresh) = match buffers.remove(&task) {
            Some(b) => (b, vec![]),
            None => {
                let p = tasks
                    .get(&task)
                    .map(|t| {
                        let specs = parse_specs(&t.persistent_rubrics);
                        let mut p = answer_rubrics(opts.group.answer_score, &specs);
                        // Stagewise recipes only: an answer-only judge (DR Tulu, DeepRubric)
                        // would look for the document ids in the answer's citations.
                        if opts.research_evidence && opts.group.mode == ScoreMode::Stagewise {
                            p.extend(evidence_rubrics(&specs));
                        }
                        p
                    })
                    .unwrap_or_default();
                (RubricBuffer::with_persistent(p.clone(), step), p)
            }
        };
        let question = tasks.get(&task).map(|t| t.prompt.clone());
        async move {
            let question = question.ok_or(StepError::MissingTask(task))?;
            let mut buffer = buffer;
            let judged = judge_group(judge, &mut buffer, opts.group, &question, &group, step).await;
            let (rows, rewards, degenerate) = credit(opts, &group, &judged)
                .map_err(|source| StepError::Credit { task, source })?;
            Ok::<_, StepError>(Done {
                task,
                buffer,
                fresh_persistent: fresh,
                judged,
                rows,
                rewards,
                degenerate,
            })
        }
    });
    let t_calls = Instant::now();
    let done: Vec<Done> = join_all(jobs).await.into_iter().collect::<Result<_, _>>()?;
    let judge_seconds = t_calls.elapsed().as_secs_f64();
    {
        use crate::domain::judge::group::CallKind;
        let scoring = done
            .iter()
            .flat_map(|d| &d.judged.calls)
            .filter(|c| matches!(c.kind, CallKind::Score | CallKind::ScoreFallback));
        let (mut calls, mut failed, mut last_error) = (0usize, 0usize, None);
        for c in scoring {
            calls += 1;
            if let Some(e) = &c.error {
                failed += 1;
                last_error = Some(e.clone());
            }
        }
        if calls > 0 && failed as f64 > max_failure_rate * calls as f64 {
            return Err(StepError::JudgeDown {
                failed,
                calls,
                limit: max_failure_rate,
                last_error: last_error.unwrap_or_default(),
            });
        }
    }

    let model = judge.model().to_string();
    let kind = judge.kind();
    let mut report = StepReport {
        trajectories: trajs.len(),
        groups: done.len(),
        judge_seconds,
        ..StepReport::default()
    };
    // Demonstrations are judged and credited with their groups, but the step's reward
    // metrics are of the policy's own samples; theirs is reported apart.
    let teacher: HashSet<Uuid> = trajs
        .iter()
        .filter(|t| t.server == TEACHER)
        .map(|t| t.id)
        .collect();
    let (mut answer_sum, mut guidance_answer) = (0.0, 0.0);
    let mut tx = pool.begin().await.map_err(DbError::from)?;
    for d in &done {
        let mut rubrics = d.fresh_persistent.clone();
        rubrics.extend(d.judged.new_rubrics.iter().cloned());
        judging::insert_rubrics(&mut tx, run_id, d.task, step, &rubrics).await?;
        judging::save_buffer(&mut tx, run_id, d.task, &d.buffer).await?;
        let sets: Vec<judging::JudgmentSet> = d
            .judged
            .trajectories
            .iter()
            .map(|t| judging::JudgmentSet {
                trajectory_id: t.trajectory_id,
                scores: &t.scores,
                fallback: t.source != ScoreSource::Judged,
                point_scale: t.point_scale,
            })
            .collect();
        judging::insert_judgments(&mut tx, &d.judged.scored_against, &sets, &model, kind).await?;
        for t in &d.judged.trajectories {
            report.broadcast += usize::from(t.source == ScoreSource::Broadcast);
            report.failed += usize::from(t.source == ScoreSource::Failed);
            if teacher.contains(&t.trajectory_id) {
                guidance_answer += t.stage_scores[STAGES - 1];
                continue;
            }
            for k in 0..STAGES {
                report.mean_stage_score[k] += t.stage_scores[k];
            }
        }
        judging::upsert_stage_scores(&mut tx, &d.rows, &model, kind).await?;
        if !d.rewards.is_empty() {
            judging::upsert_rewards(&mut tx, &d.rewards, &model, opts.recipe.as_str()).await?;
            for r in &d.rewards {
                if teacher.contains(&r.trajectory_id) {
                    report.guidance_reward += r.reward;
                } else {
                    answer_sum += r.reward;
                }
            }
        }
        judging::insert_calls(
            &mut tx,
            run_id,
            step,
            Some(d.task),
            &d.judged.calls,
            &model,
            kind,
        )
        .await?;
        report.degenerate_groups += usize::from(d.degenerate);
        report.new_rubrics += d.judged.new_rubrics.len();
        report.pruned += d.judged.pruned.len();
        for s in Stage::ALL {
            report.active_rubrics[s.index()] += d.buffer.active(s).count();
        }
        for c in &d.judged.calls {
            report.calls += 1;
            report.failed_calls += usize::from(c.error.is_some());
            report.prompt_tokens += u64::from(c.usage.prompt_tokens);
            report.completion_tokens += u64::from(c.usage.completion_tokens);
            report.cost_usd += c.usage.cost_usd;
        }
    }
    let n = (trajs.len() - teacher.len()).max(1) as f64;
    for v in &mut report.mean_stage_score {
        *v /= n;
    }
    let rewarded = done.iter().any(|d| !d.rewards.is_empty());
    report.mean_reward = if rewarded {
        answer_sum / n
    } else {
        report.mean_stage_score[STAGES - 1]
    };
    report.guidance = teacher.len();
    if !teacher.is_empty() {
        let g = teacher.len() as f64;
        report.guidance_reward = if rewarded {
            report.guidance_reward / g
        } else {
            guidance_answer / g
        };
    }
    report.seconds = t0.elapsed().as_secs_f64();
    tx.commit().await.map_err(DbError::from)?;
    db::metrics::record(pool, run_id, step, &report.metrics()).await?;
    Ok(report)
}

type Credited = (Vec<judging::StageRow>, Vec<judging::RewardRow>, bool);

/// Advantages of one group under the recipe's credit.
fn credit(
    opts: &StepOptions,
    group: &[(Uuid, TraceView)],
    judged: &GroupJudgment,
) -> Result<Credited, crate::domain::credit::CreditError> {
    let scores: Vec<[f64; STAGES]> = judged.trajectories.iter().map(|t| t.stage_scores).collect();
    // Trajectories whose scoring failed have no reward: they are left out of the group's
    // statistics (their R = 0 would move everyone else's advantage) and get advantage 0; the
    // batch builder leaves them out of training.
    let live: Vec<usize> = (0..scores.len())
        .filter(|&i| judged.trajectories[i].source != ScoreSource::Failed)
        .collect();
    match opts.credit {
        Credit::Stage(mode) => {
            let live_scores: Vec<[f64; STAGES]> = live.iter().map(|&i| scores[i]).collect();
            let mut g = crate::domain::credit::GroupAdvantages {
                advantages: vec![[0.0; STAGES]; scores.len()],
                returns: scores.clone(),
                degenerate: true,
                std: [0.0; STAGES],
            };
            if !live.is_empty() {
                let lg = group_advantages(mode, &live_scores)?;
                g.degenerate = lg.degenerate || live.len() < 2;
                g.std = lg.std;
                for (j, &i) in live.iter().enumerate() {
                    g.advantages[i] = lg.advantages[j];
                    g.returns[i] = lg.returns[j];
                }
            }
            let rows = judged
                .trajectories
                .iter()
                .enumerate()
                .map(|(i, t)| judging::StageRow {
                    trajectory_id: t.trajectory_id,
                    scores: t.stage_scores,
                    returns: g.returns[i],
                    advantages: g.advantages[i],
                    source: t.source.as_str(),
                })
                .collect();
            // Terminal credit is GRPO on R4: keep its scalar reward for SQL and reports.
            let rewards = if mode == CreditMode::Terminal {
                judged
                    .trajectories
                    .iter()
                    .enumerate()
                    .map(|(i, t)| judging::RewardRow {
                        trajectory_id: t.trajectory_id,
                        reward: t.stage_scores[STAGES - 1],
                        rubric: t.stage_scores[STAGES - 1],
                        citation: None,
                        format: None,
                        search: None,
                        advantage: g.advantages[i][STAGES - 1],
                    })
                    .collect()
            } else {
                vec![]
            };
            Ok((rows, rewards, g.degenerate))
        }
        Credit::Composite { citation } => {
            let mut parts = Vec::with_capacity(group.len());
            for ((_, view), t) in group.iter().zip(&judged.trajectories) {
                // DR Tulu's format check finds cites anywhere in the response; its answer is a
                // closed <answer>…</answer> only (without one: rubric = citation = 0).
                let claims = crate::domain::judge::citation::split_claims(
                    view.answer.as_deref().unwrap_or(""),
                );
                let inputs = CompositeInputs {
                    rubric: t.rubric_score,
                    citation: t.citation.map_or(0.0, |c| c.reward),
                    has_answer: view.extracted_answer().is_some(),
                    has_cite: claims.iter().any(|c| !c.ids.is_empty()),
                    has_tool_query: view.tool_calls > 0,
                    search_queries: view.tool_calls,
                };
                parts.push((composite_reward(&inputs, citation), inputs));
            }
            let rewards: Vec<f64> = parts.iter().map(|(r, _)| *r).collect();
            let live_rewards: Vec<f64> = live.iter().map(|&i| rewards[i]).collect();
            let live_adv = scalar_advantages(&live_rewards);
            let mut adv = vec![0.0; rewards.len()];
            for (j, &i) in live.iter().enumerate() {
                adv[i] = live_adv[j];
            }
            // DR Tulu removes groups whose rewards have zero std (method.md B.7): flag them.
            let degenerate = zero_std(&live_rewards) || live.len() < 2;
            let rows = judged
                .trajectories
                .iter()
                .zip(rewards.iter().zip(&adv))
                .map(|(t, (r, a))| judging::StageRow {
                    trajectory_id: t.trajectory_id,
                    scores: t.stage_scores,
                    returns: [*r; STAGES],
                    advantages: [*a; STAGES],
                    source: t.source.as_str(),
                })
                .collect();
            let reward_rows = judged
                .trajectories
                .iter()
                .zip(parts)
                .zip(&adv)
                .map(|((t, (r, inp)), a)| judging::RewardRow {
                    trajectory_id: t.trajectory_id,
                    reward: r,
                    rubric: inp.rubric,
                    citation: citation.then_some(inp.citation),
                    format: Some(format_reward(&inp)),
                    search: Some(search_reward(inp.search_queries)),
                    advantage: *a,
                })
                .collect();
            Ok((rows, reward_rows, degenerate))
        }
    }
}

pub use crate::infra::db::judging::load_advantages;
