//! Building a [`Pipeline`] for one run of an experiment from its configuration: tasks (and the
//! research world and its index when the preset generates them) split into the training
//! schedule and the held-out evaluation subset, further evaluation sets, tools, tokenizer,
//! policy client with admission control, judge, and the trainer client.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use super::{Pipeline, PipelineError};
use crate::domain::config::{Config, Recipe};
use crate::infra::chat::ModelTokenizer;
use crate::infra::db;
use crate::infra::llm::trainer::TrainerClient;
use crate::infra::llm::{LlmClient, Role};
use crate::pipeline::judging::StepOptions;
use crate::pipeline::rollout::{Admission, RolloutCtx, RolloutTask};

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
    if !d.tasks.exists() {
        let world = crate::domain::data::world::generate(seed, d.world_docs, d.world_tasks);
        crate::domain::data::world::write(&world, dir)
            .map_err(|e| setup(format!("writing the world to {}: {e}", dir.display())))?;
        tracing::info!(dir = %dir.display(), docs = world.docs.len(), tasks = world.tasks.len(), "research world generated");
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
    pub tools: Arc<crate::infra::tools::runner::ToolRunner>,
    pub codec: Arc<ModelTokenizer>,
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

/// Split the task file into training tasks (with their questions) and the held-out subset
/// (`eval.held_out`), and draw the further evaluation sets; every task is stored in `tasks`.
pub async fn split_tasks(
    cfg: &Config,
    pool: &PgPool,
    system: &str,
) -> Result<(Vec<RolloutTask>, Vec<String>, Vec<super::evaluate::Subset>), PipelineError> {
    use super::evaluate::{EvalTask, HELD_OUT, Subset};
    let (rows, ids) = load_tasks(pool, &cfg.data.tasks).await?;
    let all = RolloutTask::from_rows(&rows, &ids, system);
    let k = cfg.eval.held_out as usize;
    let min_train = cfg.rollout.tasks_per_step as usize;
    if k > 0 && k + min_train > rows.len() {
        return Err(setup(format!(
            "eval.held_out = {k} leaves {} of the {} tasks in {} for training; at most {} can be \
             held out (rollout.tasks_per_step = {min_train} must remain)",
            rows.len().saturating_sub(k),
            rows.len(),
            cfg.data.tasks.display(),
            rows.len().saturating_sub(min_train),
        )));
    }
    let held = crate::domain::schedule::held_out(rows.len(), k, cfg.experiment.seed);
    let mut evals = Vec::new();
    if !held.is_empty() {
        evals.push(Subset {
            name: HELD_OUT.into(),
            tasks: held
                .iter()
                .map(|&i| EvalTask::new(&rows[i], all[i].clone()))
                .collect(),
        });
    }
    let (mut tasks, mut questions) = (Vec::new(), Vec::new());
    for (i, (t, r)) in all.into_iter().zip(&rows).enumerate() {
        if held.binary_search(&i).is_err() {
            tasks.push(t);
            questions.push(r.query.clone());
        }
    }
    let train: std::collections::HashSet<uuid::Uuid> = tasks.iter().map(|t| t.task_id).collect();
    for set in &cfg.eval.sets {
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
        evals.push(Subset {
            name: set.name.clone(),
            tasks: picks
                .iter()
                .map(|&i| EvalTask::new(&rows[i], ts[i].clone()))
                .collect(),
        });
    }
    Ok((tasks, questions, evals))
}

pub async fn common(cfg: &Config, pool: &PgPool) -> Result<Common, PipelineError> {
    ensure_world(cfg)?;
    let cache = Arc::new(db::tool_cache::PgToolCache { pool: pool.clone() });
    let tool_setup = crate::infra::tools::setup::ToolSetup {
        index: (!cfg.data.index.as_os_str().is_empty()).then(|| cfg.data.index.clone()),
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
    let (tasks, questions, evals) = split_tasks(cfg, pool, &system).await?;
    let codec = ModelTokenizer::from_dir(&cfg.data.tokenizer).map_err(setup)?;
    Ok(Common {
        tasks,
        questions,
        evals,
        tools: Arc::new(runner),
        codec: Arc::new(codec),
    })
}

/// The pipeline of one run.
pub async fn pipeline(
    cfg: &Config,
    pool: &PgPool,
    common: &Common,
    run_id: Uuid,
    recipe: Recipe,
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
    let state = trainer.state().await?;
    let judge = crate::infra::llm::judge::from_config(cfg).map_err(setup)?;
    let memory = if recipe.reflects() {
        let embedder = crate::pipeline::bank::Embedder::from_config(cfg)?;
        let bank =
            crate::pipeline::bank::Bank::load(pool.clone(), run_id, embedder, cfg.reflection.top_k)
                .await?;
        Some(super::Memory {
            reflector: crate::pipeline::reflection::Reflector {
                pool: pool.clone(),
                run_id,
                seed: cfg.experiment.seed,
                client: client.clone(),
                codec: common.codec.clone(),
                judge: judge.clone(),
                bank: Arc::new(bank),
                settings: crate::domain::reflection::Settings::from_config(&cfg.reflection),
            },
            window: cfg.reflection.window,
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
        questions: common.questions.clone(),
        evals: common.evals.clone(),
        eval: cfg.eval.clone(),
        memory,
        tasks_per_step: cfg.rollout.tasks_per_step as usize,
        n: cfg.rollout.n,
        seed: cfg.experiment.seed,
        rollout: RolloutCtx {
            client,
            codec: common.codec.clone(),
            tools: common.tools.clone(),
            cfg: cfg.rollout.clone(),
            seed: Some(cfg.experiment.seed),
        },
        admission,
        judge,
        judge_opts: StepOptions::for_recipe(recipe, cfg.credit.lambda, cfg.credit.citation),
        trainer,
        trainer_mode: state.mode,
    })
}
