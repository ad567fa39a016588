//! The Python interpreter the parity and tracker tests run: `ORCH_PYTHON` when set, else the
//! project's `.venv` (scripts/python-env.sh), else `python3`. Tests only.
#![allow(dead_code)]

use std::path::PathBuf;

pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("ORCH_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = super::browser::workspace().join(".venv/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}
