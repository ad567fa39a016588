//! libtorch kernels that tch does not bind, called through the trainer's C++ shim
//! (`trainer/csrc/kernels.{h,cpp}`, built by `build.rs` beside the c10d shim): the fused AdamW
//! update, `torch._fused_adamw_`, the kernel behind `torch.optim.AdamW(fused=True)` on CPU and
//! CUDA. It reads each gradient once and writes each parameter and moment once, where the same
//! update as tensor expressions takes about ten passes over the elements. And libtorch's
//! intra-op parallel loop (`at::parallel_for`), which the CPU decode kernel runs its rows on.
//! And [`prefix_causal_attention`]: a causal attention whose queries follow a prefix, as two of
//! libtorch's CPU flash calls under one autograd node. And [`causal_attention`]: the trainer's
//! own bf16 causal attention for the CPU (`csrc/attention.cpp`), exact causal chunks on
//! AVX512-BF16 dot products.

use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use tch::Tensor;

use crate::error::{Result, TrainerError};

unsafe extern "C" {
    fn rtorch_parallel_for(
        n: i64,
        f: unsafe extern "C" fn(*mut c_void, i64, i64),
        ctx: *mut c_void,
    ) -> *mut c_char;
    fn rtorch_prefix_causal_attention(
        q: *mut c_void,
        kp: *mut c_void,
        vp: *mut c_void,
        ko: *mut c_void,
        vo: *mut c_void,
        out: *mut *mut c_void,
    ) -> *mut c_char;
    fn rtorch_causal_attention(
        q: *mut c_void,
        k: *mut c_void,
        v: *mut c_void,
        past: i64,
        portable: i32,
        out: *mut *mut c_void,
    ) -> *mut c_char;
    fn rtorch_causal_attention_fast() -> i32;
    fn rtorch_fused_adamw(
        params: *const *mut c_void,
        grads: *const *mut c_void,
        exp_avgs: *const *mut c_void,
        exp_avg_sqs: *const *mut c_void,
        n: usize,
        step: f64,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
    ) -> *mut c_char;
}

/// Run `work(begin, end)` over disjoint chunks covering `0..n` on libtorch's intra-op threads
/// (`at::parallel_for`, grain 1; the calling thread among them), returning once all have ended.
/// The CPU decode kernel runs its rows so: threads it started itself met libtorch's OpenMP
/// workers still spinning after the round's matrix products and shared the cores with them, so
/// on two threads its rows ran slower than on one (BENCHMARKS.md, issue 25 session 86). A panic
/// in `work` is caught on its thread and raised again here once every chunk has ended; a
/// failure of the loop itself runs the whole range on this thread.
pub fn parallel_for(n: usize, work: &(dyn Fn(usize, usize) + Sync)) {
    type Caught = std::sync::Mutex<Option<Box<dyn std::any::Any + Send>>>;
    struct Ctx<'a> {
        work: &'a (dyn Fn(usize, usize) + Sync),
        panic: Caught,
    }
    unsafe extern "C" fn body(ctx: *mut c_void, begin: i64, end: i64) {
        // SAFETY: `ctx` is the `Ctx` below, alive until `rtorch_parallel_for` returns, which is
        // after every call of this body; shared access only (the panic slot is a mutex).
        let ctx = unsafe { &*(ctx.cast_const().cast::<Ctx<'_>>()) };
        let run = || (ctx.work)(begin.max(0) as usize, end.max(0) as usize);
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
            let mut slot = ctx.panic.lock().unwrap_or_else(|e| e.into_inner());
            slot.get_or_insert(p);
        }
    }
    if n == 0 {
        return;
    }
    let ctx = Ctx {
        work,
        panic: Caught::default(),
    };
    let len = i64::try_from(n).unwrap_or(i64::MAX);
    // SAFETY: `body` matches the shim's callback type and never unwinds (it catches panics);
    // `ctx` outlives the call.
    let err = unsafe { rtorch_parallel_for(len, body, std::ptr::from_ref(&ctx).cast_mut().cast()) };
    if let Some(p) = ctx.panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
        std::panic::resume_unwind(p);
    }
    // SAFETY: `err` is what the shim function just returned, passed here once.
    if let Err(msg) = unsafe { crate::shim::take_error(err) } {
        tracing::warn!(%msg, "at::parallel_for failed; running the range on this thread");
        work(0, n);
    }
}

