//! Collectives across training processes on torch's own distributed engine (c10d): a
//! [`Collective`] trait with the c10d backend ([`C10d`]: gloo on CPU or CUDA tensors, NCCL on
//! GPUs with the `nccl` feature) and the single-process no-op backend ([`SingleProcess`]); the
//! rendezvous environment as torchrun sets it ([`DistEnv`]); and a key-value control plane on
//! the same TCPStore (batch shards and commands go there, never through collectives, so idle
//! time between steps cannot trip a collective timeout).
//!
//! Every collective carries the group's timeout; an error names the rank and the operation.
//! Tensors must be contiguous and on the group's device; reductions are SUM/MIN/MAX (no AVG:
//! the trainer weights by global token counts, so summing is what it needs).

// The C++ shim is reached through raw pointers; `ffi` is the only module allowed unsafe code,
// and it hands out safe owners (Store, Group, PendingWork) whose Drop frees each handle once.
#[allow(unsafe_code)]
mod ffi;

pub mod data_parallel;
pub mod launch;
pub mod vllm;
pub mod watchdog;
pub mod zero;

pub use ffi::cuda_peak_allocated;

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tch::{Device, Tensor};

/// Errors of the collective layer; each names the rank and what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    /// RANK / WORLD_SIZE / MASTER_ADDR / ... missing or malformed.
    #[error("distributed environment: {0}")]
    Env(String),
    #[error("rank {rank} of {world}: rendezvous at {addr} failed: {message}")]
    Rendezvous {
        rank: usize,
        world: usize,
        addr: String,
        message: String,
    },
    /// A collective failed or timed out (a peer died, hung, or disagreed).
    #[error("rank {rank}: {op} failed: {message}")]
    Collective {
        rank: usize,
        op: &'static str,
        message: String,
    },
    /// The call itself is wrong (tensor shape, dtype, device, layout, root): nothing was sent.
    #[error("rank {rank}: {op}: {message}")]
    Invalid {
        rank: usize,
        op: &'static str,
        message: String,
    },
    #[error("rank {rank}: store {op} `{key}` failed: {message}")]
    Store {
        rank: usize,
        op: &'static str,
        key: String,
        message: String,
    },
    /// Another rank of the group failed its part of the step and said why (its report comes
    /// first: it names the cause; `here` is what this rank saw of it).
    #[error("rank {rank} failed the step: {message} (rank {at}: {here})")]
    Peer {
        rank: usize,
        message: String,
        at: usize,
        here: String,
    },
}

pub type Result<T, E = DistError> = std::result::Result<T, E>;

/// How values combine in a reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Min,
    Max,
}

impl ReduceOp {
    /// c10d's `ReduceOp::RedOpType`.
    fn code(self) -> i32 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Min => 3,
            ReduceOp::Max => 4,
        }
    }
}

/// A collective that was started; [`Work::wait`] blocks until it is done (or failed, or timed
/// out). Dropping it without waiting lets the collective finish in the background.
#[must_use = "a collective's result is known only after wait()"]
pub struct Work {
    pending: Option<ffi::PendingWork>,
    op: &'static str,
    rank: usize,
    timeout: Duration,
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work")
            .field("op", &self.op)
            .field("pending", &self.pending.is_some())
            .finish()
    }
}

impl Work {
    /// Work that is already complete (single process).
    pub fn done(op: &'static str) -> Self {
        Self {
            pending: None,
            op,
            rank: 0,
            timeout: Duration::ZERO,
        }
    }

    pub fn wait(self) -> Result<()> {
        let Some(p) = self.pending else {
            return Ok(());
        };
        p.wait(self.timeout)
            .map_err(|message| DistError::Collective {
                rank: self.rank,
                op: self.op,
                message,
            })
    }
}

