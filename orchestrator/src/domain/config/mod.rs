//! Experiment configuration: embedded presets < file < environment < flags, validated before
//! anything starts. Unknown keys and out-of-range values are errors that name the field and the
//! allowed values. Nothing here does I/O beyond reading an optional config file.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The database the set-up script creates, reached over local TCP with trust auth.
/// The name of the evaluation subset of `data.tasks` kept out of training (`eval.held_out`).
pub const HELD_OUT: &str = "held-out";

pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/rubricem";

/// Presets embedded in the binary (`orchestrator/experiments/*.toml`).
pub const PRESETS: &[(&str, &str)] = &[
    (
        "smoke",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/experiments/smoke.toml"
        )),
    ),
    (
        "ablation-600",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/experiments/ablation-600.toml"
        )),
    ),
    (
        "rubricem",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/experiments/rubricem.toml"
        )),
    ),
    (
        "drtulu",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/experiments/drtulu.toml"
        )),
    ),
];

/// The recipes of the paper's ablation plus DR Tulu's RLER.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Recipe {
    /// Answer-only GRPO with the terminal reward broadcast to every token.
    BaselineRl,
    /// Stage-structured credit assignment (SS-GRPO).
    SsGrpo,
    /// Answer-only GRPO plus the reflection meta-policy and rubric bank.
    MetaPolicy,
    /// SS-GRPO plus meta-policy: RubricEM.
    Full,
    /// DR Tulu's RLER: evolving answer rubrics with the composite reward.
    Drtulu,
}

impl Recipe {
    pub fn as_str(self) -> &'static str {
        match self {
            Recipe::BaselineRl => "baseline-rl",
            Recipe::SsGrpo => "ss-grpo",
            Recipe::MetaPolicy => "meta-policy",
            Recipe::Full => "full",
            Recipe::Drtulu => "drtulu",
        }
    }

    /// Recipes with the reflection meta-policy, rubric bank and windowed curriculum.
    pub fn reflects(self) -> bool {
        matches!(self, Recipe::MetaPolicy | Recipe::Full)
    }

    pub const ALL: [Recipe; 5] = [
        Recipe::BaselineRl,
        Recipe::SsGrpo,
        Recipe::MetaPolicy,
        Recipe::Full,
        Recipe::Drtulu,
    ];

    /// The recipe named `s` as stored in `runs.recipe` and written in presets.
    pub fn parse(s: &str) -> Option<Recipe> {
        Recipe::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// Which judge scores a run (`judge.kind`): one type with the judge's own.
pub use crate::domain::judge::JudgeKind;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub experiment: ExperimentConfig,
    pub database: DatabaseConfig,
    pub policy: EndpointPoolConfig,
    pub judge: JudgeConfig,
    pub embeddings: EndpointPoolConfig,
    pub trainer: TrainerConfig,
    #[serde(default)]
    pub retry: RetryConfig,
    #[serde(default)]
    pub health: HealthConfig,
    pub rollout: RolloutConfig,
    #[serde(default)]
    pub credit: CreditConfig,
    #[serde(default)]
    pub pipeline: PipelineConfig,
    #[serde(default)]
    pub data: DataConfig,
    #[serde(default)]
    pub reflection: ReflectionConfig,
    #[serde(default)]
    pub eval: EvalConfig,
}

/// Evaluation of each run's policy on fixed task subsets (method.md A.9: the ablation recipes
/// are compared on a fixed random subset per benchmark). Evaluations roll out without bank
/// injection and score answers against each task's persistent rubrics only (plus exact match
/// where a task has a short known answer), so every recipe meets the same yardstick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// Tasks of `data.tasks` held out of training as the `held-out` subset: a seeded random
    /// pick (experiment.seed), the same for every recipe of the experiment. 0 = none.
    pub held_out: u32,
    /// Further fixed subsets, e.g. one per benchmark: a seeded random `size` tasks of a task
    /// file (never trained on).
    pub sets: Vec<EvalSet>,
    /// Evaluate after every N trained steps; the final policy is always evaluated. 0 = final
    /// only.
    pub every: u32,
    /// Also evaluate the starting policy (version 0, the SFT checkpoint).
    pub initial: bool,
    /// Samples per task.
    pub n: u32,
    /// Sampling temperature of evaluation rollouts (0 = greedy); unset = rollout.temperature.
    pub temperature: Option<f32>,
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self {
            held_out: 0,
            sets: Vec::new(),
            every: 0,
            initial: true,
            n: 1,
            temperature: None,
        }
    }
}

