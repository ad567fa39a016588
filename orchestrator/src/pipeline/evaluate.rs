//! Evaluation of a run's policy on fixed task subsets (`[eval]`, method.md A.9): which policy
//! versions are evaluated, the subsets (held out of the training schedule, or drawn from further
//! task files), and one evaluation: roll out without bank injection, score each answer against
//! the task's persistent rubrics (the task file's merged with those Postgres holds, where
//! `orchestrator rubrics init` writes them) with the run's judge (plus exact match where the task
//! has a short known answer), and summarise; a result without its task's figure (no rubric and
//! no known answer, a failed judge or rollout) counts as failed. Storing it is the caller's (one
//! transaction).

use futures::future::join_all;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::domain::config::EvalConfig;
use crate::domain::data::tasks::TaskRow;
use crate::domain::judge::score::{contribution, stage_means};
use crate::domain::judge::{Judge, Rubric, ScoreMode, TraceView};
use crate::infra::db::DbError;
use crate::infra::db::evaluations::{EvalRow, ResultRow};
use crate::pipeline::rollout::{Rollout, RolloutCtx, RolloutError, RolloutSlot, RolloutTask};

pub use crate::domain::config::HELD_OUT;

/// The rollout-slot step of every evaluation rollout: sampling seeds depend on (task prompt,
/// sample) only, so each version and each recipe draws the same seeds (paired comparisons), in
/// any database.
const EVAL_SEED_STEP: i32 = 0x4556;

/// One task of an evaluation subset.
#[derive(Debug, Clone)]
pub struct EvalTask {
    pub rollout: RolloutTask,
    pub question: String,
    /// The task's persistent Answer rubrics (the yardstick; empty = no rubric score).
    pub rubrics: Vec<Rubric>,
    /// The known answer of an exact or short task.
    pub answer: Option<String>,
}

impl EvalTask {
    pub fn new(row: &TaskRow, rollout: RolloutTask) -> Self {
        let specs = serde_json::to_value(&row.rubrics).unwrap_or_default();
        EvalTask {
            rollout,
            question: row.query.clone(),
            rubrics: crate::pipeline::judging::persistent_rubrics(&specs),
            answer: (row.format != crate::infra::chat::AnswerFormat::Long)
                .then(|| row.answer.clone())
                .flatten()
                .filter(|a| !a.trim().is_empty()),
        }
    }

    /// Whether a result of this task got the figure the task is measured by: the rubric score
    /// where the task has persistent rubrics, else the exact match against its known answer. A
    /// result without it (a task with neither rubrics nor a known answer, a judge that failed
    /// after its retries, a rollout cut by the policy server) is counted as failed.
    pub fn scored(&self, r: &ResultRow) -> bool {
        if self.rubrics.is_empty() {
            r.exact.is_some()
        } else {
            r.score.is_some()
        }
    }
}

/// A named, fixed list of evaluation tasks.
#[derive(Debug, Clone)]
pub struct Subset {
    pub name: String,
    pub tasks: Vec<EvalTask>,
    /// Samples per task on this subset; `None` = `eval.n`.
    pub samples: Option<u32>,
    /// Sampling temperature on this subset; `None` = `eval.temperature`.
    pub temperature: Option<f32>,
}

/// Whether the policy after `version` trained steps (of `steps`) is evaluated.
pub fn due(version: u32, steps: u32, cfg: &EvalConfig) -> bool {
    (version == 0 && cfg.initial)
        || version == steps
        || (version > 0 && cfg.every > 0 && version.is_multiple_of(cfg.every))
}

/// Where and how one evaluation runs.
pub struct EvalRun<'a> {
    pub run_id: Uuid,
    pub version: i32,
    pub samples: u32,
    pub max_inflight: usize,
    pub ctx: &'a RolloutCtx,
    pub judge: &'a dyn Judge,
    /// The run's admission control towards the policy servers, if on.
    pub gate: Option<std::sync::Arc<crate::pipeline::rollout::Admission>>,
}

