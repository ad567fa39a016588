//! `orchestrator probe`: feature-detect the inference servers of a role (policy, judge or
//! embeddings) and print what each offers as JSON.

use std::process::ExitCode;

use super::{load_config, out};
use crate::cli::{ConfigArgs, ProbeRole};
use crate::infra::llm::{self, LlmClient, Role};

pub(super) async fn probe(config: &ConfigArgs, role: ProbeRole) -> anyhow::Result<ExitCode> {
    let cfg = load_config(config)?;
    let (role, pool_cfg) = match role {
        ProbeRole::Policy => (Role::Policy, cfg.policy.clone()),
        ProbeRole::Judge => (Role::Judge, cfg.judge.pool()),
        ProbeRole::Embeddings => (Role::Embeddings, cfg.embeddings.clone()),
    };
    let client = LlmClient::for_role(&cfg, role, &pool_cfg)?;
    let features = llm::detect_all(&client, role).await?;
    out(serde_json::to_string_pretty(&features)?);
    Ok(ExitCode::SUCCESS)
}
