//! Command-line interface: clap structs only, no logic. Every flag is long and has an
//! environment variable; `--help` is generated from these doc comments.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "orchestrator",
    version,
    about = "RubricEM experiment orchestrator"
)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, env = "ORCH_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the database if needed and apply pending migrations.
    Migrate {
        /// Postgres URL.
        #[arg(long, env = "DATABASE_URL", default_value = crate::domain::config::DEFAULT_DATABASE_URL)]
        database_url: String,
    },
    /// Check that the database is reachable and its migrations match this binary.
    DbCheck {
        /// Postgres URL.
        #[arg(long, env = "DATABASE_URL", default_value = crate::domain::config::DEFAULT_DATABASE_URL)]
        database_url: String,
    },
    /// Print the resolved configuration (preset < file < env < flags) as TOML.
    Config(ConfigArgs),
    /// Feature-detect the inference servers of a role and report what each offers.
    Probe {
        #[command(flatten)]
        config: ConfigArgs,
        /// Which role's endpoints to probe.
        #[arg(long, env = "ORCH_PROBE_ROLE", value_enum, default_value_t = ProbeRole::Policy)]
        role: ProbeRole,
    },
    /// Build or evaluate a local BM25 index (the offline `local_search` tool).
    #[command(subcommand)]
    Index(IndexCommand),
    /// Generate the offline research world (corpus + multi-hop tasks with rubrics).
    #[command(subcommand)]
    World(WorldCommand),
    /// Roll out the policy on a task file: n trajectories per task, stored in Postgres, with a
    /// summary of finish reasons, tool calls per stage and parse failures.
    Rollout(RolloutArgs),
    /// Judge (or re-judge) the stored trajectories of a run: rubric scores, stage scores,
    /// advantages and the judge-call log, for one step or every step.
    Judge(JudgeArgs),
    /// Rubric data: `rubrics init` writes search-grounded persistent rubrics for tasks.
    #[command(subcommand)]
    Rubrics(RubricsCommand),
    /// Run an experiment preset: for each recipe, rollout, judging and training as overlapping
    /// workers (pipeline.max_staleness = 0 makes them sequential), checkpoints, per-step
    /// metrics, live progress. Ctrl-C pauses cleanly; `--resume` continues exactly.
    Run {
        #[command(flatten)]
        config: ConfigArgs,
        /// Continue this run, or every unfinished run of this experiment, instead of starting
        /// a new one.
        #[arg(long, env = "ORCH_RESUME")]
        resume: Option<uuid::Uuid>,
    },
    /// Score an agent, a plain chat model or another system's answers on a benchmark by the
    /// benchmark's own protocol (HealthBench, ResearchQA, DeepResearch Bench RACE,
    /// ResearchRubrics, SQA-CS2, SimpleQA, 2Wiki/HotpotQA/MuSiQue/Bamboogle, WebWalkerQA), with
    /// a judge panel; stored in Postgres and resumable under its --name.
    Eval(Box<EvalArgs>),
    /// Build SFT warm-start data (ChatML JSONL with tool spans marked) from the research
    /// world's known evidence chains, searched on the real local index.
    SftData(SftDataArgs),
    /// Training data construction: `data deeprubric` builds query-rubric tasks from evidence
    /// trees (DeepRubric).
    #[command(subcommand)]
    Data(DataCommand),
    /// Inspect a run's rubric bank (reflection memory).
    #[command(subcommand)]
    Bank(BankCommand),
    /// Serve the read-only web dashboard (runs, live metrics, trajectories, rubric buffers,
    /// reflections, the bank). Binds to loopback by default; another address needs
    /// ORCH_DASHBOARD_TOKEN.
    Dashboard {
        /// Address to listen on.
        #[arg(long, env = "ORCH_DASHBOARD_BIND", default_value = crate::pipeline::dashboard::DEFAULT_BIND)]
        bind: std::net::SocketAddr,
        /// Postgres URL.
        #[arg(long, env = "DATABASE_URL", default_value = crate::domain::config::DEFAULT_DATABASE_URL)]
        database_url: String,
    },
    /// Export a run's policy version for transformers/PEFT/vLLM: writes the model card section
    /// (run, evaluations up to that version, benchmarks, resolved config) and runs `trainer
    /// export` on the version's checkpoint with it.
    Export(ExportArgs),
    /// Write a markdown report with PNG and SVG plots for a run or a whole experiment.
    Report {
        /// A run id or an experiment id.
        target: uuid::Uuid,
        /// Output directory.
        #[arg(long, env = "ORCH_REPORT_OUT", default_value = "reports")]
        out: PathBuf,
        /// Also pick each completed run's version by this evaluation subset (a validation set,
        /// e.g. `unseen-t07`): the version after the first with the highest score there, and
        /// every other subset's change at it.
        #[arg(long, env = "ORCH_REPORT_SELECT_BY", value_name = "SUBSET")]
        select_by: Option<String>,
        /// Postgres URL.
        #[arg(long, env = "DATABASE_URL", default_value = crate::domain::config::DEFAULT_DATABASE_URL)]
        database_url: String,
    },
    /// Export a run's stored step metrics to experiment trackers (TensorBoard event files,
    /// an MLflow server) under the tracker names of README.md "Trackers"; `tracking.*` in the
    /// experiment config does the same live during `run`.
    Track(TrackArgs),
}