/// The collectives a data-parallel trainer needs. All ranks must issue the same collectives in
/// the same order; each blocks for at most the group's timeout.
pub trait Collective: Send {
    fn rank(&self) -> usize;
    fn world(&self) -> usize;
    /// `single`, `gloo` or `nccl`.
    fn backend(&self) -> &'static str;
    /// Where the tensors of this group's collectives must live.
    fn device(&self) -> Device;
    fn timeout(&self) -> Duration;
    /// Reduce `t` across ranks in place.
    fn all_reduce(&self, t: &mut Tensor, op: ReduceOp) -> Result<Work>;
    /// `out` = this rank's slice (dim 0, rank order) of the reduction of `input`, which has
    /// `world` times `out`'s elements.
    fn reduce_scatter(&self, out: &mut Tensor, input: &Tensor, op: ReduceOp) -> Result<Work>;
    /// `out` = every rank's `input` concatenated in rank order (`world` times its elements).
    fn all_gather(&self, out: &mut Tensor, input: &Tensor) -> Result<Work>;
    /// `t` = rank `root`'s `t`.
    fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<Work>;
    /// Wait until every rank got here.
    fn barrier(&self) -> Result<()>;
    /// Control plane: publish `value` at `key` for the other ranks.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Control plane: the value at `key`, waiting up to `timeout` for a rank to set it.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;
    /// Control plane: remove `key` (a consumed command).
    fn delete(&self, key: &str) -> Result<()>;
    /// How many control-plane commands this group has sent (rank 0) or taken (the others):
    /// every rank counts the same, whichever trainer sends or takes them.
    fn commands(&self) -> &AtomicU64;
}

/// Check a collective's tensors before anything is sent: defined, contiguous, dense, on
/// `device`; for a pair `(big, Some(small))`, one dtype and `world` times as many elements in
/// `big`.
fn check_tensors(
    rank: usize,
    op: &'static str,
    device: Device,
    world: usize,
    pair: (&Tensor, Option<&Tensor>),
) -> Result<()> {
    let bad = |message: String| Err(DistError::Invalid { rank, op, message });
    let (a, b) = pair;
    for t in std::iter::once(a).chain(b) {
        if !t.defined() {
            return bad("an undefined tensor".into());
        }
        if t.device() != device {
            return bad(format!(
                "a tensor on {:?}; this group's collectives take tensors on {device:?}",
                t.device()
            ));
        }
        if !t.is_contiguous() || t.is_sparse() {
            return bad("a non-contiguous or sparse tensor".into());
        }
    }
    if let Some(small) = b {
        let big = a;
        if big.kind() != small.kind() {
            return bad(format!(
                "dtypes differ: {:?} and {:?}",
                big.kind(),
                small.kind()
            ));
        }
        if big.numel() != small.numel() * world {
            return bad(format!(
                "{} elements cannot hold {world} x {} (shapes {:?} and {:?})",
                big.numel(),
                small.numel(),
                big.size(),
                small.size()
            ));
        }
    }
    Ok(())
}

/// One process: every collective is the identity (a reduce-scatter or all-gather copies), and
/// the control plane is an in-memory map.
#[derive(Debug)]
pub struct SingleProcess {
    device: Device,
    kv: Mutex<HashMap<String, Vec<u8>>>,
    commands: AtomicU64,
}

impl SingleProcess {
    pub fn new(device: Device) -> Self {
        Self {
            device,
            kv: Mutex::new(HashMap::new()),
            commands: AtomicU64::new(0),
        }
    }
}

impl Collective for SingleProcess {
    fn rank(&self) -> usize {
        0
    }
    fn world(&self) -> usize {
        1
    }
    fn backend(&self) -> &'static str {
        "single"
    }
    fn device(&self) -> Device {
        self.device
    }
    fn timeout(&self) -> Duration {
        Duration::MAX
    }
    fn all_reduce(&self, t: &mut Tensor, _op: ReduceOp) -> Result<Work> {
        check_tensors(0, "all_reduce", self.device, 1, (t, None))?;
        Ok(Work::done("all_reduce"))
    }
    fn reduce_scatter(&self, out: &mut Tensor, input: &Tensor, _op: ReduceOp) -> Result<Work> {
        check_tensors(0, "reduce_scatter", self.device, 1, (input, Some(out)))?;
        copy_into(out, input, "reduce_scatter")?;
        Ok(Work::done("reduce_scatter"))
    }
    fn all_gather(&self, out: &mut Tensor, input: &Tensor) -> Result<Work> {
        check_tensors(0, "all_gather", self.device, 1, (out, Some(input)))?;
        copy_into(out, input, "all_gather")?;
        Ok(Work::done("all_gather"))
    }
    fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<Work> {
        check_root(0, 1, root)?;
        check_tensors(0, "broadcast", self.device, 1, (t, None))?;
        Ok(Work::done("broadcast"))
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut kv = self
            .kv
            .lock()
            .map_err(|_| store_err(0, "set", key, "poisoned"))?;
        kv.insert(key.to_owned(), value.to_vec());
        Ok(())
    }
    fn get(&self, key: &str, _timeout: Duration) -> Result<Vec<u8>> {
        let kv = self
            .kv
            .lock()
            .map_err(|_| store_err(0, "get", key, "poisoned"))?;
        kv.get(key)
            .cloned()
            .ok_or_else(|| store_err(0, "get", key, "not set (a single process waits for no one)"))
    }
    fn delete(&self, key: &str) -> Result<()> {
        let mut kv = self
            .kv
            .lock()
            .map_err(|_| store_err(0, "delete", key, "poisoned"))?;
        kv.remove(key);
        Ok(())
    }
    fn commands(&self) -> &AtomicU64 {
        &self.commands
    }
}