impl EvalConfig {
    /// Whether any subset is configured.
    pub fn enabled(&self) -> bool {
        self.held_out > 0 || !self.sets.is_empty()
    }
}

/// One named evaluation subset drawn from a task file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalSet {
    /// Subset name in `evaluations.subset` and the report (letters, digits, '-', '_').
    pub name: String,
    /// Task file (any shape `data.tasks` accepts).
    pub tasks: PathBuf,
    /// Tasks drawn from it (all of them when the file holds fewer).
    pub size: u32,
}

/// The reflection meta-policy, rubric bank and windowed curriculum (method.md A.6-A.7); used by
/// the `meta-policy` and `full` recipes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReflectionConfig {
    /// Reflection candidates per sampled trajectory (m).
    pub candidates: u32,
    pub temperature: f32,
    pub top_p: f32,
    /// Token budget of one candidate.
    pub max_tokens: u32,
    /// Write the best valid candidate only if its utility reaches this (0 = always).
    pub accept_threshold: f64,
    /// Cross-episode items injected per question (k).
    pub top_k: usize,
    /// New-query batches per curriculum window (K); each window replays them in order.
    pub window: u32,
    /// The trajectory shown to the reflection prompt is cut to this many bytes (head and tail).
    pub max_trajectory_chars: usize,
    /// How long training of step s waits for the reflection job of step s - 1 before it trains
    /// without it (the candidates then join a later step; the lag is a metric).
    pub wait_secs: u64,
}

impl Default for ReflectionConfig {
    fn default() -> Self {
        Self {
            candidates: 8,
            temperature: 0.7,
            top_p: 1.0,
            max_tokens: 1024,
            accept_threshold: 0.0,
            top_k: 2,
            window: 3,
            max_trajectory_chars: 12_000,
            wait_secs: 600,
        }
    }
}

/// How `orchestrator run` schedules its workers (method.md A.8, design.md section 3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineConfig {
    /// How many steps the rollout policy may lag the step being rolled out: rollouts of step s
    /// start once steps up to s - 1 - max_staleness are trained. 0 = strictly sequential:
    /// rollout, judging, the step's reflection job and training, one after another.
    pub max_staleness: u32,
    /// Save trainer weights and optimizer every N steps (recorded in `checkpoints`); resume
    /// restores the latest and replays the steps after it from Postgres.
    pub checkpoint_every: u32,
    /// Trajectories in flight at once.
    pub max_inflight: u32,
    /// Admission control: hold new trajectories while any policy server reports more than
    /// this many queued requests on its metrics endpoint (0 = off).
    pub admission_max_waiting: u32,
    /// How long to wait for a dead trainer to come back before the run fails.
    pub trainer_wait_secs: u64,
    /// Trainer checkpoints live under this sub-directory of its --checkpoint-dir, one folder per
    /// run.
    pub checkpoint_subdir: String,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            max_staleness: 1,
            checkpoint_every: 5,
            max_inflight: 64,
            admission_max_waiting: 32,
            trainer_wait_secs: 600,
            checkpoint_subdir: "runs".into(),
        }
    }
}

