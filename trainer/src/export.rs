//! `trainer export`: one policy version of a checkpoint written as a directory that transformers,
//! PEFT and vLLM load unchanged. A full fine-tune (or a LoRA one with `--merge`) becomes a Hugging
//! Face model directory (config.json with its dtype, `model.safetensors` or index-sharded
//! `model-*-of-*.safetensors`, generation_config.json); a LoRA fine-tune a PEFT adapter
//! (`adapter_config.json` naming the base, `adapter_model.safetensors`). Both carry the base's
//! tokenizer files and chat template, `export.json` (version, step, mode, base, source, SHA-256
//! of every weight file) and a model card (README.md) with YAML front matter, the training facts
//! and an optional markdown section from the caller (`--card-extra`: evaluation summary, resolved
//! config). The directory is written beside its final name and renamed into place
//! (`checkpoint::write_dir_atomically`). Only weights and state.json are read from the checkpoint:
//! the optimizer files, whole or ZeRO-sharded, are not needed (their step and settings only feed
//! the card).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};
use tch::{Device, Kind, Tensor};

use crate::checkpoint::{self, CheckpointState};
use crate::error::{Result, TrainerError};
use crate::model::lora::{self, LoraTarget};
use crate::model::weights::{self, TensorInfo};
use crate::model::{Qwen3, Qwen3Config};

/// Tokenizer files copied from the base when present (`tokenizer.json` and
/// `tokenizer_config.json` are required).
pub const TOKENIZER_FILES: [&str; 9] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
];

/// What the exported weights are stored as (`--dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExportDtype {
    /// As stored: the checkpoint's dtype (full, adapter) or the base's (merged).
    Keep,
    Bf16,
    F32,
}

impl std::str::FromStr for ExportDtype {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "keep" => Ok(Self::Keep),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "f32" | "fp32" | "float32" => Ok(Self::F32),
            other => Err(format!("--dtype = {other:?}; allowed: bf16, f32, keep")),
        }
    }
}

/// What the export directory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExportFormat {
    /// A full fine-tune's weights (Hugging Face model directory).
    Full,
    /// A LoRA fine-tune folded into the base weights (Hugging Face model directory).
    Merged,
    /// A PEFT LoRA adapter for the base.
    Adapter,
}

/// `trainer export`'s settings.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// A checkpoint directory (holds state.json) or a checkpoint root (`latest`, `step-N`).
    pub checkpoint: PathBuf,
    /// Under a root: the checkpoint of this policy version instead of `latest`; of a checkpoint
    /// directory: the version it must hold.
    pub version: Option<i64>,
    pub out: PathBuf,
    /// The base model directory (tokenizer, config; LoRA's base weights); `None`: state.json's.
    pub base: Option<PathBuf>,
    /// The base as written into adapter_config.json and the card (a hub id, say); `None`: the
    /// base directory's absolute path.
    pub base_name: Option<String>,
    pub dtype: ExportDtype,
    /// LoRA: write the merged full weights instead of the adapter.
    pub merge: bool,
    /// Markdown appended to the model card.
    pub card_extra: Option<PathBuf>,
    /// Weight files above this size are split into index-mapped shards.
    pub max_shard_bytes: u64,
}

impl ExportOptions {
    /// Defaults for everything but the checkpoint and the output.
    pub fn new(checkpoint: impl Into<PathBuf>, out: impl Into<PathBuf>) -> Self {
        Self {
            checkpoint: checkpoint.into(),
            version: None,
            out: out.into(),
            base: None,
            base_name: None,
            dtype: ExportDtype::Keep,
            merge: false,
            card_extra: None,
            max_shard_bytes: DEFAULT_MAX_SHARD_BYTES,
        }
    }
}

/// Shards of at most 5 GB, as transformers' `save_pretrained` writes them.
pub const DEFAULT_MAX_SHARD_BYTES: u64 = 5_000_000_000;

