//! vLLM's native NCCL weight-transfer route (`vllm/distributed/weight_transfer/nccl_engine.py`,
//! dev-mode routes of `entrypoints/serve/dev/rlhf`; ../shared/spec/distributed.md §1.6, §3.7):
//! the trainer is rank 0 of an NCCL group with every worker of every vLLM server. Handshake:
//! `GET /get_world_size` per server (its workers W_i; world = 1 + Σ W_i), then, concurrently,
//! `POST /init_weight_transfer_engine {"init_info": {master_address, master_port, rank_offset,
//! world_size, ...}}` to each server and, here, a TCPStore server holding the pickled
//! `ncclUniqueId` at `broadcast_from/0/0`, `ncclCommInitRank(world, id, 0)` and vLLM's warm-up
//! all-reduce. Per version: `/start_weight_update`, `/update_weights {"update_info": {names,
//! dtype_names, shapes, packed: true, ...}}` while rank 0 broadcasts the weights packed into
//! `uint8` buffers by vLLM's rule (tensors are added until the byte total exceeds the buffer
//! size, the crossing tensor included), then `/finish_weight_update {"weight_version"}`.
//!
//! The NCCL communicator is behind [`WeightComm`]: the raw-NCCL implementation exists with the
//! cargo feature `nccl` (a GPU build); this machine has no GPU, so tests drive the whole HTTP and
//! store side with a recording communicator.

use std::ops::Range;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tch::{Kind, Tensor};

use super::ffi::Store;

/// The Python module path of vLLM's `ncclUniqueId` (newer trees moved it under
/// `vllm.backends.distributed...`; pass that path to [`Bridge::connect`] for them).
pub const DEFAULT_UNIQUE_ID_MODULE: &str = "vllm.distributed.device_communicators.pynccl_wrapper";

/// vLLM's defaults for packed transfers.
pub const PACKED_BUFFER_BYTES: usize = 1 << 30;
pub const PACKED_NUM_BUFFERS: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("{url}{route}: {message}")]
    Http {
        url: String,
        route: &'static str,
        message: String,
    },
    #[error("NCCL weight transfer: {0}")]
    Comm(String),
    #[error("TCPStore for the weight-transfer handshake: {0}")]
    Store(String),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, BridgeError>;

/// The NCCL side of the route: rank 0 of the transfer group.
pub trait WeightComm: Send {
    /// A fresh `ncclUniqueId` (128 bytes).
    fn unique_id(&mut self) -> Result<[u8; 128]>;
    /// Join the group as rank 0 of `world` (blocks until every rank joined) and run vLLM's
    /// warm-up all-reduce of one f32 zero.
    fn init(&mut self, id: &[u8; 128], world: usize) -> Result<()>;
    /// Broadcast `buf` (a `uint8` tensor on the communicator's device) from rank 0.
    fn broadcast(&mut self, buf: &Tensor) -> Result<()>;
}

