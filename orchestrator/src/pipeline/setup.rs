//! Building a [`Pipeline`] for one run of an experiment from its configuration: tasks (and the
//! research world and its index when the preset generates them) split into the training
//! schedule and the held-out evaluation subset, further evaluation sets, tools, tokenizer,
//! policy client with admission control, judge, and the trainer client.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use super::{Pipeline, PipelineError};
use crate::domain::config::{Config, Recipe};
use crate::domain::data::demos::Demo;
use crate::infra::chat::ModelTokenizer;
use crate::infra::db;
use crate::infra::llm::trainer::TrainerClient;
use crate::infra::llm::{LlmClient, Role};
use crate::pipeline::judging::StepOptions;
use crate::pipeline::rollout::{Admission, RolloutCtx, RolloutTask, TokenCodec};

fn setup(m: impl std::fmt::Display) -> PipelineError {
    PipelineError::Setup(m.to_string())
}

/// Generate the research world and build its index when the preset asks for it and they are
/// missing (deterministic per seed, so an existing copy is the same world).
pub fn ensure_world(cfg: &Config) -> Result<(), PipelineError> {
    let d = &cfg.data;
    let Some(seed) = d.world_seed else {
        return Ok(());
    };
    let dir = d.tasks.parent().unwrap_or(Path::new("."));
    if let Some(held) = world_held_out(cfg)
        && d.tasks.exists()
        && !held.exists()
    {
        return Err(setup(format!(
            "data.world_held_out = {} but {} holds a world without {}: it was generated \
             without held-out tasks (their lineages would overlap its training tasks); delete \
             the directory to generate the split world",
            d.world_held_out,
            dir.display(),
            held.display()
        )));
    }
    if !d.tasks.exists() {
        let world = crate::domain::data::world::generate_split(
            seed,
            d.world_docs,
            d.world_tasks,
            d.world_held_out,
        );
        crate::domain::data::world::write(&world, dir)
            .map_err(|e| setup(format!("writing the world to {}: {e}", dir.display())))?;
        tracing::info!(dir = %dir.display(), docs = world.docs.len(), tasks = world.tasks.len(), held_out = world.held_out.len(), "research world generated");
    }
    if !d.index.as_os_str().is_empty() && !d.index.join("meta.json").exists() {
        use crate::infra::tools::local_search::{LocalIndex, read_corpus};
        let docs = read_corpus(&dir.join("corpus.jsonl")).map_err(setup)?;
        LocalIndex::build(&docs, Some(&d.index)).map_err(setup)?;
        tracing::info!(index = %d.index.display(), docs = docs.len(), "local index built");
    }
    Ok(())
}

/// Everything a run shares across its recipes: tasks in the database, evaluation subsets,
/// tools, tokenizer.
pub struct Common {
    /// The training tasks (the task file without the held-out subset), in file order.
    pub tasks: Vec<RolloutTask>,
    /// Each training task's question text (bank key), same order as `tasks`.
    pub questions: Vec<String>,
    /// The fixed evaluation subsets: `held-out` first, then `eval.sets` in order.
    pub evals: Vec<super::evaluate::Subset>,
    /// The benchmark sets (`eval.sets` naming a benchmark), graded by their gold judges.
    pub bench_sets: Vec<super::bench::periodic::BenchSet>,
    pub tools: Arc<crate::infra::tools::runner::ToolRunner>,
    pub codec: Arc<ModelTokenizer>,
    /// The demonstrations of `credit.guidance_demos` by training task id (empty: off).
    pub guidance: Arc<HashMap<uuid::Uuid, Demo>>,
}

