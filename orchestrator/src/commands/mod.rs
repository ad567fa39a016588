//! Command dispatch: turns a parsed CLI into work, one file per subcommand. This is the edge of
//! the program, so it uses `anyhow` and writes human-readable output to stdout; everything it
//! calls returns typed errors.

mod bank;
mod config;
mod dashboard;
mod deeprubric;
mod eval;
mod export;
mod index;
mod judge;
mod migrate;
mod probe;
mod report;
mod rollout;
mod rubrics;
mod run;
mod sft_data;
mod track;
mod world;

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cli::{Cli, Command, ConfigArgs};
use crate::domain::config::Config;
pub use crate::pipeline::rollout::RolloutSummary;
pub use rollout::rollout;

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Migrate { database_url } => migrate::migrate(&database_url).await,
        Command::DbCheck { database_url } => migrate::db_check(&database_url).await,
        Command::Config(args) => config::config(&args),
        Command::Probe { config, role } => probe::probe(&config, role).await,
        Command::Index(cmd) => index::index(cmd).await,
        Command::World(cmd) => world::world(cmd),
        Command::Rollout(args) => rollout::command(&args).await,
        Command::Judge(args) => judge::judge(&args).await,
        Command::Rubrics(cmd) => rubrics::rubrics(cmd).await,
        Command::Run { config, resume } => run::run_experiment(&config, resume).await,
        Command::Eval(args) => eval::eval(&args).await,
        Command::SftData(args) => sft_data::sft_data(&args).await,
        Command::Data(crate::cli::DataCommand::Deeprubric(args)) => {
            deeprubric::deeprubric(&args).await
        }
        Command::Bank(cmd) => bank::bank(cmd).await,
        Command::Dashboard { bind, database_url } => {
            dashboard::dashboard(bind, &database_url).await
        }
        Command::Export(args) => export::export(&args).await,
        Command::Report {
            target,
            out: dir,
            select_by,
            database_url,
        } => report::report(target, &dir, select_by, &database_url).await,
        Command::Track(args) => track::track(&args).await,
    }
}

/// One line on stdout.
fn out(line: impl AsRef<str>) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{}", line.as_ref());
}

/// The resolved configuration (preset < file < env < flags).
fn load_config(args: &ConfigArgs) -> anyhow::Result<Config> {
    Config::load(&args.experiment, &args.overrides()).context("configuration rejected")
}

/// A token cancelled by the first Ctrl-C, which logs `message`; with `second_exits`, a second
/// Ctrl-C exits the process at once with status 130. Abort the returned watcher when the work
/// it guards is done.
fn cancel_on_ctrl_c(
    message: &'static str,
    second_exits: bool,
) -> (CancellationToken, JoinHandle<()>) {
    let cancel = CancellationToken::new();
    let token = cancel.clone();
    let watcher = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            tracing::warn!("{message}");
            token.cancel();
            if second_exits && tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        }
    });
    (cancel, watcher)
}
