//! Decode-step attention on the CPU that reads each row of a batch cache only up to its own
//! length. libtorch's `scaled_dot_product_attention` over a [`super::BatchKv`] must read every
//! row up to the longest row's length (a masked view of one tensor): with rows of 400 and
//! 3,500 positions in one wave, most of what a short row's attention reads is padding it then
//! masks away, and a decode round on this hardware is bound by those reads (BENCHMARKS.md,
//! issue 25 session 41). This kernel walks row i's keys and values `0..lens[i]` straight from
//! the cache's storage, once for all the query heads that share a key/value head.
//!
//! Per position read it costs 0.99-1.20x libtorch's kernel over the runs measured (which
//! vectorises wider), so the decode step uses it only when the rows' lengths differ enough
//! (`StepSlots::rows_pay`). Only for contiguous f32 or bf16 caches on the CPU (a bf16 cache is
//! read as bf16, half the bytes of f32, and widened to f32 in registers; the queries are
//! widened first and the output narrowed back to the queries' dtype); anything else (CUDA,
//! other dtypes) returns `None` and the caller keeps libtorch's kernel. Scores use SDPA's
//! default scale 1/sqrt(d) and a max-subtracted softmax in f32.

use tch::{Device, Kind, Tensor};

/// A cache element this kernel reads: f32, or bf16 held as its 16 bits (the high half of the
/// f32 with the same sign, exponent and leading mantissa bits).
trait Elem: Copy + Send + Sync {
    /// The dtype of a tensor whose storage holds these.
    const KIND: Kind;
    fn f32(self) -> f32;
}

impl Elem for f32 {
    const KIND: Kind = Kind::Float;
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }
}

/// bf16's bits.
impl Elem for u16 {
    const KIND: Kind = Kind::BFloat16;
    #[inline(always)]
    fn f32(self) -> f32 {
        f32::from_bits(u32::from(self) << 16)
    }
}

/// A contiguous CPU tensor's values as `T` (whose dtype is `T::KIND`), borrowed; `None` for
/// anything else, and for a tensor that records gradients (this kernel has no backward).
///
/// # Safety
/// Nothing may write the tensor's storage (through `t`, a shallow clone or a view of it) while
/// the returned slice lives.
#[allow(unsafe_code)]
unsafe fn host<T: Elem>(t: &Tensor) -> Option<&[T]> {
    if t.device() != Device::Cpu || t.kind() != T::KIND || !t.is_contiguous() || t.requires_grad() {
        return None;
    }
    let n = t.numel();
    let p = t.data_ptr().cast::<T>().cast_const();
    if n == 0 || p.is_null() || !p.is_aligned() {
        return None;
    }
    // SAFETY: a contiguous CPU tensor of dtype `T::KIND` holds `numel` consecutive values of
    // `T`'s size and layout from `data_ptr` (which includes the storage offset); the slice
    // borrows `t`, whose handle keeps the storage alive; the caller guarantees no write while
    // it lives.
    Some(unsafe { std::slice::from_raw_parts(p, n) })
}

/// Sum of products, in sixteen lanes so the compiler vectorises it (two 8-wide registers
/// under AVX2, four 4-wide ones otherwise).
#[inline(always)]
fn dot<T: Elem>(a: &[f32], b: &[T]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y.f32())
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] += x[i] * y[i].f32();
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `exp` of every value, for values <= 0 (scores after subtracting their maximum), written so
/// it vectorises: x = n ln 2 + r with |r| <= ln 2 / 2, e^r by Cephes' degree-6 polynomial for
/// `expf`, 2^n through the exponent bits. Relative error about 1e-7; below -87 it gives
/// e^-87 ~ 1.6e-38 rather than underflowing; NaN stays NaN (as libtorch's kernel would give).
#[inline(always)]
fn exp_nonpositive(xs: &mut [f32]) {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts, so n * LN2_HI is exact for the n used here.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding then subtracting 1.5 * 2^23 rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    for x in xs.iter_mut() {
        // Not `f32::max`, which would turn NaN into -87.
        let v = if *x < -87.0 { -87.0 } else { *x };
        let n = (v * LOG2E + ROUND) - ROUND;
        let r = (v - n * LN2_HI) - n * LN2_LO;
        let mut p = 1.987_569_2e-4_f32;
        p = p * r + 1.398_199_9e-3;
        p = p * r + 8.333_452e-3;
        p = p * r + 4.166_579_6e-2;
        p = p * r + 1.666_666_5e-1;
        p = p * r + 0.5;
        let e = p * r * r + r + 1.0;
        let bits = ((n as i32 + 127) as u32) << 23;
        *x = e * f32::from_bits(bits);
    }
}