/// Load a task file and store its tasks; returns the rows and their ids.
async fn load_tasks(
    pool: &PgPool,
    path: &Path,
) -> Result<(Vec<crate::domain::data::tasks::TaskRow>, Vec<uuid::Uuid>), PipelineError> {
    let rows = crate::domain::data::tasks::load(path).map_err(setup)?;
    if rows.is_empty() {
        return Err(setup(format!("{} holds no tasks", path.display())));
    }
    let new: Vec<db::tasks::NewTask> = rows
        .iter()
        .map(crate::infra::db::tasks::from_task_row)
        .collect();
    let ids = db::tasks::upsert(pool, &new).await?;
    Ok((rows, ids))
}

/// The split world's held-out task file, when the preset generates one
/// (`data.world_seed` and `data.world_held_out > 0`).
pub fn world_held_out(cfg: &Config) -> Option<std::path::PathBuf> {
    let d = &cfg.data;
    (d.world_seed.is_some() && d.world_held_out > 0).then(|| {
        d.tasks
            .parent()
            .unwrap_or(Path::new("."))
            .join(crate::domain::data::world::HELD_OUT_FILE)
    })
}

/// Split the task file into training tasks (with their questions) and the held-out subset
/// (`eval.held_out`), and draw the further evaluation sets; every task is stored in `tasks`.
pub async fn split_tasks(
    cfg: &Config,
    pool: &PgPool,
    system: &str,
) -> Result<(Vec<RolloutTask>, Vec<String>, Vec<super::evaluate::Subset>), PipelineError> {
    use super::evaluate::HELD_OUT;
    let (rows, ids) = load_tasks(pool, &cfg.data.tasks).await?;
    let all = RolloutTask::from_rows(&rows, &ids, system);
    let k = cfg.eval.held_out as usize;
    let mut evals = Vec::new();
    let (mut tasks, mut questions) = (Vec::new(), Vec::new());
    if let Some(path) = world_held_out(cfg) {
        // A split world: every task of data.tasks trains, and `held-out` is a seeded pick of
        // the world's held-out tasks, whose entities no training task mentions.
        let (hrows, hids) = load_tasks(pool, &path).await?;
        if k > hrows.len() {
            return Err(setup(format!(
                "eval.held_out = {k} is more than the {} held-out tasks of {}; allowed: <= \
                 data.world_held_out",
                hrows.len(),
                path.display()
            )));
        }
        let hall = RolloutTask::from_rows(&hrows, &hids, system);
        let picks = crate::domain::schedule::held_out(hrows.len(), k, cfg.experiment.seed);
        if !picks.is_empty() {
            evals.push(subset(HELD_OUT, &picks, &hrows, &hall, None));
        }
        for (t, r) in all.into_iter().zip(&rows) {
            tasks.push(t);
            questions.push(r.query.clone());
        }
    } else {
        let min_train = cfg.rollout.tasks_per_step as usize;
        if k > 0 && k + min_train > rows.len() {
            return Err(setup(format!(
                "eval.held_out = {k} leaves {} of the {} tasks in {} for training; at most {} \
                 can be held out (rollout.tasks_per_step = {min_train} must remain)",
                rows.len().saturating_sub(k),
                rows.len(),
                cfg.data.tasks.display(),
                rows.len().saturating_sub(min_train),
            )));
        }
        let held = crate::domain::schedule::held_out(rows.len(), k, cfg.experiment.seed);
        if !held.is_empty() {
            evals.push(subset(HELD_OUT, &held, &rows, &all, None));
        }
        for (i, (t, r)) in all.into_iter().zip(&rows).enumerate() {
            if held.binary_search(&i).is_err() {
                tasks.push(t);
                questions.push(r.query.clone());
            }
        }
    }
    let train: std::collections::HashSet<uuid::Uuid> = tasks.iter().map(|t| t.task_id).collect();
    for set in cfg.eval.sets.iter().filter(|s| s.benchmark.is_none()) {
        let (rows, ids) = load_tasks(pool, &set.tasks).await?;
        let picks =
            crate::domain::schedule::held_out(rows.len(), set.size as usize, cfg.experiment.seed);
        let ts = RolloutTask::from_rows(&rows, &ids, system);
        if let Some(&i) = picks.iter().find(|&&i| train.contains(&ids[i])) {
            return Err(setup(format!(
                "eval set `{}` ({}) contains training task `{}` of {}; evaluation sets must \
                 not overlap the training tasks",
                set.name,
                set.tasks.display(),
                rows[i].external_id,
                cfg.data.tasks.display()
            )));
        }
        evals.push(subset(&set.name, &picks, &rows, &ts, Some(set)));
    }
    Ok((tasks, questions, evals))
}

