//! `orchestrator data deeprubric`: read the seeds, build the tools and the LLM clients, run the
//! requested DeepRubric stages (resumable under --name), print the statistics and write the
//! task file of kept and revised pairs.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::{cancel_on_ctrl_c, load_config, out};
use crate::cli::{DeepRubricArgs, DeepRubricStage};
use crate::domain::deeprubric::{Stats, TreeLimits};
use crate::infra::db;
use crate::infra::llm::{self, LlmClient, Role};
use crate::pipeline::deeprubric::{self as dr, DeepRubricError, DrSpec, Stage};

/// The seeds with their pages: topics from lines of text or JSONL rows with `topic` / `seed` /
/// `title` (no page), or the titles of sampled corpus documents (their text is the page).
fn read_seeds(args: &DeepRubricArgs) -> anyhow::Result<(Vec<String>, Vec<Option<String>>)> {
    match (&args.seeds, &args.seed_corpus) {
        (Some(path), None) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading seeds {}", path.display()))?;
            let mut seeds = Vec::new();
            for (i, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() {
                    continue;
                }
                let seed = if line.starts_with('{') {
                    let v: serde_json::Value = serde_json::from_str(line)
                        .with_context(|| format!("{} line {}: not JSON", path.display(), i + 1))?;
                    ["topic", "seed", "title"]
                        .iter()
                        .find_map(|k| v[*k].as_str().map(str::to_string))
                        .with_context(|| {
                            format!(
                                "{} line {}: no `topic`, `seed` or `title` string",
                                path.display(),
                                i + 1
                            )
                        })?
                } else {
                    line.to_string()
                };
                seeds.push(seed);
            }
            anyhow::ensure!(!seeds.is_empty(), "{} holds no seed", path.display());
            let pages = vec![None; seeds.len()];
            Ok((seeds, pages))
        }
        (None, Some(path)) => {
            let docs = crate::infra::tools::read_corpus(path)?;
            anyhow::ensure!(
                args.seed_count >= 1 && args.seed_count <= docs.len(),
                "--seed-count = {} is out of range; the corpus has {} documents",
                args.seed_count,
                docs.len()
            );
            let picked = crate::domain::bench::sample::PyRandom::new(args.seed)
                .sample(docs.len(), args.seed_count);
            Ok(picked
                .into_iter()
                .map(|i| {
                    let d = &docs[i];
                    let seed = if d.title.trim().is_empty() {
                        d.text.split('.').next().unwrap_or("").trim().to_string()
                    } else {
                        d.title.trim().to_string()
                    };
                    (
                        seed,
                        Some(format!("{}\n\n{}", d.title.trim(), d.text.trim())),
                    )
                })
                .unzip())
        }
        _ => anyhow::bail!("give the seeds: --seeds FILE, or --seed-corpus CORPUS.jsonl"),
    }
}

/// A judge-role client of one endpoint with the experiment's retry and health settings.
fn client(
    cfg: &crate::domain::config::Config,
    url: &str,
    model: &str,
    key_env: Option<&str>,
    inflight: usize,
) -> anyhow::Result<LlmClient> {
    let endpoint = crate::domain::config::EndpointPoolConfig {
        urls: vec![url.to_string()],
        model: model.to_string(),
        max_concurrency: u32::try_from(inflight.max(1)).unwrap_or(u32::MAX),
        timeout_secs: cfg.judge.timeout_secs.max(1),
        api_key_env: key_env.map(str::to_string),
    };
    Ok(LlmClient::from_config(
        llm::build_http(Duration::from_secs(10))?,
        Role::Judge,
        &endpoint,
        &cfg.retry,
        &cfg.health,
    )?)
}

fn print_stats(s: &Stats) {
    out(format!(
        "trees {} ({} failed): {:.1} nodes, {:.1} leaves per tree; leaves by depth {:?}",
        s.trees, s.trees_failed, s.nodes_per_tree, s.leaves_per_tree, s.leaf_depths
    ));
    out(format!(
        "items composed {} (failed {}): {:.1} leaves and {:.1} rubrics per item, {:.0}% factual",
        s.items_composed,
        s.items_failed,
        s.leaves_per_item,
        s.rubrics_per_item,
        s.factual_share * 100.0
    ));
    let judged = (s.keep + s.revise + s.drop).max(1) as f64;
    out(format!(
        "verification: KEEP {} ({:.1}%), REVISE {} ({:.1}%), DROP {} ({:.1}%), failed {}; reasons {:?}",
        s.keep,
        s.keep as f64 / judged * 100.0,
        s.revise,
        s.revise as f64 / judged * 100.0,
        s.drop,
        s.drop as f64 / judged * 100.0,
        s.verify_failed,
        s.reasons
    ));
    out(format!(
        "per tree: {:.2} s retrieving and asking, {:.4} s writing nodes to Postgres",
        s.tree_seconds, s.db_seconds_per_tree
    ));
    out(format!(
        "LLM: {} calls, {} prompt + {} completion tokens, ${:.4}",
        s.llm_calls, s.prompt_tokens, s.completion_tokens, s.cost_usd
    ));
    for (stage, c) in &s.per_stage {
        out(format!(
            "  {stage}: {} calls, {} prompt + {} completion tokens, ${:.4}",
            c.calls, c.prompt_tokens, c.completion_tokens, c.cost_usd
        ));
    }
}

