//! `orchestrator rollout`: roll out the policy on a task file (n trajectories per task, with
//! the rubric bank of an earlier run injected on request), store them in Postgres as a
//! one-step run and print a summary of finish reasons, tool calls per stage and parse failures.

use std::process::ExitCode;
use std::sync::Arc;

use super::{cancel_on_ctrl_c, load_config, out};
use crate::cli::RolloutArgs;
use crate::infra::chat::ModelTokenizer;
use crate::infra::db;
use crate::infra::llm::{self, LlmClient, Role};
use crate::pipeline::rollout::{
    RolloutCtx, RolloutSlot, RolloutSummary, RolloutTask, rollout_batch_summary,
};
use crate::pipeline::run::{ROLLOUT_STEP, finish_rollout_run, start_rollout_run};

pub(super) async fn command(args: &RolloutArgs) -> anyhow::Result<ExitCode> {
    let summary = rollout(args).await?;
    out(summary.render());
    Ok(ExitCode::SUCCESS)
}

/// Load tasks, roll out, persist, summarise.
pub async fn rollout(args: &RolloutArgs) -> anyhow::Result<RolloutSummary> {
    let cfg = load_config(&args.config)?;
    let scaffold = args.scaffold;
    let n = args.n.unwrap_or(cfg.rollout.n);
    anyhow::ensure!(
        (1..=64).contains(&n),
        "--n = {n} is out of range; allowed: 1..=64"
    );
    let mut tasks = crate::domain::data::tasks::load(&args.tasks)?;
    if let Some(l) = args.limit {
        tasks.truncate(l);
    }
    anyhow::ensure!(!tasks.is_empty(), "{} holds no tasks", args.tasks.display());
    let pool = db::open(&cfg.database.url, cfg.database.max_connections).await?;
    let tokenizer = ModelTokenizer::from_dir(&args.tokenizer)?;
    let client = LlmClient::for_role(&cfg, Role::Policy, &cfg.policy)?;
    llm::detect_all(&client, Role::Policy).await?;

    let cache = Arc::new(db::tool_cache::PgToolCache { pool: pool.clone() });
    // The local index is served under the experiment's one tool name, as `run` and `sft-data`
    // serve it, so the system prompt is the one the policy trained and is evaluated on.
    let mut setup = args.tools.setup();
    setup.index_tool = Some(cfg.data.index_tool.clone());
    setup.index_k = Some(cfg.data.index_k);
    let runner = crate::infra::tools::setup::build(&setup, Some(cache)).await?;
    let system = crate::infra::prompts::system_prompt(
        scaffold,
        &runner.specs(),
        cfg.rollout.max_tool_calls,
    )?;

    let new_tasks: Vec<db::tasks::NewTask> = tasks.iter().map(db::tasks::from_task_row).collect();
    let task_ids = db::tasks::upsert(&pool, &new_tasks).await?;
    let run_id = start_rollout_run(&pool, &cfg, &args.config.experiment, &task_ids).await?;
    let mut rtasks = RolloutTask::from_rows(&tasks, &task_ids, &system);
    if args.reuse != crate::domain::bank::Reuse::None {
        let queries: Vec<&str> = tasks.iter().map(|row| row.query.as_str()).collect();
        inject_memory(args, &cfg, &pool, &mut rtasks, &queries).await?;
    }
    let ctx = RolloutCtx {
        client,
        codec: Arc::new(tokenizer),
        tools: Arc::new(runner),
        cfg: cfg.rollout.clone(),
        seed: Some(cfg.experiment.seed),
        scaffold,
    };
    let (cancel, watcher) =
        cancel_on_ctrl_c("interrupted: abandoning trajectories in flight", false);
    let pb = crate::telemetry::progress((rtasks.len() * n as usize) as u64, "rollouts");
    let started = std::time::Instant::now();
    let slot = RolloutSlot {
        run_id,
        step: ROLLOUT_STEP,
        sample_index: 0,
        policy_version: 0,
    };
    let (rollouts, mut summary) = rollout_batch_summary(
        &ctx,
        &rtasks,
        n,
        slot,
        args.max_inflight,
        &cancel,
        Some(&pb),
    )
    .await;
    pb.finish_and_clear();
    watcher.abort();
    db::rollouts::insert(&pool, &rollouts).await?;
    finish_rollout_run(&pool, run_id, cancel.is_cancelled()).await?;
    summary.run_id = run_id;
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// `--reuse`: put the rubric bank of `--bank-run` before each task's question (`queries`, in
/// the order of `rtasks`) as the `<reference_examples>` block.
async fn inject_memory(
    args: &RolloutArgs,
    cfg: &crate::domain::config::Config,
    pool: &sqlx::PgPool,
    rtasks: &mut [RolloutTask],
    queries: &[&str],
) -> anyhow::Result<()> {
    let Some(bank_run) = args.bank_run else {
        anyhow::bail!(
            "--reuse {} needs --bank-run RUN (the run whose rubric bank is read)",
            args.reuse.as_str()
        );
    };
    let bank = crate::pipeline::bank::Bank::load(
        pool.clone(),
        bank_run,
        crate::pipeline::bank::Embedder::from_config(cfg)?,
        cfg.reflection.top_k,
    )
    .await?;
    anyhow::ensure!(!bank.is_empty(), "run {bank_run} has an empty rubric bank");
    let queries: Vec<(uuid::Uuid, &str)> = rtasks
        .iter()
        .zip(queries)
        .map(|(t, q)| (t.task_id, *q))
        .collect();
    let found = bank.retrieve_many(&queries, args.reuse).await?;
    let mut served = std::collections::BTreeMap::<&str, usize>::new();
    for (t, got) in rtasks.iter_mut().zip(found) {
        *served.entry(got.mode().as_str()).or_default() += 1;
        t.user = got.clipped(cfg.reflection.max_item_chars).inject(&t.user)?;
    }
    tracing::info!(reuse = args.reuse.as_str(), bank = %bank_run, items = bank.len(), served = ?served, "memory injected");
    Ok(())
}
