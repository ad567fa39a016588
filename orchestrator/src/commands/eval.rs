//! `orchestrator eval`: score the project's agent, a plain chat model or another system's answers
//! on a benchmark by its own protocol, with a judge panel; print the papers' table (or one JSON
//! line with `--json`) and write markdown + plots with `--out`. Ctrl-C stops cleanly; the same
//! command (same --name) resumes.

use std::collections::HashMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;

use super::{cancel_on_ctrl_c, load_config, out};
use crate::cli::{EvalArgs, FactArg, HbAggregationArg, RaceCleanArg, SamplingArg};
use crate::domain::bench::Benchmark;
use crate::domain::bench::load::{LoadOptions, load, load_answers};
use crate::domain::bench::sample::{Sampling, select};
use crate::domain::bench::score::Aggregation;
use crate::domain::config::Config;
use crate::domain::util::sha256_hex;
use crate::infra::chat::ModelTokenizer;
use crate::infra::db;
use crate::infra::llm::{self, LlmClient, Role};
use crate::infra::tools::browse::Browser;
use crate::infra::tools::ssrf::{AddressGuard, IpBlock};
use crate::pipeline::bench::{
    self, BenchError, BenchRun, Clean, FactPages, GradeOptions, JudgeSpec, Responder, Templates,
};
use crate::pipeline::rollout::RolloutCtx;

