//! AdamW (PyTorch's update rule) over named tensors with weight-decay groups, global-norm
//! gradient clipping, learning-rate schedules, fp32 master weights for bf16/f16 parameters, and
//! optimizer state saved and restored exactly.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::error::{Result, TrainerError};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Schedule {
    Constant,
    /// Linear warm-up to the peak, then constant.
    Warmup {
        steps: u64,
    },
    /// Linear warm-up, then cosine decay to `min_ratio`·lr at `total` steps.
    Cosine {
        warmup: u64,
        total: u64,
        min_ratio: f64,
    },
    /// Linear warm-up, then linear decay to 0 at `total` steps.
    Linear {
        warmup: u64,
        total: u64,
    },
}

impl Schedule {
    /// Multiplier of the peak learning rate for 1-based `step`.
    pub fn factor(&self, step: u64) -> f64 {
        let warm = |w: u64| {
            if w > 0 && step <= w {
                Some(step as f64 / w as f64)
            } else {
                None
            }
        };
        match *self {
            Schedule::Constant => 1.0,
            Schedule::Warmup { steps } => warm(steps).unwrap_or(1.0),
            Schedule::Cosine {
                warmup,
                total,
                min_ratio,
            } => warm(warmup).unwrap_or_else(|| {
                let span = total.saturating_sub(warmup).max(1) as f64;
                let p = ((step.saturating_sub(warmup)) as f64 / span).min(1.0);
                min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos())
            }),
            Schedule::Linear { warmup, total } => warm(warmup).unwrap_or_else(|| {
                let span = total.saturating_sub(warmup).max(1) as f64;
                (1.0 - (step.saturating_sub(warmup)) as f64 / span).max(0.0)
            }),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdamWConfig {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    /// Global-norm clip (0 = off).
    pub max_grad_norm: f64,
    pub schedule: Schedule,
}

impl AdamWConfig {
    /// The same settings at `scale` times the peak rate (the schedule's shape unchanged).
    pub fn with_lr_scale(&self, scale: f64) -> Self {
        Self {
            lr: self.lr * scale,
            ..self.clone()
        }
    }
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            lr: 1e-5,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            schedule: Schedule::Constant,
        }
    }
}

struct Slot {
    param: Tensor,
    /// The fp32 master copy of a bf16/f16 parameter: the update applies to it, and the parameter
    /// receives it rounded. Without it an update smaller than half a unit in the last place of
    /// the parameter's value (most updates at lr 5e-7 in bf16) rounds away. `None` for fp32
    /// (and wider) parameters, which are their own master.
    master: Option<Tensor>,
    m: Tensor,
    v: Tensor,
    decay: bool,
}

/// PyTorch's AdamW moments for one fp32 gradient `g` (already clipped) at 1-based `step` and
/// learning rate `lr`: the new first and second moments and the divisor `d` for which the
/// update is `p ← p + m / d`, i.e. `d = −(√v / √(1−β₂ᵗ) + ε) · (1−β₁ᵗ) / lr`. `m` and `v` are
/// not written (an optimizer snapshot may share them): three new tensors, six passes over the
/// elements (the update written as separate tensor expressions took eleven new tensors).
pub(crate) fn adamw_moments(
    g: &Tensor,
    m: &Tensor,
    v: &Tensor,
    cfg: &AdamWConfig,
    step: u64,
    lr: f64,
) -> (Tensor, Tensor, Tensor) {
    let (b1, b2) = cfg.betas;
    let bc1 = 1.0 - b1.powi(step as i32);
    let bc2 = 1.0 - b2.powi(step as i32);
    let m = m.lerp(g, 1.0 - b1);
    let v = v.lerp(&(g * g), 1.0 - b2);
    let mut d = v.sqrt();
    let _ = d.f_div_scalar_(bc2.sqrt());
    let _ = d.f_add_scalar_(cfg.eps);
    let _ = d.f_mul_scalar_(-bc1 / lr);
    (m, v, d)
}

/// The tensor-expression update of one slot without a master copy whose parameter is not
/// fp32 (f64): new moment tensors, the parameter in place.
/// `g` is the fp32 gradient, clipped.
fn unfused_update(s: &mut Slot, g: &Tensor, cfg: &AdamWConfig, step: u64, lr: f64, decays: bool) {
    let (m, v, d) = adamw_moments(g, &s.m, &s.v, cfg, step, lr);
    s.m = m;
    s.v = v;
    let mut p = s.param.shallow_clone();
    if decays {
        let _ = p.f_mul_scalar_(1.0 - lr * cfg.weight_decay);
    }
    let _ = p.f_addcdiv_(&s.m, &d);
}

