//! Building the served policy from a model directory (or resuming it from the latest
//! checkpoint), with its tokenizer, chat template and end-of-sequence ids.

use std::path::{Path, PathBuf};

use crate::checkpoint;
use crate::error::{Result, TrainerError};
use crate::model::Qwen3;
use crate::model::lora::{self, LoraConfig};
use crate::train::{TrainConfig, Trainer};

use super::Policy;

#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Hugging Face model directory (config.json, safetensors, tokenizer.json).
    pub model_dir: PathBuf,
    /// LoRA to train (None: full fine-tune).
    pub lora: Option<LoraConfig>,
    pub train: TrainConfig,
    pub device: tch::Device,
    pub seed: i64,
    /// Resume from `checkpoint_dir/latest` when it exists.
    pub resume_from: Option<PathBuf>,
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
/// checkpoint directory (its adapter or weights, optimizer moments and policy version).
pub fn build_policy(opts: &LoadOptions, checkpoint: Option<&Path>) -> Result<Policy> {
    let dir = &opts.model_dir;
    let kind = crate::default_kind(opts.device);
    let (model, lora_cfg, version) = match checkpoint {
        Some(ck) => {
            let st = checkpoint::read_state(ck)?;
            if st.mode == "lora" {
                let mut m = Qwen3::load(dir, opts.device, kind)?;
                let cfg = lora::load_adapter(&mut m, ck)?;
                (m, Some(cfg), st.policy_version)
            } else {
                let m = Qwen3::load(ck, opts.device, kind)?;
                m.set_trainable(true);
                (m, None, st.policy_version)
            }
        }
        None => {
            let mut m = Qwen3::load(dir, opts.device, kind)?;
            match &opts.lora {
                Some(l) => m.add_lora(l, opts.seed)?,
                None => m.set_trainable(true),
            }
            (m, opts.lora.clone(), 0)
        }
    };
    let mut trainer = Trainer::new(model, opts.train.clone())?;
    if let Some(ck) = checkpoint {
        trainer.opt.load(ck)?;
        tracing::info!(checkpoint = %ck.display(), version, step = trainer.opt.step, "policy restored");
    }
    Ok(Policy {
        trainer,
        version,
        lora: lora_cfg,
        base: dir.display().to_string(),
        seed: opts.seed,
    })
}
