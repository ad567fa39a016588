//! Decode-step attention on the CPU that reads each row of a batch cache only up to its own
//! length. libtorch's `scaled_dot_product_attention` over a [`super::BatchKv`] must read every
//! row up to the longest row's length (a masked view of one tensor): with rows of 400 and
//! 3,500 positions in one wave, most of what a short row's attention reads is padding it then
//! masks away, and a decode round on this hardware is bound by those reads (BENCHMARKS.md,
//! issue 25 session 41). This kernel walks row i's keys and values `0..lens[i]` straight from
//! the cache's storage, once for all the query heads that share a key/value head. A row whose
//! first positions repeat another row's prompt (`BatchKv::push_shared`) reads them from that
//! row's storage, so a prompt every row of a wave holds is read from memory once a layer while it
//! stays in the core's cache; the rows' own positions are then asked for as read once.
//!
//! The decode step uses it where its cost per position read, weighed against libtorch's
//! (`relative_cost`), makes reading only the rows' own positions cheaper (`StepSlots::rows_pay`):
//! the generic kernel, which costs more per position than libtorch's, when the rows' lengths
//! differ enough; the SIMD kernels where they cost less, always (AVX-512's on a bf16 cache,
//! AVX2's on CPUs without AVX-512 on f32 and bf16 caches). Only for
//! contiguous f32 or bf16 caches on the CPU (a bf16 cache is read as bf16, half the bytes of
//! f32, and widened to f32 in registers; the queries are widened first and the output narrowed
//! back to the queries' dtype); anything else (CUDA, other dtypes) returns `None` and the caller
//! keeps libtorch's kernel. Scores use SDPA's default scale 1/sqrt(d) and a max-subtracted
//! softmax in f32.

use tch::{Device, Kind, Tensor};

/// A cache element this kernel reads: f32, or bf16 held as its 16 bits (the high half of the
/// f32 with the same sign, exponent and leading mantissa bits).
trait Elem: Copy + Send + Sync {
    /// The dtype of a tensor whose storage holds these.
    const KIND: Kind;
    /// Whether these are bf16's bits (else f32).
    const BF16: bool;
    fn f32(self) -> f32;
}

impl Elem for f32 {
    const KIND: Kind = Kind::Float;
    const BF16: bool = false;
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }
}

/// bf16's bits.
impl Elem for u16 {
    const KIND: Kind = Kind::BFloat16;
    const BF16: bool = true;
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

/// Each run of `n` scores in `scores` replaced by its softmax.
#[inline(always)]
fn softmax(scores: &mut [f32], n: usize) {
    if n == 0 {
        return;
    }
    for row in scores.chunks_exact_mut(n) {
        // A NaN or infinite score leaves NaN (through inf - inf or the NaN itself), as in
        // libtorch's kernel, rather than a softmax over the finite rest.
        let max =
            row.iter().copied().fold(
                f32::NEG_INFINITY,
                |m, x| {
                    if x > m || x.is_nan() { x } else { m }
                },
            );
        for x in row.iter_mut() {
            *x -= max;
        }
        exp_nonpositive(row);
        let inv = 1.0 / sum(row);
        for x in row.iter_mut() {
            *x *= inv;
        }
    }
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

/// One row's cached keys and values as a kernel reads them ([kv_heads, capacity, d] each):
/// positions `0..m` from `shared_k` and `shared_v`, another row's storage whose first `m`
/// positions hold the same tokens' keys and values (a prompt the rows share, read once for all
/// of them while it stays in the core's cache; [`super::BatchKv`] says which), the rest from the
/// row's own `k` and `v`. With `m = 0` only its own are read.
#[derive(Clone, Copy)]
struct RowKv<'a, T> {
    k: &'a [T],
    v: &'a [T],
    shared_k: &'a [T],
    shared_v: &'a [T],
    m: usize,
}

impl<'a, T> RowKv<'a, T> {
    /// A row read from its own storage alone.
    fn own(k: &'a [T], v: &'a [T]) -> Self {
        Self {
            k,
            v,
            shared_k: k,
            shared_v: v,
            m: 0,
        }
    }

    /// The keys position `t` is read from.
    #[inline(always)]
    fn keys(&self, t: usize) -> &'a [T] {
        if t < self.m { self.shared_k } else { self.k }
    }

    /// The values position `t` is read from.
    #[inline(always)]
    fn values(&self, t: usize) -> &'a [T] {
        if t < self.m { self.shared_v } else { self.v }
    }

    /// Ask for the `len` values at `at` of `from` (position `t`'s keys or values): a shared
    /// position for every cache level, the row's own, which no other row reads, as read once
    /// (non-temporal) when the row shares a prompt, so they do not push that prompt out before
    /// the next row reads it.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn prefetch(&self, from: &[T], t: usize, at: usize, len: usize) {
        let p = from.as_ptr().wrapping_add(at);
        let bytes = len * std::mem::size_of::<T>();
        if t < self.m || self.m == 0 {
            prefetch(p, bytes);
        } else {
            prefetch_hint::<{ std::arch::x86_64::_MM_HINT_NTA }, T>(p, bytes);
        }
    }
}

/// Attention of one row's queries (all kv heads) over its first `n` cached positions, into
/// `out` ([kv_heads, group, d]); `scores` is scratch.
#[inline(always)]
fn attend_row<T: Elem>(
    s: Shape,
    q: &[f32],
    kv: RowKv<'_, T>,
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
            let kt = &kv.keys(t)[base + t * d..base + (t + 1) * d];
            for j in 0..g {
                scores[j * n + t] = dot(&qh[j * d..(j + 1) * d], kt) * scale;
            }
        }
        softmax(&mut scores[..g * n], n);
        let oh = &mut out[h * g * d..(h + 1) * g * d];
        for t in 0..n {
            let vt = &kv.values(t)[base + t * d..base + (t + 1) * d];
            for j in 0..g {
                let p = scores[j * n + t];
                for (o, x) in oh[j * d..(j + 1) * d].iter_mut().zip(vt) {
                    *o += p * x.f32();
                }
            }
        }
    }
}

/// Positions ahead of the one being read whose cache lines the SIMD kernels request early: 16
/// (2 KiB of a bf16 head of 64); 8 and 32 were no faster on the `timing` test (session 80, within
/// its noise).
#[cfg(target_arch = "x86_64")]
const AHEAD: usize = 16;

/// Ask for the cache lines of the `bytes` bytes at `p` (no fault on any address).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(unsafe_code)]
fn prefetch<T>(p: *const T, bytes: usize) {
    prefetch_hint::<{ std::arch::x86_64::_MM_HINT_T0 }, T>(p, bytes);
}