/// How many bytes of fp32 gradients [`AdamW::step`] gathers before it calls the fused kernel
/// (256 MiB: the kernel's launches are few per call either way, and the transient copies stay
/// small beside an 8B model's 131 GB of state).
const FUSED_CHUNK_BYTES: usize = 256 << 20;

/// A copy of `t` in new memory (an out-of-memory error returned, not a panic).
fn copied(t: &Tensor) -> Result<Tensor> {
    let mut c = t.f_empty_like()?;
    c.f_copy_(t)?;
    Ok(c)
}

/// One slot of a fused group: its name, the slot, its fp32 clipped gradient, whether it decays.
type FusedSlot<'a> = (&'a str, &'a mut Slot, Tensor, bool);

/// Update `group`'s slots with the fused kernel (one call for those that decay, one for the
/// rest), round bf16/f16 parameters from their masters, and empty `group`.
fn fused_update(
    group: &mut Vec<FusedSlot<'_>>,
    cfg: &AdamWConfig,
    step: u64,
    lr: f64,
) -> Result<()> {
    for decay_group in [true, false] {
        let slots: Vec<crate::kernels::AdamWSlot<'_>> = group
            .iter()
            .filter(|(_, _, _, d)| *d == decay_group)
            .map(|(name, s, g, _)| crate::kernels::AdamWSlot {
                name,
                param: s.master.as_ref().unwrap_or(&s.param),
                grad: g,
                m: &s.m,
                v: &s.v,
            })
            .collect();
        let update = crate::kernels::AdamWUpdate {
            step,
            lr,
            betas: cfg.betas,
            eps: cfg.eps,
            weight_decay: if decay_group { cfg.weight_decay } else { 0.0 },
        };
        crate::kernels::fused_adamw(&slots, &update)?;
    }
    // A bf16/f16 parameter gets its master rounded once (round to nearest even).
    for (_, s, _, _) in group.iter() {
        if let Some(master) = &s.master {
            s.param.shallow_clone().f_copy_(master)?;
        }
    }
    group.clear();
    Ok(())
}

/// Whether parameters of `kind` keep an fp32 master copy.
pub fn needs_master(kind: Kind) -> bool {
    matches!(kind, Kind::BFloat16 | Kind::Half)
}

/// The optimizer's moments, master weights and step count at one moment ([`AdamW::state`]).
pub struct AdamWState {
    moments: BTreeMap<String, (Tensor, Tensor, Option<Tensor>)>,
    step: u64,
}

impl std::fmt::Debug for AdamWState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdamWState")
            .field("params", &self.moments.len())
            .field("step", &self.step)
            .finish()
    }
}

/// AdamW over a fixed list of named parameters.
pub struct AdamW {
    pub cfg: AdamWConfig,
    slots: BTreeMap<String, Slot>,
    /// Optimizer steps taken.
    pub step: u64,
    /// Whether an [`AdamWState`] may share the moments and master copies: then the next
    /// [`AdamW::step`] updates copies of them, so the shared tensors keep their values; else it
    /// updates them in place.
    shared: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for AdamW {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdamW")
            .field("cfg", &self.cfg)
            .field("params", &self.slots.len())
            .field("step", &self.step)
            .finish()
    }
}

/// Decay group rule: matrices decay; vectors (norm weights, biases) do not.
pub fn decays(name: &str, t: &Tensor) -> bool {
    t.dim() >= 2 && !name.ends_with("norm.weight")
}

impl AdamW {
    pub fn new(params: Vec<(String, Tensor)>, cfg: AdamWConfig) -> Self {
        let slots = params
            .into_iter()
            .map(|(name, p)| {
                let decay = decays(&name, &p);
                let m = Tensor::zeros_like(&p).to_kind(Kind::Float);
                let v = Tensor::zeros_like(&p).to_kind(Kind::Float);
                let master = master_of(&p);
                (
                    name,
                    Slot {
                        param: p,
                        master,
                        m,
                        v,
                        decay,
                    },
                )
            })
            .collect();
        Self {
            cfg,
            slots,
            step: 0,
            shared: false.into(),
        }
    }

