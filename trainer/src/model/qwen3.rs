//! The Qwen3 decoder: RMSNorm, rotate-half RoPE (`rope`), grouped-query attention through
//! scaled_dot_product_attention with per-head q_norm/k_norm, SwiGLU MLP, tied or untied
//! embeddings. One struct per Hugging Face module, fields named like the HF tensors, so a name
//! from `model.safetensors.index.json` leads to its field. The model is immutable in forward;
//! the KV cache belongs to the caller.

use std::collections::BTreeMap;

use tch::{Device, Kind, Tensor};

use super::config::Qwen3Config;
use super::kv_cache::{BatchKv, KvCache, LayerKv, StepSlots};
use super::linear::{Fwd, Lora, LoraConfig, LoraTarget, Proj};
use super::rope::Rope;
use crate::error::{Result, TrainerError};

/// How a decode step attends over its batch cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecodeAttention {
    /// The CPU row kernel where it pays (`StepSlots::rows_pay`), libtorch's kernel otherwise.
    #[default]
    Auto,
    /// libtorch's kernel over a masked view of every row up to the longest.
    Masked,
    /// The CPU row kernel whenever the tensors allow it (contiguous CPU f32).
    Rows,
}

/// How a generation worker decodes: the attention path and the batch cache's dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DecodeOptions {
    pub attention: DecodeAttention,
    /// The batch cache's dtype ([`BatchKv::with_kind`]); `None`: the weights'.
    pub kv_cache: Option<Kind>,
}

/// The leading positions of `rows` rows of `width` each that [`Qwen3::layers_forward`] runs
/// once for `prefix` shared ones: `prefix`, or 0 when there is a single row or no position
/// after it.
pub fn shared_positions(rows: i64, width: i64, prefix: i64) -> i64 {
    if rows > 1 && prefix > 0 && prefix < width {
        prefix
    } else {
        0
    }
}

/// `ids` [B, T] split for [`Qwen3::shared_layer_forward`]: the first row's first `prefix`
/// positions (None when [`shared_positions`] is 0) and every row's positions after them.
pub fn split_shared(ids: &Tensor, prefix: i64) -> (Option<Tensor>, Tensor) {
    let (b, t) = (ids.size()[0], ids.size()[1]);
    match shared_positions(b, t, prefix) {
        0 => (None, ids.shallow_clone()),
        p => (
            Some(ids.narrow(0, 0, 1).narrow(1, 0, p)),
            ids.narrow(1, p, t - p),
        ),
    }
}

/// The rows' states [B, P + T, H] from the shared row's [1, P, H] (expanded to every row) and
/// their own [B, T, H]; with nothing shared, their own.
pub fn join_shared(shared: Option<&Tensor>, own: &Tensor) -> Tensor {
    match shared {
        None => own.shallow_clone(),
        Some(xp) => {
            let (b, h) = (own.size()[0], own.size()[2]);
            let p = xp.size()[1];
            Tensor::cat(&[xp.expand([b, p, h], false), own.shallow_clone()], 1)
        }
    }
}

/// Qwen3RMSNorm: normalise in f32, scale by the weight in the input's dtype.
pub fn rms_norm(xs: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
    let kind = xs.kind();
    let x = xs.to_kind(Kind::Float);
    let var = x.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
    let x = x * (var + eps).rsqrt();
    weight * x.to_kind(kind)
}

#[derive(Debug)]
pub struct Attention {
    pub q_proj: Proj,
    pub k_proj: Proj,
    pub v_proj: Proj,
    pub o_proj: Proj,
    pub q_norm: Tensor,
    pub k_norm: Tensor,
}

#[derive(Debug)]
pub struct Mlp {
    pub gate_proj: Proj,
    pub up_proj: Proj,
    pub down_proj: Proj,
}

#[derive(Debug)]
pub struct DecoderLayer {
    pub self_attn: Attention,
    pub mlp: Mlp,
    pub input_layernorm: Tensor,
    pub post_attention_layernorm: Tensor,
}

