//! Errors at the boundary to inference servers, and which of them are worth retrying.

use std::time::Duration;

/// Longest body excerpt carried in an error message.
pub const EXCERPT_CHARS: usize = 300;

#[derive(Debug, Clone, thiserror::Error)]
pub enum LlmError {
    #[error("cannot connect to {endpoint}: {message}")]
    Connect { endpoint: String, message: String },
    #[error("{endpoint} did not answer within {after:?}")]
    Timeout { endpoint: String, after: Duration },
    #[error("{endpoint} answered HTTP {status}: {excerpt}")]
    Status {
        endpoint: String,
        status: u16,
        excerpt: String,
    },
    #[error("{endpoint} answered an invalid body ({reason}): {excerpt}")]
    InvalidBody {
        endpoint: String,
        reason: String,
        excerpt: String,
    },
    #[error("{endpoint} lacks what the {role} role needs: {}", missing.join("; "))]
    MissingFeatures {
        endpoint: String,
        role: &'static str,
        missing: Vec<String>,
    },
    #[error("no endpoint configured for the {role} role")]
    NoEndpoint { role: &'static str },
    #[error("request to {endpoint} is invalid: {message}")]
    Request { endpoint: String, message: String },
    #[error(
        "environment variable {var} (named by api_key_env) is not set or empty; export the API key there"
    )]
    MissingApiKey { var: String },
    #[error("cancelled")]
    Cancelled,
}

impl LlmError {
    /// 429, 5xx, 408, timeouts, connection errors and garbage bodies are transient; everything
    /// else (4xx, missing features, bad requests) fails at once.
    pub fn is_retryable(&self) -> bool {
        match self {
            LlmError::Connect { .. } | LlmError::Timeout { .. } | LlmError::InvalidBody { .. } => {
                true
            }
            LlmError::Status { status, .. } => *status == 429 || *status == 408 || *status >= 500,
            LlmError::MissingFeatures { .. }
            | LlmError::NoEndpoint { .. }
            | LlmError::Request { .. }
            | LlmError::MissingApiKey { .. }
            | LlmError::Cancelled => false,
        }
    }

    /// Whether the failure says something about the endpoint's health (as opposed to the request).
    pub fn is_endpoint_failure(&self) -> bool {
        match self {
            LlmError::Connect { .. } | LlmError::Timeout { .. } => true,
            LlmError::Status { status, .. } => *status >= 500,
            _ => false,
        }
    }
}

/// The first [`EXCERPT_CHARS`] characters of a body, lossily decoded and with every registered
/// API key redacted (`secrets`), for error messages.
pub fn excerpt(body: &[u8]) -> String {
    let raw = String::from_utf8_lossy(body);
    let text = super::secrets::redact(&raw);
    let mut out: String = text.chars().take(EXCERPT_CHARS).collect();
    if text.chars().count() > EXCERPT_CHARS {
        out.push('…');
    }
    if out.is_empty() {
        out.push_str("<empty body>");
    }
    out
}
