//! The embeddings door for the rubric bank: a configured OpenAI-compatible `/v1/embeddings`
//! endpoint pool, or the local feature-hash embedding of `domain::bank::embed` when the
//! experiment names it (`embeddings.model = "local-hash-v1"`).

use crate::domain::bank::embed::LOCAL_MODEL;
use crate::domain::bank::{BankError, LocalEmbedder, normalize};
use crate::infra::llm::{LlmClient, LlmError};

impl From<LlmError> for BankError {
    fn from(e: LlmError) -> Self {
        BankError::Embed(std::sync::Arc::new(e))
    }
}

/// Where embeddings come from.
#[derive(Debug, Clone)]
pub enum Embedder {
    Local(LocalEmbedder),
    Remote(LlmClient),
}

impl Embedder {
    /// The local feature-hash embedding when `embeddings.model` names it (chosen explicitly,
    /// never as a silent fallback), else the configured endpoint pool, which must have URLs.
    pub fn from_config(cfg: &crate::domain::config::Config) -> Result<Self, BankError> {
        let e = &cfg.embeddings;
        if e.model == LOCAL_MODEL {
            return Ok(Embedder::Local(LocalEmbedder::default()));
        }
        if e.urls.is_empty() {
            return Err(BankError::NoEndpoint {
                model: e.model.clone(),
            });
        }
        Ok(Embedder::Remote(LlmClient::for_role(
            cfg,
            crate::infra::llm::Role::Embeddings,
            e,
        )?))
    }

    pub fn model(&self) -> &str {
        match self {
            Embedder::Local(_) => LOCAL_MODEL,
            Embedder::Remote(c) => c.model(),
        }
    }

    /// One normalised vector per text, in order.
    pub async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, BankError> {
        let mut out = match self {
            Embedder::Local(l) => texts.iter().map(|t| l.embed_one(t)).collect(),
            Embedder::Remote(c) => c.embed(texts).await?,
        };
        for v in &mut out {
            normalize(v);
        }
        Ok(out)
    }
}
