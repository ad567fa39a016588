//! Reading and writing named tensors in safetensors files: single files and sharded checkpoints
//! (`model.safetensors.index.json`), memory-mapped, by Hugging Face tensor names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

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

/// All tensors of a model directory: `model.safetensors`, or the shards named by
/// `model.safetensors.index.json`.
pub fn read_model_dir(dir: &Path, device: Device, kind: Kind) -> Result<BTreeMap<String, Tensor>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(TrainerError::io(&index))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(TrainerError::json(&index))?;
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
        let mut out = BTreeMap::new();
        for (file, names) in &by_file {
            let got = read_file(&dir.join(file), device, Some(kind), Some(names))?;
            if let Some(missing) = names.iter().find(|n| !got.contains_key(*n)) {
                return Err(TrainerError::MissingTensor(format!(
                    "{missing} (index says {file})"
                )));
            }
            out.extend(got);
        }
        return Ok(out);
    }
    read_file(&dir.join("model.safetensors"), device, Some(kind), None)
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