/// The evaluation subset `name` of the tasks at `picks` (indexes into `rows` and `tasks`, the
/// same task file's rows and their rollout tasks), with `set`'s samples and temperature where it
/// sets them.
fn subset(
    name: &str,
    picks: &[usize],
    rows: &[crate::domain::data::tasks::TaskRow],
    tasks: &[RolloutTask],
    set: Option<&crate::domain::config::EvalSet>,
) -> super::evaluate::Subset {
    super::evaluate::Subset {
        name: name.to_string(),
        samples: set.and_then(|s| s.n),
        temperature: set.and_then(|s| s.temperature),
        tasks: picks
            .iter()
            .map(|&i| super::evaluate::EvalTask::new(&rows[i], tasks[i].clone()))
            .collect(),
    }
}

pub async fn common(cfg: &Config, pool: &PgPool) -> Result<Common, PipelineError> {
    ensure_world(cfg)?;
    let cache = Arc::new(db::tool_cache::PgToolCache { pool: pool.clone() });
    let tool_setup = crate::infra::tools::setup::ToolSetup {
        index: (!cfg.data.index.as_os_str().is_empty()).then(|| cfg.data.index.clone()),
        index_tool: Some(cfg.data.index_tool.clone()),
        index_k: Some(cfg.data.index_k),
        web: cfg.data.index.as_os_str().is_empty(),
        mcp_urls: vec![],
    };
    let runner = crate::infra::tools::setup::build(&tool_setup, Some(cache))
        .await
        .map_err(setup)?;
    let scaffold = cfg.data.scaffold;
    let system =
        crate::infra::prompts::system_prompt(scaffold, &runner.specs(), cfg.rollout.max_tool_calls)
            .map_err(setup)?;
    let (mut tasks, mut questions, evals) = split_tasks(cfg, pool, &system).await?;
    let codec = ModelTokenizer::from_dir(&cfg.data.tokenizer).map_err(setup)?;
    if let Some(limit) = cfg.rollout.max_prompt_tokens {
        let before = tasks.len();
        let mut keep = Vec::with_capacity(before);
        for (t, q) in tasks.into_iter().zip(questions) {
            let text = codec.render_prompt(&t.system, &t.user).map_err(setup)?;
            if TokenCodec::encode(&codec, &text).map_err(setup)?.len() <= limit as usize {
                keep.push((t, q));
            }
        }
        (tasks, questions) = keep.into_iter().unzip();
        if tasks.len() < before {
            tracing::warn!(
                dropped = before - tasks.len(),
                limit,
                "training tasks whose prompt is longer than rollout.max_prompt_tokens are left out"
            );
        }
        if tasks.len() < cfg.rollout.tasks_per_step as usize {
            return Err(setup(format!(
                "{} of {before} training tasks fit rollout.max_prompt_tokens = {limit}; \
                 rollout.tasks_per_step = {} are needed per step",
                tasks.len(),
                cfg.rollout.tasks_per_step
            )));
        }
    }
    let guidance = match &cfg.credit.guidance_demos {
        Some(path) => Arc::new(guidance_demos(pool, cfg, path, &tasks).await?),
        None => Arc::default(),
    };
    Ok(Common {
        guidance,
        tasks,
        questions,
        evals,
        bench_sets: super::bench::periodic::load_sets(cfg).map_err(setup)?,
        tools: Arc::new(runner),
        codec: Arc::new(codec),
    })
}