/// Sum in sixteen lanes (vectorises).
#[inline(always)]
fn sum(xs: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let c = xs.chunks_exact(16);
    let tail: f32 = c.remainder().iter().sum();
    for x in c {
        for i in 0..16 {
            acc[i] += x[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// The shape of one call: `q` is [rows, kv_heads, group, d]; the caches are [capacity_rows,
/// kv_heads, capacity, d].
#[derive(Debug, Clone, Copy)]
struct Shape {
    kv_heads: usize,
    group: usize,
    d: usize,
    capacity: usize,
}

/// Attention of one row's queries (all kv heads) over its first `n` cached positions, into
/// `out` ([kv_heads, group, d]); `scores` is scratch.
#[inline(always)]
fn attend_row<T: Elem>(
    s: Shape,
    q: &[f32],
    k: &[T],
    v: &[T],
    n: usize,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let (g, d) = (s.group, s.d);
    let scale = 1.0 / (d as f32).sqrt();
    scores.clear();
    scores.resize(g * n, 0.0);
    out.fill(0.0);
    for h in 0..s.kv_heads {
        let base = h * s.capacity * d;
        let qh = &q[h * g * d..(h + 1) * g * d];
        for t in 0..n {
            let kt = &k[base + t * d..base + (t + 1) * d];
            for j in 0..g {
                scores[j * n + t] = dot(&qh[j * d..(j + 1) * d], kt) * scale;
            }
        }
        for j in 0..g {
            let row = &mut scores[j * n..(j + 1) * n];
            // A NaN or infinite score leaves NaN (through inf - inf or the NaN itself), as in
            // libtorch's kernel, rather than a softmax over the finite rest.
            let max = row.iter().copied().fold(f32::NEG_INFINITY, |m, x| {
                if x > m || x.is_nan() { x } else { m }
            });
            for x in row.iter_mut() {
                *x -= max;
            }
            exp_nonpositive(row);
            let inv = 1.0 / sum(row);
            for x in row.iter_mut() {
                *x *= inv;
            }
        }
        let oh = &mut out[h * g * d..(h + 1) * g * d];
        for t in 0..n {
            let vt = &v[base + t * d..base + (t + 1) * d];
            for j in 0..g {
                let p = scores[j * n + t];
                for (o, x) in oh[j * d..(j + 1) * d].iter_mut().zip(vt) {
                    *o += p * x.f32();
                }
            }
        }
    }
}

/// One call's inputs: the queries and whole caches as slices, and each row's length.
struct Call<'a, T> {
    s: Shape,
    q: &'a [f32],
    k: &'a [T],
    v: &'a [T],
    lens: &'a [usize],
}

impl<T: Elem> Call<'_, T> {
    /// Rows `first..` into `out` (whole rows of [kv_heads, group, d]).
    #[inline(always)]
    fn block(&self, first: usize, out: &mut [f32]) {
        let s = self.s;
        let q_row = s.kv_heads * s.group * s.d;
        let c_row = s.kv_heads * s.capacity * s.d;
        let mut scores = Vec::new();
        for (r, o) in out.chunks_exact_mut(q_row).enumerate() {
            let i = first + r;
            attend_row(
                s,
                &self.q[i * q_row..(i + 1) * q_row],
                &self.k[i * c_row..(i + 1) * c_row],
                &self.v[i * c_row..(i + 1) * c_row],
                self.lens[i],
                o,
                &mut scores,
            );
        }
    }

    /// [`Self::block`] compiled for AVX2 (8-wide vectors).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn block_avx2(&self, first: usize, out: &mut [f32]) {
        self.block(first, out);
    }

    /// [`Self::block`] with the widest vectors this CPU has.
    #[allow(unsafe_code)]
    fn block_best(&self, first: usize, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above), the only requirement of a
            // `target_feature(enable = "avx2")` function.
            unsafe { self.block_avx2(first, out) };
            return;
        }
        self.block(first, out);
    }
}

