//! `orchestrator sft-data`: build SFT warm-start data (ChatML JSONL with tool spans marked),
//! offline from the research world's known evidence chains searched on the local index, or
//! from a teacher model at `--teacher-url`.

use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;

use super::{load_config, out};
use crate::cli::SftDataArgs;
use crate::infra::llm::{LlmClient, Role};

pub(super) async fn sft_data(args: &SftDataArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(&args.config)?;
    if args.teacher_url.is_none() {
        crate::pipeline::setup::ensure_world(&cfg)?;
    }
    let tasks_path = args.tasks.clone().unwrap_or_else(|| cfg.data.tasks.clone());
    // The offline teacher needs the world's index; a teacher endpoint uses it when it is built.
    let use_index = args.teacher_url.is_none() || cfg.data.index.join("meta.json").exists();
    let setup = crate::infra::tools::setup::ToolSetup {
        index: use_index.then(|| cfg.data.index.clone()),
        index_tool: Some(cfg.data.index_tool.clone()),
        index_k: Some(cfg.data.index_k),
        web: args.web_tools,
        mcp_urls: vec![],
    };
    let runner = crate::infra::tools::setup::build(&setup, None).await?;
    anyhow::ensure!(
        !runner.names().is_empty(),
        "sft-data has no tool to call: build the local index ({}) or pass --web-tools",
        cfg.data.index.display()
    );
    let tool = args
        .tool
        .clone()
        .unwrap_or_else(|| cfg.data.index_tool.clone());
    let scaffold = cfg.data.scaffold;
    let system = crate::infra::prompts::system_prompt(
        scaffold,
        &runner.specs(),
        cfg.rollout.max_tool_calls,
    )?;
    anyhow::ensure!(
        args.reflections_out.is_none() || args.teacher_url.is_none(),
        "--reflections-out is written by the offline teacher only (it reads the research world's trajectories); drop --teacher-url or --reflections-out"
    );
    let mut reflections = Vec::new();
    let mut injected = Vec::new();
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
            let client = LlmClient::for_role(&cfg, Role::Teacher, &pool)?;
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
            for (line, t) in
                crate::domain::jsonl::rows::<crate::domain::data::world::WorldTask>(&text)
            {
                tasks.push(t.with_context(|| {
                    format!(
                        "{} line {line}: not a research-world task (the offline teacher needs the world's evidence chains; pass --teacher-url for other task files)",
                        tasks_path.display(),
                    )
                })?);
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
                runner.names().contains(&tool),
                "--tool = {:?} is not available; configured tools: {}",
                tool,
                runner.names().join(", ")
            );
            let (rows, stats) = crate::pipeline::sft::offline(
                &tasks,
                &docs,
                &runner,
                &tool,
                &system,
                cfg.rollout.max_tool_calls,
            )
            .await;
            if args.reflections_out.is_some() {
                reflections = crate::pipeline::sft::reflection_rows(
                    &tasks,
                    &rows,
                    cfg.reflection.max_trajectory_chars,
                )?;
            }
            if args.injected_out.is_some() {
                let embedder = crate::infra::embed::Embedder::from_config(&cfg)?;
                injected = crate::pipeline::sft::injected_rows(
                    &tasks,
                    &rows,
                    &reflections,
                    cfg.reflection.max_item_chars,
                    cfg.reflection.top_k,
                    &embedder,
                )
                .await?;
            }
            (rows, stats)
        }
    };
    if let Some(path) = &args.reflections_out {
        write_rows(path, &reflections)?;
        out(format!(
            "sft-data: {} reflection demonstrations ({} on a cut attempt, {} on a looping one) written to {}",
            reflections.len(),
            reflections
                .iter()
                .filter(|r| r.id.contains("#reflect-cut"))
                .count(),
            reflections
                .iter()
                .filter(|r| r.id.contains("#reflect-loop"))
                .count(),
            path.display()
        ));
    }
    if let Some(path) = &args.injected_out {
        write_rows(path, &injected)?;
        out(format!(
            "sft-data: {} demonstrations with an injected bank block written to {}",
            injected.len(),
            path.display()
        ));
    }
    write_rows(&args.out, &rows)?;
    out(format!(
        "sft-data: {} of {} tasks written to {} (rejected: {})",
        stats.written,
        stats.tasks,
        args.out.display(),
        serde_json::to_string(&stats.rejected)?
    ));
    Ok(ExitCode::SUCCESS)
}

fn write_rows(path: &std::path::Path, rows: &[crate::pipeline::sft::SftRow]) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    for r in rows {
        writeln!(f, "{}", serde_json::to_string(r)?)?;
    }
    f.flush()?;
    Ok(())
}