fn store_err(rank: usize, op: &'static str, key: &str, message: &str) -> DistError {
    DistError::Store {
        rank,
        op,
        key: key.to_owned(),
        message: message.to_owned(),
    }
}

fn copy_into(out: &mut Tensor, input: &Tensor, op: &'static str) -> Result<()> {
    tch::no_grad(|| out.f_copy_(&input.view_as(out))).map_err(|e| DistError::Invalid {
        rank: 0,
        op,
        message: e.to_string(),
    })
}

fn check_root(rank: usize, world: usize, root: usize) -> Result<()> {
    if root >= world {
        return Err(DistError::Invalid {
            rank,
            op: "broadcast",
            message: format!("root {root} is not a rank of a group of {world}"),
        });
    }
    Ok(())
}

/// Where this process sits in the job, as torchrun (or `trainer serve --nproc-per-node`) sets
/// it: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and
/// TORCHELASTIC_USE_AGENT_STORE (the launcher hosts the TCPStore; every rank is a client).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistEnv {
    pub rank: usize,
    pub world: usize,
    pub local_rank: usize,
    pub local_world: usize,
    pub master_addr: String,
    pub master_port: u16,
    pub agent_store: bool,
}

impl DistEnv {
    /// From the process environment; `None` when WORLD_SIZE is unset (a single process).
    pub fn from_env() -> Result<Option<Self>> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// From `var` (the environment's lookup, or a test's).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>> {
        let Some(world) = var("WORLD_SIZE") else {
            return Ok(None);
        };
        let num = |name: &str, v: &str| -> Result<usize> {
            v.trim()
                .parse()
                .map_err(|_| DistError::Env(format!("{name} = `{v}` is not a number")))
        };
        let world = num("WORLD_SIZE", &world)?;
        let rank = num(
            "RANK",
            &var("RANK")
                .ok_or_else(|| DistError::Env("WORLD_SIZE is set but RANK is not".into()))?,
        )?;
        if world == 0 || rank >= world {
            return Err(DistError::Env(format!(
                "RANK = {rank} with WORLD_SIZE = {world}: need 0 <= RANK < WORLD_SIZE"
            )));
        }
        let local_rank = var("LOCAL_RANK").map_or(Ok(rank), |v| num("LOCAL_RANK", &v))?;
        let local_world =
            var("LOCAL_WORLD_SIZE").map_or(Ok(world), |v| num("LOCAL_WORLD_SIZE", &v))?;
        let master_port = match var("MASTER_PORT") {
            None => 29500,
            Some(v) => v
                .trim()
                .parse()
                .map_err(|_| DistError::Env(format!("MASTER_PORT = `{v}` is not a port number")))?,
        };
        Ok(Some(Self {
            rank,
            world,
            local_rank,
            local_world,
            master_addr: var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into()),
            master_port,
            agent_store: var("TORCHELASTIC_USE_AGENT_STORE")
                .is_some_and(|v| v.eq_ignore_ascii_case("true")),
        }))
    }
}