/// Attention for a decode step: row i's queries `q[i]` ([rows, kv_heads, group, d]: query head
/// `kv * group + j` reads kv head `kv`) over positions `0..lens[i]` of rows `0..rows` of the
/// caches `k` and `v` ([capacity_rows, kv_heads, capacity, d], whole allocations). Returns
/// [rows, kv_heads, group, d] in `q`'s dtype, or `None` when the caches are not contiguous CPU
/// f32 or bf16 (with `q` of the same dtype) or the shapes disagree (the caller then uses
/// libtorch's kernel). Rows are split over `tch::get_num_threads()` threads.
pub fn decode_rows(q: &Tensor, k: &Tensor, v: &Tensor, lens: &[usize]) -> Option<Tensor> {
    let threads = usize::try_from(tch::get_num_threads()).unwrap_or(1);
    decode_rows_on(q, k, v, lens, threads)
}

/// [`decode_rows`] on at most `threads` threads.
fn decode_rows_on(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    lens: &[usize],
    threads: usize,
) -> Option<Tensor> {
    let (qs, ks) = (q.size(), k.size());
    if qs.len() != 4 || ks.len() != 4 || k.size() != v.size() {
        return None;
    }
    let dims =
        |x: &[i64]| -> Option<Vec<usize>> { x.iter().map(|&n| usize::try_from(n).ok()).collect() };
    let (qd, kd) = (dims(&qs)?, dims(&ks)?);
    let rows = qd[0];
    let s = Shape {
        kv_heads: qd[1],
        group: qd[2],
        d: qd[3],
        capacity: kd[2],
    };
    if lens.len() != rows
        || rows > kd[0]
        || kd[1] != s.kv_heads
        || kd[3] != s.d
        || lens.iter().any(|&n| n == 0 || n > s.capacity)
    {
        return None;
    }
    if q.kind() != k.kind() || (q.kind() != Kind::Float && q.kind() != Kind::BFloat16) {
        return None;
    }
    // bf16 queries are few (one position a row): widened once, so the kernel reads f32 queries
    // against bf16 keys and values.
    let q32 = (q.kind() == Kind::BFloat16 && q.device() == Device::Cpu && !q.requires_grad())
        .then(|| q.to_kind(Kind::Float).contiguous());
    // SAFETY: the slices live until this function returns, and nothing here or on the threads
    // it starts writes a tensor: the decode step wrote this step's keys and values into the
    // caches (`BatchKv::write`) before calling, the caches belong to the calling thread, and
    // `q32` is this function's own.
    #[allow(unsafe_code)]
    let qv = unsafe { host::<f32>(q32.as_ref().unwrap_or(q))? };
    #[allow(unsafe_code)]
    let out = if k.kind() == Kind::BFloat16 {
        // SAFETY: as above.
        let (kv, vv) = unsafe { (host::<u16>(k)?, host::<u16>(v)?) };
        attend(s, qv, kv, vv, lens, threads)
    } else {
        // SAFETY: as above.
        let (kv, vv) = unsafe { (host::<f32>(k)?, host::<f32>(v)?) };
        attend(s, qv, kv, vv, lens, threads)
    };
    let y = Tensor::from_slice(&out).view([qs[0], qs[1], qs[2], qs[3]]);
    Some(if q.kind() == Kind::Float {
        y
    } else {
        y.to_kind(q.kind())
    })
}

