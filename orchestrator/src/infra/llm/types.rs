//! Wire types of the OpenAI-compatible API (vLLM / SGLang / trainer serve dialect) and the
//! validated results the rest of the orchestrator sees.

use serde::{Deserialize, Serialize};

use crate::domain::config::RepetitionDetection;

/// `/v1/completions` with a token-id prompt. Token ids come back (`return_token_ids`), with one
/// sampled-token logprob each (`logprobs: 0`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: Vec<u32>,
    pub max_tokens: u32,
    pub temperature: f32,
    pub top_p: f32,
    pub n: u32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Keep the stop string in `text` (the token ids keep it regardless).
    pub include_stop_str_in_output: bool,
    pub skip_special_tokens: bool,
    pub return_token_ids: bool,
    /// Older vLLM: logprob tokens as `token_id:N`, a second source of the ids.
    pub return_tokens_as_token_ids: bool,
    pub logprobs: u32,
    /// vLLM's (>= 0.17) loop stop: the request ends with finish reason `repetition` when its
    /// generated tokens close in `min_count` copies of one block of `min_pattern_size` to
    /// `max_pattern_size` tokens. The config's `rollout.repetition_detection` as it is (its
    /// field names are vLLM's). Omitted when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repetition_detection: Option<RepetitionDetection>,
}

impl CompletionRequest {
    pub fn new(model: impl Into<String>, prompt: Vec<u32>, max_tokens: u32) -> Self {
        Self {
            model: model.into(),
            prompt,
            max_tokens,
            temperature: 1.0,
            top_p: 1.0,
            n: 1,
            stop: Vec::new(),
            seed: None,
            include_stop_str_in_output: true,
            skip_special_tokens: false,
            return_token_ids: true,
            return_tokens_as_token_ids: true,
            logprobs: 0,
            repetition_detection: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop string, stop token or EOS ended generation.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The server's repetition detection ended a loop (vLLM's `repetition`).
    Repetition,
    /// The server aborted the request (resumable).
    Abort,
    /// Anything else a server reports.
    Other,
}

impl FinishReason {
    pub fn parse(raw: Option<&str>) -> Self {
        match raw {
            Some("stop") | Some("eos") | Some("stop_sequence") => FinishReason::Stop,
            Some("length") | Some("max_tokens") => FinishReason::Length,
            Some("repetition") => FinishReason::Repetition,
            Some("abort") => FinishReason::Abort,
            _ => FinishReason::Other,
        }
    }
}

/// One validated completion choice: exactly one logprob per generated token id.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionChoice {
    pub text: String,
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub finish_reason: FinishReason,
    /// The stop string or token that ended generation, when the server says.
    pub stop_reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    pub usage: Usage,
    /// The endpoint that served it (recorded with every trajectory).
    pub endpoint: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
}

impl Usage {
    /// The call's cost at the given prices (USD per million tokens).
    pub fn cost_usd(&self, usd_per_mtok_prompt: f64, usd_per_mtok_completion: f64) -> f64 {
        (self.prompt_tokens as f64 * usd_per_mtok_prompt
            + self.completion_tokens as f64 * usd_per_mtok_completion)
            / 1e6
    }
}

// ---- raw response shapes (lenient: unknown fields ignored, optional fields optional) ----

#[derive(Debug, Deserialize)]
pub(crate) struct RawCompletion {
    #[serde(default)]
    pub model: String,
    pub choices: Vec<RawChoice>,
    #[serde(default)]
    pub usage: Option<Usage>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawChoice {
    #[serde(default)]
    pub index: u32,
    #[serde(default)]
    pub text: String,
    #[serde(default)]
    pub token_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub logprobs: Option<RawLogprobs>,
    #[serde(default)]
    pub finish_reason: Option<String>,
    #[serde(default)]
    pub stop_reason: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawLogprobs {
    #[serde(default)]
    pub tokens: Option<Vec<String>>,
    #[serde(default)]
    pub token_logprobs: Option<Vec<Option<f32>>>,
}

// ---- chat ----

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn system(content: impl Into<String>) -> Self {
        Self {
            role: "system".into(),
            content: content.into(),
        }
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self {
            role: "user".into(),
            content: content.into(),
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    pub temperature: f32,
    pub max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Stop sequences (most APIs drop the matched sequence from the content).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
}

/// OpenAI structured output: `{"type":"json_schema","json_schema":{"name","schema","strict"}}`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub json_schema: JsonSchemaSpec,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct JsonSchemaSpec {
    pub name: String,
    pub schema: serde_json::Value,
    pub strict: bool,
}

impl ResponseFormat {
    pub fn json_schema(name: impl Into<String>, schema: serde_json::Value) -> Self {
        Self {
            kind: "json_schema",
            json_schema: JsonSchemaSpec {
                name: name.into(),
                schema,
                strict: true,
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChatCompletion {
    pub model: String,
    pub content: String,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    pub endpoint: String,
}

/// A chat completion whose content was parsed into `T`.
#[derive(Debug, Clone, PartialEq)]
pub struct Structured<T> {
    pub value: T,
    pub raw: ChatCompletion,
    /// Attempts it took (1 = first try).
    pub attempts: u32,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawChat {
    #[serde(default)]
    pub model: String,
    pub choices: Vec<RawChatChoice>,
    #[serde(default)]
    pub usage: Option<Usage>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawChatChoice {
    pub message: RawChatMessage,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawChatMessage {
    #[serde(default)]
    pub content: Option<String>,
}

// ---- embeddings, tokenizer, models ----

#[derive(Debug, Clone, Serialize)]
pub(crate) struct EmbeddingRequest<'a> {
    pub model: &'a str,
    pub input: &'a [String],
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawEmbeddings {
    pub data: Vec<RawEmbedding>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawEmbedding {
    #[serde(default)]
    pub index: usize,
    pub embedding: Vec<f32>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct TokenizeRequest<'a> {
    pub model: &'a str,
    pub prompt: &'a str,
    pub add_special_tokens: bool,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawTokenize {
    pub tokens: Vec<u32>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct DetokenizeRequest<'a> {
    pub model: &'a str,
    pub tokens: &'a [u32],
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawDetokenize {
    pub prompt: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawModels {
    pub data: Vec<RawModel>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawModel {
    pub id: String,
}