/// `pickle.dumps(ncclUniqueId)` as vLLM's ranks unpickle it: protocol 4, the ctypes structure
/// rebuilt by `_ctypes._unpickle(cls, ({}, bytes))`. Checked against CPython's `pickle.loads`
/// with a stub module in the tests.
pub fn unique_id_pickle(module: &str, id: &[u8; 128]) -> Vec<u8> {
    fn unicode(out: &mut Vec<u8>, s: &str) {
        // SHORT_BINUNICODE (strings here are < 256 bytes) then MEMOIZE.
        out.push(0x8c);
        out.push(s.len() as u8);
        out.extend_from_slice(s.as_bytes());
        out.push(0x94);
    }
    let mut body = Vec::new();
    unicode(&mut body, "_ctypes");
    unicode(&mut body, "_unpickle");
    body.extend_from_slice(&[0x93, 0x94]); // STACK_GLOBAL, MEMOIZE
    unicode(&mut body, module);
    unicode(&mut body, "ncclUniqueId");
    body.extend_from_slice(&[0x93, 0x94]); // STACK_GLOBAL, MEMOIZE
    body.extend_from_slice(&[0x7d, 0x94]); // EMPTY_DICT, MEMOIZE
    body.push(0x43); // SHORT_BINBYTES
    body.push(128);
    body.extend_from_slice(id);
    body.push(0x94); // MEMOIZE
    body.extend_from_slice(&[0x86, 0x94]); // TUPLE2, MEMOIZE  ({}, bytes)
    body.extend_from_slice(&[0x86, 0x94]); // TUPLE2, MEMOIZE  (cls, state)
    body.extend_from_slice(&[0x52, 0x94]); // REDUCE, MEMOIZE
    body.push(0x2e); // STOP
    let mut out = vec![0x80, 4]; // PROTO 4
    out.push(0x95); // FRAME
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// vLLM's packing rule over tensor byte sizes: consecutive groups, each closed as soon as its
/// total exceeds `buffer` (the crossing tensor included).
pub fn pack_groups(sizes: &[usize], buffer: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut total) = (0, 0usize);
    for (i, &n) in sizes.iter().enumerate() {
        total += n;
        if total > buffer {
            out.push(start..i + 1);
            start = i + 1;
            total = 0;
        }
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

/// torch's dtype name of a tensor kind, as vLLM reads `dtype_names`.
pub fn dtype_name(kind: Kind) -> Result<&'static str> {
    Ok(match kind {
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        Kind::Float => "float32",
        Kind::Double => "float64",
        Kind::Int64 => "int64",
        Kind::Int => "int32",
        Kind::Int16 => "int16",
        Kind::Uint8 => "uint8",
        Kind::Int8 => "int8",
        Kind::Bool => "bool",
        other => {
            return Err(BridgeError::Invalid(format!(
                "no torch dtype name for {other:?}"
            )));
        }
    })
}

/// The tensors of one group as one `uint8` buffer (each tensor's bytes, in order).
pub fn pack(tensors: &[&Tensor]) -> Tensor {
    let parts: Vec<Tensor> = tensors
        .iter()
        .map(|t| t.contiguous().view([-1]).view_dtype(Kind::Uint8))
        .collect();
    Tensor::cat(&parts, 0)
}

/// One inference server of the group.
#[derive(Debug, Clone, PartialEq)]
pub struct Server {
    pub url: String,
    /// Its workers (tensor x pipeline x data parallel).
    pub world: usize,
    /// Global rank of its first worker.
    pub rank_offset: usize,
}

/// What one push did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PushStats {
    pub tensors: usize,
    pub bytes: usize,
    pub buffers: usize,
    pub seconds: f64,
}

/// The trainer's end of the route, connected.
pub struct Bridge {
    http: reqwest::Client,
    pub servers: Vec<Server>,
    pub world: usize,
    pub master_port: u16,
    comm: Box<dyn WeightComm>,
    /// Keeps the handshake store served while the group lives.
    _store: Store,
    pub buffer_bytes: usize,
    pub num_buffers: usize,
}

async fn post(http: &reqwest::Client, url: &str, route: &'static str, body: Value) -> Result<()> {
    crate::publish::post_json(http, url, route, &body)
        .await
        .map_err(|message| BridgeError::Http {
            url: url.to_string(),
            route,
            message,
        })
}

/// `POST route` to every server at once (bodies by server); the first failure.
async fn post_all(
    http: &reqwest::Client,
    servers: &[Server],
    route: &'static str,
    body: impl Fn(&Server) -> Value,
) -> Result<()> {
    let mut set = tokio::task::JoinSet::new();
    for s in servers {
        let (http, url, b) = (http.clone(), s.url.clone(), body(s));
        set.spawn(async move { post(&http, &url, route, b).await });
    }
    let mut first = Ok(());
    while let Some(r) = set.join_next().await {
        let r = r.unwrap_or_else(|e| Err(BridgeError::Comm(format!("request task: {e}"))));
        if first.is_ok() {
            first = r;
        }
    }
    first
}

/// `GET /get_world_size`: a bare number or `{"world_size": n}`.
async fn world_size(http: &reqwest::Client, url: &str) -> Result<usize> {
    let err = |message: String| BridgeError::Http {
        url: url.to_string(),
        route: "/get_world_size",
        message,
    };
    let v = crate::publish::get_json(http, url, "/get_world_size")
        .await
        .map_err(|e| {
            err(format!(
                "{e} (is the server in dev mode, VLLM_SERVER_DEV_MODE=1?)"
            ))
        })?;
    v.as_u64()
        .or_else(|| v["world_size"].as_u64())
        .filter(|&n| n >= 1)
        .map(|n| n as usize)
        .ok_or_else(|| err(format!("not a world size: {v}")))
}