/// [`prefetch`] with the hint `H` (`_MM_HINT_NTA`: lines read once, kept out of the outer
/// caches where the CPU can, so they do not push out a shared prompt read again by the next
/// row).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(unsafe_code)]
fn prefetch_hint<const H: i32, T>(p: *const T, bytes: usize) {
    let p = p.cast::<i8>();
    let mut o = 0;
    while o < bytes {
        // SAFETY: a prefetch is a hint that never faults, whatever the address.
        unsafe { std::arch::x86_64::_mm_prefetch::<H>(p.wrapping_add(o)) };
        o += 64;
    }
}

/// Whether the SIMD kernels (AVX-512's and AVX2's) take this shape: heads of 64 or 128 with
/// 1, 2 or 4 query heads a key/value head.
#[cfg(target_arch = "x86_64")]
fn simd_takes(s: Shape) -> bool {
    matches!(s.d, 64 | 128) && matches!(s.group, 1 | 2 | 4)
}

/// Whether this CPU runs the AVX2 kernel (AVX2 and FMA).
#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// Panics unless a SIMD kernel built for heads of `d` with `g` query heads a key/value head
/// reads and writes only inside the slices it is given: head h's positions 0..n of d values,
/// in the row's own storage and in the shared one (products checked, so a wrapped one cannot
/// pass). The kernels' `unsafe` accesses rest on it.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn assert_row_shape<T>(
    s: Shape,
    d: usize,
    g: usize,
    n: usize,
    q: &[f32],
    kv: RowKv<'_, T>,
    out: &[f32],
) {
    let heads = s.kv_heads.checked_mul(g).and_then(|x| x.checked_mul(d));
    let cache = s
        .kv_heads
        .checked_mul(s.capacity)
        .and_then(|x| x.checked_mul(d));
    assert!(
        s.d == d
            && s.group == g
            && n <= s.capacity
            && heads.is_some_and(|m| q.len() >= m && out.len() >= m)
            && cache.is_some_and(|m| {
                [kv.k, kv.v, kv.shared_k, kv.shared_v]
                    .iter()
                    .all(|x| x.len() >= m)
            }),
        "row kernel shape"
    );
}

