//! The policy model: Qwen3 from a Hugging Face directory, its LoRA adapters (PEFT format) and
//! the safetensors reader/writer behind both.

pub mod config;
pub mod lora;
pub mod qwen3;
pub mod weights;

pub use config::Qwen3Config;
pub use lora::{LoraConfig, LoraTarget};
pub use qwen3::{Fwd, KvCache, Qwen3};
