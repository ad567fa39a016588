//! Endpoint pools per role: per-endpoint concurrency limits, sticky (rendezvous-hash) routing per
//! trajectory, failover to the next endpoint on a failed attempt, and health probing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::LlmError;

/// The three roles an endpoint can serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Policy,
    Judge,
    Embeddings,
    /// A chat model writing SFT trajectories (`sft-data --teacher-url`).
    Teacher,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Policy => "policy",
            Role::Judge => "judge",
            Role::Embeddings => "embeddings",
            Role::Teacher => "teacher",
        }
    }
}

/// One inference server.
#[derive(Debug)]
pub struct Endpoint {
    /// Base URL without a trailing slash, e.g. `http://127.0.0.1:8000`.
    pub url: String,
    semaphore: Arc<Semaphore>,
    healthy: AtomicBool,
    consecutive_failures: AtomicU32,
    in_flight: AtomicUsize,
    served: AtomicU64,
    failed: AtomicU64,
}

/// A snapshot of an endpoint's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointStats {
    pub url: String,
    pub healthy: bool,
    pub in_flight: usize,
    pub served: u64,
    pub failed: u64,
}

impl Endpoint {
    fn new(url: &str, max_concurrency: usize) -> Self {
        Self {
            url: url.trim_end_matches('/').to_string(),
            semaphore: Arc::new(Semaphore::new(max_concurrency)),
            healthy: AtomicBool::new(true),
            consecutive_failures: AtomicU32::new(0),
            in_flight: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    pub fn set_healthy(&self, healthy: bool) {
        if healthy {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
        let was = self.healthy.swap(healthy, Ordering::Relaxed);
        if was != healthy {
            tracing::warn!(endpoint = %self.url, healthy, "endpoint health changed");
        }
    }

    /// Wait for a concurrency slot. Cancel-safe: dropping the future gives nothing up.
    pub async fn acquire(self: &Arc<Self>) -> Result<InFlight, LlmError> {
        let permit = self
            .semaphore
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| LlmError::Cancelled)?;
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(InFlight {
            endpoint: self.clone(),
            _permit: permit,
        })
    }

    pub(crate) fn record(&self, outcome: Result<(), &LlmError>, failures_before_unhealthy: u32) {
        match outcome {
            Ok(()) => {
                self.served.fetch_add(1, Ordering::Relaxed);
                self.consecutive_failures.store(0, Ordering::Relaxed);
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                if e.is_endpoint_failure() {
                    let n = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
                    if n >= failures_before_unhealthy {
                        self.set_healthy(false);
                    }
                }
            }
        }
    }

    pub fn stats(&self) -> EndpointStats {
        EndpointStats {
            url: self.url.clone(),
            healthy: self.is_healthy(),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            served: self.served.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }
}

/// A held concurrency slot on an endpoint.
#[derive(Debug)]
pub struct InFlight {
    endpoint: Arc<Endpoint>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.endpoint.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The endpoints serving one role.
#[derive(Debug)]
pub struct EndpointPool {
    pub role: Role,
    pub model: String,
    pub timeout: Duration,
    pub failures_before_unhealthy: u32,
    endpoints: Vec<Arc<Endpoint>>,
}

/// FNV-1a: stable across Rust versions, so routing is reproducible.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in *p {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl EndpointPool {
    pub fn new(
        role: Role,
        model: impl Into<String>,
        urls: &[String],
        max_concurrency: usize,
        timeout: Duration,
        failures_before_unhealthy: u32,
    ) -> Self {
        Self {
            role,
            model: model.into(),
            timeout,
            failures_before_unhealthy: failures_before_unhealthy.max(1),
            endpoints: urls
                .iter()
                .map(|u| Arc::new(Endpoint::new(u, max_concurrency)))
                .collect(),
        }
    }

    pub fn endpoints(&self) -> &[Arc<Endpoint>] {
        &self.endpoints
    }

    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// The endpoint for attempt `attempt` of a request. With a session key the order is the
    /// rendezvous-hash order of the healthy endpoints (so a trajectory stays on one server and
    /// reuses its prefix cache, and moves to the next one only when an attempt fails); without a
    /// key, healthy endpoints by fewest requests in flight. Unhealthy endpoints come last, so a
    /// pool whose every server is marked down still tries them.
    pub fn select(&self, session: Option<&str>, attempt: u32) -> Result<Arc<Endpoint>, LlmError> {
        if self.endpoints.is_empty() {
            return Err(LlmError::NoEndpoint {
                role: self.role.as_str(),
            });
        }
        if self.endpoints.len() == 1 {
            return Ok(self.endpoints[0].clone());
        }
        let mut order: Vec<&Arc<Endpoint>> = self.endpoints.iter().collect();
        match session {
            Some(key) => order.sort_by_key(|e| {
                (
                    !e.is_healthy(),
                    std::cmp::Reverse(fnv1a(&[key.as_bytes(), e.url.as_bytes()])),
                )
            }),
            None => order.sort_by_key(|e| (!e.is_healthy(), e.in_flight.load(Ordering::Relaxed))),
        }
        let idx = attempt as usize % order.len();
        Ok(order[idx].clone())
    }

    pub fn stats(&self) -> Vec<EndpointStats> {
        self.endpoints.iter().map(|e| e.stats()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize) -> EndpointPool {
        let urls: Vec<String> = (0..n).map(|i| format!("http://h{i}:80")).collect();
        EndpointPool::new(Role::Policy, "m", &urls, 4, Duration::from_secs(1), 2)
    }

    #[test]
    fn sticky_per_session_and_spread_across_sessions() {
        let p = pool(4);
        let mut hits = std::collections::HashMap::new();
        for i in 0..400 {
            let key = format!("traj-{i}");
            let a = p.select(Some(&key), 0).unwrap();
            let b = p.select(Some(&key), 0).unwrap();
            assert_eq!(a.url, b.url, "same session, same endpoint");
            *hits.entry(a.url.clone()).or_insert(0) += 1;
        }
        assert_eq!(hits.len(), 4);
        assert!(hits.values().all(|&n| n > 50), "{hits:?}");
    }

    #[test]
    fn failover_moves_to_another_endpoint() {
        let p = pool(3);
        let first = p.select(Some("s"), 0).unwrap();
        let second = p.select(Some("s"), 1).unwrap();
        assert_ne!(first.url, second.url);
    }

    #[test]
    fn unhealthy_endpoints_are_skipped_but_kept_as_last_resort() {
        let p = pool(2);
        let first = p.select(Some("s"), 0).unwrap();
        let err = LlmError::Connect {
            endpoint: first.url.clone(),
            message: "x".into(),
        };
        first.record(Err(&err), 2);
        assert!(first.is_healthy(), "one failure is not enough");
        first.record(Err(&err), 2);
        assert!(!first.is_healthy());
        assert_ne!(p.select(Some("s"), 0).unwrap().url, first.url);
        for e in p.endpoints() {
            e.set_healthy(false);
        }
        assert!(p.select(Some("s"), 0).is_ok());
    }

    #[test]
    fn client_errors_do_not_mark_unhealthy() {
        let p = pool(1);
        let e = &p.endpoints()[0];
        let err = LlmError::Status {
            endpoint: e.url.clone(),
            status: 400,
            excerpt: String::new(),
        };
        for _ in 0..10 {
            e.record(Err(&err), 2);
        }
        assert!(e.is_healthy());
    }

    #[test]
    fn empty_pool_names_role() {
        let p = EndpointPool::new(Role::Judge, "m", &[], 1, Duration::from_secs(1), 1);
        let err = p.select(None, 0).unwrap_err().to_string();
        assert_eq!(err, "no endpoint configured for the judge role");
    }
}
