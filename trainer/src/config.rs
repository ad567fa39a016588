//! The `trainer` binary's settings, built from the parsed command line (`cli`): each
//! subcommand's options as the library takes them, checked before any work starts, with errors
//! that name the flag, the value given and what is allowed.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::bail;

use crate::bench::BenchSpec;
use crate::cli::{Cli, Command, ExportArgs, ServeArgs, TokenizerCommand};
use crate::export::ExportOptions;
use crate::model::{LoraConfig, Qwen3Config};
use crate::service::ApiToken;
use crate::service::auth::{TOKEN_ENV, check_bind};
use crate::service::load::LoadOptions;
use crate::sft::SftOptions;
use crate::train::TrainConfig;

/// What the binary was asked to do, with its settings checked.
#[derive(Debug)]
pub enum Task {
    /// `trainer tokenizer train`.
    TrainTokenizer {
        corpus: PathBuf,
        vocab: usize,
        out: PathBuf,
        split_digits: bool,
    },
    /// `trainer init`.
    Init {
        config: PathBuf,
        tokenizer: PathBuf,
        out: PathBuf,
        seed: i64,
    },
    /// `trainer info` (`--cpu-dtype`: the CPU's faster parameter dtype alone).
    Info { cpu_dtype: bool },
    /// `trainer average`.
    Average { out: PathBuf, dirs: Vec<PathBuf> },
    /// `trainer consolidate`.
    Consolidate { dir: PathBuf },
    /// `trainer export`.
    Export(Box<ExportOptions>),
    /// `trainer sft`.
    Sft(Box<SftOptions>),
    /// `trainer serve`.
    Serve(Box<ServeSettings>),
    /// `trainer bench`.
    Bench(Box<BenchSpec>),
    /// `trainer plan`.
    Plan(Box<crate::plan::PlanSpec>),
}

/// `trainer serve`: how to build the policy, where to listen, what to checkpoint and publish.
#[derive(Debug)]
pub struct ServeSettings {
    /// libtorch intra-op threads on CPU; `None`: libtorch's default.
    pub threads: Option<i32>,
    /// How the policy is built (and rebuilt by `POST /v1/restore`).
    pub load: LoadOptions,
    pub bind: SocketAddr,
    pub served_name: String,
    pub checkpoint_dir: Option<PathBuf>,
    pub checkpoint_every: u64,
    pub max_body_bytes: usize,
    pub prefix_cache_tokens: usize,
    pub decode_attention: crate::model::DecodeAttention,
    /// The batch cache's dtype (`--kv-cache-dtype`); `None`: the weights'.
    pub kv_cache_kind: Option<tch::Kind>,
    /// The bearer token every route but `/health` requires (`TRAINER_API_TOKEN`); needed to
    /// bind to anything but loopback.
    pub api_token: Option<ApiToken>,
    /// Publishing each new version to inference servers; `None`: no publishing.
    pub publish: Option<PublishSettings>,
    /// Data-parallel ranks (`--nproc-per-node` and friends).
    pub dist: DistSettings,
}

/// `trainer serve`'s data-parallel layout.
#[derive(Debug, Clone, PartialEq)]
pub struct DistSettings {
    pub nproc_per_node: usize,
    pub nnodes: usize,
    pub node_rank: usize,
    /// `None`: auto (NCCL on CUDA, else gloo).
    pub backend: Option<crate::dist::BackendKind>,
    pub timeout: std::time::Duration,
    pub zero: crate::dist::zero::ZeroStage,
}

/// `--publish-*`: where versions are written and which servers load them.
#[derive(Debug, Clone)]
pub struct PublishSettings {
    /// `--publish-dir` as given (created and made absolute at start).
    pub dir: PathBuf,
    pub urls: Vec<String>,
    pub name: String,
    pub window: usize,
    pub retries: u32,
    /// LoRA adapters (else full weights).
    pub lora: bool,
    /// `--publish-route nccl`: the address the servers reach this trainer at.
    pub nccl: Option<String>,
}

