//! Train-step throughput: a random Qwen3 of a given config, a synthetic RL batch, timed steps
//! (forward, loss, backward, AdamW) in tokens/s, and model FLOPs utilisation when a peak is
//! given. `scripts/bench-trainer.sh` runs it beside the PyTorch + transformers reference.

use serde::Serialize;
use tch::{Device, Kind};

use crate::error::Result;
use crate::loss::PolicyLossConfig;
use crate::model::{LoraConfig, Qwen3, Qwen3Config};
use crate::optim::AdamWConfig;
use crate::train::{Sequence, TrainConfig, Trainer};

#[derive(Debug, Clone)]
pub struct BenchSpec {
    pub config: Qwen3Config,
    pub lora: Option<LoraConfig>,
    pub seqs: usize,
    pub seq_len: usize,
    pub steps: usize,
    pub warmup: usize,
    pub grad_checkpoint: bool,
    pub device: Device,
    pub kind: Kind,
    /// Peak FLOP/s of the device for MFU (None: not reported).
    pub peak_flops: Option<f64>,
    /// `PolicyLossConfig::entropy` of the timed step (0 = off).
    pub entropy_bonus: f64,
    /// Leading tokens every row has in common (a chat batch's system prompt), which the step
    /// runs once for all rows (`Qwen3::layers_forward`); 0: every row differs from its first.
    pub shared_prefix: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    pub tokens_per_step: usize,
    pub seconds_per_step: f64,
    pub tokens_per_second: f64,
    pub params: i64,
    pub trainable_params: i64,
    pub mfu: Option<f64>,
    pub threads: i32,
    /// The kernel the step's causal attention ran on: `own` (`kernels::causal_attention`, bf16
    /// on a CPU with AVX512-BF16) or `libtorch` (its SDPA kernels), so figures taken with
    /// `--causal-attention` either way say which they are.
    pub attention: &'static str,
    /// Peak GPU memory allocated during the timed steps, GiB (CUDA in the `nccl` build).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_gib: Option<f64>,
}

/// Training FLOPs per token: 6·N for the matmuls (forward 2N + backward 4N) plus attention
/// 12·L·H·T/2 (causal), as in the PaLM appendix; recompute adds one more forward (2N).
pub fn flops_per_token(cfg: &Qwen3Config, params: i64, seq_len: usize, recompute: bool) -> f64 {
    let n = params as f64;
    let attn = 12.0
        * cfg.num_hidden_layers as f64
        * (cfg.num_attention_heads * cfg.head_dim()) as f64
        * seq_len as f64
        / 2.0;
    let matmul = if recompute { 8.0 * n } else { 6.0 * n };
    matmul + attn
}