/// What an export wrote: the content of `export.json` (and the command's JSON output).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExportReport {
    pub out: PathBuf,
    pub format: ExportFormat,
    pub policy_version: i64,
    pub step: u64,
    /// `full` or `lora` (state.json).
    pub mode: String,
    /// The base as named in adapter_config.json and the card.
    pub base: String,
    /// The base model directory the tokenizer (and LoRA's base weights) came from.
    pub base_dir: PathBuf,
    pub source_checkpoint: PathBuf,
    /// Stored dtype of the weights (`float32`, `bfloat16`, ...).
    pub dtype: String,
    /// Weight file -> SHA-256 (hex).
    pub sha256: BTreeMap<String, String>,
    /// Every file written, export.json and README.md included.
    pub files: Vec<String>,
    pub trainer_version: String,
}

/// The checkpoint directory `--checkpoint` and `--version` name: the directory itself when it
/// holds state.json (its version checked against `version`), else, as a root, the checkpoint of
/// policy version `version` (the latest step of that version) or the one `latest` points at.
pub fn resolve_checkpoint(path: &Path, version: Option<i64>) -> Result<PathBuf> {
    if path.join("state.json").is_file() {
        if let Some(v) = version {
            let st = checkpoint::read_state(path)?;
            if st.policy_version != v {
                return Err(TrainerError::Config(format!(
                    "checkpoint {} holds policy version {}, not --version {v}",
                    path.display(),
                    st.policy_version
                )));
            }
        }
        return Ok(path.to_path_buf());
    }
    if !path.is_dir() {
        return Err(TrainerError::Config(format!(
            "--checkpoint {}: no such directory",
            path.display()
        )));
    }
    let Some(v) = version else {
        return checkpoint::latest(path)?.ok_or_else(|| {
            TrainerError::Config(format!(
                "{} holds neither state.json (a checkpoint) nor a `latest` pointer (a checkpoint \
                 root); pass a checkpoint directory, or --version under a root",
                path.display()
            ))
        });
    };
    let rd = std::fs::read_dir(path).map_err(TrainerError::io(path))?;
    let mut found: Vec<(u64, PathBuf)> = Vec::new();
    let mut versions = BTreeSet::new();
    for e in rd.flatten() {
        let dir = e.path();
        let hidden = e.file_name().to_string_lossy().starts_with('.');
        if hidden || !dir.join("state.json").is_file() {
            continue;
        }
        let st = checkpoint::read_state(&dir)?;
        versions.insert(st.policy_version);
        if st.policy_version == v {
            found.push((st.step, dir));
        }
    }
    found.sort();
    found.pop().map(|(_, d)| d).ok_or_else(|| {
        let list: Vec<String> = versions.iter().map(i64::to_string).collect();
        TrainerError::Config(format!(
            "{} holds no checkpoint of policy version {v} (versions found: {})",
            path.display(),
            if list.is_empty() {
                "none".into()
            } else {
                list.join(", ")
            }
        ))
    })
}

