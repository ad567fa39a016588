//! Admission control towards the policy servers: before a trajectory starts, wait while any
//! server reports more queued requests than allowed on its metrics endpoint. The queue depths
//! are polled at most every `interval` and shared by all waiting trajectories.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

#[derive(Debug)]
pub struct Admission {
    http: reqwest::Client,
    urls: Vec<String>,
    max_waiting: f64,
    interval: Duration,
    /// (when polled, deepest queue seen); `None` depth: no server exposes a queue metric.
    last: Mutex<Option<(Instant, Option<f64>)>>,
    held: Mutex<Duration>,
}

impl Admission {
    pub fn new(http: reqwest::Client, urls: Vec<String>, max_waiting: u32) -> Self {
        Self {
            http,
            urls,
            max_waiting: f64::from(max_waiting),
            interval: Duration::from_millis(250),
            last: Mutex::new(None),
            held: Mutex::new(Duration::ZERO),
        }
    }

    async fn depth(&self) -> Option<f64> {
        if let Ok(g) = self.last.lock()
            && let Some((at, d)) = *g
            && at.elapsed() < self.interval
        {
            return d;
        }
        let mut deepest: Option<f64> = None;
        for u in &self.urls {
            if let Some(d) = crate::infra::llm::trainer::queue_depth(&self.http, u).await {
                deepest = Some(deepest.map_or(d, |x: f64| x.max(d)));
            }
        }
        if let Ok(mut g) = self.last.lock() {
            *g = Some((Instant::now(), deepest));
        }
        deepest
    }

    /// Return once the deepest queue is within the limit (or no server reports one, or the
    /// batch is cancelled).
    pub async fn admit(&self, cancel: &CancellationToken) {
        let t0 = Instant::now();
        while !cancel.is_cancelled() {
            match self.depth().await {
                Some(d) if d > self.max_waiting => {
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(self.interval) => {}
                    }
                }
                _ => break,
            }
        }
        if let Ok(mut h) = self.held.lock() {
            *h += t0.elapsed();
        }
    }

    /// Total time trajectories were held back (summed over trajectories), then reset.
    pub fn take_held(&self) -> Duration {
        self.held
            .lock()
            .map(|mut h| std::mem::take(&mut *h))
            .unwrap_or_default()
    }
}