/// The demonstrations of `path` for the training tasks `tasks`, by task id. A file that guides
/// none of them is refused (its ids are of another task file).
async fn guidance_demos(
    pool: &PgPool,
    cfg: &Config,
    path: &Path,
    tasks: &[RolloutTask],
) -> Result<HashMap<uuid::Uuid, Demo>, PipelineError> {
    let mut demos = crate::domain::data::demos::load(path).map_err(setup)?;
    let (rows, ids) = load_tasks(pool, &cfg.data.tasks).await?;
    let by_id: HashMap<uuid::Uuid, &str> = ids
        .iter()
        .zip(&rows)
        .map(|(id, r)| (*id, r.external_id.as_str()))
        .collect();
    let mut out = HashMap::new();
    for t in tasks {
        if let Some(d) = by_id.get(&t.task_id).and_then(|ext| demos.remove(*ext)) {
            out.insert(t.task_id, d);
        }
    }
    if out.is_empty() {
        return Err(setup(format!(
            "credit.guidance_demos = {} has no demonstration for any of the {} training tasks \
             of {} (rows are matched by task id)",
            path.display(),
            tasks.len(),
            cfg.data.tasks.display()
        )));
    }
    tracing::info!(
        demos = %path.display(),
        guided = out.len(),
        tasks = tasks.len(),
        "off-policy guidance: demonstrations join their tasks' groups"
    );
    Ok(out)
}

/// The judge is probed like the policy (every endpoint must answer a chat completion): a run
/// never starts against a judge that does not answer. The offline lexical judge needs none.
pub async fn probe_judge(cfg: &Config) -> Result<(), PipelineError> {
    if cfg.judge.kind != crate::domain::config::JudgeKind::Llm {
        return Ok(());
    }
    let c = LlmClient::for_role(cfg, Role::Judge, &cfg.judge.pool()).map_err(setup)?;
    crate::infra::llm::detect_all(&c, Role::Judge)
        .await
        .map_err(|e| setup(format!("the judge does not answer: {e}")))?;
    Ok(())
}

