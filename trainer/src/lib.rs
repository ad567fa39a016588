//! The RubricEM trainer library: Qwen3 in libtorch (tch) with LoRA, the SS-GRPO / GRPO / SFT
//! losses, AdamW with exact state restore, the train step (chunked logits head, gradient
//! checkpointing, PPO minibatches), data parallelism over torch's c10d (`dist`), per-rank memory
//! planning, the experiment's settings mapped onto it, exports that transformers, PEFT and vLLM
//! load, and small-model tooling (tokenizer training, random-init model dirs).

pub mod alloc;
pub mod average;
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

/// Whether bf16 parameters train faster than f32 on this CPU: AMX-BF16 (CPUID leaf 7, EDX bit
/// 22) with its tile state enabled by the OS (XCR0 bits 17 and 18), or AVX512-BF16 (leaf 7
/// sub-leaf 1, EAX bit 5) on an AMD CPU; `None` where this build cannot tell (not x86-64).
/// Measured on the smoke model's training step, one thread (`trainer bench`, BENCHMARKS.md
/// issue 25): with AMX-BF16, 1.87x faster than f32 (session 77); with AVX512-BF16 on a Zen 4
/// EPYC, 1.24x faster (session 83), 1.85x since bf16 attention runs on the trainer's own kernel
/// there (`kernels::causal_attention`, session 88); with AVX512-BF16 alone on an Intel Xeon
/// whose hypervisor hid AMX, 1.68x slower (session 82, before that kernel; not measured since);
/// with neither (a Zen 3 EPYC), 13x slower (session 81).
pub fn cpu_fast_bf16() -> Option<bool> {
    #[cfg(target_arch = "x86_64")]
    return Some(amx_bf16() || amd_avx512_bf16());
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// The parameter dtype a CPU training step runs fastest in here, as `trainer info --cpu-dtype`
/// prints it: `bf16` where [`cpu_fast_bf16`] says so, else `f32` (also where it cannot tell).
/// `trainer.param_dtype = "auto"` still means f32 on a CPU; scripts that pick bf16 for speed
/// (`scripts/guided.sh`) ask this, since AVX512-BF16 alone is not enough on an Intel CPU.
pub fn cpu_param_dtype() -> &'static str {
    if cpu_fast_bf16() == Some(true) {
        "bf16"
    } else {
        "f32"
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn amx_bf16() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    if __cpuid(0).eax < 7
        || __cpuid_count(7, 0).edx & (1 << 22) == 0
        || !std::arch::is_x86_feature_detected!("xsave")
    {
        return false;
    }
    #[target_feature(enable = "xsave")]
    fn xcr0() -> u64 {
        // SAFETY: XGETBV with ECX = 0 reads XCR0, which every CPU with XSAVE enabled has.
        unsafe { std::arch::x86_64::_xgetbv(0) }
    }
    // SAFETY: the CPU has XSAVE (checked just above), the only requirement of a
    // `target_feature(enable = "xsave")` function.
    let xcr0 = unsafe { xcr0() };
    xcr0 & (0b11 << 17) == 0b11 << 17
}

/// AVX512-BF16 on a CPU whose vendor string is AMD's (Zen 4 and later).
#[cfg(target_arch = "x86_64")]
fn amd_avx512_bf16() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    let v = __cpuid(0);
    let vendor: Vec<u8> = [v.ebx, v.edx, v.ecx]
        .iter()
        .flat_map(|r| r.to_le_bytes())
        .collect();
    vendor == b"AuthenticAMD" && v.eax >= 7 && __cpuid_count(7, 1).eax & (1 << 5) != 0
}

/// Once a process, a warning when a model holds bf16 parameters on a CPU where they train slower
/// than f32 (neither AMX-BF16 nor AMD's AVX512-BF16, [`cpu_fast_bf16`]): libtorch's bf16
/// products there are converted or run on vector units, and the smoke model's training step
/// took 12.2 s in bf16 against 7.3 s in f32 on a Xeon with AVX512-BF16 alone (session 82), 153 s
/// against 11.7 s on a Zen 3 EPYC without bf16 arithmetic (session 81).
pub fn warn_if_slow_bf16(device: tch::Device, kind: tch::Kind) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    if device == tch::Device::Cpu && kind == tch::Kind::BFloat16 && cpu_fast_bf16() == Some(false) {
        WARNED.call_once(|| {
            tracing::warn!(
                "bf16 parameters on a CPU with neither AMX-BF16 nor AMD's AVX512-BF16: expect \
                 training steps slower than f32 (the smoke model's: 1.7x on an Intel CPU with \
                 AVX512-BF16 alone, 13x without it; BENCHMARKS.md issue 25 sessions 81-82); \
                 --dtype f32 or trainer.param_dtype = \"f32\" (auto) avoids it"
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
    /// The check agrees with what the kernel reports in /proc/cpuinfo (read where it exists):
    /// `amx_bf16` among the CPU's flags (Linux lists it only where the OS enables the tile
    /// state), or `avx512_bf16` on an `AuthenticAMD` CPU.
    #[test]
    fn fast_bf16_is_what_the_cpu_reports() {
        #[cfg(target_arch = "x86_64")]
        if let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") {
            let has = |name: &str| {
                info.lines()
                    .filter(|l| l.starts_with("flags"))
                    .any(|l| l.split_whitespace().any(|f| f == name))
            };
            let amd = info
                .lines()
                .any(|l| l.starts_with("vendor_id") && l.ends_with("AuthenticAMD"));
            let flag = has("amx_bf16") || (amd && has("avx512_bf16"));
            assert_eq!(super::cpu_fast_bf16(), Some(flag));
            assert_eq!(super::cpu_param_dtype(), if flag { "bf16" } else { "f32" });
        }
    }
}