/// The row kernel written in AVX-512 for the head sizes of 64 and 128 with up to four query heads
/// a key/value head: a row's queries and its output held in registers for the whole pass over
/// its positions, a key or value read once as 16-wide vectors (bf16 widened by a shift), one
/// fused multiply-add per 16 products, and the scores of sixteen positions summed by one shuffle
/// tree (45 shuffles and adds, where a horizontal sum a score took about 8 each: 1.06-1.1x on a
/// bf16 cache, BENCHMARKS.md issue 25 session 86). Over 32 rows of 2,048
/// positions the generic kernel compiled for AVX2 took 2.5-4x libtorch's time (1.1-1.2x less
/// compiled for AVX-512), mostly in its per-score sums in lane order and its output kept in
/// memory (BENCHMARKS.md, issue 25 session 79). The cache lines of the key or value `AHEAD`
/// positions on are requested before the current one is read: a head's positions are one
/// sequential stream, but the hardware's prefetcher stops at each 4 KiB page (32 positions of a
/// bf16 head of 64) and the loads then waited on memory (a profile put over half the kernel's
/// samples on them); with the hint a decode round of 32 rows of 2,048 positions took 20 ms
/// instead of 34 (session 80).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx512 {
    use super::{AHEAD, Elem, RowKv, Shape, softmax};
    use std::arch::x86_64::{
        __m512, _mm256_loadu_si256, _mm512_add_ps, _mm512_castsi512_ps, _mm512_cvtepu16_epi32,
        _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_mul_ps, _mm512_reduce_add_ps, _mm512_set1_ps,
        _mm512_setzero_ps, _mm512_shuffle_f32x4, _mm512_shuffle_ps, _mm512_slli_epi32,
        _mm512_storeu_ps, _mm512_unpackhi_ps, _mm512_unpacklo_ps,
    };

    /// Each query head's products with position `t`'s key, sixteen lanes a head whose sum is
    /// the score (before the scale); asks for the key `AHEAD` positions on.
    ///
    /// # Safety
    /// `base + t d + d <= kv.keys(t).len()` with `d = 16 C` (what `row` asserts for `t < n`).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn products<T: Elem, const C: usize, const G: usize>(
        qr: &[[__m512; C]; G],
        kv: &RowKv<'_, T>,
        base: usize,
        t: usize,
    ) -> [__m512; G] {
        let d = 16 * C;
        let ahead = t + AHEAD;
        kv.prefetch(kv.keys(ahead), ahead, base + ahead * d, d);
        let k = kv.keys(t);
        let mut kt = [_mm512_setzero_ps(); C];
        for (c, x) in kt.iter_mut().enumerate() {
            // SAFETY: base + t d + 16 c + 16 <= base + t d + d <= k.len() (the caller's
            // guarantee).
            *x = unsafe { load(k.as_ptr().add(base + t * d + 16 * c)) };
        }
        let mut acc = [_mm512_setzero_ps(); G];
        for (a, qj) in acc.iter_mut().zip(qr) {
            *a = _mm512_mul_ps(qj[0], kt[0]);
            for c in 1..C {
                *a = _mm512_fmadd_ps(qj[c], kt[c], *a);
            }
        }
        acc
    }

    /// Summing sixteen vectors at once, so each sum costs a sixteenth of a shuffle tree rather
    /// than a whole one: `a` and `b` added pairwise within each 128-bit lane, interleaved (lane
    /// L holds two partial sums of `a`'s and two of `b`'s lane L).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn sum2(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b))
    }

    /// Two [`sum2`] results of vectors a, b and c, d as lane L = [a, b, c, d]'s sums over lane L.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn sum4(ab: __m512, cd: __m512) -> __m512 {
        _mm512_add_ps(
            _mm512_shuffle_ps::<0x44>(ab, cd),
            _mm512_shuffle_ps::<0xEE>(ab, cd),
        )
    }

    /// Adjacent 128-bit lanes of `x` and then `y` added: lanes [x0 + x1, x2 + x3, y0 + y1,
    /// y2 + y3]. Applied to two [`sum4`] results, then to two of its own, it leaves sixteen
    /// vectors' whole sums in their order.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn sum_lanes(x: __m512, y: __m512) -> __m512 {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(x, y),
            _mm512_shuffle_f32x4::<0xDD>(x, y),
        )
    }

    /// Sixteen consecutive values from `p` as f32.
    ///
    /// # Safety
    /// `p` must be valid for reading 16 values of `T`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load<T: Elem>(p: *const T) -> __m512 {
        if T::BF16 {
            // SAFETY: 16 u16 are 32 bytes, readable by the caller's guarantee (unaligned load).
            let h = unsafe { _mm256_loadu_si256(p.cast()) };
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        } else {
            // SAFETY: 16 f32 readable by the caller's guarantee (unaligned load).
            unsafe { _mm512_loadu_ps(p.cast()) }
        }
    }

    /// [`super::attend_row`] for a shape [`super::simd_takes`] accepts.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) fn attend_row<T: Elem>(
        s: Shape,
        q: &[f32],
        kv: RowKv<'_, T>,
        n: usize,
        out: &mut [f32],
        scores: &mut Vec<f32>,
    ) {
        match (s.d, s.group) {
            (64, 1) => row::<T, 4, 1>(s, q, kv, n, out, scores),
            (64, 2) => row::<T, 4, 2>(s, q, kv, n, out, scores),
            (64, 4) => row::<T, 4, 4>(s, q, kv, n, out, scores),
            (128, 1) => row::<T, 8, 1>(s, q, kv, n, out, scores),
            (128, 2) => row::<T, 8, 2>(s, q, kv, n, out, scores),
            (128, 4) => row::<T, 8, 4>(s, q, kv, n, out, scores),
            _ => super::attend_row(s, q, kv, n, out, scores),
        }
    }

    /// One row with `C` vectors of 16 a head (d = 16 C) and `G` query heads a key/value head.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn row<T: Elem, const C: usize, const G: usize>(
        s: Shape,
        q: &[f32],
        kv: RowKv<'_, T>,
        n: usize,
        out: &mut [f32],
        scores: &mut Vec<f32>,
    ) {
        let d = 16 * C;
        // Every read and write below stays inside the slices (asserted).
        super::assert_row_shape(s, d, G, n, q, kv, out);
        let scale = 1.0 / (d as f32).sqrt();
        scores.clear();
        scores.resize(G * n, 0.0);
        for h in 0..s.kv_heads {
            let base = h * s.capacity * d;
            let mut qr = [[_mm512_setzero_ps(); C]; G];
            for (j, qj) in qr.iter_mut().enumerate() {
                for (c, x) in qj.iter_mut().enumerate() {
                    // SAFETY: (h G + j) d + 16 c + 16 <= kv_heads G d <= q.len() (asserted).
                    *x = unsafe { _mm512_loadu_ps(q.as_ptr().add((h * G + j) * d + 16 * c)) };
                }
            }
            // Scores sixteen positions at a time, summed by one shuffle tree; the rest one at a
            // time.
            let scale16 = _mm512_set1_ps(scale);
            let whole = n / 16 * 16;
            for t0 in (0..whole).step_by(16) {
                let zero = [_mm512_setzero_ps(); G];
                let (mut l1, mut l2, mut l3) = (zero, zero, zero);
                for pair in 0..8 {
                    let t = t0 + 2 * pair;
                    // SAFETY: t + 1 < n <= capacity, so base + (t + 1) d + d <= (h + 1)
                    // capacity d <= both keys' lengths (asserted).
                    let (a, b) = unsafe {
                        (
                            products::<T, C, G>(&qr, &kv, base, t),
                            products::<T, C, G>(&qr, &kv, base, t + 1),
                        )
                    };
                    for j in 0..G {
                        let w = sum2(a[j], b[j]);
                        if pair % 2 == 0 {
                            l1[j] = w;
                            continue;
                        }
                        let x = sum4(l1[j], w);
                        if pair % 4 == 1 {
                            l2[j] = x;
                            continue;
                        }
                        let y = sum_lanes(l2[j], x);
                        if pair == 3 {
                            l3[j] = y;
                            continue;
                        }
                        let z = _mm512_mul_ps(sum_lanes(l3[j], y), scale16);
                        // SAFETY: j n + t0 + 16 <= j n + n <= G n = scores.len().
                        unsafe { _mm512_storeu_ps(scores.as_mut_ptr().add(j * n + t0), z) };
                    }
                }
            }
            for t in whole..n {
                // SAFETY: t < n <= capacity, as above.
                let acc = unsafe { products::<T, C, G>(&qr, &kv, base, t) };
                for (j, a) in acc.iter().enumerate() {
                    scores[j * n + t] = _mm512_reduce_add_ps(*a) * scale;
                }
            }
            softmax(&mut scores[..G * n], n);
            let mut o = [[_mm512_setzero_ps(); C]; G];
            for t in 0..n {
                let ahead = t + AHEAD;
                kv.prefetch(kv.values(ahead), ahead, base + ahead * d, d);
                let v = kv.values(t);
                let mut vt = [_mm512_setzero_ps(); C];
                for (c, x) in vt.iter_mut().enumerate() {
                    // SAFETY: as for the keys.
                    *x = unsafe { load(v.as_ptr().add(base + t * d + 16 * c)) };
                }
                for (j, oj) in o.iter_mut().enumerate() {
                    let p = _mm512_set1_ps(scores[j * n + t]);
                    for c in 0..C {
                        oj[c] = _mm512_fmadd_ps(p, vt[c], oj[c]);
                    }
                }
            }
            for (j, oj) in o.iter().enumerate() {
                for (c, x) in oj.iter().enumerate() {
                    // SAFETY: (h G + j) d + 16 c + 16 <= kv_heads G d <= out.len() (asserted).
                    unsafe { _mm512_storeu_ps(out.as_mut_ptr().add((h * G + j) * d + 16 * c), *x) };
                }
            }
        }
    }
}

