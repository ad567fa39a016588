//! `orchestrator bank show|search|export`: inspect a run's rubric bank (reflection memory):
//! list its items, retrieve for a query as a rollout would, or export it as JSONL.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;

use super::{load_config, out};
use crate::cli::BankCommand;
use crate::domain::bank::Retrieved;
use crate::infra::db;
use crate::pipeline::bank::{Bank, Embedder};

pub(super) async fn bank(cmd: BankCommand) -> anyhow::Result<ExitCode> {
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
