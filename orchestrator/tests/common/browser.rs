//! Drives Debian's chromium through scripts/browser/dashboard-check.mjs (playwright-core,
//! installed by scripts/browser-env.sh) and returns its JSON report; shared by the dashboard's
//! browser tests in this crate and the trainer's (included there by path). Tests only.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs scripts/browser/dashboard-check.mjs on `pages` and returns its report. The process
/// is awaited off the runtime: sqlx tests run on one thread, which also serves the dashboard.
pub async fn browse(base: &str, out: &Path, pages: &[(&str, String)]) -> serde_json::Value {
    let (base, out) = (base.to_string(), out.to_path_buf());
    let pages: Vec<(String, String)> = pages
        .iter()
        .map(|(n, h)| (n.to_string(), h.clone()))
        .collect();
    tokio::task::spawn_blocking(move || browse_blocking(&base, &out, &pages))
        .await
        .unwrap()
}

fn browse_blocking(base: &str, out: &Path, pages: &[(String, String)]) -> serde_json::Value {
    let script = workspace().join("scripts/browser/dashboard-check.mjs");
    assert!(
        workspace()
            .join("scripts/browser/node_modules/playwright-core")
            .exists(),
        "playwright-core is not installed: run scripts/browser-env.sh (scripts/test.sh does)"
    );
    let mut cmd = std::process::Command::new("node");
    cmd.arg(&script).arg(base).arg(out);
    for (name, hash) in pages {
        cmd.arg(format!("{name}={hash}"));
    }
    let output = cmd
        .output()
        .expect("node runs (scripts/browser-env.sh installs it)");
    assert!(
        output.status.success(),
        "browser check failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}
