//! Following a run into the experiment trackers: while the run goes on, a background task reads
//! the run's `step_metrics` recorded since its cursor every `tracking.poll_secs`, maps the
//! names (`domain::tracking`) and appends what is new or changed to a TensorBoard event file
//! and / or an MLflow run; at the run's end it flushes once more and marks the MLflow run
//! FINISHED, FAILED or KILLED. It never fails or holds up the run: a tracker error is logged
//! (warn), counted, and the unsent values are tried again at the next poll. A resumed run
//! continues its MLflow run (found by the `rubricem.run_id` tag) and adds an event file beside
//! its earlier ones. `orchestrator track` uses the same session to export a run post hoc.

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::domain::config::{Config, TrackingConfig};
use crate::domain::tracking::{EndStatus, Point, Row, Seen, flatten_params};
use crate::infra::db;
use crate::infra::llm::RetryPolicy;
use crate::infra::tracking::TrackingError;
use crate::infra::tracking::mlflow::MlflowClient;
use crate::infra::tracking::tensorboard::EventWriter;

/// Rows are re-read this far behind the cursor: a row's `recorded_at` is its transaction's
/// start, so a slow transaction can commit a row older than one already read.
const LOOKBACK: chrono::TimeDelta = chrono::TimeDelta::seconds(5);
/// Values held for a tracker that keeps failing; beyond this the oldest are dropped (counted).
const MAX_PENDING: usize = 500_000;
/// How long the end of a run waits for the final flush.
const FINAL_FLUSH: Duration = Duration::from_secs(60);
/// The MLflow tag that finds a run's MLflow run again on resume.
pub const RUN_ID_TAG: &str = "rubricem.run_id";

/// The run being tracked.
#[derive(Debug, Clone)]
pub struct Target {
    pub run_id: Uuid,
    pub run_name: String,
    pub recipe: String,
    /// Our experiment's name (the MLflow experiment unless `tracking.mlflow_experiment`).
    pub experiment: String,
    /// The resolved configuration as MLflow parameters (logged when the MLflow run is made).
    pub params: Vec<(String, String)>,
}

/// What a tracking session did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrackStats {
    pub polls: u64,
    /// Values handed to the trackers (new or changed).
    pub points: u64,
    pub tensorboard_events: u64,
    pub mlflow_requests: u64,
    /// Failed reads and writes (each retried at the next poll).
    pub errors: u64,
    /// Values given up on after [`MAX_PENDING`] piled up for a failing tracker.
    pub dropped: u64,
    /// Values still unsent when the session closed.
    pub unsent: u64,
    pub event_files: Vec<PathBuf>,
    pub mlflow_run: Option<String>,
}

struct TensorBoardSink {
    dir: PathBuf,
    writer: Option<EventWriter>,
    pending: Vec<Point>,
    /// Failures in a row.
    streak: u64,
}

struct MlflowSink {
    client: MlflowClient,
    experiment: String,
    run: Option<String>,
    /// The configuration is logged once, on the run's first start (MLflow refuses to change a
    /// parameter, and a resumed run's configuration may differ in its endpoints).
    params_logged: bool,
    pending: Vec<Point>,
    /// Failures in a row.
    streak: u64,
}

/// One run's trackers and the cursor into its metrics.
pub struct Session {
    pool: PgPool,
    target: Target,
    seen: Seen,
    cursor: Option<DateTime<Utc>>,
    lookback: chrono::TimeDelta,
    tensorboard: Option<TensorBoardSink>,
    mlflow: Option<MlflowSink>,
    stats: TrackStats,
    /// Failed reads of the metrics in a row.
    read_streak: u64,
}

/// A directory name from free text (letters, digits, `-`, `.`, `_`).
fn dir_name(s: &str) -> String {
    let n: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-._".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    match n.trim_matches('.') {
        "" => "_".into(),
        t => t.to_string(),
    }
}

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// One failure of a tracker (or of reading the metrics) that the next poll retries: counted,
/// and logged as a warning on the 1st, 10th, 100th, ... failure in a row (a tracker that is down
/// for a day must not flood the run's log), at debug level otherwise.
fn failed(stats: &mut TrackStats, streak: &mut u64, what: &str, e: &dyn std::fmt::Display) {
    stats.errors += 1;
    *streak += 1;
    let mut k = *streak;
    while k >= 10 && k.is_multiple_of(10) {
        k /= 10;
    }
    let n = *streak;
    if k == 1 {
        tracing::warn!(error = %e, failures_in_a_row = n, "trackers: {what} failed; retried at the next poll");
    } else {
        tracing::debug!(error = %e, failures_in_a_row = n, "trackers: {what} failed");
    }
}

