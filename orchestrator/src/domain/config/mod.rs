//! Experiment configuration: embedded presets < file < environment < flags, validated before
//! anything starts. Unknown keys and out-of-range values are errors that name the field and the
//! allowed values. Nothing here does I/O beyond reading an optional config file.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod validate;

/// The name of the evaluation subset of `data.tasks` kept out of training (`eval.held_out`).
pub const HELD_OUT: &str = "held-out";

/// The database the set-up script creates, reached over local TCP with trust auth.
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
        "ablation-mini",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/experiments/ablation-mini.toml"
        )),
    ),
    (
        "guided",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/experiments/guided.toml"
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
    (
        "deeprubric",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/experiments/deeprubric.toml"
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
    /// DeepRubric: fixed evidence-tree rubrics, `Σ w·s / Σ |w|`, the composite reward.
    Deeprubric,
}

impl Recipe {
    pub fn as_str(self) -> &'static str {
        match self {
            Recipe::BaselineRl => "baseline-rl",
            Recipe::SsGrpo => "ss-grpo",
            Recipe::MetaPolicy => "meta-policy",
            Recipe::Full => "full",
            Recipe::Drtulu => "drtulu",
            Recipe::Deeprubric => "deeprubric",
        }
    }

    /// Recipes with the reflection meta-policy, rubric bank and windowed curriculum.
    pub fn reflects(self) -> bool {
        matches!(self, Recipe::MetaPolicy | Recipe::Full)
    }

    pub const ALL: [Recipe; 6] = [
        Recipe::BaselineRl,
        Recipe::SsGrpo,
        Recipe::MetaPolicy,
        Recipe::Full,
        Recipe::Drtulu,
        Recipe::Deeprubric,
    ];

    /// The recipe named `s` as stored in `runs.recipe` and written in presets.
    pub fn parse(s: &str) -> Option<Recipe> {
        Recipe::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// Which judge scores a run (`judge.kind`): one type with the judge's own.
pub use crate::domain::judge::JudgeKind;
pub use crate::domain::schedule::Inject;

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
    /// Experiment trackers the run's step metrics are copied to (off unless configured).
    #[serde(default, skip_serializing_if = "TrackingConfig::is_off")]
    pub tracking: TrackingConfig,
}

/// Experiment trackers (`[tracking]`): while a run goes on, its `step_metrics` are copied every
/// `poll_secs` to TensorBoard event files and / or an MLflow tracking server under the names of
/// `domain::tracking::MAPPING`. Trackers never stop or slow a run: their errors are logged and
/// retried at the next poll.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrackingConfig {
    /// TensorBoard log directory: each run writes
    /// `<dir>/<experiment>/<run>.<id8>/events.out.tfevents.*`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensorboard_dir: Option<PathBuf>,
    /// MLflow tracking server (`http(s)://host:port`); a token, if the server wants one, comes
    /// from `MLFLOW_TRACKING_TOKEN` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mlflow_url: Option<String>,
    /// MLflow experiment (created when missing); unset: `experiment.name`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mlflow_experiment: Option<String>,
    /// Seconds between two reads of the run's new metrics.
    pub poll_secs: u64,
}

impl Default for TrackingConfig {
    fn default() -> Self {
        Self {
            tensorboard_dir: None,
            mlflow_url: None,
            mlflow_experiment: None,
            poll_secs: 5,
        }
    }
}

impl TrackingConfig {
    /// Whether any tracker is configured.
    pub fn enabled(&self) -> bool {
        self.tensorboard_dir.is_some() || self.mlflow_url.is_some()
    }

    /// Nothing set beyond the defaults (then `[tracking]` is left out of the rendered config).
    pub fn is_off(&self) -> bool {
        *self == Self::default()
    }
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
    /// Samples per task on this set; unset = `eval.n`. With `temperature`, one task file can be
    /// evaluated greedily in one set and at the rollout temperature in another, in one run.
    /// Not with `benchmark` (a benchmark's protocol fixes its samples).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// Sampling temperature on this set (0 = greedy); unset = `eval.temperature`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// The benchmark `tasks` is a published file of (e.g. "simpleqa", "healthbench"): the set
    /// is then scored by the benchmark harness with the benchmark's own protocol and the
    /// `judges` panel (the gold judges), stored as a benchmark evaluation per policy version,
    /// and compared with the training reward (the reward-hacking monitor). Unset: a task file
    /// scored like `held-out`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub benchmark: Option<String>,
    /// The gold judge panel of a benchmark set, distinct from the training judge. Empty on a
    /// short-answer benchmark: exact match only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub judges: Vec<GoldJudge>,
}

