//! Command dispatch: turns a parsed CLI into work. This is the edge of the program, so it uses
//! `anyhow` and writes human-readable output to stdout; everything it calls returns typed errors.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use crate::cli::{
    Cli, Command, ConfigArgs, IndexCommand, JudgeArgs, ProbeRole, RolloutArgs, RubricsCommand,
    WorldCommand,
};
use crate::domain::config::{Config, JudgeKind};
use crate::infra::db;
use crate::infra::llm::{self, LlmClient, Role};
pub use crate::pipeline::rollout::RolloutSummary;

fn out(line: impl AsRef<str>) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{}", line.as_ref());
}

fn load_config(args: &ConfigArgs) -> anyhow::Result<Config> {
    Config::load(&args.experiment, &args.overrides()).context("configuration rejected")
}

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Migrate { database_url } => {
            let applied = db::migrate(&database_url).await?;
            db::check_migrations(&db::connect(&database_url, 1).await?, &database_url).await?;
            out(format!(
                "migrations up to date on {} ({} applied now, {} embedded)",
                db::redact_url(&database_url),
                applied.len(),
                db::MIGRATOR.iter().count()
            ));
            Ok(ExitCode::SUCCESS)
        }
        Command::DbCheck { database_url } => {
            db::open(&database_url, 1).await?;
            out(format!(
                "database {} is reachable and migrated",
                db::redact_url(&database_url)
            ));
            Ok(ExitCode::SUCCESS)
        }
        Command::Config(args) => {
            let cfg = load_config(&args)?;
            out(cfg.to_toml());
            Ok(ExitCode::SUCCESS)
        }
        Command::Probe { config, role } => {
            let cfg = load_config(&config)?;
            let (role, pool_cfg) = match role {
                ProbeRole::Policy => (Role::Policy, cfg.policy.clone()),
                ProbeRole::Judge => (Role::Judge, cfg.judge.pool()),
                ProbeRole::Embeddings => (Role::Embeddings, cfg.embeddings.clone()),
            };
            let client = client_for(&cfg, role, &pool_cfg)?;
            let features = llm::detect_all(&client, role).await?;
            out(serde_json::to_string_pretty(&features)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Index(cmd) => index(cmd).await,
        Command::World(WorldCommand::Generate {
            seed,
            docs,
            tasks,
            out: dir,
        }) => {
            anyhow::ensure!(docs >= 4, "--docs = {docs} is too small; allowed: >= 4");
            anyhow::ensure!(
                docs <= 10_000_000,
                "--docs = {docs} is too large; allowed: <= 10000000"
            );
            anyhow::ensure!(
                tasks <= 1_000_000,
                "--tasks = {tasks} is too large; allowed: <= 1000000"
            );
            let world = crate::domain::data::world::generate(seed, docs, tasks);
            crate::domain::data::world::write(&world, &dir)
                .with_context(|| format!("writing the world to {}", dir.display()))?;
            out(format!(
                "world seed {seed}: {} documents, {} tasks written to {}",
                world.docs.len(),
                world.tasks.len(),
                dir.display()
            ));
            Ok(ExitCode::SUCCESS)
        }
        Command::Rollout(args) => {
            let summary = rollout(&args).await?;
            out(summary.render());
            Ok(ExitCode::SUCCESS)
        }
        Command::Judge(args) => judge(&args).await,
        Command::Rubrics(cmd) => rubrics(cmd).await,
        Command::Run { config, resume } => run_experiment(&config, resume).await,
        Command::SftData(args) => sft_data(&args).await,
        Command::Bank(cmd) => bank(cmd).await,
        Command::Report {
            target,
            out: dir,
            database_url,
        } => {
            let pool = db::open(&database_url, 4).await?;
            let path = crate::pipeline::report::write(&pool, target, &dir).await?;
            out(format!("report written to {}", path.display()));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `orchestrator bank show|search|export`.
async fn bank(cmd: crate::cli::BankCommand) -> anyhow::Result<ExitCode> {
    use crate::cli::BankCommand;
    use crate::domain::bank::Retrieved;
    use crate::pipeline::bank::{Bank, Embedder};
    let (BankCommand::Show { config, .. }
    | BankCommand::Search { config, .. }
    | BankCommand::Export { config, .. }) = &cmd;
    let cfg = load_config(config)?;
    let pool = db::open(&cfg.database.url, 4).await?;
    match cmd {
        BankCommand::Show {
            run, limit, full, ..
        } => {
            let mut items = db::bank::load(&pool, run).await?;
            items.reverse();
            out(format!("run {run}: {} bank item(s)", items.len()));
            for it in items.iter().take(limit) {
                out(format!(
                    "- step {:>4}  score {:.3}  task {}  {}",
                    it.step,
                    it.score,
                    it.task_id,
                    crate::domain::judge::view::clip_middle(it.question.trim(), 100)
                ));
                if full {
                    out(format!(
                        "  rubrics:\n{}\n  takeaways:\n{}",
                        it.rubrics, it.takeaways
                    ));
                }
            }
        }
        BankCommand::Search {
            run,
            query,
            mode,
            k,
            ..
        } => {
            let embedder = Embedder::from_config(&cfg)?;
            let bank = Bank::load(
                pool.clone(),
                run,
                embedder,
                k.unwrap_or(cfg.reflection.top_k),
            )
            .await?;
            let t0 = std::time::Instant::now();
            // The query is not a task of the bank: nothing is excluded by id.
            let got = bank.retrieve(uuid::Uuid::nil(), &query, mode).await?;
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            out(format!(
                "{} item(s) in the bank; served mode {} in {ms:.2} ms",
                bank.len(),
                got.mode().as_str()
            ));
            match &got {
                Retrieved::Nothing => {}
                Retrieved::Within(it) => out(format!("exact match: task {}", it.task_id)),
                Retrieved::Cross(v) => {
                    for (it, cos) in v {
                        out(format!(
                            "cos {cos:.3}  task {}  {}",
                            it.task_id,
                            crate::domain::judge::view::clip_middle(it.question.trim(), 100)
                        ));
                    }
                }
            }
            let block = got.render()?;
            if !block.is_empty() {
                out(block);
            }
        }
        BankCommand::Export { run, out: path, .. } => {
            let items = db::bank::load(&pool, run).await?;
            let mut f = std::io::BufWriter::new(
                std::fs::File::create(&path)
                    .with_context(|| format!("creating {}", path.display()))?,
            );
            for it in &items {
                serde_json::to_writer(&mut f, it)?;
                f.write_all(b"\n")?;
            }
            f.flush()?;
            out(format!(
                "{} item(s) written to {}",
                items.len(),
                path.display()
            ));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `orchestrator sft-data`: offline teacher trajectories over the research world.
async fn sft_data(args: &crate::cli::SftDataArgs) -> anyhow::Result<ExitCode> {
    use std::collections::HashMap;
    let cfg = load_config(&args.config)?;
    if args.teacher_url.is_none() {
        crate::pipeline::setup::ensure_world(&cfg)?;
    }
    let tasks_path = args.tasks.clone().unwrap_or_else(|| cfg.data.tasks.clone());
    // The offline teacher needs the world's index; a teacher endpoint uses it when it is built.
    let use_index = args.teacher_url.is_none() || cfg.data.index.join("meta.json").exists();
    let setup = crate::infra::tools::setup::ToolSetup {
        index: use_index.then(|| cfg.data.index.clone()),
        web: args.web_tools,
        mcp_urls: vec![],
    };
    let runner = crate::infra::tools::setup::build(&setup, None).await?;
    anyhow::ensure!(
        !runner.names().is_empty(),
        "sft-data has no tool to call: build the local index ({}) or pass --web-tools",
        cfg.data.index.display()
    );
    let scaffold: crate::infra::chat::Scaffold =
        serde_json::from_value(serde_json::Value::String(cfg.data.scaffold.clone()))?;
    let system = crate::infra::prompts::system_prompt(
        scaffold,
        &runner.specs(),
        cfg.rollout.max_tool_calls,
    )?;
    let (rows, stats) = match &args.teacher_url {
        Some(url) => {
            let mut tasks = crate::domain::data::tasks::load(&tasks_path)?;
            if let Some(l) = args.limit {
                tasks.truncate(l);
            }
            anyhow::ensure!(!tasks.is_empty(), "{} holds no tasks", tasks_path.display());
            let pool = crate::domain::config::EndpointPoolConfig {
                urls: vec![url.clone()],
                model: args.teacher_model.clone(),
                max_concurrency: args.concurrency.max(1) as u32,
                timeout_secs: cfg.judge.timeout_secs.max(300),
                api_key_env: args.teacher_api_key_env.clone(),
            };
            let client = client_for(&cfg, Role::Teacher, &pool)?;
            let teacher = crate::pipeline::sft::teacher::Teacher {
                client: &client,
                tools: &runner,
                system,
                settings: crate::pipeline::sft::teacher::TeacherSettings {
                    max_rounds: args.max_rounds,
                    max_tool_calls: cfg.rollout.max_tool_calls,
                    temperature: args.temperature,
                    max_tokens: args.max_tokens,
                    concurrency: args.concurrency,
                },
            };
            let items: Vec<crate::pipeline::sft::teacher::TeacherTask> = tasks
                .iter()
                .map(|t| crate::pipeline::sft::teacher::TeacherTask {
                    id: t.external_id.clone(),
                    query: t.query.clone(),
                    format: t.format,
                })
                .collect();
            let pb = crate::telemetry::progress(items.len() as u64, "teacher");
            let out = teacher.run(&items, Some(&pb)).await?;
            pb.finish_and_clear();
            out
        }
        None => {
            let dir = tasks_path
                .parent()
                .map(std::path::Path::to_path_buf)
                .unwrap_or_default();
            let text = std::fs::read_to_string(&tasks_path)
                .with_context(|| format!("reading {}", tasks_path.display()))?;
            let mut tasks = Vec::new();
            for (i, line) in text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
            {
                let t: crate::domain::data::world::WorldTask =
                    serde_json::from_str(line).with_context(|| {
                        format!(
                            "{} line {}: not a research-world task (the offline teacher needs the world's evidence chains; pass --teacher-url for other task files)",
                            tasks_path.display(),
                            i + 1
                        )
                    })?;
                tasks.push(t);
            }
            if let Some(l) = args.limit {
                tasks.truncate(l);
            }
            let docs: HashMap<String, crate::infra::tools::local_search::CorpusDoc> =
                crate::infra::tools::local_search::read_corpus(&dir.join("corpus.jsonl"))?
                    .into_iter()
                    .map(|d| (d.id.clone(), d))
                    .collect();
            anyhow::ensure!(
                runner.names().contains(&args.tool),
                "--tool = {:?} is not available; configured tools: {}",
                args.tool,
                runner.names().join(", ")
            );
            crate::pipeline::sft::offline(
                &tasks,
                &docs,
                &runner,
                &args.tool,
                &system,
                cfg.rollout.max_tool_calls,
            )
            .await
        }
    };
    if let Some(parent) = args.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(&args.out)
            .with_context(|| format!("creating {}", args.out.display()))?,
    );
    for r in &rows {
        writeln!(f, "{}", serde_json::to_string(r)?)?;
    }
    f.flush()?;
    out(format!(
        "sft-data: {} of {} tasks written to {} (rejected: {})",
        stats.written,
        stats.tasks,
        args.out.display(),
        serde_json::to_string(&stats.rejected)?
    ));
    Ok(ExitCode::SUCCESS)
}

/// `orchestrator judge`: (re)score stored trajectories step by step.
async fn judge(args: &JudgeArgs) -> anyhow::Result<ExitCode> {
    use crate::domain::config::Recipe;
    use crate::pipeline::judging::{StepOptions, judge_step};

    let cfg = load_config(&args.config)?;
    let pool = db::open(&cfg.database.url, cfg.database.max_connections).await?;
    let run = db::runs::get_run(&pool, args.run)
        .await?
        .with_context(|| format!("run {} does not exist", args.run))?;
    let recipe_name = args.recipe.clone().unwrap_or_else(|| run.recipe.clone());
    let recipe: Recipe = serde_json::from_value(serde_json::Value::String(recipe_name.clone()))
        .or_else(|e| {
            if args.recipe.is_none() {
                Ok(Recipe::Full) // runs made by `orchestrator rollout` have no recipe
            } else {
                Err(e)
            }
        })
        .map_err(|_| {
            anyhow::anyhow!(
                "--recipe = {recipe_name:?}; allowed: baseline-rl, ss-grpo, meta-policy, full, drtulu"
            )
        })?;
    let mut opts = StepOptions::for_recipe(recipe, cfg.credit.lambda, cfg.credit.citation);
    opts.group.generate = args.generate;
    let judge = crate::infra::llm::judge::from_config(&cfg)?;
    let steps: Vec<i32> = match args.step {
        Some(s) => vec![s],
        None => sqlx::query_scalar(
            "SELECT DISTINCT step FROM trajectories WHERE run_id = $1 ORDER BY step",
        )
        .bind(args.run)
        .fetch_all(&pool)
        .await
        .context("listing the run's steps")?,
    };
    anyhow::ensure!(!steps.is_empty(), "run {} has no trajectories", args.run);
    let pb = crate::telemetry::progress(steps.len() as u64, "steps judged");
    for step in steps {
        let r = judge_step(&pool, judge.as_ref(), &opts, args.run, step).await?;
        pb.inc(1);
        pb.suspend(|| {
            out(format!(
                "step {step}: {} trajectories in {} groups judged by {} ({}) in {:.2}s; \
                 R plan/research/review/answer = {:.3}/{:.3}/{:.3}/{:.3}; reward {:.3}; \
                 {} calls ({} failed), {} broadcast, {} failed scores, {} degenerate groups; \
                 {} new rubrics, {} pruned; {} + {} tokens, ${:.4}",
                r.trajectories,
                r.groups,
                judge.model(),
                judge.kind().as_str(),
                r.seconds,
                r.mean_stage_score[0],
                r.mean_stage_score[1],
                r.mean_stage_score[2],
                r.mean_stage_score[3],
                r.mean_reward,
                r.calls,
                r.failed_calls,
                r.broadcast,
                r.failed,
                r.degenerate_groups,
                r.new_rubrics,
                r.pruned,
                r.prompt_tokens,
                r.completion_tokens,
                r.cost_usd
            ))
        });
    }
    pb.finish_and_clear();
    Ok(ExitCode::SUCCESS)
}

/// `orchestrator rubrics init`: search-grounded persistent rubrics for a task file.
async fn rubrics(cmd: RubricsCommand) -> anyhow::Result<ExitCode> {
    use std::collections::BTreeMap;

    let RubricsCommand::Init {
        config,
        tasks: path,
        limit,
        index,
        web_tools,
        mcp,
        tool,
        k,
        overwrite,
    } = cmd;
    let cfg = load_config(&config)?;
    let mut tasks = crate::domain::data::tasks::load(&path)?;
    if let Some(l) = limit {
        tasks.truncate(l);
    }
    anyhow::ensure!(!tasks.is_empty(), "{} holds no tasks", path.display());
    let pool = db::open(&cfg.database.url, cfg.database.max_connections).await?;
    let cache = std::sync::Arc::new(db::tool_cache::PgToolCache { pool: pool.clone() });
    let setup = crate::infra::tools::setup::ToolSetup {
        index,
        web: web_tools,
        mcp_urls: mcp,
    };
    let runner = crate::infra::tools::setup::build(&setup, Some(cache)).await?;
    anyhow::ensure!(
        runner.names().contains(&tool),
        "--tool = {tool:?} is not available; configured tools: {}",
        runner.names().join(", ")
    );
    let judge = crate::infra::llm::judge::from_config(&cfg)?;
    let new_tasks = tasks
        .iter()
        .map(crate::infra::db::tasks::from_task_row)
        .collect::<Vec<_>>();
    let ids = db::tasks::upsert(&pool, &new_tasks).await?;
    let stored = db::tasks::get_many(&pool, &ids).await?;
    let pb = crate::telemetry::progress(tasks.len() as u64, "tasks grounded");
    let (mut written, mut kept, mut failed) = (0, 0, 0);
    for (t, id) in tasks.iter().zip(&ids) {
        pb.inc(1);
        let has = stored
            .get(id)
            .and_then(|r| r.persistent_rubrics.as_array())
            .is_some_and(|a| !a.is_empty());
        if !overwrite && has {
            kept += 1;
            continue;
        }
        let args = crate::infra::tools::runner::ToolArgs {
            query: t.query.clone(),
            attrs: BTreeMap::from([("limit".to_string(), k.to_string())]),
        };
        let res = runner.run(&tool, args).await;
        if let Some(e) = &res.error {
            tracing::warn!(task = %t.external_id, error = %e, "search failed; task skipped");
            failed += 1;
            continue;
        }
        let snippets: Vec<(String, String)> = res
            .snippets
            .iter()
            .take(k as usize)
            .map(|s| (s.id.clone(), format!("{}: {}", s.title, s.text)))
            .collect();
        match judge.ground(&t.query, &snippets).await {
            Ok(g) => {
                let specs: Vec<crate::domain::data::tasks::RubricSpec> = g.per_stage[3]
                    .iter()
                    .map(|r| crate::domain::data::tasks::RubricSpec {
                        title: r.title.clone(),
                        description: r.description.clone(),
                        weight: if r.negative { -r.weight } else { r.weight },
                        key_terms: r.key_terms.clone(),
                        evidence: snippets.iter().map(|(id, _)| id.clone()).collect(),
                    })
                    .collect();
                db::tasks::set_persistent_rubrics(&pool, *id, &serde_json::to_value(&specs)?)
                    .await?;
                written += 1;
            }
            Err(e) => {
                tracing::warn!(task = %t.external_id, error = %crate::domain::util::error_chain(&e), "rubric generation failed; task skipped");
                failed += 1;
            }
        }
    }
    pb.finish_and_clear();
    out(format!(
        "persistent rubrics by {} ({}): {written} tasks written, {kept} kept (already had rubrics), {failed} failed",
        judge.model(),
        judge.kind().as_str()
    ));
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `orchestrator rollout`: load tasks, roll out, persist, summarise.
pub async fn rollout(args: &RolloutArgs) -> anyhow::Result<RolloutSummary> {
    use std::sync::Arc;

    use crate::infra::chat::{ModelTokenizer, Scaffold};
    use crate::pipeline::rollout::{
        RolloutConfig, RolloutCtx, RolloutSlot, RolloutTask, rollout_batch_summary,
    };

    let cfg = load_config(&args.config)?;
    let scaffold: Scaffold =
        serde_json::from_value(serde_json::Value::String(args.scaffold.clone())).map_err(|_| {
            anyhow::anyhow!(
                "--scaffold = {:?}; allowed: rubricem, drtulu, react",
                args.scaffold
            )
        })?;
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
    let client = client_for(&cfg, Role::Policy, &cfg.policy)?;
    llm::detect_all(&client, Role::Policy).await?;

    let cache = Arc::new(db::tool_cache::PgToolCache { pool: pool.clone() });
    let setup = crate::infra::tools::setup::ToolSetup {
        index: args.index.clone(),
        web: args.web_tools,
        mcp_urls: args.mcp.clone(),
    };
    let runner = crate::infra::tools::setup::build(&setup, Some(cache)).await?;
    let system = crate::infra::prompts::system_prompt(
        scaffold,
        &runner.specs(),
        cfg.rollout.max_tool_calls,
    )?;

    let new_tasks: Vec<db::tasks::NewTask> = tasks
        .iter()
        .map(crate::infra::db::tasks::from_task_row)
        .collect();
    let task_ids = db::tasks::upsert(&pool, &new_tasks).await?;
    let snapshot = cfg.snapshot();
    let exp =
        db::runs::create_experiment(&pool, "rollout", &args.config.experiment, &snapshot).await?;
    let run_id = db::runs::create_run(
        &pool,
        exp,
        "rollout",
        "rollout",
        &snapshot,
        cfg.experiment.seed as i64,
    )
    .await?;
    db::runs::set_run_status(&pool, run_id, "running", None).await?;
    db::runs::begin_step(&pool, run_id, 0, 0, &task_ids).await?;
    let mut rtasks = RolloutTask::from_rows(&tasks, &task_ids, &system);
    if args.reuse != crate::domain::bank::Reuse::None {
        let Some(bank_run) = args.bank_run else {
            anyhow::bail!(
                "--reuse {} needs --bank-run RUN (the run whose rubric bank is read)",
                args.reuse.as_str()
            );
        };
        let bank = crate::pipeline::bank::Bank::load(
            pool.clone(),
            bank_run,
            crate::pipeline::bank::Embedder::from_config(&cfg)?,
            cfg.reflection.top_k,
        )
        .await?;
        anyhow::ensure!(!bank.is_empty(), "run {bank_run} has an empty rubric bank");
        let queries: Vec<(uuid::Uuid, &str)> = rtasks
            .iter()
            .zip(&tasks)
            .map(|(t, row)| (t.task_id, row.query.as_str()))
            .collect();
        let found = bank.retrieve_many(&queries, args.reuse).await?;
        let mut served = std::collections::BTreeMap::<&str, usize>::new();
        for (t, got) in rtasks.iter_mut().zip(found) {
            *served.entry(got.mode().as_str()).or_default() += 1;
            t.user = got.inject(&t.user)?;
        }
        tracing::info!(reuse = args.reuse.as_str(), bank = %bank_run, items = bank.len(), served = ?served, "memory injected");
    }
    let ctx = RolloutCtx {
        client,
        codec: Arc::new(tokenizer),
        tools: Arc::new(runner),
        cfg: RolloutConfig::from_config(&cfg.rollout, cfg.experiment.seed),
    };
    let cancel = tokio_util::sync::CancellationToken::new();
    let ctrl_c = cancel.clone();
    let watcher = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            tracing::warn!("interrupted: abandoning trajectories in flight");
            ctrl_c.cancel();
        }
    });
    let pb = crate::telemetry::progress((rtasks.len() * n as usize) as u64, "rollouts");
    let started = std::time::Instant::now();
    let slot = RolloutSlot {
        run_id,
        step: 0,
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
    let status = if cancel.is_cancelled() {
        "cancelled"
    } else {
        "completed"
    };
    db::runs::set_step_status(&pool, run_id, 0, status).await?;
    db::runs::set_run_status(&pool, run_id, status, None).await?;
    summary.run_id = run_id;
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

async fn index(cmd: IndexCommand) -> anyhow::Result<ExitCode> {
    use crate::infra::tools::local_search::{LocalIndex, read_corpus};
    match cmd {
        IndexCommand::Build { corpus, out: dir } => {
            let started = std::time::Instant::now();
            let n = tokio::task::spawn_blocking(move || -> anyhow::Result<u64> {
                let docs = read_corpus(&corpus)?;
                Ok(LocalIndex::build(&docs, Some(&dir))?.num_docs())
            })
            .await??;
            out(format!(
                "indexed {n} documents in {:.1} s",
                started.elapsed().as_secs_f64()
            ));
        }
        IndexCommand::Eval {
            index,
            queries,
            qrels,
            k,
        } => {
            let report =
                tokio::task::spawn_blocking(move || -> anyhow::Result<(usize, f64, f64)> {
                    let idx = LocalIndex::open(&index)?;
                    let qrels = crate::domain::eval::retrieval::read_qrels(&qrels)
                        .with_context(|| format!("reading {}", qrels.display()))?;
                    let text = std::fs::read_to_string(&queries)
                        .with_context(|| format!("reading {}", queries.display()))?;
                    let pb = crate::telemetry::progress(qrels.len() as u64, "queries");
                    let started = std::time::Instant::now();
                    let (mut n, mut sum) = (0usize, 0.0f64);
                    for line in text.lines().filter(|l| !l.trim().is_empty()) {
                        let q: serde_json::Value = serde_json::from_str(line)?;
                        let id = q["_id"]
                            .as_str()
                            .or_else(|| q["id"].as_str())
                            .unwrap_or_default();
                        let Some(rel) = qrels.get(id) else { continue };
                        let qtext = q["text"].as_str().unwrap_or_default();
                        let ranked: Vec<String> =
                            idx.search(qtext, k)?.into_iter().map(|h| h.id).collect();
                        sum += crate::domain::eval::retrieval::ndcg_at_k(&ranked, rel, k);
                        n += 1;
                        pb.inc(1);
                    }
                    pb.finish_and_clear();
                    let per_query_ms = started.elapsed().as_secs_f64() * 1000.0 / n.max(1) as f64;
                    Ok((n, if n == 0 { 0.0 } else { sum / n as f64 }, per_query_ms))
                })
                .await??;
            out(format!(
                "nDCG@{k} = {:.4} over {} judged queries ({:.2} ms per query)",
                report.1, report.0, report.2
            ));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn client_for(
    cfg: &Config,
    role: Role,
    pool: &crate::domain::config::EndpointPoolConfig,
) -> anyhow::Result<LlmClient> {
    let http = llm::build_http(Duration::from_secs(10))?;
    Ok(LlmClient::from_config(
        http,
        role,
        pool,
        &cfg.retry,
        &cfg.health,
    )?)
}

/// `orchestrator run`: register the experiment (or find the one to resume), then run each
/// recipe's pipeline in turn. Ctrl-C stops starting rollouts, trains what is already judged and
/// leaves the run `paused`; a second Ctrl-C exits at once. `--resume` takes a run id or an
/// experiment id and continues every run of it that is not completed, on the configuration the
/// run was started with (database URL and endpoints may be overridden).
async fn run_experiment(args: &ConfigArgs, resume: Option<uuid::Uuid>) -> anyhow::Result<ExitCode> {
    use crate::domain::config::Recipe;
    use crate::pipeline::setup;

    let mut cfg = load_config(args)?;
    let pool = db::open(&cfg.database.url, cfg.database.max_connections).await?;
    let runs: Vec<(uuid::Uuid, Recipe, String)> = match resume {
        Some(id) => {
            let rows = match db::runs::get_run(&pool, id).await? {
                Some(r) => vec![r],
                None => db::runs::list_for_experiment(&pool, id).await?,
            };
            anyhow::ensure!(
                !rows.is_empty(),
                "--resume {id}: no run or experiment with that id in {}",
                db::redact_url(&cfg.database.url)
            );
            if let Some(snap) = db::runs::config_of(&pool, rows[0].id).await? {
                let mut stored: Config = serde_json::from_value(snap)
                    .context("the run's stored configuration no longer parses")?;
                stored.database = cfg.database.clone();
                stored.policy.urls = cfg.policy.urls.clone();
                stored.trainer = cfg.trainer.clone();
                stored.judge.urls = cfg.judge.urls.clone();
                if let Some(steps) = args.steps {
                    stored.experiment.steps = steps;
                }
                cfg = stored;
            }
            rows.into_iter()
                .filter(|r| r.status != "completed")
                .map(|r| {
                    let recipe: Recipe =
                        serde_json::from_value(serde_json::Value::String(r.recipe.clone()))
                            .unwrap_or(Recipe::Full);
                    (r.id, recipe, r.name)
                })
                .collect()
        }
        None => {
            let snapshot = cfg.snapshot();
            let exp = db::runs::create_experiment(
                &pool,
                &cfg.experiment.name,
                &args.experiment,
                &snapshot,
            )
            .await?;
            let mut v = Vec::new();
            for recipe in &cfg.experiment.recipes {
                let id = db::runs::create_run(
                    &pool,
                    exp,
                    recipe.as_str(),
                    recipe.as_str(),
                    &snapshot,
                    cfg.experiment.seed as i64,
                )
                .await?;
                v.push((id, *recipe, recipe.as_str().to_string()));
            }
            out(format!(
                "experiment {} ({}) registered as {exp} with {} run(s), {} steps each",
                cfg.experiment.name,
                cfg.experiment.description,
                v.len(),
                cfg.experiment.steps
            ));
            v
        }
    };
    if cfg.judge.kind == JudgeKind::Lexical {
        out(format!(
            "judge: offline lexical judge `{}` (deterministic term matching, not an LLM)",
            cfg.judge.model
        ));
    }
    let common = setup::common(&cfg, &pool).await?;
    let cancel = tokio_util::sync::CancellationToken::new();
    let ctrl_c = cancel.clone();
    let watcher = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            tracing::warn!(
                "interrupted: no new rollouts; finishing judged steps (Ctrl-C again to quit now)"
            );
            ctrl_c.cancel();
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        }
    });
    let mut failed = false;
    for (run_id, recipe, name) in runs {
        if cancel.is_cancelled() {
            break;
        }
        db::runs::set_run_status(&pool, run_id, "running", None).await?;
        let pipeline = match setup::pipeline(&cfg, &pool, &common, run_id, recipe).await {
            Ok(p) => std::sync::Arc::new(p),
            Err(e) => {
                let msg = crate::domain::util::error_chain(&e);
                db::runs::set_run_status(&pool, run_id, "failed", Some(&msg)).await?;
                return Err(anyhow::anyhow!(msg).context(format!("run {name} ({run_id})")));
            }
        };
        let pb = crate::telemetry::progress(u64::from(cfg.experiment.steps), &name);
        let result = pipeline.run(cancel.clone(), pb.clone()).await;
        pb.finish_and_clear();
        match result {
            Ok(o) => {
                let status = if o.interrupted { "paused" } else { "completed" };
                db::runs::set_run_status(&pool, run_id, status, None).await?;
                let curve = db::metrics::fetch(&pool, run_id, "reward/answer").await?;
                let mean = |xs: &[(i32, f64)]| {
                    xs.iter().map(|x| x.1).sum::<f64>() / xs.len().max(1) as f64
                };
                let k = curve.len().min(3);
                out(format!(
                    "run {name} ({run_id}): {status}, {} of {} steps ({} now, {} replayed into the trainer); \
                     answer reward first {k} steps {:.4}, last {k} steps {:.4}",
                    o.completed,
                    cfg.experiment.steps,
                    o.completed_now,
                    o.replayed,
                    mean(&curve[..k]),
                    mean(&curve[curve.len() - k..]),
                ));
            }
            Err(e) => {
                let msg = crate::domain::util::error_chain(&e);
                db::runs::set_run_status(&pool, run_id, "failed", Some(&msg)).await?;
                out(format!("run {name} ({run_id}): failed: {msg}"));
                failed = true;
            }
        }
    }
    watcher.abort();
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