/// Causal attention of the queries `q` [B, H, T, D] at positions `past..past + T`, over keys and
/// values `k`, `v` [B, Hkv, past + T, D] (H a multiple of Hkv, CPU tensors, scale 1/sqrt(D)):
/// query i sees keys `0..=past + i`. What SDPA's `is_causal` (aligned to the top left) cannot
/// say directly when `past > 0`; the trainer meets it where rows' own positions follow a shared
/// prefix, and a cached prefill. It runs as two calls of libtorch's CPU flash kernel, every
/// prefix key in full and the own keys causally, merged by their log-sum-exps, with one
/// autograd node whose backward is the two flash backwards given the merged output (so the
/// gradients are those of the one softmax). Nothing is computed for positions no query sees,
/// where SDPA over `past` zero queries before `q` computes their causal attention too, and an
/// explicit mask computes every block (BENCHMARKS.md, issue 25 session 87).
pub fn prefix_causal_attention(q: &Tensor, k: &Tensor, v: &Tensor, past: i64) -> Result<Tensor> {
    let (qs, ks) = (q.size(), k.size());
    let bad = |why: String| {
        Err(TrainerError::Config(format!(
            "prefix causal attention: {why} (queries {qs:?}, keys {ks:?}, past {past})"
        )))
    };
    if qs.len() != 4 || ks.len() != 4 || v.size() != ks {
        return bad("queries, keys and values must be [B, H, T, D] alike".into());
    }
    let t = qs[2];
    if past < 1 {
        return bad("past must be at least 1 (with none, SDPA's own causal mask is right)".into());
    }
    if ks[2] != past + t || ks[0] != qs[0] || ks[3] != qs[3] {
        return bad(format!(
            "the keys must hold past + T = {} positions",
            past + t
        ));
    }
    if ks[1] < 1 || qs[1] % ks[1] != 0 {
        return bad("query heads must be a multiple of key heads".into());
    }
    if [q, k, v].iter().any(|x| x.device() != tch::Device::Cpu) {
        return bad("CPU tensors only (libtorch's CPU flash kernel)".into());
    }
    let (kp, ko) = (k.narrow(2, 0, past), k.narrow(2, past, t));
    let (vp, vo) = (v.narrow(2, 0, past), v.narrow(2, past, t));
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: the five pointers are live tch tensors (`torch::Tensor*`) borrowed for the call;
    // the shim takes new references and writes `out` only on success, with a tensor it
    // allocated that this side now owns.
    let err = unsafe {
        rtorch_prefix_causal_attention(raw(q), raw(&kp), raw(&vp), raw(&ko), raw(&vo), &mut out)
    };
    // SAFETY: `err` and `out` are what the shim function just returned and wrote.
    unsafe { take_tensor(err, out, "prefix causal attention") }
}

/// Whether [`causal_attention`] may run where it applies (`trainer --causal-attention auto`,
/// the default); off, bf16 steps keep libtorch's flash kernel (`libtorch`, for comparisons).
static OWN_CAUSAL: AtomicBool = AtomicBool::new(true);

/// Choose the kernel of bf16 causal attention on the CPU for this process: the trainer's own
/// ([`causal_attention`], where [`own_causal_attention`] says it applies) or libtorch's.
pub fn set_own_causal_attention(on: bool) {
    OWN_CAUSAL.store(on, Ordering::Relaxed);
}