impl DistEnv {
    /// The device this rank trains on: CUDA device LOCAL_RANK when the job runs on CUDA.
    pub fn device(&self, device: Device) -> Device {
        match device {
            Device::Cuda(_) => Device::Cuda(self.local_rank),
            d => d,
        }
    }

    /// Join this rank's group on `device` with `backend` (default: NCCL on CUDA, gloo
    /// otherwise) and `timeout` for the rendezvous and every collective.
    pub fn join(
        &self,
        device: Device,
        backend: Option<BackendKind>,
        timeout: Duration,
    ) -> Result<C10d> {
        let backend = backend.unwrap_or(if device.is_cuda() {
            BackendKind::Nccl
        } else {
            BackendKind::Gloo
        });
        tracing::info!(
            rank = self.rank,
            world = self.world,
            ?backend,
            "joining the group"
        );
        C10d::init(
            self,
            &DistOptions {
                backend,
                device,
                timeout,
                ..Default::default()
            },
        )
    }
}

/// Which c10d backend a [`C10d`] group uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// Tensors on the rank's training device: CPU (tests, CPU training), or CUDA device
    /// LOCAL_RANK, which gloo stages through pinned host memory as torch.distributed's gloo
    /// backend does (slower than NCCL, but it runs where NCCL refuses, e.g. several ranks
    /// sharing one GPU).
    Gloo,
    /// CUDA tensors on device LOCAL_RANK (needs the `nccl` feature).
    Nccl,
}

/// How to build a [`C10d`] group.
#[derive(Debug, Clone)]
pub struct DistOptions {
    pub backend: BackendKind,
    /// The device this rank trains on. A gloo group's collectives take tensors there (CUDA:
    /// device LOCAL_RANK); an NCCL group's are always on CUDA device LOCAL_RANK.
    pub device: Device,
    /// Every collective's and the rendezvous's limit.
    pub timeout: Duration,
    /// The address gloo binds on this rank (`None`: 127.0.0.1 when MASTER_ADDR is a loopback
    /// address, else gloo's default device, which honours GLOO_SOCKET_IFNAME).
    pub host: Option<String>,
    /// Gloo worker threads.
    pub threads: usize,
}

impl Default for DistOptions {
    fn default() -> Self {
        Self {
            backend: BackendKind::Gloo,
            device: Device::Cpu,
            timeout: Duration::from_secs(1800),
            host: None,
            threads: 2,
        }
    }
}

/// A c10d process group over a TCPStore rendezvous.
pub struct C10d {
    group: ffi::Group,
    /// Control-plane keys (`rubricem/ctl/...`).
    ctl: ffi::Store,
    rank: usize,
    world: usize,
    device: Device,
    timeout: Duration,
    backend: &'static str,
    commands: AtomicU64,
}

impl std::fmt::Debug for C10d {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("C10d")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("backend", &self.backend)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl C10d {
    /// Rendezvous with the other ranks of `env` and build the process group: rank 0 hosts the
    /// TCPStore (unless the launcher's agent does), the group's keys live under
    /// `rubricem/pg/dp/` and the control plane's under `rubricem/ctl/`. Blocks until every
    /// rank has joined, or `opts.timeout`.
    pub fn init(env: &DistEnv, opts: &DistOptions) -> Result<Self> {
        let addr = format!("{}:{}", env.master_addr, env.master_port);
        let fail = |message: String| DistError::Rendezvous {
            rank: env.rank,
            world: env.world,
            addr: addr.clone(),
            message,
        };
        let is_server = env.rank == 0 && !env.agent_store;
        let base = ffi::Store::tcp(
            &env.master_addr,
            env.master_port,
            is_server,
            env.world,
            opts.timeout,
        )
        .map_err(|m| fail(format!("TCPStore: {m}")))?;
        let pg_store = base.prefixed("rubricem/pg/dp/").map_err(&fail)?;
        let ctl = base.prefixed("rubricem/ctl/").map_err(&fail)?;
        let (group, device, backend) = match opts.backend {
            BackendKind::Gloo => {
                let host = opts
                    .host
                    .clone()
                    .or_else(|| is_loopback(&env.master_addr).then(|| "127.0.0.1".to_owned()));
                let g = ffi::Group::gloo(
                    &pg_store,
                    env.rank,
                    env.world,
                    host.as_deref(),
                    opts.threads.max(1),
                    opts.timeout,
                )
                .map_err(|m| fail(format!("gloo: {m}")))?;
                (g, env.device(opts.device), "gloo")
            }
            BackendKind::Nccl => {
                let g =
                    ffi::Group::nccl(&pg_store, env.rank, env.world, env.local_rank, opts.timeout)
                        .map_err(|m| fail(format!("nccl: {m}")))?;
                (g, Device::Cuda(env.local_rank), "nccl")
            }
        };
        Ok(Self {
            group,
            ctl,
            rank: env.rank,
            world: env.world,
            device,
            timeout: opts.timeout,
            backend,
            commands: AtomicU64::new(0),
        })
    }

