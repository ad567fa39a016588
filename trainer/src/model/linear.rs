//! The linear layer of the model's projections and the LoRA layer it may carry: `Proj`
//! (`y = x Wᵀ + b`, plus the adapter's low-rank update when the forward mode asks for it),
//! `Lora` (the A/B pair), the adapter's `LoraConfig` and `LoraTarget`s, and `Fwd`, how a
//! forward pass runs. Shared by the model (`qwen3`) and the PEFT adapter files (`lora`), and
//! importing neither.

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::error::{Result, TrainerError};

/// How a forward pass runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fwd {
    /// Apply the LoRA adapters (false = the reference policy, the frozen base).
    pub lora: bool,
    /// Training mode (LoRA dropout active).
    pub train: bool,
}

impl Fwd {
    pub const POLICY: Fwd = Fwd {
        lora: true,
        train: false,
    };
    pub const REFERENCE: Fwd = Fwd {
        lora: false,
        train: false,
    };
    pub const TRAIN: Fwd = Fwd {
        lora: true,
        train: true,
    };
}

/// Which projections carry adapters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LoraTarget {
    #[serde(rename = "q_proj")]
    Q,
    #[serde(rename = "k_proj")]
    K,
    #[serde(rename = "v_proj")]
    V,
    #[serde(rename = "o_proj")]
    O,
    #[serde(rename = "gate_proj")]
    Gate,
    #[serde(rename = "up_proj")]
    Up,
    #[serde(rename = "down_proj")]
    Down,
}

impl LoraTarget {
    pub const ALL: [LoraTarget; 7] = [
        Self::Q,
        Self::K,
        Self::V,
        Self::O,
        Self::Gate,
        Self::Up,
        Self::Down,
    ];
    pub fn module(self) -> &'static str {
        match self {
            Self::Q => "q_proj",
            Self::K => "k_proj",
            Self::V => "v_proj",
            Self::O => "o_proj",
            Self::Gate => "gate_proj",
            Self::Up => "up_proj",
            Self::Down => "down_proj",
        }
    }
    pub fn parse(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.module() == s || t.module().trim_end_matches("_proj") == s)
            .ok_or_else(|| {
                TrainerError::Config(format!(
                    "LoRA target {s:?}; allowed: q, k, v, o, gate, up, down (or *_proj)"
                ))
            })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    pub r: i64,
    pub alpha: f64,
    #[serde(default)]
    pub dropout: f64,
    pub targets: Vec<LoraTarget>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        Self {
            r: 16,
            alpha: 32.0,
            dropout: 0.0,
            targets: LoraTarget::ALL.to_vec(),
        }
    }
}

impl LoraConfig {
    pub fn scale(&self) -> f64 {
        self.alpha / self.r as f64
    }
    pub fn validate(&self) -> Result<()> {
        if !(1..=1024).contains(&self.r) {
            return Err(TrainerError::Config(format!(
                "lora r = {}; allowed: 1..=1024",
                self.r
            )));
        }
        if self.alpha.is_nan() || self.alpha <= 0.0 {
            return Err(TrainerError::Config(format!(
                "lora alpha = {}; it must be > 0",
                self.alpha
            )));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(TrainerError::Config(format!(
                "lora dropout = {}; allowed: [0, 1)",
                self.dropout
            )));
        }
        if self.targets.is_empty() {
            return Err(TrainerError::Config("lora targets are empty".into()));
        }
        Ok(())
    }
}

/// A LoRA pair on one projection: `y += dropout(x) Aᵀ Bᵀ · alpha/r`.
#[derive(Debug)]
pub struct Lora {
    pub a: Tensor,
    pub b: Tensor,
    pub scale: f64,
    pub dropout: f64,
}

impl Lora {
    /// A fresh adapter for a `[d_out, d_in]` weight, as PEFT initialises it: A Kaiming-uniform
    /// (a = sqrt(5), so bound 1/sqrt(d_in)), B zeros, so the adapter starts as a no-op. Draws
    /// from libtorch's default generator (the caller holds `rng_lock` and has seeded it).
    pub fn init(d_out: i64, d_in: i64, cfg: &LoraConfig, device: Device) -> Self {
        let r = cfg.r;
        let bound = 1.0 / (d_in as f64).sqrt();
        let a = (Tensor::rand([r, d_in], (Kind::Float, Device::Cpu)) * (2.0 * bound) - bound)
            .to_device(device)
            .set_requires_grad(true);
        let b = Tensor::zeros([d_out, r], (Kind::Float, device)).set_requires_grad(true);
        Self {
            a,
            b,
            scale: cfg.scale(),
            dropout: cfg.dropout,
        }
    }

    /// The adapter's contribution for input `xs` (computed in the adapter's dtype, returned in
    /// the input's), with dropout on the input when training.
    pub fn delta(&self, xs: &Tensor, train: bool) -> Tensor {
        let x = xs.to_kind(self.a.kind());
        let x = if train && self.dropout > 0.0 {
            x.dropout(self.dropout, true)
        } else {
            x
        };
        let delta = x
            .linear::<Tensor>(&self.a, None)
            .linear::<Tensor>(&self.b, None)
            * self.scale;
        delta.to_kind(xs.kind())
    }

    /// The adapter folded into a weight update, `s·B·A`, in `kind`.
    pub fn weight_delta(&self, kind: Kind) -> Tensor {
        (self.b.matmul(&self.a) * self.scale).to_kind(kind)
    }
}

/// A bias-free (or biased) linear layer with an optional LoRA adapter.
#[derive(Debug)]
pub struct Proj {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub lora: Option<Lora>,
}

impl Proj {
    pub fn forward(&self, xs: &Tensor, f: Fwd) -> Tensor {
        let y = xs.linear(&self.weight, self.bias.as_ref());
        match (&self.lora, f.lora) {
            (Some(l), true) => y + l.delta(xs, f.train),
            _ => y,
        }
    }

    /// Fold the adapter into the weight (W += s·B·A) and drop it.
    pub fn merge(&mut self) {
        if let Some(l) = self.lora.take() {
            tch::no_grad(|| {
                let _ = self.weight.f_add_(&l.weight_delta(self.weight.kind()));
            });
        }
    }
}
