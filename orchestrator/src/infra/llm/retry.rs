//! The retry policy: jittered exponential backoff through `backon`, only for retryable errors.
//! This is the only file that uses `backon`.

use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};

use super::LlmError;
use crate::domain::config::RetryConfig;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    pub min_delay: Duration,
    pub max_delay: Duration,
    pub jitter: bool,
}

impl RetryPolicy {
    pub fn from_config(cfg: &RetryConfig) -> Self {
        Self {
            max_retries: cfg.max_retries,
            min_delay: Duration::from_millis(cfg.min_delay_ms),
            max_delay: Duration::from_millis(cfg.max_delay_ms),
            jitter: true,
        }
    }

    /// No retries at all (feature detection, health probes).
    pub fn none() -> Self {
        Self {
            max_retries: 0,
            min_delay: Duration::ZERO,
            max_delay: Duration::ZERO,
            jitter: false,
        }
    }

    fn backoff(&self) -> ExponentialBuilder {
        let b = ExponentialBuilder::default()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .with_factor(2.0)
            .with_max_times(self.max_retries as usize);
        if self.jitter { b.with_jitter() } else { b }
    }

    /// Run `op` until it succeeds, fails with a non-retryable error, or retries run out; the last
    /// error is returned. `on_retry` sees each retryable error and the delay before the next try.
    pub async fn run<T, F, Fut>(
        &self,
        op: F,
        on_retry: impl Fn(&LlmError, Duration),
    ) -> Result<T, LlmError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, LlmError>>,
    {
        self.run_when(op, LlmError::is_retryable, on_retry).await
    }

    /// [`Self::run`] for another door's error type: `retryable` says which errors are retried
    /// (the experiment trackers' client uses it).
    pub async fn run_when<T, E, F, Fut>(
        &self,
        op: F,
        retryable: impl FnMut(&E) -> bool,
        on_retry: impl Fn(&E, Duration),
    ) -> Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        op.retry(self.backoff())
            .sleep(tokio::time::sleep)
            .when(retryable)
            .notify(|e: &E, d: Duration| on_retry(e, d))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn policy(n: u32) -> RetryPolicy {
        RetryPolicy {
            max_retries: n,
            min_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
            jitter: false,
        }
    }

    fn status(code: u16) -> LlmError {
        LlmError::Status {
            endpoint: "e".into(),
            status: code,
            excerpt: String::new(),
        }
    }

    #[tokio::test]
    async fn retries_retryable_until_success() {
        let calls = AtomicU32::new(0);
        let out = policy(5)
            .run(
                || async {
                    let n = calls.fetch_add(1, Ordering::SeqCst);
                    if n < 3 { Err(status(503)) } else { Ok(n) }
                },
                |_, _| {},
            )
            .await;
        assert_eq!(out.unwrap(), 3);
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn gives_up_after_max_retries_with_last_error() {
        let calls = AtomicU32::new(0);
        let out: Result<(), _> = policy(2)
            .run(
                || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Err(status(429))
                },
                |_, _| {},
            )
            .await;
        assert!(matches!(out, Err(LlmError::Status { status: 429, .. })));
        assert_eq!(calls.load(Ordering::SeqCst), 3, "first try + 2 retries");
    }

    #[tokio::test]
    async fn does_not_retry_client_errors() {
        for code in [400u16, 401, 404, 422] {
            let calls = AtomicU32::new(0);
            let out: Result<(), _> = policy(5)
                .run(
                    || async {
                        calls.fetch_add(1, Ordering::SeqCst);
                        Err(status(code))
                    },
                    |_, _| {},
                )
                .await;
            assert!(out.is_err());
            assert_eq!(
                calls.load(Ordering::SeqCst),
                1,
                "HTTP {code} must not be retried"
            );
        }
    }

    #[test]
    fn classification() {
        assert!(status(500).is_retryable());
        assert!(status(502).is_retryable());
        assert!(status(429).is_retryable());
        assert!(status(408).is_retryable());
        assert!(!status(400).is_retryable());
        assert!(
            LlmError::Timeout {
                endpoint: "e".into(),
                after: Duration::from_secs(1)
            }
            .is_retryable()
        );
        assert!(
            !LlmError::MissingFeatures {
                endpoint: "e".into(),
                role: "policy",
                missing: vec![]
            }
            .is_retryable()
        );
    }
}
