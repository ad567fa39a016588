//! Sharded optimizer state (ZeRO stages 1 and 2; Rajbhandari et al., 2020) over a
//! [`Collective`]: the trainable parameters, flattened in a fixed order into one fp32 vector
//! padded to a multiple of the world size, are split into equal contiguous shards; rank r keeps
//! the AdamW moments and fp32 master weights of shard r only (12 bytes per parameter / N instead
//! of 12). Each update:
//! - stage 1: the flat gradient is all-reduced, each rank takes its shard;
//! - stage 2: the flat gradient is reduce-scattered, each rank receives only its shard's sum;
//!
//! then the global gradient norm (one scalar all-reduce) clips, each rank applies PyTorch's
//! AdamW rule to its shard, and the updated shards are all-gathered into every rank's full
//! parameters (rounded once to their dtype, as [`crate::optim::AdamW`] rounds its master).
//! Parameters stay replicated (that is stage 3's business, not done here).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tch::{Kind, Tensor};

use super::data_parallel::SyncStats;
use super::{Collective, DistError, ReduceOp, Result};
use crate::optim::AdamWConfig;

/// Which ZeRO stage shards the optimizer (`Off`: every rank keeps the whole state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ZeroStage {
    #[default]
    Off,
    /// Optimizer state sharded; gradients all-reduced.
    One,
    /// Optimizer state sharded; gradients reduce-scattered.
    Two,
}

impl std::str::FromStr for ZeroStage {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "0" | "off" => Ok(ZeroStage::Off),
            "1" => Ok(ZeroStage::One),
            "2" => Ok(ZeroStage::Two),
            other => Err(format!("ZeRO stage `{other}`: expected 0, 1 or 2")),
        }
    }
}

/// Where every trainable parameter sits in the flat vector.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    pub names: Vec<String>,
    pub shapes: Vec<Vec<i64>>,
    pub numels: Vec<i64>,
    /// Elements of all parameters.
    pub total: i64,
    /// Elements per shard (`total` padded up to a multiple of the world size, divided by it).
    pub chunk: i64,
}

impl Layout {
    pub fn new(params: &[(String, Tensor)], world: usize) -> Self {
        let numels: Vec<i64> = params.iter().map(|(_, t)| t.numel() as i64).collect();
        let total: i64 = numels.iter().sum();
        let w = world.max(1) as i64;
        Layout {
            names: params.iter().map(|(n, _)| n.clone()).collect(),
            shapes: params.iter().map(|(_, t)| t.size()).collect(),
            numels,
            total,
            chunk: (total + w - 1) / w,
        }
    }

    /// The flat range of shard `rank` that holds parameters (the tail of the last shard may
    /// be padding).
    pub fn owned(&self, rank: usize) -> std::ops::Range<i64> {
        let start = (rank as i64 * self.chunk).min(self.total);
        start..((rank as i64 + 1) * self.chunk).min(self.total)
    }
}

/// One rank's shard of the optimizer state.
pub struct ZeroShard {
    pub stage: ZeroStage,
    pub layout: Layout,
    rank: usize,
    world: usize,
    master: Tensor,
    m: Tensor,
    v: Tensor,
    /// 1 where the element's parameter decays (matrices), else 0.
    decay: Tensor,
    /// Whether a [`ZeroSnap`] may share `master`, `m` and `v` (see [`ZeroShard::state`]).
    shared: AtomicBool,
}

impl std::fmt::Debug for ZeroShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZeroShard")
            .field("stage", &self.stage)
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("chunk", &self.layout.chunk)
            .finish()
    }
}

/// A shard's tensors at one moment, shared not copied ([`ZeroShard::state`]).
#[derive(Debug)]
pub struct ZeroSnap {
    master: Tensor,
    m: Tensor,
    v: Tensor,
}

