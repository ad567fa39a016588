//! Building the served policy from a model directory (or resuming it from the latest
//! checkpoint) with the optimisation settings it trains with (and, for a full fine-tune with a
//! KL term, a frozen reference copy of the model directory's weights), plus its tokenizer, chat
//! template and end-of-sequence ids.

use std::path::{Path, PathBuf};

use wire::TrainSettings;

use crate::checkpoint;
use crate::error::{Result, TrainerError};
use crate::model::lora::{self, LoraConfig};
use crate::model::{Qwen3, Qwen3Config};
use crate::train::{TrainConfig, Trainer};

use super::Policy;

#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Hugging Face model directory (config.json, safetensors, tokenizer.json).
    pub model_dir: PathBuf,
    /// What to train and how (LoRA or full fine-tune, optimizer, loss, minibatches).
    pub settings: TrainSettings,
    pub device: tch::Device,
    pub seed: i64,
    /// Resume from `checkpoint_dir/latest` when it exists.
    pub resume_from: Option<PathBuf>,
}

impl LoadOptions {
    /// Options whose settings are those of `train` and `lora` (see `settings::from_config`).
    pub fn from_config(
        model_dir: PathBuf,
        train: &TrainConfig,
        lora: Option<&LoraConfig>,
        device: tch::Device,
        seed: i64,
    ) -> Self {
        Self {
            model_dir,
            settings: crate::settings::from_config(train, lora),
            device,
            seed,
            resume_from: None,
        }
    }
}

/// What `trainer serve` needs besides the policy.
pub struct Loaded {
    pub policy: Policy,
    pub tokenizer: tokenizers::Tokenizer,
    pub chat_template: Option<String>,
    pub eos: Vec<u32>,
    pub max_model_len: usize,
    /// The checkpoint it resumed from.
    pub resumed: Option<PathBuf>,
}

fn read_json(p: &Path) -> Option<serde_json::Value> {
    std::fs::read_to_string(p)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
}

fn ids(v: Option<&serde_json::Value>) -> Vec<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => {
            n.as_u64().map(|x| vec![x as u32]).unwrap_or_default()
        }
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect(),
        _ => vec![],
    }
}

pub fn load(opts: &LoadOptions) -> Result<Loaded> {
    let dir = &opts.model_dir;
    let tok_path = dir.join("tokenizer.json");
    let tokenizer = tokenizers::Tokenizer::from_file(&tok_path)
        .map_err(|e| TrainerError::Tokenizer(format!("{}: {e}", tok_path.display())))?;
    let tcfg = read_json(&dir.join("tokenizer_config.json"));
    let chat_template = tcfg
        .as_ref()
        .and_then(|v| v.get("chat_template"))
        .and_then(|v| v.as_str())
        .map(str::to_string);
    let mut eos = ids(read_json(&dir.join("generation_config.json"))
        .as_ref()
        .and_then(|v| v.get("eos_token_id")));
    eos.extend(ids(read_json(&dir.join("config.json"))
        .as_ref()
        .and_then(|v| v.get("eos_token_id"))));
    for s in ["<|im_end|>", "<|endoftext|>"] {
        if let Some(id) = tokenizer.token_to_id(s) {
            eos.push(id);
        }
    }
    eos.sort_unstable();
    eos.dedup();

    let resume = match &opts.resume_from {
        Some(root) => checkpoint::latest(root)?,
        None => None,
    };
    let policy = build_policy(opts, resume.as_deref())?;
    let max_model_len = policy.trainer.model.cfg.max_position_embeddings as usize;
    Ok(Loaded {
        policy,
        tokenizer,
        chat_template,
        eos,
        max_model_len,
        resumed: resume,
    })
}