/// The row kernel written in AVX2 with FMA (8-wide vectors) for the head sizes of 64 and 128
/// with up to four query heads a key/value head, for CPUs without AVX-512: the generic kernel
/// compiled for AVX2 sums each score in lane order and keeps its output in memory. Scores: a
/// position's key is read once as 8-wide vectors and multiplied into every query head's two
/// accumulators (even and odd vectors, two chains of fused multiply-adds), one horizontal sum a
/// score. Output: AVX2 has 16 vector registers, too few for every query head's whole output
/// (16 vectors for a head of 64 and two query heads), so the values are read in column blocks of
/// `B` vectors, `G B` = 8 accumulators held in registers over all positions; each pass reads its
/// own cache lines of every position, so the blocks read no byte twice from memory. The cache
/// lines `AHEAD` positions on are requested before a position is read, as in the AVX-512 kernel.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2 {
    use super::{AHEAD, Elem, RowKv, Shape, softmax};
    use std::arch::x86_64::{
        __m256, _mm_add_ps, _mm_add_ss, _mm_cvtss_f32, _mm_loadu_si128, _mm_movehdup_ps,
        _mm_movehl_ps, _mm256_add_ps, _mm256_castps256_ps128, _mm256_castsi256_ps,
        _mm256_cvtepu16_epi32, _mm256_extractf128_ps, _mm256_fmadd_ps, _mm256_loadu_ps,
        _mm256_set1_ps, _mm256_setzero_ps, _mm256_slli_epi32, _mm256_storeu_ps,
    };

    /// Eight consecutive values from `p` as f32.
    ///
    /// # Safety
    /// `p` must be valid for reading 8 values of `T`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load<T: Elem>(p: *const T) -> __m256 {
        if T::BF16 {
            // SAFETY: 8 u16 are 16 bytes, readable by the caller's guarantee (unaligned load).
            let h = unsafe { _mm_loadu_si128(p.cast()) };
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        } else {
            // SAFETY: 8 f32 readable by the caller's guarantee (unaligned load).
            unsafe { _mm256_loadu_ps(p.cast()) }
        }
    }

    /// The sum of a vector's eight lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum(x: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// [`super::attend_row`] for a shape [`super::simd_takes`] accepts.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn attend_row<T: Elem>(
        s: Shape,
        q: &[f32],
        kv: RowKv<'_, T>,
        n: usize,
        out: &mut [f32],
        scores: &mut Vec<f32>,
    ) {
        match (s.d, s.group) {
            (64, 1) => row::<T, 8, 1, 8>(s, q, kv, n, out, scores),
            (64, 2) => row::<T, 8, 2, 4>(s, q, kv, n, out, scores),
            (64, 4) => row::<T, 8, 4, 2>(s, q, kv, n, out, scores),
            (128, 1) => row::<T, 16, 1, 8>(s, q, kv, n, out, scores),
            (128, 2) => row::<T, 16, 2, 4>(s, q, kv, n, out, scores),
            (128, 4) => row::<T, 16, 4, 2>(s, q, kv, n, out, scores),
            _ => super::attend_row(s, q, kv, n, out, scores),
        }
    }

    /// One row with `C` vectors of 8 a head (d = 8 C), `G` query heads a key/value head, and the
    /// output in column blocks of `B` vectors (`C` a multiple of `B`).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn row<T: Elem, const C: usize, const G: usize, const B: usize>(
        s: Shape,
        q: &[f32],
        kv: RowKv<'_, T>,
        n: usize,
        out: &mut [f32],
        scores: &mut Vec<f32>,
    ) {
        let d = 8 * C;
        // Every read and write below stays inside the slices (asserted).
        super::assert_row_shape(s, d, G, n, q, kv, out);
        assert!(C.is_multiple_of(B), "row kernel shape");
        let scale = 1.0 / (d as f32).sqrt();
        scores.clear();
        scores.resize(G * n, 0.0);
        for h in 0..s.kv_heads {
            let base = h * s.capacity * d;
            let mut qr = [[_mm256_setzero_ps(); C]; G];
            for (j, qj) in qr.iter_mut().enumerate() {
                for (c, x) in qj.iter_mut().enumerate() {
                    // SAFETY: (h G + j) d + 8 c + 8 <= kv_heads G d <= q.len() (asserted).
                    *x = unsafe { _mm256_loadu_ps(q.as_ptr().add((h * G + j) * d + 8 * c)) };
                }
            }
            for t in 0..n {
                let ahead = t + AHEAD;
                kv.prefetch(kv.keys(ahead), ahead, base + ahead * d, d);
                let k = kv.keys(t);
                let mut acc = [[_mm256_setzero_ps(); 2]; G];
                for c in 0..C {
                    // SAFETY: base + t d + 8 c + 8 <= (h + 1) capacity d <= k.len(), as t < n
                    // <= capacity (asserted for both the own and the shared keys).
                    let kc = unsafe { load(k.as_ptr().add(base + t * d + 8 * c)) };
                    for j in 0..G {
                        acc[j][c % 2] = _mm256_fmadd_ps(qr[j][c], kc, acc[j][c % 2]);
                    }
                }
                for (j, a) in acc.iter().enumerate() {
                    scores[j * n + t] = hsum(_mm256_add_ps(a[0], a[1])) * scale;
                }
            }
            softmax(&mut scores[..G * n], n);
            for b in (0..C).step_by(B) {
                let mut o = [[_mm256_setzero_ps(); B]; G];
                for t in 0..n {
                    let at = base + t * d + 8 * b;
                    kv.prefetch(kv.values(t + AHEAD), t + AHEAD, at + AHEAD * d, 8 * B);
                    let v = kv.values(t);
                    let mut vt = [_mm256_setzero_ps(); B];
                    for (c, x) in vt.iter_mut().enumerate() {
                        // SAFETY: at + 8 c + 8 <= base + t d + 8 C <= (h + 1) capacity d <=
                        // v.len(), as b + c < C and t < n <= capacity (asserted).
                        *x = unsafe { load(v.as_ptr().add(at + 8 * c)) };
                    }
                    for (j, oj) in o.iter_mut().enumerate() {
                        let p = _mm256_set1_ps(scores[j * n + t]);
                        for c in 0..B {
                            oj[c] = _mm256_fmadd_ps(p, vt[c], oj[c]);
                        }
                    }
                }
                for (j, oj) in o.iter().enumerate() {
                    for (c, x) in oj.iter().enumerate() {
                        // SAFETY: (h G + j) d + 8 (b + c) + 8 <= kv_heads G d <= out.len()
                        // (asserted; b + c < C).
                        unsafe {
                            _mm256_storeu_ps(
                                out.as_mut_ptr().add((h * G + j) * d + 8 * (b + c)),
                                *x,
                            )
                        };
                    }
                }
            }
        }
    }
}

/// One call's inputs: the queries and whole caches as slices, each row's length, and where
/// each row reads its shared positions (`shared[i] = (row r, m)`: positions `0..m` from row r's
/// storage; empty: every row reads its own).
struct Call<'a, T> {
    s: Shape,
    q: &'a [f32],
    k: &'a [T],
    v: &'a [T],
    lens: &'a [usize],
    shared: &'a [(usize, usize)],
}

