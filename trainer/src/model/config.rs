//! `Qwen3Config`: the subset of a Hugging Face Qwen3 `config.json` the model needs, read from
//! both the transformers 4 (`rope_theta`) and 5 (`rope_parameters`) layouts, with range checks.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Result, TrainerError};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Qwen3Config {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    #[serde(default)]
    pub head_dim: Option<i64>,
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: i64,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_parameters: Option<Value>,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Everything else in the file, kept so a rewritten config loses nothing.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

fn default_max_pos() -> i64 {
    40960
}
fn default_eps() -> f64 {
    1e-6
}
fn default_act() -> String {
    "silu".into()
}

impl Qwen3Config {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(TrainerError::io(path))?;
        let cfg: Self = serde_json::from_str(&text).map_err(TrainerError::json(path))?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn head_dim(&self) -> i64 {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// RoPE base: `rope_theta`, else `rope_parameters.rope_theta`, else 10000.
    pub fn theta(&self) -> f64 {
        self.rope_theta
            .or_else(|| {
                self.rope_parameters
                    .as_ref()
                    .and_then(|p| p.get("rope_theta"))
                    .and_then(Value::as_f64)
            })
            .unwrap_or(10000.0)
    }

    /// Where `self` differs from `served` in anything the model computes with (sizes, position
    /// limit, rotary base, norm epsilon, tying, bias, activation), as `field = ours, served
    /// theirs` items; empty when the two build the same function shapes and positions.
    /// Metadata (`extra`: token ids, dtype names, architectures) does not count.
    pub fn architecture_diff(&self, served: &Self) -> Vec<String> {
        let mut out = Vec::new();
        let mut int = |name: &str, a: i64, b: i64| {
            if a != b {
                out.push(format!("{name} = {a}, served {b}"));
            }
        };
        int("vocab_size", self.vocab_size, served.vocab_size);
        int("hidden_size", self.hidden_size, served.hidden_size);
        int(
            "intermediate_size",
            self.intermediate_size,
            served.intermediate_size,
        );
        int(
            "num_hidden_layers",
            self.num_hidden_layers,
            served.num_hidden_layers,
        );
        int(
            "num_attention_heads",
            self.num_attention_heads,
            served.num_attention_heads,
        );
        int(
            "num_key_value_heads",
            self.num_key_value_heads,
            served.num_key_value_heads,
        );
        int("head_dim", self.head_dim(), served.head_dim());
        int(
            "max_position_embeddings",
            self.max_position_embeddings,
            served.max_position_embeddings,
        );
        let mut other = |name: &str, a: String, b: String| {
            if a != b {
                out.push(format!("{name} = {a}, served {b}"));
            }
        };
        other(
            "rope_theta",
            self.theta().to_string(),
            served.theta().to_string(),
        );
        other(
            "rms_norm_eps",
            self.rms_norm_eps.to_string(),
            served.rms_norm_eps.to_string(),
        );
        other(
            "tie_word_embeddings",
            self.tie_word_embeddings.to_string(),
            served.tie_word_embeddings.to_string(),
        );
        other(
            "attention_bias",
            self.attention_bias.to_string(),
            served.attention_bias.to_string(),
        );
        other(
            "hidden_act",
            self.hidden_act.clone(),
            served.hidden_act.clone(),
        );
        out
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(TrainerError::Config(m));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v < 1 {
                return bad(format!("{name} = {v}; it must be at least 1"));
            }
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return bad(format!(
                "num_attention_heads = {} is not a multiple of num_key_value_heads = {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.head_dim() % 2 != 0 || self.head_dim() < 2 {
            return bad(format!(
                "head_dim = {} must be even and at least 2 (rotary embedding)",
                self.head_dim()
            ));
        }
        if self.hidden_act != "silu" {
            return bad(format!(
                "hidden_act = {:?}; only \"silu\" is supported",
                self.hidden_act
            ));
        }
        let rope_type = self
            .rope_scaling
            .as_ref()
            .or(self.rope_parameters.as_ref())
            .and_then(|p| p.get("rope_type").or_else(|| p.get("type")))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if rope_type != "default" {
            return bad(format!(
                "rope_type = {rope_type:?}; only \"default\" rotary embeddings are supported"
            ));
        }
        if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1.0) {
            return bad(format!(
                "rms_norm_eps = {}; allowed: (0, 1)",
                self.rms_norm_eps
            ));
        }
        Ok(())
    }
}