pub async fn deeprubric(args: &DeepRubricArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(&args.config)?;
    let (seeds, pages) = read_seeds(args)?;
    let setup = args.tools.setup();
    let runner = crate::infra::tools::setup::build(&setup, None).await?;
    let names = runner.names();
    let search_tool = match &args.search_tool {
        Some(t) => {
            anyhow::ensure!(
                names.contains(t),
                "--search-tool {t}: no such tool; configured: {}",
                names.join(", ")
            );
            t.clone()
        }
        None => ["snippet_search", "google_search"]
            .iter()
            .find(|n| names.iter().any(|x| x == *n))
            .map(|s| s.to_string())
            .or_else(|| names.first().cloned())
            .context("no search tool configured")?,
    };
    let url = args
        .llm_url
        .clone()
        .or_else(|| cfg.judge.urls.first().cloned())
        .context("DeepRubric needs an LLM: --llm-url URL (or --judge-url)")?;
    let model = args
        .llm_model
        .clone()
        .unwrap_or_else(|| cfg.judge.model.clone());
    let key_env = args.key_env.as_deref().or(cfg.judge.api_key_env.as_deref());
    let llm = client(&cfg, &url, &model, key_env, args.llm_in_flight)?;
    let verifier = client(
        &cfg,
        args.verifier_url.as_deref().unwrap_or(&url),
        args.verifier_model.as_deref().unwrap_or(&model),
        key_env,
        args.llm_in_flight,
    )?;
    anyhow::ensure!(
        (1..=6).contains(&args.max_depth),
        "--max-depth = {} is out of range 1..=6",
        args.max_depth
    );
    anyhow::ensure!(
        (2..=500).contains(&args.max_nodes),
        "--max-nodes = {} is out of range 2..=500",
        args.max_nodes
    );
    let name = args.name.clone().unwrap_or_else(|| {
        format!(
            "deeprubric-{}",
            &crate::domain::util::sha256_hex(seeds.join("\n").as_bytes())[..12]
        )
    });
    let spec = DrSpec {
        name: name.clone(),
        seeds,
        pages,
        limits: TreeLimits {
            max_depth: args.max_depth,
            max_nodes: args.max_nodes,
            passages: args.passages.clamp(1, 20),
            passage_chars: args.passage_chars.clamp(100, 100_000),
        },
        llm,
        verifier,
        temperature: args.temperature,
        max_tokens: args.max_tokens,
        attempts: args.attempts.clamp(1, 10),
        tools: Arc::new(runner),
        search_tool,
        trees_inflight: args.trees_in_flight.max(1),
        progress: true,
        prices: crate::domain::deeprubric::Prices {
            prompt: args.usd_per_mtok_prompt.max(0.0),
            completion: args.usd_per_mtok_completion.max(0.0),
        },
    };
    let stages: &[Stage] = match args.stage {
        DeepRubricStage::Tree => &[Stage::Tree],
        DeepRubricStage::Compose => &[Stage::Compose],
        DeepRubricStage::Verify => &[Stage::Verify],
        DeepRubricStage::All => &[Stage::Tree, Stage::Compose, Stage::Verify],
    };
    let pool = db::open(&cfg.database.url, cfg.database.max_connections).await?;
    let (cancel, watcher) = cancel_on_ctrl_c("interrupted: stopping the DeepRubric build", true);
    let result = dr::run(&pool, &spec, stages, &cancel).await;
    watcher.abort();
    let (id, stats) = match result {
        Ok(x) => x,
        Err(e @ DeepRubricError::Interrupted { .. }) => {
            out(e.to_string());
            return Ok(ExitCode::from(130));
        }
        Err(e) => return Err(e.into()),
    };
    let written = dr::write_tasks(&pool, id, &args.out).await?;
    out(format!(
        "build `{name}` ({id}): {written} tasks written to {}",
        args.out.display()
    ));
    print_stats(&stats);
    if args.json {
        out(serde_json::to_string(&stats)?);
    }
    Ok(ExitCode::SUCCESS)
}