/// Roll out and score one subset. `None` when `cancel` fired before it finished.
pub async fn evaluate(
    run: &EvalRun<'_>,
    subset: &Subset,
    cancel: &CancellationToken,
) -> Option<(EvalRow, Vec<ResultRow>)> {
    let t0 = std::time::Instant::now();
    let tasks: Vec<RolloutTask> = subset.tasks.iter().map(|t| t.rollout.clone()).collect();
    let slot = RolloutSlot {
        run_id: run.run_id,
        step: EVAL_SEED_STEP,
        sample_index: 0,
        policy_version: run.version,
    };
    let rolled = crate::pipeline::rollout::rollout_batch_gated(
        run.ctx,
        &tasks,
        run.samples,
        slot,
        run.max_inflight,
        cancel,
        None,
        run.gate.clone(),
    )
    .await;
    if cancel.is_cancelled() {
        return None;
    }
    let n = run.samples as usize;
    let scored = join_all(
        rolled
            .iter()
            .enumerate()
            .map(|(i, r)| score_one(run.judge, &subset.tasks[i / n], r, (i % n) as i32)),
    )
    .await;
    let (results, costs): (Vec<ResultRow>, Vec<f64>) = scored.into_iter().unzip();
    let cost = costs.iter().sum();
    let row = summarise(run, subset, &results, cost, t0.elapsed().as_secs_f64());
    Some((row, results))
}

/// [`evaluate`] on the subset as Postgres grounds it: each task's persistent rubrics stored in
/// `tasks.persistent_rubrics` (where `orchestrator rubrics init` writes them) are merged into the
/// task file's (see [`merge_rubrics`]) just before the evaluation, so rubrics grounded after the
/// run started count from the next evaluation on. `Ok(None)` when `cancel` fired.
pub async fn evaluate_stored(
    pool: &PgPool,
    run: &EvalRun<'_>,
    subset: &Subset,
    cancel: &CancellationToken,
) -> Result<Option<(EvalRow, Vec<ResultRow>)>, DbError> {
    let subset = with_stored_rubrics(pool, subset).await?;
    Ok(evaluate(run, &subset, cancel).await)
}

/// The subset with each task's stored persistent rubrics merged into its file rubrics. A task
/// that Postgres does not hold keeps its file rubrics.
pub async fn with_stored_rubrics(pool: &PgPool, subset: &Subset) -> Result<Subset, DbError> {
    let ids: Vec<Uuid> = subset.tasks.iter().map(|t| t.rollout.task_id).collect();
    let stored = crate::infra::db::tasks::get_many(pool, &ids).await?;
    Ok(Subset {
        name: subset.name.clone(),
        samples: subset.samples,
        temperature: subset.temperature,
        tasks: subset
            .tasks
            .iter()
            .map(|t| {
                let mut t = t.clone();
                if let Some(row) = stored.get(&t.rollout.task_id) {
                    let db = crate::pipeline::judging::persistent_rubrics(&row.persistent_rubrics);
                    t.rubrics = merge_rubrics(&t.rubrics, db);
                }
                t
            })
            .collect(),
    })
}

