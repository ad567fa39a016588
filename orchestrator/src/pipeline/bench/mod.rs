//! Benchmark evaluation (`orchestrator eval --benchmark ...`): select the items, get one response
//! per item from the responder, grade each with every judge of the panel by the benchmark's own
//! protocol, and summarise on the benchmark's own scale. Everything is stored in Postgres as it
//! is produced; an evaluation of the same name resumes: stored responses are not regenerated and
//! graded units are not regraded.

pub mod grade;
pub mod periodic;
pub mod respond;
pub mod summary;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::domain::bench::cite::Source;
use crate::domain::bench::{Benchmark, Item};
use crate::infra::db::bench::{NewBenchRun, ResponseRow, ScoreRow};
use crate::infra::db::{self, DbError};
pub use grade::{Clean, FactPages, GradeOptions, Grader, JudgeSpec, Templates};
pub use respond::Responder;
pub use summary::Summary;

/// The judge label of the string-match grader (short answers scored without an LLM judge).
pub const STRING_MATCH: &str = "string-match";

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(
        "an evaluation named `{name}` exists with other settings ({what} differs: stored {stored}, now {now}); choose another --name"
    )]
    Conflict {
        name: String,
        what: &'static str,
        stored: String,
        now: String,
    },
    #[error("evaluation `{name}` was interrupted; run the same command again to resume it")]
    Interrupted { name: String },
}

/// One evaluation to run (or resume).
pub struct BenchRun {
    pub name: String,
    pub bench: Benchmark,
    pub data_path: String,
    pub data_sha256: String,
    /// The selected items, in selection order.
    pub items: Vec<Item>,
    /// How the items were selected ({limit, seed, sampling}).
    pub selection: Value,
    pub responder: Responder,
    /// The responder's settings as recorded (model, URL, sampling, tools, prompt hashes).
    pub responder_desc: Value,
    /// The judge panel (empty: short answers are scored by string match only).
    pub judges: Vec<JudgeSpec>,
    pub templates: Templates,
    pub opts: GradeOptions,
    /// Responses in flight.
    pub gen_inflight: usize,
    /// Judge calls in flight (over the whole panel).
    pub judge_inflight: usize,
    pub bootstrap: usize,
    pub seed: u64,
    pub source_run_id: Option<Uuid>,
    pub policy_version: Option<i32>,
    pub progress: bool,
}

impl BenchRun {
    fn grading_desc(&self) -> Value {
        json!({
            "judges": self.judges.iter().map(JudgeSpec::describe).collect::<Vec<_>>(),
            "templates": self.templates.hashes(&grade::templates_of(self.bench, &self.opts)),
            "options": self.opts,
        })
    }
}

