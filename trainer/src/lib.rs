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

/// Whether this CPU has bf16 arithmetic (AVX512-BF16, which every CPU with AMX-BF16 also has);
/// `None` where this build cannot tell (not x86-64).
pub fn cpu_native_bf16() -> Option<bool> {
    #[cfg(target_arch = "x86_64")]
    return Some(std::arch::is_x86_feature_detected!("avx512bf16"));
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// Once a process, a warning when a model holds bf16 parameters on a CPU without bf16
/// arithmetic: libtorch then converts every product, and the smoke model's training step took
/// 153 s in bf16 against 11.7 s in f32 on a Zen 3 EPYC (BENCHMARKS.md, issue 25 session 81).
pub fn warn_if_slow_bf16(device: tch::Device, kind: tch::Kind) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    if device == tch::Device::Cpu && kind == tch::Kind::BFloat16 && cpu_native_bf16() == Some(false)
    {
        WARNED.call_once(|| {
            tracing::warn!(
                "bf16 parameters on a CPU without bf16 arithmetic (no avx512_bf16 or amx_bf16): \
                 expect steps and decoding many times slower than f32 (13x for the smoke \
                 model's training step, BENCHMARKS.md issue 25 session 81); --dtype f32 or \
                 trainer.param_dtype = \"f32\" (auto) avoids it"
            );
        });
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

#[cfg(test)]
mod tests {
    /// The bf16 check agrees with what the kernel reports: `avx512_bf16` among the CPU's flags
    /// in /proc/cpuinfo (read where it exists).
    #[test]
    fn native_bf16_is_what_the_cpu_reports() {
        #[cfg(target_arch = "x86_64")]
        if let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") {
            let flag = info
                .lines()
                .filter(|l| l.starts_with("flags"))
                .any(|l| l.split_whitespace().any(|f| f == "avx512_bf16"));
            assert_eq!(super::cpu_native_bf16(), Some(flag));
        }
    }
}
