//! `orchestrator judge`: judge (or re-judge) the stored trajectories of a run, one step or
//! every step: rubric scores, stage scores, advantages and the judge-call log.

use std::process::ExitCode;

use anyhow::Context;

use super::{load_config, out};
use crate::cli::JudgeArgs;
use crate::domain::config::Recipe;
use crate::infra::db;
use crate::pipeline::judging::{StepOptions, judge_step};

pub(super) async fn judge(args: &JudgeArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(&args.config)?;
    let pool = db::open(&cfg.database.url, cfg.database.max_connections).await?;
    let run = db::runs::get_run(&pool, args.run)
        .await?
        .with_context(|| format!("run {} does not exist", args.run))?;
    let recipe_name = args.recipe.as_deref().unwrap_or(&run.recipe);
    let recipe = match Recipe::parse(recipe_name) {
        Some(r) => r,
        // runs made by `orchestrator rollout` have no recipe
        None if args.recipe.is_none() => Recipe::Full,
        None => anyhow::bail!(
            "--recipe = {recipe_name:?}; allowed: baseline-rl, ss-grpo, meta-policy, full, drtulu"
        ),
    };
    let mut opts = StepOptions::for_recipe(recipe, cfg.credit.lambda, cfg.credit.citation);
    opts.group.generate = args.generate;
    opts.research_evidence = cfg.judge.research_evidence;
    let judge = crate::infra::llm::judge::from_config(&cfg)?;
    let steps: Vec<i32> = match args.step {
        Some(s) => vec![s],
        None => db::trajectories::steps_of_run(&pool, args.run)
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