/// Run (or resume) an evaluation; `Err(Interrupted)` when `cancel` fired (what was done is
/// stored).
pub async fn run(
    pool: &PgPool,
    spec: BenchRun,
    cancel: &CancellationToken,
) -> Result<Summary, BenchError> {
    let t0 = Instant::now();
    let run_id = register(pool, &spec).await?;
    let spec = Arc::new(spec);

    // Responses: generate what is missing, each stored as soon as it exists.
    let mut responses = db::bench::responses(pool, run_id).await?;
    let missing: Vec<Item> = spec
        .items
        .iter()
        .filter(|i| !responses.contains_key(&i.id))
        .cloned()
        .collect();
    if !missing.is_empty() {
        let pb = bar(spec.progress, missing.len(), "responses");
        // Whatever responses are ready are stored together (one statement); a slow responder
        // stores them one by one as they come, so a kill loses none that finished.
        let mut stream = futures::stream::iter(missing.into_iter().map(|item| {
            let spec = spec.clone();
            async move { spec.responder.respond(spec.bench, run_id, &item).await }
        }))
        .buffer_unordered(spec.gen_inflight.max(1))
        .ready_chunks(256);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                next = stream.next() => match next {
                    Some(rows) => {
                        db::bench::insert_responses(pool, run_id, &rows).await?;
                        pb.inc(rows.len() as u64);
                        responses.extend(rows.into_iter().map(|r| (r.item_id.clone(), r)));
                    }
                    None => break,
                }
            }
        }
        pb.finish_and_clear();
        if cancel.is_cancelled() {
            db::bench::set_status(pool, run_id, "interrupted", None).await?;
            return Err(BenchError::Interrupted {
                name: spec.name.clone(),
            });
        }
    }

    // Grades: every (item, judge), units stored as they are graded by a writer task.
    let stored = db::bench::grades(pool, run_id)
        .await?
        .into_iter()
        .map(|g| {
            (
                (
                    g.item_id.clone(),
                    g.judge.clone(),
                    g.unit.clone(),
                    g.unit_index,
                ),
                g,
            )
        })
        .collect();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let writer_pool = pool.clone();
    let writer = tokio::spawn(async move {
        let mut first_err = None;
        let mut batch = Vec::new();
        // Units that arrived while the last batch was written go together in the next one.
        while rx.recv_many(&mut batch, 512).await > 0 {
            if let Err(e) = db::bench::insert_grades(&writer_pool, run_id, &batch).await {
                first_err.get_or_insert(e);
            }
            batch.clear();
        }
        first_err
    });
    let grader = Arc::new(Grader {
        templates: spec.templates.clone(),
        opts: spec.opts.clone(),
        sem: Arc::new(Semaphore::new(spec.judge_inflight.max(1))),
        stored,
        sink: tx,
    });
    let mut scores: Vec<ScoreRow> = Vec::new();
    if spec.judges.is_empty() {
        scores.extend(string_match_scores(&spec.items, &responses));
    } else {
        type Job = (Item, usize, Option<String>, Arc<Vec<Source>>);
        let jobs: Vec<Job> = spec
            .items
            .iter()
            .flat_map(|item| {
                let r = responses.get(&item.id);
                let answer = r.and_then(|r| r.answer.clone());
                let sources = Arc::new(respond::stored_sources(
                    r.and_then(|r| r.trajectory.as_ref()),
                ));
                (0..spec.judges.len())
                    .map(move |j| (item.clone(), j, answer.clone(), sources.clone()))
            })
            .collect();
        let pb = bar(spec.progress, jobs.len(), "grading");
        let mut stream =
            futures::stream::iter(jobs.into_iter().map(|(item, j, answer, sources)| {
                let (spec, grader) = (spec.clone(), grader.clone());
                async move {
                    grader
                        .grade(
                            spec.bench,
                            &spec.judges[j],
                            &item,
                            answer.as_deref(),
                            &sources,
                        )
                        .await
                }
            }))
            // Items in flight: enough to keep every judge-call slot busy.
            .buffer_unordered(spec.judge_inflight.max(1));
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                next = stream.next() => match next {
                    Some(s) => {
                        scores.push(s);
                        pb.inc(1);
                    }
                    None => break,
                }
            }
        }
        pb.finish_and_clear();
    }
    drop(grader);
    if let Ok(Some(e)) = writer.await {
        return Err(e.into());
    }
    if cancel.is_cancelled() {
        db::bench::set_status(pool, run_id, "interrupted", None).await?;
        return Err(BenchError::Interrupted {
            name: spec.name.clone(),
        });
    }
    db::bench::put_scores(pool, run_id, &scores).await?;

    let grades = db::bench::grades(pool, run_id).await?;
    let summary = summary::summarise(
        &spec,
        run_id,
        &responses,
        &scores,
        &grades,
        t0.elapsed().as_secs_f64(),
    );
    let value = serde_json::to_value(&summary).unwrap_or(Value::Null);
    db::bench::set_status(pool, run_id, "finished", Some(&value)).await?;
    Ok(summary)
}