impl DecoderLayer {
    /// The seven projections with their HF names inside the layer and LoRA target kinds.
    pub fn projections(&self) -> [(&'static str, LoraTarget, &Proj); 7] {
        let (a, m) = (&self.self_attn, &self.mlp);
        [
            ("self_attn.q_proj", LoraTarget::Q, &a.q_proj),
            ("self_attn.k_proj", LoraTarget::K, &a.k_proj),
            ("self_attn.v_proj", LoraTarget::V, &a.v_proj),
            ("self_attn.o_proj", LoraTarget::O, &a.o_proj),
            ("mlp.gate_proj", LoraTarget::Gate, &m.gate_proj),
            ("mlp.up_proj", LoraTarget::Up, &m.up_proj),
            ("mlp.down_proj", LoraTarget::Down, &m.down_proj),
        ]
    }

    /// As `projections`, mutable.
    pub fn projections_mut(&mut self) -> [(&'static str, LoraTarget, &mut Proj); 7] {
        let (a, m) = (&mut self.self_attn, &mut self.mlp);
        [
            ("self_attn.q_proj", LoraTarget::Q, &mut a.q_proj),
            ("self_attn.k_proj", LoraTarget::K, &mut a.k_proj),
            ("self_attn.v_proj", LoraTarget::V, &mut a.v_proj),
            ("self_attn.o_proj", LoraTarget::O, &mut a.o_proj),
            ("mlp.gate_proj", LoraTarget::Gate, &mut m.gate_proj),
            ("mlp.up_proj", LoraTarget::Up, &mut m.up_proj),
            ("mlp.down_proj", LoraTarget::Down, &mut m.down_proj),
        ]
    }
}

#[derive(Debug)]
pub struct Qwen3 {
    pub cfg: Qwen3Config,
    pub embed_tokens: Tensor,
    pub layers: Vec<DecoderLayer>,
    pub norm: Tensor,
    /// None when the embeddings are tied.
    pub lm_head: Option<Tensor>,
    pub rope: Rope,
    pub device: Device,
    pub kind: Kind,
}

/// Takes named tensors out of a map, checking shapes and dtypes.
struct Take<'a> {
    map: &'a mut BTreeMap<String, Tensor>,
    kind: Kind,
}

impl Take<'_> {
    fn get(&mut self, name: &str, shape: &[i64]) -> Result<Tensor> {
        let t = self
            .map
            .remove(name)
            .ok_or_else(|| TrainerError::MissingTensor(name.to_string()))?;
        if t.size() != shape {
            return Err(TrainerError::Shape {
                name: name.into(),
                got: t.size(),
                want: shape.to_vec(),
            });
        }
        if t.kind() != self.kind {
            return Err(TrainerError::Dtype {
                name: name.into(),
                got: format!("{:?}", t.kind()),
                want: format!("{:?}", self.kind),
            });
        }
        Ok(t)
    }
}

