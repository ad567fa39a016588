//! The caller-owned KV cache of incremental decoding: per layer, the keys and values of the
//! tokens seen so far, [B, kv_heads, T, d], grown by each forward step.

use tch::Tensor;

/// One layer's cached keys and values, [B, kv_heads, T, d].
#[derive(Debug, Default)]
pub struct LayerKv {
    k: Option<Tensor>,
    v: Option<Tensor>,
}

impl LayerKv {
    pub(crate) fn append(&mut self, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let k = match &self.k {
            Some(p) => Tensor::cat(&[p, k], 2),
            None => k.shallow_clone(),
        };
        let v = match &self.v {
            Some(p) => Tensor::cat(&[p, v], 2),
            None => v.shallow_clone(),
        };
        self.k = Some(k.shallow_clone());
        self.v = Some(v.shallow_clone());
        (k, v)
    }

    pub fn seq_len(&self) -> i64 {
        self.k.as_ref().map_or(0, |k| k.size()[2])
    }
}

/// The caller-owned KV cache: one entry per layer.
#[derive(Debug, Default)]
pub struct KvCache {
    pub layers: Vec<LayerKv>,
}

impl KvCache {
    pub fn new(n_layers: usize) -> Self {
        Self {
            layers: (0..n_layers).map(|_| LayerKv::default()).collect(),
        }
    }
    pub fn seq_len(&self) -> i64 {
        self.layers.first().map_or(0, LayerKv::seq_len)
    }

    /// An independent copy (samples of one prompt share its prefill).
    pub fn deep_copy(&self) -> Self {
        Self {
            layers: self
                .layers
                .iter()
                .map(|l| LayerKv {
                    k: l.k.as_ref().map(Tensor::copy),
                    v: l.v.as_ref().map(Tensor::copy),
                })
                .collect(),
        }
    }
}