/// The pipeline of one run, trained on seed `seed` (its rollout sampling, task schedule and
/// reflection picks; the evaluation picks in `common` stay on `experiment.seed`).
pub async fn pipeline(
    cfg: &Config,
    pool: &PgPool,
    common: &Common,
    run_id: Uuid,
    recipe: Recipe,
    seed: u64,
) -> Result<Pipeline, PipelineError> {
    let http = crate::infra::llm::build_http(Duration::from_secs(10)).map_err(setup)?;
    let client = LlmClient::from_config(
        http.clone(),
        Role::Policy,
        &cfg.policy,
        &cfg.retry,
        &cfg.health,
    )
    .map_err(setup)?;
    crate::infra::llm::detect_all(&client, Role::Policy)
        .await
        .map_err(setup)?;
    let admission = (cfg.pipeline.admission_max_waiting > 0).then(|| {
        Arc::new(Admission::new(
            http.clone(),
            cfg.policy.urls.clone(),
            cfg.pipeline.admission_max_waiting,
        ))
    });
    let trainer = TrainerClient::new(http, &cfg.trainer.url);
    // Fail early, naming the URL, when the trainer does not answer.
    trainer.state().await?;
    let judge = crate::infra::llm::judge::from_config(cfg).map_err(setup)?;
    probe_judge(cfg).await?;
    let memory = if recipe.reflects() {
        let embedder = crate::pipeline::bank::Embedder::from_config(cfg)?;
        if let crate::pipeline::bank::Embedder::Remote(c) = &embedder {
            crate::infra::llm::detect_all(c, Role::Embeddings)
                .await
                .map_err(|e| setup(format!("the embeddings endpoint does not answer: {e}")))?;
        }
        let bank =
            crate::pipeline::bank::Bank::load(pool.clone(), run_id, embedder, cfg.reflection.top_k)
                .await?;
        Some(super::Memory {
            reflector: crate::pipeline::reflection::Reflector {
                pool: pool.clone(),
                run_id,
                seed,
                client: client.clone(),
                codec: common.codec.clone(),
                judge: judge.clone(),
                bank: Arc::new(bank),
                settings: crate::domain::reflection::Settings::from_config(&cfg.reflection),
            },
            window: cfg.reflection.window,
            max_item_chars: cfg.reflection.max_item_chars,
            inject: cfg.reflection.inject,
            wait: Duration::from_secs(cfg.reflection.wait_secs),
        })
    } else {
        None
    };
    Ok(Pipeline {
        pool: pool.clone(),
        run_id,
        recipe,
        steps: cfg.experiment.steps,
        cfg: cfg.pipeline.clone(),
        tasks: common.tasks.clone(),
        guidance: common.guidance.clone(),
        questions: common.questions.clone(),
        evals: common.evals.clone(),
        bench_sets: common.bench_sets.clone(),
        eval: cfg.eval.clone(),
        memory,
        tasks_per_step: cfg.rollout.tasks_per_step as usize,
        n: cfg.rollout.n,
        seed,
        rollout: RolloutCtx {
            client,
            codec: common.codec.clone(),
            tools: common.tools.clone(),
            cfg: cfg.rollout.clone(),
            seed: Some(seed),
            scaffold: cfg.data.scaffold,
        },
        admission,
        judge,
        judge_opts: StepOptions {
            research_evidence: cfg.judge.research_evidence,
            ..StepOptions::for_recipe(recipe, cfg.credit.lambda, cfg.credit.citation)
        },
        batch_credit: cfg.batch_credit(),
        judge_url: if cfg.judge.urls.is_empty() {
            cfg.judge.kind.as_str().to_string()
        } else {
            cfg.judge.urls.join(", ")
        },
        max_judge_failure_rate: cfg.judge.max_failure_rate,
        trainer,
        trainer_mode: match cfg.trainer.settings.finetune {
            wire::settings::Finetune::Lora => wire::api::TrainMode::Lora,
            wire::settings::Finetune::Full => wire::api::TrainMode::Full,
        },
        settings_hash: cfg.trainer.settings.hash(),
        trainer_settings: cfg.trainer.settings.clone(),
    })
}

/// What a run needs that its configuration does not give, one line each naming the key that
/// fills it (empty: ready to start). Paper presets leave the task file, the search back-end,
/// the tokenizer and the endpoints to the user; nothing falls back to the smoke world.
pub fn missing_inputs(cfg: &Config, recipes: &[Recipe]) -> Vec<String> {
    let d = &cfg.data;
    let generated = d.world_seed.is_some();
    let mut out = Vec::new();
    if d.tasks.as_os_str().is_empty() {
        out.push(
            "data.tasks: a task file (JSONL: ours or DR Tulu RL rows); --set data.tasks=PATH"
                .into(),
        );
    } else if !generated && !d.tasks.exists() {
        out.push(format!("data.tasks = {}: no such file", d.tasks.display()));
    }
    if d.index.as_os_str().is_empty() {
        use crate::infra::tools::setup::{S2_KEY_ENV, SERPER_KEY_ENV};
        let keys: Vec<&str> = [SERPER_KEY_ENV, S2_KEY_ENV]
            .into_iter()
            .filter(|k| {
                std::env::var(k)
                    .map(|v| v.trim().is_empty())
                    .unwrap_or(true)
            })
            .collect();
        if !keys.is_empty() {
            out.push(format!(
                "search: the web tools need {} in the environment, or --set data.index=DIR (a \
                 local index from `orchestrator index build`)",
                keys.join(" and ")
            ));
        }
    } else if !generated && !d.index.join("meta.json").exists() {
        out.push(format!(
            "data.index = {}: not a built index (run `orchestrator index build`)",
            d.index.display()
        ));
    }
    if d.tokenizer.as_os_str().is_empty() {
        out.push("data.tokenizer: the policy model's directory (tokenizer.json and chat template); --set data.tokenizer=DIR".into());
    } else if !d.tokenizer.join("tokenizer.json").exists() {
        out.push(format!(
            "data.tokenizer = {}: no tokenizer.json there",
            d.tokenizer.display()
        ));
    }
    if cfg.policy.urls.is_empty() {
        out.push("policy.urls: the inference servers (--policy-url)".into());
    }
    if cfg.judge.kind == crate::domain::config::JudgeKind::Llm && cfg.judge.urls.is_empty() {
        out.push("judge.urls: the LLM judge's endpoint (--judge-url)".into());
    }
    let local = crate::domain::bank::embed::LOCAL_MODEL;
    if recipes.iter().any(|r| r.reflects())
        && cfg.embeddings.model != local
        && cfg.embeddings.urls.is_empty()
    {
        out.push(format!(
            "embeddings.urls: an /v1/embeddings endpoint serving embeddings.model = {:?} for the \
             rubric bank (--embeddings-url), or --set embeddings.model={local} to choose the \
             local feature-hash embedding",
            cfg.embeddings.model
        ));
    }
    out
}