/// What makes two persistent rubrics the same criterion: the title (case and spacing aside), or
/// the description when the title is empty (DR Tulu rubrics may have none).
fn rubric_key(r: &Rubric) -> String {
    let key = if r.title.trim().is_empty() {
        &r.description
    } else {
        &r.title
    };
    key.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// Merge a task's stored persistent rubrics into its file rubrics: a stored rubric wins over the
/// file's rubric(s) of the same key ([`rubric_key`]) and takes its place, a stored rubric of a
/// new key is added after the file's, and a file rubric no stored one names stays. Postgres is
/// the later word (`rubrics init --overwrite` regrounds a task; a run's setup stores the file's
/// non-empty rubrics over the stored ones, so both usually agree).
pub fn merge_rubrics(file: &[Rubric], stored: Vec<Rubric>) -> Vec<Rubric> {
    if stored.is_empty() {
        return file.to_vec();
    }
    let mut by_key: Vec<(String, Vec<Rubric>)> = Vec::new();
    for r in stored {
        let k = rubric_key(&r);
        match by_key.iter_mut().find(|(key, _)| *key == k) {
            Some((_, v)) => v.push(r),
            None => by_key.push((k, vec![r])),
        }
    }
    let mut out = Vec::with_capacity(file.len() + by_key.len());
    for f in file {
        let k = rubric_key(f);
        match by_key.iter_mut().find(|(key, _)| *key == k) {
            // The first file rubric of the key gives its place to the stored ones (the list is
            // left empty, so further file rubrics of that key are dropped).
            Some((_, v)) => out.append(v),
            None => out.push(f.clone()),
        }
    }
    for (_, v) in by_key {
        out.extend(v);
    }
    out
}

fn mean(xs: impl Iterator<Item = f64>) -> Option<f64> {
    let (s, k) = xs.fold((0.0, 0usize), |(s, k), x| (s + x, k + 1));
    (k > 0).then(|| s / k as f64)
}

fn summarise(
    run: &EvalRun<'_>,
    subset: &Subset,
    results: &[ResultRow],
    judge_cost_usd: f64,
    seconds: f64,
) -> EvalRow {
    // Results come in (task, sample) order: result i belongs to task i / samples.
    let n = run.samples.max(1) as usize;
    let unscored = |i: usize, r: &ResultRow| !subset.tasks[i / n].scored(r);
    EvalRow {
        run_id: run.run_id,
        policy_version: run.version,
        subset: subset.name.clone(),
        judge_model: run.judge.model().to_string(),
        tasks: subset.tasks.len() as i32,
        samples: run.samples as i32,
        score: mean(results.iter().filter_map(|r| r.score)),
        exact: mean(
            results
                .iter()
                .filter_map(|r| r.exact.map(|h| f64::from(u8::from(h)))),
        ),
        judged: results.iter().filter(|r| r.score.is_some()).count() as i32,
        failed: results
            .iter()
            .enumerate()
            .filter(|(i, r)| unscored(*i, r))
            .count() as i32,
        parse_failures: results.iter().filter(|r| r.parse_failed).count() as i32,
        model_tokens: results.iter().map(|r| i64::from(r.num_model_tokens)).sum(),
        judge_cost_usd,
        seconds,
    }
}

/// Score one rollout: a missing answer scores 0 (a scored outcome, no judge call); a rollout
/// cut by a policy-server failure, or a failed judge call, leaves the score (and exact match)
/// empty with the reason. Returns the row and the
/// judge cost.
async fn score_one(
    judge: &dyn Judge,
    task: &EvalTask,
    rolled: &Result<Rollout, RolloutError>,
    sample_index: i32,
) -> (ResultRow, f64) {
    let r = match rolled {
        Ok(r) => r,
        Err(e) => {
            return (
                ResultRow {
                    task_id: task.rollout.task_id,
                    sample_index,
                    finish_reason: "not_run".into(),
                    answer: None,
                    parsed: serde_json::json!({}),
                    num_model_tokens: 0,
                    tool_calls: 0,
                    parse_failed: true,
                    score: None,
                    rubric_scores: serde_json::json!([]),
                    exact: None,
                    error: Some(format!("rollout: {e}")),
                },
                0.0,
            );
        }
    };
    let p = &r.parsed;
    let answer = p.answer.clone();
    let shown = p.boxed.as_deref().or(answer.as_deref()).unwrap_or("");
    let mut row = ResultRow {
        task_id: task.rollout.task_id,
        sample_index,
        finish_reason: r.trajectory.finish_reason.clone(),
        answer: answer.clone(),
        parsed: r.trajectory.parsed.clone(),
        num_model_tokens: r.trajectory.num_model_tokens() as i32,
        tool_calls: r.calls.len() as i32,
        parse_failed: p.failed(),
        score: None,
        rubric_scores: serde_json::json!([]),
        exact: task
            .answer
            .as_ref()
            .map(|g| crate::domain::eval::answer::contains_answer(g, shown)),
        error: r.error.as_ref().map(|e| format!("policy server: {e}")),
    };
    if row.error.is_some() {
        // The server failed, not the policy: no score, counted as failed.
        row.exact = None;
        return (row, 0.0);
    }
    if task.rubrics.is_empty() {
        row.error = Some(if task.answer.is_some() {
            "no persistent rubrics (exact match only)".into()
        } else {
            "no persistent rubrics and no known answer: the task cannot be scored".into()
        });
        return (row, 0.0);
    }
    if answer.is_none() {
        row.score = Some(0.0);
        return (row, 0.0);
    }
    let view = TraceView::from_trajectory(&r.trajectory);
    match judge
        .score(&task.question, &view, &task.rubrics, ScoreMode::AnswerOnly)
        .await
    {
        Ok(sc) => {
            row.score = stage_means(&task.rubrics, &sc.scores)[3];
            if row.score.is_none() {
                row.error = Some("the judge scored none of the rubrics".into());
            }
            row.rubric_scores = task
                .rubrics
                .iter()
                .filter_map(|rb| {
                    let s = sc.scores.iter().find(|s| s.rubric_id == rb.id)?;
                    Some(serde_json::json!({
                        "title": rb.title,
                        "description": rb.description,
                        "weight": rb.weight,
                        "negative": rb.negative,
                        "score": s.score,
                        "contribution": contribution(s.score, rb.negative),
                        "justification": s.justification,
                    }))
                })
                .collect();
            (row, sc.usage.cost_usd)
        }
        Err(e) => {
            row.error = Some(format!("judge: {}", crate::domain::util::error_chain(&e)));
            (row, 0.0)
        }
    }
}

/// A run's policy on one subset from its first to its last evaluated version: the mean score
/// and exact-match rate of each, and their change paired over the tasks scored at both.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub subset: String,
    pub first: i32,
    pub last: i32,
    pub score: Option<crate::domain::eval::paired::Paired>,
    pub exact: Option<crate::domain::eval::paired::Paired>,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |p: &Option<crate::domain::eval::paired::Paired>| {
            p.map_or("–".to_string(), |p| p.to_string())
        };
        write!(
            f,
            "{} v{} -> v{}: score {}; exact {}",
            self.subset,
            self.first,
            self.last,
            show(&self.score),
            show(&self.exact)
        )
    }
}

