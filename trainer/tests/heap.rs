//! The `trainer` binary sets glibc's heap thresholds at start (`trainer::alloc`) and leaves an
//! allocator the environment configures alone: what it did is logged at debug level.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn heap_log(env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainer"));
    // NO_COLOR: tracing-subscriber then writes the log without ANSI colour sequences.
    cmd.arg("info")
        .env("RUST_LOG", "trainer=debug")
        .env("NO_COLOR", "1");
    for v in trainer::alloc::USER_SETTINGS {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let log = String::from_utf8_lossy(&out.stderr);
    log.lines()
        .find(|l| l.contains("glibc heap thresholds"))
        .unwrap_or_else(|| panic!("no heap line in {log}"))
        .to_string()
}

#[test]
fn the_binary_keeps_freed_memory_unless_the_environment_configures_glibc() {
    let default = heap_log(&[]);
    if cfg!(all(target_os = "linux", target_env = "gnu")) {
        assert!(default.contains("heap=Kept"), "{default}");
    } else {
        assert!(default.contains("heap=Unchanged"), "{default}");
    }
    for var in [
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
        "MALLOC_ARENA_MAX",
    ] {
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
