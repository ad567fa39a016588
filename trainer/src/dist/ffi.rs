//! The only unsafe code of the collective layer: the `extern "C"` functions of the c10d shim
//! (`trainer/csrc/c10d_shim.h`) and safe owners of its handles. Every other module of `dist` is
//! safe Rust over [`Store`], [`Group`] and [`PendingWork`].
//!
//! Contract with the shim: a function returns null or a `malloc`ed error message that this
//! module frees; handles are freed exactly once by `Drop`; a tensor argument is tch's
//! `C_tensor` pointer (a `torch::Tensor*`) that the shim copies (a new reference to the same
//! storage) before it returns, so the collective keeps its tensors alive on its own.

use std::ffi::{CString, c_char, c_int, c_void};
use std::ptr::{NonNull, null, null_mut};
use std::time::Duration;

use tch::Tensor;

#[repr(C)]
struct RawStore {
    _private: [u8; 0],
}
#[repr(C)]
struct RawGroup {
    _private: [u8; 0],
}
#[repr(C)]
struct RawWork {
    _private: [u8; 0],
}

unsafe extern "C" {
    fn rc10d_free_bytes(bytes: *mut u8);
    fn rc10d_tcp_store_new(
        host: *const c_char,
        port: u16,
        is_server: c_int,
        world: c_int,
        timeout_ms: i64,
        out: *mut *mut RawStore,
        bound_port: *mut u16,
    ) -> *mut c_char;
    fn rc10d_prefix_store_new(
        prefix: *const c_char,
        base: *mut RawStore,
        out: *mut *mut RawStore,
    ) -> *mut c_char;
    fn rc10d_store_set(
        s: *mut RawStore,
        key: *const c_char,
        value: *const u8,
        n: usize,
    ) -> *mut c_char;
    fn rc10d_store_get(
        s: *mut RawStore,
        key: *const c_char,
        timeout_ms: i64,
        value: *mut *mut u8,
        n: *mut usize,
    ) -> *mut c_char;
    fn rc10d_store_delete(s: *mut RawStore, key: *const c_char) -> *mut c_char;
    fn rc10d_store_free(s: *mut RawStore);
    fn rc10d_gloo_new(
        s: *mut RawStore,
        rank: c_int,
        world: c_int,
        host: *const c_char,
        threads: c_int,
        timeout_ms: i64,
        out: *mut *mut RawGroup,
    ) -> *mut c_char;
    fn rc10d_nccl_new(
        s: *mut RawStore,
        rank: c_int,
        world: c_int,
        device: c_int,
        timeout_ms: i64,
        out: *mut *mut RawGroup,
    ) -> *mut c_char;
    fn rc10d_pg_free(pg: *mut RawGroup);
    fn rc10d_all_reduce(
        pg: *mut RawGroup,
        t: *mut c_void,
        op: c_int,
        timeout_ms: i64,
        out: *mut *mut RawWork,
    ) -> *mut c_char;
    fn rc10d_reduce_scatter(
        pg: *mut RawGroup,
        out: *mut c_void,
        input: *mut c_void,
        op: c_int,
        timeout_ms: i64,
        w: *mut *mut RawWork,
    ) -> *mut c_char;
    fn rc10d_all_gather(
        pg: *mut RawGroup,
        out: *mut c_void,
        input: *mut c_void,
        timeout_ms: i64,
        w: *mut *mut RawWork,
    ) -> *mut c_char;
    fn rc10d_broadcast(
        pg: *mut RawGroup,
        t: *mut c_void,
        root: c_int,
        timeout_ms: i64,
        w: *mut *mut RawWork,
    ) -> *mut c_char;
    fn rc10d_barrier(pg: *mut RawGroup, timeout_ms: i64, w: *mut *mut RawWork) -> *mut c_char;
    fn rc10d_work_wait(w: *mut RawWork, timeout_ms: i64) -> *mut c_char;
    fn rc10d_work_free(w: *mut RawWork);
    fn rc10d_set_grad(t: *mut c_void, grad: *mut c_void) -> *mut c_char;
}

