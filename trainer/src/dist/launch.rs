//! `trainer serve --nproc-per-node N`: the local launcher. It starts N copies of this binary
//! with the same arguments and the rendezvous environment torchrun would set (RANK,
//! WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), then watches them: the
//! job ends when every rank has exited successfully; the first rank to fail stops the job (the
//! others get SIGTERM, then SIGKILL after a grace period) and the launcher fails naming that
//! rank and its exit status, so a supervisor
//! restarts the whole group and the orchestrator re-synchronises it. Ctrl-C / SIGTERM to the
//! launcher is passed on to every rank. Multi-node jobs run one launcher per node with
//! `--nnodes`, `--node-rank` and the same MASTER_ADDR / MASTER_PORT (rank 0's node hosts the
//! store). A one-node job without MASTER_PORT has its store hosted by the launcher itself, at a
//! port the OS picks (torchrun's agent store): no port is probed and released.

use std::ffi::OsString;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("launch: {0}")]
    Spec(String),
    #[error("launch: starting rank {rank} ({exe}) failed: {message}")]
    Spawn {
        rank: usize,
        exe: String,
        message: String,
    },
    #[error(
        "rank {rank} (pid {pid}) exited with {status}; the other ranks were stopped (see its log above)"
    )]
    RankExited {
        rank: usize,
        pid: u32,
        status: String,
    },
    #[error(
        "launch: hosting the rendezvous store on {addr} (port 0: the OS picks) failed: {message}"
    )]
    Store { addr: String, message: String },
    #[error("launch: {0}")]
    Io(#[from] std::io::Error),
}

/// Where this node's ranks sit in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchSpec {
    /// Ranks on this node.
    pub nproc_per_node: usize,
    pub nnodes: usize,
    pub node_rank: usize,
    /// Rank 0's host (`127.0.0.1` on one node).
    pub master_addr: String,
    /// `None` (one node only): the launcher hosts the store at a port the OS picks.
    pub master_port: Option<u16>,
    /// How long ranks get to stop after SIGTERM before SIGKILL.
    pub grace: Duration,
}