/// The attention of `rows = lens.len()` rows into a new [rows, kv_heads, group, d] buffer, on
/// at most `threads` threads.
fn attend<T: Elem>(
    s: Shape,
    qv: &[f32],
    kv: &[T],
    vv: &[T],
    lens: &[usize],
    threads: usize,
) -> Vec<f32> {
    let rows = lens.len();
    let q_row = s.kv_heads * s.group * s.d;
    let mut out = vec![0f32; rows * q_row];
    let call = Call {
        s,
        q: qv,
        k: kv,
        v: vv,
        lens,
    };
    let work = |first: usize, chunk: &mut [f32]| call.block_best(first, chunk);
    let threads = threads.clamp(1, rows.max(1));
    if threads == 1 {
        work(0, &mut out);
    } else {
        // Contiguous blocks of rows with about equal positions each.
        let total: usize = lens.iter().sum();
        let mut bounds = vec![0];
        let mut acc = 0;
        for (i, &n) in lens.iter().enumerate() {
            acc += n;
            if acc * threads >= total * bounds.len() && bounds.len() < threads && i + 1 < rows {
                bounds.push(i + 1);
            }
        }
        bounds.push(rows);
        // The first block runs on the calling thread, the others on scoped threads.
        std::thread::scope(|sc| {
            let (head, mut rest) = out.split_at_mut(bounds[1] * q_row);
            for w in bounds.windows(2).skip(1) {
                let (chunk, tail) = rest.split_at_mut((w[1] - w[0]) * q_row);
                rest = tail;
                let first = w[0];
                let work = &work;
                sc.spawn(move || work(first, chunk));
            }
            work(0, head);
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel equals libtorch's SDPA over each row's own positions, for rows of different
    /// lengths in a cache with spare rows and positions, on one to three threads.
    #[test]
    fn rows_attend_only_their_own_positions_as_sdpa_does() {
        tch::manual_seed(5);
        let (rows, kvh, g, d, cap) = (5_i64, 2_i64, 3_i64, 16_i64, 40_i64);
        let k = Tensor::randn([rows + 2, kvh, cap, d], (Kind::Float, Device::Cpu));
        let v = Tensor::randn([rows + 2, kvh, cap, d], (Kind::Float, Device::Cpu));
        let q = Tensor::randn([rows, kvh, g, d], (Kind::Float, Device::Cpu));
        let lens = [1_usize, 7, 40, 13, 2];
        for threads in [1, 2, 3] {
            let got = decode_rows_on(&q, &k, &v, &lens, threads).unwrap();
            for (i, &n) in lens.iter().enumerate() {
                let i = i as i64;
                let n = n as i64;
                let want = Tensor::scaled_dot_product_attention(
                    &q.narrow(0, i, 1),
                    &k.narrow(0, i, 1).narrow(2, 0, n),
                    &v.narrow(0, i, 1).narrow(2, 0, n),
                    None::<Tensor>,
                    0.0,
                    false,
                    None,
                    false,
                );
                let diff = (got.narrow(0, i, 1) - want).abs().max().double_value(&[]);
                assert!(
                    diff < 1e-5,
                    "row {i} ({n} positions), {threads} threads: {diff}"
                );
            }
        }
    }

    /// A bf16 cache is read as bf16: the kernel equals SDPA over the same bf16 values widened
    /// to f32 up to the output's rounding to bf16, and returns bf16.
    #[test]
    fn a_bf16_cache_is_read_as_bf16() {
        tch::manual_seed(6);
        let (rows, kvh, g, d, cap) = (4_i64, 2_i64, 2_i64, 64_i64, 48_i64);
        let bf = (Kind::BFloat16, Device::Cpu);
        let k = Tensor::randn([rows + 1, kvh, cap, d], bf);
        let v = Tensor::randn([rows + 1, kvh, cap, d], bf);
        let q = Tensor::randn([rows, kvh, g, d], bf);
        let lens = [3_usize, 48, 17, 1];
        for threads in [1, 2] {
            let got = decode_rows_on(&q, &k, &v, &lens, threads).unwrap();
            assert_eq!(got.kind(), Kind::BFloat16);
            for (i, &n) in lens.iter().enumerate() {
                let (i, n) = (i as i64, n as i64);
                let wide = |t: &Tensor| t.narrow(0, i, 1).to_kind(Kind::Float);
                let want = Tensor::scaled_dot_product_attention(
                    &wide(&q),
                    &wide(&k).narrow(2, 0, n),
                    &wide(&v).narrow(2, 0, n),
                    None::<Tensor>,
                    0.0,
                    false,
                    None,
                    false,
                );
                let got = got.narrow(0, i, 1).to_kind(Kind::Float);
                let diff = (&got - &want).abs().max().double_value(&[]);
                let scale = want.abs().max().double_value(&[]).max(1.0);
                // bf16 keeps 8 significant bits: the output's rounding alone is up to 2^-8 of it.
                assert!(
                    diff <= scale / 128.0,
                    "row {i} ({n} positions), {threads} threads: {diff}"
                );
            }
        }
        // Mixed dtypes are libtorch's.
        assert!(decode_rows(&q, &k.to_kind(Kind::Float), &v, &[1, 1, 1, 1]).is_none());
    }

    #[test]
    fn the_vectorised_exp_matches_the_standard_one() {
        let mut xs: Vec<f32> = (0..=2000).map(|i| -(i as f32) * 0.05).collect();
        let want: Vec<f32> = xs.iter().map(|x| x.exp()).collect();
        exp_nonpositive(&mut xs);
        for (i, (g, w)) in xs.iter().zip(&want).enumerate() {
            let rel = (g - w).abs() / w.max(f32::MIN_POSITIVE);
            assert!(
                rel < 5e-7 || (g - w).abs() < 1e-37,
                "x = {}: {g} vs {w}",
                -(i as f32) * 0.05
            );
        }
        let mut deep = [-100.0_f32, -1e30, f32::NEG_INFINITY];
        exp_nonpositive(&mut deep);
        assert!(deep.iter().all(|&x| (0.0..2e-38).contains(&x)), "{deep:?}");
        let mut nan = [f32::NAN];
        exp_nonpositive(&mut nan);
        assert!(nan[0].is_nan());
    }

    #[test]
    fn anything_but_contiguous_cpu_f32_or_bf16_is_left_to_libtorch() {
        let k = Tensor::zeros([2, 1, 8, 4], (Kind::Float, Device::Cpu));
        let q = Tensor::zeros([2, 1, 1, 4], (Kind::Float, Device::Cpu));
        assert!(decode_rows(&q.to_kind(Kind::BFloat16), &k, &k, &[1, 1]).is_none());
        let strided = k.transpose(2, 3).contiguous().transpose(2, 3);
        assert_eq!(strided.size(), k.size());
        assert!(
            decode_rows(&q, &strided, &k, &[1, 1]).is_none(),
            "not contiguous"
        );
        let q_grad = q.copy().set_requires_grad(true);
        assert!(
            decode_rows(&q_grad, &k, &k, &[1, 1]).is_none(),
            "records gradients"
        );
        assert!(
            decode_rows(&q, &k, &k, &[1, 9]).is_none(),
            "a length past the capacity"
        );
        assert!(decode_rows(&q, &k, &k, &[1]).is_none(), "a length per row");
        assert!(decode_rows(&q, &k, &k, &[1, 8]).is_some());
    }
}