    pub fn zero_grad(&self) {
        for s in self.slots.values() {
            let mut g = s.param.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
    }

    /// The global L2 norm of all gradients (before clipping).
    pub fn grad_norm(&self) -> f64 {
        tch::no_grad(|| {
            // Each parameter's L2 norm in fp32 (one read, no temporary: the per-tensor norms
            // of `clip_grad_norm_`), then the norm of the norms in f64 on the device: one read
            // back for the whole model, where a read back per parameter would wait on a GPU
            // once per tensor (hundreds of times a step).
            let parts: Vec<Tensor> = self
                .slots
                .values()
                .map(|s| s.param.grad())
                .filter(Tensor::defined)
                .map(|g| {
                    // bf16/f16 accumulate in fp32 without a copy; wider gradients (f64) are
                    // read as fp32, as before (the kernel refuses a narrowing dtype).
                    let g = match g.kind() {
                        Kind::Float | Kind::BFloat16 | Kind::Half => g,
                        _ => g.to_kind(Kind::Float),
                    };
                    g.norm_scalaropt_dtype(2.0, Kind::Float)
                        .to_kind(Kind::Double)
                })
                .collect();
            if parts.is_empty() {
                return 0.0;
            }
            Tensor::stack(&parts, 0)
                .square()
                .sum(Kind::Double)
                .double_value(&[])
                .sqrt()
        })
    }

    /// Clip, then apply one AdamW update. Returns (grad norm before clipping, learning rate).
    ///
    /// fp32 parameters, and the fp32 master copies of bf16/f16 ones, are updated by libtorch's
    /// fused AdamW kernel ([`crate::kernels::fused_adamw`]: one pass over each tensor, the
    /// arithmetic of `torch.optim.AdamW(fused=True)`), in place unless an [`AdamWState`] shares
    /// the moments (then on copies). Clipping scales a copy of the gradient (the parameters'
    /// gradients stay as backward left them). Parameters of other dtypes (f64) take the
    /// tensor-expression update of [`adamw_moments`].
    pub fn step(&mut self) -> Result<(f64, f64)> {
        self.step_scaled(1.0)
    }

    /// [`AdamW::step`] at `lr_scale` times the scheduled rate (the meta-policy's Phase A at
    /// `reflection_lr_scale`); the step still counts in the schedule. Returns the rate used.
    pub fn step_scaled(&mut self, lr_scale: f64) -> Result<(f64, f64)> {
        self.step_in_chunks(FUSED_CHUNK_BYTES, lr_scale)
    }

    /// [`AdamW::step`], with the fused kernel called on consecutive groups of slots whose fp32
    /// gradients add up to about `chunk_bytes` (a slot larger than that is a group alone), so
    /// the fp32 copies of bf16 gradients (4 bytes a parameter, 32 GB for an 8B model) and the
    /// copies of shared moments exist for one group at a time. Every element's update is
    /// independent of the others, so the grouping does not change the result.
    fn step_in_chunks(&mut self, chunk_bytes: usize, lr_scale: f64) -> Result<(f64, f64)> {
        self.step += 1;
        let norm = self.grad_norm();
        let clip = if self.cfg.max_grad_norm > 0.0 && norm > self.cfg.max_grad_norm {
            self.cfg.max_grad_norm / (norm + 1e-6)
        } else {
            1.0
        };
        let lr = self.cfg.lr * lr_scale * self.cfg.schedule.factor(self.step);
        let cfg = &self.cfg;
        let step = self.step;
        let shared = self
            .shared
            .swap(false, std::sync::atomic::Ordering::Relaxed);
        tch::no_grad(|| -> Result<()> {
            // (name, slot, fp32 clipped gradient, decays) of each fused slot of the group being
            // gathered, in slot order; the other slots are updated here directly.
            let mut group: Vec<FusedSlot<'_>> = Vec::new();
            let mut group_bytes = 0usize;
            for (name, s) in self.slots.iter_mut() {
                let g = s.param.grad();
                if !g.defined() {
                    continue;
                }
                // The fp32 gradient, clipped; the parameter's own gradient is left as backward
                // wrote it (data-parallel ranks and ZeRO keep theirs unclipped too).
                let g = match (clip != 1.0, g.kind() == Kind::Float) {
                    (false, _) => g.f_to_kind(Kind::Float)?,
                    (true, true) => g.f_mul_scalar(clip)?,
                    (true, false) => {
                        let mut g = g.f_to_kind(Kind::Float)?;
                        let _ = g.f_mul_scalar_(clip)?;
                        g
                    }
                };
                let decays = s.decay && cfg.weight_decay > 0.0;
                if s.master.is_none() && s.param.kind() != Kind::Float {
                    unfused_update(s, &g, cfg, step, lr, decays);
                    continue;
                }
                if shared {
                    s.m = copied(&s.m)?;
                    s.v = copied(&s.v)?;
                    s.master = s.master.as_ref().map(copied).transpose()?;
                }
                group_bytes += g.numel() * 4;
                group.push((name, s, g, decays));
                if group_bytes >= chunk_bytes {
                    fused_update(&mut group, cfg, step, lr)?;
                    group_bytes = 0;
                }
            }
            fused_update(&mut group, cfg, step, lr)
        })?;
        Ok((norm, lr))
    }

    /// Drop the moments and master copies: a sharded optimizer
    /// ([`crate::dist::zero::ZeroShard`]) keeps them instead. The step count stays.
    pub fn release_state(&mut self) {
        for s in self.slots.values_mut() {
            let empty = Tensor::zeros([0], (Kind::Float, s.param.device()));
            s.m = empty.shallow_clone();
            s.v = empty;
            s.master = None;
        }
    }

    /// Restore parameter `name`'s moments and master from flat fp32 tensors of its size (a
    /// consolidated ZeRO save, [`crate::dist::zero::Saved::per_parameter`]); the master is kept
    /// only for a bf16/f16 parameter.
    pub fn set_state(&mut self, name: &str, master: &Tensor, m: &Tensor, v: &Tensor) -> Result<()> {
        let s = self
            .slots
            .get_mut(name)
            .ok_or_else(|| TrainerError::MissingTensor(format!("optimizer slot {name}")))?;
        let shape = s.param.size();
        let n: i64 = shape.iter().product();
        for (what, t) in [("master", master), ("m", m), ("v", v)] {
            if t.numel() as i64 != n {
                return Err(TrainerError::Shape {
                    name: format!("{what}.{name}"),
                    got: t.size(),
                    want: shape.clone(),
                });
            }
        }
        s.m = m.to_kind(Kind::Float).reshape(shape.as_slice());
        s.v = v.to_kind(Kind::Float).reshape(shape.as_slice());
        s.master = needs_master(s.param.kind())
            .then(|| master.to_kind(Kind::Float).reshape(shape.as_slice()));
        Ok(())
    }

    /// Whether any parameter keeps an fp32 master copy (bf16/f16 parameters).
    pub fn has_master(&self) -> bool {
        self.slots.values().any(|s| s.master.is_some())
    }

    /// The fp32 master copy of parameter `name` (`None` for fp32 parameters or an unknown name).
    pub fn master(&self, name: &str) -> Option<&Tensor> {
        self.slots.get(name).and_then(|s| s.master.as_ref())
    }

    /// The moments, master weights and step count as they are now, for [`AdamW::restore`] after
    /// a failed step. The tensors are shared, not copied: the next [`AdamW::step`] updates
    /// copies of them instead of writing them in place, so the shared tensors keep this moment's
    /// values.
    pub fn state(&self) -> AdamWState {
        self.shared
            .store(true, std::sync::atomic::Ordering::Relaxed);
        AdamWState {
            moments: self
                .slots
                .iter()
                .map(|(n, s)| {
                    (
                        n.clone(),
                        (
                            s.m.shallow_clone(),
                            s.v.shallow_clone(),
                            s.master.as_ref().map(Tensor::shallow_clone),
                        ),
                    )
                })
                .collect(),
            step: self.step,
        }
    }

    /// Put back the moments and step count of [`AdamW::state`]; refused (nothing changes) when
    /// the state is of another parameter list.
    pub fn restore(&mut self, state: AdamWState) -> Result<()> {
        if state.moments.len() != self.slots.len()
            || state
                .moments
                .keys()
                .zip(self.slots.keys())
                .any(|(a, b)| a != b)
        {
            return Err(TrainerError::Config(format!(
                "optimizer state of {} parameters does not match the optimizer's {}",
                state.moments.len(),
                self.slots.len()
            )));
        }
        for (slot, (m, v, master)) in self.slots.values_mut().zip(state.moments.into_values()) {
            slot.m = m;
            slot.v = v;
            slot.master = master;
        }
        self.step = state.step;
        // Another state taken at the same moment may share these tensors too.
        self.shared
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Save moments, fp32 master weights (`master.NAME`, bf16/f16 parameters only) and step to
    /// `dir/optimizer.safetensors` + `dir/optimizer.json`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let mut tensors = Vec::new();
        for (name, s) in &self.slots {
            tensors.push((format!("m.{name}"), s.m.shallow_clone()));
            tensors.push((format!("v.{name}"), s.v.shallow_clone()));
            if let Some(master) = &s.master {
                tensors.push((format!("master.{name}"), master.shallow_clone()));
            }
        }
        crate::model::weights::write_file(&dir.join("optimizer.safetensors"), &tensors)?;
        let path = dir.join("optimizer.json");
        let meta = serde_json::json!({"step": self.step, "config": self.cfg});
        let text = serde_json::to_string_pretty(&meta).map_err(TrainerError::json(&path))?;
        std::fs::write(&path, text).map_err(TrainerError::io(&path))?;
        Ok(())
    }

    /// Restore what `save` wrote; every parameter must have its moments. A bf16/f16
    /// parameter takes its master copy from the file, or (a checkpoint written before master
    /// weights existed) from the parameter's current value.
    pub fn load(&mut self, dir: &Path) -> Result<()> {
        let path = dir.join("optimizer.json");
        let text = std::fs::read_to_string(&path).map_err(TrainerError::io(&path))?;
        let meta: serde_json::Value =
            serde_json::from_str(&text).map_err(TrainerError::json(&path))?;
        let step = meta["step"]
            .as_u64()
            .ok_or_else(|| TrainerError::Config(format!("{}: no step", path.display())))?;
        let device = self
            .slots
            .values()
            .next()
            .map_or(tch::Device::Cpu, |s| s.param.device());
        let mut t = crate::model::weights::read_file(
            &dir.join("optimizer.safetensors"),
            device,
            Some(Kind::Float),
            None,
        )?;
        for (name, s) in self.slots.iter_mut() {
            for (prefix, dst) in [("m", &mut s.m), ("v", &mut s.v)] {
                let key = format!("{prefix}.{name}");
                let src = t
                    .remove(&key)
                    .ok_or_else(|| TrainerError::MissingTensor(key.clone()))?;
                if src.size() != dst.size() {
                    return Err(TrainerError::Shape {
                        name: key,
                        got: src.size(),
                        want: dst.size(),
                    });
                }
                *dst = src;
            }
            if s.master.is_some() || needs_master(s.param.kind()) {
                let key = format!("master.{name}");
                s.master = match t.remove(&key) {
                    Some(src) if src.size() != s.param.size() => {
                        return Err(TrainerError::Shape {
                            name: key,
                            got: src.size(),
                            want: s.param.size(),
                        });
                    }
                    Some(src) => Some(src),
                    None => master_of(&s.param),
                };
            }
        }
        self.step = step;
        Ok(())
    }
}

/// An fp32 copy of `p` when its dtype needs one ([`needs_master`]), detached.
fn master_of(p: &Tensor) -> Option<Tensor> {
    needs_master(p.kind()).then(|| tch::no_grad(|| p.detach().to_kind(Kind::Float)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// PyTorch's AdamW rule in f64 (clip_grad_norm_ then the update), for `steps` steps of the
    /// same gradients: the parameters after them.
    fn reference(
        p0: &[Vec<f64>],
        g: &[Vec<f64>],
        decays: &[bool],
        cfg: &AdamWConfig,
        steps: u64,
    ) -> Vec<Vec<f64>> {
        let (b1, b2) = cfg.betas;
        let mut p = p0.to_vec();
        let mut m: Vec<Vec<f64>> = p0.iter().map(|x| vec![0.0; x.len()]).collect();
        let mut v = m.clone();
        let norm = g.iter().flatten().map(|x| x * x).sum::<f64>().sqrt();
        let clip = if norm > cfg.max_grad_norm {
            cfg.max_grad_norm / (norm + 1e-6)
        } else {
            1.0
        };
        for t in 1..=steps {
            let (bc1, bc2) = (1.0 - b1.powi(t as i32), 1.0 - b2.powi(t as i32));
            for i in 0..p.len() {
                for j in 0..p[i].len() {
                    let gj = g[i][j] * clip;
                    m[i][j] = b1 * m[i][j] + (1.0 - b1) * gj;
                    v[i][j] = b2 * v[i][j] + (1.0 - b2) * gj * gj;
                    if decays[i] {
                        p[i][j] *= 1.0 - cfg.lr * cfg.weight_decay;
                    }
                    let denom = v[i][j].sqrt() / bc2.sqrt() + cfg.eps;
                    p[i][j] -= cfg.lr / bc1 * m[i][j] / denom;
                }
            }
        }
        p
    }

    fn values(t: &Tensor) -> Vec<f64> {
        Vec::<f64>::try_from(t.to_kind(Kind::Double).reshape([-1])).unwrap_or_default()
    }

    #[test]
    fn the_fused_update_is_pytorchs_adamw_and_leaves_a_shared_state_alone() {
        let _rng = crate::model::rng_lock();
        tch::manual_seed(3);
        let cpu = tch::Device::Cpu;
        // A matrix that decays, a vector that does not (fused, fp32), a bf16 matrix with its
        // fp32 master (fused on the master) and an f64 vector (the tensor-expression path).
        let w = Tensor::randn([6, 4], (Kind::Float, cpu)).set_requires_grad(true);
        let b = Tensor::randn([4], (Kind::Float, cpu)).set_requires_grad(true);
        let h = Tensor::randn([3, 5], (Kind::Float, cpu))
            .to_kind(Kind::BFloat16)
            .set_requires_grad(true);
        let d = Tensor::randn([3], (Kind::Double, cpu)).set_requires_grad(true);
        let params = [&w, &b, &h, &d];
        let grads: Vec<Tensor> = params
            .iter()
            .map(|p| Tensor::randn(p.size(), (Kind::Float, cpu)))
            .collect();
        let p0: Vec<Vec<f64>> = params.iter().map(|p| values(p)).collect();
        let cfg = AdamWConfig {
            lr: 1e-2,
            weight_decay: 0.1,
            max_grad_norm: 0.5,
            ..AdamWConfig::default()
        };
        let names = ["w.weight", "b.bias", "h.weight", "d.bias"];
        let mut opt = AdamW::new(
            names
                .iter()
                .zip(params)
                .map(|(n, p)| (n.to_string(), p.shallow_clone()))
                .collect(),
            cfg.clone(),
        );
        let backward = |opt: &AdamW| {
            opt.zero_grad();
            let loss = params
                .iter()
                .zip(&grads)
                .map(|(p, g)| (p.to_kind(Kind::Float) * g).sum(Kind::Float))
                .fold(Tensor::zeros([], (Kind::Float, cpu)), |a, x| a + x);
            loss.backward();
        };
        // The gradients as the optimizer sees them (h's rounded to bf16).
        let g_seen: Vec<Vec<f64>> = params
            .iter()
            .zip(&grads)
            .map(|(p, g)| values(&g.to_kind(p.kind())))
            .collect();
        let decays: Vec<bool> = names
            .iter()
            .zip(params)
            .map(|(n, p)| decays(n, p))
            .collect();
        assert_eq!(decays, [true, false, true, false]);
        for _ in 0..2 {
            backward(&opt);
            let (norm, lr) = opt.step().unwrap();
            assert!(norm > cfg.max_grad_norm && lr == cfg.lr);
        }
        // Clipping scaled copies: the gradients are as backward wrote them.
        assert_eq!(values(&w.grad()), values(&grads[0]));
        let want = reference(&p0, &g_seen, &decays, &cfg, 2);
        let master = values(opt.master("h.weight").unwrap());
        let got = [values(&w), values(&b), master, values(&d)];
        for ((name, got), want) in names.iter().zip(&got).zip(&want) {
            for (x, y) in got.iter().zip(want) {
                assert!(
                    (x - y).abs() <= 1e-6 * (1.0 + y.abs()),
                    "{name}: {x} vs {y}"
                );
            }
        }
        // The bf16 parameter is its master rounded once.
        assert_eq!(
            values(&h),
            values(&opt.master("h.weight").unwrap().to_kind(Kind::BFloat16))
        );
        // A state taken now keeps its values through the next step, and restoring it makes
        // that step repeat exactly.
        let saved = opt.state();
        let kept: Vec<Vec<f64>> = saved
            .moments
            .values()
            .flat_map(|(m, v, _)| [values(m), values(v)])
            .collect();
        let params_before: Vec<Tensor> = params.iter().map(|p| p.detach().copy()).collect();
        backward(&opt);
        opt.step().unwrap();
        let after: Vec<Vec<f64>> = params.iter().map(|p| values(p)).collect();
        let still: Vec<Vec<f64>> = saved
            .moments
            .values()
            .flat_map(|(m, v, _)| [values(m), values(v)])
            .collect();
        assert_eq!(kept, still, "the step wrote the shared moments");
        tch::no_grad(|| {
            for (p, before) in params.iter().zip(&params_before) {
                p.shallow_clone().copy_(before);
            }
        });
        opt.restore(saved).unwrap();
        backward(&opt);
        opt.step().unwrap();
        let again: Vec<Vec<f64>> = params.iter().map(|p| values(p)).collect();
        assert_eq!(after, again);
    }

    #[test]
    fn updating_in_groups_of_slots_gives_the_same_bits_as_one_group() {
        let cpu = tch::Device::Cpu;
        // Two fp32 tensors and two bf16 ones (with masters); clipping on; weight decay on the
        // matrices only. Group budgets: every slot alone (1 byte), two slots a group, one group.
        let run = |chunk_bytes: usize, take_state: bool| -> Vec<Vec<f64>> {
            let shapes: [(&str, &[i64], Kind); 4] = [
                ("a.weight", &[5, 3], Kind::Float),
                ("a.bias", &[3], Kind::Float),
                ("b.weight", &[4, 4], Kind::BFloat16),
                ("c.weight", &[2, 6], Kind::BFloat16),
            ];
            let params: Vec<(String, Tensor)> = shapes
                .iter()
                .enumerate()
                .map(|(i, (n, shape, kind))| {
                    // Fixed values (no generator: tests share torch's global one).
                    let len: i64 = shape.iter().product();
                    let p = (Tensor::arange(len, (Kind::Float, cpu)) * 0.7 + i as f64)
                        .sin()
                        .reshape(*shape)
                        .to_kind(*kind)
                        .set_requires_grad(true);
                    (n.to_string(), p)
                })
                .collect();
            let cfg = AdamWConfig {
                lr: 1e-2,
                weight_decay: 0.1,
                max_grad_norm: 0.5,
                ..AdamWConfig::default()
            };
            let mut opt = AdamW::new(
                params
                    .iter()
                    .map(|(n, p)| (n.clone(), p.shallow_clone()))
                    .collect(),
                cfg,
            );
            let mut saved = None;
            for _ in 0..3 {
                opt.zero_grad();
                let loss = params
                    .iter()
                    .map(|(_, p)| {
                        (p.to_kind(Kind::Float).pow_tensor_scalar(2) * 3.0).sum(Kind::Float)
                    })
                    .fold(Tensor::zeros([], (Kind::Float, cpu)), |a, x| a + x);
                loss.backward();
                if take_state {
                    saved = Some(opt.state());
                }
                opt.step_in_chunks(chunk_bytes, 1.0).unwrap();
            }
            drop(saved);
            let mut out: Vec<Vec<f64>> = params.iter().map(|(_, p)| values(p)).collect();
            out.extend(["b.weight", "c.weight"].map(|n| values(opt.master(n).unwrap())));
            out
        };
        for take_state in [false, true] {
            let whole = run(usize::MAX, take_state);
            assert_eq!(run(1, take_state), whole, "each slot alone");
            assert_eq!(run(15 * 4 + 3 * 4, take_state), whole, "two slots a group");
        }
    }

    #[test]
    fn schedules() {
        let c = Schedule::Cosine {
            warmup: 10,
            total: 110,
            min_ratio: 0.1,
        };
        assert!((c.factor(5) - 0.5).abs() < 1e-12);
        assert!((c.factor(10) - 1.0).abs() < 1e-12);
        assert!((c.factor(60) - 0.55).abs() < 1e-12);
        assert!((c.factor(500) - 0.1).abs() < 1e-12);
        let l = Schedule::Linear {
            warmup: 0,
            total: 4,
        };
        assert_eq!(l.factor(2), 0.5);
        assert_eq!(Schedule::Constant.factor(99), 1.0);
    }
}