    /// A store call under the [`watchdog`]: its own `timeout`, plus the watchdog's grace for a
    /// store client that would block past it.
    fn store_call<T>(
        &self,
        op: &'static str,
        key: &str,
        timeout: Duration,
        f: impl FnOnce() -> ffi::ShimResult<T>,
    ) -> Result<T> {
        watchdog::within(
            self.rank,
            format!("store {op} `{key}`"),
            timeout + watchdog::GRACE,
            f,
        )
        .map_err(|m| store_err(self.rank, op, key, &m))
    }

    fn work(&self, op: &'static str, r: ffi::ShimResult<ffi::PendingWork>) -> Result<Work> {
        let p = r.map_err(|message| DistError::Collective {
            rank: self.rank,
            op,
            message,
        })?;
        Ok(Work {
            pending: Some(p),
            op,
            rank: self.rank,
            timeout: self.timeout,
        })
    }
}

fn is_loopback(addr: &str) -> bool {
    addr == "localhost"
        || addr
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl Collective for C10d {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn backend(&self) -> &'static str {
        self.backend
    }
    fn device(&self) -> Device {
        self.device
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn all_reduce(&self, t: &mut Tensor, op: ReduceOp) -> Result<Work> {
        check_tensors(self.rank, "all_reduce", self.device, self.world, (t, None))?;
        self.work(
            "all_reduce",
            self.group.all_reduce(t, op.code(), self.timeout),
        )
    }
    fn reduce_scatter(&self, out: &mut Tensor, input: &Tensor, op: ReduceOp) -> Result<Work> {
        check_tensors(
            self.rank,
            "reduce_scatter",
            self.device,
            self.world,
            (input, Some(out)),
        )?;
        self.work(
            "reduce_scatter",
            self.group
                .reduce_scatter(out, input, op.code(), self.timeout),
        )
    }
    fn all_gather(&self, out: &mut Tensor, input: &Tensor) -> Result<Work> {
        check_tensors(
            self.rank,
            "all_gather",
            self.device,
            self.world,
            (out, Some(input)),
        )?;
        self.work(
            "all_gather",
            self.group.all_gather(out, input, self.timeout),
        )
    }
    fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<Work> {
        check_root(self.rank, self.world, root)?;
        check_tensors(self.rank, "broadcast", self.device, self.world, (t, None))?;
        self.work("broadcast", self.group.broadcast(t, root, self.timeout))
    }
    fn barrier(&self) -> Result<()> {
        self.work("barrier", self.group.barrier(self.timeout))?
            .wait()
    }
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.store_call("set", key, self.timeout, || self.ctl.set(key, value))
    }
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.store_call("get", key, timeout, || self.ctl.get(key, timeout))
    }
    fn delete(&self, key: &str) -> Result<()> {
        self.store_call("delete", key, self.timeout, || self.ctl.delete(key))
    }
    fn commands(&self) -> &AtomicU64 {
        &self.commands
    }
}

/// A client of a c10d TCPStore another process serves (what vLLM's ranks see of the weight-transfer
/// handshake's store, for example).
pub struct StoreClient(ffi::Store);

impl StoreClient {
    /// The value at `key`, waiting up to `timeout` for it to be set.
    pub fn get(&self, key: &str, timeout: Duration) -> std::result::Result<Vec<u8>, String> {
        self.0.get(key, timeout)
    }
}

/// A TCPStore server hosted by a process that is not a rank (the launcher, a test harness),
/// as torchrun's agent hosts one: it serves until dropped.
pub struct StoreHost {
    _store: ffi::Store,
}