/// `flat` (fp32, `chunk * world` elements) with `params` concatenated at the start.
fn flatten(params: &[Tensor], chunk: i64, world: usize, f: impl Fn(&Tensor) -> Tensor) -> Tensor {
    let mut parts: Vec<Tensor> = params
        .iter()
        .map(|p| f(p).to_kind(Kind::Float).reshape([-1]))
        .collect();
    let total: i64 = parts.iter().map(|t| t.numel() as i64).sum();
    let pad = chunk * world as i64 - total;
    if pad > 0 {
        let device = params.first().map_or(tch::Device::Cpu, Tensor::device);
        parts.push(Tensor::zeros([pad], (Kind::Float, device)));
    }
    Tensor::cat(&parts, 0)
}

impl ZeroShard {
    /// Shard the optimizer of `params` (name order as every rank lists them) for `rank` of
    /// `world`: fresh moments, masters from the current parameter values.
    pub fn new(stage: ZeroStage, params: &[(String, Tensor)], rank: usize, world: usize) -> Self {
        let layout = Layout::new(params, world);
        tch::no_grad(|| {
            let tensors: Vec<Tensor> = params.iter().map(|(_, t)| t.shallow_clone()).collect();
            let flat = flatten(&tensors, layout.chunk, world, Tensor::detach);
            let mask = flatten(&tensors, layout.chunk, world, |t| t.zeros_like());
            // Decay flags per element, by the same rule as the unsharded optimizer.
            let mut off = 0i64;
            for ((name, t), n) in params.iter().zip(&layout.numels) {
                if crate::optim::decays(name, t) {
                    let _ = mask.narrow(0, off, *n).fill_(1.0);
                }
                off += n;
            }
            let mine = |x: &Tensor| x.narrow(0, rank as i64 * layout.chunk, layout.chunk).copy();
            let master = mine(&flat);
            ZeroShard {
                stage,
                rank,
                world,
                m: master.zeros_like(),
                v: master.zeros_like(),
                decay: mine(&mask),
                master,
                layout,
                shared: false.into(),
            }
        })
    }

    /// The shard's tensors as they are now (for a failed step's rollback), shared: the next
    /// [`ZeroShard::step`] updates copies of them instead of writing them in place.
    pub fn state(&self) -> ZeroSnap {
        self.shared.store(true, Ordering::Relaxed);
        ZeroSnap {
            master: self.master.shallow_clone(),
            m: self.m.shallow_clone(),
            v: self.v.shallow_clone(),
        }
    }

    pub fn restore(&mut self, s: ZeroSnap) {
        self.master = s.master;
        self.m = s.m;
        self.v = s.v;
        // Another state taken at the same moment may share these tensors too.
        self.shared.store(true, Ordering::Relaxed);
    }

