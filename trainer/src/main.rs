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
    /// Supervised warm start on `orchestrator sft-data` output (ChatML JSONL, tool spans
    /// masked); writes a model directory `trainer serve` loads. Prints a JSON report.
    Sft {
        /// The SFT JSONL file.
        #[arg(long, env = "TRAINER_SFT_DATA")]
        data: PathBuf,
        /// Model directory to start from.
        #[arg(long, env = "TRAINER_MODEL")]
        model: PathBuf,
        /// Output model directory (written atomically).
        #[arg(long, env = "TRAINER_SFT_OUT")]
        out: PathBuf,
        #[arg(long, default_value_t = 2)]
        epochs: usize,
        /// Sequences per optimizer step.
        #[arg(long, default_value_t = 8)]
        batch: usize,
        #[arg(long, default_value_t = 1e-3)]
        lr: f64,
        /// Rows longer than this many tokens are dropped (and counted).
        #[arg(long, default_value_t = 4096)]
        max_len: usize,
        #[arg(long, env = "TRAINER_SEED", default_value_t = 17)]
        seed: u64,
        #[arg(long, default_value = "auto")]
        device: String,
        /// Recompute activations in backward (saves memory, costs time).
        #[arg(long)]
        grad_checkpoint: bool,
    },
    /// Serve the policy: train steps over HTTP, checkpoints, publishing to inference servers,
    /// and OpenAI-compatible generation (the embedded policy server).
    Serve(Box<ServeArgs>),
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

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Hugging Face model directory (config.json, model.safetensors, tokenizer.json).
    #[arg(long, env = "TRAINER_MODEL")]
    model: PathBuf,
    /// Address to listen on (loopback by default).
    #[arg(long, env = "TRAINER_BIND", default_value = "127.0.0.1:8100")]
    bind: std::net::SocketAddr,
    /// Model name served on /v1/models.
    #[arg(long, env = "TRAINER_SERVED_NAME", default_value = "policy")]
    served_name: String,
    /// LoRA rank; 0 trains all weights.
    #[arg(long, env = "TRAINER_LORA_R", default_value_t = 0)]
    lora_r: i64,
    #[arg(long, env = "TRAINER_LORA_ALPHA")]
    lora_alpha: Option<f64>,
    #[arg(long, env = "TRAINER_LR", default_value_t = 1e-5)]
    lr: f64,
    /// KL3 coefficient to the reference (LoRA only: the reference is the base).
    #[arg(long, env = "TRAINER_KL", default_value_t = 0.0)]
    kl_coef: f64,
    #[arg(long, env = "TRAINER_MICRO_BATCH_TOKENS", default_value_t = 16384)]
    micro_batch_tokens: i64,
    /// Checkpoints go here (`step-N`, `latest`).
    #[arg(long, env = "TRAINER_CHECKPOINT_DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// Checkpoint every N steps (0: only on POST /v1/checkpoint).
    #[arg(long, env = "TRAINER_CHECKPOINT_EVERY", default_value_t = 0)]
    checkpoint_every: u64,
    /// Continue from the latest checkpoint in --checkpoint-dir if there is one.
    #[arg(long, env = "TRAINER_RESUME")]
    resume: bool,
    /// Inference servers to publish each new version to (vLLM or SGLang, detected).
    #[arg(
        long = "publish-url",
        env = "TRAINER_PUBLISH_URLS",
        value_delimiter = ','
    )]
    publish_urls: Vec<String>,
    /// Where versioned adapters / weights are written for the servers.
    #[arg(long, env = "TRAINER_PUBLISH_DIR")]
    publish_dir: Option<PathBuf>,
    #[arg(long, env = "TRAINER_PUBLISH_NAME", default_value = "policy")]
    publish_name: String,
    /// Versions kept loaded on the servers.
    #[arg(long, env = "TRAINER_PUBLISH_WINDOW", default_value_t = 2)]
    publish_window: usize,
    #[arg(long, env = "TRAINER_PUBLISH_RETRIES", default_value_t = 3)]
    publish_retries: u32,
    /// Largest accepted request body in MiB.
    #[arg(long, env = "TRAINER_MAX_BODY_MB", default_value_t = 4096)]
    max_body_mb: usize,
    #[arg(long, env = "TRAINER_SEED", default_value_t = 17)]
    seed: i64,
    /// cpu, cuda or auto.
    #[arg(long, env = "TRAINER_DEVICE", default_value = "auto")]
    device: String,
    /// libtorch intra-op threads on CPU (0: libtorch's default, one per core). Two processes
    /// sharing a machine (a policy server and a trainer) each get a share this way.
    #[arg(long, env = "TRAINER_THREADS", default_value_t = 0)]
    threads: i32,
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
            let device = parse_device(&device)?;
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
        Command::Serve(a) => {
            serve(*a)?;
            "trainer serve stopped".into()
        }
        Command::Sft {
            data,
            model,
            out,
            epochs,
            batch,
            lr,
            max_len,
            seed,
            device,
            grad_checkpoint,
        } => {
            let mut train = trainer::train::TrainConfig::default();
            train.optim.lr = lr;
            train.grad_checkpoint = grad_checkpoint;
            train.loss.kl_coef = 0.0; // SFT: no reference policy
            let report = trainer::sft::run(&trainer::sft::SftOptions {
                data,
                model_dir: model,
                out,
                epochs,
                batch,
                max_len,
                train,
                device: parse_device(&device)?,
                seed,
            })?;
            serde_json::to_string(&report)?
        }
        Command::Info => format!(
            "cuda available: {}, devices: {}, cudnn: {}",
            tch::Cuda::is_available(),
            tch::Cuda::device_count(),
            tch::Cuda::cudnn_is_available()
        ),
    })
}

