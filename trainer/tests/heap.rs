//! The `trainer` binary sets glibc's heap thresholds at start (`trainer::alloc`) and leaves an
//! allocator the environment configures alone: what it did is logged at debug level.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn heap_log(env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainer"));
    cmd.arg("info").env("RUST_LOG", "trainer=debug");
    for v in [
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
        "GLIBC_TUNABLES",
    ] {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let log = plain(&String::from_utf8_lossy(&out.stderr));
    log.lines()
        .find(|l| l.contains("glibc heap thresholds"))
        .unwrap_or_else(|| panic!("no heap line in {log}"))
        .to_string()
}

/// The log without its ANSI colour sequences (ESC [ ... m).
fn plain(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn the_binary_keeps_freed_memory_unless_the_environment_configures_glibc() {
    let default = heap_log(&[]);
    if cfg!(all(target_os = "linux", target_env = "gnu")) {
        assert!(default.contains("heap=Kept"), "{default}");
    } else {
        assert!(default.contains("heap=Unchanged"), "{default}");
    }
    for var in ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"] {
        let line = heap_log(&[(var, "1048576")]);
        assert!(
            line.contains(&format!("UserConfigured(\"{var}\")")),
            "{line}"
        );
    }
    let line = heap_log(&[("GLIBC_TUNABLES", "glibc.malloc.tcache_count=7")]);
    assert!(
        line.contains("UserConfigured(\"GLIBC_TUNABLES\")"),
        "{line}"
    );
}