    /// One update at 1-based optimizer step `step`: synchronise the gradients of `params` (in
    /// layout order, every one with a gradient), clip by the global norm, AdamW on this shard,
    /// gather the updated parameters. Returns (grad norm before clipping, lr, what the
    /// collectives did).
    pub fn step(
        &mut self,
        coll: &dyn Collective,
        params: &[Tensor],
        cfg: &AdamWConfig,
        step: u64,
    ) -> Result<(f64, f64, SyncStats)> {
        let t0 = Instant::now();
        let invalid = |message: String| DistError::Invalid {
            rank: coll.rank(),
            op: "zero step",
            message,
        };
        if params.len() != self.layout.numels.len() {
            return Err(invalid(format!(
                "{} parameters for a layout of {}",
                params.len(),
                self.layout.numels.len()
            )));
        }
        if let Some(i) = params.iter().position(|p| !p.grad().defined()) {
            return Err(invalid(format!(
                "parameter {} has no gradient (ensure_grads first)",
                self.layout.names[i]
            )));
        }
        let (chunk, world, rank) = (self.layout.chunk, self.world, self.rank);
        let mut stats = SyncStats::default();
        tch::no_grad(|| -> Result<(f64, f64, SyncStats)> {
            let mut flat = flatten(params, chunk, world, Tensor::grad);
            stats.elements += flat.numel();
            let mut g = match self.stage {
                ZeroStage::Two => {
                    let mut out = Tensor::zeros([chunk], (Kind::Float, flat.device()));
                    coll.reduce_scatter(&mut out, &flat, ReduceOp::Sum)?
                        .wait()?;
                    out
                }
                _ => {
                    coll.all_reduce(&mut flat, ReduceOp::Sum)?.wait()?;
                    // Stage 1 has every gradient: keep them on the parameters as plain data
                    // parallelism does.
                    let mut off = 0i64;
                    for p in params {
                        let n = p.numel() as i64;
                        let mut gr = p.grad();
                        gr.copy_(&flat.narrow(0, off, n).view_as(&gr));
                        off += n;
                    }
                    flat.narrow(0, rank as i64 * chunk, chunk).copy()
                }
            };
            stats.collectives += 1;
            let mut sq = g.pow_tensor_scalar(2).sum(Kind::Float).reshape([1]);
            coll.all_reduce(&mut sq, ReduceOp::Sum)?.wait()?;
            stats.collectives += 1;
            let norm = sq.double_value(&[0]).sqrt();
            let clip = if cfg.max_grad_norm > 0.0 && norm > cfg.max_grad_norm {
                cfg.max_grad_norm / (norm + 1e-6)
            } else {
                1.0
            };
            let lr = cfg.lr * cfg.schedule.factor(step);
            if clip != 1.0 {
                let _ = g.f_mul_scalar_(clip).map_err(|e| invalid(e.to_string()))?;
            }
            // A state snapshot may share the shard's tensors: then update copies of them.
            if self.shared.swap(false, Ordering::Relaxed) {
                self.master = self.master.copy();
                self.m = self.m.copy();
                self.v = self.v.copy();
            }
            if cfg.weight_decay > 0.0 {
                // Decoupled decay on the elements whose parameter decays, then the fused
                // update without decay.
                let keep = (&self.decay * (-lr * cfg.weight_decay)) + 1.0;
                let _ = self
                    .master
                    .f_mul_(&keep)
                    .map_err(|e| invalid(e.to_string()))?;
            }
            let slot = crate::kernels::AdamWSlot {
                name: "zero shard",
                param: &self.master,
                grad: &g,
                m: &self.m,
                v: &self.v,
            };
            let update = crate::kernels::AdamWUpdate {
                step,
                lr,
                betas: cfg.betas,
                eps: cfg.eps,
                weight_decay: 0.0,
            };
            crate::kernels::fused_adamw(&[slot], &update).map_err(|e| invalid(e.to_string()))?;
            let mut full = Tensor::zeros([chunk * world as i64], (Kind::Float, g.device()));
            coll.all_gather(&mut full, &self.master)?.wait()?;
            stats.collectives += 1;
            stats.elements += full.numel();
            let mut off = 0i64;
            for p in params {
                let n = p.numel() as i64;
                let mut p = p.shallow_clone();
                p.copy_(&full.narrow(0, off, n).view_as(&p));
                off += n;
            }
            stats.seconds = t0.elapsed().as_secs_f64();
            Ok((norm, lr, stats))
        })
    }

    /// Write this rank's shard: `optimizer.zero-RANK-of-WORLD.safetensors` (master, m, v of the
    /// owned range, padding dropped) and, from rank 0, `optimizer.zero.json` (layout, step).
    pub fn save(&self, dir: &Path, step: u64) -> crate::error::Result<()> {
        let owned = self.layout.owned(self.rank);
        let len = owned.end - owned.start;
        let cut = |t: &Tensor| t.narrow(0, 0, len);
        let tensors = vec![
            ("master".to_string(), cut(&self.master)),
            ("m".to_string(), cut(&self.m)),
            ("v".to_string(), cut(&self.v)),
        ];
        crate::model::weights::write_file(&dir.join(shard_file(self.rank, self.world)), &tensors)?;
        if self.rank == 0 {
            let path = dir.join("optimizer.zero.json");
            let meta = serde_json::json!({
                "step": step, "world": self.world, "stage": self.stage,
                "names": self.layout.names, "numels": self.layout.numels,
                "shapes": self.layout.shapes,
            });
            let text = serde_json::to_string_pretty(&meta)
                .map_err(crate::error::TrainerError::json(&path))?;
            std::fs::write(&path, text).map_err(crate::error::TrainerError::io(&path))?;
        }
        Ok(())
    }

