//! Judging's tables: rubrics, per-run rubric buffers, judgments, stage scores with returns and
//! advantages, scalar rewards, and the judge-call log. Writes are bulk (UNNEST) and idempotent
//! (re-judging a step upserts), so a crashed judge phase can be repeated without duplicates.

use std::collections::HashMap;

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::DbError;
use crate::domain::judge::group::CallRecord;
use crate::domain::judge::{JudgeKind, Origin, Rubric, RubricScore};
use crate::domain::rubrics::{Entry, RubricBuffer, State};
use crate::domain::trajectory::Stage;

type RubricRow = (
    Uuid,
    Uuid,
    i16,
    String,
    String,
    String,
    f32,
    bool,
    Vec<String>,
    String,
    Option<f32>,
    i32,
    Option<i32>,
);

/// Load the buffers of `task_ids` in a run (tasks without a buffer are absent).
pub async fn load_buffers(
    pool: &PgPool,
    run_id: Uuid,
    task_ids: &[Uuid],
) -> Result<HashMap<Uuid, RubricBuffer>, DbError> {
    let rows: Vec<RubricRow> = sqlx::query_as(
        "SELECT b.task_id, r.id, r.stage, r.origin, r.title, r.description, r.weight, r.negative,
                r.key_terms, b.state, b.variance, b.updated_step, r.created_step
         FROM rubric_buffers b JOIN rubrics r ON r.id = b.rubric_id
         WHERE b.run_id = $1 AND b.task_id = ANY($2)
         ORDER BY b.task_id, r.created_at, r.id",
    )
    .bind(run_id)
    .bind(task_ids)
    .fetch_all(pool)
    .await?;
    let mut out: HashMap<Uuid, RubricBuffer> = HashMap::new();
    for (
        task,
        id,
        stage,
        origin,
        title,
        description,
        weight,
        negative,
        key_terms,
        state,
        var,
        upd,
        created,
    ) in rows
    {
        let invalid = |what: &'static str, v: String| DbError::Invalid { what, message: v };
        let rubric = Rubric {
            id,
            stage: Stage::from_index(i64::from(stage))
                .ok_or_else(|| invalid("rubric stage", stage.to_string()))?,
            title,
            description,
            weight,
            negative,
            key_terms,
            origin: Origin::parse(&origin)
                .ok_or_else(|| invalid("rubric origin", origin.clone()))?,
        };
        out.entry(task).or_default().entries.push(Entry {
            rubric,
            state: State::parse(&state).ok_or_else(|| invalid("buffer state", state.clone()))?,
            variance: var.map(f64::from),
            updated_step: upd,
            created_step: created.unwrap_or(upd),
        });
    }
    Ok(out)
}

/// Insert rubrics (ignoring ones already stored).
pub async fn insert_rubrics(
    conn: &mut PgConnection,
    run_id: Uuid,
    task_id: Uuid,
    step: i32,
    rubrics: &[Rubric],
) -> Result<(), DbError> {
    if rubrics.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = rubrics.iter().map(|r| r.id).collect();
    let stages: Vec<i16> = rubrics.iter().map(|r| r.stage as i16).collect();
    let origins: Vec<&str> = rubrics.iter().map(|r| r.origin.as_str()).collect();
    let titles: Vec<String> = rubrics
        .iter()
        .map(|r| super::pg_text(&r.title).into_owned())
        .collect();
    let descs: Vec<String> = rubrics
        .iter()
        .map(|r| super::pg_text(&r.description).into_owned())
        .collect();
    let weights: Vec<f32> = rubrics.iter().map(|r| r.weight).collect();
    let negs: Vec<bool> = rubrics.iter().map(|r| r.negative).collect();
    // text[][] must be rectangular: key terms travel as JSON.
    let terms: Vec<serde_json::Value> = rubrics
        .iter()
        .map(|r| super::pg_json(&serde_json::json!(r.key_terms)))
        .collect();
    sqlx::query(
        "INSERT INTO rubrics (id, task_id, stage, origin, title, description, weight, negative,
                              key_terms, run_id, created_step)
         SELECT u.id, $2, u.stage, u.origin, u.title, u.description, u.weight, u.negative,
                ARRAY(SELECT jsonb_array_elements_text(u.terms)), $3, $4
         FROM UNNEST($1::uuid[], $5::int2[], $6::text[], $7::text[], $8::text[], $9::real[],
                     $10::bool[], $11::jsonb[])
              AS u(id, stage, origin, title, description, weight, negative, terms)
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(&ids)
    .bind(task_id)
    .bind(run_id)
    .bind(step)
    .bind(&stages)
    .bind(&origins)
    .bind(&titles)
    .bind(&descs)
    .bind(&weights)
    .bind(&negs)
    .bind(&terms)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Write a task's whole buffer state (every entry's state, variance and step).
