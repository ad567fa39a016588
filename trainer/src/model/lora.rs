//! LoRA adapters as files: the PEFT adapter format (`adapter_model.safetensors` +
//! `adapter_config.json`) that PEFT and vLLM load unchanged, written from a model, and read,
//! checked whole against a model (staged) and only then attached to it. The layer itself and its
//! config live in `linear` (re-exported here).

use std::collections::BTreeMap;
use std::path::Path;

use tch::{Device, Kind, Tensor};

pub use super::linear::{Lora, LoraConfig, LoraTarget};
use super::qwen3::Qwen3;
use crate::error::{Result, TrainerError};

/// Write the model's adapters in PEFT format (f32 tensors; vLLM casts on load).
pub fn save_adapter(model: &Qwen3, cfg: &LoraConfig, base_id: &str, dir: &Path) -> Result<()> {
    let tensors = model.lora_tensors();
    if tensors.is_empty() {
        return Err(TrainerError::Config(
            "the model has no LoRA adapters to save".into(),
        ));
    }
    std::fs::create_dir_all(dir).map_err(TrainerError::io(dir))?;
    let tensors: Vec<(String, tch::Tensor)> = tensors
        .into_iter()
        .map(|(n, t)| (n, t.detach().to_kind(Kind::Float)))
        .collect();
    super::weights::write_file(&dir.join("adapter_model.safetensors"), &tensors)?;
    let targets: Vec<&str> = cfg.targets.iter().map(|t| t.module()).collect();
    let json = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_id,
        "r": cfg.r,
        "lora_alpha": cfg.alpha,
        "lora_dropout": cfg.dropout,
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "use_rslora": false,
        "use_dora": false,
        "init_lora_weights": true,
        "modules_to_save": null,
    });
    let path = dir.join("adapter_config.json");
    let text = serde_json::to_string_pretty(&json).map_err(TrainerError::json(&path))?;
    std::fs::write(&path, text).map_err(TrainerError::io(&path))?;
    Ok(())
}

/// Read a PEFT adapter directory's config.
pub fn read_adapter_config(dir: &Path) -> Result<LoraConfig> {
    let path = dir.join("adapter_config.json");
    let text = std::fs::read_to_string(&path).map_err(TrainerError::io(&path))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(TrainerError::json(&path))?;
    let bad = |m: &str| TrainerError::Config(format!("{}: {m}", path.display()));
    if v.get("use_dora").and_then(|x| x.as_bool()) == Some(true)
        || v.get("use_rslora").and_then(|x| x.as_bool()) == Some(true)
    {
        return Err(bad("DoRA and rsLoRA adapters are not supported"));
    }
    let targets = match v.get("target_modules") {
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_str())
            .map(LoraTarget::parse)
            .collect::<Result<Vec<_>>>()?,
        _ => return Err(bad("target_modules must be a list")),
    };
    let cfg = LoraConfig {
        r: v.get("r")
            .and_then(|x| x.as_i64())
            .ok_or_else(|| bad("no r"))?,
        alpha: v
            .get("lora_alpha")
            .and_then(|x| x.as_f64())
            .ok_or_else(|| bad("no lora_alpha"))?,
        dropout: v
            .get("lora_dropout")
            .and_then(|x| x.as_f64())
            .unwrap_or(0.0),
        targets,
    };
    cfg.validate()?;
    Ok(cfg)
}

/// An adapter read and checked whole against a model, not yet attached: every targeted
/// projection's A `[r, d_in]` and B `[d_out, r]` (f32, finite, on the model's device), nothing
/// missing and nothing extra. [`StagedAdapter::attach`] then swaps it in and cannot fail, so a
/// refused adapter leaves the model as it was.
#[derive(Debug)]
pub struct StagedAdapter {
    cfg: LoraConfig,
    /// Module name -> (A, B).
    pairs: BTreeMap<String, (Tensor, Tensor)>,
}

impl StagedAdapter {
    pub fn config(&self) -> &LoraConfig {
        &self.cfg
    }

    /// Replace every projection's adapter by the staged one (none on projections the adapter
    /// does not target); the base weights stop training (an adapter is what trains).
    pub fn attach(mut self, model: &mut Qwen3) -> LoraConfig {
        model.set_trainable(false);
        let (scale, dropout) = (self.cfg.scale(), self.cfg.dropout);
        for (name, _, proj) in model.projections_mut() {
            proj.lora = self.pairs.remove(&name).map(|(a, b)| Lora {
                a: a.set_requires_grad(true),
                b: b.set_requires_grad(true),
                scale,
                dropout,
            });
        }
        self.cfg
    }
}

/// Read the adapter of a PEFT directory and check it tensor by tensor against a model's
/// projections (`Qwen3::projection_shapes`) on `device`: names, shapes for the config's rank,
/// dtype (floating point; stored as f32) and finite values. The model is not touched.
pub fn stage_adapter(
    projections: &[(String, LoraTarget, [i64; 2])],
    device: Device,
    dir: &Path,
) -> Result<StagedAdapter> {
    let cfg = read_adapter_config(dir)?;
    let path = dir.join("adapter_model.safetensors");
    let mut tensors = super::weights::read_file(&path, device, Some(Kind::Float), None)?;
    let mut pairs = BTreeMap::new();
    for (name, target, [d_out, d_in]) in projections {
        if !cfg.targets.contains(target) {
            continue;
        }
        let mut take = |ab: &str, shape: [i64; 2]| -> Result<Tensor> {
            // PEFT may or may not keep the adapter name ("default") in the key.
            let plain = format!("base_model.model.{name}.{ab}.weight");
            let named = format!("base_model.model.{name}.{ab}.default.weight");
            let (key, t) = match tensors.remove(&plain) {
                Some(t) => (plain, t),
                None => match tensors.remove(&named) {
                    Some(t) => (named, t),
                    None => return Err(TrainerError::MissingTensor(plain)),
                },
            };
            check_tensor(&key, &t, &shape)?;
            Ok(t)
        };
        let a = take("lora_A", [cfg.r, *d_in])?;
        let b = take("lora_B", [*d_out, cfg.r])?;
        pairs.insert(name.clone(), (a, b));
    }
    if !tensors.is_empty() {
        let names: Vec<&str> = tensors.keys().map(String::as_str).take(8).collect();
        return Err(TrainerError::UnexpectedTensors(names.join(", ")));
    }
    Ok(StagedAdapter { cfg, pairs })
}

/// One adapter tensor: the expected shape, stored as f32 (`read_file` converts every floating
/// dtype; anything else is refused), finite throughout.
fn check_tensor(name: &str, t: &Tensor, shape: &[i64]) -> Result<()> {
    if t.size() != shape {
        return Err(TrainerError::Shape {
            name: name.into(),
            got: t.size(),
            want: shape.to_vec(),
        });
    }
    if t.kind() != Kind::Float {
        return Err(TrainerError::Dtype {
            name: name.into(),
            got: format!("{:?}", t.kind()),
            want: "a floating-point dtype (F32, F16, BF16, F64)".into(),
        });
    }
    let finite = tch::no_grad(|| t.f_isfinite()?.f_all()?.f_int64_value(&[]))?;
    if finite != 1 {
        return Err(TrainerError::NotFinite(name.into()));
    }
    Ok(())
}

/// Attach the adapters of a PEFT directory to the model (replacing any attached), after
/// checking them whole ([`stage_adapter`]); on error the model is unchanged.
pub fn load_adapter(model: &mut Qwen3, dir: &Path) -> Result<LoraConfig> {
    let staged = stage_adapter(&model.projection_shapes(), model.device, dir)?;
    Ok(staged.attach(model))
}