/// [`Change`] of `run_id` on `subset`; `None` until two versions are evaluated.
pub async fn change(pool: &PgPool, run_id: Uuid, subset: &str) -> Result<Option<Change>, DbError> {
    let evals = crate::infra::db::evaluations::for_run(pool, run_id).await?;
    change_from(pool, run_id, &evals, subset).await
}

/// [`change`] from the run's evaluation rows already read (`evaluations::for_run`): only the
/// per-task means of its first and last version on `subset` are queried.
pub async fn change_from(
    pool: &PgPool,
    run_id: Uuid,
    evals: &[crate::infra::db::evaluations::EvalRow],
    subset: &str,
) -> Result<Option<Change>, DbError> {
    use std::collections::BTreeMap;
    let versions: Vec<i32> = evals
        .iter()
        .filter(|e| e.run_id == run_id && e.subset == subset)
        .map(|e| e.policy_version)
        .collect();
    let (Some(&first), Some(&last)) = (versions.iter().min(), versions.iter().max()) else {
        return Ok(None);
    };
    if first == last {
        return Ok(None);
    }
    let means = |rows: &[(Uuid, Option<f64>, Option<f64>)], exact: bool| -> BTreeMap<Uuid, f64> {
        rows.iter()
            .filter_map(|(t, s, e)| if exact { *e } else { *s }.map(|v| (*t, v)))
            .collect()
    };
    let a = crate::infra::db::evaluations::task_means(pool, run_id, subset, first).await?;
    let b = crate::infra::db::evaluations::task_means(pool, run_id, subset, last).await?;
    use crate::domain::eval::paired::Paired;
    Ok(Some(Change {
        subset: subset.to_string(),
        first,
        last,
        score: Paired::of(&means(&a, false), &means(&b, false)),
        exact: Paired::of(&means(&a, true), &means(&b, true)),
    }))
}

/// When evaluations run within a run: after the step that made a due version.
use std::time::Instant;

use super::{Pipeline, PipelineError, Shared};
use crate::infra::db;

impl Pipeline {
    /// Evaluate the policy of `version` (which the trainer holds and the servers serve) on every
    /// subset not yet evaluated at that version, if the version is due; the time spent is the
    /// metric `time/eval_s` of the step that made the version. A cancelled evaluation stores
    /// nothing.
    pub(super) async fn evaluate_due(
        &self,
        version: i32,
        shared: &Shared,
        cancel: &CancellationToken,
    ) -> Result<(), PipelineError> {
        if (self.evals.is_empty() && self.bench_sets.is_empty())
            || !due(version.max(0) as u32, self.steps, &self.eval)
        {
            return Ok(());
        }
        let t0 = Instant::now();
        let mut done = self.evaluate_subsets(version, shared, cancel).await?;
        done |= self.evaluate_benchmarks(version, shared, cancel).await?;
        if done && version > 0 {
            let m = [("time/eval_s".to_string(), t0.elapsed().as_secs_f64())];
            db::metrics::record(&self.pool, self.run_id, version - 1, &m).await?;
        }
        Ok(())
    }

