//! The `trainer` binary: parse the command line (`trainer::cli`), check it into settings
//! (`trainer::config`), set up tracing, run the subcommand. Results go to stdout (JSON for
//! `bench`, `sft` and `export`), diagnostics to stderr.

use std::process::ExitCode;

use clap::Parser;
use trainer::cli::Cli;
use trainer::config::{PublishSettings, ServeSettings, Task};
use trainer::publish::{PublishConfig, PublishTarget, Publisher, ServerKind, detect_kind};
use trainer::service::{AppState, ServeConfig, load};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let heap = trainer::alloc::keep_freed_memory();
    tracing::debug!(?heap, "glibc heap thresholds");
    let cli = Cli::parse();
    trainer::kernels::set_own_causal_attention(cli.causal_attention == "auto");
    match Task::from_cli(cli).and_then(run) {
        Ok(msg) => {
            #[allow(clippy::print_stdout)]
            if !msg.is_empty() {
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
        Task::TrainTokenizer {
            corpus,
            vocab,
            out,
            split_digits,
        } => {
            let n = trainer::smallmodel::train_tokenizer_with(&corpus, vocab, &out, split_digits)?;
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
        Task::Average { out, dirs } => serde_json::to_string(&trainer::average::run(&dirs, &out)?)?,
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
        Task::Sft(opts) => {
            if opts.nproc_per_node > 1 && std::env::var_os("WORLD_SIZE").is_none() {
                launch_ranks(opts.nproc_per_node, 1, 0)?;
                return Ok(format!("sft written to {}", opts.out.display()));
            }
            let report = trainer::sft::run(&opts)?;
            if report.rank != 0 {
                return Ok(String::new());
            }
            serde_json::to_string(&report)?
        }
        Task::Info { cpu_dtype: true } => trainer::cpu_param_dtype().to_string(),
        Task::Info { cpu_dtype: false } => format!(
            "cuda available: {}, devices: {}, cudnn: {}, cpu parameter dtype: {}",
            tch::Cuda::is_available(),
            tch::Cuda::device_count(),
            tch::Cuda::cudnn_is_available(),
            trainer::cpu_param_dtype()
        ),
    })
}

/// `trainer serve`: load the policy, start the publisher, serve until Ctrl-C / SIGTERM.
fn serve(mut s: ServeSettings) -> anyhow::Result<()> {
    if s.dist.nproc_per_node * s.dist.nnodes > 1 && std::env::var_os("WORLD_SIZE").is_none() {
        return launch_ranks(s.dist.nproc_per_node, s.dist.nnodes, s.dist.node_rank);
    }
    if let Some(n) = s.threads {
        tch::set_num_threads(n);
    }
    let env = trainer::dist::DistEnv::from_env()?.filter(|e| e.world > 1);
    if let Some(env) = &env {
        s.load.device = env.device(s.load.device);
    }
    tracing::info!(
        hash = %s.load.settings.hash(),
        settings = %serde_json::to_string(&s.load.settings).unwrap_or_default(),
        "training settings from the flags (until POST /v1/settings)"
    );
    let mut loaded = load::load(&s.load)?;
    if let Some(env) = env {
        let group = env.join(s.load.device, s.dist.backend, s.dist.timeout)?;
        loaded.policy.trainer.set_collective(Box::new(group));
        loaded.policy.trainer.set_zero(s.dist.zero)?;
        if let Some(ck) = &loaded.resumed {
            load::restore_sharded_optimizer(&mut loaded.policy, ck)?;
        }
        if env.rank != 0 {
            trainer::service::follower::follow(loaded.policy, s.load)?;
            return Ok(());
        }
    }
    if s.dist.zero != trainer::dist::zero::ZeroStage::Off
        && loaded.policy.trainer.collective().is_none()
    {
        tracing::warn!("--zero needs more than one rank; this trainer keeps its optimizer whole");
    }
    if loaded.policy.trainer.collective().is_none()
        && let Some(ck) = &loaded.resumed
    {
        load::restore_sharded_optimizer(&mut loaded.policy, ck)?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let publisher = match s.publish {
            Some(p) => Some(publisher(p, s.load.device).await?),
            None => None,
        };
        let cfg = ServeConfig {
            bind: s.bind,
            served_name: s.served_name,
            checkpoint_dir: s.checkpoint_dir,
            checkpoint_every: s.checkpoint_every,
            max_body_bytes: s.max_body_bytes,
            prefix_cache_tokens: s.prefix_cache_tokens,
            decode_attention: s.decode_attention,
            kv_cache_kind: s.kv_cache_kind,
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

/// `--nproc-per-node N`: start this node's ranks (this binary, same arguments, torchrun's
/// environment) and watch them; Ctrl-C or SIGTERM stops them all.
fn launch_ranks(nproc_per_node: usize, nnodes: usize, node_rank: usize) -> anyhow::Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let port = std::env::var("MASTER_PORT")
        .ok()
        .map(|v| v.parse::<u16>())
        .transpose()
        .map_err(|e| anyhow::anyhow!("MASTER_PORT: {e}"))?;
    let spec = trainer::dist::launch::LaunchSpec {
        nproc_per_node,
        nnodes,
        node_rank,
        master_addr: std::env::var("MASTER_ADDR").unwrap_or_else(|_| "127.0.0.1".into()),
        master_port: port,
        grace: std::time::Duration::from_secs(10),
    };
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let flag = stop.clone();
        tokio::spawn(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                Some(()) = async { match term.as_mut() { Some(t) => t.recv().await, None => None } } => {}
            }
            flag.store(true, Ordering::SeqCst);
        });
        tokio::task::spawn_blocking(move || {
            trainer::dist::launch::launch(&spec, &args, || stop.load(Ordering::SeqCst))
        })
        .await?
        .map_err(anyhow::Error::from)
    })
}