#[derive(Debug, Clone, Args)]
pub struct TrackArgs {
    /// The run: its id, its name (the newest run of that name), or EXPERIMENT/NAME.
    #[arg(long, env = "ORCH_TRACK_RUN")]
    pub run: String,
    /// TensorBoard log directory (the run's events go to DIR/EXPERIMENT/NAME.ID/).
    #[arg(long, env = "ORCH_TRACK_TENSORBOARD")]
    pub tensorboard: Option<PathBuf>,
    /// MLflow tracking server; a token comes from MLFLOW_TRACKING_TOKEN.
    #[arg(long, env = "ORCH_TRACK_MLFLOW_URL")]
    pub mlflow_url: Option<String>,
    /// MLflow experiment (default: the run's experiment name).
    #[arg(long, env = "ORCH_TRACK_MLFLOW_EXPERIMENT")]
    pub mlflow_experiment: Option<String>,
    /// Postgres URL.
    #[arg(long, env = "DATABASE_URL", default_value = crate::domain::config::DEFAULT_DATABASE_URL)]
    pub database_url: String,
}

#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// The run whose policy is exported.
    #[arg(long, env = "ORCH_EXPORT_RUN")]
    pub run: uuid::Uuid,
    /// Policy version (default: the run's newest checkpoint).
    #[arg(long, env = "ORCH_EXPORT_VERSION")]
    pub version: Option<i32>,
    /// Output directory (model directory or PEFT adapter, with README.md).
    #[arg(long, env = "ORCH_EXPORT_OUT")]
    pub out: PathBuf,
    /// Write only the model card section, as markdown, to --out (no weights; no trainer needed).
    #[arg(long, env = "ORCH_EXPORT_CARD_ONLY")]
    pub card_only: bool,
    /// The trainer binary that writes the weights.
    #[arg(long, env = "ORCH_TRAINER_BIN", default_value = "trainer")]
    pub trainer_bin: PathBuf,
    /// The trainer's --checkpoint-dir: the run records checkpoint paths relative to it.
    #[arg(long, env = "ORCH_EXPORT_CHECKPOINT_ROOT")]
    pub checkpoint_root: Option<PathBuf>,
    /// Base model directory (default: the checkpoint's).
    #[arg(long, env = "ORCH_EXPORT_BASE")]
    pub base: Option<PathBuf>,
    /// LoRA: write merged full weights instead of an adapter.
    #[arg(long, env = "ORCH_EXPORT_MERGE")]
    pub merge: bool,
    /// Stored dtype: bf16, f32 or keep.
    #[arg(long, env = "ORCH_EXPORT_DTYPE", default_value = "keep")]
    pub dtype: String,
    /// Postgres URL.
    #[arg(long, env = "DATABASE_URL", default_value = crate::domain::config::DEFAULT_DATABASE_URL)]
    pub database_url: String,
}