/// Where the run's tasks, search index and policy tokenizer come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// Task file (ours, the research world's, or DR Tulu RL rows).
    pub tasks: PathBuf,
    /// Local search index directory (built from the world's corpus when missing and
    /// `world_seed` is set). Empty: web tools from the environment.
    pub index: PathBuf,
    /// Directory with the policy's tokenizer.json (and chat template).
    pub tokenizer: PathBuf,
    /// Generate the research world into the task file's directory when it is missing.
    pub world_seed: Option<u64>,
    pub world_docs: usize,
    pub world_tasks: usize,
    /// Agent scaffold: rubricem, drtulu or react (parsed once, here).
    pub scaffold: crate::domain::scaffold::Scaffold,
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            tasks: PathBuf::from("runs/smoke/world/tasks.jsonl"),
            index: PathBuf::from("runs/smoke/index"),
            tokenizer: PathBuf::from("runs/smoke/model-sft"),
            world_seed: None,
            world_docs: 400,
            world_tasks: 96,
            scaffold: crate::domain::scaffold::Scaffold::Rubricem,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentConfig {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub recipes: Vec<Recipe>,
    pub steps: u32,
    pub seed: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    pub url: String,
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
}

fn default_max_connections() -> u32 {
    16
}

/// A pool of OpenAI-compatible endpoints serving one role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointPoolConfig {
    pub urls: Vec<String>,
    pub model: String,
    /// Requests in flight per endpoint.
    pub max_concurrency: u32,
    /// Whole-request timeout.
    pub timeout_secs: u64,
    /// Name of the environment variable holding the API key (hosted APIs); the key itself is
    /// never written in a config, logged or stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JudgeConfig {
    pub kind: JudgeKind,
    pub urls: Vec<String>,
    pub model: String,
    pub max_concurrency: u32,
    pub timeout_secs: u64,
    /// USD per million prompt tokens (cost accounting; 0 for self-hosted judges).
    #[serde(default)]
    pub usd_per_mtok_prompt: f64,
    /// USD per million completion tokens.
    #[serde(default)]
    pub usd_per_mtok_completion: f64,
    /// Each stage's text is cut to this many bytes (head and tail kept) in judge prompts.
    #[serde(default = "default_max_stage_chars")]
    pub max_stage_chars: usize,
    /// Name of the environment variable holding the judge API's key (e.g. `OPENAI_API_KEY`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
}

fn default_max_stage_chars() -> usize {
    12_000
}

/// Credit assignment settings (method.md A.5, B.6).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreditConfig {
    /// The stage-dependence matrix Λ (rows: stages; upper-triangular, unit diagonal).
    #[serde(default)]
    pub lambda: crate::domain::credit::Lambda,
    /// DR Tulu recipe: include the citation reward (claim-level judge calls).
    #[serde(default)]
    pub citation: bool,
}