pub async fn save_buffer(
    conn: &mut PgConnection,
    run_id: Uuid,
    task_id: Uuid,
    buffer: &RubricBuffer,
) -> Result<(), DbError> {
    if buffer.entries.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = buffer.entries.iter().map(|e| e.rubric.id).collect();
    let stages: Vec<i16> = buffer
        .entries
        .iter()
        .map(|e| e.rubric.stage as i16)
        .collect();
    let states: Vec<&str> = buffer.entries.iter().map(|e| e.state.as_str()).collect();
    let vars: Vec<Option<f32>> = buffer
        .entries
        .iter()
        .map(|e| e.variance.map(|v| v as f32))
        .collect();
    let steps: Vec<i32> = buffer.entries.iter().map(|e| e.updated_step).collect();
    sqlx::query(
        "INSERT INTO rubric_buffers (run_id, task_id, stage, rubric_id, state, variance, updated_step)
         SELECT $1, $2, u.stage, u.id, u.state, u.variance, u.step
         FROM UNNEST($3::uuid[], $4::int2[], $5::text[], $6::real[], $7::int4[])
              AS u(id, stage, state, variance, step)
         ON CONFLICT (run_id, task_id, rubric_id) DO UPDATE SET
             state = EXCLUDED.state, variance = EXCLUDED.variance,
             updated_step = EXCLUDED.updated_step",
    )
    .bind(run_id)
    .bind(task_id)
    .bind(&ids)
    .bind(&stages)
    .bind(&states)
    .bind(&vars)
    .bind(&steps)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// One trajectory's rubric scores for `insert_judgments`.
#[derive(Debug, Clone, Copy)]
pub struct JudgmentSet<'a> {
    pub trajectory_id: Uuid,
    pub scores: &'a [RubricScore],
    /// The scores came from a fallback (answer-only call), not the stagewise call.
    pub fallback: bool,
    /// The scale of `scores` (2, or 4 for DeepRubric's 0-4 grades).
    pub point_scale: u8,
}

