//! `orchestrator rubrics init`: write search-grounded persistent rubrics for the tasks of a
//! task file (search each question, let the judge ground answer rubrics in the results).

use std::collections::BTreeMap;
use std::process::ExitCode;

use super::{load_config, out};
use crate::cli::RubricsCommand;
use crate::infra::db;

pub(super) async fn rubrics(cmd: RubricsCommand) -> anyhow::Result<ExitCode> {
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
        index_tool: None,
        index_k: None,
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
