//! The `trainer` binary: a thin CLI over the trainer library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "trainer",
    version,
    about = "RubricEM trainer (Qwen3 in libtorch)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Train a byte-level BPE tokenizer (ChatML specials) on a JSONL or text corpus.
    Tokenizer {
        #[command(subcommand)]
        command: TokenizerCommand,
    },
    /// Write a random-init Qwen3 model directory in Hugging Face layout.
    Init {
        /// A Qwen3 config.json (vocab_size is taken from the tokenizer).
        #[arg(long, env = "TRAINER_INIT_CONFIG")]
        config: PathBuf,
        /// Directory with tokenizer.json (and tokenizer_config.json).
        #[arg(long, env = "TRAINER_TOKENIZER")]
        tokenizer: PathBuf,
        /// Output directory.
        #[arg(long, env = "TRAINER_INIT_OUT")]
        out: PathBuf,
        #[arg(long, env = "TRAINER_SEED", default_value_t = 17)]
        seed: i64,
    },
    /// Print what libtorch sees (version of the build, CUDA devices).
    Info,
    /// Time train steps (forward, loss, backward, AdamW) on a random model; prints JSON.
    Bench {
        /// A Qwen3 config.json.
        #[arg(long, env = "TRAINER_BENCH_CONFIG")]
        config: PathBuf,
        #[arg(long, default_value_t = 4)]
        seqs: usize,
        #[arg(long, default_value_t = 512)]
        seq_len: usize,
        #[arg(long, default_value_t = 3)]
        steps: usize,
        #[arg(long, default_value_t = 1)]
        warmup: usize,
        /// LoRA rank (0 = full fine-tune).
        #[arg(long, default_value_t = 0)]
        lora_r: i64,
        #[arg(long)]
        grad_checkpoint: bool,
        /// cpu or cuda.
        #[arg(long, default_value = "auto")]
        device: String,
        /// Peak FLOP/s for MFU, e.g. 989e12 for H100 bf16 dense.
        #[arg(long)]
        peak_flops: Option<f64>,
    },
}

#[derive(Debug, Subcommand)]
enum TokenizerCommand {
    Train {
        #[arg(long, env = "TRAINER_CORPUS")]
        corpus: PathBuf,
        #[arg(long, env = "TRAINER_VOCAB", default_value_t = 4096)]
        vocab: usize,
        #[arg(long, env = "TRAINER_TOKENIZER_OUT")]
        out: PathBuf,
    },
}

fn run(cli: Cli) -> anyhow::Result<String> {
    Ok(match cli.command {
        Command::Tokenizer {
            command: TokenizerCommand::Train { corpus, vocab, out },
        } => {
            let n = trainer::smallmodel::train_tokenizer(&corpus, vocab, &out)?;
            format!("tokenizer with {n} entries written to {}", out.display())
        }
        Command::Init {
            config,
            tokenizer,
            out,
            seed,
        } => {
            let cfg = trainer::smallmodel::init_model(&config, &tokenizer, &out, seed)?;
            format!(
                "random-init Qwen3 ({} layers, hidden {}, vocab {}) written to {}",
                cfg.num_hidden_layers,
                cfg.hidden_size,
                cfg.vocab_size,
                out.display()
            )
        }
        Command::Bench {
            config,
            seqs,
            seq_len,
            steps,
            warmup,
            lora_r,
            grad_checkpoint,
            device,
            peak_flops,
        } => {
            let device = match device.as_str() {
                "cpu" => tch::Device::Cpu,
                "cuda" => tch::Device::Cuda(0),
                "auto" => trainer::default_device(),
                other => anyhow::bail!("--device = {other:?}; allowed: cpu, cuda, auto"),
            };
            let spec = trainer::bench::BenchSpec {
                config: trainer::model::Qwen3Config::from_file(&config)?,
                lora: (lora_r > 0).then(|| trainer::model::LoraConfig {
                    r: lora_r,
                    alpha: 2.0 * lora_r as f64,
                    ..Default::default()
                }),
                seqs,
                seq_len,
                steps,
                warmup,
                grad_checkpoint,
                device,
                kind: trainer::default_kind(device),
                peak_flops,
            };
            serde_json::to_string(&trainer::bench::run(&spec)?)?
        }
        Command::Info => format!(
            "cuda available: {}, devices: {}, cudnn: {}",
            tch::Cuda::is_available(),
            tch::Cuda::device_count(),
            tch::Cuda::cudnn_is_available()
        ),
    })
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(msg) => {
            // Results go to stdout (JSON for bench), diagnostics to stderr.
            #[allow(clippy::print_stdout)]
            {
                println!("{msg}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