#[derive(Debug, Clone, Args)]
pub struct SftDataArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Task file (default: data.tasks of the preset). The offline teacher needs the research
    /// world's tasks.jsonl; a teacher endpoint takes any task file.
    #[arg(long, env = "ORCH_SFT_TASKS")]
    pub tasks: Option<PathBuf>,
    /// Output JSONL file.
    #[arg(long, env = "ORCH_SFT_OUT")]
    pub out: PathBuf,
    /// Use at most this many tasks.
    #[arg(long, env = "ORCH_SFT_LIMIT")]
    pub limit: Option<usize>,
    /// Also write one reflection demonstration per kept trajectory here (offline teacher only):
    /// the meta-policy's prompt over the trajectory, every second one cut after an earlier
    /// search, and the teacher's post-mortem of what it shows (no gold rubric or answer).
    #[arg(long, env = "ORCH_SFT_REFLECTIONS_OUT")]
    pub reflections_out: Option<PathBuf>,
    /// Also write the agent demonstrations again with a `<reference_examples>` block of the
    /// teacher's post-mortems prepended to the question, as the rubric bank injects it (every
    /// second one its own task's, the rest the reflection.top_k other tasks' items nearest to the
    /// question by the experiment's embedder, as a run retrieves them); needs --reflections-out.
    #[arg(long, env = "ORCH_SFT_INJECTED_OUT", requires = "reflections_out")]
    pub injected_out: Option<PathBuf>,
    /// The search tool the offline teacher calls (default: the experiment's data.index_tool).
    #[arg(long, env = "ORCH_SFT_TOOL")]
    pub tool: Option<String>,
    /// Teacher endpoint (OpenAI-compatible base URL, `/v1/chat/completions`). Without it the
    /// offline teacher follows the research world's known evidence chains; with it any task
    /// file (our shape or DR Tulu rows) is taught by the model, one call per round.
    #[arg(long, env = "ORCH_SFT_TEACHER_URL")]
    pub teacher_url: Option<String>,
    /// Teacher model name.
    #[arg(long, env = "ORCH_SFT_TEACHER_MODEL", default_value = "teacher")]
    pub teacher_model: String,
    /// Name of the environment variable holding the teacher API's key (e.g. GEMINI_API_KEY).
    #[arg(long, env = "ORCH_SFT_TEACHER_API_KEY_ENV")]
    pub teacher_api_key_env: Option<String>,
    /// Rounds (teacher calls) per trajectory; method.md A.3 stops after 10.
    #[arg(long, env = "ORCH_SFT_MAX_ROUNDS", default_value_t = 10)]
    pub max_rounds: u32,
    /// Teacher sampling temperature.
    #[arg(long, env = "ORCH_SFT_TEMPERATURE", default_value_t = 0.7)]
    pub temperature: f32,
    /// Completion tokens per teacher round.
    #[arg(long, env = "ORCH_SFT_MAX_TOKENS", default_value_t = 4096)]
    pub max_tokens: u32,
    /// Trajectories taught at once.
    #[arg(long, env = "ORCH_SFT_CONCURRENCY", default_value_t = 8)]
    pub concurrency: usize,
    /// Also attach the real web tools (google_search via Serper, snippet_search via Semantic
    /// Scholar, browse_webpage behind the SSRF guard); keys from the environment.
    #[arg(long, env = "ORCH_SFT_WEB_TOOLS")]
    pub web_tools: bool,
}

#[derive(Debug, Clone, Args)]
pub struct RolloutArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Task file (JSONL; our shape or DR Tulu RL rows).
    #[arg(long, env = "ORCH_TASKS")]
    pub tasks: PathBuf,
    /// Rollouts per task (default: rollout.n of the preset).
    #[arg(long, env = "ORCH_N")]
    pub n: Option<u32>,
    /// Use only the first N tasks.
    #[arg(long, env = "ORCH_LIMIT")]
    pub limit: Option<usize>,
    /// Model directory with tokenizer.json and the chat template of the policy.
    #[arg(long, env = "ORCH_TOKENIZER")]
    pub tokenizer: PathBuf,
    #[command(flatten)]
    pub tools: ToolFlags,
    /// Agent scaffold: rubricem, drtulu or react.
    #[arg(long, env = "ORCH_SCAFFOLD", default_value = "rubricem")]
    pub scaffold: crate::domain::scaffold::Scaffold,
    /// Trajectories in flight at once.
    #[arg(long, env = "ORCH_MAX_INFLIGHT", default_value_t = 256)]
    pub max_inflight: usize,
    /// Inference-time memory: inject `<reference_examples>` from a run's rubric bank (none;
    /// within = this question's own item, else similar ones; cross = top-k similar questions).
    #[arg(long, env = "ORCH_REUSE", value_enum, default_value_t = crate::domain::bank::Reuse::None)]
    pub reuse: crate::domain::bank::Reuse,
    /// The run whose rubric bank `--reuse` reads.
    #[arg(long, env = "ORCH_BANK_RUN")]
    pub bank_run: Option<uuid::Uuid>,
}