/// Export one checkpoint (see the module doc); returns what was written.
pub fn run(opts: &ExportOptions) -> Result<ExportReport> {
    let ck = resolve_checkpoint(&opts.checkpoint, opts.version)?;
    let state = checkpoint::read_state(&ck)?;
    let base_dir = opts
        .base
        .clone()
        .unwrap_or_else(|| PathBuf::from(&state.base));
    if !base_dir.join("config.json").is_file() {
        return Err(TrainerError::Config(format!(
            "base model {} has no config.json ({} names the base {:?}); pass --base with the \
             base model directory: its config and tokenizer files go into the export",
            base_dir.display(),
            ck.join("state.json").display(),
            state.base
        )));
    }
    let base_dir = std::fs::canonicalize(&base_dir).map_err(TrainerError::io(&base_dir))?;
    let base_name = opts
        .base_name
        .clone()
        .unwrap_or_else(|| base_dir.display().to_string());
    let format = match (state.mode.as_str(), opts.merge) {
        ("full", _) => ExportFormat::Full,
        ("lora", true) => ExportFormat::Merged,
        ("lora", false) => ExportFormat::Adapter,
        (other, _) => {
            return Err(TrainerError::Config(format!(
                "{}: mode {other:?}; allowed: full, lora",
                ck.join("state.json").display()
            )));
        }
    };
    let root = ck.parent().map(Path::to_path_buf).unwrap_or_default();
    check_out(
        &opts.out,
        &[ck.as_path(), root.as_path(), base_dir.as_path()],
    )?;
    let tokenizer = tokenizer_files(&base_dir)?;
    let extra = match &opts.card_extra {
        Some(p) => Some(std::fs::read_to_string(p).map_err(TrainerError::io(p))?),
        None => None,
    };
    let facts = Facts::read(&ck, &state, format)?;
    let out_abs = absolute(&opts.out);

    let mut report = None;
    checkpoint::write_dir_atomically(&opts.out, |tmp| {
        let (kind, weight_files) = match format {
            ExportFormat::Full => write_full(&ck, &base_dir, opts, tmp)?,
            ExportFormat::Merged => write_merged(&ck, &base_dir, opts, tmp)?,
            ExportFormat::Adapter => write_adapter(&ck, &base_dir, &base_name, opts, tmp)?,
        };
        let mut files = weight_files.clone();
        if format == ExportFormat::Adapter {
            files.push("adapter_config.json".into());
        } else {
            files.push("config.json".into());
            let gen_cfg = base_dir.join("generation_config.json");
            if gen_cfg.is_file() {
                copy(&gen_cfg, &tmp.join("generation_config.json"))?;
                files.push("generation_config.json".into());
            }
        }
        for f in &tokenizer {
            copy(&base_dir.join(f), &tmp.join(f))?;
            files.push(f.clone());
        }
        let mut sha256 = BTreeMap::new();
        for f in &weight_files {
            sha256.insert(f.clone(), sha256_file(&tmp.join(f))?);
        }
        files.push("export.json".into());
        files.push("README.md".into());
        let r = ExportReport {
            out: out_abs.clone(),
            format,
            policy_version: state.policy_version,
            step: state.step,
            mode: state.mode.clone(),
            base: base_name.clone(),
            base_dir: base_dir.clone(),
            source_checkpoint: std::fs::canonicalize(&ck).unwrap_or_else(|_| ck.clone()),
            dtype: dtype_name(kind).into(),
            sha256,
            files,
            trainer_version: env!("CARGO_PKG_VERSION").into(),
        };
        let path = tmp.join("export.json");
        let text = serde_json::to_string_pretty(&r).map_err(TrainerError::json(&path))?;
        std::fs::write(&path, text).map_err(TrainerError::io(&path))?;
        let path = tmp.join("README.md");
        let card = model_card(&r, &facts, extra.as_deref());
        std::fs::write(&path, card).map_err(TrainerError::io(&path))?;
        report = Some(r);
        Ok(())
    })?;
    report.ok_or_else(|| TrainerError::Config("the export wrote no report".into()))
}

/// Refuse an output directory that is (or contains) the checkpoint, its root or the base, or
/// that exists holding something other than an earlier export: it is replaced whole.
fn check_out(out: &Path, protected: &[&Path]) -> Result<()> {
    let out_abs = absolute(out);
    for p in protected {
        let p = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        if p.starts_with(&out_abs) {
            return Err(TrainerError::Config(format!(
                "--out {} would replace {}, which the export reads; choose another directory",
                out.display(),
                p.display()
            )));
        }
    }
    if out.exists() {
        if !out.is_dir() {
            return Err(TrainerError::Config(format!(
                "--out {} exists and is not a directory",
                out.display()
            )));
        }
        let empty = std::fs::read_dir(out)
            .map_err(TrainerError::io(out))?
            .next()
            .is_none();
        if !empty && !out.join("export.json").is_file() {
            return Err(TrainerError::Config(format!(
                "--out {} exists and is not an earlier export (no export.json); an export \
                 replaces its directory whole, so remove it or choose another",
                out.display()
            )));
        }
    }
    Ok(())
}