/// One gold judge of a benchmark evaluation set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoldJudge {
    /// OpenAI-compatible base URL.
    pub url: String,
    pub model: String,
    /// Name of the environment variable holding its API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
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
    /// Each injected bank item's rubrics and takeaways are cut to this many characters
    /// together, whole lines only (`Retrieved::clipped`); 0 = whole items (the paper's). A cap
    /// for long items at scale; on the smoke warm start, which only ever saw whole items, cut
    /// items raised the budget-cut share (BENCHMARKS.md, issue 25 session 40).
    pub max_item_chars: usize,
    /// How long training of step s waits for the reflection job of step s - 1 before it trains
    /// without it (the candidates then join a later step; the lag is a metric).
    pub wait_secs: u64,
    /// Which bank items the training prompts carry: "curriculum" (the default, RubricEM's:
    /// cross-episode on new steps, within-episode on replays), "cross" (new steps only),
    /// "within" (replays only, no cross-episode fallback) or "none" (no block; the bank and the
    /// curriculum stay). An ablation of the memory half (issue 25, session 61: the bank recipes
    /// lost in `guided` what Baseline-RL gains). Not serialised at the default, so earlier
    /// runs' settings hashes stand.
    #[serde(default, skip_serializing_if = "Inject::is_curriculum")]
    pub inject: Inject,
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
            max_item_chars: 0,
            wait_secs: 600,
            inject: Inject::Curriculum,
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
    /// Trajectories in flight at once, across every step being rolled out.
    pub max_inflight: u32,
    /// Start a step's trajectories in the slots the previous step's finished trajectories free,
    /// instead of after that step's last trajectory: the policy servers keep a full batch while a
    /// step's longest attempts finish. Each step still waits for the staleness bound, so no
    /// trajectory starts on an older policy than without it; steps are still committed, judged
    /// and trained in order. No effect with max_staleness 0 (a step then waits for the previous
    /// step's training, which waits for all its rollouts).
    pub overlap_rollouts: bool,
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
            overlap_rollouts: false,
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
    /// The one tool name the local index is served under (`snippet_search`: passages of a
    /// corpus; the smoke world's offline SFT data calls it `google_search`).
    pub index_tool: String,
    /// Snippets one local search returns (a call may ask for another number with `num`).
    pub index_k: usize,
    /// Directory with the policy's tokenizer.json (and chat template).
    pub tokenizer: PathBuf,
    /// Generate the research world into the task file's directory when it is missing.
    pub world_seed: Option<u64>,
    pub world_docs: usize,
    pub world_tasks: usize,
    /// Held-out tasks written beside the task file (`heldout.jsonl`) about lineages and cities
    /// no training task mentions; an `eval.sets` entry evaluates on them. 0 = none.
    pub world_held_out: usize,
    /// Agent scaffold: rubricem, drtulu or react (parsed once, here).
    pub scaffold: crate::domain::scaffold::Scaffold,
}