/// A success after failures ends the streak (and says so).
fn recovered(streak: &mut u64, what: &str) {
    if *streak > 0 {
        tracing::info!(after = *streak, "trackers: {what} works again");
        *streak = 0;
    }
}

/// Append `points` to a tracker's queue, dropping the oldest beyond [`MAX_PENDING`].
fn enqueue(pending: &mut Vec<Point>, points: &[Point], dropped: &mut u64) {
    pending.extend_from_slice(points);
    if pending.len() > MAX_PENDING {
        let over = pending.len() - MAX_PENDING;
        pending.drain(..over);
        *dropped += over as u64;
    }
}

impl Session {
    /// The trackers `cfg` configures for `target`; `None` when none is. A bad MLflow URL (which
    /// validation refuses earlier) is the only error.
    pub fn new(
        pool: PgPool,
        cfg: &TrackingConfig,
        target: Target,
    ) -> Result<Option<Self>, TrackingError> {
        if !cfg.enabled() {
            return Ok(None);
        }
        let tensorboard = cfg.tensorboard_dir.as_ref().map(|d| TensorBoardSink {
            dir: d.join(dir_name(&target.experiment)).join(format!(
                "{}.{}",
                dir_name(&target.run_name),
                &target.run_id.simple().to_string()[..8]
            )),
            writer: None,
            pending: Vec::new(),
            streak: 0,
        });
        let mlflow = match &cfg.mlflow_url {
            Some(url) => Some(MlflowSink {
                client: MlflowClient::new(url, tracker_retry())?,
                experiment: cfg
                    .mlflow_experiment
                    .clone()
                    .unwrap_or_else(|| target.experiment.clone()),
                run: None,
                params_logged: false,
                pending: Vec::new(),
                streak: 0,
            }),
            None => None,
        };
        Ok(Some(Self {
            pool,
            target,
            seen: Seen::default(),
            cursor: None,
            lookback: LOOKBACK,
            tensorboard,
            mlflow,
            stats: TrackStats::default(),
            read_streak: 0,
        }))
    }

    /// Another re-read window than [`LOOKBACK`] (5 s).
    pub fn with_lookback(mut self, lookback: chrono::TimeDelta) -> Self {
        self.lookback = lookback;
        self
    }

    pub fn stats(&self) -> &TrackStats {
        &self.stats
    }

    /// Read what was recorded since the cursor and hand it to every tracker. Never fails:
    /// errors are logged and counted, and what was not written waits for the next poll.
    pub async fn poll(&mut self) {
        self.stats.polls += 1;
        let after = self.cursor.map(|c| c - self.lookback);
        match db::tracking::metrics_since(&self.pool, self.target.run_id, after).await {
            Ok(rows) => {
                recovered(&mut self.read_streak, "reading the step metrics");
                if let Some(last) = rows.iter().map(|r| r.recorded_at).max() {
                    self.cursor = Some(self.cursor.map_or(last, |c| c.max(last)));
                }
                let rows: Vec<Row> = rows
                    .into_iter()
                    .map(|r| Row {
                        step: r.step,
                        name: r.name,
                        value: r.value,
                        recorded_ms: r.recorded_at.timestamp_millis(),
                    })
                    .collect();
                let points = self.seen.take(&rows);
                self.stats.points += points.len() as u64;
                if let Some(t) = &mut self.tensorboard {
                    enqueue(&mut t.pending, &points, &mut self.stats.dropped);
                }
                if let Some(m) = &mut self.mlflow {
                    enqueue(&mut m.pending, &points, &mut self.stats.dropped);
                }
            }
            Err(e) => failed(
                &mut self.stats,
                &mut self.read_streak,
                "reading the step metrics",
                &e,
            ),
        }
        self.flush_tensorboard();
        self.flush_mlflow().await;
    }

    fn flush_tensorboard(&mut self) {
        let Some(t) = &mut self.tensorboard else {
            return;
        };
        if t.pending.is_empty() && t.writer.is_some() {
            return;
        }
        if t.writer.is_none() {
            match EventWriter::create(&t.dir) {
                Ok(w) => {
                    tracing::info!(file = %w.path().display(), "TensorBoard event file opened");
                    self.stats.event_files.push(w.path().to_path_buf());
                    t.writer = Some(w);
                }
                Err(e) => {
                    failed(
                        &mut self.stats,
                        &mut t.streak,
                        "opening a TensorBoard event file",
                        &e,
                    );
                    return;
                }
            }
        }
        let Some(w) = &mut t.writer else { return };
        if t.pending.is_empty() {
            return;
        }
        match w.write_points(&t.pending) {
            Ok(events) => {
                self.stats.tensorboard_events += events as u64;
                t.pending.clear();
                recovered(&mut t.streak, "TensorBoard");
            }
            Err(e) => {
                // A failed batch may be torn: the next one goes to a new file.
                t.writer = None;
                failed(
                    &mut self.stats,
                    &mut t.streak,
                    "writing TensorBoard events",
                    &e,
                );
            }
        }
    }