impl JudgeConfig {
    pub fn pool(&self) -> EndpointPoolConfig {
        EndpointPoolConfig {
            urls: self.urls.clone(),
            model: self.model.clone(),
            max_concurrency: self.max_concurrency,
            timeout_secs: self.timeout_secs,
            api_key_env: self.api_key_env.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainerConfig {
    pub url: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// Retries after the first attempt, for 429/5xx/timeouts/connection errors/garbage bodies.
    pub max_retries: u32,
    pub min_delay_ms: u64,
    pub max_delay_ms: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_retries: 5,
            min_delay_ms: 200,
            max_delay_ms: 10_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthConfig {
    pub probe_interval_secs: u64,
    /// Consecutive failures after which an endpoint is taken out of rotation until a probe passes.
    pub failures_before_unhealthy: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            probe_interval_secs: 10,
            failures_before_unhealthy: 3,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutConfig {
    /// Rollouts per task (the GRPO group size).
    pub n: u32,
    /// Unique tasks per step.
    pub tasks_per_step: u32,
    pub max_tool_calls: u32,
    /// Token budget for the model's output across all turns of one trajectory.
    pub max_tokens: u32,
    pub temperature: f32,
    pub top_p: f32,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("unknown experiment preset `{name}`; available presets: {available}")]
    UnknownPreset { name: String, available: String },
    #[error("cannot read config file {path}: {source}")]
    ReadFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid TOML in {origin}: {message}")]
    Toml { origin: String, message: String },
    #[error("invalid override `{arg}`: expected KEY=VALUE with a dotted key, e.g. rollout.n=8")]
    BadOverride { arg: String },
    #[error("override `{key}` does not name a configuration table: `{segment}` is a value")]
    NotATable { key: String, segment: String },
    #[error("invalid configuration: {0}")]
    Schema(String),
    #[error("`{field}` = {value} is out of range; allowed: {allowed}")]
    OutOfRange {
        field: &'static str,
        value: String,
        allowed: &'static str,
    },
}

/// Everything that can override a preset, in increasing precedence: file, then explicit values
/// (flags or their environment variables, which clap has already merged).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub file: Option<PathBuf>,
    pub database_url: Option<String>,
    pub policy_urls: Option<Vec<String>>,
    pub judge_urls: Option<Vec<String>>,
    pub embeddings_urls: Option<Vec<String>>,
    pub trainer_url: Option<String>,
    pub steps: Option<u32>,
    /// `KEY=VALUE` pairs with dotted keys; VALUE is parsed as TOML, else taken as a string.
    pub sets: Vec<String>,
}

pub fn preset_names() -> Vec<&'static str> {
    PRESETS.iter().map(|(n, _)| *n).collect()
}

fn parse_toml(text: &str, origin: &str) -> Result<toml::Table, ConfigError> {
    text.parse::<toml::Table>().map_err(|e| ConfigError::Toml {
        origin: origin.to_string(),
        message: e.to_string(),
    })
}

/// Deep-merge `over` into `base`: tables merge key by key, everything else replaces.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

fn set_path(root: &mut toml::Table, key: &str, value: toml::Value) -> Result<(), ConfigError> {
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|p| p.trim().is_empty()) {
        return Err(ConfigError::BadOverride {
            arg: key.to_string(),
        });
    }
    let (last, parents) = parts
        .split_last()
        .ok_or(ConfigError::BadOverride { arg: key.into() })?;
    let mut table = root;
    for seg in parents {
        let entry = table
            .entry(seg.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = match entry {
            toml::Value::Table(t) => t,
            _ => {
                return Err(ConfigError::NotATable {
                    key: key.to_string(),
                    segment: seg.to_string(),
                });
            }
        };
    }
    table.insert(last.to_string(), value);
    Ok(())
}

/// Parse the VALUE of `--set KEY=VALUE`: TOML syntax when it parses (`8`, `true`, `["a"]`,
/// `"s"`), otherwise the raw text as a string.
fn parse_override_value(raw: &str) -> toml::Value {
    match format!("v = {raw}").parse::<toml::Table>() {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.to_string())),
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

fn strings(v: &[String]) -> toml::Value {
    toml::Value::Array(v.iter().map(|s| toml::Value::String(s.clone())).collect())
}

impl Config {
    /// Resolve a preset with its overrides and validate the result.
    pub fn load(preset: &str, ov: &Overrides) -> Result<Config, ConfigError> {
        let text = PRESETS
            .iter()
            .find(|(n, _)| *n == preset)
            .map(|(_, t)| *t)
            .ok_or_else(|| ConfigError::UnknownPreset {
                name: preset.to_string(),
                available: preset_names().join(", "),
            })?;
        let mut table = parse_toml(text, &format!("preset `{preset}`"))?;
        if let Some(path) = &ov.file {
            merge(&mut table, read_file(path)?);
        }
        let explicit: [(&str, Option<toml::Value>); 6] = [
            (
                "database.url",
                ov.database_url.clone().map(toml::Value::String),
            ),
            ("policy.urls", ov.policy_urls.as_deref().map(strings)),
            ("judge.urls", ov.judge_urls.as_deref().map(strings)),
            (
                "embeddings.urls",
                ov.embeddings_urls.as_deref().map(strings),
            ),
            (
                "trainer.url",
                ov.trainer_url.clone().map(toml::Value::String),
            ),
            (
                "experiment.steps",
                ov.steps.map(|s| toml::Value::Integer(i64::from(s))),
            ),
        ];
        for (key, value) in explicit {
            if let Some(v) = value {
                set_path(&mut table, key, v)?;
            }
        }
        for arg in &ov.sets {
            let (k, v) = arg
                .split_once('=')
                .ok_or_else(|| ConfigError::BadOverride { arg: arg.clone() })?;
            set_path(&mut table, k.trim(), parse_override_value(v.trim()))?;
        }
        Self::from_table(table)
    }

    /// Deserialize (unknown keys are errors) and validate.
    pub fn from_table(table: toml::Table) -> Result<Config, ConfigError> {
        // Re-render so that the deserializer's error points at the offending line.
        let text = toml::to_string(&table).map_err(|e| ConfigError::Schema(e.to_string()))?;
        let cfg: Config = toml::from_str(&text).map_err(|e| ConfigError::Schema(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_default()
    }

    /// The configuration as JSON for the run's snapshot in Postgres, with the database password
    /// removed.
    pub fn snapshot(&self) -> serde_json::Value {
        let mut cfg = self.clone();
        cfg.database.url = crate::domain::util::redact_url(&cfg.database.url);
        serde_json::to_value(&cfg).unwrap_or(serde_json::Value::Null)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let e = &self.experiment;
        check(
            !e.name.trim().is_empty(),
            "experiment.name",
            "\"\"",
            "a non-empty name",
        )?;
        check(
            !e.recipes.is_empty(),
            "experiment.recipes",
            "[]",
            "one or more of baseline-rl, ss-grpo, meta-policy, full, drtulu",
        )?;
        check(
            e.steps >= 1 && e.steps <= 1_000_000,
            "experiment.steps",
            e.steps,
            "1..=1000000",
        )?;
        let p = &self.pipeline;
        check(
            p.max_staleness <= 16,
            "pipeline.max_staleness",
            p.max_staleness,
            "0..=16 (0 = sequential)",
        )?;
        check(
            (1..=4096).contains(&p.max_inflight),
            "pipeline.max_inflight",
            p.max_inflight,
            "1..=4096",
        )?;
        check(
            (1..=86_400).contains(&p.trainer_wait_secs),
            "pipeline.trainer_wait_secs",
            p.trainer_wait_secs,
            "1..=86400",
        )?;
        check(
            !p.checkpoint_subdir.is_empty()
                && p.checkpoint_subdir
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c)),
            "pipeline.checkpoint_subdir",
            format!("{:?}", p.checkpoint_subdir),
            "a plain name of letters, digits, '-' and '_'",
        )?;
        let r = &self.reflection;
        check(
            (1..=64).contains(&r.candidates),
            "reflection.candidates",
            r.candidates,
            "1..=64",
        )?;
        check(
            r.temperature.is_finite() && (0.0..=2.0).contains(&r.temperature),
            "reflection.temperature",
            r.temperature,
            "0..=2",
        )?;
        check(
            (16..=32_768).contains(&r.max_tokens),
            "reflection.max_tokens",
            r.max_tokens,
            "16..=32768",
        )?;
        check(
            (0.0..=1.0).contains(&r.accept_threshold),
            "reflection.accept_threshold",
            r.accept_threshold,
            "0..=1",
        )?;
        check(
            (1..=16).contains(&r.top_k),
            "reflection.top_k",
            r.top_k,
            "1..=16",
        )?;
        check(
            (1..=1000).contains(&r.window),
            "reflection.window",
            r.window,
            "1..=1000",
        )?;
        check(
            (4..=10_000_000).contains(&self.data.world_docs),
            "data.world_docs",
            self.data.world_docs,
            "4..=10000000",
        )?;
        check(
            (1..=1_000_000).contains(&self.data.world_tasks),
            "data.world_tasks",
            self.data.world_tasks,
            "1..=1000000",
        )?;
        check(
            !self.database.url.is_empty(),
            "database.url",
            "\"\"",
            "a postgres:// URL",
        )?;
        check(
            (1..=1024).contains(&self.database.max_connections),
            "database.max_connections",
            self.database.max_connections,
            "1..=1024",
        )?;
        validate_pool("policy", &self.policy, true)?;
        validate_pool(
            "judge",
            &self.judge.pool(),
            self.judge.kind == JudgeKind::Llm,
        )?;
        validate_pool("embeddings", &self.embeddings, false)?;
        validate_url("trainer.url", &self.trainer.url)?;
        let r = &self.retry;
        check(
            r.max_retries <= 20,
            "retry.max_retries",
            r.max_retries,
            "0..=20",
        )?;
        check(
            r.min_delay_ms >= 1,
            "retry.min_delay_ms",
            r.min_delay_ms,
            ">= 1",
        )?;
        check(
            r.max_delay_ms >= r.min_delay_ms && r.max_delay_ms <= 600_000,
            "retry.max_delay_ms",
            r.max_delay_ms,
            "retry.min_delay_ms..=600000",
        )?;
        let h = &self.health;
        check(
            (1..=3600).contains(&h.probe_interval_secs),
            "health.probe_interval_secs",
            h.probe_interval_secs,
            "1..=3600",
        )?;
        check(
            (1..=100).contains(&h.failures_before_unhealthy),
            "health.failures_before_unhealthy",
            h.failures_before_unhealthy,
            "1..=100",
        )?;
        let ro = &self.rollout;
        check((1..=64).contains(&ro.n), "rollout.n", ro.n, "1..=64")?;
        check(
            (1..=4096).contains(&ro.tasks_per_step),
            "rollout.tasks_per_step",
            ro.tasks_per_step,
            "1..=4096",
        )?;
        check(
            ro.max_tool_calls <= 100,
            "rollout.max_tool_calls",
            ro.max_tool_calls,
            "0..=100",
        )?;
        check(
            (16..=262_144).contains(&ro.max_tokens),
            "rollout.max_tokens",
            ro.max_tokens,
            "16..=262144",
        )?;
        check(
            ro.temperature > 0.0 && ro.temperature <= 2.0,
            "rollout.temperature",
            ro.temperature,
            "(0, 2]",
        )?;
        check(
            ro.top_p > 0.0 && ro.top_p <= 1.0,
            "rollout.top_p",
            ro.top_p,
            "(0, 1]",
        )?;
        self.validate_eval()
    }

    fn validate_eval(&self) -> Result<(), ConfigError> {
        let ev = &self.eval;
        check((1..=64).contains(&ev.n), "eval.n", ev.n, "1..=64")?;
        check(
            ev.held_out <= 1_000_000,
            "eval.held_out",
            ev.held_out,
            "0..=1000000",
        )?;
        if let Some(t) = ev.temperature {
            check(
                t.is_finite() && (0.0..=2.0).contains(&t),
                "eval.temperature",
                t,
                "0..=2 (0 = greedy)",
            )?;
        }
        let mut names = std::collections::BTreeSet::new();
        for set in &ev.sets {
            check(
                !set.name.is_empty()
                    && set.name != HELD_OUT
                    && set
                        .name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c)),
                "eval.sets.name",
                format!("{:?}", set.name),
                "a plain name of letters, digits, '-' and '_', other than \"held-out\"",
            )?;
            check(
                names.insert(set.name.as_str()),
                "eval.sets.name",
                format!("{:?}", set.name),
                "a name used by one set only",
            )?;
            check(
                (1..=1_000_000).contains(&set.size),
                "eval.sets.size",
                set.size,
                "1..=1000000",
            )?;
        }
        Ok(())
    }
}