impl Bridge {
    /// Handshake with every server of `urls` as described in the module's documentation.
    /// `master_address` is how the servers reach this process; the store listens on a free port.
    pub async fn connect(
        http: reqwest::Client,
        urls: &[String],
        master_address: &str,
        module: &str,
        mut comm: Box<dyn WeightComm>,
        timeout: Duration,
    ) -> Result<Self> {
        if urls.is_empty() {
            return Err(BridgeError::Invalid(
                "no inference server to connect".into(),
            ));
        }
        let mut servers = Vec::new();
        let mut offset = 1;
        for url in urls {
            let w = world_size(&http, url).await?;
            servers.push(Server {
                url: url.clone(),
                world: w,
                rank_offset: offset,
            });
            offset += w;
        }
        let world = offset;
        // The store binds a port the OS picks and holds it from the start: a port probed,
        // released and bound again could be taken in between (`dist::launch` does the same).
        let (store, port) = Store::tcp_server_any_port(master_address, world, timeout)
            .map_err(|e| BridgeError::Store(format!("no store on {master_address}: {e}")))?;
        let id = comm.unique_id()?;
        store
            .set("broadcast_from/0/0", &unique_id_pickle(module, &id))
            .map_err(BridgeError::Store)?;
        // The servers' ranks join while this rank initialises: both sides block until all met.
        let init = tokio::task::spawn_blocking(move || {
            let r = comm.init(&id, world);
            (comm, r)
        });
        let posts = post_all(&http, &servers, "/init_weight_transfer_engine", |s| {
            json!({"init_info": {
                "master_address": master_address, "master_port": port,
                "rank_offset": s.rank_offset, "world_size": world,
                "packed": true, "packed_buffer_size_bytes": PACKED_BUFFER_BYTES,
                "packed_num_buffers": PACKED_NUM_BUFFERS,
            }})
        });
        let (posted, joined) = tokio::join!(posts, init);
        let (comm, r) = joined.map_err(|e| BridgeError::Comm(format!("init task: {e}")))?;
        posted?;
        r?;
        Ok(Bridge {
            http,
            servers,
            world,
            master_port: port,
            comm,
            _store: store,
            buffer_bytes: PACKED_BUFFER_BYTES,
            num_buffers: PACKED_NUM_BUFFERS,
        })
    }

    /// Push `params` (HF names, in the order the servers receive them) as `version`.
    pub async fn push(&mut self, version: &str, params: &[(String, Tensor)]) -> Result<PushStats> {
        let t0 = Instant::now();
        let mut dtype_names = Vec::with_capacity(params.len());
        for (_, t) in params {
            dtype_names.push(dtype_name(t.kind())?);
        }
        let info = json!({"update_info": {
            "names": params.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            "dtype_names": dtype_names,
            "shapes": params.iter().map(|(_, t)| t.size()).collect::<Vec<_>>(),
            "packed": true,
            "packed_buffer_size_bytes": self.buffer_bytes,
            "packed_num_buffers": self.num_buffers,
        }});
        post_all(&self.http, &self.servers, "/start_weight_update", |_| {
            json!({})
        })
        .await?;
        let sizes: Vec<usize> = params
            .iter()
            .map(|(_, t)| t.numel() * t.kind().elt_size_in_bytes())
            .collect();
        let groups = pack_groups(&sizes, self.buffer_bytes);
        // The servers start receiving when they get update_info; rank 0 broadcasts meanwhile.
        let updates = post_all(&self.http, &self.servers, "/update_weights", |_| {
            info.clone()
        });
        let comm = &mut self.comm;
        let send = async {
            // Let the update requests go out first (the receivers join each broadcast once
            // they have the update_info); a blocking communicator needs a multi-thread runtime.
            tokio::task::yield_now().await;
            for g in &groups {
                let refs: Vec<&Tensor> = params[g.clone()].iter().map(|(_, t)| t).collect();
                let buf = tch::no_grad(|| pack(&refs));
                comm.broadcast(&buf)?;
                tokio::task::yield_now().await;
            }
            Ok::<(), BridgeError>(())
        };
        let (posted, sent) = tokio::join!(updates, send);
        sent?;
        posted?;
        post_all(
            &self.http,
            &self.servers,
            "/finish_weight_update",
            |_| json!({"weight_version": version}),
        )
        .await?;
        Ok(PushStats {
            tensors: params.len(),
            bytes: sizes.iter().sum(),
            buffers: groups.len(),
            seconds: t0.elapsed().as_secs_f64(),
        })
    }
}