    /// The MLflow run of this run: found by tag (a resumed run, set RUNNING again; true) or
    /// created with its tags (false).
    async fn mlflow_run(m: &MlflowSink, target: &Target) -> Result<(String, bool), TrackingError> {
        let exp = m.client.experiment_id(&m.experiment).await?;
        let id = target.run_id.to_string();
        if let Some(run) = m.client.find_run(&exp, RUN_ID_TAG, &id).await? {
            m.client.set_status(&run, "RUNNING", None).await?;
            return Ok((run, true));
        }
        let tags = [
            (RUN_ID_TAG.to_string(), id),
            ("rubricem.recipe".to_string(), target.recipe.clone()),
            ("rubricem.experiment".to_string(), target.experiment.clone()),
        ];
        let run = m
            .client
            .create_run(&exp, &target.run_name, now_ms(), &tags)
            .await?;
        Ok((run, false))
    }

    async fn flush_mlflow(&mut self) {
        let Some(m) = &mut self.mlflow else { return };
        if m.run.is_none() {
            match Self::mlflow_run(m, &self.target).await {
                Ok((run, resumed)) => {
                    tracing::info!(url = m.client.url(), experiment = %m.experiment, mlflow_run = %run, resumed, "MLflow run opened");
                    self.stats.mlflow_run = Some(run.clone());
                    m.run = Some(run);
                    m.params_logged = resumed;
                }
                Err(e) => {
                    failed(&mut self.stats, &mut m.streak, "opening the MLflow run", &e);
                    return;
                }
            }
        }
        let Some(run) = m.run.clone() else { return };
        if !m.params_logged {
            match m.client.log_params(&run, &self.target.params).await {
                Ok(()) => m.params_logged = true,
                Err(e) => {
                    failed(
                        &mut self.stats,
                        &mut m.streak,
                        "logging the configuration to MLflow",
                        &e,
                    );
                    return;
                }
            }
        }
        while !m.pending.is_empty() {
            let n = m
                .pending
                .len()
                .min(crate::domain::tracking::MLFLOW_MAX_METRICS);
            match m.client.log_metrics(&run, &m.pending[..n]).await {
                Ok(requests) => {
                    self.stats.mlflow_requests += requests as u64;
                    m.pending.drain(..n);
                    recovered(&mut m.streak, "MLflow");
                }
                Err(e) => {
                    failed(
                        &mut self.stats,
                        &mut m.streak,
                        "logging metrics to MLflow",
                        &e,
                    );
                    return;
                }
            }
        }
    }

    /// A last poll, then the MLflow run's final status (when the run ended: `status` set).
    /// Returns what the session did.
    pub async fn close(mut self, status: Option<EndStatus>) -> TrackStats {
        self.poll().await;
        if let (Some(m), Some(st)) = (&self.mlflow, status)
            && let Some(run) = &m.run
            && let Err(e) = m
                .client
                .set_status(run, st.as_mlflow(), Some(now_ms()))
                .await
        {
            self.stats.errors += 1;
            tracing::warn!(error = %e, status = st.as_mlflow(), "trackers: setting the MLflow run's status failed");
        }
        self.stats.unsent = self
            .tensorboard
            .as_ref()
            .map_or(0, |t| t.pending.len() as u64)
            + self.mlflow.as_ref().map_or(0, |m| m.pending.len() as u64);
        self.stats
    }
}

/// Retries of one tracker request: a few, quickly (the next poll retries anyway).
fn tracker_retry() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        min_delay: Duration::from_millis(200),
        max_delay: Duration::from_secs(2),
        jitter: true,
    }
}

/// The background task following one run; [`Follower::finish`] ends it.
pub struct Follower {
    stop: Option<oneshot::Sender<Option<EndStatus>>>,
    handle: tokio::task::JoinHandle<TrackStats>,
}

