//! The `trainer` binary: parse the command line (`trainer::cli`), check it into settings
//! (`trainer::config`), set up tracing, run the subcommand. Results go to stdout (JSON for
//! `bench`, `sft` and `export`), diagnostics to stderr.

use std::process::ExitCode;

use clap::Parser;
use trainer::cli::Cli;
use trainer::config::{PublishSettings, ServeSettings, Task};
use trainer::publish::{PublishConfig, PublishTarget, Publisher, detect_kind};
use trainer::service::{AppState, ServeConfig, load};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Task::from_cli(Cli::parse()).and_then(run) {
        Ok(msg) => {
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

/// Run one subcommand; returns what it prints.
fn run(task: Task) -> anyhow::Result<String> {
    Ok(match task {
        Task::TrainTokenizer { corpus, vocab, out } => {
            let n = trainer::smallmodel::train_tokenizer(&corpus, vocab, &out)?;
            format!("tokenizer with {n} entries written to {}", out.display())
        }
        Task::Init {
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
        Task::Bench(spec) => serde_json::to_string(&trainer::bench::run(&spec)?)?,
        Task::Plan(spec) => serde_json::to_string_pretty(&trainer::plan::plan(&spec))?,
        Task::Consolidate { dir } => {
            let (params, elements, step) = trainer::dist::zero::consolidate(&dir)?;
            serde_json::json!({"dir": dir, "params": params, "elements": elements, "step": step})
                .to_string()
        }
        Task::Export(opts) => serde_json::to_string(&trainer::export::run(&opts)?)?,
        Task::Serve(settings) => {
            serve(*settings)?;
            "trainer serve stopped".into()
        }
        Task::Sft(opts) => serde_json::to_string(&trainer::sft::run(&opts)?)?,
        Task::Info => format!(
            "cuda available: {}, devices: {}, cudnn: {}",
            tch::Cuda::is_available(),
            tch::Cuda::device_count(),
            tch::Cuda::cudnn_is_available()
        ),
    })
}

/// `trainer serve`: load the policy, start the publisher, serve until Ctrl-C / SIGTERM.
fn serve(s: ServeSettings) -> anyhow::Result<()> {
    if let Some(n) = s.threads {
        tch::set_num_threads(n);
    }
    tracing::info!(
        hash = %s.load.settings.hash(),
        settings = %serde_json::to_string(&s.load.settings).unwrap_or_default(),
        "training settings from the flags (until POST /v1/settings)"
    );
    let loaded = load::load(&s.load)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let publisher = match s.publish {
            Some(p) => Some(publisher(p).await?),
            None => None,
        };
        let cfg = ServeConfig {
            bind: s.bind,
            served_name: s.served_name,
            checkpoint_dir: s.checkpoint_dir,
            checkpoint_every: s.checkpoint_every,
            max_body_bytes: s.max_body_bytes,
            max_model_len: loaded.max_model_len,
            api_token: s.api_token,
        };
        let state = AppState::new(
            loaded.policy,
            loaded.tokenizer,
            loaded.chat_template,
            loaded.eos,
            cfg,
            publisher,
        );
        state.set_load_options(s.load);
        trainer::service::serve(state).await?;
        Ok(())
    })
}

/// The publish directory made absolute and cleaned of interrupted writes, and each server's
/// kind detected (vLLM or SGLang).
async fn publisher(p: PublishSettings) -> anyhow::Result<Publisher> {
    std::fs::create_dir_all(&p.dir)?;
    let root = std::fs::canonicalize(&p.dir)?;
    trainer::checkpoint::clean_partial(&root);
    let http = trainer::publish::http_client();
    let mut targets = Vec::new();
    for url in p.urls {
        let kind = detect_kind(&http, &url).await;
        targets.push(PublishTarget { url, kind });
    }
    Ok(Publisher::new(PublishConfig {
        root,
        name: p.name,
        window: p.window,
        retries: p.retries,
        targets,
        lora: p.lora,
    }))
}