fn parse_device(s: &str) -> anyhow::Result<tch::Device> {
    Ok(match s {
        "cpu" => tch::Device::Cpu,
        "cuda" => tch::Device::Cuda(0),
        "auto" => trainer::default_device(),
        other => anyhow::bail!("--device = {other:?}; allowed: cpu, cuda, auto"),
    })
}

fn serve(a: ServeArgs) -> anyhow::Result<()> {
    use trainer::publish::{PublishConfig, PublishTarget, Publisher, detect_kind};
    use trainer::service::{AppState, ServeConfig, load};
    let device = parse_device(&a.device)?;
    if a.threads < 0 {
        anyhow::bail!("--threads = {}; allowed: 0 (default) or more", a.threads);
    }
    if a.threads > 0 {
        tch::set_num_threads(a.threads);
    }
    let lora = (a.lora_r > 0).then(|| trainer::model::LoraConfig {
        r: a.lora_r,
        alpha: a.lora_alpha.unwrap_or(2.0 * a.lora_r as f64),
        ..Default::default()
    });
    let mut train = trainer::train::TrainConfig::default();
    train.optim.lr = a.lr;
    train.loss.kl_coef = a.kl_coef;
    train.micro_batch_tokens = a.micro_batch_tokens;
    let load_opts = load::LoadOptions {
        model_dir: a.model.clone(),
        lora: lora.clone(),
        train,
        device,
        seed: a.seed,
        resume_from: if a.resume {
            a.checkpoint_dir.clone()
        } else {
            None
        },
    };
    let loaded = load::load(&load_opts)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let publisher = if a.publish_urls.is_empty() && a.publish_dir.is_none() {
            None
        } else {
            let root = a.publish_dir.clone().ok_or_else(|| {
                anyhow::anyhow!(
                    "--publish-url needs --publish-dir (a directory the servers can read)"
                )
            })?;
            std::fs::create_dir_all(&root)?;
            let root = std::fs::canonicalize(&root)?;
            trainer::checkpoint::clean_partial(&root);
            let http = trainer::publish::http_client();
            let mut targets = Vec::new();
            for url in &a.publish_urls {
                targets.push(PublishTarget {
                    url: url.clone(),
                    kind: detect_kind(&http, url).await,
                });
            }
            Some(Publisher::new(PublishConfig {
                root,
                name: a.publish_name.clone(),
                window: a.publish_window,
                retries: a.publish_retries,
                targets,
                lora: lora.is_some(),
            }))
        };
        let cfg = ServeConfig {
            bind: a.bind,
            served_name: a.served_name.clone(),
            checkpoint_dir: a.checkpoint_dir.clone(),
            checkpoint_every: a.checkpoint_every,
            max_body_bytes: a.max_body_mb << 20,
            max_model_len: loaded.max_model_len,
        };
        let state = AppState::new(
            loaded.policy,
            loaded.tokenizer,
            loaded.chat_template,
            loaded.eos,
            cfg,
            publisher,
        );
        state.set_load_options(load_opts);
        trainer::service::serve(state).await?;
        Ok::<_, anyhow::Error>(())
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
