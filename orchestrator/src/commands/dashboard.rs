//! `orchestrator dashboard`: serve the read-only web view until Ctrl-C.

use std::net::SocketAddr;
use std::process::ExitCode;

use super::out;
use crate::infra::db;
use crate::pipeline::dashboard::{self, TOKEN_ENV, Token};

pub(super) async fn dashboard(bind: SocketAddr, database_url: &str) -> anyhow::Result<ExitCode> {
    let token = Token::from_value(std::env::var(TOKEN_ENV).ok().as_deref())?;
    dashboard::check_bind(bind, token.as_ref())?;
    let pool = db::open(database_url, 8).await?;
    db::check_migrations(&pool, database_url).await?;
    let (cancel, watcher) = super::cancel_on_ctrl_c("stopping the dashboard", true);
    out(format!(
        "dashboard on http://{bind}/{}",
        if token.is_some() {
            " (token required)"
        } else {
            ""
        }
    ));
    dashboard::serve(bind, dashboard::router(pool, token), cancel).await?;
    watcher.abort();
    Ok(ExitCode::SUCCESS)
}
