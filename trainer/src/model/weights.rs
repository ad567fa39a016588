//! Reading and writing named tensors in safetensors files: single files and sharded checkpoints
//! (`model.safetensors.index.json`), memory-mapped, by Hugging Face tensor names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use tch::{Device, Kind, Tensor};

use crate::error::{Result, TrainerError};

fn kind_of(d: Dtype) -> Option<Kind> {
    Some(match d {
        Dtype::F32 => Kind::Float,
        Dtype::F16 => Kind::Half,
        Dtype::BF16 => Kind::BFloat16,
        Dtype::F64 => Kind::Double,
        Dtype::I64 => Kind::Int64,
        Dtype::I32 => Kind::Int,
        Dtype::I16 => Kind::Int16,
        Dtype::I8 => Kind::Int8,
        Dtype::U8 => Kind::Uint8,
        Dtype::BOOL => Kind::Bool,
        _ => return None,
    })
}

/// Memory-map one safetensors file and copy every tensor (optionally only `wanted`) onto
/// `device` as `kind` (floating tensors only; integer tensors keep their kind).
pub fn read_file(
    path: &Path,
    device: Device,
    kind: Option<Kind>,
    wanted: Option<&BTreeSet<String>>,
) -> Result<BTreeMap<String, Tensor>> {
    let file = std::fs::File::open(path).map_err(TrainerError::io(path))?;
    // SAFETY: the map is read-only and lives only inside this function; the tensors below are
    // copies. A concurrent truncation of the file by another process could fault, which is
    // the documented hazard of memory-mapping any checkpoint and the reason loaders do it.
    #[allow(unsafe_code)]
    let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(TrainerError::io(path))?;
    let st = SafeTensors::deserialize(&mmap).map_err(|e| TrainerError::Safetensors {
        path: path.into(),
        message: e.to_string(),
    })?;
    let mut out = BTreeMap::new();
    for (name, view) in st.tensors() {
        if wanted.is_some_and(|w| !w.contains(&name)) {
            continue;
        }
        let k = kind_of(view.dtype()).ok_or_else(|| TrainerError::Safetensors {
            path: path.into(),
            message: format!("tensor `{name}` has unsupported dtype {:?}", view.dtype()),
        })?;
        let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
        let t = Tensor::f_from_data_size(view.data(), &shape, k)?;
        let float = matches!(k, Kind::Float | Kind::Half | Kind::BFloat16 | Kind::Double);
        let t = match kind {
            Some(want) if float => t.to_device(device).to_kind(want),
            _ => t.to_device(device),
        };
        out.insert(name, t);
    }
    Ok(out)
}

/// The safetensors files of a model directory and the tensors each holds by the index:
/// `model.safetensors.index.json`'s `weight_map` grouped by file, or `model.safetensors` alone
/// (`None`: every tensor in it).
pub fn model_files(dir: &Path) -> Result<Vec<(PathBuf, Option<BTreeSet<String>>)>> {
    let index = dir.join("model.safetensors.index.json");
    if !index.exists() {
        return Ok(vec![(dir.join("model.safetensors"), None)]);
    }
    let text = std::fs::read_to_string(&index).map_err(TrainerError::io(&index))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(TrainerError::json(&index))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| TrainerError::Safetensors {
            path: index.clone(),
            message: "no `weight_map` object".into(),
        })?;
    let mut by_file: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, file) in map {
        let file = file.as_str().ok_or_else(|| TrainerError::Safetensors {
            path: index.clone(),
            message: format!("weight_map[{name}] is not a file name"),
        })?;
        by_file
            .entry(file.to_string())
            .or_default()
            .insert(name.clone());
    }
    Ok(by_file
        .into_iter()
        .map(|(file, names)| (dir.join(file), Some(names)))
        .collect())
}

/// All tensors of a model directory: `model.safetensors`, or the shards named by
/// `model.safetensors.index.json`.
pub fn read_model_dir(dir: &Path, device: Device, kind: Kind) -> Result<BTreeMap<String, Tensor>> {
    let mut out = BTreeMap::new();
    for (path, names) in model_files(dir)? {
        let got = read_file(&path, device, Some(kind), names.as_ref())?;
        if let Some(names) = &names
            && let Some(missing) = names.iter().find(|n| !got.contains_key(*n))
        {
            let file = path.file_name().unwrap_or_default().to_string_lossy();
            return Err(TrainerError::MissingTensor(format!(
                "{missing} (index says {file})"
            )));
        }
        out.extend(got);
    }
    Ok(out)
}

/// One tensor's entry in a safetensors header.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub kind: Kind,
    pub shape: Vec<i64>,
}

