//! The policy model: Qwen3 from a Hugging Face directory, its LoRA adapters (PEFT format) and
//! the safetensors reader/writer behind both. Imports run one way, from the model down to its
//! parts: `qwen3` (the decoder) uses `linear` (projections and the LoRA layer), `rope`,
//! `kv_cache`, `row_attention` (the CPU decode step's attention), `config` and `weights`;
//! `lora` (adapter files) uses `qwen3` and `linear`.

pub mod config;
pub mod kv_cache;
pub mod linear;
pub mod lora;
pub mod qwen3;
pub mod rope;
pub mod row_attention;
pub mod weights;

pub use config::Qwen3Config;
pub use kv_cache::{BatchKv, KvCache, LayerKv};
pub use linear::{Fwd, Lora, LoraConfig, LoraTarget, Proj};
pub use qwen3::{DecodeAttention, DecodeOptions, Qwen3};
pub use rope::Rope;

/// libtorch's default generator is process-wide: seeding it and drawing from it must happen
/// under this lock, or concurrent model initialisations (tests, a server initialising while
/// another thread samples) interleave their draws and lose determinism per seed.
pub fn rng_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
