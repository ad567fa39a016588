//! Tests that run as several ranks: the test binary re-executes itself once per rank with the
//! variables torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
//! TORCHELASTIC_USE_AGENT_STORE: this process hosts the store) and an env var naming the test
//! each child runs, then checks every rank passed.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use tch::Device;
use trainer::dist::{BackendKind, C10d, DistEnv, DistOptions};

/// How the children of one multi-rank test are started.
#[derive(Debug, Clone, Copy)]
pub struct Spawn {
    /// The env var naming the test a child process runs as one rank.
    pub child_var: &'static str,
    /// Every rank gets LOCAL_RANK 0 (several ranks sharing one GPU), instead of its rank.
    pub one_device: bool,
}

/// Run test `name` of this binary as `world` ranks; every rank's output, in rank order. A rank
/// still running after `limit` is killed (and fails the test).
pub fn run_ranks(spawn: Spawn, name: &str, world: usize, limit: Duration) -> Vec<Output> {
    // This process hosts the store, as a launcher's agent does: the port is held from binding
    // on, so another test cannot take it before the ranks rendezvous.
    let (_store, port) = trainer::dist::host_store("127.0.0.1", world, limit).unwrap();
    let port = port.to_string();
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = (0..world)
        .map(|rank| {
            let local = if spawn.one_device { 0 } else { rank };
            Command::new(&exe)
                .args([name, "--exact", "--nocapture", "--test-threads=1"])
                .env(spawn.child_var, name)
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", local.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("TORCHELASTIC_USE_AGENT_STORE", "true")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let t0 = Instant::now();
    while children.iter_mut().any(|c| c.try_wait().unwrap().is_none()) {
        if t0.elapsed() > limit {
            for c in &mut children {
                let _ = c.kill();
            }
            let outs: Vec<String> = children
                .into_iter()
                .map(|c| {
                    let o = c.wait_with_output().unwrap();
                    String::from_utf8_lossy(&o.stderr).into_owned()
                })
                .collect();
            panic!("ranks of {name} still running after {limit:?}: {outs:#?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

/// Every rank exited 0 with its one test passed; the lines the ranks report (` -> `, `: ok (`)
/// are echoed, prefixed with the rank.
pub fn assert_ranks_passed(name: &str, outs: &[Output]) {
    for (rank, o) in outs.iter().enumerate() {
        // What the ranks report (seen with --nocapture).
        for line in String::from_utf8_lossy(&o.stderr).lines() {
            if line.contains(" -> ") || line.contains(": ok (") {
                eprintln!("rank {rank}: {line}");
            }
        }
        assert!(
            o.status.success() && String::from_utf8_lossy(&o.stdout).contains("1 passed"),
            "{name}: rank {rank} failed ({:?}):\n{}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// In a child process started for test `name` (its `child_var` says so): the rank's
/// environment, one torch thread. `None` in any other process, where the test does nothing.
pub fn child_env(child_var: &str, name: &str) -> Option<DistEnv> {
    if std::env::var(child_var).ok().as_deref() != Some(name) {
        return None;
    }
    tch::set_num_threads(1);
    Some(DistEnv::from_env().unwrap().unwrap())
}

/// The rank's group over `backend` (one gloo thread) with `timeout` for every collective.
pub fn join(env: &DistEnv, backend: BackendKind, timeout: Duration) -> trainer::dist::Result<C10d> {
    join_on(env, backend, Device::Cpu, timeout)
}

/// [`join`] for a rank training on `device` (a gloo group's collectives then take tensors
/// there; an NCCL group's are on CUDA device LOCAL_RANK whatever it is).
pub fn join_on(
    env: &DistEnv,
    backend: BackendKind,
    device: Device,
    timeout: Duration,
) -> trainer::dist::Result<C10d> {
    C10d::init(
        env,
        &DistOptions {
            backend,
            device,
            timeout,
            threads: 1,
            ..DistOptions::default()
        },
    )
}