/// No defaults for a run's inputs: a preset that leaves them empty refuses to start, naming
/// each (`--set data.tasks=...`); only the smoke preset points them at the smoke world.
impl Default for DataConfig {
    fn default() -> Self {
        Self {
            tasks: PathBuf::new(),
            index: PathBuf::new(),
            index_tool: "snippet_search".into(),
            index_k: 5,
            tokenizer: PathBuf::new(),
            world_seed: None,
            world_docs: 400,
            world_tasks: 96,
            world_held_out: 0,
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
    /// The experiment's seed: the held-out and evaluation picks (the same for every run of the
    /// experiment) and, when `seeds` is empty, each run's training seed.
    pub seed: u64,
    /// Training seeds: each recipe runs once per seed (rollout sampling, the task schedule and
    /// the reflection picks), all from the same starting policy and on the same held-out pick,
    /// so a recipe's scores come with their seed-to-seed spread. Empty: one run per recipe on
    /// `seed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seeds: Vec<u64>,
}

impl ExperimentConfig {
    /// The training seed of each run of a recipe: `seeds`, or `[seed]` when it is empty.
    pub fn run_seeds(&self) -> Vec<u64> {
        if self.seeds.is_empty() {
            vec![self.seed]
        } else {
            self.seeds.clone()
        }
    }
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
    /// Circuit breaker: when more than this fraction of a step's scoring calls fail after their
    /// retries, the step is not trained and the run pauses (resume once the judge answers).
    #[serde(default = "default_max_failure_rate")]
    pub max_failure_rate: f64,
    /// Persistent Research rubrics from each task's evidence chain (one per evidence document
    /// its Answer rubrics name: "the Research stage retrieved it"), beside the generated ones
    /// (`domain::rubrics::evidence_rubrics`). Off by default: method.md A.4.1 keeps persistent
    /// rubrics to the Answer stage. Only tasks with `evidence` ids (the research world's) get any,
    /// and only in the stagewise recipes (the answer-only DR Tulu and DeepRubric ignore it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub research_evidence: bool,
}

fn default_max_stage_chars() -> usize {
    12_000
}

fn default_max_failure_rate() -> f64 {
    0.2
}

/// Credit assignment settings (method.md A.5, B.6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreditConfig {
    /// The stage-dependence matrix Λ (rows: stages; upper-triangular, unit diagonal).
    #[serde(default)]
    pub lambda: crate::domain::credit::Lambda,
    /// DR Tulu recipe: include the citation reward (claim-level judge calls).
    #[serde(default)]
    pub citation: bool,
    /// Overlong filtering (DAPO, Yu et al. 2025, section 3.4): trajectories cut by the token
    /// budget or stopped in a loop (`finish_reason` `length` or `repetition`) keep their reward
    /// in their group's statistics, so the members that finished are still credited against
    /// them, but their own tokens are left out of the loss: a reasoning chain that was merely
    /// cut is not pushed down as if it were wrong.
    /// Counted per step as `train/overlong_filtered`. Off by default (none of the three papers
    /// uses it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overlong_filter: bool,
    /// An attempt stopped in a loop (`finish_reason` `repetition`) keeps only the loop's tokens
    /// (the copies `rollout.repetition_detection` stopped it on) in the loss; its tokens before
    /// the loop leave it. Its reward still counts in its group, and its advantage (negative when
    /// it scored below the group) then lands on the loop alone, not on the plan, searches and
    /// review before it, where 92% of what a policy gradient can move sat in session 47's
    /// measurement (BENCHMARKS, issue 25). Budget cuts are trained whole. Counted per step as
    /// `train/loop_only` (and `train/loop_only_tokens`; `train/loop_not_found` when the rule
    /// finds no closing loop, trained whole). Needs `rollout.repetition_detection`; not with
    /// `overlong_filter`, which leaves the whole attempt out. Off by default (no paper does
    /// this).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub loop_tokens_only: bool,
    /// What a negative advantage is multiplied by in the training batch, in [0, 1] (1, the
    /// default: the policy gradient as every paper writes it). Positive advantages are kept.
    /// 0 trains on the better-than-group attempts alone: Zhu et al. 2025's positive sample
    /// reinforcement (PSR, "The Surprising Effectiveness of Negative Reinforcement in LLM
    /// Reasoning"), an advantage-weighted form of rejection-sampling fine-tuning (RAFT, Dong et
    /// al. 2023). Why here (issue 25): at this model size the negative side flattens the text
    /// before a loop and the flattened policy loops more (session 48's lr 2e-4 run), while SFT
    /// transfers across lineages. The stored advantages (and so the group statistics and the
    /// judge's record) are unchanged; per stage for SS-GRPO. Reflection candidates' updates
    /// are not affected (`reflection_negative_advantage_scale` is theirs). Not serialised at 1,
    /// so earlier runs' settings hashes stand.
    #[serde(
        default = "unit_scale",
        skip_serializing_if = "is_unit_scale",
        rename = "negative_advantage_scale"
    )]
    pub negative_scale: f64,
    /// The same for the meta-policy's Phase A update: what a reflection candidate's negative
    /// advantage (its utility below its candidate group's mean; an invalid candidate scores 0)
    /// is multiplied by in the training batch, in [0, 1] (1, the default: RubricEM's GRPO
    /// over candidates as written). 0 trains on the better-than-group candidates alone. Why
    /// (issue 25, session 60): under `guided`'s lr 5e-4 the meta-policy's first two Phase A
    /// updates, with both signs, took the valid-candidate share from 0.25-0.38 to 0 for the
    /// rest of the run. Applied after the degenerate-group test, as the task side's; the
    /// stored advantages are unchanged. Not serialised at 1, so earlier runs' hashes stand.
    #[serde(
        default = "unit_scale",
        skip_serializing_if = "is_unit_scale",
        rename = "reflection_negative_advantage_scale"
    )]
    pub reflection_negative_scale: f64,
    /// What a loop-stopped attempt's negative advantages (finish reason `repetition`) are
    /// multiplied by, in [0, 1], in place of `negative_advantage_scale`; absent (the default):
    /// that scale, as every other attempt's. Why (issue 25, sessions 58-59): with the positive
    /// advantages alone (`negative_advantage_scale = 0`) a loop-stopped attempt, which scores
    /// about 0, trains with advantage 0, so nothing in the update pushes a loop down, and in
    /// some seeds the policy drifted late into loops on tasks about entities it never trained
    /// on. This puts a negative signal on the loop-stopped attempts alone, without session 48's
    /// collapse at both signs on every attempt. With `loop_tokens_only` it lands on the loop's
    /// tokens alone. Counted per step as `train/loop_negative` (loop-stopped sequences trained
    /// with a negative advantage). Needs `rollout.repetition_detection`. Not serialised when
    /// absent, so earlier runs' settings hashes stand. No paper does this.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "loop_negative_advantage_scale"
    )]
    pub loop_negative_scale: Option<f64>,
    /// Off-policy guidance (LUFFY, Yan et al. 2025, "Learning to Reason under Off-Policy
    /// Guidance"): a file of demonstrations in the rows `orchestrator sft-data` writes (one per
    /// task id; reflection rows skipped). Each training task with a demonstration gets it as
    /// one more member of its group (`sample_index` = `rollout.n`, server `teacher`): replayed
    /// through the rollout engine with this run's tools, judged with the others, counted in
    /// the group's statistics and trained on with its advantage. Its tokens have no recorded
    /// behaviour log-probs, so the trainer takes no truncated importance weight on them and
    /// the ratio is against the step's own policy (ratio 1 on the first pass). LUFFY's
    /// policy shaping of the off-policy tokens is not applied. The rollout metrics
    /// (`rollout/*`) are of the policy's samples alone; `rollout/guidance` counts the
    /// demonstrations added. Why here (issue 25, session 51): the RL tasks' demonstrations
    /// teach this model what its own samples do not. Absent (off) in every preset but
    /// `guided`: none of the three papers does this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guidance_demos: Option<PathBuf>,
}