pub(super) async fn eval(args: &EvalArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(&args.config)?;
    let bench: Benchmark = args.benchmark.parse().map_err(anyhow::Error::msg)?;
    let opts = LoadOptions {
        criteria: args.criteria.clone(),
        references: args.references.clone(),
        subset_ids: args.subset_ids.clone(),
    };
    let all = load(bench, &args.data, &opts)?;
    anyhow::ensure!(!all.is_empty(), "{} holds no items", args.data.display());
    let data_sha256 = sha256_hex(
        &std::fs::read(&args.data).with_context(|| format!("reading {}", args.data.display()))?,
    );
    let sampling =
        args.sampling
            .unwrap_or(if bench.is_healthbench() || bench == Benchmark::Simpleqa {
                SamplingArg::SimpleEvals
            } else {
                SamplingArg::Drtulu
            });
    let (sampling, sampling_name) = match sampling {
        SamplingArg::SimpleEvals => (Sampling::SimpleEvals, "simple-evals"),
        SamplingArg::Drtulu => (Sampling::DrTulu, "drtulu"),
        SamplingArg::First => (Sampling::First, "first"),
    };
    let picked = select(all.len(), args.limit, args.seed, sampling);
    let items: Vec<_> = picked.iter().map(|&i| all[i].clone()).collect();
    let selection = json!({
        "limit": args.limit, "seed": args.seed, "sampling": sampling_name,
        "available": all.len(),
    });

    let pool = db::open(&cfg.database.url, cfg.database.max_connections).await?;
    let (responder, responder_desc) = responder(args, &cfg, bench).await?;
    let judges = judges(args, &cfg, bench)?;
    let mut gopts = GradeOptions {
        aggregation: match args.hb_aggregation {
            HbAggregationArg::Clipped => Aggregation::ClippedMean,
            HbAggregationArg::Plain => Aggregation::PlainMean,
        },
        ternary: args.rr_ternary,
        coverage_batch: args.coverage_batch,
        clean: match args.race_clean {
            RaceCleanArg::Llm => Clean::Llm,
            RaceCleanArg::Strip => Clean::Strip,
        },
        parse_attempts: args.parse_attempts,
        fact: match args.fact {
            FactArg::Off => FactPages::Off,
            FactArg::Trace => FactPages::Trace,
            FactArg::Browse => FactPages::Browse,
        },
        webwalker_cot_qa: args.webwalker_cot_qa,
        fetcher: None,
    };
    anyhow::ensure!(
        !gopts.webwalker_cot_qa || bench == Benchmark::Webwalker,
        "--webwalker-cot-qa applies to webwalker only (benchmark {bench})"
    );
    anyhow::ensure!(
        gopts.fact == FactPages::Off || bench == Benchmark::Drb,
        "--fact applies to drb only (benchmark {bench})"
    );
    if gopts.fact == FactPages::Browse {
        let allow = args
            .fact_allow
            .iter()
            .map(|b| {
                b.parse::<IpBlock>()
                    .map_err(|e| anyhow::anyhow!("--fact-allow {b:?}: {e}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        gopts.fetcher = Some(Arc::new(Browser::new(
            AddressGuard::new(allow),
            4 << 20,
            std::time::Duration::from_secs(30),
        )?));
    }
    anyhow::ensure!(
        (1..=64).contains(&gopts.coverage_batch),
        "--coverage-batch = {} is out of range; allowed: 1..=64",
        gopts.coverage_batch
    );
    gopts.parse_attempts = gopts.parse_attempts.clamp(1, 20);
    let templates = templates(&args.grader_template, bench, &gopts)?;
    let name = args.name.clone().unwrap_or_else(|| {
        let judges: Vec<&str> = judges.iter().map(|j| j.label.as_str()).collect();
        let key = format!(
            "{selection}|{responder_desc}|{}|{}",
            judges.join(","),
            serde_json::to_string(&templates.hashes(&bench::grade::templates_of(bench, &gopts)))
                .unwrap_or_default()
        );
        format!(
            "{bench}-{}-{}-{}",
            responder.kind(),
            &data_sha256[..8],
            &sha256_hex(key.as_bytes())[..8]
        )
    });
    let spec = BenchRun {
        name: name.clone(),
        bench,
        data_path: args.data.display().to_string(),
        data_sha256,
        items,
        selection,
        responder,
        responder_desc,
        judges,
        templates,
        opts: gopts,
        gen_inflight: args.max_inflight.max(1),
        judge_inflight: args.judge_inflight.max(1),
        bootstrap: args.bootstrap,
        seed: args.seed.unwrap_or(0),
        source_run_id: None,
        policy_version: None,
        progress: true,
    };
    tracing::info!(%name, benchmark = %bench, items = spec.items.len(), "evaluating");
    let (cancel, watcher) = cancel_on_ctrl_c("interrupted: stopping the evaluation", true);
    let result = bench::run(&pool, spec, &cancel).await;
    watcher.abort();
    let summary = match result {
        Ok(s) => s,
        Err(e @ BenchError::Interrupted { .. }) => {
            out(e.to_string());
            return Ok(ExitCode::from(130));
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(dir) = &args.out {
        write_out(dir, &summary)?;
    }
    if args.json {
        out(serde_json::to_string(&summary)?);
    } else {
        out(summary.render());
    }
    Ok(ExitCode::SUCCESS)
}

/// The responder and its recorded settings.
async fn responder(
    args: &EvalArgs,
    cfg: &Config,
    bench: Benchmark,
) -> anyhow::Result<(Responder, serde_json::Value)> {
    if let Some(path) = &args.answers {
        let rows = load_answers(path)?;
        let map: HashMap<String, String> = rows.into_iter().map(|r| (r.id, r.answer)).collect();
        let desc = json!({
            "kind": "answers", "file": path.display().to_string(),
            "sha256": sha256_hex(&std::fs::read(path)?), "rows": map.len(),
        });
        return Ok((Responder::Answers(Arc::new(map)), desc));
    }
    let mut policy = cfg.policy.clone();
    if let Some(m) = &args.policy_model {
        policy.model = m.clone();
    }
    anyhow::ensure!(
        !policy.urls.is_empty(),
        "evaluating a model needs a policy endpoint: --policy-url URL (or --answers FILE to score published answers)"
    );
    let client = LlmClient::for_role(cfg, Role::Policy, &policy)?;
    let temperature = args.temperature.unwrap_or(cfg.rollout.temperature);
    if args.chat {
        let desc = json!({
            "kind": "chat", "model": policy.model, "urls": policy.urls,
            "temperature": temperature, "max_tokens": args.max_tokens, "seed": cfg.experiment.seed,
            "system": null,
        });
        return Ok((
            Responder::Chat {
                client,
                system: None,
                temperature,
                max_tokens: args.max_tokens,
                seed: Some(cfg.experiment.seed),
            },
            desc,
        ));
    }
    let tokenizer_dir = args
        .tokenizer
        .clone()
        .unwrap_or_else(|| cfg.data.tokenizer.clone());
    anyhow::ensure!(
        !tokenizer_dir.as_os_str().is_empty(),
        "the agent needs the policy's tokenizer directory: --tokenizer DIR (or --chat for a plain chat baseline)"
    );
    let tokenizer = ModelTokenizer::from_dir(&tokenizer_dir)?;
    llm::detect_all(&client, Role::Policy).await?;
    let setup = args.tools.setup();
    let runner = crate::infra::tools::setup::build(&setup, None).await?;
    let system = crate::infra::prompts::system_prompt(
        args.scaffold,
        &runner.specs(),
        cfg.rollout.max_tool_calls,
    )?;
    let mut rcfg = cfg.rollout.clone();
    rcfg.temperature = temperature;
    let tools: Vec<String> = runner.specs().iter().map(|t| t.name.clone()).collect();
    let desc = json!({
        "kind": "agent", "scaffold": args.scaffold, "model": policy.model, "urls": policy.urls,
        "temperature": temperature, "top_p": rcfg.top_p, "max_tokens": rcfg.max_tokens,
        "max_tool_calls": rcfg.max_tool_calls, "seed": cfg.experiment.seed,
        "tools": tools, "index": args.tools.index.as_ref().map(|p| p.display().to_string()),
        "web_tools": args.tools.web_tools, "mcp": args.tools.mcp,
        "system_sha256": sha256_hex(system.as_bytes()),
        "format_sha256": sha256_hex(crate::infra::prompts::user_message("", if bench.short_answer() { crate::infra::chat::AnswerFormat::Exact } else { crate::infra::chat::AnswerFormat::Long }).as_bytes()),
        "tokenizer": tokenizer_dir.display().to_string(),
    });
    let ctx = RolloutCtx {
        client,
        codec: Arc::new(tokenizer),
        tools: Arc::new(runner),
        cfg: rcfg,
        seed: Some(cfg.experiment.seed),
        scaffold: args.scaffold,
    };
    Ok((
        Responder::Agent {
            ctx: Box::new(ctx),
            system,
            policy_version: 0,
        },
        desc,
    ))
}

/// The judge panel: one judge per --judge-url (default judge.urls), each with its model.
fn judges(args: &EvalArgs, cfg: &Config, bench: Benchmark) -> anyhow::Result<Vec<JudgeSpec>> {
    if args.no_judge {
        anyhow::ensure!(
            bench.short_answer(),
            "--no-judge scores by exact match and works only on short-answer benchmarks; {bench} needs an LLM judge"
        );
        return Ok(vec![]);
    }
    let urls = cfg.judge.urls.clone();
    anyhow::ensure!(
        !urls.is_empty(),
        "{bench} is graded by an LLM judge: pass --judge-url URL (repeat for a panel){}",
        if bench.short_answer() {
            ", or --no-judge for exact match only"
        } else {
            ""
        }
    );
    let models: Vec<String> = match args.judge_model.len() {
        0 => vec![cfg.judge.model.clone(); urls.len()],
        1 => vec![args.judge_model[0].clone(); urls.len()],
        n if n == urls.len() => args.judge_model.clone(),
        n => anyhow::bail!(
            "--judge-model names {n} models for {} judge URLs; give one model or one per URL",
            urls.len()
        ),
    };
    let key_env = args
        .judge_key_env
        .as_deref()
        .or(cfg.judge.api_key_env.as_deref());
    let http = llm::build_http(Duration::from_secs(10))?;
    let mut out = Vec::new();
    for (url, model) in urls.iter().zip(models) {
        let mut judge = JudgeSpec::on_endpoint(
            cfg,
            http.clone(),
            url,
            &model,
            key_env,
            args.judge_inflight,
            args.judge_timeout_secs.max(1),
        )?;
        judge.temperature = args.judge_temperature;
        judge.max_tokens = args.judge_max_tokens;
        judge.usd_per_mtok_prompt = args.usd_per_mtok_prompt;
        judge.usd_per_mtok_completion = args.usd_per_mtok_completion;
        out.push(judge);
    }
    let mut seen = std::collections::BTreeSet::new();
    for j in &out {
        anyhow::ensure!(
            seen.insert(j.label.clone()),
            "the judge {} is named twice in the panel",
            j.label
        );
    }
    Ok(out)
}

/// The embedded grader templates with the user's replacements (`NAME=FILE`, or `FILE` alone
/// when the benchmark uses one template).
fn templates(specs: &[String], bench: Benchmark, opts: &GradeOptions) -> anyhow::Result<Templates> {
    let mut t = Templates::embedded();
    let used = bench::grade::templates_of(bench, opts);
    for s in specs {
        let (name, file) = match s.split_once('=') {
            Some((n, f)) if !n.contains('/') => (n.trim().to_string(), f.trim().to_string()),
            _ => {
                anyhow::ensure!(
                    used.len() == 1,
                    "--grader-template {s}: {bench} uses {} templates ({}); write NAME=FILE",
                    used.len(),
                    used.join(", ")
                );
                (used[0].to_string(), s.clone())
            }
        };
        let source = std::fs::read_to_string(&file)
            .with_context(|| format!("reading grader template {file}"))?;
        t.replace(&name, source).map_err(anyhow::Error::msg)?;
    }
    Ok(t)
}

/// `--out DIR`: summary.md, summary.json and a bar chart of the score per judge and breakdown.
fn write_out(dir: &Path, summary: &bench::Summary) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("summary.md"), summary.markdown())?;
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string_pretty(summary)?,
    )?;
    bench::summary::plot(summary, &dir.join("scores.svg"), &dir.join("scores.png"))
        .map_err(|e| anyhow::anyhow!("plotting the scores: {e}"))?;
    Ok(())
}