/// The publish directory made absolute and cleaned of interrupted writes, and each server's
/// kind detected (vLLM or SGLang).
async fn publisher(p: PublishSettings, device: tch::Device) -> anyhow::Result<Publisher> {
    std::fs::create_dir_all(&p.dir)?;
    let root = std::fs::canonicalize(&p.dir)?;
    trainer::checkpoint::clean_partial(&root);
    let http = trainer::publish::http_client();
    let mut targets = Vec::new();
    for url in p.urls {
        let kind = detect_kind(&http, &url).await;
        targets.push(PublishTarget { url, kind });
    }
    let publisher = Publisher::new(PublishConfig {
        root,
        name: p.name,
        window: p.window,
        retries: p.retries,
        targets: targets.clone(),
        lora: p.lora,
    });
    let Some(address) = p.nccl else {
        return Ok(publisher);
    };
    if let Some(t) = targets.iter().find(|t| t.kind != ServerKind::Vllm) {
        anyhow::bail!(
            "--publish-route nccl: {} is not a vLLM server (the NCCL weight-transfer engine is vLLM's)",
            t.url
        );
    }
    Ok(
        publisher.with_route(Box::new(trainer::dist::vllm::NcclRoute::new(
            &address,
            trainer::dist::vllm::DEFAULT_UNIQUE_ID_MODULE,
            nccl_comm(device)?,
            std::time::Duration::from_secs(600),
        ))),
    )
}

/// The NCCL communicator of the weight-transfer route, on this trainer's CUDA device.
#[cfg(feature = "nccl")]
fn nccl_comm(device: tch::Device) -> anyhow::Result<Box<dyn trainer::dist::vllm::WeightComm>> {
    match device {
        tch::Device::Cuda(i) => Ok(Box::new(trainer::dist::vllm::NcclComm::new(i as i32))),
        d => anyhow::bail!("--publish-route nccl needs a CUDA device (--device cuda), not {d:?}"),
    }
}

#[cfg(not(feature = "nccl"))]
fn nccl_comm(_device: tch::Device) -> anyhow::Result<Box<dyn trainer::dist::vllm::WeightComm>> {
    anyhow::bail!(
        "--publish-route nccl: this trainer was built without the `nccl` feature (a CUDA build: \
         cargo build --release -p trainer --features nccl); use --publish-route disk"
    )
}