impl LaunchSpec {
    /// The environment of local rank `local` (name, value), torchrun's names.
    pub fn env_of(&self, local: usize, port: u16) -> Vec<(&'static str, String)> {
        vec![
            (
                "RANK",
                (self.node_rank * self.nproc_per_node + local).to_string(),
            ),
            (
                "WORLD_SIZE",
                (self.nnodes * self.nproc_per_node).to_string(),
            ),
            ("LOCAL_RANK", local.to_string()),
            ("LOCAL_WORLD_SIZE", self.nproc_per_node.to_string()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", port.to_string()),
        ]
    }

    fn check(&self) -> Result<(), LaunchError> {
        if self.nproc_per_node == 0 || self.nnodes == 0 {
            return Err(LaunchError::Spec(format!(
                "--nproc-per-node = {} and --nnodes = {}; allowed: 1 or more each",
                self.nproc_per_node, self.nnodes
            )));
        }
        if self.node_rank >= self.nnodes {
            return Err(LaunchError::Spec(format!(
                "--node-rank = {}; allowed: 0..{} (--nnodes)",
                self.node_rank, self.nnodes
            )));
        }
        if self.nnodes > 1 && self.master_port.is_none() {
            return Err(LaunchError::Spec(
                "a multi-node job needs MASTER_PORT (and MASTER_ADDR: rank 0's host) set the same on every node".into(),
            ));
        }
        Ok(())
    }
}

/// How long the launcher's own store waits on a call of its own (it makes none after starting;
/// the ranks' calls carry their own timeouts).
const AGENT_STORE_TIMEOUT: Duration = Duration::from_secs(300);

/// The rendezvous store of a one-node job without MASTER_PORT, hosted by the launcher as
/// torchrun's agent hosts it: a TCPStore server on MASTER_ADDR at a port the OS picks, held from
/// binding until the job ends, so no other process can take the port between its choice and the
/// ranks' rendezvous (which a port probed, released and handed on allows). The ranks get
/// TORCHELASTIC_USE_AGENT_STORE and join it as clients, rank 0 included.
fn host_agent_store(spec: &LaunchSpec) -> Result<(super::StoreHost, u16), LaunchError> {
    super::host_store(
        &spec.master_addr,
        spec.nnodes * spec.nproc_per_node,
        AGENT_STORE_TIMEOUT,
    )
    .map_err(|message| LaunchError::Store {
        addr: spec.master_addr.clone(),
        message,
    })
}

fn describe(s: ExitStatus) -> String {
    match s.code() {
        Some(c) => format!("exit code {c}"),
        None => format!("{s} (killed by a signal)"),
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

struct Rank {
    rank: usize,
    child: Child,
    done: Option<ExitStatus>,
}

/// Start this node's ranks running this binary with `args` and watch them until the job ends.
/// `stop` is polled between checks: when it returns true (Ctrl-C, SIGTERM) the ranks are
/// stopped and the launch ends without error.
pub fn launch(
    spec: &LaunchSpec,
    args: &[OsString],
    mut stop: impl FnMut() -> bool,
) -> Result<(), LaunchError> {
    spec.check()?;
    let exe = std::env::current_exe()?;
    // `agent_store` (when hosted) lives until the launch returns, after every rank has exited.
    let (agent_store, port) = match spec.master_port {
        Some(p) => (None, p),
        None => {
            let (store, port) = host_agent_store(spec)?;
            (Some(store), port)
        }
    };
    let mut ranks: Vec<Rank> = Vec::with_capacity(spec.nproc_per_node);
    for local in 0..spec.nproc_per_node {
        let mut env = spec.env_of(local, port);
        if agent_store.is_some() {
            env.push(("TORCHELASTIC_USE_AGENT_STORE", "true".to_owned()));
        }
        let rank: usize = spec.node_rank * spec.nproc_per_node + local;
        let mut cmd = Command::new(&exe);
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        match cmd.spawn() {
            Ok(child) => {
                tracing::info!(rank, pid = child.id(), port, "rank started");
                ranks.push(Rank {
                    rank,
                    child,
                    done: None,
                });
            }
            Err(e) => {
                stop_all(&mut ranks, spec.grace);
                return Err(LaunchError::Spawn {
                    rank,
                    exe: exe.display().to_string(),
                    message: e.to_string(),
                });
            }
        }
    }
    loop {
        if stop() {
            tracing::info!("stopping every rank");
            stop_all(&mut ranks, spec.grace);
            return Ok(());
        }
        for r in ranks.iter_mut().filter(|r| r.done.is_none()) {
            if let Some(status) = r.child.try_wait()? {
                r.done = Some(status);
                let (rank, pid) = (r.rank, r.child.id());
                if status.success() {
                    tracing::info!(rank, pid, "rank finished");
                    continue;
                }
                tracing::error!(rank, pid, status = %describe(status), "rank exited; stopping the others");
                stop_all(&mut ranks, spec.grace);
                return Err(LaunchError::RankExited {
                    rank,
                    pid,
                    status: describe(status),
                });
            }
        }
        if ranks_left(&ranks) == 0 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn ranks_left(ranks: &[Rank]) -> usize {
    ranks.iter().filter(|r| r.done.is_none()).count()
}

/// SIGTERM every running rank, SIGKILL whatever still runs after `grace`, reap all.
fn stop_all(ranks: &mut [Rank], grace: Duration) {
    for r in ranks.iter().filter(|r| r.done.is_none()) {
        signal(r.child.id(), "TERM");
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        for r in ranks.iter_mut().filter(|r| r.done.is_none()) {
            if let Ok(Some(s)) = r.child.try_wait() {
                r.done = Some(s);
            }
        }
        if ranks_left(ranks) == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for r in ranks.iter_mut().filter(|r| r.done.is_none()) {
        tracing::warn!(rank = r.rank, "rank ignored SIGTERM; killing it");
        let _ = r.child.kill();
        if let Ok(s) = r.child.wait() {
            r.done = Some(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(n: usize, nodes: usize, node: usize, port: Option<u16>) -> LaunchSpec {
        LaunchSpec {
            nproc_per_node: n,
            nnodes: nodes,
            node_rank: node,
            master_addr: "10.0.0.1".into(),
            master_port: port,
            grace: Duration::from_secs(1),
        }
    }

    #[test]
    fn ranks_get_torchruns_environment() {
        let env = spec(4, 2, 1, Some(29500)).env_of(2, 29500);
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("RANK"), Some("6"));
        assert_eq!(get("WORLD_SIZE"), Some("8"));
        assert_eq!(get("LOCAL_RANK"), Some("2"));
        assert_eq!(get("LOCAL_WORLD_SIZE"), Some("4"));
        assert_eq!(get("MASTER_ADDR"), Some("10.0.0.1"));
        assert_eq!(get("MASTER_PORT"), Some("29500"));
    }

    #[test]
    fn bad_layouts_are_refused_with_the_limit() {
        let e = spec(0, 1, 0, None).check().unwrap_err().to_string();
        assert!(e.contains("--nproc-per-node = 0"), "{e}");
        let e = spec(2, 2, 2, Some(1)).check().unwrap_err().to_string();
        assert!(e.contains("--node-rank = 2") && e.contains("0..2"), "{e}");
        let e = spec(2, 2, 0, None).check().unwrap_err().to_string();
        assert!(e.contains("MASTER_PORT"), "{e}");
        assert!(spec(2, 1, 0, None).check().is_ok());
    }

    #[test]
    fn the_launcher_holds_its_store_port_from_binding_to_the_end() {
        let mut one_node = spec(2, 1, 0, None);
        one_node.master_addr = "127.0.0.1".into();
        let (store, port) = host_agent_store(&one_node).unwrap();
        assert_ne!(port, 0, "the OS-picked port is reported");
        // The port is taken while the store lives: nothing else can bind it.
        assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_err());
        // A rank joins it as a client and sees what another client wrote.
        let t = Duration::from_secs(10);
        let a = super::super::ffi::Store::tcp("127.0.0.1", port, false, 2, t).unwrap();
        let b = super::super::ffi::Store::tcp("127.0.0.1", port, false, 2, t).unwrap();
        a.set("k", b"v").unwrap();
        assert_eq!(b.get("k", t).unwrap(), b"v");
        drop((a, b, store));
    }
}
