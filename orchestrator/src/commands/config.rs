//! `orchestrator config`: print the resolved configuration (preset < file < env < flags) as
//! TOML.

use std::process::ExitCode;

use super::{load_config, out};
use crate::cli::ConfigArgs;

pub(super) fn config(args: &ConfigArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(args)?;
    out(cfg.to_toml());
    Ok(ExitCode::SUCCESS)
}
