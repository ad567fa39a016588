//! Rotary position embeddings (RoPE) as Qwen3 uses them: f32 cos/sin tables precomputed up to
//! `max_position_embeddings`, applied in the rotate-half layout of Hugging Face, for a run of
//! positions (prefill, training) or one position per row (batched decoding).

use tch::{Device, Kind, Tensor};

use super::config::Qwen3Config;

/// Precomputed rotary tables (f32), rotate-half layout as in Hugging Face.
#[derive(Debug)]
pub struct Rope {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    pub fn new(cfg: &Qwen3Config, device: Device) -> Self {
        let d = cfg.head_dim();
        let theta = cfg.theta();
        // As transformers: inv_freq = 1 / theta^(arange(0, d, 2) / d), in f32.
        let exps = Tensor::arange_start_step(0, d, 2, (Kind::Int64, device)).to_kind(Kind::Float)
            / d as f64;
        let inv = Tensor::from(theta as f32)
            .to_device(device)
            .pow(&exps)
            .reciprocal();
        let pos = Tensor::arange(cfg.max_position_embeddings, (Kind::Float, device));
        let freqs = pos.outer(&inv);
        let emb = Tensor::cat(&[&freqs, &freqs], -1);
        Self {
            cos: emb.cos(),
            sin: emb.sin(),
        }
    }

    /// x: [B, heads, T, d]; positions start at `pos`.
    pub fn apply(&self, x: &Tensor, pos: i64) -> Tensor {
        let (t, d) = (x.size()[2], x.size()[3]);
        let cos = self.cos.narrow(0, pos, t).to_kind(x.kind());
        let sin = self.sin.narrow(0, pos, t).to_kind(x.kind());
        let half = d / 2;
        let rot = Tensor::cat(&[-x.narrow(-1, half, half), x.narrow(-1, 0, half)], -1);
        x * cos + rot * sin
    }

    /// x: [B, heads, 1, d]; row i is at position `pos[i]`.
    pub fn apply_rows(&self, x: &Tensor, pos: &Tensor) -> Tensor {
        let d = x.size()[3];
        let b = x.size()[0];
        let cos = self
            .cos
            .index_select(0, pos)
            .to_kind(x.kind())
            .view([b, 1, 1, d]);
        let sin = self
            .sin
            .index_select(0, pos)
            .to_kind(x.kind())
            .view([b, 1, 1, d]);
        let half = d / 2;
        let rot = Tensor::cat(&[-x.narrow(-1, half, half), x.narrow(-1, 0, half)], -1);
        x * cos + rot * sin
    }
}
