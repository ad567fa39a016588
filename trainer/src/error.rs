//! The trainer's error type: one enum for every boundary (files, configs, tensors, libtorch).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TrainerError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: unreadable safetensors: {message}")]
    Safetensors { path: PathBuf, message: String },
    #[error("config: {0}")]
    Config(String),
    #[error("weights: tensor `{0}` is missing")]
    MissingTensor(String),
    #[error("weights: unexpected tensors (a module the model does not have?): {0}")]
    UnexpectedTensors(String),
    #[error("weights: `{name}` has shape {got:?}, expected {want:?}")]
    Shape {
        name: String,
        got: Vec<i64>,
        want: Vec<i64>,
    },
    #[error("batch: {0}")]
    Batch(String),
    /// What is asked for contradicts the settings the trainer holds (a checkpoint of another
    /// fine-tune mode or LoRA shape).
    #[error("settings: {0}")]
    Mismatch(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

impl TrainerError {
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }
    pub fn json(path: impl Into<PathBuf>) -> impl FnOnce(serde_json::Error) -> Self {
        let path = path.into();
        move |source| Self::Json { path, source }
    }
}

pub type Result<T, E = TrainerError> = std::result::Result<T, E>;