impl Qwen3 {
    /// Build from named tensors (HF names). Every tensor must be used; a tied checkpoint may
    /// carry a redundant `lm_head.weight`, which is dropped.
    pub fn from_tensors(
        cfg: Qwen3Config,
        mut tensors: BTreeMap<String, Tensor>,
        device: Device,
        kind: Kind,
    ) -> Result<Self> {
        cfg.validate()?;
        crate::warn_if_slow_bf16(device, kind);
        let (h, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
        let (nh, nkv, d) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim(),
        );
        if cfg.tie_word_embeddings {
            tensors.remove("lm_head.weight");
        }
        let mut t = Take {
            map: &mut tensors,
            kind,
        };
        let bias = cfg.attention_bias;
        let proj = |t: &mut Take, name: &str, o: i64, i: i64, b: bool| -> Result<Proj> {
            Ok(Proj {
                weight: t.get(&format!("{name}.weight"), &[o, i])?,
                bias: if b {
                    Some(t.get(&format!("{name}.bias"), &[o])?)
                } else {
                    None
                },
                lora: None,
            })
        };
        let embed_tokens = t.get("model.embed_tokens.weight", &[v, h])?;
        let mut layers = Vec::new();
        for l in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let a = format!("{p}.self_attn");
            let m = format!("{p}.mlp");
            layers.push(DecoderLayer {
                self_attn: Attention {
                    q_proj: proj(&mut t, &format!("{a}.q_proj"), nh * d, h, bias)?,
                    k_proj: proj(&mut t, &format!("{a}.k_proj"), nkv * d, h, bias)?,
                    v_proj: proj(&mut t, &format!("{a}.v_proj"), nkv * d, h, bias)?,
                    o_proj: proj(&mut t, &format!("{a}.o_proj"), h, nh * d, false)?,
                    q_norm: t.get(&format!("{a}.q_norm.weight"), &[d])?,
                    k_norm: t.get(&format!("{a}.k_norm.weight"), &[d])?,
                },
                mlp: Mlp {
                    gate_proj: proj(&mut t, &format!("{m}.gate_proj"), i, h, false)?,
                    up_proj: proj(&mut t, &format!("{m}.up_proj"), i, h, false)?,
                    down_proj: proj(&mut t, &format!("{m}.down_proj"), h, i, false)?,
                },
                input_layernorm: t.get(&format!("{p}.input_layernorm.weight"), &[h])?,
                post_attention_layernorm: t
                    .get(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
            });
        }
        let norm = t.get("model.norm.weight", &[h])?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(t.get("lm_head.weight", &[v, h])?)
        };
        if !tensors.is_empty() {
            let names: Vec<&str> = tensors.keys().map(String::as_str).take(8).collect();
            return Err(TrainerError::UnexpectedTensors(names.join(", ")));
        }
        let rope = Rope::new(&cfg, device);
        let model = Self {
            cfg,
            embed_tokens,
            layers,
            norm,
            lm_head,
            rope,
            device,
            kind,
        };
        model.set_trainable(false);
        Ok(model)
    }

    /// Load a Hugging Face model directory (config.json + safetensors, sharded or not).
    pub fn load(dir: &std::path::Path, device: Device, kind: Kind) -> Result<Self> {
        let cfg = Qwen3Config::from_file(&dir.join("config.json"))?;
        let tensors = super::weights::read_model_dir(dir, device, kind)?;
        Self::from_tensors(cfg, tensors, device, kind)
    }

    /// Random initialisation (normal(0, std) weights, unit norms), deterministic per seed.
    pub fn random(
        cfg: Qwen3Config,
        seed: i64,
        std: f64,
        device: Device,
        kind: Kind,
    ) -> Result<Self> {
        cfg.validate()?;
        let guard = super::rng_lock();
        tch::manual_seed(seed);
        let mut map = BTreeMap::new();
        for (name, shape) in Self::shapes(&cfg) {
            let t = if name.ends_with("norm.weight") {
                Tensor::ones(&shape, (Kind::Float, Device::Cpu))
            } else if name.ends_with(".bias") {
                Tensor::zeros(&shape, (Kind::Float, Device::Cpu))
            } else {
                Tensor::randn(&shape, (Kind::Float, Device::Cpu)) * std
            };
            map.insert(name, t.to_device(device).to_kind(kind));
        }
        drop(guard);
        Self::from_tensors(cfg, map, device, kind)
    }

    /// Every base tensor's HF name and shape, in a fixed order.
    pub fn shapes(cfg: &Qwen3Config) -> Vec<(String, Vec<i64>)> {
        let (h, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
        let (nh, nkv, d) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim(),
        );
        let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
        for l in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{l}");
            for (n, s) in [
                ("self_attn.q_proj.weight", vec![nh * d, h]),
                ("self_attn.k_proj.weight", vec![nkv * d, h]),
                ("self_attn.v_proj.weight", vec![nkv * d, h]),
                ("self_attn.o_proj.weight", vec![h, nh * d]),
                ("self_attn.q_norm.weight", vec![d]),
                ("self_attn.k_norm.weight", vec![d]),
                ("mlp.gate_proj.weight", vec![i, h]),
                ("mlp.up_proj.weight", vec![i, h]),
                ("mlp.down_proj.weight", vec![h, i]),
                ("input_layernorm.weight", vec![h]),
                ("post_attention_layernorm.weight", vec![h]),
            ] {
                out.push((format!("{p}.{n}"), s));
            }
            if cfg.attention_bias {
                for (n, s) in [
                    ("self_attn.q_proj.bias", vec![nh * d]),
                    ("self_attn.k_proj.bias", vec![nkv * d]),
                    ("self_attn.v_proj.bias", vec![nkv * d]),
                ] {
                    out.push((format!("{p}.{n}"), s));
                }
            }
        }
        out.push(("model.norm.weight".to_string(), vec![h]));
        if !cfg.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), vec![v, h]));
        }
        out
    }

    /// The position limit: sequences (prompt and generated tokens together) of at most this many
    /// tokens; the rotary tables end there.
    pub fn max_positions(&self) -> usize {
        usize::try_from(self.cfg.max_position_embeddings).unwrap_or(0)
    }

    /// Every projection's full HF module name, LoRA target kind and weight shape
    /// `[d_out, d_in]`, in the order of [`Qwen3::projections_mut`].
    pub fn projection_shapes(&self) -> Vec<(String, LoraTarget, [i64; 2])> {
        let mut out = Vec::new();
        for (l, layer) in self.layers.iter().enumerate() {
            for (n, target, proj) in layer.projections() {
                let s = proj.weight.size();
                let (o, i) = (
                    s.first().copied().unwrap_or(0),
                    s.get(1).copied().unwrap_or(0),
                );
                out.push((format!("model.layers.{l}.{n}"), target, [o, i]));
            }
        }
        out
    }

    /// Every projection with its full HF module name and kind, for LoRA and parameter listings.
    pub fn projections_mut(&mut self) -> Vec<(String, LoraTarget, &mut Proj)> {
        let mut out = Vec::new();
        for (l, layer) in self.layers.iter_mut().enumerate() {
            for (n, target, proj) in layer.projections_mut() {
                out.push((format!("model.layers.{l}.{n}"), target, proj));
            }
        }
        out
    }

    /// All base tensors by HF name (shallow clones sharing storage).
    pub fn base_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![(
            "model.embed_tokens.weight".to_string(),
            self.embed_tokens.shallow_clone(),
        )];
        for (l, layer) in self.layers.iter().enumerate() {
            let p = format!("model.layers.{l}");
            let at = &layer.self_attn;
            for (n, _, proj) in layer.projections() {
                out.push((format!("{p}.{n}.weight"), proj.weight.shallow_clone()));
                if let Some(b) = &proj.bias {
                    out.push((format!("{p}.{n}.bias"), b.shallow_clone()));
                }
            }
            out.push((
                format!("{p}.self_attn.q_norm.weight"),
                at.q_norm.shallow_clone(),
            ));
            out.push((
                format!("{p}.self_attn.k_norm.weight"),
                at.k_norm.shallow_clone(),
            ));
            out.push((
                format!("{p}.input_layernorm.weight"),
                layer.input_layernorm.shallow_clone(),
            ));
            out.push((
                format!("{p}.post_attention_layernorm.weight"),
                layer.post_attention_layernorm.shallow_clone(),
            ));
        }
        out.push(("model.norm.weight".to_string(), self.norm.shallow_clone()));
        if let Some(w) = &self.lm_head {
            out.push(("lm_head.weight".to_string(), w.shallow_clone()));
        }
        out
    }

    /// Full fine-tuning on (true) or off (false) for every base tensor.
    pub fn set_trainable(&self, on: bool) {
        for (_, t) in self.base_tensors() {
            let _ = t.set_requires_grad(on);
        }
    }

    /// Attach fresh LoRA adapters (A: Kaiming-uniform like PEFT, B: zeros) to the targets.
    pub fn add_lora(&mut self, lcfg: &LoraConfig, seed: i64) -> Result<()> {
        lcfg.validate()?;
        let _guard = super::rng_lock();
        tch::manual_seed(seed);
        let device = self.device;
        for (_, target, proj) in self.projections_mut() {
            if !lcfg.targets.contains(&target) {
                continue;
            }
            let size = proj.weight.size();
            proj.lora = Some(Lora::init(size[0], size[1], lcfg, device));
        }
        Ok(())
    }

    /// LoRA tensors under PEFT names (`base_model.model.<module>.lora_A.weight`).
    pub fn lora_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for (l, layer) in self.layers.iter().enumerate() {
            for (n, _, proj) in layer.projections() {
                if let Some(lo) = &proj.lora {
                    let base = format!("base_model.model.model.layers.{l}.{n}");
                    out.push((format!("{base}.lora_A.weight"), lo.a.shallow_clone()));
                    out.push((format!("{base}.lora_B.weight"), lo.b.shallow_clone()));
                }
            }
        }
        out
    }

    /// The tensors an optimizer updates: LoRA tensors if any adapter is attached, else all
    /// base tensors (full fine-tune).
    pub fn trainable(&self) -> Vec<(String, Tensor)> {
        let lora = self.lora_tensors();
        if lora.is_empty() {
            self.base_tensors()
        } else {
            lora
        }
    }

    pub fn has_lora(&self) -> bool {
        self.layers
            .iter()
            .any(|l| l.projections().iter().any(|(_, _, p)| p.lora.is_some()))
    }

    /// Whether any adapter applies dropout in training.
    pub fn lora_dropout(&self) -> bool {
        self.layers.iter().any(|l| {
            l.projections()
                .iter()
                .any(|(_, _, p)| p.lora.as_ref().is_some_and(|lo| lo.dropout > 0.0))
        })
    }

    /// Fold every adapter into the base weights.
    pub fn merge_lora(&mut self) {
        for (_, _, p) in self.projections_mut() {
            p.merge();
        }
    }

    pub fn lm_weight(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }

    pub fn embed(&self, ids: &Tensor) -> Tensor {
        Tensor::embedding(&self.embed_tokens, ids, -1, false, false)
    }

    /// One decoder layer. `pos` is the absolute position of xs[:, 0]; with a cache holding
    /// earlier tokens the new tokens attend to all of them.
    pub fn layer_forward(
        &self,
        l: usize,
        xs: &Tensor,
        pos: i64,
        cache: Option<&mut LayerKv>,
        f: Fwd,
    ) -> Tensor {
        let layer = &self.layers[l];
        let eps = self.cfg.rms_norm_eps;
        let h = rms_norm(xs, &layer.input_layernorm, eps);
        let h = self.attention(&layer.self_attn, &h, pos, cache, f);
        let xs = xs + h;
        let h = rms_norm(&xs, &layer.post_attention_layernorm, eps);
        let m = &layer.mlp;
        let h = m.down_proj.forward(
            &(m.gate_proj.forward(&h, f).silu() * m.up_proj.forward(&h, f)),
            f,
        );
        xs + h
    }

    fn attention(
        &self,
        a: &Attention,
        xs: &Tensor,
        pos: i64,
        cache: Option<&mut LayerKv>,
        f: Fwd,
    ) -> Tensor {
        let sz = xs.size();
        let (b, t) = (sz[0], sz[1]);
        let (nh, nkv, d) = (
            self.cfg.num_attention_heads,
            self.cfg.num_key_value_heads,
            self.cfg.head_dim(),
        );
        let eps = self.cfg.rms_norm_eps;
        let q = a.q_proj.forward(xs, f).view([b, t, nh, d]);
        let k = a.k_proj.forward(xs, f).view([b, t, nkv, d]);
        let v = a.v_proj.forward(xs, f).view([b, t, nkv, d]).transpose(1, 2);
        let q = self
            .rope
            .apply(&rms_norm(&q, &a.q_norm, eps).transpose(1, 2), pos);
        let k = self
            .rope
            .apply(&rms_norm(&k, &a.k_norm, eps).transpose(1, 2), pos);
        let past = cache.as_ref().map_or(0, |c| c.seq_len());
        let (k, v) = match cache {
            Some(c) => c.append(&k, &v),
            None => (k, v),
        };
        // SDPA's is_causal is top-left aligned; with earlier cached tokens and several new
        // ones, new token i must see keys 0..=past+i. On CPU that is two flash calls, the
        // cached keys in full and the new ones causally, under one autograd node
        // (`kernels::prefix_causal_attention`: a layer's forward and backward 1.12-1.28x faster
        // than the zero queries below, BENCHMARKS.md issue 25 session 87). Elsewhere,
        // when the new tokens are at least as many as the cached ones, `past` zero queries
        // before them make the causal kernel right (their rows are dropped), which costs at
        // most the new tokens' own attention again and runs faster than libtorch's kernel
        // with an explicit mask (1.0 s against 1.45 s for a bf16 layer's forward and backward
        // over 2,300 new and 700 cached positions, session 84); fewer new tokens (a prefill
        // after a long cached context) take the mask.
        // In bf16 on a CPU with AVX512-BF16, the trainer's own exact causal kernel, any `past`
        // (`kernels::causal_attention`, BENCHMARKS.md issue 25 session 88).
        let split = if t > 1 && crate::kernels::own_causal_attention(q.kind(), q.device(), d) {
            Some(crate::kernels::causal_attention(&q, &k, &v, past))
        } else {
            (t > 1 && past > 0 && q.device() == Device::Cpu)
                .then(|| crate::kernels::prefix_causal_attention(&q, &k, &v, past))
        }
        .and_then(|r| {
            r.map_err(
                |e| tracing::warn!(%e, "causal attention kernel failed; falling back to SDPA"),
            )
            .ok()
        });
        let y = if let Some(y) = split {
            y
        } else if t == 1 || past == 0 {
            Tensor::scaled_dot_product_attention(&q, &k, &v, None::<Tensor>, 0.0, t > 1, None, true)
        } else if past <= t {
            let pad = Tensor::zeros([b, nh, past, d], (q.kind(), q.device()));
            let qp = Tensor::cat(&[pad, q], 2);
            Tensor::scaled_dot_product_attention(&qp, &k, &v, None::<Tensor>, 0.0, true, None, true)
                .narrow(2, past, t)
        } else {
            let s = past + t;
            let qi = Tensor::arange(t, (Kind::Int64, self.device)).unsqueeze(1) + past;
            let kj = Tensor::arange(s, (Kind::Int64, self.device)).unsqueeze(0);
            let mask = kj.le_tensor(&qi);
            Tensor::scaled_dot_product_attention(&q, &k, &v, Some(mask), 0.0, false, None, true)
        };
        a.o_proj
            .forward(&y.transpose(1, 2).reshape([b, t, nh * d]), f)
    }

    /// Every layer over `ids` [B, T] whose rows all begin with the same `prefix` tokens: the
    /// output of the last layer (before the final norm), [B, T, H]. The shared positions run
    /// once, as one row whose keys and values every row's later positions attend to (the
    /// row's `expand`, so backward sums the rows' gradients into them); the result and its
    /// gradients are those of running every row whole, up to the order of float sums. A batch
    /// of chat rollouts shares its system prompt: about 700 of a training row's 1,950 tokens
    /// in the research world. `prefix` 0, a single row or a prefix that leaves no later
    /// position runs every row whole ([`shared_positions`]). The caller vouches that the rows
    /// share the prefix. With LoRA dropout on, the shared positions take one dropout draw for
    /// all rows: each row's distribution is unchanged, the rows' draws there are no longer
    /// independent.
    pub fn layers_forward(&self, ids: &Tensor, prefix: i64, f: Fwd) -> Tensor {
        let (shared, own) = split_shared(ids, prefix);
        let mut xp = shared.as_ref().map(|i| self.embed(i));
        let mut xs = self.embed(&own);
        for l in 0..self.layers.len() {
            (xp, xs) = self.shared_layer_forward(l, xp.as_ref(), &xs, f);
        }
        join_shared(xp.as_ref(), &xs)
    }

    /// Layer `l` over rows that share their first positions: the shared row `shared` [1, P, H]
    /// (None: nothing shared) at positions 0..P, then the rows' own positions `own` [B, T, H]
    /// from P on, attending to the shared row's keys and values expanded to every row.
    /// Returns both outputs; with nothing shared, [`Qwen3::layer_forward`] over `own`.
    pub fn shared_layer_forward(
        &self,
        l: usize,
        shared: Option<&Tensor>,
        own: &Tensor,
        f: Fwd,
    ) -> (Option<Tensor>, Tensor) {
        match shared {
            None => (None, self.layer_forward(l, own, 0, None, f)),
            Some(xp) => {
                let mut kv = LayerKv::default();
                let yp = self.layer_forward(l, xp, 0, Some(&mut kv), f);
                let mut rows = kv.expand_rows(own.size()[0]);
                let y = self.layer_forward(l, own, xp.size()[1], Some(&mut rows), f);
                (Some(yp), y)
            }
        }
    }

    /// Final hidden states (after the last norm), [B, T, H].
    pub fn hidden(&self, ids: &Tensor, f: Fwd) -> Tensor {
        self.hidden_shared(ids, 0, f)
    }

    /// [`Qwen3::hidden`] of rows that share their first `prefix` tokens, which run once
    /// ([`Qwen3::layers_forward`]).
    pub fn hidden_shared(&self, ids: &Tensor, prefix: i64, f: Fwd) -> Tensor {
        let xs = self.layers_forward(ids, prefix, f);
        rms_norm(&xs, &self.norm, self.cfg.rms_norm_eps)
    }

    /// Full logits [B, T, V] in f32. For long sequences use `loss::token_logprobs` on
    /// `hidden` instead, which never builds the whole [T, V] tensor.
    pub fn logits(&self, ids: &Tensor, f: Fwd) -> Tensor {
        self.hidden(ids, f)
            .matmul(&self.lm_weight().tr())
            .to_kind(Kind::Float)
    }

    /// Incremental forward with a cache: returns logits [B, T, V] (f32) for the new tokens.
    pub fn forward_cached(&self, ids: &Tensor, cache: &mut KvCache, f: Fwd) -> Tensor {
        if cache.layers.len() != self.layers.len() {
            *cache = KvCache::new(self.layers.len());
        }
        let pos = cache.seq_len();
        let mut xs = self.embed(ids);
        for (l, c) in cache.layers.iter_mut().enumerate() {
            xs = self.layer_forward(l, &xs, pos, Some(c), f);
        }
        rms_norm(&xs, &self.norm, self.cfg.rms_norm_eps)
            .matmul(&self.lm_weight().tr())
            .to_kind(Kind::Float)
    }

    /// One decoding step for every row of the batch cache `kv` (each of any length): `ids[i]`
    /// is row i's next token. Projections and MLPs run batched; each row's new key and value
    /// are written in place into `kv`, with RoPE at each row's own position, and attention
    /// reads either each row's own positions (the CPU row kernel, when the rows' lengths differ
    /// enough: `DecodeAttention::Auto`) or the rows' caches as one view up to the longest,
    /// masked past each row's own length. Returns logits [B, V] (f32); every row then holds one
    /// more position.
    pub fn decode_step(&self, ids: &[i64], kv: &mut BatchKv, f: Fwd) -> Tensor {
        self.decode_step_with(ids, kv, f, DecodeAttention::Auto)
    }

    /// [`Self::decode_step`] with libtorch's attention over a masked view of every row up to the
    /// longest, on any device: the reference the CPU row kernel is measured and tested against.
    pub fn decode_step_masked(&self, ids: &[i64], kv: &mut BatchKv, f: Fwd) -> Tensor {
        self.decode_step_with(ids, kv, f, DecodeAttention::Masked)
    }

    /// [`Self::decode_step`] with the attention path chosen by the caller (benchmarks, tests).
    pub fn decode_step_with(
        &self,
        ids: &[i64],
        kv: &mut BatchKv,
        f: Fwd,
        how: DecodeAttention,
    ) -> Tensor {
        assert_eq!(
            ids.len(),
            kv.rows(),
            "decode_step: {} tokens for {} cached rows",
            ids.len(),
            kv.rows()
        );
        let b = ids.len() as i64;
        let at = kv.begin_step(self.device, self.kind);
        // Built by the first layer that uses libtorch's kernel (none when every layer takes the
        // row kernel).
        let mask = std::cell::OnceCell::new();
        let ids_t = Tensor::from_slice(ids).view([b, 1]).to_device(self.device);
        let mut xs = self.embed(&ids_t);
        let eps = self.cfg.rms_norm_eps;
        for l in 0..self.layers.len() {
            let layer = &self.layers[l];
            let h = rms_norm(&xs, &layer.input_layernorm, eps);
            let h = self.attention_rows(&layer.self_attn, &h, &at, &mask, kv, l, f, how);
            xs += h;
            let h = rms_norm(&xs, &layer.post_attention_layernorm, eps);
            let m = &layer.mlp;
            let h = m.down_proj.forward(
                &(m.gate_proj.forward(&h, f).silu() * m.up_proj.forward(&h, f)),
                f,
            );
            xs += h;
        }
        kv.advance();
        rms_norm(&xs, &self.norm, self.cfg.rms_norm_eps)
            .matmul(&self.lm_weight().tr())
            .to_kind(Kind::Float)
            .view([b, -1])
    }

    #[allow(clippy::too_many_arguments)]
    fn attention_rows(
        &self,
        a: &Attention,
        xs: &Tensor,
        at: &StepSlots,
        mask: &std::cell::OnceCell<Tensor>,
        kv: &mut BatchKv,
        l: usize,
        f: Fwd,
        how: DecodeAttention,
    ) -> Tensor {
        let b = xs.size()[0];
        let (nh, nkv, d) = (
            self.cfg.num_attention_heads,
            self.cfg.num_key_value_heads,
            self.cfg.head_dim(),
        );
        let eps = self.cfg.rms_norm_eps;
        let q = a.q_proj.forward(xs, f).view([b, 1, nh, d]);
        let k = a.k_proj.forward(xs, f).view([b, 1, nkv, d]);
        let v = a.v_proj.forward(xs, f).view([b, 1, nkv, d]).transpose(1, 2);
        let q = self
            .rope
            .apply_rows(&rms_norm(&q, &a.q_norm, eps).transpose(1, 2), &at.pos);
        let k = self
            .rope
            .apply_rows(&rms_norm(&k, &a.k_norm, eps).transpose(1, 2), &at.pos);
        let (k, v) = kv.write(l, &k, &v, at);
        // Grouped-query attention without expanding the cache: the query heads that share a
        // key/value head (head h reads kv head h / g) attend as g query positions of it.
        let g = nh / nkv;
        let q = q.reshape([b, nkv, g, d]).contiguous();
        // On the CPU in f32 or bf16, when the rows' lengths differ enough for it to pay, each row
        // reads only its own positions; otherwise libtorch's kernel reads every row up to the
        // longest and masks the rest.
        let own = kv
            .layer(l)
            .filter(|(kc, _)| match how {
                DecodeAttention::Auto => at.rows_pay(super::row_attention::relative_cost(
                    kc.kind(),
                    d as usize,
                    g as usize,
                )),
                DecodeAttention::Masked => false,
                DecodeAttention::Rows => true,
            })
            .and_then(|(kc, vc)| {
                super::row_attention::decode_rows(&q, kc, vc, &at.lens, &at.shared)
            });
        let y = match own {
            Some(y) => y,
            None => {
                // A cache in another dtype than the weights (`BatchKv::with_kind`): libtorch's
                // kernel wants one dtype, so the view is widened (a copy; the row kernel reads
                // it as it is).
                let (k, v) = if k.kind() == q.kind() {
                    (k, v)
                } else {
                    (k.to_kind(q.kind()), v.to_kind(q.kind()))
                };
                Tensor::scaled_dot_product_attention(
                    &q,
                    &k,
                    &v,
                    Some(mask.get_or_init(|| at.mask()).shallow_clone()),
                    0.0,
                    false,
                    None,
                    false,
                )
            }
        };
        a.o_proj.forward(&y.reshape([b, 1, nh * d]), f)
    }

    /// Save the base weights (HF names) and config.json into `dir`.
    pub fn save(&self, dir: &std::path::Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(TrainerError::io(dir))?;
        super::weights::write_file(&dir.join("model.safetensors"), &self.base_tensors())?;
        let path = dir.join("config.json");
        let text = serde_json::to_string_pretty(&self.cfg).map_err(TrainerError::json(&path))?;
        std::fs::write(&path, text).map_err(TrainerError::io(&path))?;
        Ok(())
    }
}