impl Task {
    /// Check the parsed command line and build the settings its subcommand runs with.
    pub fn from_cli(cli: Cli) -> anyhow::Result<Self> {
        Ok(match cli.command {
            Command::Tokenizer {
                command:
                    TokenizerCommand::Train {
                        corpus,
                        vocab,
                        out,
                        split_digits,
                    },
            } => Task::TrainTokenizer {
                corpus,
                vocab,
                out,
                split_digits,
            },
            Command::Init {
                config,
                tokenizer,
                out,
                seed,
            } => Task::Init {
                config,
                tokenizer,
                out,
                seed,
            },
            Command::Info { cpu_dtype } => Task::Info { cpu_dtype },
            Command::Average { out, dirs } => Task::Average { out, dirs },
            Command::Consolidate { dir } => Task::Consolidate { dir },
            Command::Export(a) => Task::Export(Box::new(export_options(*a)?)),
            Command::Plan {
                config,
                world_size,
                seq_tokens,
                logit_chunk,
                lora_r,
            } => {
                if world_size == 0 || seq_tokens == 0 || logit_chunk == 0 {
                    bail!(
                        "--world-size {world_size}, --seq-tokens {seq_tokens} and \
                         --logit-chunk {logit_chunk} must be at least 1"
                    );
                }
                Task::Plan(Box::new(crate::plan::PlanSpec {
                    config: Qwen3Config::from_file(&config)?,
                    world_size,
                    seq_tokens,
                    logit_chunk,
                    lora_r,
                }))
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
                dtype,
                peak_flops,
                entropy_bonus,
                shared_prefix,
            } => {
                if shared_prefix >= seq_len {
                    bail!(
                        "--shared-prefix {shared_prefix} must be under --seq-len {seq_len} \
                         (every row keeps a position of its own)"
                    );
                }
                let device = parse_device(&device)?;
                let kind = parse_dtype(&dtype)?.unwrap_or_else(|| crate::default_kind(device));
                Task::Bench(Box::new(BenchSpec {
                    config: Qwen3Config::from_file(&config)?,
                    lora: lora_config(lora_r, None),
                    seqs,
                    seq_len,
                    steps,
                    warmup,
                    grad_checkpoint,
                    device,
                    kind,
                    peak_flops,
                    entropy_bonus,
                    shared_prefix,
                }))
            }
            Command::Sft {
                data,
                copy_rows,
                copy_length,
                model,
                out,
                epochs,
                batch,
                lr,
                weight_decay,
                max_len,
                seed,
                device,
                dtype,
                grad_checkpoint,
                nproc_per_node,
                dist_timeout_secs,
                schedule,
                warmup_steps,
                save_every,
                stop_after,
            } => {
                let cosine = match schedule.as_str() {
                    "constant" => false,
                    "cosine" => true,
                    other => bail!("--schedule = {other:?}; allowed: constant, cosine"),
                };
                if nproc_per_node == 0 || dist_timeout_secs == 0 {
                    bail!(
                        "--nproc-per-node = {nproc_per_node}, --dist-timeout-secs = \
                         {dist_timeout_secs}; allowed: 1 or more each"
                    );
                }
                if !(0.0..1.0).contains(&weight_decay) || lr * weight_decay >= 1.0 {
                    bail!(
                        "--weight-decay = {weight_decay}; allowed: 0 <= it < 1 (and lr x it < 1)"
                    );
                }
                let kind = parse_dtype(&dtype)?;
                let mut train = TrainConfig::default();
                train.optim.lr = lr;
                train.optim.weight_decay = weight_decay;
                train.grad_checkpoint = grad_checkpoint;
                train.loss.kl_coef = 0.0; // SFT: no reference policy
                Task::Sft(Box::new(SftOptions {
                    data,
                    copy_rows,
                    copy_length,
                    model_dir: model,
                    out,
                    epochs,
                    batch,
                    max_len,
                    train,
                    device: parse_device(&device)?,
                    kind,
                    seed,
                    nproc_per_node,
                    dist_timeout: std::time::Duration::from_secs(dist_timeout_secs),
                    cosine,
                    warmup_steps,
                    save_every,
                    stop_after,
                }))
            }
            Command::Serve(a) => {
                let token = std::env::var(TOKEN_ENV).ok();
                Task::Serve(Box::new(ServeSettings::from_args(*a, token.as_deref())?))
            }
        })
    }
}