/// The policy from the model directory (fresh LoRA or trainable weights, version 0), or from a
/// checkpoint directory (its adapter or weights, optimizer moments and policy version), trained
/// with `opts.settings`. A checkpoint of another fine-tune mode or LoRA shape than the settings
/// is refused (`TrainerError::Mismatch`). The reference copy of a full fine-tune with a KL term
/// always comes from the model directory, never from the checkpoint.
pub fn build_policy(opts: &LoadOptions, checkpoint: Option<&Path>) -> Result<Policy> {
    let dir = &opts.model_dir;
    let resolved = crate::settings::resolve(&opts.settings)
        .map_err(|e| TrainerError::Config(e.to_string()))?;
    let kind = resolved
        .kind
        .unwrap_or_else(|| crate::default_kind(opts.device));
    let (model, lora_cfg, version) = match checkpoint {
        Some(ck) => {
            let st = checkpoint::read_state(ck)?;
            if !st.dtype.is_empty() && st.dtype != crate::dtype_name(kind) {
                return Err(TrainerError::Mismatch(format!(
                    "checkpoint {} holds {} parameters; the settings (hash {}) give {}: set \
                     trainer.param_dtype = \"{}\" (trainer serve --dtype {})",
                    ck.display(),
                    st.dtype,
                    opts.settings.hash(),
                    crate::dtype_name(kind),
                    st.dtype,
                    st.dtype
                )));
            }
            let want = if resolved.lora.is_some() {
                "lora"
            } else {
                "full"
            };
            if st.mode != want {
                return Err(TrainerError::Mismatch(format!(
                    "checkpoint {} holds a {} fine-tune; the settings (hash {}) train {want}",
                    ck.display(),
                    st.mode,
                    opts.settings.hash()
                )));
            }
            if st.mode == "lora" {
                let mut m = Qwen3::load(dir, opts.device, kind)?;
                let cfg = lora::load_adapter(&mut m, ck)?;
                if let Some(w) = &resolved.lora
                    && !same_lora(&cfg, w)
                {
                    return Err(TrainerError::Mismatch(format!(
                        "checkpoint {} holds a LoRA adapter r = {}, alpha = {}, dropout = {}, \
                         targets {:?}; the settings (hash {}) ask for r = {}, alpha = {}, \
                         dropout = {}, targets {:?}",
                        ck.display(),
                        cfg.r,
                        cfg.alpha,
                        cfg.dropout,
                        cfg.targets,
                        opts.settings.hash(),
                        w.r,
                        w.alpha,
                        w.dropout,
                        w.targets
                    )));
                }
                (m, Some(cfg), st.policy_version)
            } else {
                let m = Qwen3::load(ck, opts.device, kind)?;
                // The checkpoint must be the model directory's architecture and context: the
                // server advertises the directory's.
                let want = Qwen3Config::from_file(&dir.join("config.json"))?;
                let diff = m.cfg.architecture_diff(&want);
                if !diff.is_empty() {
                    return Err(TrainerError::Mismatch(format!(
                        "checkpoint {} is not a fine-tune of {}: {}",
                        ck.display(),
                        dir.display(),
                        diff.join("; ")
                    )));
                }
                m.set_trainable(true);
                (m, None, st.policy_version)
            }
        }
        None => {
            let mut m = Qwen3::load(dir, opts.device, kind)?;
            match &resolved.lora {
                Some(l) => m.add_lora(l, opts.seed)?,
                None => m.set_trainable(true),
            }
            (m, resolved.lora.clone(), 0)
        }
    };
    let reference = if resolved.reference_copy {
        Some(Qwen3::load(dir, opts.device, kind)?)
    } else {
        None
    };
    let mut trainer = Trainer::with_reference(model, reference, resolved.train)?;
    if let Some(ck) = checkpoint {
        if crate::dist::zero::is_sharded_save(ck) {
            // Restored by `restore_sharded_optimizer` once the policy knows its group.
            tracing::info!(checkpoint = %ck.display(), version, "weights restored; the ZeRO-sharded optimizer follows");
        } else {
            trainer.opt.load(ck)?;
            tracing::info!(checkpoint = %ck.display(), version, step = trainer.opt.step, "policy restored");
        }
    }
    Ok(Policy {
        trainer,
        version,
        lora: lora_cfg,
        base: dir.display().to_string(),
        seed: opts.seed,
        settings: opts.settings.clone(),
        weights_epoch: super::next_weights_epoch(),
    })
}

/// The same adapter shape (targets in any order).
fn same_lora(a: &LoraConfig, b: &LoraConfig) -> bool {
    a.r == b.r
        && a.alpha == b.alpha
        && a.dropout == b.dropout
        && a.targets.len() == b.targets.len()
        && a.targets.iter().all(|t| b.targets.contains(t))
}

/// The optimizer of a ZeRO-sharded checkpoint `ck` (written by a group of any size), restored
/// into `p` after it joined its group and set its ZeRO stage: this rank's shard of the saved
/// state under ZeRO, else the whole state reassembled from the shards (a single process, or a
/// group without ZeRO). A checkpoint with the single-file state was restored by
/// [`build_policy`]; nothing to do.
pub fn restore_sharded_optimizer(p: &mut Policy, ck: &Path) -> Result<()> {
    if !crate::dist::zero::is_sharded_save(ck) {
        return Ok(());
    }
    let grouped = p.trainer.collective().is_some_and(|g| g.world() > 1);
    if grouped && p.trainer.zero_stage() != crate::dist::zero::ZeroStage::Off {
        let step = p.trainer.load_zero(ck)?;
        tracing::info!(checkpoint = %ck.display(), step, "ZeRO optimizer shard restored");
        return Ok(());
    }
    let tmp = std::env::temp_dir().join(format!(
        "rubricem-consolidate-{}-{}",
        std::process::id(),
        p.version
    ));
    std::fs::create_dir_all(&tmp).map_err(crate::error::TrainerError::io(&tmp))?;
    let r = crate::dist::zero::consolidate_into(ck, &tmp).and_then(|_| p.trainer.opt.load(&tmp));
    let _ = std::fs::remove_dir_all(&tmp);
    r?;
    tracing::info!(checkpoint = %ck.display(), step = p.trainer.opt.step, "ZeRO-sharded optimizer reassembled");
    Ok(())
}