/// `p` made absolute, symlinks resolved as far as the path exists.
fn absolute(p: &Path) -> PathBuf {
    if let Ok(c) = std::fs::canonicalize(p) {
        return c;
    }
    match (p.parent(), p.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            absolute(parent).join(name)
        }
        _ => std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()),
    }
}

/// The tokenizer files of the base to copy; tokenizer.json, tokenizer_config.json and a chat
/// template (in tokenizer_config.json or chat_template.jinja / .json) are required.
fn tokenizer_files(base: &Path) -> Result<Vec<String>> {
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        if !base.join(f).is_file() {
            return Err(TrainerError::Tokenizer(format!(
                "base model {} has no {f}; the export carries the base's tokenizer",
                base.display()
            )));
        }
    }
    let cfg_path = base.join("tokenizer_config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(TrainerError::io(&cfg_path))?;
    let cfg: serde_json::Value =
        serde_json::from_str(&text).map_err(TrainerError::json(&cfg_path))?;
    let in_config = cfg
        .get("chat_template")
        .is_some_and(|t| t.is_string() || t.is_array());
    let separate = ["chat_template.jinja", "chat_template.json"]
        .iter()
        .any(|f| base.join(f).is_file());
    if !in_config && !separate {
        return Err(TrainerError::Tokenizer(format!(
            "base model {}: no chat template (neither `chat_template` in tokenizer_config.json \
             nor chat_template.jinja); the export carries the base's template",
            base.display()
        )));
    }
    Ok(TOKENIZER_FILES
        .iter()
        .filter(|f| base.join(f).is_file())
        .map(|f| f.to_string())
        .collect())
}

fn copy(src: &Path, dst: &Path) -> Result<()> {
    std::fs::copy(src, dst).map_err(TrainerError::io(src))?;
    Ok(())
}

/// The Hugging Face name of a dtype (config.json `torch_dtype`).
pub fn dtype_name(kind: Kind) -> &'static str {
    match kind {
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        Kind::Double => "float64",
        _ => "float32",
    }
}

/// `--dtype` for weights stored as `stored`.
fn target_kind(dtype: ExportDtype, stored: Kind) -> Kind {
    match dtype {
        ExportDtype::Keep => stored,
        ExportDtype::Bf16 => Kind::BFloat16,
        ExportDtype::F32 => Kind::Float,
    }
}

/// The base's config.json with the exported dtype, under both names: `torch_dtype` (vLLM,
/// transformers 4) and `dtype` (transformers 5, which prefers it).
fn write_config(base: &Path, kind: Kind, tmp: &Path) -> Result<()> {
    let src = base.join("config.json");
    let text = std::fs::read_to_string(&src).map_err(TrainerError::io(&src))?;
    let mut cfg: serde_json::Value =
        serde_json::from_str(&text).map_err(TrainerError::json(&src))?;
    let obj = cfg
        .as_object_mut()
        .ok_or_else(|| TrainerError::Config(format!("{}: not a JSON object", src.display())))?;
    obj.insert("torch_dtype".into(), dtype_name(kind).into());
    obj.insert("dtype".into(), dtype_name(kind).into());
    let path = tmp.join("config.json");
    let text = serde_json::to_string_pretty(&cfg).map_err(TrainerError::json(&path))?;
    std::fs::write(&path, text).map_err(TrainerError::io(&path))
}

/// Every tensor of a model directory's weight files by name: its file, kind and shape.
fn layout(dir: &Path) -> Result<BTreeMap<String, (PathBuf, TensorInfo)>> {
    let mut out = BTreeMap::new();
    for (path, names) in weights::model_files(dir)? {
        for info in weights::read_header(&path)? {
            if names.as_ref().is_none_or(|n| n.contains(&info.name)) {
                out.insert(info.name.clone(), (path.clone(), info));
            }
        }
        if let Some(names) = &names
            && let Some(missing) = names.iter().find(|n| !out.contains_key(*n))
        {
            return Err(TrainerError::MissingTensor(format!(
                "{missing} (the index of {} names {})",
                dir.display(),
                path.display()
            )));
        }
    }
    Ok(out)
}

