//! Talking to OpenAI-compatible inference servers (vLLM, SGLang, TGI, `trainer serve`): the one
//! reqwest client, endpoint pools per role, retries, feature detection and wire types. Nothing
//! outside this module sends HTTP to a model server.

pub mod client;
pub mod endpoints;
pub mod error;
pub mod features;
pub mod judge;
pub mod retry;
pub mod secrets;
pub mod trainer;
pub mod types;

pub use client::{ApiKey, LlmClient, Timing, build_http};
pub use endpoints::{Endpoint, EndpointPool, EndpointStats, Role};
pub use error::LlmError;
pub use features::{ServerFeatures, detect, detect_all};
pub use retry::RetryPolicy;
pub use types::*;