/// Store the per-rubric judgments of a group of trajectories in one statement (upsert per
/// trajectory, rubric and judge model). Scores for rubrics not in `rubrics` are skipped.
pub async fn insert_judgments(
    conn: &mut PgConnection,
    rubrics: &[Rubric],
    sets: &[JudgmentSet<'_>],
    judge_model: &str,
    kind: JudgeKind,
) -> Result<(), DbError> {
    let stage_of: HashMap<Uuid, i16> = rubrics.iter().map(|r| (r.id, r.stage as i16)).collect();
    let kept: Vec<(&JudgmentSet, &RubricScore)> = sets
        .iter()
        .flat_map(|j| j.scores.iter().map(move |s| (j, s)))
        .filter(|(_, s)| stage_of.contains_key(&s.rubric_id))
        .collect();
    if kept.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = kept.iter().map(|_| Uuid::now_v7()).collect();
    let tids: Vec<Uuid> = kept.iter().map(|(j, _)| j.trajectory_id).collect();
    let fallback: Vec<bool> = kept.iter().map(|(j, _)| j.fallback).collect();
    let rids: Vec<Uuid> = kept.iter().map(|(_, s)| s.rubric_id).collect();
    let stages: Vec<i16> = kept.iter().map(|(_, s)| stage_of[&s.rubric_id]).collect();
    // Stored on the 0..2 scale whatever the judge's (a 0-4 grade of 3 is 1.5).
    let sc: Vec<f32> = kept
        .iter()
        .map(|(j, s)| {
            let scale = j.point_scale.max(1);
            f32::from(s.score.min(scale)) * 2.0 / f32::from(scale)
        })
        .collect();
    let just: Vec<String> = kept
        .iter()
        .map(|(_, s)| super::pg_text(&s.justification).into_owned())
        .collect();
    sqlx::query(
        "INSERT INTO judgments (id, trajectory_id, rubric_id, stage, score, justification,
                                judge_model, judge_kind, fallback)
         SELECT u.id, u.tid, u.rid, u.stage, u.score, u.just, $1, $2, u.fallback
         FROM UNNEST($3::uuid[], $4::uuid[], $5::uuid[], $6::int2[], $7::real[], $8::text[],
                     $9::bool[])
              AS u(id, tid, rid, stage, score, just, fallback)
         ON CONFLICT (trajectory_id, rubric_id, judge_model) DO UPDATE SET
             score = EXCLUDED.score, justification = EXCLUDED.justification,
             fallback = EXCLUDED.fallback, created_at = now()",
    )
    .bind(judge_model)
    .bind(kind.as_str())
    .bind(&ids)
    .bind(&tids)
    .bind(&rids)
    .bind(&stages)
    .bind(&sc)
    .bind(&just)
    .bind(&fallback)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// One trajectory's four stage rows.
#[derive(Debug, Clone, PartialEq)]
pub struct StageRow {
    pub trajectory_id: Uuid,
    pub scores: [f64; 4],
    pub returns: [f64; 4],
    pub advantages: [f64; 4],
    pub source: &'static str,
}

pub async fn upsert_stage_scores(
    conn: &mut PgConnection,
    rows: &[StageRow],
    judge_model: &str,
    kind: JudgeKind,
) -> Result<(), DbError> {
    let mut tid = Vec::new();
    let mut stage = Vec::new();
    let mut score = Vec::new();
    let mut ret = Vec::new();
    let mut adv = Vec::new();
    let mut src = Vec::new();
    for r in rows {
        for k in 0..4 {
            tid.push(r.trajectory_id);
            stage.push(k as i16);
            score.push(r.scores[k] as f32);
            ret.push(r.returns[k] as f32);
            adv.push(r.advantages[k] as f32);
            src.push(r.source);
        }
    }
    sqlx::query(
        "INSERT INTO stage_scores (trajectory_id, stage, judge_model, score, stage_return,
                                   advantage, source, judge_kind)
         SELECT u.t, u.k, $1, u.s, u.g, u.a, u.src, $2
         FROM UNNEST($3::uuid[], $4::int2[], $5::real[], $6::real[], $7::real[], $8::text[])
              AS u(t, k, s, g, a, src)
         ON CONFLICT (trajectory_id, stage, judge_model) DO UPDATE SET
             score = EXCLUDED.score, stage_return = EXCLUDED.stage_return,
             advantage = EXCLUDED.advantage, source = EXCLUDED.source,
             judge_kind = EXCLUDED.judge_kind, created_at = now()",
    )
    .bind(judge_model)
    .bind(kind.as_str())
    .bind(&tid)
    .bind(&stage)
    .bind(&score)
    .bind(&ret)
    .bind(&adv)
    .bind(&src)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// A scalar reward row (Baseline-RL's R4 or DR Tulu's composite).
#[derive(Debug, Clone, PartialEq)]
pub struct RewardRow {
    pub trajectory_id: Uuid,
    pub reward: f64,
    pub rubric: f64,
    pub citation: Option<f64>,
    pub format: Option<f64>,
    pub search: Option<f64>,
    pub advantage: f64,
}

pub async fn upsert_rewards(
    conn: &mut PgConnection,
    rows: &[RewardRow],
    judge_model: &str,
    recipe: &str,
) -> Result<(), DbError> {
    let f = |g: fn(&RewardRow) -> f64| rows.iter().map(|r| g(r) as f32).collect::<Vec<_>>();
    let o = |g: fn(&RewardRow) -> Option<f64>| {
        rows.iter()
            .map(|r| g(r).map(|v| v as f32))
            .collect::<Vec<_>>()
    };
    let ids: Vec<Uuid> = rows.iter().map(|r| r.trajectory_id).collect();
    sqlx::query(
        "INSERT INTO trajectory_rewards (trajectory_id, judge_model, recipe, reward, rubric,
                                         citation, format, search, advantage)
         SELECT u.t, $1, $2, u.reward, u.rubric, u.citation, u.format, u.search, u.adv
         FROM UNNEST($3::uuid[], $4::real[], $5::real[], $6::real[], $7::real[], $8::real[],
                     $9::real[]) AS u(t, reward, rubric, citation, format, search, adv)
         ON CONFLICT (trajectory_id, judge_model) DO UPDATE SET
             recipe = EXCLUDED.recipe, reward = EXCLUDED.reward, rubric = EXCLUDED.rubric,
             citation = EXCLUDED.citation, format = EXCLUDED.format, search = EXCLUDED.search,
             advantage = EXCLUDED.advantage, created_at = now()",
    )
    .bind(judge_model)
    .bind(recipe)
    .bind(&ids)
    .bind(f(|r| r.reward))
    .bind(f(|r| r.rubric))
    .bind(o(|r| r.citation))
    .bind(o(|r| r.format))
    .bind(o(|r| r.search))
    .bind(f(|r| r.advantage))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Log judge calls (failed ones included).
pub async fn insert_calls(
    conn: &mut PgConnection,
    run_id: Uuid,
    step: i32,
    task_id: Option<Uuid>,
    calls: &[CallRecord],
    judge_model: &str,
    kind: JudgeKind,
) -> Result<(), DbError> {
    if calls.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = calls.iter().map(|_| Uuid::now_v7()).collect();
    let tids: Vec<Option<Uuid>> = calls.iter().map(|c| c.trajectory_id).collect();
    let kinds: Vec<&str> = calls.iter().map(|c| c.kind.as_str()).collect();
    let ok: Vec<bool> = calls.iter().map(|c| c.error.is_none()).collect();
    let att: Vec<i32> = calls.iter().map(|c| c.usage.attempts as i32).collect();
    let pt: Vec<i32> = calls.iter().map(|c| c.usage.prompt_tokens as i32).collect();
    let ct: Vec<i32> = calls
        .iter()
        .map(|c| c.usage.completion_tokens as i32)
        .collect();
    let cost: Vec<f64> = calls.iter().map(|c| c.usage.cost_usd).collect();
    let lat: Vec<i32> = calls.iter().map(|c| c.usage.latency_ms as i32).collect();
    let err: Vec<Option<String>> = calls
        .iter()
        .map(|c| c.error.as_deref().map(|e| super::pg_text(e).into_owned()))
        .collect();
    sqlx::query(
        "INSERT INTO judge_calls (id, run_id, step, task_id, trajectory_id, kind, judge_model,
                                  judge_kind, ok, attempts, prompt_tokens, completion_tokens,
                                  cost_usd, latency_ms, error)
         SELECT u.id, $1, $2, $3, u.tid, u.kind, $4, $5, u.ok, u.att, u.pt, u.ct, u.cost,
                u.lat, u.err
         FROM UNNEST($6::uuid[], $7::uuid[], $8::text[], $9::bool[], $10::int4[], $11::int4[],
                     $12::int4[], $13::float8[], $14::int4[], $15::text[])
              AS u(id, tid, kind, ok, att, pt, ct, cost, lat, err)",
    )
    .bind(run_id)
    .bind(step)
    .bind(task_id)
    .bind(judge_model)
    .bind(kind.as_str())
    .bind(&ids)
    .bind(&tids)
    .bind(&kinds)
    .bind(&ok)
    .bind(&att)
    .bind(&pt)
    .bind(&ct)
    .bind(&cost)
    .bind(&lat)
    .bind(&err)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// A trajectory's per-rubric judgments with the rubric's stage and title, for the reflection
/// judge (stage order, then rubric title).
pub async fn findings(
    pool: &PgPool,
    trajectory_id: Uuid,
    judge_model: &str,
) -> Result<Vec<crate::domain::judge::Finding>, DbError> {
    let rows: Vec<(i16, String, String, f32, String)> = sqlx::query_as(
        "SELECT r.stage, r.title, r.description, j.score, j.justification
         FROM judgments j JOIN rubrics r ON r.id = j.rubric_id
         WHERE j.trajectory_id = $1 AND j.judge_model = $2
         ORDER BY r.stage, r.title, r.id",
    )
    .bind(trajectory_id)
    .bind(judge_model)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(stage, title, description, score, justification)| {
            let stage = Stage::from_index(i64::from(stage))?;
            Some(crate::domain::judge::Finding {
                stage,
                title: if title.is_empty() { description } else { title },
                score,
                justification,
            })
        })
        .collect())
}