impl ServeSettings {
    /// The settings of `trainer serve`'s arguments, with `token` the value of
    /// `TRAINER_API_TOKEN` (unset or empty: none). Bound beyond loopback without a token it
    /// refuses to start.
    fn from_args(a: ServeArgs, token: Option<&str>) -> anyhow::Result<Self> {
        let api_token = ApiToken::from_value(token)?;
        check_bind(a.bind, api_token.as_ref())?;
        let device = parse_device(&a.device)?;
        if a.threads < 0 {
            bail!("--threads = {}; allowed: 0 (default) or more", a.threads);
        }
        let lora = lora_config(a.lora_r, a.lora_alpha);
        let backend = match a.dist_backend.as_str() {
            "auto" => None,
            "gloo" => Some(crate::dist::BackendKind::Gloo),
            "nccl" => Some(crate::dist::BackendKind::Nccl),
            other => bail!("--dist-backend = {other:?}; allowed: auto, gloo, nccl"),
        };
        if a.nproc_per_node == 0 || a.nnodes == 0 || a.node_rank >= a.nnodes {
            bail!(
                "--nproc-per-node = {}, --nnodes = {}, --node-rank = {}; allowed: at least 1 \
                 rank and 1 node, and 0 <= --node-rank < --nnodes",
                a.nproc_per_node,
                a.nnodes,
                a.node_rank
            );
        }
        if a.dist_timeout_secs == 0 {
            bail!("--dist-timeout-secs = 0; allowed: 1 or more");
        }
        let dist = DistSettings {
            nproc_per_node: a.nproc_per_node,
            nnodes: a.nnodes,
            node_rank: a.node_rank,
            backend,
            timeout: std::time::Duration::from_secs(a.dist_timeout_secs),
            zero: a.zero,
        };
        let nccl = match a.publish_route.as_str() {
            "disk" => false,
            "nccl" if lora.is_some() => bail!(
                "--publish-route = nccl with --lora-r {}: the NCCL route carries full weights; \
                 LoRA adapters are hot-loaded from --publish-dir (use --publish-route disk)",
                a.lora_r
            ),
            "nccl" => true,
            other => bail!("--publish-route = {other:?}; allowed: disk, nccl"),
        };
        let publish = if a.publish_urls.is_empty() && a.publish_dir.is_none() {
            None
        } else {
            let dir = match (&a.publish_dir, nccl) {
                (Some(d), _) => d.clone(),
                // The NCCL route writes nothing; versions are still named under a root.
                (None, true) => std::env::temp_dir().join("rubricem-publish"),
                (None, false) => {
                    bail!("--publish-url needs --publish-dir (a directory the servers can read)")
                }
            };
            Some(PublishSettings {
                dir,
                urls: a.publish_urls.clone(),
                name: a.publish_name.clone(),
                window: a.publish_window,
                retries: a.publish_retries,
                lora: lora.is_some(),
                nccl: nccl.then(|| a.publish_nccl_address.clone()),
            })
        };
        // The flags' settings: what the trainer trains with until a client sends its own
        // (`POST /v1/settings`). A KL term with a full fine-tune keeps a frozen reference copy.
        let mut train = TrainConfig::default();
        train.optim.lr = a.lr;
        train.loss.kl_coef = a.kl_coef;
        train.optim.max_grad_norm = a.max_grad_norm;
        train.micro_batch_tokens = a.micro_batch_tokens;
        let mut settings = crate::settings::from_config(&train, lora.as_ref());
        settings.param_dtype = match parse_dtype(&a.dtype)? {
            None => wire::settings::ParamDtype::Auto,
            Some(tch::Kind::BFloat16) => wire::settings::ParamDtype::Bf16,
            Some(_) => wire::settings::ParamDtype::F32,
        };
        crate::settings::resolve(&settings).map_err(|e| {
            anyhow::anyhow!(
                "{e} (from --lr, --kl-coef, --max-grad-norm, --micro-batch-tokens, --lora-r, \
                 --lora-alpha)"
            )
        })?;
        Ok(Self {
            threads: (a.threads > 0).then_some(a.threads),
            load: LoadOptions {
                model_dir: a.model,
                settings,
                device,
                seed: a.seed,
                resume_from: if a.resume {
                    a.checkpoint_dir.clone()
                } else {
                    None
                },
            },
            dist,
            bind: a.bind,
            served_name: a.served_name,
            checkpoint_dir: a.checkpoint_dir,
            checkpoint_every: a.checkpoint_every,
            max_body_bytes: a.max_body_mb << 20,
            prefix_cache_tokens: a.prefix_cache_tokens,
            decode_attention: match a.decode_attention.as_str() {
                "masked" => crate::model::DecodeAttention::Masked,
                "rows" => crate::model::DecodeAttention::Rows,
                _ => crate::model::DecodeAttention::Auto,
            },
            kv_cache_kind: parse_dtype(&a.kv_cache_dtype).map_err(|_| {
                anyhow::anyhow!(
                    "--kv-cache-dtype = {:?}; allowed: auto, f32, bf16",
                    a.kv_cache_dtype
                )
            })?,
            api_token,
            publish,
        })
    }
}

