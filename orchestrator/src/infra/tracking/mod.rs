//! Experiment trackers, the doors to them: TensorBoard event files written by hand
//! (`tensorboard`: TFRecord framing, masked CRC-32C, protobuf `Event`s) and an MLflow tracking
//! server over its REST API (`mlflow`). What is written, and under which names, is decided in
//! `domain::tracking`; following a run is `pipeline::tracking`.

pub mod mlflow;
pub mod tensorboard;

/// What a tracker door can fail with. Messages never carry a token: MLflow's is sent only in
/// the `Authorization` header and registered for redaction.
#[derive(Debug, thiserror::Error)]
pub enum TrackingError {
    #[error("TensorBoard event file {path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("MLflow at {endpoint}: {message}")]
    Http { endpoint: String, message: String },
    #[error("MLflow at {endpoint} answered HTTP {status} {code}: {message}")]
    Status {
        endpoint: String,
        status: u16,
        /// MLflow's `error_code` (e.g. `RESOURCE_DOES_NOT_EXIST`), empty when the body had none.
        code: String,
        message: String,
    },
    #[error("MLflow at {endpoint}: unexpected reply: {message}")]
    Decode { endpoint: String, message: String },
    #[error("MLflow URL {url:?} is not an http(s) URL")]
    BadUrl { url: String },
}

impl TrackingError {
    /// Worth another try: connection errors, timeouts, 408, 429 and 5xx.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Http { .. } => true,
            Self::Status { status, .. } => *status == 408 || *status == 429 || *status >= 500,
            Self::Io { .. } | Self::Decode { .. } | Self::BadUrl { .. } => false,
        }
    }
}
