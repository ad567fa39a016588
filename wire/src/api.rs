//! The trainer's HTTP API as types (`trainer serve` answers with them, the orchestrator's
//! client reads them): train-step and dry-run replies with their step metrics, the publish
//! result, checkpoint and restore requests and replies, the state reply, and the error body
//! every refusal carries. The JSON is exactly what the handlers wrote by hand before: field
//! names and order, `null` for absent optional values except where noted.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::PolicyVersion;

/// What one optimizer step reports (one phase of a train step).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    pub loss: f64,
    /// Counted tokens of the rows trained on (not of the rows skipped as null, see
    /// `null_sequences`).
    pub tokens: i64,
    pub sequences: usize,
    pub micro_batches: usize,
    /// Optimizer updates (PPO minibatches) the step took; `grad_norm` is their mean, `lr` the
    /// last one's, the per-token figures are means over all their counted tokens.
    #[serde(default)]
    pub minibatches: usize,
    pub grad_norm: f64,
    pub lr: f64,
    pub clip_fraction: f64,
    pub kl: f64,
    pub entropy: f64,
    pub ratio_mean: f64,
    pub tis_mean: f64,
    pub tis_min: f64,
    pub tis_max: f64,
    /// Mean −log(1 − p) over the tokens the unlikelihood term applied to
    /// (`trainer.loop_unlikelihood`), and how many there were (0 when it is off).
    #[serde(default)]
    pub unlikelihood: f64,
    #[serde(default)]
    pub unlikelihood_tokens: i64,
    /// Counted tokens of off-policy sequences that took LUFFY's shaped objective
    /// (`trainer.off_policy_shaping`; 0 when it is off).
    #[serde(default)]
    pub shaped_tokens: i64,
    /// Sequences left out of forward and backward because their loss was zero at every token
    /// (the trainer's `skip_null_rows`; they still count in the aggregation's totals, while
    /// `tokens` and the per-token figures above are over the rows trained on). A rank of a
    /// data-parallel group whose rows are all null trains its shortest one, so these counts
    /// and figures can differ by that row between world sizes (the update does not).
    #[serde(default)]
    pub null_sequences: usize,
    /// Positions the step did not run again because rows of one micro-batch share them (a
    /// batch's common system prompt, run once for all its rows): per micro-batch, the shared
    /// prefix times its rows less one, summed. 0 when no rows shared a prefix worth running
    /// once.
    #[serde(default)]
    pub shared_prefix_tokens: i64,
    pub seconds: f64,
}

/// `POST /v1/train_step`: what a train step returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainReply {
    /// The new policy version (one per train step).
    pub policy_version: PolicyVersion,
    /// Phase B: the task sequences (all zero when the batch held only reflections).
    pub metrics: StepMetrics,
    /// Phase A: the reflection sequences' own optimizer step, when the batch carried any
    /// (omitted otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reflection: Option<StepMetrics>,
    /// The checkpoint written after this step, when one was due.
    #[serde(default)]
    pub checkpoint: Option<PathBuf>,
    /// What publishing the new version to the inference servers did (a trainer that publishes).
    #[serde(default)]
    pub published: Option<Published>,
    /// Seconds to decode the batch body.
    #[serde(default)]
    pub decode_seconds: f64,
    /// `wire::TrainSettings::hash` of the settings the step trained with.
    #[serde(default)]
    pub settings_hash: Option<String>,
}

/// `POST /v1/train_step?dry_run=true`: the batch decoded and validated, nothing trained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DryRunReply {
    /// Sequences of both phases.
    pub sequences: usize,
    pub reflection_sequences: usize,
    pub tokens: usize,
    pub decode_seconds: f64,
}

/// What one publish did: the version loaded on the inference servers (in `published` of the
/// train-step and restore replies).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Published {
    pub version: PolicyVersion,
    /// The versioned name, `NAME-vN`.
    pub name: String,
    /// Where the adapter or weights were written for the servers.
    pub dir: PathBuf,
    /// Servers that loaded it.
    pub loaded: Vec<String>,
    /// `(server, error)` for servers that did not; they keep serving the previous version.
    pub failed: Vec<(String, String)>,
    /// Names unloaded because they left the window.
    pub unloaded: Vec<String>,
    /// LoRA adapters: the servers serve this version under `name`. Full weights replace the
    /// served model in place, so clients keep asking for the servers' own model name.
    pub lora: bool,
    pub seconds: f64,
}