#[derive(Debug, Subcommand)]
pub enum BankCommand {
    /// List a run's bank items (newest first).
    Show {
        /// The run whose bank is shown.
        run: uuid::Uuid,
        /// At most this many items.
        #[arg(long, env = "ORCH_BANK_LIMIT", default_value_t = 20)]
        limit: usize,
        /// Print each item's full rubrics and takeaways.
        #[arg(long, env = "ORCH_BANK_FULL")]
        full: bool,
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Retrieve what a question would be given: top-k similar items (cross) or its own item
    /// (within), with cosine scores and the injected block.
    Search {
        run: uuid::Uuid,
        /// The question text.
        #[arg(long, env = "ORCH_BANK_QUERY")]
        query: String,
        #[arg(long, env = "ORCH_BANK_MODE", value_enum, default_value_t = crate::domain::bank::Reuse::Cross)]
        mode: crate::domain::bank::Reuse,
        /// Items returned (default: reflection.top_k of the preset).
        #[arg(long, env = "ORCH_BANK_K")]
        k: Option<usize>,
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Write a run's bank as JSONL (one item per line, embeddings included).
    Export {
        run: uuid::Uuid,
        #[arg(long, env = "ORCH_BANK_OUT")]
        out: PathBuf,
        #[command(flatten)]
        config: ConfigArgs,
    },
}

#[derive(Debug, Clone, Args)]
pub struct JudgeArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Run id whose trajectories are judged.
    #[arg(long, env = "ORCH_RUN")]
    pub run: uuid::Uuid,
    /// Only this step (default: every step with trajectories, in order).
    #[arg(long, env = "ORCH_STEP")]
    pub step: Option<i32>,
    /// Recipe whose judging and credit apply (default: the run's own recipe; `rollout` runs
    /// default to full).
    #[arg(long, env = "ORCH_RECIPE")]
    pub recipe: Option<String>,
    /// Propose new rubrics by contrasting each group (the training-time procedure). Off by
    /// default: re-score against the run's stored buffers and persistent rubrics.
    #[arg(long, env = "ORCH_GENERATE")]
    pub generate: bool,
}

#[derive(Debug, Subcommand)]
pub enum RubricsCommand {
    /// Search each task's question, then have the judge write persistent Answer rubrics grounded
    /// only in the results; stored on the task (tasks.persistent_rubrics).
    Init {
        #[command(flatten)]
        config: ConfigArgs,
        /// Task file (JSONL; our shape or DR Tulu RL rows).
        #[arg(long, env = "ORCH_TASKS")]
        tasks: PathBuf,
        /// Use only the first N tasks.
        #[arg(long, env = "ORCH_LIMIT")]
        limit: Option<usize>,
        /// Local BM25 index served as google_search / snippet_search.
        #[arg(long, env = "ORCH_INDEX_DIR")]
        index: Option<PathBuf>,
        /// Real web tools (Serper, Semantic Scholar).
        #[arg(long, env = "ORCH_WEB_TOOLS")]
        web_tools: bool,
        /// MCP servers whose tools are attached.
        #[arg(long, env = "ORCH_MCP_URLS", value_delimiter = ',')]
        mcp: Vec<String>,
        /// Search tool to ground rubrics in.
        #[arg(long, env = "ORCH_GROUND_TOOL", default_value = "google_search")]
        tool: String,
        /// Results per search (the papers use 10).
        #[arg(long, env = "ORCH_GROUND_K", default_value_t = 10)]
        k: u32,
        /// Replace rubrics a task already has (default: keep them).
        #[arg(long, env = "ORCH_OVERWRITE")]
        overwrite: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum WorldCommand {
    /// Write corpus.jsonl and tasks.jsonl, deterministic per seed.
    Generate {
        /// Seed: the same seed always gives the same world.
        #[arg(long, env = "ORCH_WORLD_SEED", default_value_t = 17)]
        seed: u64,
        /// Number of documents.
        #[arg(long, env = "ORCH_WORLD_DOCS", default_value_t = 2000)]
        docs: usize,
        /// Number of tasks.
        #[arg(long, env = "ORCH_WORLD_TASKS", default_value_t = 300)]
        tasks: usize,
        /// Held-out evaluation tasks written to heldout.jsonl, about lineages and cities that
        /// no training task mentions (0 = none).
        #[arg(long, env = "ORCH_WORLD_HELD_OUT", default_value_t = 0)]
        held_out: usize,
        /// Output directory.
        #[arg(long, env = "ORCH_WORLD_OUT")]
        out: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum IndexCommand {
    /// Index a JSONL corpus ({"_id"|"id", "title", "text", "url"?} per line).
    Build {
        /// The corpus file.
        #[arg(long, env = "ORCH_CORPUS")]
        corpus: PathBuf,
        /// Index directory to create (must not hold an index yet).
        #[arg(long, env = "ORCH_INDEX_DIR")]
        out: PathBuf,
    },
    /// nDCG@k of the index on BEIR-format queries and qrels.
    Eval {
        /// Index directory written by `index build`.
        #[arg(long, env = "ORCH_INDEX_DIR")]
        index: PathBuf,
        /// Queries JSONL ({"_id", "text"} per line).
        #[arg(long, env = "ORCH_EVAL_QUERIES")]
        queries: PathBuf,
        /// Qrels TSV (query-id, corpus-id, score).
        #[arg(long, env = "ORCH_EVAL_QRELS")]
        qrels: PathBuf,
        /// Cut-off k.
        #[arg(long, env = "ORCH_EVAL_K", default_value_t = 10)]
        k: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProbeRole {
    Policy,
    Judge,
    Embeddings,
}

/// Where the configuration comes from. Precedence: preset < --config file < env/flags < --set.
#[derive(Debug, Clone, Args)]
pub struct ConfigArgs {
    /// Experiment preset embedded in the binary (smoke, ablation-600, rubricem, drtulu).
    #[arg(long, env = "ORCH_EXPERIMENT", default_value = "smoke")]
    pub experiment: String,
    /// TOML file merged over the preset.
    #[arg(long = "config", env = "ORCH_CONFIG")]
    pub config_file: Option<PathBuf>,
    /// Postgres URL (overrides database.url).
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// Policy server base URLs, comma-separated (overrides policy.urls).
    #[arg(long = "policy-url", env = "ORCH_POLICY_URLS", value_delimiter = ',')]
    pub policy_urls: Option<Vec<String>>,
    /// Judge server base URLs, comma-separated (overrides judge.urls).
    #[arg(long = "judge-url", env = "ORCH_JUDGE_URLS", value_delimiter = ',')]
    pub judge_urls: Option<Vec<String>>,
    /// Embedding server base URLs, comma-separated (overrides embeddings.urls).
    #[arg(
        long = "embeddings-url",
        env = "ORCH_EMBEDDINGS_URLS",
        value_delimiter = ','
    )]
    pub embeddings_urls: Option<Vec<String>>,
    /// Trainer service base URL (overrides trainer.url).
    #[arg(long, env = "ORCH_TRAINER_URL")]
    pub trainer_url: Option<String>,
    /// Number of steps (overrides experiment.steps).
    #[arg(long, env = "ORCH_STEPS")]
    pub steps: Option<u32>,
    /// KEY=VALUE override with a dotted key, e.g. --set rollout.n=8; repeatable
    /// (environment: ';'-separated).
    #[arg(long = "set", env = "ORCH_SET", value_delimiter = ';')]
    pub sets: Vec<String>,
}

impl ConfigArgs {
    /// The overrides given. Empty values (an environment variable set to "", as compose.yaml
    /// passes unset ones through) override nothing.
    pub fn overrides(&self) -> crate::domain::config::Overrides {
        let urls = |v: &Option<Vec<String>>| {
            v.as_ref()
                .map(|v| {
                    v.iter()
                        .filter(|u| !u.trim().is_empty())
                        .cloned()
                        .collect::<Vec<_>>()
                })
                .filter(|v| !v.is_empty())
        };
        crate::domain::config::Overrides {
            file: self.config_file.clone(),
            database_url: self.database_url.clone(),
            policy_urls: urls(&self.policy_urls),
            judge_urls: urls(&self.judge_urls),
            embeddings_urls: urls(&self.embeddings_urls),
            trainer_url: self.trainer_url.clone(),
            steps: self.steps,
            sets: self
                .sets
                .iter()
                .filter(|s| !s.trim().is_empty())
                .cloned()
                .collect(),
        }
    }
}

/// Every environment variable the CLI reads (used to check compose.yaml against the CLI).
pub fn env_vars() -> Vec<String> {
    use clap::CommandFactory;
    fn walk(cmd: &clap::Command, out: &mut Vec<String>) {
        for a in cmd.get_arguments() {
            if let Some(e) = a.get_env() {
                out.push(e.to_string_lossy().into_owned());
            }
        }
        for s in cmd.get_subcommands() {
            walk(s, out);
        }
    }
    let mut out = Vec::new();
    walk(&Cli::command(), &mut out);
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_flag_is_long_with_env() {
        fn walk(cmd: &clap::Command) {
            for a in cmd.get_arguments() {
                if a.is_positional() || a.get_id() == "help" || a.get_id() == "version" {
                    continue;
                }
                assert!(a.get_long().is_some(), "{} has no long flag", a.get_id());
                assert!(a.get_env().is_some(), "--{} has no env var", a.get_id());
            }
            for s in cmd.get_subcommands() {
                walk(s);
            }
        }
        walk(&Cli::command());
    }

    #[test]
    fn empty_values_override_nothing() {
        let cli = Cli::try_parse_from([
            "orchestrator",
            "config",
            "--set",
            "",
            "--embeddings-url",
            "",
            "--set",
            "rollout.n=4",
        ])
        .unwrap();
        let Command::Config(config) = cli.command else {
            panic!("not config")
        };
        let ov = config.overrides();
        assert_eq!(ov.sets, ["rollout.n=4"]);
        assert_eq!(ov.embeddings_urls, None);
    }

    #[test]
    fn env_vars_are_listed() {
        let v = env_vars();
        for e in [
            "DATABASE_URL",
            "ORCH_POLICY_URLS",
            "ORCH_TRAINER_URL",
            "ORCH_SET",
        ] {
            assert!(v.iter().any(|x| x == e), "{e} missing from {v:?}");
        }
    }
}

/// How a benchmark subset is drawn (`--limit N --seed S`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SamplingArg {
    /// simple-evals: `random.Random(seed).sample(items, N)` (default seed 0).
    SimpleEvals,
    /// DR Tulu: `random.seed(seed); random.shuffle(items); items[:N]` (default seed 42).
    Drtulu,
    /// The first N items in file order.
    First,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RaceCleanArg {
    /// One judge call per article removes citations (the protocol).
    Llm,
    /// Citation markers and reference lists removed locally (no call; not the protocol).
    Strip,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FactArg {
    Off,
    /// Cited pages from the agent's trace only.
    Trace,
    /// The trace first, else the page fetched with the browse tool.
    Browse,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HbAggregationArg {
    /// OpenAI simple-evals: the mean of unclipped per-example scores, clipped to [0, 1].
    Clipped,
    /// DR Tulu: the plain mean (may be negative).
    Plain,
}

#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// healthbench, healthbench-hard, healthbench-consensus, researchqa, drb, researchrubrics,
    /// sqa-cs-v2, simpleqa, 2wiki, hotpotqa, musique, bamboogle, webwalker, frontierscience.
    #[arg(long, env = "ORCH_EVAL_BENCHMARK")]
    pub benchmark: String,
    /// The benchmark's file in its published format.
    #[arg(long, env = "ORCH_EVAL_DATA")]
    pub data: PathBuf,
    /// DRB: criteria.jsonl when --data is query.jsonl (default: beside it).
    #[arg(long, env = "ORCH_EVAL_CRITERIA")]
    pub criteria: Option<PathBuf>,
    /// DRB: the reference articles (reference.jsonl), joined by prompt text.
    #[arg(long, env = "ORCH_EVAL_REFERENCES")]
    pub references: Option<PathBuf>,
    /// ResearchQA: a JSON list of ids to keep (the official subset).
    #[arg(long, env = "ORCH_EVAL_SUBSET_IDS")]
    pub subset_ids: Option<PathBuf>,
    /// Evaluate N items drawn by --sampling.
    #[arg(long, env = "ORCH_EVAL_LIMIT")]
    pub limit: Option<usize>,
    /// Seed of the subset draw (default: the sampling's own, 0 or 42).
    #[arg(long, env = "ORCH_EVAL_SEED")]
    pub seed: Option<u64>,
    /// How the subset is drawn (default: simple-evals for HealthBench and SimpleQA, drtulu
    /// otherwise).
    #[arg(long, env = "ORCH_EVAL_SAMPLING", value_enum)]
    pub sampling: Option<SamplingArg>,
    /// The evaluation's name: the same name resumes it (default: derived from the benchmark,
    /// data hash, subset, responder and judges).
    #[arg(long, env = "ORCH_EVAL_NAME")]
    pub name: Option<String>,
    /// Score another system's answers: JSONL rows {"id": ..., "answer": ...} keyed by the
    /// benchmark's own item id (0-based row index for files without one).
    #[arg(long, env = "ORCH_EVAL_ANSWERS", conflicts_with = "chat")]
    pub answers: Option<PathBuf>,
    /// Baseline: a plain chat model (the policy endpoint) answers without tools.
    #[arg(long, env = "ORCH_EVAL_CHAT")]
    pub chat: bool,
    /// Policy model name (default: policy.model of the preset).
    #[arg(long, env = "ORCH_EVAL_POLICY_MODEL")]
    pub policy_model: Option<String>,
    /// Agent scaffold: rubricem, drtulu or react.
    #[arg(long, env = "ORCH_SCAFFOLD", default_value = "rubricem")]
    pub scaffold: crate::domain::scaffold::Scaffold,
    /// Agent: model directory with tokenizer.json and the chat template (default: data.tokenizer).
    #[arg(long, env = "ORCH_TOKENIZER")]
    pub tokenizer: Option<PathBuf>,
    #[command(flatten)]
    pub tools: ToolFlags,
    /// Sampling temperature of the policy (default: rollout.temperature of the preset).
    #[arg(long, env = "ORCH_EVAL_TEMPERATURE")]
    pub temperature: Option<f32>,
    /// Chat baseline: completion tokens per answer.
    #[arg(long, env = "ORCH_EVAL_MAX_TOKENS", default_value_t = 4096)]
    pub max_tokens: u32,
    /// Responses in flight.
    #[arg(long, env = "ORCH_EVAL_MAX_INFLIGHT", default_value_t = 32)]
    pub max_inflight: usize,
    /// Judge model per --judge-url: in `eval` every --judge-url is one judge of the panel
    /// (repeat or comma-separate both; one model name applies to all; default: judge.model).
    #[arg(long, env = "ORCH_EVAL_JUDGE_MODEL", value_delimiter = ',')]
    pub judge_model: Vec<String>,
    /// Name of the environment variable holding the judges' API key.
    #[arg(long, env = "ORCH_EVAL_JUDGE_KEY_ENV")]
    pub judge_key_env: Option<String>,
    /// Judge temperature (DR Tulu's evaluations use 0; simple-evals' sampler 0.5).
    #[arg(long, env = "ORCH_EVAL_JUDGE_TEMPERATURE", default_value_t = 0.0)]
    pub judge_temperature: f32,
    /// Judge completion tokens per call.
    #[arg(long, env = "ORCH_EVAL_JUDGE_MAX_TOKENS", default_value_t = 2048)]
    pub judge_max_tokens: u32,
    /// Judge calls in flight over the whole panel.
    #[arg(long, env = "ORCH_EVAL_JUDGE_INFLIGHT", default_value_t = 64)]
    pub judge_inflight: usize,
    /// Judge request timeout in seconds.
    #[arg(long, env = "ORCH_EVAL_JUDGE_TIMEOUT", default_value_t = 300)]
    pub judge_timeout_secs: u64,
    /// USD per million judge prompt tokens (cost accounting).
    #[arg(long, env = "ORCH_EVAL_USD_PROMPT", default_value_t = 0.0)]
    pub usd_per_mtok_prompt: f64,
    /// USD per million judge completion tokens.
    #[arg(long, env = "ORCH_EVAL_USD_COMPLETION", default_value_t = 0.0)]
    pub usd_per_mtok_completion: f64,
    /// Short-answer benchmarks only: no LLM judge, exact match is the score.
    #[arg(long, env = "ORCH_EVAL_NO_JUDGE")]
    pub no_judge: bool,
    /// Replace a grader template: NAME=FILE (e.g. criterion=healthbench_grader.jinja), or FILE
    /// alone when the benchmark uses one template. Names: criterion, verdict, coverage, race,
    /// clean, three_class, equivalence, ingredients, precision, citations (SQA), facts, dedupe,
    /// fact_support (DRB FACT), cot_qa (WebWalker).
    #[arg(long, env = "ORCH_EVAL_GRADER_TEMPLATE")]
    pub grader_template: Vec<String>,
    /// HealthBench aggregation.
    #[arg(long, env = "ORCH_EVAL_HB_AGGREGATION", value_enum, default_value_t = HbAggregationArg::Clipped)]
    pub hb_aggregation: HbAggregationArg,
    /// ResearchRubrics: count "Partially Satisfied" as 0.5 (ternary) instead of 0 (binary).
    #[arg(long, env = "ORCH_EVAL_RR_TERNARY")]
    pub rr_ternary: bool,
    /// ResearchQA: rubric items per judge call (official 8, DR Tulu 10).
    #[arg(long, env = "ORCH_EVAL_COVERAGE_BATCH", default_value_t = 8)]
    pub coverage_batch: usize,
    /// DRB RACE: clean the target article with a judge call (llm, the protocol) or locally.
    #[arg(long, env = "ORCH_EVAL_RACE_CLEAN", value_enum, default_value_t = RaceCleanArg::Llm)]
    pub race_clean: RaceCleanArg,
    /// DRB FACT citation checking beside RACE: off, pages from the agent's trace (DR Tulu's
    /// route; offline), or the trace then the browse tool (needs the network).
    #[arg(long, env = "ORCH_EVAL_FACT", value_enum, default_value_t = FactArg::Off)]
    pub fact: FactArg,
    /// WebWalkerQA: grade with the official CoT-QA protocol (GRADE: CORRECT|INCORRECT) instead
    /// of DR Tulu's yes/no equivalence judge that RubricEM's numbers use.
    #[arg(long, env = "ORCH_EVAL_WEBWALKER_COT_QA")]
    pub webwalker_cot_qa: bool,
    /// FACT with `browse`: address blocks the fetcher may reach although private, loopback or
    /// link-local (refused by default), e.g. 127.0.0.1/32 for a local mirror.
    #[arg(
        long = "fact-allow",
        env = "ORCH_EVAL_FACT_ALLOW",
        value_delimiter = ','
    )]
    pub fact_allow: Vec<String>,
    /// Attempts per judge call when its reply does not parse.
    #[arg(long, env = "ORCH_EVAL_PARSE_ATTEMPTS", default_value_t = 3)]
    pub parse_attempts: u32,
    /// Bootstrap resamples for the 95% intervals.
    #[arg(long, env = "ORCH_EVAL_BOOTSTRAP", default_value_t = 1000)]
    pub bootstrap: usize,
    /// Print the summary as one JSON object on the last line of stdout.
    #[arg(long, env = "ORCH_EVAL_JSON")]
    pub json: bool,
    /// Also write summary.md, summary.json and scores.svg/png into this directory.
    #[arg(long, env = "ORCH_EVAL_OUT")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// DeepRubric: grow an evidence tree per seed topic with the project's search tools,
    /// compose a query with rubrics from selected leaves, verify it (KEEP / REVISE / DROP), and
    /// write the kept pairs as a task file. Stored in Postgres per stage; the same --name
    /// continues a killed build.
    Deeprubric(Box<DeepRubricArgs>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeepRubricStage {
    Tree,
    Compose,
    Verify,
    All,
}

#[derive(Debug, Clone, Args)]
pub struct DeepRubricArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Seed topics: one per line, or JSONL rows with `topic` (or `seed`, `title`).
    #[arg(long, env = "ORCH_DR_SEEDS")]
    pub seeds: Option<PathBuf>,
    /// Or draw the seeds from a JSONL corpus (the local index's format): the titles of
    /// --seed-count documents sampled with --seed.
    #[arg(long, env = "ORCH_DR_SEED_CORPUS")]
    pub seed_corpus: Option<PathBuf>,
    #[arg(long, env = "ORCH_DR_SEED_COUNT", default_value_t = 10)]
    pub seed_count: usize,
    #[arg(long, env = "ORCH_DR_SEED", default_value_t = 0)]
    pub seed: u64,
    /// The task file written from the kept and revised pairs.
    #[arg(long, env = "ORCH_DR_OUT")]
    pub out: PathBuf,
    /// Run one stage (its inputs must be stored) or all.
    #[arg(long, env = "ORCH_DR_STAGE", value_enum, default_value_t = DeepRubricStage::All)]
    pub stage: DeepRubricStage,
    /// The build's name: the same name continues it (default: derived from the seeds).
    #[arg(long, env = "ORCH_DR_NAME")]
    pub name: Option<String>,
    #[command(flatten)]
    pub tools: ToolFlags,
    /// The tool passages come from (default: snippet_search, else google_search).
    #[arg(long, env = "ORCH_DR_SEARCH_TOOL")]
    pub search_tool: Option<String>,
    /// The LLM of tree expansion and co-generation (default: the first --judge-url).
    #[arg(long, env = "ORCH_DR_LLM_URL")]
    pub llm_url: Option<String>,
    #[arg(long, env = "ORCH_DR_LLM_MODEL")]
    pub llm_model: Option<String>,
    /// The verifier (default: the same LLM).
    #[arg(long, env = "ORCH_DR_VERIFIER_URL")]
    pub verifier_url: Option<String>,
    #[arg(long, env = "ORCH_DR_VERIFIER_MODEL")]
    pub verifier_model: Option<String>,
    /// Name of the environment variable holding the LLM's API key.
    #[arg(long, env = "ORCH_DR_KEY_ENV")]
    pub key_env: Option<String>,
    #[arg(long, env = "ORCH_DR_MAX_DEPTH", default_value_t = 3)]
    pub max_depth: u8,
    #[arg(long, env = "ORCH_DR_MAX_NODES", default_value_t = 50)]
    pub max_nodes: usize,
    /// Passages retrieved per node.
    #[arg(long, env = "ORCH_DR_PASSAGES", default_value_t = 5)]
    pub passages: usize,
    /// Characters kept of each passage (the paper: 5,000; less for a small model's context).
    #[arg(long, env = "ORCH_DR_PASSAGE_CHARS", default_value_t = 5000)]
    pub passage_chars: usize,
    /// Attempts per LLM call whose reply breaks the schema or a rule.
    #[arg(long, env = "ORCH_DR_ATTEMPTS", default_value_t = 3)]
    pub attempts: u32,
    #[arg(long, env = "ORCH_DR_TEMPERATURE", default_value_t = 0.4)]
    pub temperature: f32,
    #[arg(long, env = "ORCH_DR_MAX_TOKENS", default_value_t = 4096)]
    pub max_tokens: u32,
    /// Trees (and items) processed at once.
    #[arg(long, env = "ORCH_DR_TREES_IN_FLIGHT", default_value_t = 4)]
    pub trees_in_flight: usize,
    /// LLM calls in flight per endpoint.
    #[arg(long, env = "ORCH_DR_LLM_IN_FLIGHT", default_value_t = 16)]
    pub llm_in_flight: usize,
    /// USD per million prompt tokens of the LLM (cost accounting per stage).
    #[arg(long, env = "ORCH_DR_USD_PER_MTOK_PROMPT", default_value_t = 0.0)]
    pub usd_per_mtok_prompt: f64,
    /// USD per million completion tokens of the LLM.
    #[arg(long, env = "ORCH_DR_USD_PER_MTOK_COMPLETION", default_value_t = 0.0)]
    pub usd_per_mtok_completion: f64,
    /// Print the statistics as one JSON object on the last line of stdout.
    #[arg(long, env = "ORCH_DR_JSON")]
    pub json: bool,
}

/// The tools an agent (or a data build) searches with: one set of flags for `rollout`, `eval`
/// and `data deeprubric`.
#[derive(Debug, Clone, Args)]
pub struct ToolFlags {
    /// Local BM25 index (from `index build`): served as google_search and snippet_search, or in
    /// `rollout` as the experiment's one data.index_tool (the tool the policy trained with).
    #[arg(long, env = "ORCH_INDEX_DIR")]
    pub index: Option<PathBuf>,
    /// Real web tools: google_search (Serper, SERPER_API_KEY), snippet_search (Semantic
    /// Scholar, S2_API_KEY) and browse_webpage behind the SSRF guard.
    #[arg(long, env = "ORCH_WEB_TOOLS")]
    pub web_tools: bool,
    /// MCP server (streamable HTTP) whose tools are attached; repeat or comma-separate.
    #[arg(long = "mcp", env = "ORCH_MCP_URLS", value_delimiter = ',')]
    pub mcp: Vec<String>,
}

impl ToolFlags {
    /// The tool runner's setup from these flags.
    pub fn setup(&self) -> crate::infra::tools::setup::ToolSetup {
        crate::infra::tools::setup::ToolSetup {
            index: self.index.clone(),
            index_tool: None,
            index_k: None,
            web: self.web_tools,
            mcp_urls: self.mcp.clone(),
        }
    }
}
