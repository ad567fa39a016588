//! LoRA adapters as files: the PEFT adapter format (`adapter_model.safetensors` +
//! `adapter_config.json`) that PEFT and vLLM load unchanged, written from and attached to a
//! model. The layer itself and its config live in `linear` (re-exported here).

use std::path::Path;

use tch::{Device, Kind};

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

/// Attach the adapters of a PEFT directory to the model (replacing any attached).
pub fn load_adapter(model: &mut Qwen3, dir: &Path) -> Result<LoraConfig> {
    let cfg = read_adapter_config(dir)?;
    let device: Device = model.device;
    let mut tensors = super::weights::read_file(
        &dir.join("adapter_model.safetensors"),
        device,
        Some(Kind::Float),
        None,
    )?;
    let scale = cfg.scale();
    for (name, target, proj) in model.projections_mut() {
        proj.lora = None;
        if !cfg.targets.contains(&target) {
            continue;
        }
        let take = |t: &mut std::collections::BTreeMap<String, tch::Tensor>, ab: &str| {
            // PEFT may or may not keep the adapter name ("default") in the key.
            let plain = format!("base_model.model.{name}.{ab}.weight");
            let named = format!("base_model.model.{name}.{ab}.default.weight");
            t.remove(&plain)
                .or_else(|| t.remove(&named))
                .ok_or(TrainerError::MissingTensor(plain))
        };
        let a = take(&mut tensors, "lora_A")?.set_requires_grad(true);
        let b = take(&mut tensors, "lora_B")?.set_requires_grad(true);
        proj.lora = Some(Lora {
            a,
            b,
            scale,
            dropout: cfg.dropout,
        });
    }
    if !tensors.is_empty() {
        let names: Vec<&str> = tensors.keys().map(String::as_str).take(8).collect();
        return Err(TrainerError::UnexpectedTensors(names.join(", ")));
    }
    Ok(cfg)
}
