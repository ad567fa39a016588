//! The `orchestrator` binary: parse the CLI, set up tracing, dispatch. No logic lives here.

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = orchestrator::cli::Cli::parse();
    orchestrator::telemetry::init(cli.log_format);
    match orchestrator::commands::run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