/// The stored kind of a model directory's weights (its embedding's).
fn stored_kind(layout: &BTreeMap<String, (PathBuf, TensorInfo)>, dir: &Path) -> Result<Kind> {
    layout
        .get("model.embed_tokens.weight")
        .map(|(_, i)| i.kind)
        .ok_or_else(|| {
            TrainerError::MissingTensor(format!("model.embed_tokens.weight in {}", dir.display()))
        })
}

/// A full fine-tune: the checkpoint's weights (checked whole against its config, which must be
/// the base's architecture), streamed shard by shard in the requested dtype.
fn write_full(
    ck: &Path,
    base: &Path,
    opts: &ExportOptions,
    tmp: &Path,
) -> Result<(Kind, Vec<String>)> {
    let ck_cfg = Qwen3Config::from_file(&ck.join("config.json"))?;
    let base_cfg = Qwen3Config::from_file(&base.join("config.json"))?;
    let diff = ck_cfg.architecture_diff(&base_cfg);
    if !diff.is_empty() {
        return Err(TrainerError::Mismatch(format!(
            "checkpoint {} is not a fine-tune of {}: {}",
            ck.display(),
            base.display(),
            diff.join("; ")
        )));
    }
    let src = layout(ck)?;
    let entries = Qwen3::shapes(&ck_cfg);
    for (name, shape) in &entries {
        let (_, info) = src
            .get(name)
            .ok_or_else(|| TrainerError::MissingTensor(format!("{name} in {}", ck.display())))?;
        if &info.shape != shape {
            return Err(TrainerError::Shape {
                name: name.clone(),
                got: info.shape.clone(),
                want: shape.clone(),
            });
        }
    }
    let known: BTreeSet<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
    let extra: Vec<&str> = src
        .keys()
        .map(String::as_str)
        .filter(|n| !known.contains(n))
        .take(8)
        .collect();
    if !extra.is_empty() {
        return Err(TrainerError::UnexpectedTensors(format!(
            "{} in {}",
            extra.join(", "),
            ck.display()
        )));
    }
    let kind = target_kind(opts.dtype, stored_kind(&src, ck)?);
    let files = weights::write_sharded(tmp, &entries, kind, opts.max_shard_bytes, |names| {
        let mut by_file: BTreeMap<&Path, BTreeSet<String>> = BTreeMap::new();
        for n in names {
            if let Some((p, _)) = src.get(n) {
                by_file.entry(p.as_path()).or_default().insert(n.clone());
            }
        }
        let mut out = BTreeMap::new();
        for (p, wanted) in by_file {
            out.extend(weights::read_file(
                p,
                Device::Cpu,
                Some(kind),
                Some(&wanted),
            )?);
        }
        Ok(out)
    })?;
    write_config(base, kind, tmp)?;
    Ok((kind, files))
}

/// A LoRA fine-tune folded into the base (loaded in f32, adapters checked whole, merged), in
/// the base's dtype or the requested one.
fn write_merged(
    ck: &Path,
    base: &Path,
    opts: &ExportOptions,
    tmp: &Path,
) -> Result<(Kind, Vec<String>)> {
    let stored = stored_kind(&layout(base)?, base)?;
    let kind = target_kind(opts.dtype, stored);
    let mut model = Qwen3::load(base, Device::Cpu, Kind::Float)?;
    lora::load_adapter(&mut model, ck)?;
    tch::no_grad(|| model.merge_lora());
    let mut tensors: BTreeMap<String, Tensor> = model.base_tensors().into_iter().collect();
    let entries = Qwen3::shapes(&model.cfg);
    let files = weights::write_sharded(tmp, &entries, kind, opts.max_shard_bytes, |names| {
        Ok(names
            .iter()
            .filter_map(|n| tensors.remove(n).map(|t| (n.clone(), t.detach())))
            .collect())
    })?;
    write_config(base, kind, tmp)?;
    Ok((kind, files))
}