/// The publisher's NCCL route (`trainer serve --publish-route nccl`): the communicator until
/// the first push connects it (the handshake needs the servers up), then the connected bridge,
/// kept for every later version.
pub struct NcclRoute {
    /// How the servers' workers reach this process (the handshake store and NCCL's rank 0).
    master_address: String,
    /// The Python module of vLLM's `ncclUniqueId`.
    module: String,
    timeout: Duration,
    comm: Option<Box<dyn WeightComm>>,
    bridge: Option<Bridge>,
}

impl std::fmt::Debug for NcclRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclRoute")
            .field("master_address", &self.master_address)
            .field("connected", &self.bridge.is_some())
            .finish_non_exhaustive()
    }
}

impl NcclRoute {
    pub fn new(
        master_address: &str,
        module: &str,
        comm: Box<dyn WeightComm>,
        timeout: Duration,
    ) -> Self {
        Self {
            master_address: master_address.to_string(),
            module: module.to_string(),
            timeout,
            comm: Some(comm),
            bridge: None,
        }
    }

    async fn push_async(
        &mut self,
        http: reqwest::Client,
        urls: &[String],
        version: i64,
        params: &[(String, Tensor)],
    ) -> std::result::Result<(), String> {
        if self.bridge.is_none() {
            let comm = self.comm.take().ok_or_else(|| {
                "the NCCL handshake failed earlier; restart the trainer".to_string()
            })?;
            let bridge = Bridge::connect(
                http,
                urls,
                &self.master_address,
                &self.module,
                comm,
                self.timeout,
            )
            .await
            .map_err(|e| format!("NCCL handshake: {e}"))?;
            self.bridge = Some(bridge);
        }
        let Some(bridge) = self.bridge.as_mut() else {
            return Err("not connected".into());
        };
        let stats = bridge
            .push(&format!("v{version}"), params)
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!(
            version,
            bytes = stats.bytes,
            buffers = stats.buffers,
            seconds = stats.seconds,
            "weights pushed over NCCL"
        );
        Ok(())
    }
}

impl crate::publish::TensorRoute for NcclRoute {
    fn push(
        &mut self,
        http: &reqwest::Client,
        urls: &[String],
        version: i64,
        params: &[(String, Tensor)],
    ) -> std::result::Result<(), String> {
        tokio::runtime::Handle::current().block_on(self.push_async(
            http.clone(),
            urls,
            version,
            params,
        ))
    }
}

/// The raw-NCCL communicator (GPU builds with the cargo feature `nccl`).
#[cfg(feature = "nccl")]
pub use super::ffi::RawNcclComm as NcclComm;

#[cfg(feature = "nccl")]
impl WeightComm for NcclComm {
    fn unique_id(&mut self) -> Result<[u8; 128]> {
        NcclComm::unique_id(self).map_err(BridgeError::Comm)
    }
    fn init(&mut self, id: &[u8; 128], world: usize) -> Result<()> {
        NcclComm::init(self, id, world).map_err(BridgeError::Comm)
    }
    fn broadcast(&mut self, buf: &Tensor) -> Result<()> {
        NcclComm::broadcast(self, buf).map_err(BridgeError::Comm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_closes_a_group_when_it_exceeds_the_buffer() {
        assert_eq!(pack_groups(&[4, 4, 4], 8), vec![0..3]);
        assert_eq!(pack_groups(&[4, 5, 1, 9, 2], 8), vec![0..2, 2..4, 4..5]);
        assert_eq!(pack_groups(&[20], 8), vec![0..1]);
        assert!(pack_groups(&[], 8).is_empty());
    }

    #[test]
    fn packed_bytes_are_the_tensors_bytes_in_order() {
        let a = Tensor::from_slice(&[1.0f32, -2.0]);
        let b = Tensor::from_slice(&[7i64]);
        let buf = pack(&[&a, &b]);
        let bytes: Vec<u8> = Vec::<u8>::try_from(&buf).unwrap();
        let mut want = Vec::new();
        for x in [1.0f32, -2.0] {
            want.extend_from_slice(&x.to_le_bytes());
        }
        want.extend_from_slice(&7i64.to_le_bytes());
        assert_eq!(bytes, want);
        assert_eq!(dtype_name(Kind::BFloat16).unwrap(), "bfloat16");
    }
}
