//! Tests that run as several ranks: the test binary re-executes itself once per rank with the
//! variables torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
//! TORCHELASTIC_USE_AGENT_STORE: this process hosts the store) and an env var naming the test
//! each child runs, then checks every rank passed.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};
use trainer::dist::{BackendKind, C10d, Collective, DistEnv, DistOptions, ReduceOp, Work};

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

/// On rank `g.rank()` of a 2-rank group whose collectives take tensors on `dev`: each collective
/// the trainer uses gives the hand-computed values. All-reduce (sum, min, max; f32 and bf16),
/// several in flight waited in any order, reduce-scatter, all-gather in rank order, broadcast
/// from rank 1; then a barrier.
pub fn collectives_give_hand_computed_values(g: &dyn Collective, dev: Device) {
    let rank = g.rank();
    assert_eq!((g.world(), g.device()), (2, dev));
    let r = rank as f32;
    let on = |v: &[f32]| Tensor::from_slice(v).to_device(dev);
    let values = |t: &Tensor| {
        Vec::<f32>::try_from(t.to_kind(Kind::Float).to_device(Device::Cpu).view([-1])).unwrap()
    };
    // All-reduce: sum, min, max; f32 and bf16.
    for (op, want) in [
        (ReduceOp::Sum, [3.0f32, -1.0]),
        (ReduceOp::Min, [1.0, -1.0]),
        (ReduceOp::Max, [2.0, 0.0]),
    ] {
        let mut t = on(&[r + 1.0, -r]);
        g.all_reduce(&mut t, op).unwrap().wait().unwrap();
        assert_eq!(values(&t), want, "{op:?}");
    }
    let mut b = on(&[0.5 + r, 2.0]).to_kind(Kind::BFloat16);
    g.all_reduce(&mut b, ReduceOp::Sum).unwrap().wait().unwrap();
    assert_eq!((b.kind(), values(&b)), (Kind::BFloat16, vec![2.0, 4.0]));
    // Several in flight at once, waited in any order.
    let mut ts: Vec<Tensor> = (0..4).map(|k| on(&[k as f32 * (r + 1.0)])).collect();
    let works: Vec<Work> = ts
        .iter_mut()
        .map(|t| g.all_reduce(t, ReduceOp::Sum).unwrap())
        .collect();
    for w in works.into_iter().rev() {
        w.wait().unwrap();
    }
    assert_eq!(
        ts.iter().flat_map(values).collect::<Vec<_>>(),
        [0.0, 3.0, 6.0, 9.0]
    );
    // Reduce-scatter: rank k gets the sum of everyone's k-th half.
    let input = Tensor::arange(4, (Kind::Float, dev)) + 10.0 * r as f64;
    let mut out = Tensor::zeros([2], (Kind::Float, dev));
    g.reduce_scatter(&mut out, &input, ReduceOp::Sum)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        values(&out),
        if rank == 0 {
            [10.0, 12.0]
        } else {
            [14.0, 16.0]
        }
    );
    // All-gather in rank order (2-D, dim 0).
    let mine = on(&[r, r + 0.5]).view([1, 2]);
    let mut all = Tensor::zeros([2, 2], (Kind::Float, dev));
    g.all_gather(&mut all, &mine).unwrap().wait().unwrap();
    assert_eq!(values(&all), [0.0, 0.5, 1.0, 1.5]);
    // Broadcast from rank 1.
    let mut t = on(&[r * 7.0, 1.0 + r]);
    g.broadcast(&mut t, 1).unwrap().wait().unwrap();
    assert_eq!(values(&t), [7.0, 2.0]);
    g.barrier().unwrap();
}