/// A LoRA fine-tune as a PEFT adapter: checked whole against the base's projections, its
/// config pointing at `base_name`.
fn write_adapter(
    ck: &Path,
    base: &Path,
    base_name: &str,
    opts: &ExportOptions,
    tmp: &Path,
) -> Result<(Kind, Vec<String>)> {
    let base_cfg = Qwen3Config::from_file(&base.join("config.json"))?;
    let mut projections = Vec::new();
    for (name, shape) in Qwen3::shapes(&base_cfg) {
        let Some(module) = name.strip_suffix(".weight") else {
            continue;
        };
        let short = module.rsplit('.').next().unwrap_or_default();
        if let (Ok(target), [o, i]) = (LoraTarget::parse(short), shape.as_slice()) {
            projections.push((module.to_string(), target, [*o, *i]));
        }
    }
    // Names, shapes for the config's rank, finite values: the adapter fits this base.
    lora::stage_adapter(&projections, Device::Cpu, ck)?;
    let src = ck.join("adapter_model.safetensors");
    let stored = weights::read_header(&src)?
        .first()
        .map_or(Kind::Float, |i| i.kind);
    let kind = target_kind(opts.dtype, stored);
    let dst = tmp.join("adapter_model.safetensors");
    if kind == stored {
        copy(&src, &dst)?;
    } else {
        let t = weights::read_file(&src, Device::Cpu, Some(kind), None)?;
        weights::write_file(&dst, &t.into_iter().collect::<Vec<_>>())?;
    }
    let cfg_path = ck.join("adapter_config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(TrainerError::io(&cfg_path))?;
    let mut cfg: serde_json::Value =
        serde_json::from_str(&text).map_err(TrainerError::json(&cfg_path))?;
    let obj = cfg.as_object_mut().ok_or_else(|| {
        TrainerError::Config(format!("{}: not a JSON object", cfg_path.display()))
    })?;
    obj.insert("base_model_name_or_path".into(), base_name.into());
    obj.insert("inference_mode".into(), true.into());
    let path = tmp.join("adapter_config.json");
    let text = serde_json::to_string_pretty(&cfg).map_err(TrainerError::json(&path))?;
    std::fs::write(&path, text).map_err(TrainerError::io(&path))?;
    Ok((kind, vec!["adapter_model.safetensors".into()]))
}

/// SHA-256 of a file, hex.
fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(TrainerError::io(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(TrainerError::io(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Training facts for the card beyond state.json: the optimizer's settings and layout, the
/// adapter's shape.
#[derive(Debug, Default)]
struct Facts {
    seed: i64,
    rows: Vec<(String, String)>,
}

impl Facts {
    fn read(ck: &Path, state: &CheckpointState, format: ExportFormat) -> Result<Self> {
        let mut rows = Vec::new();
        let read_json = |name: &str| -> Option<serde_json::Value> {
            let text = std::fs::read_to_string(ck.join(name)).ok()?;
            serde_json::from_str(&text).ok()
        };
        if state.mode == "lora" {
            let l = lora::read_adapter_config(ck)?;
            let targets: Vec<&str> = l.targets.iter().map(|t| t.module()).collect();
            rows.push((
                "fine-tune".into(),
                format!(
                    "LoRA r = {}, alpha = {}, dropout = {}, targets {}{}",
                    l.r,
                    l.alpha,
                    l.dropout,
                    targets.join(", "),
                    if format == ExportFormat::Merged {
                        " (merged into the base weights)"
                    } else {
                        ""
                    }
                ),
            ));
        } else {
            rows.push(("fine-tune".into(), "full (all weights)".into()));
        }
        if let Some(o) = read_json("optimizer.json")
            && let Some(c) = o.get("config")
        {
            for (key, label) in [
                ("lr", "learning rate"),
                ("betas", "AdamW betas"),
                ("eps", "AdamW eps"),
                ("weight_decay", "weight decay"),
                ("max_grad_norm", "gradient clip (norm)"),
                ("schedule", "schedule"),
            ] {
                if let Some(v) = c.get(key) {
                    rows.push((label.into(), plain(v)));
                }
            }
        }
        if let Some(z) = read_json("optimizer.zero.json") {
            rows.push((
                "optimizer".into(),
                format!(
                    "ZeRO stage {} over {} ranks (sharded moments; not needed for the export)",
                    plain(&z["stage"]),
                    plain(&z["world"])
                ),
            ));
        }
        Ok(Self {
            seed: state.seed,
            rows,
        })
    }
}

/// A JSON value as card text (strings without quotes).
fn plain(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The model card: YAML front matter (library, base, tags), what this is, the training facts,
/// how to load it, then the caller's markdown.
fn model_card(r: &ExportReport, facts: &Facts, extra: Option<&str>) -> String {
    let quoted = |s: &str| serde_json::Value::from(s).to_string();
    let adapter = r.format == ExportFormat::Adapter;
    let title = r
        .out
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "policy".into());
    let mut s = String::new();
    s.push_str("---\n");
    s.push_str(if adapter {
        "library_name: peft\n"
    } else {
        "library_name: transformers\n"
    });
    s.push_str(&format!("base_model: {}\n", quoted(&r.base)));
    s.push_str("pipeline_tag: text-generation\ntags:\n- rubricem\n- qwen3\n");
    if r.mode == "lora" {
        s.push_str("- lora\n");
    }
    s.push_str("---\n\n");
    s.push_str(&format!("# {title}\n\n"));
    let what = match r.format {
        ExportFormat::Adapter => format!("a PEFT LoRA adapter for `{}`", r.base),
        ExportFormat::Merged => format!(
            "full weights ({}): a LoRA fine-tune merged into `{}`",
            r.dtype, r.base
        ),
        ExportFormat::Full => format!("full weights ({}), a fine-tune of `{}`", r.dtype, r.base),
    };
    s.push_str(&format!(
        "A RubricEM research-agent policy (policy version {}), trained with rubric-guided RL and \
         exported by `trainer export`: {what}. The tokenizer and chat template are the base's.\n\n",
        r.policy_version
    ));
    s.push_str("## Training\n\n| fact | value |\n| --- | --- |\n");
    let mut rows: Vec<(String, String)> = vec![
        ("policy version".into(), r.policy_version.to_string()),
        ("optimizer steps".into(), r.step.to_string()),
        ("base model".into(), format!("`{}`", r.base)),
        ("seed".into(), facts.seed.to_string()),
    ];
    rows.extend(facts.rows.iter().cloned());
    rows.push(("weights dtype".into(), r.dtype.clone()));
    rows.push((
        "source checkpoint".into(),
        format!("`{}`", r.source_checkpoint.display()),
    ));
    for (k, v) in rows {
        s.push_str(&format!("| {k} | {} |\n", v.replace('|', "\\|")));
    }
    s.push_str("\n`export.json` lists the SHA-256 of every weight file.\n\n## Use\n\n```bash\n");
    if adapter {
        s.push_str(&format!(
            "vllm serve {} --enable-lora --lora-modules policy={}\n```\n\n```python\n\
             from peft import PeftModel\nfrom transformers import AutoModelForCausalLM, \
             AutoTokenizer\n\nbase = AutoModelForCausalLM.from_pretrained({})\n\
             model = PeftModel.from_pretrained(base, {})\ntokenizer = \
             AutoTokenizer.from_pretrained({})\n```\n",
            r.base,
            r.out.display(),
            quoted(&r.base),
            quoted(&r.out.display().to_string()),
            quoted(&r.out.display().to_string()),
        ));
    } else {
        let out = quoted(&r.out.display().to_string());
        s.push_str(&format!(
            "vllm serve {}\n```\n\n```python\nfrom transformers import AutoModelForCausalLM, \
             AutoTokenizer\n\nmodel = AutoModelForCausalLM.from_pretrained({out})\n\
             tokenizer = AutoTokenizer.from_pretrained({out})\n```\n",
            r.out.display()
        ));
    }
    if let Some(extra) = extra {
        s.push('\n');
        s.push_str(extra.trim_end());
        s.push('\n');
    }
    s
}
