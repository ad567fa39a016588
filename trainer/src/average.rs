//! `trainer average`: the uniform mean of several policy versions' weights (full fine-tune
//! checkpoint directories or Hugging Face model directories), the averaged policy of
//! latest-weight averaging (LAWA, Kaddour 2022) and stochastic weight averaging (Izmailov et al.
//! 2018). Every tensor is summed in f32 and divided by the count; the mean is written as one f32
//! safetensors file, which `trainer serve --dtype` rounds to the serving dtype like any warm start.

use std::path::{Path, PathBuf};

use serde::Serialize;
use tch::{Device, Kind, Tensor};

use crate::error::{Result, TrainerError};
use crate::model::weights;

/// What `trainer average` wrote (printed as JSON).
#[derive(Debug, Clone, Serialize)]
pub struct AverageReport {
    pub out: PathBuf,
    pub inputs: Vec<PathBuf>,
    pub tensors: usize,
    pub elements: i64,
}

/// Average the weights of `dirs` (at least two) into the safetensors file `out`. Every
/// directory must hold the same tensor names and shapes; a checkpoint whose `state.json` names
/// another fine-tune mode than `full` is refused, since the mean of LoRA factors is not the
/// mean of their updates (export it with `--merge` first).
pub fn run(dirs: &[PathBuf], out: &Path) -> Result<AverageReport> {
    if dirs.len() < 2 {
        return Err(TrainerError::Config(format!(
            "average: {} input director{} given; at least 2 are needed",
            dirs.len(),
            if dirs.len() == 1 { "y" } else { "ies" }
        )));
    }
    for d in dirs {
        refuse_adapter(d)?;
    }
    let mut sum = weights::read_model_dir(&dirs[0], Device::Cpu, Kind::Float)?;
    for (name, t) in &sum {
        if t.kind() != Kind::Float {
            return Err(TrainerError::Dtype {
                name: name.clone(),
                got: format!("{:?}", t.kind()),
                want: "a floating dtype (only weights are averaged)".into(),
            });
        }
    }
    for d in &dirs[1..] {
        let next = weights::read_model_dir(d, Device::Cpu, Kind::Float)?;
        if let Some(extra) = next.keys().find(|k| !sum.contains_key(*k)) {
            return Err(TrainerError::UnexpectedTensors(format!(
                "`{extra}` is in {} but not in {}",
                d.display(),
                dirs[0].display()
            )));
        }
        for (name, acc) in sum.iter_mut() {
            let t = next.get(name).ok_or_else(|| {
                TrainerError::MissingTensor(format!(
                    "{name} (in {}, not in {})",
                    dirs[0].display(),
                    d.display()
                ))
            })?;
            if t.size() != acc.size() {
                return Err(TrainerError::Shape {
                    name: format!("{name} in {}", d.display()),
                    got: t.size(),
                    want: acc.size(),
                });
            }
            let _ = acc.f_add_(t)?;
        }
    }
    let n = dirs.len() as f64;
    let mut elements = 0;
    let mut mean: Vec<(String, Tensor)> = Vec::with_capacity(sum.len());
    for (name, acc) in sum {
        let m = acc.f_div_scalar(n)?;
        if m.f_isfinite()?.f_all()?.f_int64_value(&[])? == 0 {
            return Err(TrainerError::NotFinite(name));
        }
        elements += m.numel() as i64;
        mean.push((name, m));
    }
    weights::write_file(out, &mean)?;
    Ok(AverageReport {
        out: out.to_path_buf(),
        inputs: dirs.to_vec(),
        tensors: mean.len(),
        elements,
    })
}

