//! The rubric bank and reflection rows: one bank item per (run, task); reflection candidates
//! with their judged utility and GRPO advantage; background job status. A job's candidates,
//! bank writes and status commit in one transaction, so a resumed run sees all of a job or none.

use sqlx::PgPool;
use uuid::Uuid;

use super::DbError;
use crate::domain::bank::{BankError, BankItem};

impl From<DbError> for BankError {
    fn from(e: DbError) -> Self {
        BankError::Db(std::sync::Arc::new(e))
    }
}

type BankTuple = (
    Uuid,
    String,
    String,
    Vec<f32>,
    String,
    String,
    f32,
    i32,
    Option<Uuid>,
);

fn to_item(r: BankTuple) -> BankItem {
    BankItem {
        task_id: r.0,
        question: r.1,
        question_sha256: r.2,
        embedding: r.3,
        rubrics: r.4,
        takeaways: r.5,
        score: r.6,
        step: r.7,
        reflection_id: r.8,
    }
}

const BANK_COLS: &str = "task_id, question, question_sha256, embedding, rubrics, takeaways, \
                         score, step, reflection_id";

/// Every item of a run's bank, oldest write first.
pub async fn load(pool: &PgPool, run_id: Uuid) -> Result<Vec<BankItem>, DbError> {
    let rows: Vec<BankTuple> = sqlx::query_as(&format!(
        "SELECT {BANK_COLS} FROM rubric_bank WHERE run_id = $1 ORDER BY updated_at, task_id"
    ))
    .bind(run_id)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(to_item).collect())
}

/// Insert or overwrite the task's item.
pub async fn upsert(pool: &PgPool, run_id: Uuid, it: &BankItem) -> Result<(), DbError> {
    let mut conn = pool.acquire().await?;
    upsert_in(&mut conn, run_id, it).await
}

pub async fn upsert_in(
    conn: &mut sqlx::PgConnection,
    run_id: Uuid,
    it: &BankItem,
) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO rubric_bank (run_id, task_id, question, question_sha256, embedding, rubrics,
                                  takeaways, score, step, reflection_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
         ON CONFLICT (run_id, task_id) DO UPDATE
         SET question = EXCLUDED.question, question_sha256 = EXCLUDED.question_sha256,
             embedding = EXCLUDED.embedding, rubrics = EXCLUDED.rubrics,
             takeaways = EXCLUDED.takeaways, score = EXCLUDED.score, step = EXCLUDED.step,
             reflection_id = EXCLUDED.reflection_id, updated_at = now()",
    )
    .bind(run_id)
    .bind(it.task_id)
    .bind(super::pg_text(&it.question))
    .bind(&it.question_sha256)
    .bind(&it.embedding)
    .bind(super::pg_text(&it.rubrics))
    .bind(super::pg_text(&it.takeaways))
    .bind(it.score)
    .bind(it.step)
    .bind(it.reflection_id)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// One reflection candidate as stored.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ReflectionRow {
    pub id: Uuid,
    pub step: i32,
    pub task_id: Uuid,
    pub source_trajectory_id: Option<Uuid>,
    pub candidate_index: i32,
    pub prompt_token_ids: Vec<i32>,
    pub token_ids: Vec<i32>,
    pub logprobs: Vec<f32>,
    pub text: String,
    pub valid: bool,
    pub score: Option<f32>,
    pub utility: serde_json::Value,
    pub judge_model: Option<String>,
    pub judge_kind: Option<String>,
    pub advantage: Option<f32>,
    pub policy_version: i32,
    pub trained_step: Option<i32>,
}

const REFLECTION_COLS: &str = "id, step, task_id, source_trajectory_id, candidate_index, \
    prompt_token_ids, token_ids, logprobs, text, valid, score, utility, judge_model, judge_kind, \
    advantage, policy_version, trained_step";

/// Mark a step's job as running (a rerun after a crash starts it again).
pub async fn start_job(pool: &PgPool, run_id: Uuid, step: i32) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO reflection_jobs (run_id, step, status) VALUES ($1, $2, 'running')
         ON CONFLICT (run_id, step) DO UPDATE
         SET status = 'running', error = NULL, started_at = now(), finished_at = NULL",
    )
    .bind(run_id)
    .bind(step)
    .execute(pool)
    .await?;
    Ok(())
}

/// A failed job is recorded with its error; its questions fall back to cross-episode memory.
pub async fn fail_job(pool: &PgPool, run_id: Uuid, step: i32, error: &str) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE reflection_jobs SET status = 'failed', error = $3, finished_at = now()
         WHERE run_id = $1 AND step = $2",
    )
    .bind(run_id)
    .bind(step)
    .bind(super::pg_text(error))
    .execute(pool)
    .await?;
    Ok(())
}

