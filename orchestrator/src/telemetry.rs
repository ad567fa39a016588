//! Tracing set-up: an env filter (`RUST_LOG`, default `orchestrator=info`), text or JSON on
//! stderr, and progress bars that share the terminal with log lines without breaking them.

use tracing_indicatif::IndicatifLayer;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::cli::LogFormat;

/// Install the global subscriber. Safe to call once; a second call is ignored.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("orchestrator=info,trainer=info,warn"));
    let _ = match format {
        LogFormat::Text => {
            let indicatif = IndicatifLayer::new();
            let writer = indicatif.get_stderr_writer();
            tracing_subscriber::registry()
                .with(filter)
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_writer(writer)
                        .with_target(false),
                )
                .with(indicatif)
                .try_init()
        }
        LogFormat::Json => tracing_subscriber::registry()
            .with(filter)
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
}

/// A progress bar for long work; hidden when stderr is not a terminal.
pub fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(len);
    let style = indicatif::ProgressStyle::with_template(
        "{msg:>12} [{elapsed_precise}] {wide_bar} {pos}/{len} ({per_sec}, eta {eta})",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    pb.set_style(style);
    pb.set_message(what.to_string());
    pb
}