/// `trainer export`'s arguments checked into the library's options.
fn export_options(a: ExportArgs) -> anyhow::Result<ExportOptions> {
    let dtype = a.dtype.parse().map_err(anyhow::Error::msg)?;
    if a.max_shard_bytes == 0 {
        bail!("--max-shard-bytes = 0; allowed: 1 or more");
    }
    Ok(ExportOptions {
        checkpoint: a.checkpoint,
        version: a.version,
        out: a.out,
        base: a.base,
        base_name: a.base_name,
        dtype,
        merge: a.merge,
        card_extra: a.card_extra,
        max_shard_bytes: a.max_shard_bytes,
    })
}

/// `--lora-r` (0: full fine-tune) with `--lora-alpha` (default 2r).
fn lora_config(r: i64, alpha: Option<f64>) -> Option<LoraConfig> {
    (r > 0).then(|| LoraConfig {
        r,
        alpha: alpha.unwrap_or(2.0 * r as f64),
        ..Default::default()
    })
}

/// `--device`: cpu, cuda (the first GPU) or auto (CUDA when libtorch sees a GPU).
pub fn parse_device(s: &str) -> anyhow::Result<tch::Device> {
    Ok(match s {
        "cpu" => tch::Device::Cpu,
        "cuda" if !tch::Cuda::is_available() => bail!(
            "--device = \"cuda\", but libtorch sees no CUDA device (no driver or GPU here, or a \
             CPU-only libtorch); allowed here: cpu, auto"
        ),
        "cuda" => tch::Device::Cuda(0),
        "auto" => crate::default_device(),
        other => bail!("--device = {other:?}; allowed: cpu, cuda, auto"),
    })
}