/// A checkpoint directory's `state.json` `mode` other than `full` (a model directory has none).
fn refuse_adapter(dir: &Path) -> Result<()> {
    let path = dir.join("state.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(());
    };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(TrainerError::json(&path))?;
    match v.get("mode").and_then(|m| m.as_str()) {
        None | Some("full") => Ok(()),
        Some(mode) => Err(TrainerError::Mismatch(format!(
            "{} holds a `{mode}` checkpoint: the mean of LoRA factors is not the mean of their \
             updates; `trainer export --merge` each version first, then average the exports",
            dir.display()
        ))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn model(dir: &Path, tensors: &[(&str, Tensor)]) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let named: Vec<(String, Tensor)> = tensors
            .iter()
            .map(|(n, t)| (n.to_string(), t.shallow_clone()))
            .collect();
        weights::write_file(&dir.join("model.safetensors"), &named).unwrap();
        dir.to_path_buf()
    }

    #[test]
    fn the_mean_of_versions_is_written_in_f32() {
        let tmp = tempfile::tempdir().unwrap();
        let w = |s: f64| Tensor::from_slice(&[1.0f32, -2.0, 3.5, 0.25]).reshape([2, 2]) * s;
        let a = model(
            &tmp.path().join("a"),
            &[
                ("w", w(1.0).to_kind(Kind::BFloat16)),
                ("b", Tensor::from_slice(&[1.0f32])),
            ],
        );
        let b = model(
            &tmp.path().join("b"),
            &[
                ("w", w(2.0).to_kind(Kind::BFloat16)),
                ("b", Tensor::from_slice(&[2.0f32])),
            ],
        );
        let c = model(
            &tmp.path().join("c"),
            &[
                ("w", w(6.0).to_kind(Kind::BFloat16)),
                ("b", Tensor::from_slice(&[6.0f32])),
            ],
        );
        let out = tmp.path().join("mean.safetensors");
        let report = run(&[a, b, c], &out).unwrap();
        assert_eq!((report.tensors, report.elements), (2, 5));
        let got = weights::read_file(&out, Device::Cpu, None, None).unwrap();
        assert_eq!(got["w"].kind(), Kind::Float);
        // (1 + 2 + 6) / 3 = 3 times the first version, exact in f32.
        assert!(got["w"].allclose(&w(3.0), 0.0, 0.0, false), "{}", got["w"]);
        assert!(got["b"].allclose(&Tensor::from_slice(&[3.0f32]), 0.0, 0.0, false));
    }

    #[test]
    fn versions_that_differ_in_shape_names_or_mode_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let a = model(
            &tmp.path().join("a"),
            &[("w", Tensor::zeros([2, 2], (Kind::Float, Device::Cpu)))],
        );
        let wide = model(
            &tmp.path().join("wide"),
            &[("w", Tensor::zeros([2, 3], (Kind::Float, Device::Cpu)))],
        );
        let other = model(
            &tmp.path().join("other"),
            &[("v", Tensor::zeros([2, 2], (Kind::Float, Device::Cpu)))],
        );
        let out = tmp.path().join("mean.safetensors");
        let e = run(&[a.clone(), wide], &out).unwrap_err().to_string();
        assert!(
            e.contains("`w in") && e.contains("[2, 3]") && e.contains("[2, 2]"),
            "{e}"
        );
        let e = run(&[a.clone(), other], &out).unwrap_err().to_string();
        assert!(e.contains("`v`") && e.contains("other"), "{e}");
        let e = run(std::slice::from_ref(&a), &out).unwrap_err().to_string();
        assert!(e.contains("1 input directory given; at least 2"), "{e}");
        let lora = model(
            &tmp.path().join("lora"),
            &[("w", Tensor::zeros([2, 2], (Kind::Float, Device::Cpu)))],
        );
        std::fs::write(lora.join("state.json"), r#"{"mode": "lora"}"#).unwrap();
        let e = run(&[a, lora], &out).unwrap_err().to_string();
        assert!(
            e.contains("`lora` checkpoint") && e.contains("--merge"),
            "{e}"
        );
        assert!(!out.exists(), "a refused average wrote {}", out.display());
    }
}
