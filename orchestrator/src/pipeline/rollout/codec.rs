//! How the rollout turns text into the policy's token ids and back: the chat template for the
//! prompt, encoding of tool outputs and injected text, decoding for stage boundaries.

use crate::infra::chat::ModelTokenizer;

#[derive(Debug, Clone, thiserror::Error)]
#[error("tokenizer: {0}")]
pub struct CodecError(pub String);

pub trait TokenCodec: Send + Sync {
    /// The prompt (system + user, generation prompt appended) as text.
    fn render_prompt(&self, system: &str, user: &str) -> Result<String, CodecError>;
    fn encode(&self, text: &str) -> Result<Vec<u32>, CodecError>;
    fn decode(&self, ids: &[u32]) -> Result<String, CodecError>;
}

impl TokenCodec for ModelTokenizer {
    fn render_prompt(&self, system: &str, user: &str) -> Result<String, CodecError> {
        let messages = serde_json::json!([
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ]);
        self.template()
            .render(&messages, None, true, &Default::default())
            .map_err(|e| CodecError(e.to_string()))
    }
    fn encode(&self, text: &str) -> Result<Vec<u32>, CodecError> {
        ModelTokenizer::encode(self, text).map_err(|e| CodecError(e.to_string()))
    }
    fn decode(&self, ids: &[u32]) -> Result<String, CodecError> {
        ModelTokenizer::decode(self, ids).map_err(|e| CodecError(e.to_string()))
    }
}