/// Whether a causal attention over queries of `kind` on `device` with heads `head_dim` wide
/// runs on [`causal_attention`]: bf16 on the CPU, a head dimension that is a positive multiple
/// of 64, a CPU with AVX512-BF16 (elsewhere its portable path is slower than libtorch's flash
/// kernel), unless the process chose libtorch's.
pub fn own_causal_attention(kind: tch::Kind, device: tch::Device, head_dim: i64) -> bool {
    OWN_CAUSAL.load(Ordering::Relaxed)
        && kind == tch::Kind::BFloat16
        && device == tch::Device::Cpu
        && head_dim > 0
        && head_dim % 64 == 0
        // SAFETY: a plain query of the shim, no arguments.
        && unsafe { rtorch_causal_attention_fast() } == 1
}

/// Causal attention in bf16 on the CPU, forward and backward, on the trainer's own kernel
/// (`trainer/csrc/attention.cpp`): queries `q` [B, H, T, D] at positions `past..past + T`
/// (`past` >= 0), keys and values `k`, `v` [B, Hkv, past + T, D] (H a multiple of Hkv, D a
/// multiple of 64, scale 1/sqrt(D)); query i sees keys `0..=past + i`. One autograd node.
/// Where libtorch's CPU flash kernel computes 256 x 512 blocks whole across the diagonal (and,
/// after a shared prefix, needs two calls) and on CPUs without AMX runs its bf16 block
/// products through MKL's default GEMM (bf16 converted, an f32 kernel), this computes for
/// strips of 48 queries only the 256-key chunks the strip sees, its products on AVX512-BF16
/// dot products (BENCHMARKS.md, issue 25 session 88). On a CPU without them it runs a portable
/// path of the same arithmetic, correct and slow: [`own_causal_attention`] says where to use it.
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor, past: i64) -> Result<Tensor> {
    causal_attention_on(q, k, v, past, false)
}

/// [`causal_attention`], on its portable path when `portable` (tests).
fn causal_attention_on(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    past: i64,
    portable: bool,
) -> Result<Tensor> {
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: the three pointers are live tch tensors borrowed for the call; the shim checks
    // their shapes and dtype, takes new references and writes `out` only on success, with a
    // tensor it allocated that this side now owns.
    let err = unsafe {
        rtorch_causal_attention(raw(q), raw(k), raw(v), past, i32::from(portable), &mut out)
    };
    // SAFETY: `err` and `out` are what the shim function just returned and wrote.
    unsafe { take_tensor(err, out, "causal attention") }
}

/// The tensor a shim function returned through its output slot, or its error prefixed with
/// `what`.
///
/// # Safety
/// `err` is what the shim function just returned, passed here once, and `out` the slot it
/// wrote: on success a heap `torch::Tensor*` nobody else owns (tch's C_tensor).
unsafe fn take_tensor(err: *mut c_char, out: *mut c_void, what: &str) -> Result<Tensor> {
    // SAFETY: the caller's contract.
    unsafe { crate::shim::take_error(err) }
        .map_err(|msg| TrainerError::Torch(tch::TchError::Torch(format!("{what}: {msg}"))))?;
    // SAFETY: on success `out` is the caller-vouched owned tensor.
    Ok(unsafe { Tensor::from_ptr(out.cast()) })
}

/// A tch tensor as the shim takes it (`torch::Tensor*`), borrowed for one call.
fn raw(t: &Tensor) -> *mut c_void {
    t.as_ptr().cast_mut().cast()
}

/// The hyperparameters of one fused AdamW update.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWUpdate {
    /// 1-based optimizer step (the bias corrections' exponent).
    pub step: u64,
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    /// Decoupled: every parameter of the call is multiplied by `1 - lr * weight_decay`.
    pub weight_decay: f64,
}

/// One parameter of a fused update: all four tensors of one shape, dtype and device.
pub struct AdamWSlot<'a> {
    pub name: &'a str,
    /// Written in place.
    pub param: &'a Tensor,
    /// Read only.
    pub grad: &'a Tensor,
    /// First and second moments, written in place.
    pub m: &'a Tensor,
    pub v: &'a Tensor,
}

