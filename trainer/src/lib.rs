//! The RubricEM trainer library: Qwen3 in libtorch (tch) with LoRA, the SS-GRPO / GRPO / SFT
//! losses, AdamW with exact state restore, the train step (chunked logits head, gradient
//! checkpointing, PPO minibatches), data parallelism over torch's c10d (`dist`), per-rank memory
//! planning, the experiment's settings mapped onto it, exports that transformers, PEFT and vLLM
//! load, and small-model tooling (tokenizer training, random-init model dirs).

pub mod alloc;
pub mod bench;
pub mod chat;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod dist;
pub mod error;
pub mod export;
#[allow(unsafe_code)]
pub mod kernels;
pub mod loss;
pub mod model;
pub mod optim;
pub mod plan;
pub mod publish;
pub mod sequence;
pub mod service;
pub mod settings;
pub mod sft;
#[allow(unsafe_code)]
mod shim;
pub mod smallmodel;
pub mod train;

pub use error::TrainerError;

/// The device the trainer uses: CUDA when libtorch sees a GPU, else CPU.
pub fn default_device() -> tch::Device {
    tch::Device::cuda_if_available()
}

/// A parameter dtype's name as `trainer.param_dtype` and `/v1/state` write it.
pub fn dtype_name(kind: tch::Kind) -> &'static str {
    match kind {
        tch::Kind::BFloat16 => "bf16",
        tch::Kind::Half => "f16",
        tch::Kind::Float => "f32",
        _ => "other",
    }
}

/// The parameter dtype for a device: bf16 on CUDA, f32 on CPU.
pub fn default_kind(device: tch::Device) -> tch::Kind {
    if device.is_cuda() {
        tch::Kind::BFloat16
    } else {
        tch::Kind::Float
    }
}
