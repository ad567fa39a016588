//! Checkpoints that let a restarted trainer continue exactly: the adapter (PEFT layout) or the
//! full weights, the optimizer moments and step, and `state.json` (policy version, seed, mode).
//! Randomness needs no saved generator: dropout is seeded from the optimizer step and the seed
//! (see `train.rs`), so (seed, step) determines it. Directories are written beside their final
//! name and renamed into place; `latest` is a one-line pointer file replaced the same way, so a
//! crash at any moment leaves the previous checkpoint intact and never a half-written one.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainerError};
use crate::model::lora::{self, LoraConfig};
use crate::train::Trainer;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointState {
    /// Optimizer steps taken.
    pub step: u64,
    /// Policy version served after this checkpoint (one per train step).
    pub policy_version: i64,
    pub seed: i64,
    /// `lora` or `full`.
    pub mode: String,
    /// Base model directory or id the adapter belongs to.
    pub base: String,
    /// The parameters' dtype (`f32`, `bf16`); empty in checkpoints written before it was
    /// recorded. A restore in another dtype is refused: the fp32 master weights of a bf16 run
    /// would be dropped, or an f32 run's weights rounded.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub dtype: String,
}

/// Write `src` into `dst` by renaming a fully written sibling into place. An existing `dst` is
/// replaced (moved aside first, removed after).
pub fn write_dir_atomically(dst: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let parent = dst.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(TrainerError::io(parent))?;
    let name = dst
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(TrainerError::io(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(TrainerError::io(&tmp))?;
    if let Err(e) = write(&tmp) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let old = parent.join(format!(".{name}.old-{}", std::process::id()));
    if dst.exists() {
        std::fs::rename(dst, &old).map_err(TrainerError::io(dst))?;
    }
    std::fs::rename(&tmp, dst).map_err(TrainerError::io(dst))?;
    if old.exists() {
        let _ = std::fs::remove_dir_all(&old);
    }
    Ok(())
}

/// Remove leftovers of interrupted writes (`.NAME.tmp-*`, `.NAME.old-*`) in `dir`.
pub fn clean_partial(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with('.') && (name.contains(".tmp-") || name.contains(".old-")) {
            n += usize::from(std::fs::remove_dir_all(e.path()).is_ok());
        }
    }
    n
}

/// Save a checkpoint as `root/step-NNNNNN` and point `root/latest` at it.
pub fn save(
    root: &Path,
    trainer: &Trainer,
    lora_cfg: Option<&LoraConfig>,
    state: &CheckpointState,
) -> Result<PathBuf> {
    if trainer.zero_shard().is_some() {
        // Every rank holds one shard: a checkpoint directory needs all of them (Trainer::
        // save_zero from each rank); this single-writer path would lose the others.
        return Err(TrainerError::Config(
            "checkpoints of a ZeRO-sharded optimizer are written per rank (Trainer::save_zero); the single-writer checkpoint directory does not support them yet".into(),
        ));
    }
    save_with(root, trainer, lora_cfg, state, |tmp| trainer.opt.save(tmp))
}

/// [`save`] with the optimizer state written by `optimizer` into the directory being built
/// (a ZeRO group: every rank writes its shard there before the directory is renamed into
/// place).
pub fn save_with(
    root: &Path,
    trainer: &Trainer,
    lora_cfg: Option<&LoraConfig>,
    state: &CheckpointState,
    optimizer: impl FnOnce(&Path) -> Result<()>,
) -> Result<PathBuf> {
    let dir = root.join(format!("step-{:06}", state.step));
    write_dir_atomically(&dir, |tmp| {
        match lora_cfg {
            Some(l) => lora::save_adapter(&trainer.model, l, &state.base, tmp)?,
            None => trainer.model.save(tmp)?,
        }
        optimizer(tmp)?;
        let p = tmp.join("state.json");
        let text = serde_json::to_string_pretty(state).map_err(TrainerError::json(&p))?;
        std::fs::write(&p, text).map_err(TrainerError::io(&p))
    })?;
    let latest = root.join("latest");
    let tmp = root.join(format!(".latest.tmp-{}", std::process::id()));
    std::fs::write(&tmp, format!("step-{:06}\n", state.step)).map_err(TrainerError::io(&tmp))?;
    std::fs::rename(&tmp, &latest).map_err(TrainerError::io(&latest))?;
    Ok(dir)
}

/// The directory `root/latest` points at, if any.
pub fn latest(root: &Path) -> Result<Option<PathBuf>> {
    let p = root.join("latest");
    match std::fs::read_to_string(&p) {
        Ok(s) => {
            let dir = root.join(s.trim());
            if !dir.join("state.json").exists() {
                return Err(TrainerError::Config(format!(
                    "{} points at {}, which holds no state.json",
                    p.display(),
                    dir.display()
                )));
            }
            Ok(Some(dir))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(TrainerError::io(&p)(e)),
    }
}

pub fn read_state(dir: &Path) -> Result<CheckpointState> {
    let p = dir.join("state.json");
    let text = std::fs::read_to_string(&p).map_err(TrainerError::io(&p))?;
    serde_json::from_str(&text).map_err(TrainerError::json(&p))
}