impl std::fmt::Debug for StoreHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreHost").finish_non_exhaustive()
    }
}

/// Host the rendezvous store of a `world`-rank group on `host` at a port the OS picks, and that
/// port. The ranks join it as clients: MASTER_PORT = the port and
/// TORCHELASTIC_USE_AGENT_STORE=true ([`DistEnv::agent_store`]). The port is held from binding
/// on, so nothing can take it between its choice and the rendezvous.
pub fn host_store(
    host: &str,
    world: usize,
    timeout: Duration,
) -> std::result::Result<(StoreHost, u16), String> {
    ffi::Store::tcp_server_any_port(host, world, timeout)
        .map(|(s, port)| (StoreHost { _store: s }, port))
}

/// Connect to the TCPStore at `host:port` (of a `world`-process group) as a client.
pub fn store_client(
    host: &str,
    port: u16,
    world: usize,
    timeout: Duration,
) -> std::result::Result<StoreClient, String> {
    ffi::Store::tcp(host, port, false, world, timeout).map(StoreClient)
}

/// The group this process belongs to: a [`C10d`] group when the environment names one
/// (WORLD_SIZE set), else [`SingleProcess`] on `device`.
pub fn from_env(device: Device, opts: &DistOptions) -> Result<Box<dyn Collective>> {
    match DistEnv::from_env()? {
        Some(env) => Ok(Box::new(C10d::init(
            &env,
            &DistOptions {
                device,
                ..opts.clone()
            },
        )?)),
        None => Ok(Box::new(SingleProcess::new(device))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_is_read_as_torchrun_sets_it() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(DistEnv::from_vars(vars(&[])).ok(), Some(None));
        let env = DistEnv::from_vars(vars(&[
            ("WORLD_SIZE", "4"),
            ("RANK", "3"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29400"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ]))
        .ok()
        .flatten();
        let env = env.as_ref();
        assert_eq!(
            env.map(|e| (e.rank, e.world, e.local_rank)),
            Some((3, 4, 1))
        );
        assert_eq!(
            env.map(|e| (e.master_port, e.agent_store)),
            Some((29400, true))
        );
        for bad in [
            &[("WORLD_SIZE", "2")][..],
            &[("WORLD_SIZE", "2"), ("RANK", "2")],
            &[("WORLD_SIZE", "x"), ("RANK", "0")],
            &[("WORLD_SIZE", "2"), ("RANK", "0"), ("MASTER_PORT", "70000")],
        ] {
            let owned: Vec<(String, String)> = bad
                .iter()
                .map(|(a, b)| ((*a).into(), (*b).into()))
                .collect();
            let r =
                DistEnv::from_vars(|k| owned.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()));
            assert!(matches!(r, Err(DistError::Env(_))), "{bad:?}: {r:?}");
        }
    }

    #[test]
    fn single_process_collectives_are_the_identity_and_check_shapes() {
        let g = SingleProcess::new(Device::Cpu);
        let mut t = Tensor::from_slice(&[1.0f32, 2.0]);
        g.all_reduce(&mut t, ReduceOp::Sum)
            .and_then(Work::wait)
            .ok();
        assert_eq!(Vec::<f32>::try_from(&t).ok(), Some(vec![1.0, 2.0]));
        let mut out = Tensor::zeros([2], (tch::Kind::Float, Device::Cpu));
        g.all_gather(&mut out, &t).and_then(Work::wait).ok();
        assert_eq!(Vec::<f32>::try_from(&out).ok(), Some(vec![1.0, 2.0]));
        let mut short = Tensor::zeros([3], (tch::Kind::Float, Device::Cpu));
        let e = g.reduce_scatter(&mut short, &t, ReduceOp::Sum);
        assert!(matches!(
            e,
            Err(DistError::Invalid {
                op: "reduce_scatter",
                ..
            })
        ));
        assert!(matches!(
            g.broadcast(&mut t, 1),
            Err(DistError::Invalid { .. })
        ));
        g.set("k", b"v").ok();
        assert_eq!(g.get("k", Duration::ZERO).ok(), Some(b"v".to_vec()));
        assert!(g.get("missing", Duration::ZERO).is_err());
    }
}
