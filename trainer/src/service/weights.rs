//! vLLM's native disk weight-transfer API on the embedded policy server, so a second
//! `trainer serve` can stand where a vLLM server would and receive full weights from a trainer
//! that publishes (`--publish-url`): `POST /start_weight_update`, `POST /update_weights
//! {"update_info": {"path": DIR}}` (a model directory: config.json + safetensors of the same
//! architecture), `POST /finish_weight_update {"weight_version": "vN"}`; plus `POST
//! /v1/unload_lora_adapter`. The new weights are read into a staging model and checked whole
//! (every tensor's name, shape and dtype; the config's sizes, position limit, rotary base and
//! norms equal to the served model's) before they replace the served ones between two decode
//! rounds; sequences in flight continue on them (vLLM's `keep` mode). A refused update changes
//! nothing.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::routing::post;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, ApiResult, AppState, optional_json};
use crate::error::TrainerError;
use crate::model::Qwen3;

#[derive(Debug, Deserialize)]
struct UpdateInfo {
    path: String,
}

#[derive(Debug, Deserialize)]
struct UpdateBody {
    update_info: UpdateInfo,
}

#[derive(Debug, Default, Deserialize)]
struct FinishBody {
    #[serde(default)]
    weight_version: Option<String>,
}

#[derive(Debug, Deserialize)]
struct UnloadBody {
    lora_name: String,
}

async fn start(State(s): State<Arc<AppState>>) -> Json<Value> {
    s.updating.store(true, Ordering::SeqCst);
    Json(json!({"status": "started"}))
}

/// The policy version a label names: `v7`, `step-7`, `policy-v7` or `7` give 7.
fn version_of(label: &str) -> Option<i64> {
    let digits: String = label
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    digits.parse().ok()
}

async fn update(
    State(s): State<Arc<AppState>>,
    Json(b): Json<UpdateBody>,
) -> ApiResult<Json<Value>> {
    s.ensure_healthy()?;
    if !s.updating.load(Ordering::SeqCst) {
        return Err(ApiError::bad_request(
            "no weight update in progress: call POST /start_weight_update first",
        ));
    }
    let dir = PathBuf::from(&b.update_info.path);
    if !dir.is_absolute() || !dir.join("config.json").is_file() {
        return Err(ApiError::bad_request(format!(
            "update_info.path = {:?}: expected an absolute model directory holding config.json and safetensors",
            b.update_info.path
        )));
    }
    // A train step on this same process would race the swap.
    let Ok(_guard) = s.training.try_lock() else {
        return Err(ApiError::conflict("a train step is running"));
    };
    let st = s.clone();
    let res = tokio::task::spawn_blocking(move || -> crate::error::Result<()> {
        let (device, kind, served) = {
            let p = st
                .policy
                .lock()
                .map_err(|_| TrainerError::Config("policy lock poisoned".into()))?;
            if p.lora.is_some() {
                return Err(TrainerError::Config(
                    "this server's policy carries a LoRA adapter; full weights replace a full-weights policy only".into(),
                ));
            }
            p.single_rank_only("a weight update")
                .map_err(TrainerError::Config)?;
            let m = &p.trainer.model;
            (m.device, m.kind, m.cfg.clone())
        };
        // Read the new weights into a staging model without holding the policy: generation
        // goes on meanwhile. Loading checks every tensor's name, shape and dtype.
        let fresh = Qwen3::load(&dir, device, kind)?;
        let diff = fresh.cfg.architecture_diff(&served);
        if !diff.is_empty() {
            return Err(TrainerError::Config(format!(
                "{} does not match the served model: {}",
                dir.display(),
                diff.join("; ")
            )));
        }
        fresh.set_trainable(true);
        let mut p = st
            .policy
            .lock()
            .map_err(|_| TrainerError::Config("policy lock poisoned".into()))?;
        if !p.trainer.model.cfg.architecture_diff(&served).is_empty() || p.lora.is_some() {
            return Err(TrainerError::Config(
                "the served policy changed while the weights were read; send the request again"
                    .into(),
            ));
        }
        p.trainer.model = fresh;
        p.weights_changed();
        // The optimizer held the previous tensors: start it afresh on the new ones.
        let params = p.trainer.model.trainable();
        p.trainer.opt = crate::optim::AdamW::new(params, p.trainer.cfg.optim.clone());
        Ok(())
    })
    .await;
    res?.map_err(|e| ApiError::bad_request(format!("cannot load {}: {e}", b.update_info.path)))?;
    Ok(Json(
        json!({"status": "updated", "path": b.update_info.path}),
    ))
}

async fn finish(State(s): State<Arc<AppState>>, body: axum::body::Bytes) -> ApiResult<Json<Value>> {
    let b: FinishBody = optional_json(&body)?;
    s.updating.store(false, Ordering::SeqCst);
    let version = b.weight_version.as_deref().and_then(version_of);
    if let Some(v) = version
        && let Ok(mut p) = s.policy.lock()
    {
        p.version = v;
    }
    tracing::info!(label = ?b.weight_version, ?version, "weights updated");
    Ok(Json(
        json!({"status": "finished", "weight_version": b.weight_version}),
    ))
}

async fn unload_lora(
    State(s): State<Arc<AppState>>,
    Json(b): Json<UnloadBody>,
) -> ApiResult<Json<Value>> {
    if s.remove_alias(&b.lora_name) {
        Ok(Json(json!({"unloaded": b.lora_name})))
    } else {
        Err(ApiError::not_found(format!(
            "no adapter named {:?} is loaded",
            b.lora_name
        )))
    }
}

pub(super) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/start_weight_update", post(start))
        .route("/update_weights", post(update))
        .route("/finish_weight_update", post(finish))
        .route("/v1/unload_lora_adapter", post(unload_lora))
}

#[cfg(test)]
mod tests {
    use super::version_of;

    #[test]
    fn version_labels() {
        assert_eq!(version_of("v7"), Some(7));
        assert_eq!(version_of("step-12"), Some(12));
        assert_eq!(version_of("policy-v3"), Some(3));
        assert_eq!(version_of("0"), Some(0));
        assert_eq!(version_of("default"), None);
    }
}