/// Apply one AdamW update (PyTorch's rule) to every slot, in place, on the slots' one device.
/// Refused before anything is written when a slot's tensors differ in shape or dtype, or the
/// slots lie on more than one device.
pub fn fused_adamw(slots: &[AdamWSlot<'_>], h: &AdamWUpdate) -> Result<()> {
    let Some(first) = slots.first() else {
        return Ok(());
    };
    let device = first.param.device();
    for s in slots {
        let (shape, kind) = (s.param.size(), s.param.kind());
        for (what, t) in [("gradient", s.grad), ("m", s.m), ("v", s.v)] {
            if t.size() != shape || t.kind() != kind || t.device() != s.param.device() {
                return Err(TrainerError::Config(format!(
                    "fused AdamW: the {what} of `{}` is {:?} {:?} on {:?}; the parameter is \
                     {shape:?} {kind:?} on {:?}",
                    s.name,
                    t.size(),
                    t.kind(),
                    t.device(),
                    s.param.device()
                )));
            }
        }
        if s.param.device() != device {
            return Err(TrainerError::Config(format!(
                "fused AdamW: `{}` is on {:?}, `{}` on {device:?}; one call takes one device",
                s.name,
                s.param.device(),
                first.name
            )));
        }
    }
    let p: Vec<_> = slots.iter().map(|s| raw(s.param)).collect();
    let g: Vec<_> = slots.iter().map(|s| raw(s.grad)).collect();
    let m: Vec<_> = slots.iter().map(|s| raw(s.m)).collect();
    let v: Vec<_> = slots.iter().map(|s| raw(s.v)).collect();
    // SAFETY: the four arrays hold `slots.len()` pointers to live tch tensors (`torch::Tensor*`),
    // borrowed for the call; the shim takes new references to them and keeps none after it
    // returns. Writing through the parameter and moment tensors is what the caller asked for
    // (their storage is not aliased by the gradients: checked shapes, separate tensors).
    let err = unsafe {
        rtorch_fused_adamw(
            p.as_ptr(),
            g.as_ptr(),
            m.as_ptr(),
            v.as_ptr(),
            slots.len(),
            h.step as f64,
            h.lr,
            h.betas.0,
            h.betas.1,
            h.weight_decay,
            h.eps,
        )
    };
    // SAFETY: `err` is what the shim function just returned, passed here once.
    unsafe { crate::shim::take_error(err) }
        .map_err(|msg| TrainerError::Torch(tch::TchError::Torch(format!("fused AdamW: {msg}"))))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tch::{Kind, Tensor};

    /// Output and gradients of `attend(q, k, v)` under the upstream gradient `dy`.
    fn grads(
        attend: impl Fn(&Tensor, &Tensor, &Tensor) -> Tensor,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        dy: &Tensor,
    ) -> Vec<Tensor> {
        let (q, k, v) = (
            q.detach().set_requires_grad(true),
            k.detach().set_requires_grad(true),
            v.detach().set_requires_grad(true),
        );
        let y = attend(&q, &k, &v);
        (&y * dy).sum(Kind::Float).backward();
        vec![y.detach(), q.grad(), k.grad(), v.grad()]
    }

    /// Queries after a prefix, as two flash calls, equal SDPA with the explicit mask (query i
    /// sees keys 0..=past+i) in output and in every gradient: fewer and more new positions than
    /// prefix ones, grouped heads, f32 and bf16, a batch. Malformed shapes are refused.
    #[test]
    fn prefix_causal_attention_equals_the_masked_sdpa_with_its_gradients() {
        tch::manual_seed(5);
        for (kind, tol) in [(Kind::Float, 1e-5), (Kind::BFloat16, 2e-2)] {
            for (b, t, past) in [(2, 37, 90), (3, 130, 41), (1, 64, 64)] {
                let opts = (kind, tch::Device::Cpu);
                let q = Tensor::randn([b, 4, t, 16], opts);
                let k = Tensor::randn([b, 2, past + t, 16], opts);
                let v = Tensor::randn([b, 2, past + t, 16], opts);
                let dy = Tensor::randn([b, 4, t, 16], opts);
                let qi = Tensor::arange(t, (Kind::Int64, tch::Device::Cpu)).unsqueeze(1) + past;
                let kj = Tensor::arange(past + t, (Kind::Int64, tch::Device::Cpu)).unsqueeze(0);
                let mask = kj.le_tensor(&qi);
                let want = grads(
                    |q, k, v| {
                        Tensor::scaled_dot_product_attention(
                            q,
                            k,
                            v,
                            Some(&mask),
                            0.0,
                            false,
                            None,
                            true,
                        )
                    },
                    &q,
                    &k,
                    &v,
                    &dy,
                );
                let got = grads(
                    |q, k, v| super::prefix_causal_attention(q, k, v, past).unwrap(),
                    &q,
                    &k,
                    &v,
                    &dy,
                );
                for (name, (w, g)) in ["output", "dq", "dk", "dv"]
                    .iter()
                    .zip(want.iter().zip(&got))
                {
                    assert_eq!(w.size(), g.size(), "{name}");
                    let scale = w.abs().max().double_value(&[]).max(1e-6);
                    let err = (w.to_kind(Kind::Float) - g.to_kind(Kind::Float))
                        .abs()
                        .max()
                        .double_value(&[])
                        / scale;
                    assert!(err < tol, "{kind:?} b={b} t={t} past={past} {name}: {err}");
                }
            }
        }
        let q = Tensor::randn([1, 4, 8, 16], (Kind::Float, tch::Device::Cpu));
        let k = Tensor::randn([1, 2, 12, 16], (Kind::Float, tch::Device::Cpu));
        let short = super::prefix_causal_attention(&q, &k, &k, 3).unwrap_err();
        assert!(short.to_string().contains("past + T = 11"), "{short}");
        let none = super::prefix_causal_attention(&q, &k, &k, 0).unwrap_err();
        assert!(none.to_string().contains("at least 1"), "{none}");
        let k3 = Tensor::randn([1, 3, 12, 16], (Kind::Float, tch::Device::Cpu));
        let heads = super::prefix_causal_attention(&q, &k3, &k3, 4).unwrap_err();
        assert!(heads.to_string().contains("multiple"), "{heads}");
    }

    /// The trainer's bf16 causal attention, portable path and (where the CPU has it) the
    /// AVX512-BF16 one, against the same attention in f32 over the same bf16 values (SDPA with
    /// the explicit mask): output and every gradient no further from it (relative RMS) than
    /// libtorch's own bf16 kernel is, up to 15% and 1e-4. (Both round P and the results to
    /// bf16 alike, so they land within 3% of each other; an exp whose second-order term is 10%
    /// off lands 30-45% further.) No prefix and a prefix, strips and chunks cut mid-way (T of
    /// 300 across two 256-key chunks; 430 keys), odd lengths, grouped heads, D 64 and 128, a
    /// batch. Malformed input is refused with its shapes.
    #[test]
    fn causal_attention_matches_f32_attention_as_closely_as_libtorch_bf16() {
        tch::manual_seed(11);
        let cpu = tch::Device::Cpu;
        let fast = super::own_causal_attention(Kind::BFloat16, cpu, 64);
        for (b, t, past, d) in [
            (2, 37, 0, 64),
            (1, 130, 300, 64),
            (2, 101, 41, 128),
            (1, 300, 0, 64),
        ] {
            let bf = (Kind::BFloat16, cpu);
            let q = Tensor::randn([b, 4, t, d], bf);
            let k = Tensor::randn([b, 2, past + t, d], bf);
            let v = Tensor::randn([b, 2, past + t, d], bf);
            let dy = Tensor::randn([b, 4, t, d], bf);
            let qi = Tensor::arange(t, (Kind::Int64, cpu)).unsqueeze(1) + past;
            let kj = Tensor::arange(past + t, (Kind::Int64, cpu)).unsqueeze(0);
            let mask = kj.le_tensor(&qi);
            let sdpa = |q: &Tensor, k: &Tensor, v: &Tensor| {
                Tensor::scaled_dot_product_attention(q, k, v, Some(&mask), 0.0, false, None, true)
            };
            let f = |x: &Tensor| x.to_kind(Kind::Float);
            let want = grads(sdpa, &f(&q), &f(&k), &f(&v), &f(&dy));
            let libtorch = grads(sdpa, &q, &k, &v, &dy);
            let err = |got: &[Tensor], i: usize| {
                let w = &want[i];
                let norm = |x: &Tensor| x.square().sum(Kind::Float).double_value(&[]).sqrt();
                norm(&(w - f(&got[i]))) / norm(w).max(1e-6)
            };
            let mut paths = vec![("portable", true)];
            if fast {
                paths.push(("AVX512-BF16", false));
            }
            for (path, portable) in paths {
                let got = grads(
                    |q, k, v| super::causal_attention_on(q, k, v, past, portable).unwrap(),
                    &q,
                    &k,
                    &v,
                    &dy,
                );
                for (i, name) in ["output", "dq", "dk", "dv"].iter().enumerate() {
                    assert_eq!(got[i].size(), want[i].size(), "{name}");
                    assert_eq!(got[i].kind(), Kind::BFloat16, "{name}");
                    let (ours, theirs) = (err(&got, i), err(&libtorch, i));
                    assert!(
                        ours <= 1.15 * theirs + 1e-4 && ours < 1e-2,
                        "{path} b={b} t={t} past={past} d={d} {name}: {ours:.2e} from f32, \
                         libtorch bf16 {theirs:.2e}"
                    );
                }
            }
        }
        // What refusing queries and keys of these shapes and dtype says.
        let refused = |q: &[i64], k: &[i64], kind, past| {
            let (q, k) = (Tensor::zeros(q, (kind, cpu)), Tensor::zeros(k, (kind, cpu)));
            super::causal_attention(&q, &k, &k, past)
                .unwrap_err()
                .to_string()
        };
        let bf = Kind::BFloat16;
        let short = refused(&[1, 4, 8, 64], &[1, 2, 12, 64], bf, 3);
        assert!(
            short.contains("past + T") && short.contains("[1, 2, 12, 64]"),
            "{short}"
        );
        let d16 = refused(&[1, 4, 8, 16], &[1, 2, 8, 16], bf, 0);
        assert!(d16.contains("multiple of 64"), "{d16}");
        let d0 = refused(&[1, 4, 8, 0], &[1, 2, 8, 0], bf, 0);
        assert!(d0.contains("multiple of 64"), "{d0}");
        assert!(!super::own_causal_attention(bf, cpu, 0));
        let f32 = refused(&[1, 4, 8, 64], &[1, 2, 8, 64], Kind::Float, 0);
        assert!(f32.contains("bf16"), "{f32}");
        let heads = refused(&[1, 4, 8, 64], &[1, 3, 12, 64], bf, 4);
        assert!(heads.contains("multiple of key heads"), "{heads}");
    }

    /// Every index of the range is run exactly once, on libtorch's threads (more than one when
    /// there are); a panic in the body reaches the caller, after the other chunks ran.
    #[test]
    fn parallel_for_covers_the_range_once_and_raises_a_body_panic() {
        let hits: Vec<AtomicUsize> = (0..37).map(|_| AtomicUsize::new(0)).collect();
        let threads = std::sync::Mutex::new(std::collections::HashSet::new());
        super::parallel_for(hits.len(), &|begin, end| {
            threads.lock().unwrap().insert(std::thread::current().id());
            for h in &hits[begin..end] {
                h.fetch_add(1, Ordering::Relaxed);
                // Long enough that one thread does not finish the range before another starts.
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        let used = threads.lock().unwrap().len();
        assert!((1..=tch::get_num_threads().max(1) as usize).contains(&used));
        super::parallel_for(0, &|_, _| panic!("an empty range runs nothing"));
        let ran = AtomicUsize::new(0);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            super::parallel_for(4, &|begin, end| {
                ran.fetch_add(end - begin, Ordering::Relaxed);
                if begin == 0 {
                    panic!("chunk at 0");
                }
            })
        }));
        let msg = caught.unwrap_err();
        assert_eq!(msg.downcast_ref::<&str>(), Some(&"chunk at 0"));
        assert_eq!(ran.load(Ordering::Relaxed), 4, "every chunk ran");
    }
}
