//! `orchestrator report`: write a markdown report with PNG and SVG plots for a run or a whole
//! experiment.

use std::path::Path;
use std::process::ExitCode;

use super::out;
use crate::infra::db;

pub(super) async fn report(
    target: uuid::Uuid,
    dir: &Path,
    select_by: Option<String>,
    database_url: &str,
) -> anyhow::Result<ExitCode> {
    let pool = db::open(database_url, 4).await?;
    let options = crate::pipeline::report::ReportOptions { select_by };
    let path = crate::pipeline::report::write(&pool, target, dir, &options).await?;
    out(format!("report written to {}", path.display()));
    Ok(ExitCode::SUCCESS)
}