impl Published {
    /// The model name clients should now ask the servers for: `name`, only when every server
    /// loaded it and it is a LoRA adapter (otherwise the previous name, or the servers' own
    /// model name for full weights, stays right).
    pub fn served_name(&self) -> Option<&str> {
        (self.lora && self.failed.is_empty() && !self.loaded.is_empty())
            .then_some(self.name.as_str())
    }
}

/// `POST /v1/checkpoint` body (optional; an empty body is the default).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRequest {
    /// A sub-directory of `--checkpoint-dir` (one plain name, e.g. a run id).
    #[serde(default)]
    pub subdir: Option<String>,
}

/// `POST /v1/checkpoint` reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointReply {
    /// The checkpoint directory as the trainer sees it.
    pub checkpoint: PathBuf,
    /// The same, relative to `--checkpoint-dir` (what `POST /v1/restore` takes).
    #[serde(default)]
    pub relative: Option<String>,
    pub policy_version: PolicyVersion,
}

/// `POST /v1/restore` body (optional; an empty body is the default).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RestoreRequest {
    /// A checkpoint directory relative to `--checkpoint-dir` (as `POST /v1/checkpoint`
    /// returned it); absent: the model directory as loaded at start (version 0).
    #[serde(default)]
    pub checkpoint: Option<String>,
    /// The client session the restored weights now belong to.
    #[serde(default)]
    pub session: Option<String>,
}

/// `POST /v1/restore` reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestoreReply {
    pub policy_version: PolicyVersion,
    /// The session now recorded (the request's).
    #[serde(default)]
    pub session: Option<String>,
    /// The restored weights put on the inference servers (a trainer that publishes).
    #[serde(default)]
    pub published: Option<Published>,
}

/// What the trainer trains: a LoRA adapter or all weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrainMode {
    Lora,
    Full,
}

/// `GET /v1/state` reply. `L` is the LoRA config and `C` the train config; the trainer fills
/// them with its own types, a client reads them as JSON values (the defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateReply<L = serde_json::Value, C = serde_json::Value> {
    pub policy_version: PolicyVersion,
    /// Optimizer steps taken.
    pub optimizer_step: u64,
    pub mode: TrainMode,
    /// The adapter's config (`null` for a full fine-tune).
    pub lora: Option<L>,
    /// The base model directory.
    pub base: String,
    /// A train step is running.
    #[serde(default)]
    pub training: bool,
    /// The names the policy is served under on `/v1/models`.
    #[serde(default)]
    pub served_names: Vec<String>,
    /// The client session the current weights belong to (`null` after a start).
    #[serde(default)]
    pub session: Option<String>,
    pub device: String,
    /// The parameters' dtype (`f32`, `bf16`; `trainer.param_dtype`).
    #[serde(default)]
    pub dtype: String,
    pub train_config: C,
}

/// The body of every refusal: `{"error": {"message": ..., "code": STATUS}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub message: String,
    /// The HTTP status code.
    pub code: u16,
}

