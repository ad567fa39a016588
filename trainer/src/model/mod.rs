//! The policy model: Qwen3 from a Hugging Face directory, its LoRA adapters (PEFT format) and
//! the safetensors reader/writer behind both.

pub mod config;
pub mod lora;
pub mod qwen3;
pub mod weights;

pub use config::Qwen3Config;
pub use lora::{LoraConfig, LoraTarget};
pub use qwen3::{Fwd, KvCache, Qwen3};

/// libtorch's default generator is process-wide: seeding it and drawing from it must happen
/// under this lock, or concurrent model initialisations (tests, a server initialising while
/// another thread samples) interleave their draws and lose determinism per seed.
pub fn rng_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