/// The learning-rate schedule in words. A decaying schedule counts optimizer updates
/// (`minibatches_per_step` per step, and a reflecting recipe's Phase A update), so the line
/// says where the decay ends against the updates this run's steps make, and flags a mismatch
/// (e.g. `--steps 24` on a preset that decays over 48).
fn lr_schedule(cfg: &Config, recipes: &[Recipe]) -> String {
    use wire::settings::LrSchedule;
    let t = &cfg.trainer.settings;
    let end = match t.schedule {
        LrSchedule::Constant => return "constant".to_string(),
        LrSchedule::Cosine => format!("cosine to {}x at update {}", t.min_lr_ratio, t.total_steps),
        LrSchedule::Linear => format!("linear to 0 at update {}", t.total_steps),
    };
    let updates = u64::from(cfg.experiment.steps) * u64::from(t.minibatches_per_step);
    if recipes.iter().any(|r| r.reflects()) {
        format!(
            "{end} (this run makes {updates} task updates and up to {} reflection updates)",
            cfg.experiment.steps
        )
    } else if t.total_steps == updates {
        end
    } else {
        format!("{end} (this run makes {updates} updates: the decay does not end at its last one)")
    }
}

/// One screen on what a run will do: recipe, endpoints, tools, judge, trainer settings.
pub fn summary(cfg: &Config, recipes: &[Recipe]) -> String {
    let d = &cfg.data;
    let t = &cfg.trainer.settings;
    let r = &cfg.rollout;
    let mut names: Vec<&str> = Vec::new();
    for r in recipes {
        if !names.contains(&r.as_str()) {
            names.push(r.as_str());
        }
    }
    let seeds = if cfg.experiment.seeds.is_empty() {
        format!("seed {}", cfg.experiment.seed)
    } else {
        format!(
            "seeds {:?} each (evaluation picks on seed {})",
            cfg.experiment.seeds, cfg.experiment.seed
        )
    };
    let tools = if d.index.as_os_str().is_empty() {
        "web: google_search (Serper), snippet_search (Semantic Scholar), browse_webpage".to_string()
    } else {
        format!(
            "local index {} served as {}",
            d.index.display(),
            d.index_tool
        )
    };
    let judge = match cfg.judge.kind {
        crate::domain::config::JudgeKind::Lexical => format!(
            "offline lexical judge `{}` (deterministic term matching, not an LLM)",
            cfg.judge.model
        ),
        crate::domain::config::JudgeKind::Llm => format!(
            "LLM `{}` at {}; pause when > {:.0}% of a step's calls fail",
            cfg.judge.model,
            cfg.judge.urls.join(", "),
            cfg.judge.max_failure_rate * 100.0
        ),
    } + if cfg.judge.research_evidence {
        "; persistent Research rubrics from each task's evidence chain (judge.research_evidence)"
    } else {
        ""
    };
    let finetune = match t.finetune {
        wire::settings::Finetune::Full => "full fine-tune".to_string(),
        wire::settings::Finetune::Lora => format!("LoRA r {} alpha {}", t.lora.r, t.lora.alpha),
    };
    let mut lines = vec![
        format!(
            "experiment {}: {} x {} steps, {seeds}",
            cfg.experiment.name,
            names.join(", "),
            cfg.experiment.steps,
        ),
        format!(
            "  scaffold {}; {} tasks x {} rollouts per step; <= {} tool calls; {} response tokens{}; temperature {}",
            d.scaffold.as_str(),
            r.tasks_per_step,
            r.n,
            r.max_tool_calls,
            r.max_tokens,
            r.max_prompt_tokens
                .map(|m| format!(", {m} prompt tokens"))
                .unwrap_or_default(),
            r.temperature
        ),
        format!(
            "  tasks {}; tokenizer {}",
            d.tasks.display(),
            d.tokenizer.display()
        ),
        format!(
            "  policy {} at {}",
            cfg.policy.model,
            cfg.policy.urls.join(", ")
        ),
        format!("  tools: {tools}"),
        format!("  judge: {judge}"),
        format!(
            "  trainer {}: {finetune}; lr {:e} {} (warm-up {}); AdamW ({}, {}) eps {:e} wd {}; \
             grad clip {}; KL3 beta {} vs {:?}; clip {}/{}; TIS cap {}; loop unlikelihood {}; \
             off-policy shaping γ {}; entropy bonus {}; {:?}; {} minibatch(es) per step; \
             settings hash {}",
            cfg.trainer.url,
            t.lr,
            lr_schedule(cfg, recipes),
            t.warmup_steps,
            t.adam_beta1,
            t.adam_beta2,
            t.adam_eps,
            t.weight_decay,
            t.max_grad_norm,
            t.kl_beta,
            t.reference,
            t.clip_low,
            t.clip_high,
            t.tis_cap,
            t.loop_unlikelihood,
            t.off_policy_shaping,
            t.entropy_bonus,
            t.loss_aggregation,
            t.minibatches_per_step,
            t.hash()
        ),
    ];
    if recipes.iter().any(|r| r.reflects()) {
        let local = crate::domain::bank::embed::LOCAL_MODEL;
        let emb = if cfg.embeddings.model == local {
            format!("{local} (local feature hashing, not a learned embedding)")
        } else {
            format!(
                "{} at {}",
                cfg.embeddings.model,
                cfg.embeddings.urls.join(", ")
            )
        };
        let x = &cfg.reflection;
        lines.push(format!(
            "  reflection: m = {} candidates at T = {}, window K = {}, top-{} retrieval{}; bank embedding {emb}",
            x.candidates,
            x.temperature,
            x.window,
            x.top_k,
            if x.inject.is_curriculum() {
                String::new()
            } else {
                format!(", training prompts inject {}", x.inject.as_str())
            }
        ));
    }
    if cfg.eval.enabled() {
        lines.push(format!(
            "  eval: {} held-out tasks{}, {}",
            cfg.eval.held_out,
            cfg.eval
                .sets
                .iter()
                .map(|s| format!(", {} ({})", s.name, s.size))
                .collect::<String>(),
            match cfg.eval.every {
                0 => "at the start and after the last step".to_string(),
                n => format!("every {n} steps"),
            }
        ));
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::config::Overrides;

    fn load(preset: &str, sets: &[String]) -> Config {
        Config::load(
            preset,
            &Overrides {
                sets: sets.to_vec(),
                ..Default::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn paper_presets_refuse_to_start_naming_each_missing_input_until_given() {
        let cfg = load("rubricem", &[]);
        let missing = missing_inputs(&cfg, &cfg.experiment.recipes).join("\n");
        for key in ["data.tasks", "data.tokenizer", "embeddings.urls"] {
            assert!(missing.contains(key), "{key} not named in:\n{missing}");
        }
        // The search back-end: web keys or a local index (the keys are not set in tests).
        if std::env::var("SERPER_API_KEY").is_err() {
            assert!(missing.contains("SERPER_API_KEY"), "{missing}");
        }
        let tmp = tempfile::tempdir().unwrap();
        let tasks = tmp.path().join("tasks.jsonl");
        std::fs::write(&tasks, "{}\n").unwrap();
        let index = tmp.path().join("index");
        std::fs::create_dir_all(&index).unwrap();
        std::fs::write(index.join("meta.json"), "{}").unwrap();
        let model = tmp.path().join("model");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join("tokenizer.json"), "{}").unwrap();
        let sets = vec![
            format!("data.tasks={}", tasks.display()),
            format!("data.index={}", index.display()),
            format!("data.tokenizer={}", model.display()),
            "embeddings.urls=[\"http://127.0.0.1:9\"]".to_string(),
        ];
        let cfg = load("rubricem", &sets);
        assert_eq!(
            missing_inputs(&cfg, &cfg.experiment.recipes),
            Vec::<String>::new()
        );
        // A missing file is named with its path.
        let mut bad = sets.clone();
        bad[0] = "data.tasks=/nonexistent/tasks.jsonl".into();
        let cfg = load("rubricem", &bad);
        let m = missing_inputs(&cfg, &cfg.experiment.recipes).join("\n");
        assert!(m.contains("/nonexistent/tasks.jsonl"), "{m}");
        // Choosing the hash embedding explicitly is allowed, and labelled in the summary.
        let mut hash = sets[..3].to_vec();
        hash.push("embeddings.model=local-hash-v1".into());
        let cfg = load("rubricem", &hash);
        assert!(missing_inputs(&cfg, &cfg.experiment.recipes).is_empty());
        let s = summary(&cfg, &cfg.experiment.recipes);
        assert!(
            s.contains("local feature hashing, not a learned embedding"),
            "{s}"
        );
        assert!(s.contains("lr 5e-7") && s.contains("KL3 beta 0.001"), "{s}");
        assert!(s.contains(&cfg.trainer.settings.hash()), "{s}");
        assert!(s.contains("lr 5e-7 constant"), "{s}");
        // A decaying schedule says where it ends, and flags a run whose updates end elsewhere.
        let decay = [
            "trainer.schedule=cosine",
            "trainer.total_steps=48",
            "trainer.min_lr_ratio=0.1",
        ];
        let summary_of = |sets: &[String]| {
            let cfg = load("rubricem", sets);
            summary(&cfg, &cfg.experiment.recipes)
        };
        let mut sets48 = hash.clone();
        sets48.extend(decay.iter().map(|x| x.to_string()));
        sets48.push("experiment.steps=48".into());
        sets48.push("experiment.recipes=[\"baseline-rl\"]".into());
        let s = summary_of(&sets48);
        assert!(s.contains("cosine to 0.1x at update 48 (warm-up 0)"), "{s}");
        sets48.push("experiment.steps=24".into());
        let s = summary_of(&sets48);
        assert!(
            s.contains("cosine to 0.1x at update 48 (this run makes 24 updates: the decay does not end at its last one)"),
            "{s}"
        );
        sets48.push("experiment.recipes=[\"full\"]".into());
        let s = summary_of(&sets48);
        assert!(
            s.contains("this run makes 24 task updates and up to 24 reflection updates"),
            "{s}"
        );
        // The smoke preset needs nothing (it generates its world).
        let smoke = load("smoke", &[]);
        let m = missing_inputs(&smoke, &smoke.experiment.recipes);
        assert!(
            m.iter().all(|l| l.starts_with("data.tokenizer")),
            "only the SFT model (built by scripts/smoke.sh) may be absent: {m:?}"
        );
    }
}