impl ErrorBody {
    pub fn new(code: u16, message: impl Into<String>) -> Self {
        Self {
            error: ErrorDetail {
                message: message.into(),
                code,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn metrics() -> StepMetrics {
        StepMetrics {
            loss: 0.5,
            tokens: 12,
            sequences: 2,
            ..StepMetrics::default()
        }
    }

    #[test]
    fn train_reply_omits_an_absent_reflection_and_writes_null_for_the_rest() {
        let r = TrainReply {
            policy_version: PolicyVersion(3),
            metrics: metrics(),
            reflection: None,
            checkpoint: None,
            published: None,
            decode_seconds: 0.25,
            settings_hash: Some("0123456789abcdef".into()),
        };
        let v = serde_json::to_value(&r).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "policy_version",
                "metrics",
                "checkpoint",
                "published",
                "decode_seconds",
                "settings_hash"
            ]
        );
        // A reply from a trainer without settings (no `settings_hash`, no `minibatches`) reads.
        let mut old = v.clone();
        old.as_object_mut().unwrap().remove("settings_hash");
        old["metrics"]
            .as_object_mut()
            .unwrap()
            .remove("minibatches");
        let back: TrainReply = serde_json::from_value(old).unwrap();
        assert_eq!((back.settings_hash, back.metrics.minibatches), (None, 0));
        assert_eq!(v["policy_version"], 3);
        assert_eq!(v["checkpoint"], serde_json::Value::Null);
        let back: TrainReply = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        let with = TrainReply {
            reflection: Some(metrics()),
            ..r
        };
        let v = serde_json::to_value(&with).unwrap();
        assert_eq!(v["reflection"]["tokens"], 12);
    }

    #[test]
    fn published_matches_the_trainers_json_and_names_only_a_fully_loaded_adapter() {
        let p = Published {
            version: PolicyVersion(2),
            name: "policy-v2".into(),
            dir: PathBuf::from("/p/policy-v2"),
            loaded: vec!["http://a".into()],
            failed: vec![],
            unloaded: vec!["policy-v0".into()],
            lora: true,
            seconds: 1.5,
        };
        assert_eq!(
            serde_json::to_value(&p).unwrap(),
            json!({"version": 2, "name": "policy-v2", "dir": "/p/policy-v2",
                   "loaded": ["http://a"], "failed": [], "unloaded": ["policy-v0"],
                   "lora": true, "seconds": 1.5})
        );
        assert_eq!(p.served_name(), Some("policy-v2"));
        let failed = Published {
            failed: vec![("http://b".into(), "HTTP 500".into())],
            ..p.clone()
        };
        assert_eq!(
            serde_json::to_value(&failed).unwrap()["failed"],
            json!([["http://b", "HTTP 500"]])
        );
        assert_eq!(failed.served_name(), None);
        let full = Published {
            lora: false,
            ..p.clone()
        };
        assert_eq!(full.served_name(), None);
        // A partial answer (fields missing) still reads.
        let partial: Published =
            serde_json::from_value(json!({"name": "policy-v3", "loaded": ["u"], "lora": true}))
                .unwrap();
        assert_eq!(partial.served_name(), Some("policy-v3"));
    }

    #[test]
    fn requests_and_small_replies_keep_their_shapes() {
        let r = RestoreRequest {
            checkpoint: None,
            session: Some("run-1".into()),
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"checkpoint":null,"session":"run-1"}"#
        );
        let empty: RestoreRequest = serde_json::from_str("{}").unwrap();
        assert_eq!(empty, RestoreRequest::default());
        let c = CheckpointReply {
            checkpoint: PathBuf::from("/ck/run/step-3"),
            relative: Some("run/step-3".into()),
            policy_version: PolicyVersion(3),
        };
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"checkpoint":"/ck/run/step-3","relative":"run/step-3","policy_version":3}"#
        );
        let restored = RestoreReply {
            policy_version: PolicyVersion(0),
            session: None,
            published: None,
        };
        assert_eq!(
            serde_json::to_string(&restored).unwrap(),
            r#"{"policy_version":0,"session":null,"published":null}"#
        );
        let d = DryRunReply {
            sequences: 2,
            reflection_sequences: 1,
            tokens: 40,
            decode_seconds: 0.5,
        };
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            r#"{"sequences":2,"reflection_sequences":1,"tokens":40,"decode_seconds":0.5}"#
        );
    }

    #[test]
    fn state_reply_reads_as_json_values_on_the_client() {
        let s: StateReply<serde_json::Value, serde_json::Value> = StateReply {
            policy_version: PolicyVersion(4),
            optimizer_step: 4,
            mode: TrainMode::Lora,
            lora: Some(json!({"r": 8})),
            base: "/m".into(),
            training: false,
            served_names: vec!["policy".into()],
            session: None,
            device: "Cpu".into(),
            dtype: "f32".into(),
            train_config: json!({"micro_batch_tokens": 16384}),
        };
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(
            text,
            r#"{"policy_version":4,"optimizer_step":4,"mode":"lora","lora":{"r":8},"base":"/m","training":false,"served_names":["policy"],"session":null,"device":"Cpu","dtype":"f32","train_config":{"micro_batch_tokens":16384}}"#
        );
        let back: StateReply = serde_json::from_str(&text).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn the_error_body() {
        assert_eq!(
            serde_json::to_string(&ErrorBody::new(409, "a train step is running")).unwrap(),
            r#"{"error":{"message":"a train step is running","code":409}}"#
        );
    }
}
