//! A thread other than main reuses a freed large block without faulting its pages in again once
//! `trainer::alloc::keep_freed_memory` has run, as the `trainer` binary runs it first thing
//! (`trainer serve` trains on tokio's blocking pool and decodes on a thread of its own). Its own
//! harness: the policy must be set before any other thread allocates, which the test harness's
//! threads would have done.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

/// Minor page faults of the calling thread so far (/proc/thread-self/stat, field 10).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    // The fields after the command name, which is in parentheses and may hold spaces: the
    // third field (state) is the first of them, so field 10 is the eighth.
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    rest.split_whitespace().nth(7).unwrap().parse().unwrap()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn main() {
    use trainer::alloc::{HeapPolicy, USER_SETTINGS, keep_freed_memory};
    if let Some(v) = USER_SETTINGS.iter().find(|v| std::env::var_os(v).is_some()) {
        println!("arena: skipped, {v} configures glibc's allocator");
        return;
    }
    assert_eq!(keep_freed_memory(), HeapPolicy::Kept);
    // 96 MiB: larger than a thread arena's 64 MiB heaps, the size of the trainer's biggest
    // activations; and 24 MiB, which fits in one.
    for mib in [96usize, 24] {
        let bytes = mib << 20;
        let pages = (bytes / 4096) as u64;
        let faults = std::thread::spawn(move || {
            (0..3)
                .map(|_| {
                    let before = minor_faults();
                    let mut block: Vec<u8> = Vec::with_capacity(bytes);
                    block.resize(bytes, 1);
                    std::hint::black_box(&block);
                    drop(block);
                    minor_faults() - before
                })
                .collect::<Vec<u64>>()
        })
        .join()
        .unwrap();
        println!(
            "arena: {mib} MiB block on a worker thread, minor faults per round {faults:?} ({pages} pages)"
        );
        assert!(
            faults[1] < pages / 10 && faults[2] < pages / 10,
            "{mib} MiB: the freed block's pages were faulted in again: {faults:?} of {pages} pages"
        );
    }
    println!("arena: ok");
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn main() {}