fn read_file(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
        path: path.to_path_buf(),
        source,
    })?;
    parse_toml(&text, &path.display().to_string())
}

fn check(
    ok: bool,
    field: &'static str,
    value: impl std::fmt::Display,
    allowed: &'static str,
) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange {
            field,
            value: value.to_string(),
            allowed,
        })
    }
}

fn validate_url(field: &'static str, raw: &str) -> Result<(), ConfigError> {
    match url::Url::parse(raw) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Ok(()),
        _ => Err(ConfigError::OutOfRange {
            field,
            value: format!("{raw:?}"),
            allowed: "an http:// or https:// URL with a host",
        }),
    }
}

fn validate_pool(
    role: &'static str,
    pool: &EndpointPoolConfig,
    need_urls: bool,
) -> Result<(), ConfigError> {
    let (urls_f, conc_f, timeout_f) = match role {
        "policy" => (
            "policy.urls",
            "policy.max_concurrency",
            "policy.timeout_secs",
        ),
        "judge" => ("judge.urls", "judge.max_concurrency", "judge.timeout_secs"),
        _ => (
            "embeddings.urls",
            "embeddings.max_concurrency",
            "embeddings.timeout_secs",
        ),
    };
    if need_urls {
        check(
            !pool.urls.is_empty(),
            urls_f,
            "[]",
            "at least one http(s) URL",
        )?;
    }
    for u in &pool.urls {
        validate_url(urls_f, u)?;
    }
    check(
        (1..=65_536).contains(&pool.max_concurrency),
        conc_f,
        pool.max_concurrency,
        "1..=65536",
    )?;
    check(
        (1..=86_400).contains(&pool.timeout_secs),
        timeout_f,
        pool.timeout_secs,
        "1..=86400",
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipe_names_parse_back_as_serde_writes_them() {
        for r in Recipe::ALL {
            assert_eq!(Recipe::parse(r.as_str()), Some(r));
            assert_eq!(
                serde_json::to_value(r).unwrap(),
                serde_json::Value::String(r.as_str().into())
            );
        }
        assert_eq!(Recipe::parse("rollout"), None);
    }

    #[test]
    fn every_preset_loads_and_validates() {
        for name in preset_names() {
            let cfg = Config::load(name, &Overrides::default()).unwrap();
            assert_eq!(cfg.experiment.name, name);
        }
    }

    #[test]
    fn ablation_has_the_four_recipes() {
        let cfg = Config::load("ablation-600", &Overrides::default()).unwrap();
        assert_eq!(
            cfg.experiment.recipes,
            vec![
                Recipe::BaselineRl,
                Recipe::SsGrpo,
                Recipe::MetaPolicy,
                Recipe::Full
            ]
        );
        assert_eq!(cfg.experiment.steps, 600);
        assert_eq!(cfg.rollout.n * cfg.rollout.tasks_per_step, 256);
    }

    #[test]
    fn precedence_preset_file_flags() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("o.toml");
        std::fs::write(&file, "[rollout]\nn = 2\ntemperature = 0.5\n").unwrap();
        let ov = Overrides {
            file: Some(file),
            sets: vec!["rollout.n=6".into(), "judge.model=\"g\"".into()],
            steps: Some(3),
            policy_urls: Some(vec!["http://a:1".into(), "http://b:2".into()]),
            ..Default::default()
        };
        let cfg = Config::load("smoke", &ov).unwrap();
        assert_eq!(cfg.rollout.n, 6, "--set beats the file");
        assert_eq!(cfg.rollout.temperature, 0.5, "the file beats the preset");
        assert_eq!(cfg.experiment.steps, 3);
        assert_eq!(cfg.judge.model, "g");
        assert_eq!(cfg.policy.urls, vec!["http://a:1", "http://b:2"]);
        assert_eq!(
            cfg.rollout.max_tokens, 512,
            "untouched keys keep the preset"
        );
    }

    #[test]
    fn eval_settings_are_validated() {
        let load = |sets: &[&str]| {
            Config::load(
                "smoke",
                &Overrides {
                    sets: sets.iter().map(|s| s.to_string()).collect(),
                    ..Default::default()
                },
            )
        };
        let cfg = load(&[]).unwrap();
        assert_eq!(cfg.eval.held_out, 8);
        assert!(cfg.eval.enabled() && cfg.eval.initial);
        let err = load(&["eval.n=0"]).unwrap_err().to_string();
        assert_eq!(err, "`eval.n` = 0 is out of range; allowed: 1..=64");
        let err = load(&["eval.temperature=2.5"]).unwrap_err().to_string();
        assert_eq!(
            err,
            "`eval.temperature` = 2.5 is out of range; allowed: 0..=2 (0 = greedy)"
        );
        assert_eq!(
            load(&["eval.temperature=0"]).unwrap().eval.temperature,
            Some(0.0)
        );
        let set = |name: &str, size: u32| {
            format!("eval.sets=[{{name = \"{name}\", tasks = \"t.jsonl\", size = {size}}}]")
        };
        assert_eq!(
            load(&[&set("hotpotqa", 100)]).unwrap().eval.sets[0].size,
            100
        );
        let err = load(&[&set("held-out", 5)]).unwrap_err().to_string();
        assert!(err.starts_with("`eval.sets.name` = \"held-out\""), "{err}");
        let err = load(&[&set("a b", 5)]).unwrap_err().to_string();
        assert!(err.contains("letters, digits"), "{err}");
        let err = load(&[&set("qa", 0)]).unwrap_err().to_string();
        assert_eq!(
            err,
            "`eval.sets.size` = 0 is out of range; allowed: 1..=1000000"
        );
        let two = "eval.sets=[{name = \"qa\", tasks = \"a\", size = 1}, {name = \"qa\", tasks = \"b\", size = 1}]";
        let err = load(&[two]).unwrap_err().to_string();
        assert!(err.contains("used by one set only"), "{err}");
        for p in ["ablation-600", "rubricem", "drtulu"] {
            let c = Config::load(p, &Overrides::default()).unwrap();
            assert!(c.eval.enabled(), "{p} evaluates on a fixed subset");
        }
    }

    #[test]
    fn unknown_key_is_an_error_naming_it() {
        let ov = Overrides {
            sets: vec!["rollout.nn=3".into()],
            ..Default::default()
        };
        let err = Config::load("smoke", &ov).unwrap_err().to_string();
        assert!(err.contains("unknown field `nn`"), "{err}");
        let ov = Overrides {
            sets: vec!["bogus.x=1".into()],
            ..Default::default()
        };
        let err = Config::load("smoke", &ov).unwrap_err().to_string();
        assert!(err.contains("bogus"), "{err}");
    }

    #[test]
    fn out_of_range_names_field_value_and_limit() {
        let ov = Overrides {
            sets: vec!["rollout.n=0".into()],
            ..Default::default()
        };
        let err = Config::load("smoke", &ov).unwrap_err().to_string();
        assert_eq!(err, "`rollout.n` = 0 is out of range; allowed: 1..=64");
        let ov = Overrides {
            sets: vec!["rollout.temperature=3.5".into()],
            ..Default::default()
        };
        let err = Config::load("smoke", &ov).unwrap_err().to_string();
        assert!(
            err.contains("rollout.temperature") && err.contains("3.5"),
            "{err}"
        );
        let ov = Overrides {
            policy_urls: Some(vec!["ftp://x".into()]),
            ..Default::default()
        };
        let err = Config::load("smoke", &ov).unwrap_err().to_string();
        assert!(
            err.contains("policy.urls") && err.contains("ftp://x"),
            "{err}"
        );
    }

    #[test]
    fn bad_enum_lists_allowed_values() {
        let ov = Overrides {
            sets: vec!["judge.kind=\"oracle\"".into()],
            ..Default::default()
        };
        let err = Config::load("smoke", &ov).unwrap_err().to_string();
        assert!(err.contains("oracle") && err.contains("lexical"), "{err}");
        let ov = Overrides {
            sets: vec!["experiment.recipes=[\"ppo\"]".into()],
            ..Default::default()
        };
        let err = Config::load("smoke", &ov).unwrap_err().to_string();
        assert!(err.contains("ppo") && err.contains("baseline-rl"), "{err}");
    }

    #[test]
    fn unknown_preset_lists_presets() {
        let err = Config::load("nope", &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("nope") && err.contains("ablation-600"),
            "{err}"
        );
    }

    #[test]
    fn malformed_override_is_rejected() {
        for bad in ["rollout.n", "=3", "rollout..n=3"] {
            let ov = Overrides {
                sets: vec![bad.into()],
                ..Default::default()
            };
            assert!(Config::load("smoke", &ov).is_err(), "{bad}");
        }
        let ov = Overrides {
            sets: vec!["rollout.n.x=3".into()],
            ..Default::default()
        };
        let err = Config::load("smoke", &ov).unwrap_err().to_string();
        assert!(err.contains("`n` is a value"), "{err}");
    }

    #[test]
    fn snapshot_redacts_password() {
        let ov = Overrides {
            database_url: Some("postgres://u:hunter2@h:5432/db".into()),
            ..Default::default()
        };
        let cfg = Config::load("smoke", &ov).unwrap();
        let snap = cfg.snapshot().to_string();
        assert!(!snap.contains("hunter2"), "{snap}");
    }
}
