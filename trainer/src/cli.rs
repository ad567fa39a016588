//! The `trainer` binary's command line: subcommands, flags, their environment variables and
//! defaults (clap). `config` turns a parsed command into checked settings.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "trainer",
    version,
    about = "RubricEM trainer (Qwen3 in libtorch)"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// The kernel of causal attention in bf16 on the CPU (training steps, prefill): `auto`, the
    /// trainer's own exact causal kernel where the CPU has AVX512-BF16 (`kernels::causal_attention`),
    /// else libtorch's flash kernel; `libtorch`, always libtorch's (for comparisons,
    /// BENCHMARKS.md issue 25 session 88).
    #[arg(long, global = true, env = "TRAINER_CAUSAL_ATTENTION", default_value = "auto",
          value_parser = ["auto", "libtorch"])]
    pub causal_attention: String,
}

#[derive(Debug, Subcommand)]
pub enum Command {
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
    /// Print what libtorch sees (version of the build, CUDA devices) and the parameter dtype a
    /// CPU training step runs fastest in here (bf16 with AMX-BF16 or AMD's AVX512-BF16, else
    /// f32; BENCHMARKS.md issue 25 sessions 77-88).
    Info {
        /// Print only that dtype, `bf16` or `f32`, for scripts (`scripts/guided.sh`'s
        /// `GUIDED_DTYPE=auto`).
        #[arg(long)]
        cpu_dtype: bool,
    },
    /// Average the weights of policy versions (full fine-tune checkpoint directories or model
    /// directories, at least two) into one f32 safetensors file: latest-weight averaging
    /// (LAWA, Kaddour 2022), e.g. a run's last checkpoints. Copy a model directory's config and
    /// tokenizer beside it to serve the mean. Prints JSON.
    Average {
        /// The safetensors file to write (atomically), e.g. DIR/model.safetensors.
        #[arg(long)]
        out: PathBuf,
        /// The directories to average, each with model.safetensors (or an index and shards).
        #[arg(required = true, num_args = 2..)]
        dirs: Vec<PathBuf>,
    },
    /// Rewrite a ZeRO-sharded optimizer save (optimizer.zero-R-of-N.safetensors from every rank
    /// and optimizer.zero.json) in DIR as the single-file optimizer state a one-process trainer
    /// restores (optimizer.safetensors and optimizer.json). Prints JSON.
    Consolidate {
        #[arg(long, env = "TRAINER_CONSOLIDATE_DIR")]
        dir: PathBuf,
    },
    /// Export one policy version of a checkpoint for transformers, PEFT and vLLM: a Hugging
    /// Face model directory (full fine-tune, or LoRA with --merge) or a PEFT adapter (LoRA),
    /// with the base's tokenizer and chat template, export.json and a model card (README.md).
    /// Written atomically; prints JSON (export.json's content).
    Export(Box<ExportArgs>),
    /// Estimate the per-rank memory of a fine-tune in each parallel layout (LoRA, DDP,
    /// ZeRO-1/2/3) before renting GPUs; prints JSON (GB = 10^9 bytes).
    Plan {
        /// A Qwen3 config.json.
        #[arg(long, env = "TRAINER_PLAN_CONFIG")]
        config: PathBuf,
        /// Ranks (GPUs) in the job.
        #[arg(long, default_value_t = 8)]
        world_size: usize,
        /// Padded tokens per micro-batch on one rank.
        #[arg(long, default_value_t = 16384)]
        seq_tokens: u64,
        /// Positions per chunk of the logits head.
        #[arg(long, default_value_t = 1024)]
        logit_chunk: u64,
        /// LoRA rank for the `lora` row.
        #[arg(long, default_value_t = 16)]
        lora_r: u64,
    },
    /// Supervised warm start on `orchestrator sft-data` output (ChatML JSONL, tool spans
    /// masked); writes a model directory `trainer serve` loads. Prints a JSON report.
    Sft {
        /// The SFT JSONL file (may be left out with --copy-rows).
        #[arg(long, env = "TRAINER_SFT_DATA")]
        data: Option<PathBuf>,
        /// Also train on N synthetic copy sequences (a random span of ordinary tokens that
        /// comes back after random noise, loss on the repeat): the copying a model from random
        /// weights lacks.
        #[arg(long, env = "TRAINER_SFT_COPY_ROWS", default_value_t = 0)]
        copy_rows: usize,
        /// Longest span a copy sequence repeats (spans are half of it up to it).
        #[arg(long, env = "TRAINER_SFT_COPY_LENGTH", default_value_t = 32)]
        copy_length: usize,
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
        /// AdamW's decoupled weight decay (each step multiplies the decayed weights by
        /// 1 - lr x this; norms and biases are not decayed).
        #[arg(long, default_value_t = 0.0)]
        weight_decay: f64,
        /// Rows longer than this many tokens are dropped (and counted).
        #[arg(long, default_value_t = 4096)]
        max_len: usize,
        #[arg(long, env = "TRAINER_SEED", default_value_t = 17)]
        seed: u64,
        #[arg(long, default_value = "auto")]
        device: String,
        /// Parameter dtype: auto (bf16 on CUDA, f32 on CPU), f32 or bf16. f32 on CUDA trains
        /// a small model as the CPU does (a warm start trained on a GPU for CPU runs).
        #[arg(long, default_value = "auto")]
        dtype: String,
        /// Recompute activations in backward (saves memory, costs time).
        #[arg(long)]
        grad_checkpoint: bool,
        /// Data-parallel ranks on this machine (the launcher of `trainer serve`): each step's
        /// batch is split across them by tokens; rank 0 writes the output.
        #[arg(long, env = "TRAINER_NPROC_PER_NODE", default_value_t = 1)]
        nproc_per_node: usize,
        /// Limit of every collective and of the rendezvous, in seconds.
        #[arg(long, env = "TRAINER_DIST_TIMEOUT_SECS", default_value_t = 300)]
        dist_timeout_secs: u64,
        /// Learning-rate schedule: constant, or cosine (linear warm-up over --warmup-steps,
        /// then cosine decay to a tenth of --lr at the last step).
        #[arg(long, env = "TRAINER_SFT_SCHEDULE", default_value = "constant")]
        schedule: String,
        /// Linear warm-up steps (either schedule).
        #[arg(long, env = "TRAINER_SFT_WARMUP_STEPS", default_value_t = 0)]
        warmup_steps: u64,
        /// Every N steps write a checkpoint to OUT.resume/ (weights, AdamW state, step); the
        /// same command run again continues from it exactly. 0: never.
        #[arg(long, env = "TRAINER_SFT_SAVE_EVERY", default_value_t = 0)]
        save_every: usize,
        /// End this invocation after N steps with a checkpoint in OUT.resume/ (OUT is not
        /// written); the same command without it continues.
        #[arg(long)]
        stop_after: Option<usize>,
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
        /// Parameter dtype: auto (bf16 on CUDA, f32 on CPU), f32 or bf16.
        #[arg(long, default_value = "auto")]
        dtype: String,
        /// Peak FLOP/s for MFU, e.g. 989e12 for H100 bf16 dense.
        #[arg(long)]
        peak_flops: Option<f64>,
        /// The entropy bonus's coefficient in the timed step (`trainer.entropy_bonus`; 0 = off),
        /// to time its head path.
        #[arg(long, default_value_t = 0.0)]
        entropy_bonus: f64,
        /// Leading tokens every row shares (a chat batch's system prompt), which the step runs
        /// once for all rows; 0 = rows differ from their first token.
        #[arg(long, default_value_t = 0)]
        shared_prefix: usize,
    },
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Hugging Face model directory (config.json, model.safetensors, tokenizer.json).
    #[arg(long, env = "TRAINER_MODEL")]
    pub model: PathBuf,
    /// Address to listen on (loopback by default).
    #[arg(long, env = "TRAINER_BIND", default_value = "127.0.0.1:8100")]
    pub bind: std::net::SocketAddr,
    /// Model name served on /v1/models.
    #[arg(long, env = "TRAINER_SERVED_NAME", default_value = "policy")]
    pub served_name: String,
    /// LoRA rank; 0 trains all weights.
    #[arg(long, env = "TRAINER_LORA_R", default_value_t = 0)]
    pub lora_r: i64,
    #[arg(long, env = "TRAINER_LORA_ALPHA")]
    pub lora_alpha: Option<f64>,
    #[arg(long, env = "TRAINER_LR", default_value_t = 1e-5)]
    pub lr: f64,
    /// KL3 coefficient to the reference: LoRA's is the base with the adapters off, a full
    /// fine-tune's a frozen copy of --model's weights (kept in memory beside the policy).
    #[arg(long, env = "TRAINER_KL", default_value_t = 0.0)]
    pub kl_coef: f64,
    /// Global gradient-norm clip (0: no clipping).
    #[arg(long, env = "TRAINER_MAX_GRAD_NORM", default_value_t = 1.0)]
    pub max_grad_norm: f64,
    #[arg(long, env = "TRAINER_MICRO_BATCH_TOKENS", default_value_t = 16384)]
    pub micro_batch_tokens: i64,
    /// Checkpoints go here (`step-N`, `latest`).
    #[arg(long, env = "TRAINER_CHECKPOINT_DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Checkpoint every N steps (0: only on POST /v1/checkpoint).
    #[arg(long, env = "TRAINER_CHECKPOINT_EVERY", default_value_t = 0)]
    pub checkpoint_every: u64,
    /// Continue from the latest checkpoint in --checkpoint-dir if there is one.
    #[arg(long, env = "TRAINER_RESUME")]
    pub resume: bool,
    /// Inference servers to publish each new version to (vLLM or SGLang, detected).
    #[arg(
        long = "publish-url",
        env = "TRAINER_PUBLISH_URLS",
        value_delimiter = ','
    )]
    pub publish_urls: Vec<String>,
    /// Where versioned adapters / weights are written for the servers (the disk route and
    /// LoRA adapters).
    #[arg(long, env = "TRAINER_PUBLISH_DIR")]
    pub publish_dir: Option<PathBuf>,
    /// How full weights reach the servers: disk (a directory per version, vLLM's disk
    /// weight-transfer API / SGLang's update_weights_from_disk) or nccl (vLLM's NCCL
    /// weight-transfer engine: the trainer is rank 0 of an NCCL group with every server's
    /// workers; the servers run with VLLM_SERVER_DEV_MODE=1; needs a build with the `nccl`
    /// feature). LoRA adapters are always hot-loaded from --publish-dir.
    #[arg(long, env = "TRAINER_PUBLISH_ROUTE", default_value = "disk")]
    pub publish_route: String,
    /// The address the servers' workers reach this trainer at (NCCL route).
    #[arg(
        long,
        env = "TRAINER_PUBLISH_NCCL_ADDRESS",
        default_value = "127.0.0.1"
    )]
    pub publish_nccl_address: String,
    #[arg(long, env = "TRAINER_PUBLISH_NAME", default_value = "policy")]
    pub publish_name: String,
    /// Versions kept loaded on the servers.
    #[arg(long, env = "TRAINER_PUBLISH_WINDOW", default_value_t = 2)]
    pub publish_window: usize,
    #[arg(long, env = "TRAINER_PUBLISH_RETRIES", default_value_t = 3)]
    pub publish_retries: u32,
    /// Largest accepted request body in MiB.
    #[arg(long, env = "TRAINER_MAX_BODY_MB", default_value_t = 4096)]
    pub max_body_mb: usize,
    /// Tokens of finished sequences' keys and values kept so that a request extending one (a
    /// rollout's next turn: its context plus the tool's output) computes only its new tokens
    /// (vLLM's automatic prefix caching; 0 turns it off). The smoke model holds 4 KiB a token.
    #[arg(long, env = "TRAINER_PREFIX_CACHE_TOKENS", default_value_t = 131_072)]
    pub prefix_cache_tokens: usize,
    /// How a decode round attends on the CPU in f32 or bf16: `auto` reads each row's own positions
    /// when the running sequences' lengths differ enough for that to pay, `masked` always
    /// reads every row up to the longest (libtorch's kernel; the path on GPUs), `rows` always
    /// reads each row's own. For comparisons (`scripts/bench-wave.sh`); `auto` is the fastest
    /// measured.
    #[arg(long, env = "TRAINER_DECODE_ATTENTION", default_value = "auto",
          value_parser = ["auto", "masked", "rows"])]
    pub decode_attention: String,
    /// The dtype the generation worker's batch cache stores keys and values in (vLLM's
    /// `--kv-cache-dtype`): `auto`, the weights'; `bf16` under f32 weights halves the bytes a
    /// decode round reads, which bound the CPU row kernel on a CPU without AMX (BENCHMARKS.md,
    /// issue 25 session 85). The behaviour log-probs then come from keys and values rounded to
    /// bf16, where the trainer's are f32 (the truncated importance weight covers the gap).
    #[arg(long, env = "TRAINER_KV_CACHE_DTYPE", default_value = "auto",
          value_parser = ["auto", "f32", "bf16"])]
    pub kv_cache_dtype: String,
    #[arg(long, env = "TRAINER_SEED", default_value_t = 17)]
    pub seed: i64,
    /// cpu, cuda or auto.
    #[arg(long, env = "TRAINER_DEVICE", default_value = "auto")]
    pub device: String,
    /// Parameter dtype until a client's settings say otherwise (`trainer.param_dtype`): auto
    /// (bf16 on CUDA, f32 on CPU), f32 or bf16 (fp32 master weights). A policy server that only
    /// generates serves in it.
    #[arg(long, env = "TRAINER_DTYPE", default_value = "auto")]
    pub dtype: String,
    /// libtorch intra-op threads on CPU (0: libtorch's default, one per core). Two processes
    /// sharing a machine (a policy server and a trainer) each get a share this way.
    #[arg(long, env = "TRAINER_THREADS", default_value_t = 0)]
    pub threads: i32,
    /// Data-parallel ranks on this node: this process becomes a launcher that starts N ranks
    /// of this binary with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
    /// MASTER_PORT); rank 0 serves HTTP, the others follow. Started under torchrun (WORLD_SIZE
    /// set), the process is one rank instead.
    #[arg(long, env = "TRAINER_NPROC_PER_NODE", default_value_t = 1)]
    pub nproc_per_node: usize,
    /// Nodes in the job (one launcher per node; MASTER_ADDR / MASTER_PORT name rank 0's host).
    #[arg(long, env = "TRAINER_NNODES", default_value_t = 1)]
    pub nnodes: usize,
    /// This node's index among --nnodes.
    #[arg(long, env = "TRAINER_NODE_RANK", default_value_t = 0)]
    pub node_rank: usize,
    /// c10d backend of the ranks: auto (nccl on CUDA, else gloo), gloo or nccl.
    #[arg(long, env = "TRAINER_DIST_BACKEND", default_value = "auto")]
    pub dist_backend: String,
    /// Limit of every collective and of the rendezvous, in seconds: a rank that dies or hangs
    /// fails the others' step within it.
    #[arg(long, env = "TRAINER_DIST_TIMEOUT_SECS", default_value_t = 300)]
    pub dist_timeout_secs: u64,
    /// ZeRO stage of the ranks' optimizer: 0 (every rank holds it whole), 1 (AdamW moments and
    /// fp32 master weights sharded) or 2 (gradients reduce-scattered too). Checkpoints then
    /// hold one shard per rank and restore onto any number of ranks.
    #[arg(long, env = "TRAINER_ZERO", default_value = "0")]
    pub zero: crate::dist::zero::ZeroStage,
}

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// A checkpoint directory (step-N, holding state.json), or a checkpoint root (its `latest`,
    /// or the checkpoint of --version).
    #[arg(long, env = "TRAINER_EXPORT_CHECKPOINT")]
    pub checkpoint: PathBuf,
    /// Policy version to export from a checkpoint root (a checkpoint directory must hold it).
    #[arg(long, env = "TRAINER_EXPORT_VERSION")]
    pub version: Option<i64>,
    /// Output directory (replaced whole if it holds an earlier export).
    #[arg(long, env = "TRAINER_EXPORT_OUT")]
    pub out: PathBuf,
    /// Base model directory (config, tokenizer files; LoRA's base weights). Default: the base
    /// recorded in the checkpoint's state.json.
    #[arg(long, env = "TRAINER_EXPORT_BASE")]
    pub base: Option<PathBuf>,
    /// The base as named in adapter_config.json and the model card (e.g. a hub id). Default:
    /// the base directory's absolute path.
    #[arg(long, env = "TRAINER_EXPORT_BASE_NAME")]
    pub base_name: Option<String>,
    /// Stored dtype of the weights: bf16, f32 or keep (the checkpoint's; merged: the base's).
    #[arg(long, env = "TRAINER_EXPORT_DTYPE", default_value = "keep")]
    pub dtype: String,
    /// LoRA: write the merged full weights instead of the adapter (a full fine-tune is written
    /// whole either way).
    #[arg(long, env = "TRAINER_EXPORT_MERGE")]
    pub merge: bool,
    /// Markdown file appended to the model card (evaluation summary, resolved config).
    #[arg(long, env = "TRAINER_EXPORT_CARD_EXTRA")]
    pub card_extra: Option<PathBuf>,
    /// Full weights above this many bytes are split into index-mapped shards.
    #[arg(
        long,
        env = "TRAINER_EXPORT_MAX_SHARD_BYTES",
        default_value_t = 5_000_000_000
    )]
    pub max_shard_bytes: u64,
}

#[derive(Debug, Subcommand)]
pub enum TokenizerCommand {
    Train {
        #[arg(long, env = "TRAINER_CORPUS")]
        corpus: PathBuf,
        #[arg(long, env = "TRAINER_VOCAB", default_value_t = 4096)]
        vocab: usize,
        #[arg(long, env = "TRAINER_TOKENIZER_OUT")]
        out: PathBuf,
        /// Every digit a token of its own: numbers and ids are written one digit at a time.
        #[arg(long)]
        split_digits: bool,
    },
}