    /// Restore from the shards a group of any size wrote into `dir`: the whole flat state is
    /// reassembled from every shard file, then this rank's shard of the current layout is taken.
    /// The parameter list must be the one saved (names and sizes). Returns the optimizer step.
    pub fn load(&mut self, dir: &Path) -> crate::error::Result<u64> {
        let saved = Saved::read(dir, self.master.device())?;
        saved.check(&self.layout.names, &self.layout.numels, dir)?;
        let (chunk, rank, world) = (self.layout.chunk, self.rank, self.world);
        let mine = |whole: &Tensor| {
            let pad = chunk * world as i64 - whole.numel() as i64;
            let whole = if pad > 0 {
                Tensor::cat(
                    &[
                        whole.shallow_clone(),
                        Tensor::zeros([pad], (Kind::Float, whole.device())),
                    ],
                    0,
                )
            } else {
                whole.shallow_clone()
            };
            whole.narrow(0, rank as i64 * chunk, chunk).copy()
        };
        self.master = mine(&saved.master);
        self.m = mine(&saved.m);
        self.v = mine(&saved.v);
        Ok(saved.step)
    }
}

/// A sharded save reassembled: the flat fp32 master weights and moments of every parameter.
pub struct Saved {
    pub names: Vec<String>,
    pub shapes: Vec<Vec<i64>>,
    pub numels: Vec<i64>,
    pub step: u64,
    pub master: Tensor,
    pub m: Tensor,
    pub v: Tensor,
}

impl Saved {
    /// Read `optimizer.zero.json` and every shard file it implies from `dir`.
    pub fn read(dir: &Path, device: tch::Device) -> crate::error::Result<Self> {
        use crate::error::TrainerError;
        let path = dir.join("optimizer.zero.json");
        let text = std::fs::read_to_string(&path).map_err(TrainerError::io(&path))?;
        let meta: serde_json::Value =
            serde_json::from_str(&text).map_err(TrainerError::json(&path))?;
        let field = |k: &str| {
            meta.get(k)
                .cloned()
                .ok_or_else(|| TrainerError::Config(format!("{}: no `{k}`", path.display())))
        };
        let world: usize =
            serde_json::from_value(field("world")?).map_err(TrainerError::json(&path))?;
        let step: u64 =
            serde_json::from_value(field("step")?).map_err(TrainerError::json(&path))?;
        let names: Vec<String> =
            serde_json::from_value(field("names")?).map_err(TrainerError::json(&path))?;
        let numels: Vec<i64> =
            serde_json::from_value(field("numels")?).map_err(TrainerError::json(&path))?;
        let shapes: Vec<Vec<i64>> =
            serde_json::from_value(field("shapes")?).map_err(TrainerError::json(&path))?;
        if shapes.len() != numels.len()
            || shapes
                .iter()
                .zip(&numels)
                .any(|(s, n)| s.iter().product::<i64>() != *n)
        {
            return Err(TrainerError::Config(format!(
                "{}: shapes and element counts disagree",
                path.display()
            )));
        }
        let mut parts: BTreeMap<&str, Vec<Tensor>> = BTreeMap::new();
        for r in 0..world {
            let mut t = crate::model::weights::read_file(
                &dir.join(shard_file(r, world)),
                device,
                Some(Kind::Float),
                None,
            )?;
            for key in ["master", "m", "v"] {
                let x = t
                    .remove(key)
                    .ok_or_else(|| TrainerError::MissingTensor(format!("{key} of shard {r}")))?;
                parts.entry(key).or_default().push(x);
            }
        }
        let total: i64 = numels.iter().sum();
        let mut whole = |key: &str| -> crate::error::Result<Tensor> {
            let t = Tensor::cat(&parts.remove(key).unwrap_or_default(), 0);
            if t.numel() as i64 != total {
                return Err(TrainerError::Config(format!(
                    "{}: the shards hold {} elements of `{key}`, the parameters {total}",
                    dir.display(),
                    t.numel()
                )));
            }
            Ok(t)
        };
        Ok(Saved {
            master: whole("master")?,
            m: whole("m")?,
            v: whole("v")?,
            names,
            shapes,
            numels,
            step,
        })
    }