/// Start following run `run_id` into the trackers of `cfg.tracking`; `None` when none is
/// configured (or the MLflow URL is unusable, which is logged). The task stops when
/// [`Follower::finish`] is called or the `Follower` is dropped, not at Ctrl-C: an interrupted
/// run still trains its judged steps, and their metrics belong in the trackers too.
pub fn follow(
    pool: &PgPool,
    cfg: &Config,
    run_id: Uuid,
    run_name: &str,
    recipe: &str,
) -> Option<Follower> {
    let target = Target {
        run_id,
        run_name: run_name.to_string(),
        recipe: recipe.to_string(),
        experiment: cfg.experiment.name.clone(),
        params: flatten_params(&cfg.snapshot()),
    };
    let mut session = match Session::new(pool.clone(), &cfg.tracking, target) {
        Ok(Some(s)) => s,
        Ok(None) => return None,
        Err(e) => {
            tracing::warn!(error = %e, "trackers: not started");
            return None;
        }
    };
    let every = Duration::from_secs(cfg.tracking.poll_secs.max(1));
    let (tx, mut rx) = oneshot::channel::<Option<EndStatus>>();
    let handle = tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let status = loop {
            tokio::select! {
                biased;
                st = &mut rx => break st.ok().flatten(),
                _ = tick.tick() => session.poll().await,
            }
        };
        session.close(status).await
    });
    Some(Follower {
        stop: Some(tx),
        handle,
    })
}

impl Follower {
    /// End the follower: a final flush, and the MLflow run marked with `status`. Waits at most
    /// a minute (a tracker that does not answer cannot hold up the end of a run); `None` when
    /// it did not finish in time.
    pub async fn finish(mut self, status: EndStatus) -> Option<TrackStats> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(Some(status));
        }
        match tokio::time::timeout(FINAL_FLUSH, &mut self.handle).await {
            Ok(Ok(stats)) => {
                tracing::info!(
                    polls = stats.polls,
                    values = stats.points,
                    errors = stats.errors,
                    unsent = stats.unsent,
                    "trackers: final flush done"
                );
                Some(stats)
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "trackers: the follower task failed");
                None
            }
            Err(_) => {
                self.handle.abort();
                tracing::warn!(
                    "trackers: the final flush did not finish within a minute; abandoned"
                );
                None
            }
        }
    }
}

/// How a pipeline result ends a run, for the trackers (as `orchestrator run` marks the run:
/// interrupted or paused for the judge: KILLED, resumable).
pub fn end_status(
    result: &Result<crate::pipeline::Outcome, crate::pipeline::PipelineError>,
) -> EndStatus {
    match result {
        Ok(o) if o.interrupted => EndStatus::Killed,
        Ok(_) => EndStatus::Finished,
        Err(crate::pipeline::PipelineError::JudgeDown { .. }) => EndStatus::Killed,
        Err(_) => EndStatus::Failed,
    }
}

/// Export every stored metric of `run` (with `params`) to the trackers of `cfg` in one pass,
/// and set the MLflow run's status from the run's (`orchestrator track`).
pub async fn export(
    pool: &PgPool,
    cfg: &TrackingConfig,
    run: &db::tracking::TrackedRun,
    params: Vec<(String, String)>,
) -> Result<Option<TrackStats>, TrackingError> {
    let target = Target {
        run_id: run.id,
        run_name: run.name.clone(),
        recipe: run.recipe.clone(),
        experiment: run.experiment.clone(),
        params,
    };
    let Some(session) = Session::new(pool.clone(), cfg, target)? else {
        return Ok(None);
    };
    Ok(Some(
        session.close(EndStatus::from_run_status(&run.status)).await,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_names_are_plain() {
        assert_eq!(dir_name("smoke"), "smoke");
        assert_eq!(dir_name("a/b c"), "a_b_c");
        assert_eq!(dir_name(".."), "_");
    }

    #[test]
    fn a_failing_tracker_keeps_the_newest_values_up_to_the_cap_and_counts_the_rest() {
        let p = |step| Point {
            step,
            tag: "t".into(),
            value: 0.0,
            wall_ms: 0,
        };
        let mut pending: Vec<Point> = (0..MAX_PENDING as i64).map(p).collect();
        let mut dropped = 0;
        enqueue(&mut pending, &[p(-1), p(-2)], &mut dropped);
        assert_eq!((pending.len(), dropped), (MAX_PENDING, 2));
        assert_eq!(pending[0].step, 2);
        assert_eq!(pending.last().unwrap().step, -2);
    }

    #[test]
    fn failures_are_counted_and_a_success_ends_the_streak() {
        let mut stats = TrackStats::default();
        let mut streak = 0;
        for _ in 0..12 {
            failed(&mut stats, &mut streak, "x", &"boom");
        }
        assert_eq!((stats.errors, streak), (12, 12));
        recovered(&mut streak, "x");
        assert_eq!(streak, 0);
    }
}