    /// [`Self::evaluate_due`]'s work: true when some subset was evaluated now.
    pub(super) async fn evaluate_subsets(
        &self,
        version: i32,
        shared: &Shared,
        cancel: &CancellationToken,
    ) -> Result<bool, PipelineError> {
        let mut done = false;
        let run = self.run_id.to_string();
        for subset in &self.evals {
            if db::evaluations::exists(&self.pool, self.run_id, version, &subset.name).await? {
                continue;
            }
            let samples = subset.samples.unwrap_or(self.eval.n);
            let temperature = subset.temperature.or(self.eval.temperature);
            tracing::info!(
                version,
                subset = %subset.name,
                tasks = subset.tasks.len(),
                samples,
                temperature,
                "evaluating"
            );
            loop {
                let mut ctx = self.rollout_ctx(shared);
                if let Some(t) = temperature {
                    ctx.cfg.temperature = t;
                }
                let er = EvalRun {
                    run_id: self.run_id,
                    version,
                    samples,
                    max_inflight: self.cfg.max_inflight as usize,
                    ctx: &ctx,
                    judge: self.judge.as_ref(),
                    gate: self.admission.clone(),
                };
                let Some((row, results)) = evaluate_stored(&self.pool, &er, subset, cancel).await?
                else {
                    tracing::warn!(version, subset = %subset.name, "evaluation interrupted; it reruns on resume");
                    return Ok(false);
                };
                // A trainer that restarted meanwhile served other weights: redo on the restored
                // policy.
                match self.trainer.state().await {
                    Ok(st)
                        if st.session.as_deref() == Some(run.as_str())
                            && st.policy_version == wire::PolicyVersion::from(version) =>
                    {
                        db::evaluations::record(&self.pool, &row, &results).await?;
                        done = true;
                        tracing::info!(
                            version,
                            subset = %subset.name,
                            score = ?row.score,
                            exact = ?row.exact,
                            judged = row.judged,
                            failed = row.failed,
                            "evaluated"
                        );
                        break;
                    }
                    other => {
                        tracing::warn!(version, subset = %subset.name, trainer = ?other.map(|s| (s.session, s.policy_version)), "the trainer changed during the evaluation; redoing it");
                        self.wait_for_trainer(cancel).await?;
                        self.sync_trainer(version, shared, cancel).await?;
                        if cancel.is_cancelled() {
                            return Ok(false);
                        }
                    }
                }
            }
        }
        Ok(done)
    }
}

impl Pipeline {
    /// The benchmark sets at `version`: the run's agent answers, the gold judges grade (see
    /// `bench::periodic`). True when some set was evaluated now.
    pub(super) async fn evaluate_benchmarks(
        &self,
        version: i32,
        shared: &Shared,
        cancel: &CancellationToken,
    ) -> Result<bool, PipelineError> {
        let system = self
            .tasks
            .first()
            .map(|t| t.system.clone())
            .unwrap_or_default();
        let mut done = false;
        for set in &self.bench_sets {
            tracing::info!(version, set = %crate::pipeline::bench::periodic::describe(set), "benchmark evaluation");
            let mut ctx = self.rollout_ctx(shared);
            if let Some(t) = set.temperature.or(self.eval.temperature) {
                ctx.cfg.temperature = t;
            }
            let r = crate::pipeline::bench::periodic::evaluate_set(
                &self.pool,
                self.run_id,
                set,
                version,
                ctx,
                &system,
                self.cfg.max_inflight as usize,
                cancel,
            )
            .await
            .map_err(|e| PipelineError::Benchmark(format!("benchmark set `{}`: {e}", set.name)))?;
            match r {
                Some(score) => {
                    done = true;
                    tracing::info!(version, set = %set.name, gold = ?score, "benchmark evaluated");
                }
                None => return Ok(done),
            }
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_rubrics_replace_by_title_or_description_and_add_new_ones() {
        let r = |title: &str, description: &str| Rubric {
            id: Uuid::now_v7(),
            stage: crate::domain::trajectory::Stage::Answer,
            title: title.into(),
            description: description.into(),
            weight: 1.0,
            negative: false,
            key_terms: vec![],
            origin: crate::domain::judge::Origin::Persistent,
        };
        let file = [
            r("Protein", "f1"),
            r("", "only the description"),
            r("compound", "f3"),
            r("protein", "f4 (a second file rubric of the title)"),
        ];
        let stored = vec![
            r(" protein ", "s1"),
            r("", "Only  the Description"),
            r("new", "s3"),
        ];
        let merged = merge_rubrics(&file, stored);
        let got: Vec<&str> = merged.iter().map(|x| x.description.as_str()).collect();
        assert_eq!(got, ["s1", "Only  the Description", "f3", "s3"]);
        assert_eq!(merge_rubrics(&file, vec![]), file.to_vec());
    }

    #[test]
    fn due_versions() {
        let cfg = EvalConfig {
            every: 2,
            ..Default::default()
        };
        let got: Vec<u32> = (0..=5).filter(|&v| due(v, 5, &cfg)).collect();
        assert_eq!(
            got,
            vec![0, 2, 4, 5],
            "start, every 2nd, and the final policy"
        );
        let end_only = EvalConfig {
            initial: false,
            ..Default::default()
        };
        let got: Vec<u32> = (0..=5).filter(|&v| due(v, 5, &end_only)).collect();
        assert_eq!(got, vec![5]);
    }
}
