//! `orchestrator index build|eval`: build the local BM25 index (the offline `local_search`
//! tool) from a corpus, or measure its nDCG@k on judged queries.

use std::process::ExitCode;

use anyhow::Context;

use super::out;
use crate::cli::IndexCommand;
use crate::infra::tools::local_search::{LocalIndex, read_corpus};

pub(super) async fn index(cmd: IndexCommand) -> anyhow::Result<ExitCode> {
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
                    for (_, q) in crate::domain::jsonl::rows::<serde_json::Value>(&text) {
                        let q = q?;
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