/// Create the evaluation, or find the stored one of the same name and check it is the same
/// evaluation (benchmark, data file, selection); a resumed one is marked running again.
async fn register(pool: &PgPool, spec: &BenchRun) -> Result<Uuid, BenchError> {
    let selection = with_ids(&spec.selection, &spec.items);
    if let Some(row) = db::bench::find(pool, &spec.name).await? {
        // jsonb keeps its own key order: compare values, not their text.
        let checks: [(&'static str, bool, String, String); 3] = [
            (
                "benchmark",
                row.benchmark == spec.bench.to_string(),
                row.benchmark.clone(),
                spec.bench.to_string(),
            ),
            (
                "data file (sha256)",
                row.data_sha256 == spec.data_sha256,
                row.data_sha256.clone(),
                spec.data_sha256.clone(),
            ),
            (
                "selection",
                row.selection == selection,
                row.selection.to_string(),
                selection.to_string(),
            ),
        ];
        for (what, same, stored, now) in checks {
            if !same {
                return Err(BenchError::Conflict {
                    name: spec.name.clone(),
                    what,
                    stored: shorten(&stored),
                    now: shorten(&now),
                });
            }
        }
        tracing::info!(name = %spec.name, id = %row.id, "resuming evaluation");
        db::bench::set_status(pool, row.id, "running", None).await?;
        return Ok(row.id);
    }
    let items: Vec<(String, Value)> = spec
        .items
        .iter()
        .map(|i| (i.id.clone(), serde_json::to_value(i).unwrap_or(Value::Null)))
        .collect();
    let new = NewBenchRun {
        name: spec.name.clone(),
        benchmark: spec.bench.to_string(),
        data_path: spec.data_path.clone(),
        data_sha256: spec.data_sha256.clone(),
        selection,
        responder: spec.responder_desc.clone(),
        grading: spec.grading_desc(),
        source_run_id: spec.source_run_id,
        policy_version: spec.policy_version,
    };
    Ok(db::bench::create(pool, &new, &items).await?)
}

/// The selection recipe with the selected ids' hash (two selections are the same evaluation
/// only when they picked the same items).
fn with_ids(selection: &Value, items: &[Item]) -> Value {
    let ids: Vec<&str> = items.iter().map(|i| i.id.as_str()).collect();
    let mut s = selection.clone();
    if let Value::Object(m) = &mut s {
        m.insert("items".into(), json!(items.len()));
        m.insert(
            "ids_sha256".into(),
            json!(crate::domain::util::sha256_hex(ids.join("\n").as_bytes())),
        );
    }
    s
}

fn shorten(s: &str) -> String {
    if s.chars().count() > 120 {
        format!("{}…", s.chars().take(120).collect::<String>())
    } else {
        s.to_string()
    }
}

fn bar(on: bool, len: usize, what: &str) -> indicatif::ProgressBar {
    if on {
        crate::telemetry::progress(len as u64, what)
    } else {
        indicatif::ProgressBar::hidden()
    }
}

/// Short answers without a judge: the string-match grader's exact match is the item score.
fn string_match_scores(items: &[Item], responses: &HashMap<String, ResponseRow>) -> Vec<ScoreRow> {
    items
        .iter()
        .map(|item| {
            let answer = responses.get(&item.id).and_then(|r| r.answer.as_deref());
            let golds = match &item.gold {
                crate::domain::bench::Gold::Short { answers } => answers.as_slice(),
                _ => &[],
            };
            match answer {
                Some(a) if !golds.is_empty() => {
                    let m = grade::string_metrics(a, golds);
                    let em = m["em"].as_bool().unwrap_or(false);
                    ScoreRow {
                        item_id: item.id.clone(),
                        judge: STRING_MATCH.into(),
                        score: Some(if em { 1.0 } else { 0.0 }),
                        metrics: m,
                        error: None,
                    }
                }
                Some(_) => ScoreRow {
                    item_id: item.id.clone(),
                    judge: STRING_MATCH.into(),
                    score: None,
                    metrics: json!({}),
                    error: Some("the item has no short gold answer; it needs an LLM judge".into()),
                },
                None => ScoreRow {
                    item_id: item.id.clone(),
                    judge: STRING_MATCH.into(),
                    score: None,
                    metrics: json!({}),
                    error: Some("no response".into()),
                },
            }
        })
        .collect()
}