    /// Refuse a save of another parameter list.
    pub fn check(&self, names: &[String], numels: &[i64], dir: &Path) -> crate::error::Result<()> {
        if names != self.names.as_slice() || numels != self.numels.as_slice() {
            return Err(crate::error::TrainerError::Config(format!(
                "{}: the saved optimizer shards are of another parameter list ({} parameters, {} elements; now {}, {})",
                dir.display(),
                self.names.len(),
                self.numels.iter().sum::<i64>(),
                names.len(),
                numels.iter().sum::<i64>()
            )));
        }
        Ok(())
    }

    /// Per parameter, in saved order: (name, master, m, v), each fp32 in the parameter's
    /// shape: what an unsharded optimizer restores ([`crate::optim::AdamW::set_state`]).
    pub fn per_parameter(&self) -> Vec<(String, Tensor, Tensor, Tensor)> {
        let mut off = 0i64;
        self.names
            .iter()
            .zip(&self.numels)
            .zip(&self.shapes)
            .map(|((name, &n), shape)| {
                let cut = |t: &Tensor| t.narrow(0, off, n).reshape(shape.as_slice());
                let out = (name.clone(), cut(&self.master), cut(&self.m), cut(&self.v));
                off += n;
                out
            })
            .collect()
    }
}

/// Rewrite the sharded optimizer save in `dir` (any world size) as the single-file state a
/// one-process trainer restores (`optimizer.safetensors` with `m.NAME`, `v.NAME`, `master.NAME`
/// and `optimizer.json`, [`crate::optim::AdamW::load`]). Returns (parameters, elements, step).
pub fn consolidate(dir: &Path) -> crate::error::Result<(usize, i64, u64)> {
    consolidate_into(dir, dir)
}

/// [`consolidate`] writing the single-file state into `out` (the sharded save in `dir` is left
/// as it is).
pub fn consolidate_into(dir: &Path, out: &Path) -> crate::error::Result<(usize, i64, u64)> {
    use crate::error::TrainerError;
    let saved = Saved::read(dir, tch::Device::Cpu)?;
    let mut tensors = Vec::new();
    for (name, master, m, v) in saved.per_parameter() {
        tensors.push((format!("m.{name}"), m));
        tensors.push((format!("v.{name}"), v));
        tensors.push((format!("master.{name}"), master));
    }
    crate::model::weights::write_file(&out.join("optimizer.safetensors"), &tensors)?;
    let path = out.join("optimizer.json");
    let meta = serde_json::json!({"step": saved.step, "consolidated_from_zero": true});
    let text = serde_json::to_string_pretty(&meta).map_err(TrainerError::json(&path))?;
    std::fs::write(&path, text).map_err(TrainerError::io(&path))?;
    Ok((saved.names.len(), saved.numels.iter().sum(), saved.step))
}

/// Whether `dir` holds a ZeRO-sharded optimizer save rather than the single-file state.
pub fn is_sharded_save(dir: &Path) -> bool {
    dir.join("optimizer.zero.json").exists() && !dir.join("optimizer.safetensors").exists()
}

/// The file of shard `rank` of a `world`-rank save.
pub fn shard_file(rank: usize, world: usize) -> String {
    format!("optimizer.zero-{rank}-of-{world}.safetensors")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_pads_to_equal_shards() {
        let p = |n: i64| Tensor::zeros([n], (Kind::Float, tch::Device::Cpu));
        let params = vec![("a".to_string(), p(5)), ("b".to_string(), p(6))];
        let l = Layout::new(&params, 4);
        assert_eq!((l.total, l.chunk), (11, 3));
        assert_eq!(l.owned(0), 0..3);
        assert_eq!(l.owned(3), 9..11);
        let l1 = Layout::new(&params, 1);
        assert_eq!((l1.chunk, l1.owned(0)), (11, 0..11));
        assert_eq!("2".parse::<ZeroStage>(), Ok(ZeroStage::Two));
        assert!("3".parse::<ZeroStage>().is_err());
    }
}