/// The tensors a safetensors file holds (names, kinds, shapes), from its header only.
pub fn read_header(path: &Path) -> Result<Vec<TensorInfo>> {
    let file = std::fs::File::open(path).map_err(TrainerError::io(path))?;
    // SAFETY: as in `read_file`; only the header is parsed and nothing outlives the map.
    #[allow(unsafe_code)]
    let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(TrainerError::io(path))?;
    let st = SafeTensors::deserialize(&mmap).map_err(|e| TrainerError::Safetensors {
        path: path.into(),
        message: e.to_string(),
    })?;
    let mut out = Vec::new();
    for (name, view) in st.tensors() {
        let kind = kind_of(view.dtype()).ok_or_else(|| TrainerError::Safetensors {
            path: path.into(),
            message: format!("tensor `{name}` has unsupported dtype {:?}", view.dtype()),
        })?;
        let shape = view.shape().iter().map(|&d| d as i64).collect();
        out.push(TensorInfo { name, kind, shape });
    }
    Ok(out)
}

/// Write a model's tensors in Hugging Face layout into `dir` as `kind`: `model.safetensors` when
/// they fit in `max_shard_bytes`, else `model-0000i-of-0000N.safetensors` shards (tensors in
/// the order given, a new shard when the next would overflow the current one) with
/// `model.safetensors.index.json` (`metadata.total_size`, `weight_map`), as transformers'
/// `save_pretrained` writes them. `fetch` supplies one shard's tensors at a time (any kind and
/// device), so at most one shard is in memory. Returns the weight files written, in order.
pub fn write_sharded(
    dir: &Path,
    entries: &[(String, Vec<i64>)],
    kind: Kind,
    max_shard_bytes: u64,
    mut fetch: impl FnMut(&BTreeSet<String>) -> Result<BTreeMap<String, Tensor>>,
) -> Result<Vec<String>> {
    let elem = kind.elt_size_in_bytes() as u64;
    let bytes = |shape: &[i64]| shape.iter().map(|&d| d.max(0) as u64).product::<u64>() * elem;
    let mut shards: Vec<Vec<&(String, Vec<i64>)>> = vec![Vec::new()];
    let mut used = 0u64;
    for e in entries {
        let b = bytes(&e.1);
        if used > 0 && used + b > max_shard_bytes {
            shards.push(Vec::new());
            used = 0;
        }
        used += b;
        if let Some(last) = shards.last_mut() {
            last.push(e);
        }
    }
    let n = shards.len();
    let mut files = Vec::with_capacity(n);
    let mut weight_map = serde_json::Map::new();
    for (i, shard) in shards.iter().enumerate() {
        let file = if n == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{n:05}.safetensors", i + 1)
        };
        let names: BTreeSet<String> = shard.iter().map(|e| e.0.clone()).collect();
        let mut got = fetch(&names)?;
        let mut tensors = Vec::with_capacity(shard.len());
        for (name, shape) in shard.iter().map(|e| (&e.0, &e.1)) {
            let t = got
                .remove(name)
                .ok_or_else(|| TrainerError::MissingTensor(name.clone()))?;
            if &t.size() != shape {
                return Err(TrainerError::Shape {
                    name: name.clone(),
                    got: t.size(),
                    want: shape.clone(),
                });
            }
            tensors.push((name.clone(), t.to_device(Device::Cpu).to_kind(kind)));
            weight_map.insert(name.clone(), serde_json::json!(file));
        }
        write_file(&dir.join(&file), &tensors)?;
        files.push(file);
    }
    if n > 1 {
        let path = dir.join("model.safetensors.index.json");
        let total: u64 = entries.iter().map(|e| bytes(&e.1)).sum();
        let index = serde_json::json!({
            "metadata": {"total_size": total},
            "weight_map": weight_map,
        });
        let text = serde_json::to_string_pretty(&index).map_err(TrainerError::json(&path))?;
        std::fs::write(&path, text).map_err(TrainerError::io(&path))?;
    }
    Ok(files)
}

/// Write named tensors to one safetensors file, atomically (temporary file, then rename).
pub fn write_file(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    let tmp = path.with_extension("safetensors.tmp");
    let contiguous: Vec<(String, Tensor)> = tensors
        .iter()
        .map(|(n, t)| (n.clone(), t.detach().to_device(Device::Cpu).contiguous()))
        .collect();
    Tensor::write_safetensors(&contiguous, &tmp)?;
    std::fs::rename(&tmp, path).map_err(TrainerError::io(path))?;
    Ok(())
}