impl Default for CreditConfig {
    fn default() -> Self {
        Self {
            lambda: Default::default(),
            citation: false,
            overlong_filter: false,
            loop_tokens_only: false,
            negative_scale: 1.0,
            reflection_negative_scale: 1.0,
            loop_negative_scale: None,
            guidance_demos: None,
        }
    }
}

fn unit_scale() -> f64 {
    1.0
}

fn is_unit_scale(x: &f64) -> bool {
    *x == 1.0
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

/// The `[trainer]` table: where `trainer serve` listens and the optimisation settings the run
/// trains with (`wire::TrainSettings`: learning rate and schedule, AdamW, KL, clipping, LoRA or
/// full fine-tune, minibatches per step). The settings are sent to the trainer when a run starts
/// or resumes, echoed back, stored with the run, and every train step carries their hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "toml::Table")]
pub struct TrainerConfig {
    pub url: String,
    #[serde(flatten)]
    pub settings: wire::TrainSettings,
}

impl TryFrom<toml::Table> for TrainerConfig {
    type Error = String;

    /// `url` and the settings share one table; unknown keys are errors (serde's `flatten`
    /// would drop them silently).
    fn try_from(mut t: toml::Table) -> Result<Self, String> {
        let url = match t.remove("url") {
            Some(toml::Value::String(u)) => u,
            Some(other) => return Err(format!("trainer.url = {other}; expected a string")),
            None => return Err("missing field `url` in [trainer]".into()),
        };
        let settings = toml::Value::Table(t)
            .try_into::<wire::TrainSettings>()
            .map_err(|e| format!("[trainer]: {}", e.to_string().trim()))?;
        Ok(Self { url, settings })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
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
#[serde(deny_unknown_fields, default)]
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
    /// Token budget for everything after the prompt across all turns of one trajectory (model
    /// and tool tokens), as in DR Tulu.
    pub max_tokens: u32,
    /// Part of `max_tokens` held back for a forced final answer; unset: an eighth of
    /// `max_tokens`, clamped to 16..=2048 (see [`RolloutConfig::forced_answer_budget`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forced_answer_tokens: Option<u32>,
    /// Longest prompt (system + question, after bank injection) in tokens; tasks whose prompt is
    /// longer are left out of training at start (DR Tulu filters its prompts the same way), and
    /// a rollout whose injected prompt is longer ends at once (`prompt_too_long`). Unset: no
    /// limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_prompt_tokens: Option<u32>,
    pub temperature: f32,
    pub top_p: f32,
    /// Ends a turn whose generated tokens close in a verbatim loop, and with it the trajectory
    /// (finish reason `repetition`, scored and trained like a budget cut), instead of
    /// generating the loop to the budget. Sent as vLLM's `repetition_detection` request field
    /// (vLLM >= 0.17; `trainer serve` applies the same rule; a server without it may ignore
    /// the field or refuse the request). Unset: off, as in the papers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_detection: Option<RepetitionDetection>,
    /// With `repetition_detection`: a loop stopped before the answer opened is cut back to
    /// where its copies begin, and the answer is forced with the reserved budget (`<answer>`
    /// injected, as when the budget runs out): DR Tulu runs a forced answer step for an
    /// attempt that has none (benchmarks.md, section 10). The cut copies are neither kept nor
    /// trained; the trajectory records how many tokens were cut (`parsed.loop_cut_tokens`). A
    /// loop inside the answer, or in the forced answer, still ends the trajectory
    /// (`repetition`). Off: every loop stop ends it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub answer_after_loop: bool,
}

/// vLLM's repetition rule: a turn stops when its last `p x min_count` generated tokens are
/// `min_count` copies of one `p`-token block, for some `p` in
/// `min_pattern_size..=max_pattern_size`. Sent to the policy server as it is (the field names
/// are vLLM's request fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepetitionDetection {
    pub max_pattern_size: u32,
    #[serde(default = "one")]
    pub min_pattern_size: u32,
    pub min_count: u32,
}

fn one() -> u32 {
    1
}

impl RepetitionDetection {
    /// The tokens of the loop this rule ends `ids` on: `min_count x p` for the smallest block
    /// size `p` in `min_pattern_size..=max_pattern_size` whose last `min_count` copies close
    /// `ids`; `None` when no block does (the rule would not have stopped here). The rule is
    /// [`wire::repetition::loop_len`], the one `trainer serve` stops samples with.
    pub fn loop_len(&self, ids: &[u32]) -> Option<usize> {
        wire::repetition::loop_len(
            ids,
            self.min_pattern_size as usize,
            self.max_pattern_size as usize,
            self.min_count as usize,
        )
    }
}

/// What a cut attempt (`finish::is_cut`: stopped by the token budget or in a loop) puts in the
/// loss. Its reward always counts in its group's advantages; this decides which of its own
/// tokens carry that advantage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CutCredit {
    /// Every model token, as a finished attempt's (the papers').
    #[default]
    Whole,
    /// None: cut attempts are left out of the loss (`credit.overlong_filter`, DAPO's overlong
    /// filtering).
    Drop,
    /// An attempt stopped in a loop (`repetition`) keeps only the loop's tokens (the copies
    /// this rule stopped it on) in the loss, so its advantage lands on the loop, not on the
    /// plan, searches and review before it (`credit.loop_tokens_only`). Budget cuts keep every
    /// token.
    LoopOnly(RepetitionDetection),
}

