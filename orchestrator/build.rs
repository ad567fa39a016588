//! Build-time inputs of the orchestrator: rebuild when migrations change (`sqlx::migrate!`
//! embeds them), and fetch the dashboard's front-end libraries from the npm registry.
//!
//! The dashboard bundles its chart library into the binary (nothing is fetched at run time).
//! The library is never vendored in the tree: `web/package.json` and `web/package-lock.json`
//! pin it, and this script runs `npm ci` on them in `OUT_DIR`, then copies the files the
//! binary embeds to `OUT_DIR/web-vendor/`. Offline builds may point `ORCH_WEB_NODE_MODULES` at
//! a `node_modules` directory installed from the same lockfile.
#![allow(clippy::print_stdout)] // cargo reads its instructions from stdout

use std::path::{Path, PathBuf};
use std::process::Command;

/// Files of the npm packages the binary embeds: (path under node_modules, name in web-vendor).
const VENDOR: &[(&str, &str)] = &[
    ("uplot/dist/uPlot.iife.min.js", "uPlot.iife.min.js"),
    ("uplot/dist/uPlot.min.css", "uPlot.min.css"),
    ("uplot/LICENSE", "uPlot.LICENSE"),
];

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
    println!("cargo:rerun-if-changed=web/package.json");
    println!("cargo:rerun-if-changed=web/package-lock.json");
    println!("cargo:rerun-if-env-changed=ORCH_WEB_NODE_MODULES");
    if let Err(e) = vendor() {
        println!("cargo:warning=dashboard assets: {e}");
        eprintln!(
            "error: the dashboard's front-end libraries could not be installed: {e}\n\
             Install Node.js and npm (Debian: `apt-get install nodejs npm`; the registry \
             registry.npmjs.org must be reachable), or set ORCH_WEB_NODE_MODULES to a \
             node_modules directory installed with `npm ci` from orchestrator/web."
        );
        std::process::exit(1);
    }
}

fn vendor() -> Result<(), String> {
    let out = PathBuf::from(std::env::var("OUT_DIR").map_err(|e| format!("OUT_DIR: {e}"))?);
    let manifest = PathBuf::from(
        std::env::var("CARGO_MANIFEST_DIR").map_err(|e| format!("CARGO_MANIFEST_DIR: {e}"))?,
    );
    let web = manifest.join("web");
    let modules = match std::env::var_os("ORCH_WEB_NODE_MODULES") {
        Some(dir) => PathBuf::from(dir),
        None => npm_ci(&web, &out.join("web"))?,
    };
    let dst = out.join("web-vendor");
    std::fs::create_dir_all(&dst).map_err(|e| format!("creating {}: {e}", dst.display()))?;
    for (from, to) in VENDOR {
        let src = modules.join(from);
        std::fs::copy(&src, dst.join(to)).map_err(|e| {
            format!(
                "copying {} (is the package installed from web/package-lock.json?): {e}",
                src.display()
            )
        })?;
    }
    Ok(())
}

/// `npm ci` of `web`'s manifest and lockfile in `dir`, skipped when `dir` already holds an
/// install of the same lockfile. Returns the `node_modules` directory.
fn npm_ci(web: &Path, dir: &Path) -> Result<PathBuf, String> {
    let lock = std::fs::read(web.join("package-lock.json"))
        .map_err(|e| format!("reading {}: {e}", web.join("package-lock.json").display()))?;
    let modules = dir.join("node_modules");
    let stamp = dir.join("installed.lock");
    if std::fs::read(&stamp).ok().as_deref() == Some(&lock[..])
        && VENDOR.iter().all(|(f, _)| modules.join(f).exists())
    {
        return Ok(modules);
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    for f in ["package.json", "package-lock.json"] {
        std::fs::copy(web.join(f), dir.join(f))
            .map_err(|e| format!("copying {}: {e}", web.join(f).display()))?;
    }
    let status = Command::new("npm")
        .args([
            "ci",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
        ])
        .current_dir(dir)
        .status()
        .map_err(|e| format!("running `npm ci` in {}: {e}", dir.display()))?;
    if !status.success() {
        return Err(format!(
            "`npm ci` in {} exited with {status}",
            dir.display()
        ));
    }
    std::fs::write(&stamp, &lock).map_err(|e| format!("writing {}: {e}", stamp.display()))?;
    Ok(modules)
}
