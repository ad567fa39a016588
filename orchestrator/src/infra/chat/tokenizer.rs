//! Loading a Hugging Face tokenizer directory and encoding/decoding without special tokens added.

use std::path::{Path, PathBuf};

use super::template::{ChatTemplate, TemplateError};

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("cannot load tokenizer {path}: {message}")]
    Load { path: PathBuf, message: String },
    #[error("tokenizer failed on {what}: {message}")]
    Codec { what: &'static str, message: String },
    #[error(transparent)]
    Template(#[from] TemplateError),
}

/// A model directory's tokenizer plus its chat template.
pub struct ModelTokenizer {
    inner: tokenizers::Tokenizer,
    template: ChatTemplate,
    dir: PathBuf,
}

impl std::fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl ModelTokenizer {
    /// Load `tokenizer.json` and `tokenizer_config.json` (for `chat_template` and the special
    /// tokens) from `dir`. A `chat_template.jinja` file, the newer transformers layout, wins over
    /// the config's field.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let dir = dir.as_ref().to_path_buf();
        let tok_path = dir.join("tokenizer.json");
        let inner =
            tokenizers::Tokenizer::from_file(&tok_path).map_err(|e| TokenizerError::Load {
                path: tok_path.clone(),
                message: e.to_string(),
            })?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg_text = std::fs::read_to_string(&cfg_path).map_err(|e| TokenizerError::Read {
            path: cfg_path.clone(),
            message: e.to_string(),
        })?;
        let cfg: serde_json::Value =
            serde_json::from_str(&cfg_text).map_err(|e| TokenizerError::Read {
                path: cfg_path.clone(),
                message: e.to_string(),
            })?;
        let jinja_path = dir.join("chat_template.jinja");
        let source = if jinja_path.exists() {
            std::fs::read_to_string(&jinja_path).map_err(|e| TokenizerError::Read {
                path: jinja_path.clone(),
                message: e.to_string(),
            })?
        } else {
            cfg.get("chat_template")
                .and_then(|v| v.as_str())
                .map(str::to_string)
                .ok_or_else(|| TokenizerError::Read {
                    path: cfg_path.clone(),
                    message: "no chat_template (string) in tokenizer_config.json".into(),
                })?
        };
        let template = ChatTemplate::new(&source, special_tokens(&cfg))?;
        Ok(Self {
            inner,
            template,
            dir,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// Encode text exactly as given (no BOS/EOS added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizerError::Codec {
                what: "encode",
                message: e.to_string(),
            })
    }

    /// Decode ids, keeping special tokens (the scaffold's tags may be special tokens).
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, false)
            .map_err(|e| TokenizerError::Codec {
                what: "decode",
                message: e.to_string(),
            })
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// `bos_token`, `eos_token`, `unk_token`, `pad_token` as transformers passes them to templates:
/// plain strings, or the `content` of an AddedToken object.
fn special_tokens(cfg: &serde_json::Value) -> Vec<(String, String)> {
    ["bos_token", "eos_token", "unk_token", "pad_token"]
        .iter()
        .filter_map(|k| {
            let v = cfg.get(*k)?;
            let s = v
                .as_str()
                .or_else(|| v.get("content").and_then(|c| c.as_str()))?;
            Some(((*k).to_string(), s.to_string()))
        })
        .collect()
}