/// What a step's batch makes of its cut attempts: which of their tokens carry their advantage
/// (`cut`), and, with `trainer.loop_unlikelihood` on, the rule that finds the loop whose
/// repeated copies (every copy after the first) also carry the trainer's unlikelihood term.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchCredit {
    pub cut: CutCredit,
    pub unlikelihood: Option<RepetitionDetection>,
    /// `credit.negative_advantage_scale`: what a negative advantage is multiplied by.
    pub negative_scale: f64,
    /// `credit.reflection_negative_advantage_scale`: the same for reflection candidates.
    pub reflection_negative_scale: f64,
    /// `credit.loop_negative_advantage_scale`: the same for loop-stopped attempts, in place
    /// of `negative_scale` (`None`: `negative_scale`).
    pub loop_negative_scale: Option<f64>,
}

impl Default for BatchCredit {
    fn default() -> Self {
        CutCredit::default().into()
    }
}

impl From<CutCredit> for BatchCredit {
    fn from(cut: CutCredit) -> Self {
        Self {
            cut,
            unlikelihood: None,
            negative_scale: 1.0,
            reflection_negative_scale: 1.0,
            loop_negative_scale: None,
        }
    }
}

impl BatchCredit {
    /// The rule a loop-stopped attempt's loop is found with, when anything needs it.
    pub fn loop_rule(&self) -> Option<RepetitionDetection> {
        match self.cut {
            CutCredit::LoopOnly(rule) => Some(rule),
            _ => self.unlikelihood,
        }
    }

