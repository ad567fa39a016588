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
            eprintln!("{msg}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
