//! `orchestrator export`: a run's policy version as a directory transformers, PEFT and vLLM
//! load. The orchestrator writes what only Postgres knows (the run, its evaluations up to that
//! version, gold-judged benchmarks, the resolved configuration) as a model card section; the
//! trainer binary writes the weights, tokenizer and card (`trainer export --card-extra`).

use std::process::ExitCode;

use anyhow::{Context, anyhow, bail};

use super::out;
use crate::cli::ExportArgs;
use crate::domain::export::{CardBench, CardEval, CardRun, model_card};
use crate::infra::db;

pub(super) async fn export(a: &ExportArgs) -> anyhow::Result<ExitCode> {
    let pool = db::open(&a.database_url, 2).await?;
    db::check_migrations(&pool, &a.database_url).await?;
    let run = db::runs::get_run(&pool, a.run)
        .await?
        .ok_or_else(|| anyhow!("no run {} in {}", a.run, a.database_url))?;
    let (experiment, preset, completed) = db::pipeline::card_facts(&pool, a.run)
        .await?
        .ok_or_else(|| anyhow!("no run {}", a.run))?;
    let checkpoints = db::pipeline::checkpoints(&pool, a.run).await?;
    let versions: Vec<i32> = checkpoints.iter().map(|c| c.policy_version).collect();
    let cp = match a.version {
        Some(v) => checkpoints.iter().find(|c| c.policy_version == v),
        None => checkpoints.last(),
    }
    .ok_or_else(|| {
        anyhow!(
            "run {} has no checkpoint{}; checkpointed policy versions: {versions:?} (pipeline.checkpoint_every sets how often)",
            a.run,
            a.version.map(|v| format!(" of policy version {v}")).unwrap_or_default()
        )
    })?;
    let evals: Vec<CardEval> = db::evaluations::for_run(&pool, a.run)
        .await?
        .into_iter()
        .map(|e| CardEval {
            subset: e.subset,
            policy_version: e.policy_version,
            judge_model: e.judge_model,
            tasks: e.tasks,
            samples: e.samples,
            score: e.score,
            exact: e.exact,
            failed: e.failed,
        })
        .collect();
    let benches: Vec<CardBench> = db::pipeline::gold_benchmarks(&pool, a.run)
        .await?
        .into_iter()
        .map(|(name, benchmark, policy_version, score)| CardBench {
            name,
            benchmark,
            policy_version,
            score,
        })
        .collect();
    let config = db::runs::config_of(&pool, a.run).await?.unwrap_or_default();
    let config_toml = crate::domain::export::config_toml(&config);
    let card = model_card(
        &CardRun {
            experiment,
            preset,
            run: run.name.clone(),
            run_id: run.id.to_string(),
            recipe: run.recipe.clone(),
            seed: run.seed,
            status: run.status.clone(),
            completed_steps: completed,
            policy_version: cp.policy_version,
            checkpoint: cp.path.clone(),
        },
        &evals,
        &benches,
        &config_toml,
    );
    if a.card_only {
        std::fs::write(&a.out, &card).with_context(|| format!("writing {}", a.out.display()))?;
        out(format!("model card section written to {}", a.out.display()));
        return Ok(ExitCode::SUCCESS);
    }
    let checkpoint = match &a.checkpoint_root {
        Some(root) if std::path::Path::new(&cp.path).is_relative() => root.join(&cp.path),
        _ => std::path::PathBuf::from(&cp.path),
    };
    if !checkpoint.is_dir() {
        bail!(
            "checkpoint of policy version {} is {} here, which is not a directory{}",
            cp.policy_version,
            checkpoint.display(),
            if a.checkpoint_root.is_none() {
                "; the run records paths relative to the trainer's --checkpoint-dir: pass it as --checkpoint-root"
            } else {
                ""
            }
        );
    }
    let card_file = std::env::temp_dir().join(format!("rubricem-card-{}.md", uuid::Uuid::now_v7()));
    std::fs::write(&card_file, &card)
        .with_context(|| format!("writing {}", card_file.display()))?;
    let mut cmd = tokio::process::Command::new(&a.trainer_bin);
    cmd.arg("export")
        .arg("--checkpoint")
        .arg(&checkpoint)
        .arg("--out")
        .arg(&a.out)
        .arg("--card-extra")
        .arg(&card_file)
        .arg("--dtype")
        .arg(&a.dtype);
    if let Some(base) = &a.base {
        cmd.arg("--base").arg(base);
    }
    if a.merge {
        cmd.arg("--merge");
    }
    let output = cmd.output().await;
    let _ = std::fs::remove_file(&card_file);
    let output = output.with_context(|| {
        format!(
            "running `{} export` (set --trainer-bin / ORCH_TRAINER_BIN to the trainer binary)",
            a.trainer_bin.display()
        )
    })?;
    if !output.status.success() {
        bail!(
            "`{} export --checkpoint {}` failed ({}): {}",
            a.trainer_bin.display(),
            checkpoint.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    out(String::from_utf8_lossy(&output.stdout).trim_end());
    out(format!(
        "policy version {} of run {} exported to {}",
        cp.policy_version,
        run.name,
        a.out.display()
    ));
    Ok(ExitCode::SUCCESS)
}