impl<T: Elem> Call<'_, T> {
    /// Rows `first..` into `out` (whole rows of [kv_heads, group, d]).
    #[inline(always)]
    fn block(&self, first: usize, out: &mut [f32]) {
        self.block_with(first, out, attend_row);
    }

    /// Rows `first..` into `out` (whole rows of [kv_heads, group, d]), each by `row` (a row
    /// kernel with [`attend_row`]'s arguments).
    #[inline(always)]
    fn block_with(
        &self,
        first: usize,
        out: &mut [f32],
        mut row: impl FnMut(Shape, &[f32], RowKv<'_, T>, usize, &mut [f32], &mut Vec<f32>),
    ) {
        let s = self.s;
        let q_row = s.kv_heads * s.group * s.d;
        let c_row = s.kv_heads * s.capacity * s.d;
        let cache = |i: usize| {
            (
                &self.k[i * c_row..(i + 1) * c_row],
                &self.v[i * c_row..(i + 1) * c_row],
            )
        };
        let mut scores = Vec::new();
        for (r, o) in out.chunks_exact_mut(q_row).enumerate() {
            let i = first + r;
            let (k, v) = cache(i);
            let mut kv = RowKv::own(k, v);
            if let Some(&(src, m)) = self.shared.get(i)
                && m > 0
            {
                (kv.shared_k, kv.shared_v) = cache(src);
                kv.m = m;
            }
            row(
                s,
                &self.q[i * q_row..(i + 1) * q_row],
                kv,
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

    /// [`Self::block`] by AVX-512's row kernel ([`avx512::attend_row`], which hands a shape it
    /// does not take to the generic kernel, here compiled for AVX-512).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn block_avx512(&self, first: usize, out: &mut [f32]) {
        self.block_with(first, out, |s, q, kv, n, o, scores| {
            avx512::attend_row(s, q, kv, n, o, scores)
        });
    }

    /// [`Self::block`] by AVX2's row kernel ([`avx2::attend_row`], which hands a shape it does
    /// not take to the generic kernel, here compiled for AVX2 and FMA).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn block_avx2fma(&self, first: usize, out: &mut [f32]) {
        self.block_with(first, out, |s, q, kv, n, o, scores| {
            avx2::attend_row(s, q, kv, n, o, scores)
        });
    }

    /// [`Self::block`] with the widest vectors this CPU has.
    #[allow(unsafe_code)]
    fn block_best(&self, first: usize, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above), the only requirement of a
            // `target_feature(enable = "avx512f")` function.
            unsafe { self.block_avx512(first, out) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if has_avx2_fma() {
            // SAFETY: the CPU has AVX2 and FMA (checked just above), the only requirements of a
            // `target_feature(enable = "avx2,fma")` function.
            unsafe { self.block_avx2fma(first, out) };
            return;
        }
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

/// The row kernel's cost per position read against libtorch's kernel over the masked view, as a
/// fraction `(num, den)`, for a cache of `kind` and heads of `d` with `group` query heads a
/// key/value head on this CPU (`StepSlots::rows_pay` weighs it). Measured over 32 rows of 2,048
/// positions, one thread (the `timing` test below; BENCHMARKS.md, issue 25 sessions 41 and 79):
/// the AVX-512 kernel 1.18-1.23x libtorch's on an f32 cache and 0.61-0.74x on a bf16 one, which
/// it reads at the memory's pace where libtorch does not (3/5; since its prefetch, session 80:
/// 0.93-1.26x on f32, 0.44-0.67x on bf16). In whole decode rounds (`cargo bench -p trainer
/// --bench decode`) the AVX-512 kernel on an f32 cache first cost 0.95-1.05x the reference round
/// (session 79), then ran 1.07-1.13x faster than it since the prefetch (session 80, one run) and
/// 1.06-1.21x faster at equal lengths of 512 to 2,048 positions (1.00-1.05x at 64) in three runs
/// on session 82's Xeon (AVX-512, no AMX), where 6/5 kept the reference: 4/5 for f32. On a CPU
/// with AVX2 and FMA but no AVX-512 (session 81's AMD EPYC, Zen 3) the AVX2 kernel took
/// 0.71-0.86x libtorch's time on f32 and 0.42-0.50x on bf16 where the generic one took 0.89-1.16x
/// and 1.27-1.36x, and whole decode rounds always taking it ran 1.10-1.30x faster than the
/// reference at equal lengths (f32): 4/5 for f32, and bf16's 3/5 as under AVX-512. Everything
/// else keeps session 41's 6/5: in whole decode rounds the generic kernel cost up to 1.20x
/// libtorch's per position, and on session 79's machine 2.5-4x alone, so there 6/5 sends it rows
/// it loses on.
pub fn relative_cost(kind: Kind, d: usize, group: usize) -> (usize, usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let s = Shape {
            kv_heads: 1,
            group,
            d,
            capacity: 1,
        };
        let bf16 = kind == Kind::BFloat16;
        if simd_takes(s) && (std::arch::is_x86_feature_detected!("avx512f") || has_avx2_fma()) {
            return if bf16 { (3, 5) } else { (4, 5) };
        }
    }
    let _ = (kind, d, group);
    (6, 5)
}

/// Attention for a decode step: row i's queries `q[i]` ([rows, kv_heads, group, d]: query head
/// `kv * group + j` reads kv head `kv`) over positions `0..lens[i]` of rows `0..rows` of the
/// caches `k` and `v` ([capacity_rows, kv_heads, capacity, d], whole allocations). Returns
/// [rows, kv_heads, group, d] in `q`'s dtype, or `None` when `q` and the caches are not
/// contiguous CPU f32 or bf16 (the caches of one dtype; `q` of either, so f32 queries read a
/// bf16 cache) or the shapes disagree (the caller then uses libtorch's kernel). Rows are split
/// into `tch::get_num_threads()` blocks run on libtorch's intra-op threads.
///
/// `shared[i] = (r, m)` (one per row, or none at all) says that row i's first `m` positions
/// hold the same keys and values as row r's, which the row then reads from row r's storage: a
/// prompt shared by many rows is read from memory once a layer while it stays in the core's
/// cache, instead of once a row (`BatchKv`'s shared prompts). Row r must hold `m` positions; a
/// row that names no source or `m = 0` reads its own.
pub fn decode_rows(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    lens: &[usize],
    shared: &[(usize, usize)],
) -> Option<Tensor> {
    let threads = usize::try_from(tch::get_num_threads()).unwrap_or(1);
    decode_rows_on(q, k, v, lens, shared, threads)
}

/// [`decode_rows`] in at most `threads` blocks of rows.
fn decode_rows_on(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    lens: &[usize],
    shared: &[(usize, usize)],
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
        || !(shared.is_empty() || shared.len() == rows)
        || shared
            .iter()
            .any(|&(r, m)| m > 0 && lens.get(r).is_none_or(|&n| m > n))
    {
        return None;
    }
    let float = |kind: Kind| kind == Kind::Float || kind == Kind::BFloat16;
    if !float(q.kind()) || !float(k.kind()) || v.kind() != k.kind() {
        return None;
    }
    // bf16 queries are few (one position a row): widened once, so the kernel reads f32 queries
    // against bf16 keys and values.
    let q32 = (q.kind() == Kind::BFloat16 && q.device() == Device::Cpu && !q.requires_grad())
        .then(|| q.to_kind(Kind::Float).contiguous());
    // SAFETY: the slices live until this function returns (`parallel_for` returns once every
    // block has ended), and nothing here or on the threads the blocks run on writes a tensor:
    // the decode step wrote this step's keys and values into the caches (`BatchKv::write`)
    // before calling, the caches belong to the calling thread, and `q32` is this function's own.
    #[allow(unsafe_code)]
    let qv = unsafe { host::<f32>(q32.as_ref().unwrap_or(q))? };
    #[allow(unsafe_code)]
    let out = if k.kind() == Kind::BFloat16 {
        // SAFETY: as above.
        let (kv, vv) = unsafe { (host::<u16>(k)?, host::<u16>(v)?) };
        attend(s, qv, kv, vv, lens, shared, threads)
    } else {
        // SAFETY: as above.
        let (kv, vv) = unsafe { (host::<f32>(k)?, host::<f32>(v)?) };
        attend(s, qv, kv, vv, lens, shared, threads)
    };
    let y = Tensor::from_slice(&out).view([qs[0], qs[1], qs[2], qs[3]]);
    Some(if q.kind() == Kind::Float {
        y
    } else {
        y.to_kind(q.kind())
    })
}

/// The attention of `rows = lens.len()` rows into a new [rows, kv_heads, group, d] buffer, on
/// at most `threads` blocks of rows with about equal positions each, run by
/// [`crate::kernels::parallel_for`].
fn attend<T: Elem>(
    s: Shape,
    qv: &[f32],
    kv: &[T],
    vv: &[T],
    lens: &[usize],
    shared: &[(usize, usize)],
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
        shared,
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
        // The blocks run on libtorch's intra-op threads, whose OpenMP workers are awake from
        // the round's matrix products (threads started here shared the cores with them).
        let mut blocks = Vec::with_capacity(bounds.len() - 1);
        let mut rest = out.as_mut_slice();
        for w in bounds.windows(2) {
            let (chunk, tail) = rest.split_at_mut((w[1] - w[0]) * q_row);
            rest = tail;
            blocks.push(std::sync::Mutex::new((w[0], chunk)));
        }
        crate::kernels::parallel_for(blocks.len(), &|begin, end| {
            for b in &blocks[begin..end] {
                let mut block = b.lock().unwrap_or_else(|e| e.into_inner());
                let (first, ref mut chunk) = *block;
                work(first, chunk);
            }
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libtorch's SDPA of row `i`'s queries over its first `n` cached positions, in f32 (bf16
    /// values widened): what row `i` of the kernel's output must equal.
    fn sdpa_row(q: &Tensor, k: &Tensor, v: &Tensor, i: i64, n: i64) -> Tensor {
        let wide = |t: &Tensor| t.narrow(0, i, 1).to_kind(Kind::Float);
        Tensor::scaled_dot_product_attention(
            &wide(q),
            &wide(k).narrow(2, 0, n),
            &wide(v).narrow(2, 0, n),
            None::<Tensor>,
            0.0,
            false,
            None,
            false,
        )
    }

    /// The kernel equals libtorch's SDPA over each row's own positions, for rows of different
    /// lengths in a cache with spare rows and positions, on one to three threads.
    #[test]
    fn rows_attend_only_their_own_positions_as_sdpa_does() {
        let _rng = crate::model::rng_lock();
        tch::manual_seed(5);
        let (rows, kvh, g, d, cap) = (5_i64, 2_i64, 3_i64, 16_i64, 40_i64);
        let k = Tensor::randn([rows + 2, kvh, cap, d], (Kind::Float, Device::Cpu));
        let v = Tensor::randn([rows + 2, kvh, cap, d], (Kind::Float, Device::Cpu));
        let q = Tensor::randn([rows, kvh, g, d], (Kind::Float, Device::Cpu));
        let lens = [1_usize, 7, 40, 13, 2];
        for threads in [1, 2, 3] {
            let got = decode_rows_on(&q, &k, &v, &lens, &[], threads).unwrap();
            for (i, &n) in lens.iter().enumerate() {
                let i = i as i64;
                let n = n as i64;
                let want = sdpa_row(&q, &k, &v, i, n);
                let diff = (got.narrow(0, i, 1) - want).abs().max().double_value(&[]);
                assert!(
                    diff < 1e-5,
                    "row {i} ({n} positions), {threads} threads: {diff}"
                );
            }
        }
    }

    /// A row that names a source reads its first `m` positions from the source row's storage
    /// and the rest from its own: the kernel equals SDPA over the row's own cache with those
    /// positions replaced by the source's (its own copy of them is overwritten with other
    /// values here, so reading it would show), on one to three threads, f32 and bf16 caches,
    /// shapes the SIMD kernels take and one only the generic kernel takes. Bad sources (a row
    /// past the batch, more positions than the source holds, a source per row missing) are
    /// refused, leaving libtorch's kernel.
    #[test]
    fn rows_read_their_shared_positions_from_the_source_row() {
        let _rng = crate::model::rng_lock();
        tch::manual_seed(8);
        let (rows, kvh, cap) = (5_i64, 2_i64, 60_i64);
        let lens = [50_usize, 41, 60, 7, 33];
        // Row 1 and row 2 read from row 0, row 4 from row 2 (a source's source is its own
        // storage: only row 2's own positions are read), row 3 alone.
        let shared = [(0, 0), (0, 40), (0, 50), (3, 0), (2, 30)];
        for (d, g) in [(64_i64, 2_i64), (16, 3)] {
            for kind in [Kind::Float, Kind::BFloat16] {
                let o = (kind, Device::Cpu);
                let k = Tensor::randn([rows + 1, kvh, cap, d], o);
                let v = Tensor::randn([rows + 1, kvh, cap, d], o);
                let q = Tensor::randn([rows, kvh, g, d], o);
                // What each row must read: its own storage with the shared positions taken
                // from its source.
                let (want_k, want_v) = (k.copy(), v.copy());
                for (i, &(r, m)) in shared.iter().enumerate() {
                    let m = m as i64;
                    for (want, t) in [(&want_k, &k), (&want_v, &v)] {
                        want.get(i as i64)
                            .narrow(1, 0, m)
                            .copy_(&t.get(r as i64).narrow(1, 0, m));
                    }
                }
                for threads in [1, 2, 3] {
                    let got = decode_rows_on(&q, &k, &v, &lens, &shared, threads)
                        .unwrap()
                        .to_kind(Kind::Float);
                    for (i, &n) in lens.iter().enumerate() {
                        let (i, n) = (i as i64, n as i64);
                        let want = sdpa_row(&q, &want_k, &want_v, i, n);
                        let diff = (got.narrow(0, i, 1) - &want).abs().max().double_value(&[]);
                        let tol = if kind == Kind::Float {
                            1e-5
                        } else {
                            want.abs().max().double_value(&[]).max(1.0) / 128.0
                        };
                        assert!(
                            diff <= tol,
                            "d {d}, {kind:?}, row {i}, {threads} threads: {diff}"
                        );
                        if shared[i as usize].1 > 0 {
                            let own = sdpa_row(&q, &k, &v, i, n);
                            let apart = (got.narrow(0, i, 1) - own).abs().max().double_value(&[]);
                            assert!(apart > 10.0 * tol, "row {i} read its own copy: {apart}");
                        }
                    }
                }
                let refused =
                    |bad: &[(usize, usize)]| decode_rows_on(&q, &k, &v, &lens, bad, 1).is_none();
                assert!(
                    refused(&[(0, 0), (5, 3), (0, 0), (0, 0), (0, 0)]),
                    "row past"
                );
                assert!(refused(&[(0, 0), (3, 8), (0, 0), (0, 0), (0, 0)]), "8 of 7");
                assert!(refused(&[(0, 0), (0, 4)]), "a source per row");
            }
        }
    }

    /// A bf16 cache is read as bf16: the kernel equals SDPA over the same bf16 values widened
    /// to f32, up to the output's rounding to bf16 with bf16 queries (and returns bf16), to
    /// f32's with f32 queries (and returns f32).
    #[test]
    fn a_bf16_cache_is_read_as_bf16() {
        let _rng = crate::model::rng_lock();
        tch::manual_seed(6);
        let (rows, kvh, g, d, cap) = (4_i64, 2_i64, 2_i64, 64_i64, 48_i64);
        let bf = (Kind::BFloat16, Device::Cpu);
        let k = Tensor::randn([rows + 1, kvh, cap, d], bf);
        let v = Tensor::randn([rows + 1, kvh, cap, d], bf);
        let q = Tensor::randn([rows, kvh, g, d], bf);
        let lens = [3_usize, 48, 17, 1];
        // bf16 queries (bf16 weights) give a bf16 output: bf16 keeps 8 significant bits, so
        // its rounding alone is up to 2^-8 of it. f32 queries (f32 weights over a bf16 cache,
        // `BatchKv::with_kind`) read the cache as it is and give f32: SDPA over the widened
        // values to f32's rounding.
        let q32 = q.to_kind(Kind::Float) * 1.01;
        for (q, tolerance) in [(&q, 1.0 / 128.0), (&q32, 1e-5)] {
            for threads in [1, 2] {
                let got = decode_rows_on(q, &k, &v, &lens, &[], threads).unwrap();
                assert_eq!(got.kind(), q.kind());
                for (i, &n) in lens.iter().enumerate() {
                    let (i, n) = (i as i64, n as i64);
                    let want = sdpa_row(q, &k, &v, i, n);
                    let got = got.narrow(0, i, 1).to_kind(Kind::Float);
                    let diff = (&got - &want).abs().max().double_value(&[]);
                    let scale = want.abs().max().double_value(&[]).max(1.0);
                    assert!(
                        diff <= tolerance * scale,
                        "{:?} queries, row {i} ({n} positions), {threads} threads: {diff}",
                        q.kind()
                    );
                }
            }
        }
        // Keys and values of two dtypes are libtorch's.
        assert!(decode_rows(&q, &k.to_kind(Kind::Float), &v, &[1, 1, 1, 1], &[]).is_none());
    }

    /// The SIMD kernels (AVX-512, and AVX2 with FMA, each where this CPU has it) over every shape
    /// they take, f32 and bf16 caches, equal libtorch's SDPA over each row's own positions, as
    /// `decode_rows` returns it and as the generic kernel gives it.
    #[test]
    fn the_simd_kernels_attend_as_sdpa_does() {
        let _rng = crate::model::rng_lock();
        tch::manual_seed(7);
        let lens = [1_usize, 17, 40, 3];
        let (rows, kvh, cap) = (4_i64, 2_i64, 40_i64);
        for (d, g) in [
            (64_i64, 1_i64),
            (64, 2),
            (64, 4),
            (128, 1),
            (128, 2),
            (128, 4),
        ] {
            for kind in [Kind::Float, Kind::BFloat16] {
                let o = (kind, Device::Cpu);
                let k = Tensor::randn([rows + 1, kvh, cap, d], o);
                let v = Tensor::randn([rows + 1, kvh, cap, d], o);
                let q = Tensor::randn([rows, kvh, g, d], o);
                let got = decode_rows_on(&q, &k, &v, &lens, &[], 1)
                    .unwrap()
                    .to_kind(Kind::Float);
                for (i, &n) in lens.iter().enumerate() {
                    let (i, n) = (i as i64, n as i64);
                    let want = sdpa_row(&q, &k, &v, i, n);
                    let diff = (got.narrow(0, i, 1) - &want).abs().max().double_value(&[]);
                    // f32: rounding alone; bf16: the output's rounding to 8 significant bits.
                    let tol = if kind == Kind::Float {
                        1e-5
                    } else {
                        want.abs().max().double_value(&[]).max(1.0) / 128.0
                    };
                    assert!(
                        diff <= tol,
                        "d {d}, group {g}, {kind:?}, row {i} ({n}): {diff}"
                    );
                }
                #[cfg(target_arch = "x86_64")]
                {
                    let s = Shape {
                        kv_heads: kvh as usize,
                        group: g as usize,
                        d: d as usize,
                        capacity: cap as usize,
                    };
                    assert!(simd_takes(s));
                    let qf = q.to_kind(Kind::Float).contiguous();
                    // SAFETY: nothing writes these tensors while the slices live.
                    #[allow(unsafe_code)]
                    let qv = unsafe { host::<f32>(&qf) }.unwrap();
                    // SAFETY: nothing writes these tensors while the slices live.
                    #[allow(unsafe_code)]
                    if kind == Kind::Float {
                        let (kv, vv) = unsafe { (host::<f32>(&k), host::<f32>(&v)) };
                        simd_same_as_generic(s, qv, kv.unwrap(), vv.unwrap(), &lens);
                    } else {
                        let (kv, vv) = unsafe { (host::<u16>(&k), host::<u16>(&v)) };
                        simd_same_as_generic(s, qv, kv.unwrap(), vv.unwrap(), &lens);
                    }
                }
            }
        }
    }

    /// The rows of each SIMD kernel this CPU can run (AVX-512, AVX2 with FMA) equal the generic
    /// kernel's.
    #[cfg(target_arch = "x86_64")]
    fn simd_same_as_generic<T: Elem>(s: Shape, q: &[f32], k: &[T], v: &[T], lens: &[usize]) {
        if std::arch::is_x86_feature_detected!("avx512f") {
            same_as_generic(s, q, k, v, lens, "avx512", |s, q, kv, n, o, scratch| {
                // SAFETY: this CPU has AVX-512F (checked just above).
                #[allow(unsafe_code)]
                unsafe {
                    avx512::attend_row(s, q, kv, n, o, scratch)
                }
            });
        }
        if has_avx2_fma() {
            same_as_generic(s, q, k, v, lens, "avx2", |s, q, kv, n, o, scratch| {
                // SAFETY: this CPU has AVX2 and FMA (checked just above).
                #[allow(unsafe_code)]
                unsafe {
                    avx2::attend_row(s, q, kv, n, o, scratch)
                }
            });
        }
    }

    /// A SIMD kernel's rows (`kernel`, with [`attend_row`]'s arguments) equal the generic
    /// kernel's, each row read from its own storage alone and again with its first positions
    /// from the next row's (all but its last shared position where both rows have them).
    #[cfg(target_arch = "x86_64")]
    fn same_as_generic<T: Elem>(
        s: Shape,
        q: &[f32],
        k: &[T],
        v: &[T],
        lens: &[usize],
        name: &str,
        mut kernel: impl FnMut(Shape, &[f32], RowKv<'_, T>, usize, &mut [f32], &mut Vec<f32>),
    ) {
        let q_row = s.kv_heads * s.group * s.d;
        let c_row = s.kv_heads * s.capacity * s.d;
        let cache = |i: usize| {
            (
                &k[i * c_row..(i + 1) * c_row],
                &v[i * c_row..(i + 1) * c_row],
            )
        };
        let mut scratch = Vec::new();
        let (mut a, mut b) = (vec![0f32; q_row], vec![0f32; q_row]);
        for (i, &n) in lens.iter().enumerate() {
            let qi = &q[i * q_row..(i + 1) * q_row];
            let (ki, vi) = cache(i);
            let src = (i + 1) % lens.len();
            let (sk, sv) = cache(src);
            let shared = RowKv {
                shared_k: sk,
                shared_v: sv,
                m: n.min(lens[src]).saturating_sub(1),
                ..RowKv::own(ki, vi)
            };
            for kv in [RowKv::own(ki, vi), shared] {
                attend_row(s, qi, kv, n, &mut a, &mut scratch);
                b.fill(f32::NAN);
                kernel(s, qi, kv, n, &mut b, &mut scratch);
                let diff = a
                    .iter()
                    .zip(&b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0f32, |m, x| if x > m || x.is_nan() { x } else { m });
                assert!(
                    diff < 1e-5,
                    "{name}: d {}, group {}, row {i}, {} shared: {diff}",
                    s.d,
                    s.group,
                    kv.m
                );
            }
        }
    }

    /// The cost is the kernel's that runs: under either SIMD kernel a bf16 cache (3/5) and an
    /// f32 one (4/5) are weighed as cheaper per position than libtorch's kernel; a shape
    /// neither takes and a CPU with neither keep 6/5.
    #[test]
    fn the_cost_weighs_the_kernel_that_runs() {
        assert_eq!(
            relative_cost(Kind::BFloat16, 16, 3),
            (6, 5),
            "a shape it does not take"
        );
        #[cfg(target_arch = "x86_64")]
        let (avx512, avx2) = (
            std::arch::is_x86_feature_detected!("avx512f"),
            has_avx2_fma(),
        );
        #[cfg(not(target_arch = "x86_64"))]
        let (avx512, avx2) = (false, false);
        let (want_f32, want_bf16) = if avx512 || avx2 {
            ((4, 5), (3, 5))
        } else {
            ((6, 5), (6, 5))
        };
        assert_eq!(relative_cost(Kind::Float, 64, 2), want_f32);
        assert_eq!(relative_cost(Kind::BFloat16, 64, 2), want_bf16);
    }

    /// Milliseconds per call over 32 rows of 2,048 positions (one layer of the smoke model's
    /// shape), f32 and bf16, one thread, each row reading its own positions, and again with the
    /// first 760 of rows 1-31 read from row 0 (a `guided` prompt, BENCHMARKS.md issue 25 session
    /// 85): `cargo test --release -p trainer --lib row_attention -- --ignored --nocapture`.
    #[test]
    #[ignore = "a timing, not a check"]
    fn timing() {
        let _rng = crate::model::rng_lock();
        let (rows, kvh, g, d, cap) = (32_i64, 2_i64, 2_i64, 64_i64, 2048_i64);
        for kind in [Kind::Float, Kind::BFloat16] {
            let k = Tensor::randn([rows, kvh, cap, d], (kind, Device::Cpu));
            let v = Tensor::randn([rows, kvh, cap, d], (kind, Device::Cpu));
            let q = Tensor::randn([rows, kvh, g, d], (kind, Device::Cpu));
            let lens = vec![2048_usize; 32];
            let prompt: Vec<(usize, usize)> = (0..32)
                .map(|i| if i == 0 { (0, 0) } else { (0, 760) })
                .collect();
            // Blocks of 10 calls, the two ways alternating; the median block of 9 each.
            let block = |shared: &[(usize, usize)]| {
                let t0 = std::time::Instant::now();
                for _ in 0..10 {
                    let _ = decode_rows_on(&q, &k, &v, &lens, shared, 1).unwrap();
                }
                t0.elapsed().as_secs_f64() * 1e3 / 10.0
            };
            let (mut own, mut one) = (Vec::new(), Vec::new());
            for _ in 0..9 {
                own.push(block(&[]));
                one.push(block(&prompt));
            }
            let median = |mut x: Vec<f64>| {
                x.sort_by(f64::total_cmp);
                x[x.len() / 2]
            };
            let (ms, from_one) = (median(own), median(one));
            let t0 = std::time::Instant::now();
            for _ in 0..20 {
                let _ = Tensor::scaled_dot_product_attention(
                    &q,
                    &k,
                    &v,
                    None::<Tensor>,
                    0.0,
                    false,
                    None,
                    true,
                );
            }
            let sdpa = t0.elapsed().as_secs_f64() * 1e3 / 20.0;
            println!(
                "{kind:?}: rows {ms:.2} ms, rows sharing a 760-position prompt {from_one:.2} ms \
                 ({:.2}x), sdpa {sdpa:.2} ms",
                ms / from_one
            );
        }
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
        assert!(decode_rows(&q.to_kind(Kind::Half), &k, &k, &[1, 1], &[]).is_none());
        let kh = k.to_kind(Kind::Half);
        assert!(
            decode_rows(&q, &kh, &kh, &[1, 1], &[]).is_none(),
            "an f16 cache"
        );
        let kb = k.to_kind(Kind::BFloat16);
        assert!(
            decode_rows(&q, &kb, &k, &[1, 1], &[]).is_none(),
            "keys and values apart"
        );
        let strided = k.transpose(2, 3).contiguous().transpose(2, 3);
        assert_eq!(strided.size(), k.size());
        assert!(
            decode_rows(&q, &strided, &k, &[1, 1], &[]).is_none(),
            "not contiguous"
        );
        let q_grad = q.copy().set_requires_grad(true);
        assert!(
            decode_rows(&q_grad, &k, &k, &[1, 1], &[]).is_none(),
            "records gradients"
        );
        assert!(
            decode_rows(&q, &k, &k, &[1, 9], &[]).is_none(),
            "a length past the capacity"
        );
        assert!(
            decode_rows(&q, &k, &k, &[1], &[]).is_none(),
            "a length per row"
        );
        assert!(decode_rows(&q, &k, &k, &[1, 8], &[]).is_some());
    }
}