/// `--dtype`: auto (`None`: [`crate::default_kind`] of the device), f32 or bf16 (parameters in
/// bf16; the optimizer keeps fp32 master weights and moments).
pub fn parse_dtype(s: &str) -> anyhow::Result<Option<tch::Kind>> {
    Ok(match s {
        "auto" => None,
        "f32" => Some(tch::Kind::Float),
        "bf16" => Some(tch::Kind::BFloat16),
        other => bail!("--dtype = {other:?}; allowed: auto, f32, bf16"),
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn cuda_without_a_device_is_refused_naming_it() {
        // Before, `trainer sft --device cuda` on a machine without a GPU panicked in the first
        // tensor copy; now the command line is refused.
        match parse_device("cuda") {
            Ok(d) => assert!(tch::Cuda::is_available() && d == tch::Device::Cuda(0)),
            Err(e) => {
                assert!(!tch::Cuda::is_available());
                assert!(e.to_string().contains("--device = \"cuda\""), "{e}");
            }
        }
        assert!(
            parse_device("tpu")
                .unwrap_err()
                .to_string()
                .contains("cpu, cuda, auto")
        );
    }

    fn serve(args: &[&str]) -> anyhow::Result<ServeSettings> {
        serve_with_token(args, None)
    }

    /// As `trainer serve ARGS` with `TRAINER_API_TOKEN` = `token`.
    fn serve_with_token(args: &[&str], token: Option<&str>) -> anyhow::Result<ServeSettings> {
        let mut argv = vec!["trainer", "serve", "--model", "/m"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv)?.command {
            Command::Serve(a) => ServeSettings::from_args(*a, token),
            other => anyhow::bail!("not serve: {other:?}"),
        }
    }

    #[test]
    fn serve_beyond_loopback_needs_a_token() {
        let s = serve(&["--device", "cpu"]).unwrap();
        assert!(s.api_token.is_none());
        let e = serve(&["--device", "cpu", "--bind", "0.0.0.0:8100"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--bind = 0.0.0.0:8100") && e.contains("TRAINER_API_TOKEN"),
            "{e}"
        );
        let token = "0123456789abcdef-token";
        let s =
            serve_with_token(&["--device", "cpu", "--bind", "0.0.0.0:8100"], Some(token)).unwrap();
        let t = s.api_token.unwrap();
        assert!(t.matches(token.as_bytes()));
        assert!(!format!("{t:?}").contains(token));
        // A token on loopback is required too; a short one is refused by length.
        assert!(
            serve_with_token(&["--device", "cpu"], Some(token))
                .unwrap()
                .api_token
                .is_some()
        );
        let e = serve_with_token(&["--device", "cpu"], Some("short"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("TRAINER_API_TOKEN is 5 bytes"), "{e}");
    }

    #[test]
    fn export_flags_and_checks() {
        let parse = |args: &[&str]| -> anyhow::Result<ExportOptions> {
            let mut argv = vec!["trainer", "export", "--checkpoint", "/ck", "--out", "/o"];
            argv.extend_from_slice(args);
            match Task::from_cli(Cli::try_parse_from(argv)?)? {
                Task::Export(o) => Ok(*o),
                other => anyhow::bail!("not export: {other:?}"),
            }
        };
        let o = parse(&[]).unwrap();
        assert_eq!(o.dtype, crate::export::ExportDtype::Keep);
        assert!(!o.merge && o.version.is_none() && o.base.is_none());
        assert_eq!(o.max_shard_bytes, crate::export::DEFAULT_MAX_SHARD_BYTES);
        let o = parse(&["--dtype", "bf16", "--merge", "--version", "7"]).unwrap();
        assert_eq!(o.dtype, crate::export::ExportDtype::Bf16);
        assert!(o.merge);
        assert_eq!(o.version, Some(7));
        let e = parse(&["--dtype", "int8"]).unwrap_err().to_string();
        assert!(
            e.contains("--dtype = \"int8\"") && e.contains("bf16, f32, keep"),
            "{e}"
        );
        let e = parse(&["--max-shard-bytes", "0"]).unwrap_err().to_string();
        assert!(e.contains("--max-shard-bytes = 0"), "{e}");
    }

    #[test]
    fn sft_schedule_flags() {
        let parse = |args: &[&str]| -> anyhow::Result<crate::sft::SftOptions> {
            let mut argv = vec![
                "trainer", "sft", "--data", "/d", "--model", "/m", "--out", "/o",
            ];
            argv.extend_from_slice(args);
            match Task::from_cli(Cli::try_parse_from(argv)?)? {
                Task::Sft(o) => Ok(*o),
                other => anyhow::bail!("not sft: {other:?}"),
            }
        };
        let o = parse(&[]).unwrap();
        assert!(!o.cosine && o.warmup_steps == 0, "constant by default");
        assert_eq!(o.kind, None, "the device's dtype unless asked");
        assert_eq!(
            parse(&["--dtype", "f32"]).unwrap().kind,
            Some(tch::Kind::Float)
        );
        assert_eq!(
            parse(&["--dtype", "bf16"]).unwrap().kind,
            Some(tch::Kind::BFloat16)
        );
        let e = parse(&["--dtype", "fp8"]).unwrap_err().to_string();
        assert!(
            e.contains("--dtype = \"fp8\"") && e.contains("auto, f32, bf16"),
            "{e}"
        );
        assert_eq!(o.train.optim.weight_decay, 0.0, "no decay unless asked");
        let o = parse(&["--weight-decay", "0.1"]).unwrap();
        assert_eq!(o.train.optim.weight_decay, 0.1);
        let e = parse(&["--weight-decay=-0.1"]).unwrap_err().to_string();
        assert!(e.contains("--weight-decay = -0.1"), "{e}");
        let o = parse(&["--schedule", "cosine", "--warmup-steps", "10"]).unwrap();
        assert!(o.cosine && o.warmup_steps == 10);
        let e = parse(&["--schedule", "linear"]).unwrap_err().to_string();
        assert!(
            e.contains("--schedule = \"linear\"") && e.contains("constant, cosine"),
            "{e}"
        );
        assert_eq!(o.copy_rows, 0, "no copy sequences unless asked");
        let o = parse(&["--copy-rows", "64", "--copy-length", "16"]).unwrap();
        assert_eq!((o.copy_rows, o.copy_length), (64, 16));
        // Copy sequences alone need no --data.
        let argv = [
            "trainer",
            "sft",
            "--copy-rows",
            "8",
            "--model",
            "/m",
            "--out",
            "/o",
        ];
        match Task::from_cli(Cli::try_parse_from(argv).unwrap()).unwrap() {
            Task::Sft(o) => assert!(o.data.is_none() && o.copy_rows == 8),
            other => panic!("not sft: {other:?}"),
        }
    }

    #[test]
    fn launcher_and_publish_route_flags_are_checked() {
        let s = serve(&["--device", "cpu", "--nproc-per-node", "4", "--zero", "2"]).unwrap();
        assert_eq!(s.dist.nproc_per_node, 4);
        assert_eq!(s.dist.zero, crate::dist::zero::ZeroStage::Two);
        assert_eq!(s.dist.backend, None, "auto");
        for (args, want) in [
            (&["--nproc-per-node", "0"][..], "--nproc-per-node = 0"),
            (
                &["--nnodes", "2", "--node-rank", "2"][..],
                "--node-rank = 2",
            ),
            (&["--dist-backend", "mpi"][..], "--dist-backend = \"mpi\""),
            (&["--dist-timeout-secs", "0"][..], "--dist-timeout-secs = 0"),
            (
                &[
                    "--publish-route",
                    "nccl",
                    "--lora-r",
                    "8",
                    "--publish-url",
                    "http://v:8000",
                ][..],
                "LoRA adapters are hot-loaded",
            ),
            (
                &["--publish-route", "rdma"][..],
                "--publish-route = \"rdma\"",
            ),
        ] {
            let mut argv = vec!["--device", "cpu"];
            argv.extend_from_slice(args);
            let e = serve(&argv).unwrap_err().to_string();
            assert!(e.contains(want), "{args:?}: {e}");
        }
        // The NCCL route needs no directory; the disk route does.
        let s = serve(&[
            "--device",
            "cpu",
            "--publish-route",
            "nccl",
            "--publish-url",
            "http://v:8000",
        ])
        .unwrap();
        let p = s.publish.unwrap();
        assert_eq!(p.nccl.as_deref(), Some("127.0.0.1"));
        let e = serve(&["--device", "cpu", "--publish-url", "http://v:8000"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--publish-dir"), "{e}");
    }

    #[test]
    fn serve_defaults_and_checks() {
        let s = serve(&["--device", "cpu"]).unwrap();
        assert_eq!(s.bind.to_string(), "127.0.0.1:8100");
        assert_eq!(s.served_name, "policy");
        assert_eq!(s.max_body_bytes, 4096 << 20);
        let st = &s.load.settings;
        assert_eq!(st.finetune, wire::settings::Finetune::Full);
        assert!(s.publish.is_none() && s.threads.is_none());
        assert_eq!((st.lr, st.kl_beta), (1e-5, 0.0));
        assert_eq!(st.micro_batch_tokens, 16384);
        // The flags keep their behaviour: the trainer's own config defaults beside them.
        let r = crate::settings::resolve(st).unwrap();
        let mut want = TrainConfig::default();
        want.optim.lr = 1e-5;
        want.loss.kl_coef = 0.0;
        assert_eq!(r.train, want);
        assert!(r.lora.is_none() && !r.reference_copy);
        assert_eq!(r.kind, None, "the device's dtype unless asked");
        let s = serve(&["--device", "cpu", "--dtype", "bf16"]).unwrap();
        assert_eq!(
            s.load.settings.param_dtype,
            wire::settings::ParamDtype::Bf16
        );
        assert_eq!(
            crate::settings::resolve(&s.load.settings).unwrap().kind,
            Some(tch::Kind::BFloat16)
        );
        assert_eq!(
            s.kv_cache_kind, None,
            "the cache in the weights' dtype unless asked"
        );
        let s = serve(&["--device", "cpu", "--kv-cache-dtype", "bf16"]).unwrap();
        assert_eq!(s.kv_cache_kind, Some(tch::Kind::BFloat16));
        assert_eq!(
            s.load.settings.param_dtype,
            wire::settings::ParamDtype::Auto
        );
        let e = serve(&["--device", "cpu", "--kv-cache-dtype", "fp8"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("fp8") && e.contains("bf16"), "{e}");
        let e = serve(&["--device", "cpu", "--dtype", "fp8"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--dtype = \"fp8\"") && e.contains("auto, f32, bf16"),
            "{e}"
        );

        let s = serve(&["--device", "cpu", "--lora-r", "8", "--threads", "2"]).unwrap();
        let l = crate::settings::resolve(&s.load.settings)
            .unwrap()
            .lora
            .unwrap();
        assert_eq!((l.r, l.alpha), (8, 16.0));
        assert_eq!(s.threads, Some(2));
        // A full fine-tune with a KL term keeps a reference copy of the initial weights.
        let s = serve(&["--device", "cpu", "--kl-coef", "0.001"]).unwrap();
        assert!(
            crate::settings::resolve(&s.load.settings)
                .unwrap()
                .reference_copy
        );
        let e = serve(&["--device", "cpu", "--lr", "2"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("trainer.lr = 2") && e.contains("--lr"), "{e}");

        let e = serve(&["--device", "tpu"]).unwrap_err().to_string();
        assert!(
            e.contains("--device = \"tpu\"") && e.contains("cpu, cuda, auto"),
            "{e}"
        );
        let e = serve(&["--device", "cpu", "--threads=-1"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--threads = -1"), "{e}");
        let e = serve(&["--device", "cpu", "--publish-url", "http://a"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs --publish-dir"), "{e}");
        let s = serve(&[
            "--device",
            "cpu",
            "--publish-url",
            "http://a,http://b",
            "--publish-dir",
            "/p",
        ])
        .unwrap();
        let p = s.publish.unwrap();
        assert_eq!(p.urls, ["http://a", "http://b"]);
        assert!(!p.lora);
    }
}