/// What the shim said went wrong (the first line of the C++ exception).
pub type ShimResult<T> = Result<T, String>;

/// Turn the shim's return value into a result, freeing the message.
fn check(err: *mut c_char) -> ShimResult<()> {
    // SAFETY: every caller passes what a shim function just returned, once.
    unsafe { crate::shim::take_error(err) }
}

fn cstring(what: &str, s: &str) -> ShimResult<CString> {
    CString::new(s).map_err(|_| format!("{what} `{s}` contains a NUL byte"))
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

fn int(what: &str, v: usize) -> ShimResult<c_int> {
    c_int::try_from(v).map_err(|_| format!("{what} {v} is out of range"))
}

/// The raw handle of a tch tensor the collective only reads, as the shim takes it
/// (`torch::Tensor*`; the shim never writes through a read-only argument).
fn raw(t: &Tensor) -> *mut c_void {
    t.as_ptr().cast_mut().cast()
}

/// The raw handle of a tch tensor the collective writes.
fn raw_mut(t: &mut Tensor) -> *mut c_void {
    t.as_mut_ptr().cast()
}

/// Make `grad` the gradient of leaf `param` (same shape), as `param.grad = grad` does in
/// Python: tch has no setter, and a rank whose backward never reached a parameter must still
/// hand the collective (and receive) a gradient for it.
pub fn set_grad(param: &mut Tensor, grad: &Tensor) -> ShimResult<()> {
    // SAFETY: both tensors are live for the call; the shim stores a new reference to `grad`.
    check(unsafe { rc10d_set_grad(raw_mut(param), raw(grad)) })
}

/// A c10d key-value store (TCPStore, or a prefix view of one).
pub struct Store {
    ptr: NonNull<RawStore>,
}

// SAFETY: the store handle is an owned `c10::intrusive_ptr<c10d::Store>` on the heap, not tied
// to the thread that made it; c10d's TCPStore serialises its own socket use with a mutex.
unsafe impl Send for Store {}

impl Store {
    /// A TCPStore at `host:port`: the server when `is_server` (it waits for no one), else a
    /// client that retries connecting until `timeout`.
    pub fn tcp(
        host: &str,
        port: u16,
        is_server: bool,
        world: usize,
        timeout: Duration,
    ) -> ShimResult<Self> {
        Self::tcp_bound(host, port, is_server, world, timeout).map(|(s, _)| s)
    }

    /// A TCPStore server on `host` at a port the OS picks, and that port. Nothing else can
    /// take the port between choosing and binding it (the race of binding a probe socket,
    /// releasing it and handing the number on): the store holds it from the start.
    pub fn tcp_server_any_port(
        host: &str,
        world: usize,
        timeout: Duration,
    ) -> ShimResult<(Self, u16)> {
        Self::tcp_bound(host, 0, true, world, timeout)
    }

    fn tcp_bound(
        host: &str,
        port: u16,
        is_server: bool,
        world: usize,
        timeout: Duration,
    ) -> ShimResult<(Self, u16)> {
        let host = cstring("host", host)?;
        let world = int("world size", world)?;
        let mut out = null_mut();
        let mut bound = 0u16;
        // SAFETY: `host` is a valid C string for the call; `out` and `bound` are written only
        // on success.
        check(unsafe {
            rc10d_tcp_store_new(
                host.as_ptr(),
                port,
                c_int::from(is_server),
                world,
                millis(timeout),
                &mut out,
                &mut bound,
            )
        })?;
        Ok((Self::own(out)?, bound))
    }

    /// A view of this store whose keys all start with `prefix`.
    pub fn prefixed(&self, prefix: &str) -> ShimResult<Self> {
        let prefix = cstring("prefix", prefix)?;
        let mut out = null_mut();
        // SAFETY: `self.ptr` is a live store (owned by self); the new store holds its own
        // reference to the base.
        check(unsafe { rc10d_prefix_store_new(prefix.as_ptr(), self.ptr.as_ptr(), &mut out) })?;
        Self::own(out)
    }

    fn own(out: *mut RawStore) -> ShimResult<Self> {
        NonNull::new(out)
            .map(|ptr| Self { ptr })
            .ok_or_else(|| "the shim returned no store".to_owned())
    }

    pub fn set(&self, key: &str, value: &[u8]) -> ShimResult<()> {
        let key = cstring("key", key)?;
        // SAFETY: `value` is valid for `value.len()` bytes during the call (the shim copies it).
        check(unsafe {
            rc10d_store_set(self.ptr.as_ptr(), key.as_ptr(), value.as_ptr(), value.len())
        })
    }

    /// The value at `key`, waiting up to `timeout` for it to be set.
    pub fn get(&self, key: &str, timeout: Duration) -> ShimResult<Vec<u8>> {
        let key = cstring("key", key)?;
        let (mut buf, mut n) = (null_mut(), 0usize);
        // SAFETY: out-parameters are written only on success.
        check(unsafe {
            rc10d_store_get(
                self.ptr.as_ptr(),
                key.as_ptr(),
                millis(timeout),
                &mut buf,
                &mut n,
            )
        })?;
        if buf.is_null() {
            return Err("the shim returned no value".into());
        }
        // SAFETY: on success `buf` holds `n` initialised bytes the shim `malloc`ed; copied, then
        // freed once.
        let out = unsafe { std::slice::from_raw_parts(buf, n) }.to_vec();
        // SAFETY: as above.
        unsafe { rc10d_free_bytes(buf) };
        Ok(out)
    }
}

impl Store {
    /// Remove `key` (nothing happens when it is not there).
    pub fn delete(&self, key: &str) -> ShimResult<()> {
        let key = cstring("key", key)?;
        // SAFETY: the store is live and `key` a valid C string for the call.
        check(unsafe { rc10d_store_delete(self.ptr.as_ptr(), key.as_ptr()) })
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: the handle is owned by self and freed only here.
        unsafe { rc10d_store_free(self.ptr.as_ptr()) }
    }
}

/// A c10d process group (`c10d::Backend`: gloo or NCCL).
pub struct Group {
    ptr: NonNull<RawGroup>,
}

// SAFETY: the handle is an owned `intrusive_ptr<c10d::Backend>`; c10d backends take collectives
// from any thread (gloo enqueues under a mutex, NCCL on the calling thread's stream). `Group` is
// not `Sync`: one thread issues its collectives, which keeps their order the same on every rank.
unsafe impl Send for Group {}

impl Group {
    /// A gloo group over `store`; `host` is the address this rank's gloo device binds (`None`:
    /// gloo's default, which honours GLOO_SOCKET_IFNAME).
    pub fn gloo(
        store: &Store,
        rank: usize,
        world: usize,
        host: Option<&str>,
        threads: usize,
        timeout: Duration,
    ) -> ShimResult<Self> {
        let host = host.map(|h| cstring("host", h)).transpose()?;
        let mut out = null_mut();
        // SAFETY: `store` is live for the call and the group keeps its own reference to it;
        // `host` is null or a valid C string.
        check(unsafe {
            rc10d_gloo_new(
                store.ptr.as_ptr(),
                int("rank", rank)?,
                int("world size", world)?,
                host.as_ref().map_or(null(), |h| h.as_ptr()),
                int("threads", threads)?,
                millis(timeout),
                &mut out,
            )
        })?;
        Self::own(out)
    }

    /// A NCCL group on CUDA device `device` (an error unless built with the `nccl` feature).
    pub fn nccl(
        store: &Store,
        rank: usize,
        world: usize,
        device: usize,
        timeout: Duration,
    ) -> ShimResult<Self> {
        let mut out = null_mut();
        // SAFETY: as for `gloo`.
        check(unsafe {
            rc10d_nccl_new(
                store.ptr.as_ptr(),
                int("rank", rank)?,
                int("world size", world)?,
                int("device", device)?,
                millis(timeout),
                &mut out,
            )
        })?;
        Self::own(out)
    }

    fn own(out: *mut RawGroup) -> ShimResult<Self> {
        NonNull::new(out)
            .map(|ptr| Self { ptr })
            .ok_or_else(|| "the shim returned no process group".to_owned())
    }

    fn work(out: *mut RawWork) -> ShimResult<PendingWork> {
        NonNull::new(out)
            .map(|ptr| PendingWork { ptr })
            .ok_or_else(|| "the shim returned no work handle".to_owned())
    }

    /// In-place all-reduce of `t` with c10d reduce op `op` (0 sum, 3 min, 4 max).
    pub fn all_reduce(
        &self,
        t: &mut Tensor,
        op: i32,
        timeout: Duration,
    ) -> ShimResult<PendingWork> {
        let mut w = null_mut();
        // SAFETY: `t` is a live tensor (borrowed for the call; the shim takes its own
        // reference); the group is live.
        check(unsafe {
            rc10d_all_reduce(self.ptr.as_ptr(), raw_mut(t), op, millis(timeout), &mut w)
        })?;
        Self::work(w)
    }

    pub fn reduce_scatter(
        &self,
        out: &mut Tensor,
        input: &Tensor,
        op: i32,
        timeout: Duration,
    ) -> ShimResult<PendingWork> {
        let mut w = null_mut();
        // SAFETY: as for `all_reduce`; `input` is only read by the collective.
        check(unsafe {
            rc10d_reduce_scatter(
                self.ptr.as_ptr(),
                raw_mut(out),
                raw(input),
                op,
                millis(timeout),
                &mut w,
            )
        })?;
        Self::work(w)
    }

    pub fn all_gather(
        &self,
        out: &mut Tensor,
        input: &Tensor,
        timeout: Duration,
    ) -> ShimResult<PendingWork> {
        let mut w = null_mut();
        // SAFETY: as for `reduce_scatter`.
        check(unsafe {
            rc10d_all_gather(
                self.ptr.as_ptr(),
                raw_mut(out),
                raw(input),
                millis(timeout),
                &mut w,
            )
        })?;
        Self::work(w)
    }

    pub fn broadcast(
        &self,
        t: &mut Tensor,
        root: usize,
        timeout: Duration,
    ) -> ShimResult<PendingWork> {
        let root = int("root", root)?;
        let mut w = null_mut();
        // SAFETY: as for `all_reduce`.
        check(unsafe {
            rc10d_broadcast(self.ptr.as_ptr(), raw_mut(t), root, millis(timeout), &mut w)
        })?;
        Self::work(w)
    }

    pub fn barrier(&self, timeout: Duration) -> ShimResult<PendingWork> {
        let mut w = null_mut();
        // SAFETY: the group is live; `w` is written only on success.
        check(unsafe { rc10d_barrier(self.ptr.as_ptr(), millis(timeout), &mut w) })?;
        Self::work(w)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: owned by self, freed only here. (c10d waits for queued gloo work, which ends
        // by itself within its timeout.)
        unsafe { rc10d_pg_free(self.ptr.as_ptr()) }
    }
}

/// A collective in flight (`c10d::Work`); it holds its own references to its tensors.
pub struct PendingWork {
    ptr: NonNull<RawWork>,
}

// SAFETY: an owned `intrusive_ptr<c10d::Work>`; waiting on it from another thread is what c10d's
// own futures do.
unsafe impl Send for PendingWork {}

impl PendingWork {
    /// Block until the collective ends (its error, or a timeout, is the message).
    pub fn wait(self, timeout: Duration) -> ShimResult<()> {
        // SAFETY: the work handle is live until self drops, after this call.
        check(unsafe { rc10d_work_wait(self.ptr.as_ptr(), millis(timeout)) })
    }
}

impl Drop for PendingWork {
    fn drop(&mut self) {
        // SAFETY: owned by self, freed only here.
        unsafe { rc10d_work_free(self.ptr.as_ptr()) }
    }
}

// ---- raw NCCL for vLLM's weight-transfer route (GPU builds, feature `nccl`) ----------------

#[cfg(feature = "nccl")]
unsafe extern "C" {
    fn rc10d_nccl_unique_id(out: *mut u8) -> *mut c_char;
    fn rc10d_nccl_comm_init(
        id: *const u8,
        world: c_int,
        rank: c_int,
        device: c_int,
        out: *mut *mut c_void,
    ) -> *mut c_char;
    fn rc10d_nccl_comm_broadcast(comm: *mut c_void, t: *mut c_void, root: c_int) -> *mut c_char;
    fn rc10d_nccl_comm_free(comm: *mut c_void);
}

/// Rank 0 of a raw NCCL group with vLLM's workers, on CUDA device `device`.
#[cfg(feature = "nccl")]
pub struct RawNcclComm {
    comm: *mut c_void,
    device: i32,
}

// SAFETY: the communicator is used by one thread at a time (`&mut self` methods); NCCL
// communicators are not tied to the thread that made them.
#[cfg(feature = "nccl")]
unsafe impl Send for RawNcclComm {}

#[cfg(feature = "nccl")]
impl RawNcclComm {
    pub fn new(device: i32) -> Self {
        Self {
            comm: null_mut(),
            device,
        }
    }
}

#[cfg(feature = "nccl")]
impl RawNcclComm {
    /// A fresh `ncclUniqueId`.
    pub fn unique_id(&mut self) -> ShimResult<[u8; 128]> {
        let mut id = [0u8; 128];
        // SAFETY: `id` has the 128 bytes the shim writes.
        check(unsafe { rc10d_nccl_unique_id(id.as_mut_ptr()) })?;
        Ok(id)
    }

    /// Join as rank 0 of `world` (blocks until all joined), then the warm-up all-reduce.
    pub fn init(&mut self, id: &[u8; 128], world: usize) -> ShimResult<()> {
        let world = int("world size", world)?;
        let mut out = null_mut();
        // SAFETY: `id` holds 128 bytes; `out` is written only on success.
        check(unsafe { rc10d_nccl_comm_init(id.as_ptr(), world, 0, self.device, &mut out) })?;
        self.comm = out;
        Ok(())
    }

    /// Broadcast `buf` from rank 0 (copied to this communicator's CUDA device first).
    pub fn broadcast(&mut self, buf: &Tensor) -> ShimResult<()> {
        if self.comm.is_null() {
            return Err("the NCCL communicator is not initialised".into());
        }
        let on_device = buf
            .to_device(tch::Device::Cuda(self.device as usize))
            .contiguous();
        // SAFETY: the communicator is live (owned by self); the tensor outlives the call,
        // which waits for the broadcast.
        check(unsafe { rc10d_nccl_comm_broadcast(self.comm, raw(&on_device), 0) })
    }
}

#[cfg(feature = "nccl")]
impl Drop for RawNcclComm {
    fn drop(&mut self) {
        if !self.comm.is_null() {
            // SAFETY: owned by self, freed only here.
            unsafe { rc10d_nccl_comm_free(self.comm) }
        }
    }
}

#[cfg(feature = "nccl")]
unsafe extern "C" {
    fn rc10d_cuda_peak_allocated(device: c_int, reset: c_int) -> i64;
}

/// The CUDA caching allocator's peak of allocated bytes on `device` since the last reset
/// (torch.cuda.max_memory_allocated), resetting it after reading when `reset`. `None` when the
/// build has no CUDA shim (the `nccl` feature) or the allocator cannot answer.
pub fn cuda_peak_allocated(device: usize, reset: bool) -> Option<u64> {
    #[cfg(feature = "nccl")]
    {
        let device = c_int::try_from(device).ok()?;
        // SAFETY: plain values in and out; the shim catches every C++ exception.
        let peak = unsafe { rc10d_cuda_peak_allocated(device, c_int::from(reset)) };
        u64::try_from(peak).ok()
    }
    #[cfg(not(feature = "nccl"))]
    {
        let _ = (device, reset);
        None
    }
}
