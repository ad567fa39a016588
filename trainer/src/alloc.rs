//! The process's heap policy on glibc: keep freed memory for reuse rather than handing every
//! large block back to the kernel.
//!
//! glibc serves a block above its mmap threshold (128 KiB, rising with use to at most 32 MiB)
//! with a fresh mmap and returns it to the kernel when freed, and trims the heap's free top
//! above 128 KiB. A training step allocates the same large tensors every time (the logits
//! head's [chunk, V] buffers, each layer's activations and gradients), so on CPU it page-faults
//! and zero-fills that memory again on every step: 4-7% of a `trainer bench` step's samples
//! under `perf` were the kernel's page-fault and page-clearing paths (BENCHMARKS.md, issue
//! 22/25 session 20). Raising both thresholds makes freed blocks reusable; the resident size
//! then stays at the step's peak, which a trainer reaches again on the next step anyway.
//!
//! The thresholds govern the main arena. `trainer serve` trains and decodes on other threads
//! (tokio's blocking pool, the decode loop's thread), and glibc gives such threads arenas of
//! their own, built from heaps of at most 64 MiB: a block too large for one (the training
//! step's largest activations) is mapped on its own and unmapped when freed, whatever the
//! thresholds. So the page-clearing came back there: 5.7% of the training server's samples
//! during a `guided` run (BENCHMARKS.md, issue 25 session 82; `tests/arena.rs` shows a 96 MiB
//! block faulted in again on every use without this and once with it). One arena
//! (`M_ARENA_MAX` = 1) serves every thread from the main arena under the raised thresholds; the
//! server's allocating threads take turns on one lock, which its one-thread-at-a-time steps do
//! anyway.
//!
//! Set once at start by the binary. A user who configures glibc's allocator through the
//! environment (any of [`USER_SETTINGS`]) keeps that configuration.
//! Not glibc (musl, macOS): nothing is changed.

/// Blocks up to this size come from (and return to) the heap: 1 GiB.
pub const MMAP_THRESHOLD: i32 = 1 << 30;
/// Free memory at the heap's top kept before trimming: 1 GiB.
pub const TRIM_THRESHOLD: i32 = 1 << 30;

/// Arenas: one, the main arena, for every thread.
pub const ARENA_MAX: i32 = 1;

/// The environment variables through which glibc's allocator is configured by hand.
pub const USER_SETTINGS: [&str; 4] = [
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_ARENA_MAX",
    "GLIBC_TUNABLES",
];

/// What `keep_freed_memory` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeapPolicy {
    /// Both thresholds raised and one arena for every thread.
    Kept,
    /// The named variable configures the allocator; left as it is.
    UserConfigured(&'static str),
    /// Not glibc, or glibc refused a value.
    Unchanged,
}

/// Raise glibc's mmap and trim thresholds and keep one arena (see the module comment) unless the
/// environment configures the allocator already. Call it before any other thread starts: a
/// thread that allocated before keeps the arena it was given.
pub fn keep_freed_memory() -> HeapPolicy {
    if let Some(var) = USER_SETTINGS
        .into_iter()
        .find(|v| std::env::var_os(v).is_some())
    {
        return HeapPolicy::UserConfigured(var);
    }
    set_thresholds()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_thresholds() -> HeapPolicy {
    // SAFETY: mallopt only stores the three parameters in glibc's allocator state (under its
    // lock); the values are within the ranges glibc accepts and no pointer is involved.
    #[allow(unsafe_code)]
    let ok = unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
            && libc::mallopt(libc::M_ARENA_MAX, ARENA_MAX) == 1
    };
    if ok {
        HeapPolicy::Kept
    } else {
        HeapPolicy::Unchanged
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds() -> HeapPolicy {
    HeapPolicy::Unchanged
}