    /// The advantages a trajectory trains with: each negative stage advantage times
    /// `negative_scale` (times `loop_negative_scale` instead, when set, for an attempt stopped
    /// in a loop: `looped`), the rest as stored.
    pub fn trained_advantages(&self, a: [f64; 4], looped: bool) -> [f64; 4] {
        let scale = match self.loop_negative_scale {
            Some(s) if looped => s,
            _ => self.negative_scale,
        };
        a.map(|x| if x < 0.0 { x * scale } else { x })
    }

    /// The advantage a reflection candidate trains with: negative ones times
    /// `reflection_negative_scale`, the rest as stored.
    pub fn trained_reflection_advantage(&self, a: f32) -> f32 {
        if a < 0.0 {
            (f64::from(a) * self.reflection_negative_scale) as f32
        } else {
            a
        }
    }
}

impl Config {
    /// What a step's batch makes of cut attempts: [`Config::cut_credit`], and the loop rule
    /// when `trainer.loop_unlikelihood` is on.
    pub fn batch_credit(&self) -> BatchCredit {
        BatchCredit {
            cut: self.cut_credit(),
            unlikelihood: self
                .rollout
                .repetition_detection
                .filter(|_| self.trainer.settings.loop_unlikelihood > 0.0),
            negative_scale: self.credit.negative_scale,
            reflection_negative_scale: self.credit.reflection_negative_scale,
            loop_negative_scale: self.credit.loop_negative_scale,
        }
    }

    /// What a cut attempt puts in the loss, from `credit` and the loop rule.
    pub fn cut_credit(&self) -> CutCredit {
        match (
            self.credit.overlong_filter,
            self.credit.loop_tokens_only,
            self.rollout.repetition_detection,
        ) {
            (true, _, _) => CutCredit::Drop,
            (false, true, Some(rule)) => CutCredit::LoopOnly(rule),
            _ => CutCredit::Whole,
        }
    }
}

impl RolloutConfig {
    /// The tokens held back for a forced final answer.
    pub fn forced_answer_budget(&self) -> u32 {
        self.forced_answer_tokens
            .unwrap_or((self.max_tokens / 8).clamp(16, 2048))
    }
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
        if let Some(u) = &cfg.tracking.mlflow_url {
            cfg.tracking.mlflow_url = Some(crate::domain::util::redact_url(u));
        }
        serde_json::to_value(&cfg).unwrap_or(serde_json::Value::Null)
    }
}

fn read_file(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
        path: path.to_path_buf(),
        source,
    })?;
    parse_toml(&text, &path.display().to_string())
}

#[cfg(test)]
mod tests;