pub fn run(spec: &BenchSpec) -> Result<BenchResult> {
    let mut model = Qwen3::random(spec.config.clone(), 1, 0.02, spec.device, spec.kind)?;
    if let Some(l) = &spec.lora {
        model.add_lora(l, 2)?;
    } else {
        model.set_trainable(true);
    }
    let numel = |v: Vec<(String, tch::Tensor)>| v.iter().map(|(_, t)| t.numel() as i64).sum();
    let params: i64 = numel(model.base_tensors());
    let trainable: i64 = numel(model.trainable());
    let cfg = TrainConfig {
        loss: PolicyLossConfig {
            kl_coef: 0.0,
            entropy: spec.entropy_bonus,
            ..PolicyLossConfig::default()
        },
        optim: AdamWConfig {
            lr: 1e-6,
            ..AdamWConfig::default()
        },
        micro_batch_tokens: (spec.seqs * spec.seq_len) as i64,
        logit_chunk: 1024,
        grad_checkpoint: spec.grad_checkpoint,
        minibatches_per_step: 1,
        skip_null_rows: true,
        reflection_lr_scale: 1.0,
    };
    let vocab = spec.config.vocab_size;
    let mut trainer = Trainer::new(model, cfg)?;
    let batch: Vec<Sequence> = (0..spec.seqs)
        .map(|r| {
            let n = spec.seq_len;
            Sequence {
                unlikelihood: Vec::new(),
                tokens: (0..n)
                    .map(|t| {
                        let row = if t < spec.shared_prefix { 0 } else { r + 1 };
                        ((t * 7919 + row * 104729) as i64) % vocab
                    })
                    .collect(),
                loss_mask: (0..n).map(|t| t > 0).collect(),
                stages: (0..n).map(|t| (t * 4 / n) as i8).collect(),
                behaviour_logprobs: vec![-2.0; n],
                advantages: vec![0.5, -0.2, 0.1, 0.3],
                off_policy: false,
            }
        })
        .collect();
    for _ in 0..spec.warmup {
        trainer.rl_step(&batch)?;
    }
    sync(spec.device);
    if let Device::Cuda(i) = spec.device {
        crate::dist::cuda_peak_allocated(i, true);
    }
    let t0 = std::time::Instant::now();
    for _ in 0..spec.steps {
        trainer.rl_step(&batch)?;
    }
    sync(spec.device);
    let secs = t0.elapsed().as_secs_f64() / spec.steps.max(1) as f64;
    let tokens = spec.seqs * spec.seq_len;
    let tps = tokens as f64 / secs;
    let mfu = spec.peak_flops.map(|peak| {
        // With LoRA the base weights need no weight gradients: 4N instead of 6N (8N→6N with
        // recompute) is what the hardware does; report against the dense 6N convention used
        // for full fine-tunes so numbers stay comparable across modes.
        flops_per_token(&spec.config, params, spec.seq_len, false) * tps / peak
    });
    Ok(BenchResult {
        tokens_per_step: tokens,
        seconds_per_step: secs,
        tokens_per_second: tps,
        params,
        trainable_params: trainable,
        mfu,
        threads: tch::get_num_threads(),
        attention: if crate::kernels::own_causal_attention(
            spec.kind,
            spec.device,
            spec.config.head_dim(),
        ) {
            "own"
        } else {
            "libtorch"
        },
        peak_gib: match spec.device {
            Device::Cuda(i) => {
                crate::dist::cuda_peak_allocated(i, false).map(|b| b as f64 / (1u64 << 30) as f64)
            }
            _ => None,
        },
    })
}

fn sync(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind};

    use super::{BenchSpec, run};

    /// A tiny bench runs and reports which attention kernel its step took: libtorch's in f32
    /// and with heads 8 wide; the trainer's own in bf16 with heads 64 wide exactly where the
    /// kernel applies on this CPU.
    #[test]
    fn a_bench_says_which_attention_kernel_it_ran() {
        let spec = |head_dim: i64, kind| BenchSpec {
            config: serde_json::from_value(serde_json::json!({
                "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
                "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": head_dim, "max_position_embeddings": 128, "rope_theta": 10000.0,
                "tie_word_embeddings": true
            }))
            .unwrap(),
            lora: None,
            seqs: 2,
            seq_len: 24,
            steps: 1,
            warmup: 0,
            grad_checkpoint: false,
            device: Device::Cpu,
            kind,
            peak_flops: None,
            entropy_bonus: 0.0,
            shared_prefix: 8,
        };
        let own_here = crate::kernels::own_causal_attention(Kind::BFloat16, Device::Cpu, 64);
        for (head_dim, kind, own) in [
            (8, Kind::Float, false),
            (64, Kind::Float, false),
            (8, Kind::BFloat16, false),
            (64, Kind::BFloat16, own_here),
        ] {
            let r = run(&spec(head_dim, kind)).unwrap();
            assert_eq!(r.tokens_per_step, 48);
            assert!(r.seconds_per_step > 0.0);
            let want = if own { "own" } else { "libtorch" };
            assert_eq!(r.attention, want, "head_dim {head_dim} {kind:?}");
        }
    }
}