/// Commit a finished job: its candidates (replacing any of an earlier attempt), its bank
/// writes and its status, in one transaction.
pub async fn commit_job(
    pool: &PgPool,
    run_id: Uuid,
    step: i32,
    rows: &[ReflectionRow],
    bank: &[BankItem],
) -> Result<(), DbError> {
    let mut tx = pool.begin().await?;
    sqlx::query("DELETE FROM reflections WHERE run_id = $1 AND step = $2")
        .bind(run_id)
        .bind(step)
        .execute(&mut *tx)
        .await?;
    // Multi-row INSERTs (one round trip per chunk, not per candidate); 18 binds per row stays
    // far below Postgres' 65,535-parameter limit at 512 rows.
    for chunk in rows.chunks(512) {
        let mut qb = sqlx::QueryBuilder::<sqlx::Postgres>::new(
            "INSERT INTO reflections (id, run_id, step, task_id, source_trajectory_id,
                 candidate_index, prompt_token_ids, token_ids, logprobs, text, valid, score,
                 utility, judge_model, judge_kind, advantage, policy_version, trained_step) ",
        );
        qb.push_values(chunk, |mut b, r| {
            b.push_bind(r.id)
                .push_bind(run_id)
                .push_bind(r.step)
                .push_bind(r.task_id)
                .push_bind(r.source_trajectory_id)
                .push_bind(r.candidate_index)
                .push_bind(&r.prompt_token_ids)
                .push_bind(&r.token_ids)
                .push_bind(&r.logprobs)
                .push_bind(super::pg_text(&r.text))
                .push_bind(r.valid)
                .push_bind(r.score)
                .push_bind(&r.utility)
                .push_bind(&r.judge_model)
                .push_bind(&r.judge_kind)
                .push_bind(r.advantage)
                .push_bind(r.policy_version)
                .push_bind(r.trained_step);
        });
        qb.build().execute(&mut *tx).await?;
    }
    for it in bank {
        upsert_in(&mut tx, run_id, it).await?;
    }
    sqlx::query(
        "UPDATE reflection_jobs SET status = 'done', candidates = $3, valid = $4,
             bank_writes = $5, error = NULL, finished_at = now()
         WHERE run_id = $1 AND step = $2",
    )
    .bind(run_id)
    .bind(step)
    .bind(rows.len() as i32)
    .bind(rows.iter().filter(|r| r.valid).count() as i32)
    .bind(bank.len() as i32)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// The status of one step's job, if it was ever started.
pub async fn job_status(pool: &PgPool, run_id: Uuid, step: i32) -> Result<Option<String>, DbError> {
    Ok(
        sqlx::query_scalar("SELECT status FROM reflection_jobs WHERE run_id = $1 AND step = $2")
            .bind(run_id)
            .bind(step)
            .fetch_optional(pool)
            .await?,
    )
}

/// `(step, status)` of every job of a run.
pub async fn jobs(pool: &PgPool, run_id: Uuid) -> Result<Vec<(i32, String)>, DbError> {
    Ok(
        sqlx::query_as("SELECT step, status FROM reflection_jobs WHERE run_id = $1 ORDER BY step")
            .bind(run_id)
            .fetch_all(pool)
            .await?,
    )
}

/// Give every finished, not yet trained candidate of steps before `train_step` to that step's
/// deferred (Phase A) batch; returns how many rows it took. Only a step's first build calls
/// this; a replay reads the assignment back with [`for_training`].
pub async fn assign_for_training(
    pool: &PgPool,
    run_id: Uuid,
    train_step: i32,
) -> Result<u64, DbError> {
    let r = sqlx::query(
        "UPDATE reflections r SET trained_step = $2
         FROM reflection_jobs j
         WHERE r.run_id = $1 AND r.trained_step IS NULL AND r.step < $2
           AND j.run_id = r.run_id AND j.step = r.step AND j.status = 'done'
           AND r.advantage IS NOT NULL",
    )
    .bind(run_id)
    .bind(train_step)
    .execute(pool)
    .await?;
    Ok(r.rows_affected())
}

/// The candidates assigned to a step's deferred batch, in a stable order.
pub async fn for_training(
    pool: &PgPool,
    run_id: Uuid,
    train_step: i32,
) -> Result<Vec<ReflectionRow>, DbError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {REFLECTION_COLS} FROM reflections WHERE run_id = $1 AND trained_step = $2
         ORDER BY step, task_id, candidate_index"
    ))
    .bind(run_id)
    .bind(train_step)
    .fetch_all(pool)
    .await?)
}

/// Candidates of one generation step.
pub async fn for_step(
    pool: &PgPool,
    run_id: Uuid,
    step: i32,
) -> Result<Vec<ReflectionRow>, DbError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {REFLECTION_COLS} FROM reflections WHERE run_id = $1 AND step = $2
         ORDER BY task_id, candidate_index"
    ))
    .bind(run_id)
    .bind(step)
    .fetch_all(pool)
    .await?)
}