/// Map trajectory ids to their per-stage advantages for a step (the batch builder's input).
/// Trajectories of a step whose scoring by `judge_model` failed (`stage_scores.source =
/// 'failed'`): they are never trained on.
pub async fn failed_scoring(
    pool: &PgPool,
    run_id: Uuid,
    step: i32,
    judge_model: &str,
) -> Result<std::collections::HashSet<Uuid>, DbError> {
    let rows: Vec<(Uuid,)> = sqlx::query_as(
        "SELECT DISTINCT s.trajectory_id FROM stage_scores s
         JOIN trajectories t ON t.id = s.trajectory_id
         WHERE t.run_id = $1 AND t.step = $2 AND s.judge_model = $3 AND s.source = 'failed'",
    )
    .bind(run_id)
    .bind(step)
    .bind(judge_model)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|(t,)| t).collect())
}

pub async fn load_advantages(
    pool: &PgPool,
    run_id: Uuid,
    step: i32,
    judge_model: &str,
) -> Result<std::collections::HashMap<Uuid, [f64; crate::domain::credit::STAGES]>, DbError> {
    let rows: Vec<(Uuid, i16, Option<f32>)> = sqlx::query_as(
        "SELECT s.trajectory_id, s.stage, s.advantage FROM stage_scores s
         JOIN trajectories t ON t.id = s.trajectory_id
         WHERE t.run_id = $1 AND t.step = $2 AND s.judge_model = $3",
    )
    .bind(run_id)
    .bind(step)
    .bind(judge_model)
    .fetch_all(pool)
    .await?;
    let mut out: std::collections::HashMap<Uuid, [f64; crate::domain::credit::STAGES]> =
        HashMap::new();
    for (t, k, a) in rows {
        if let Some(slot) = out.entry(t).or_default().get_mut(k as usize) {
            *slot = f64::from(a.unwrap_or(0.0));
        }
    }
    Ok(out)
}
