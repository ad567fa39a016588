// Exact causal attention of a CPU training step in bf16, forward and backward (see kernels.h,
// rtorch_causal_attention). libtorch's CPU flash kernel computes its 256 x 512 blocks whole
// across the diagonal and, on CPUs without AMX, runs their bf16 products through MKL's default
// GEMM (bf16 converted to f32 for an f32 kernel); this one computes, for strips of 48 queries,
// only the 256-key chunks the strip sees, with the products on AVX512-BF16 dot products
// (vdpbf16ps: pairs of bf16 multiplied and summed into f32) where the CPU has them, and a
// portable path of the same arithmetic elsewhere (slow; tests run it on every CPU).
//
// Layout. Every product is C[rows][64 columns] (+)= A[rows][2P] . B[P][64][2]: A's rows are
// row-major bf16, B is packed so that one 64-byte vector holds 16 columns' pair (B[p][c][0],
// B[p][c][1]), and each A pair is broadcast as one 32-bit value. Scores (Q K^T, dO V^T) take
// the keys as columns (pack_cols); the products that sum over keys or queries (P V, dS K,
// dS^T Q, P^T dO) take 64 dimensions as columns and pairs of rows (pack_rows).
//
// Softmax: the forward is online over chunks (flash attention's rescaled accumulators, Dao
// et al. 2022); the backward recomputes P from the saved log-sum-exp and uses
// dS = P * (dP - rowsum(dO * O)) * scale. P and dS are rounded to bf16 before their products,
// as libtorch's flash kernel rounds P.

#include "kernels.h"
#include "c10d_types.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <immintrin.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#define RATTN_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace {

using bf16 = uint16_t;
constexpr int64_t kCols = 64;         // columns of one product tile (4 vectors of 16 floats)
constexpr int64_t kPair = 2 * kCols;  // bf16 values of one packed pair row
constexpr int64_t kStrip = 48;        // queries a strip holds (even: pairs of queries)
constexpr int64_t kChunk = 256;       // keys a chunk holds (a multiple of kCols)
constexpr int kRows = 6;              // rows of one product tile (24 accumulators)

float bf2f(bf16 x) {
  const uint32_t u = uint32_t(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as at::BFloat16 and vcvtneps2bf16 do.
bf16 f2bf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return 0x7fc0;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16(u >> 16);
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Rows x [n][d] (row stride d) as the columns of a score product, in tiles of 64 rows:
// out[((t * d/2 + p) * 64 + j) * 2 + e] = x[t * 64 + j][2p + e], zero past row n.
// Holds round_up(n, 64) * d values.
void pack_cols(const bf16* x, int64_t n, int64_t d, bf16* out) {
  const int64_t tiles = round_up(n, kCols) / kCols, pairs = d / 2;
  for (int64_t t = 0; t < tiles; ++t) {
    for (int64_t p = 0; p < pairs; ++p) {
      bf16* o = out + (t * pairs + p) * kPair;
      for (int64_t j = 0; j < kCols; ++j) {
        const int64_t r = t * kCols + j;
        o[2 * j] = r < n ? x[r * d + 2 * p] : 0;
        o[2 * j + 1] = r < n ? x[r * d + 2 * p + 1] : 0;
      }
    }
  }
}

// Rows x [n][d] as the right operand of a product summing over them: for each tile of 64
// dimensions, each pair of rows: out[((dt * pn + r) * 64 + c) * 2 + e] = x[2r + e][dt * 64 + c],
// pn = ceil(n / 2), zero past row n. Holds pn * 2 * d values.
void pack_rows(const bf16* x, int64_t n, int64_t d, bf16* out) {
  const int64_t pn = (n + 1) / 2;
  for (int64_t dt = 0; dt < d / kCols; ++dt) {
    for (int64_t r = 0; r < pn; ++r) {
      bf16* o = out + (dt * pn + r) * kPair;
      const bf16* a = x + 2 * r * d + dt * kCols;
      const bool second = 2 * r + 1 < n;
      for (int64_t c = 0; c < kCols; ++c) {
        o[2 * c] = a[c];
        o[2 * c + 1] = second ? a[d + c] : 0;
      }
    }
  }
}

// c[r][0..64) (+)= sum over p < np of a[r][2p] b[p][.][0] + a[r][2p+1] b[p][.][1], r < R.
using TileFn = void (*)(const bf16* a, int64_t lda, int64_t np, const bf16* b, float* c,
                        int64_t ldc, bool acc);

template <int R>
void tile_portable(const bf16* a, int64_t lda, int64_t np, const bf16* b, float* c, int64_t ldc,
                   bool acc) {
  float t[R][kCols];
  for (int r = 0; r < R; ++r) {
    for (int64_t j = 0; j < kCols; ++j) {
      t[r][j] = acc ? c[r * ldc + j] : 0.f;
    }
  }
  for (int64_t p = 0; p < np; ++p) {
    const bf16* bp = b + p * kPair;
    for (int r = 0; r < R; ++r) {
      const float a0 = bf2f(a[r * lda + 2 * p]), a1 = bf2f(a[r * lda + 2 * p + 1]);
      for (int64_t j = 0; j < kCols; ++j) {
        t[r][j] += a0 * bf2f(bp[2 * j]) + a1 * bf2f(bp[2 * j + 1]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    std::memcpy(c + r * ldc, t[r], sizeof(t[r]));
  }
}

template <int R>
RATTN_AVX512 void tile_avx512(const bf16* a, int64_t lda, int64_t np, const bf16* b, float* c,
                              int64_t ldc, bool acc) {
  __m512 c0[R], c1[R], c2[R], c3[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    if (acc) {
      c0[r] = _mm512_loadu_ps(c + r * ldc);
      c1[r] = _mm512_loadu_ps(c + r * ldc + 16);
      c2[r] = _mm512_loadu_ps(c + r * ldc + 32);
      c3[r] = _mm512_loadu_ps(c + r * ldc + 48);
    } else {
      c0[r] = c1[r] = c2[r] = c3[r] = _mm512_setzero_ps();
    }
  }
  for (int64_t p = 0; p < np; ++p) {
    const bf16* bp = b + p * kPair;
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + 32);
    const __m512bh b2 = (__m512bh)_mm512_loadu_si512(bp + 64);
    const __m512bh b3 = (__m512bh)_mm512_loadu_si512(bp + 96);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + r * lda + 2 * p, 4);
      const __m512bh x = (__m512bh)_mm512_set1_epi32(pair);
      c0[r] = _mm512_dpbf16_ps(c0[r], x, b0);
      c1[r] = _mm512_dpbf16_ps(c1[r], x, b1);
      c2[r] = _mm512_dpbf16_ps(c2[r], x, b2);
      c3[r] = _mm512_dpbf16_ps(c3[r], x, b3);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(c + r * ldc, c0[r]);
    _mm512_storeu_ps(c + r * ldc + 16, c1[r]);
    _mm512_storeu_ps(c + r * ldc + 32, c2[r]);
    _mm512_storeu_ps(c + r * ldc + 48, c3[r]);
  }
}

// The softmax's row passes. `vis` of a row's scores are visible (the rest are masked out);
// outputs are written up to `n`, zero past `vis`.
struct Isa {
  TileFn tile[kRows + 1];  // by rows, 1..kRows
  // max of s[0..vis), vis >= 1
  float (*max_row)(const float* s, int64_t vis);
  // p[j] = bf16(exp(s[j] * scale - m)), j < vis; returns the sum of the unrounded exps
  float (*exp_row)(const float* s, int64_t vis, int64_t n, float scale, float m, bf16* p);
  // p = exp(s * scale - lse), ds = p * (dp - di) * scale, j < vis
  void (*grad_row)(const float* s, const float* dp, int64_t vis, int64_t n, float scale,
                   float lse, float di, bf16* p, bf16* ds);
  // xT[j][i] = x[i][j] for j < ck, i < round_up(rows, 2) (zero past rows): x's rows kChunk
  // apart, xT's kStrip apart, so that a key's pairs of queries lie side by side.
  void (*transpose)(const bf16* x, int64_t rows, int64_t ck, bf16* xT);
};

float max_row_portable(const float* s, int64_t vis) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < vis; ++j) {
    m = std::max(m, s[j]);
  }
  return m;
}

float exp_row_portable(const float* s, int64_t vis, int64_t n, float scale, float m, bf16* p) {
  float sum = 0.f;
  int64_t j = 0;
  for (; j < vis; ++j) {
    const float e = std::exp(s[j] * scale - m);
    sum += e;
    p[j] = f2bf(e);
  }
  for (; j < n; ++j) {
    p[j] = 0;
  }
  return sum;
}

void grad_row_portable(const float* s, const float* dp, int64_t vis, int64_t n, float scale,
                       float lse, float di, bf16* p, bf16* ds) {
  int64_t j = 0;
  for (; j < vis; ++j) {
    const float e = std::exp(s[j] * scale - lse);
    p[j] = f2bf(e);
    ds[j] = f2bf(e * (dp[j] - di) * scale);
  }
  for (; j < n; ++j) {
    p[j] = ds[j] = 0;
  }
}

void transpose_portable(const bf16* x, int64_t rows, int64_t ck, bf16* xT) {
  for (int64_t j = 0; j < ck; ++j) {
    for (int64_t i = 0; i < round_up(rows, 2); ++i) {
      xT[j * kStrip + i] = i < rows ? x[i * kChunk + j] : 0;
    }
  }
}

// exp on 16 lanes: 2^n e^r with |r| <= ln2/2 (Cody-Waite split of ln2), e^r by its Taylor
// polynomial of degree 7 (relative error below 1e-8), 2^n by vscalefps. Inputs below -87
// give exp(-87) ~ 1.6e-38, not 0: the callers mask what must be 0.
RATTN_AVX512 inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.f)), _mm512_set1_ps(88.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.f / 5040);
  for (const float c : {1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f}) {
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  }
  return _mm512_scalef_ps(p, n);
}

RATTN_AVX512 inline __mmask16 lanes(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1u);
}

// Stores 16 floats as bf16 (vcvtneps2bf16).
RATTN_AVX512 inline void store_bf16(bf16* p, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(x));
}

RATTN_AVX512 float max_row_avx512(const float* s, int64_t vis) {
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < vis; j += 16) {
    const __mmask16 k = lanes(vis - j);
    m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, s + j));
  }
  return _mm512_reduce_max_ps(m);
}

// Writes whole vectors: p has room up to round_up(vis, 16) and n.
RATTN_AVX512 float exp_row_avx512(const float* s, int64_t vis, int64_t n, float scale, float m,
                                  bf16* p) {
  const __m512 vs = _mm512_set1_ps(scale), vm = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j < vis; j += 16) {
    const __mmask16 k = lanes(vis - j);
    const __m512 e =
        _mm512_maskz_mov_ps(k, exp16(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(k, s + j), vs, vm)));
    sum = _mm512_add_ps(sum, e);
    store_bf16(p + j, e);
  }
  for (; j < n; ++j) {
    p[j] = 0;
  }
  return _mm512_reduce_add_ps(sum);
}

RATTN_AVX512 void grad_row_avx512(const float* s, const float* dp, int64_t vis, int64_t n,
                                  float scale, float lse, float di, bf16* p, bf16* ds) {
  const __m512 vs = _mm512_set1_ps(scale), vl = _mm512_set1_ps(lse), vd = _mm512_set1_ps(di);
  int64_t j = 0;
  for (; j < vis; j += 16) {
    const __mmask16 k = lanes(vis - j);
    const __m512 e =
        _mm512_maskz_mov_ps(k, exp16(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(k, s + j), vs, vl)));
    const __m512 g = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dp + j), vd);
    store_bf16(p + j, e);
    store_bf16(ds + j, _mm512_mul_ps(_mm512_mul_ps(e, g), vs));
  }
  for (; j < n; ++j) {
    p[j] = ds[j] = 0;
  }
}

// A pair of rows at a time: 16 keys' (x[i][j], x[i+1][j]) as 16 dwords, scattered kStrip
// values apart.
RATTN_AVX512 void transpose_avx512(const bf16* x, int64_t rows, int64_t ck, bf16* xT) {
  const __m512i apart = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6,
                                                            5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32(kStrip / 2));
  for (int64_t i = 0; i < rows; i += 2) {
    const bf16* a = x + i * kChunk;
    for (int64_t j = 0; j < ck; j += 16) {
      const __mmask16 k = lanes(ck - j);
      const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, a + j));
      const __m512i hi = i + 1 < rows
                             ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, a + kChunk + j))
                             : _mm512_setzero_si512();
      _mm512_mask_i32scatter_epi32(xT + j * kStrip + i, k, apart,
                                   _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)), 4);
    }
  }
}

const Isa kPortable = {
    {nullptr, tile_portable<1>, tile_portable<2>, tile_portable<3>, tile_portable<4>,
     tile_portable<5>, tile_portable<6>},
    max_row_portable,
    exp_row_portable,
    grad_row_portable,
    transpose_portable,
};

const Isa kAvx512 = {
    {nullptr, tile_avx512<1>, tile_avx512<2>, tile_avx512<3>, tile_avx512<4>, tile_avx512<5>,
     tile_avx512<6>},
    max_row_avx512,
    exp_row_avx512,
    grad_row_avx512,
    transpose_avx512,
};

bool have_avx512_bf16() {
  static const bool yes = __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bf16");
  return yes;
}

// c[0..rows) (+)= a[0..rows) . b, in tiles of kRows rows.
void product(const Isa& isa, const bf16* a, int64_t lda, int64_t rows, int64_t np,
             const bf16* b, float* c, int64_t ldc, bool acc) {
  for (int64_t r = 0; r < rows; r += kRows) {
    const int64_t n = std::min<int64_t>(kRows, rows - r);
    isa.tile[n](a + r * lda, lda, np, b, c + r * ldc, ldc, acc);
  }
}

// One batch row and key/value head: its g query heads, t queries each at positions past..,
// over n = past + t keys. Pointers are to the unit's first head; heads lie t * d apart.
struct Unit {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  int64_t g, t, past, d;
  float scale;
  int64_t n() const { return past + t; }
  // Keys query i (0-based among the t) sees in the chunk from c0 on, of at most ck.
  int64_t visible(int64_t i, int64_t c0, int64_t ck) const {
    return std::clamp<int64_t>(past + i + 1 - c0, 0, ck);
  }
};

// Scores of `rows` queries (a, row stride d) over the keys c0..c0+ck: s [rows][kChunk].
void scores(const Isa& isa, const Unit& u, const bf16* a, int64_t rows, const bf16* cols,
            int64_t c0, int64_t ck, float* s) {
  for (int64_t kt = 0; kt < round_up(ck, kCols) / kCols; ++kt) {
    product(isa, a, u.d, rows, u.d / 2, cols + (c0 / kCols + kt) * (u.d / 2) * kPair,
            s + kt * kCols, kChunk, false);
  }
}

// acc [rows][d] += a [rows][kChunk] (np pairs of keys from c0) . rows-packed b (pn pairs).
void sum_keys(const Isa& isa, const Unit& u, const bf16* a, int64_t rows, int64_t np,
              const bf16* b, int64_t pn, int64_t c0, float* acc) {
  for (int64_t dt = 0; dt < u.d / kCols; ++dt) {
    product(isa, a, kChunk, rows, np, b + (dt * pn + c0 / 2) * kPair, acc + dt * kCols, u.d,
            true);
  }
}

void forward_unit(const Isa& isa, const Unit& u, bf16* o, float* lse) {
  const int64_t n = u.n(), d = u.d, pn = (n + 1) / 2;
  std::vector<bf16> kc(round_up(n, kCols) * d), vr(pn * 2 * d);
  pack_cols(u.k, n, d, kc.data());
  pack_rows(u.v, n, d, vr.data());
  std::vector<float> s(kStrip * kChunk), acc(kStrip * d), m(kStrip), l(kStrip);
  std::vector<bf16> p(kStrip * kChunk);
  for (int64_t h = 0; h < u.g; ++h) {
    const bf16* q = u.q + h * u.t * d;
    for (int64_t r0 = 0; r0 < u.t; r0 += kStrip) {
      const int64_t rows = std::min(kStrip, u.t - r0), e = u.past + r0 + rows;
      std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.end(), 0.f);
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t c0 = 0; c0 < e; c0 += kChunk) {
        const int64_t ck = std::min(kChunk, e - c0), ckp = round_up(ck, 2);
        scores(isa, u, q + r0 * d, rows, kc.data(), c0, ck, s.data());
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t vis = u.visible(r0 + i, c0, ck);
          float* si = s.data() + i * kChunk;
          const float mx = vis > 0 ? isa.max_row(si, vis) * u.scale : m[i];
          const float mn = std::max(m[i], mx);
          const float alpha = std::exp(m[i] - mn);
          l[i] = l[i] * alpha + isa.exp_row(si, vis, ckp, u.scale, mn, p.data() + i * kChunk);
          m[i] = mn;
          if (alpha != 1.f) {
            for (int64_t j = 0; j < d; ++j) {
              acc[i * d + j] *= alpha;
            }
          }
        }
        sum_keys(isa, u, p.data(), rows, ckp / 2, vr.data(), pn, c0, acc.data());
      }
      for (int64_t i = 0; i < rows; ++i) {
        const float inv = 1.f / l[i];
        for (int64_t j = 0; j < d; ++j) {
          o[(h * u.t + r0 + i) * d + j] = f2bf(acc[i * d + j] * inv);
        }
        lse[h * u.t + r0 + i] = m[i] + std::log(l[i]);
      }
    }
  }
}

// dq [g][t][d] of the unit's heads; dk, dv [n][d] of its key/value head.
void backward_unit(const Isa& isa, const Unit& u, const bf16* o, const bf16* dout,
                   const float* lse, bf16* dq, bf16* dk, bf16* dv) {
  const int64_t n = u.n(), d = u.d, pn = (n + 1) / 2, pt = (u.t + 1) / 2;
  std::vector<bf16> kc(round_up(n, kCols) * d), vc(round_up(n, kCols) * d), kr(pn * 2 * d);
  pack_cols(u.k, n, d, kc.data());
  pack_cols(u.v, n, d, vc.data());
  pack_rows(u.k, n, d, kr.data());
  std::vector<bf16> qr(pt * 2 * d), dor(pt * 2 * d);
  std::vector<float> dka(n * d, 0.f), dva(n * d, 0.f), dqa(kStrip * d), di(kStrip);
  std::vector<float> s(kStrip * kChunk), dp(kStrip * kChunk);
  std::vector<bf16> p(kStrip * kChunk), ds(kStrip * kChunk), pT(kChunk * kStrip),
      dsT(kChunk * kStrip);
  for (int64_t h = 0; h < u.g; ++h) {
    const bf16* q = u.q + h * u.t * d;
    const bf16* go = dout + h * u.t * d;
    const bf16* oh = o + h * u.t * d;
    pack_rows(q, u.t, d, qr.data());
    pack_rows(go, u.t, d, dor.data());
    for (int64_t r0 = 0; r0 < u.t; r0 += kStrip) {
      const int64_t rows = std::min(kStrip, u.t - r0), e = u.past + r0 + rows;
      const int64_t rp = round_up(rows, 2);
      for (int64_t i = 0; i < rows; ++i) {
        float sum = 0.f;
        for (int64_t j = 0; j < d; ++j) {
          sum += bf2f(go[(r0 + i) * d + j]) * bf2f(oh[(r0 + i) * d + j]);
        }
        di[i] = sum;
      }
      std::fill(dqa.begin(), dqa.end(), 0.f);
      for (int64_t c0 = 0; c0 < e; c0 += kChunk) {
        const int64_t ck = std::min(kChunk, e - c0), ckp = round_up(ck, 2);
        scores(isa, u, q + r0 * d, rows, kc.data(), c0, ck, s.data());
        scores(isa, u, go + r0 * d, rows, vc.data(), c0, ck, dp.data());
        for (int64_t i = 0; i < rows; ++i) {
          isa.grad_row(s.data() + i * kChunk, dp.data() + i * kChunk, u.visible(r0 + i, c0, ck),
                       ckp, u.scale, lse[h * u.t + r0 + i], di[i], p.data() + i * kChunk,
                       ds.data() + i * kChunk);
        }
        sum_keys(isa, u, ds.data(), rows, ckp / 2, kr.data(), pn, c0, dqa.data());
        // The keys' gradients sum over the strip's queries: P and dS transposed, a key a row.
        isa.transpose(p.data(), rows, ck, pT.data());
        isa.transpose(ds.data(), rows, ck, dsT.data());
        for (int64_t dt = 0; dt < d / kCols; ++dt) {
          const int64_t at = (dt * pt + r0 / 2) * kPair;
          product(isa, dsT.data(), kStrip, ck, rp / 2, qr.data() + at,
                  dka.data() + c0 * d + dt * kCols, d, true);
          product(isa, pT.data(), kStrip, ck, rp / 2, dor.data() + at,
                  dva.data() + c0 * d + dt * kCols, d, true);
        }
      }
      for (int64_t i = 0; i < rows * d; ++i) {
        dq[(h * u.t + r0) * d + i] = f2bf(dqa[i]);
      }
    }
  }
  for (int64_t i = 0; i < n * d; ++i) {
    dk[i] = f2bf(dka[i]);
    dv[i] = f2bf(dva[i]);
  }
}

const Isa& isa_for(bool portable) {
  return !portable && have_avx512_bf16() ? kAvx512 : kPortable;
}

const bf16* ptr(const at::Tensor& x) {
  return reinterpret_cast<const bf16*>(x.const_data_ptr<at::BFloat16>());
}

bf16* mut(at::Tensor& x) { return reinterpret_cast<bf16*>(x.mutable_data_ptr<at::BFloat16>()); }

// q [B, H, T, D], k, v [B, Hkv, past + T, D], contiguous bf16 CPU tensors.
std::tuple<at::Tensor, at::Tensor> run_forward(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, int64_t past, bool portable) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3), hkv = k.size(1);
  const int64_t g = h / hkv, n = past + t;
  auto o = at::empty_like(q);
  auto lse = at::empty({b, h, t}, q.options().dtype(at::kFloat));
  const Isa& isa = isa_for(portable);
  const float scale = 1.f / std::sqrt(float(d));
  at::parallel_for(0, b * hkv, 1, [&](int64_t begin, int64_t end) {
    for (int64_t x = begin; x < end; ++x) {
      const Unit u{ptr(q) + x * g * t * d, ptr(k) + x * n * d, ptr(v) + x * n * d, g, t, past, d,
                   scale};
      forward_unit(isa, u, mut(o) + x * g * t * d, lse.mutable_data_ptr<float>() + x * g * t);
    }
  });
  return {o, lse};
}

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t past) {
  auto shape = [](const at::Tensor& x) {
    std::string s = "[";
    for (int64_t i = 0; i < x.dim(); ++i) {
      s += (i ? ", " : "") + std::to_string(x.size(i));
    }
    return s + "]";
  };
  const std::string what = "queries " + shape(q) + ", keys " + shape(k) + ", values " +
                           shape(v) + ", past " + std::to_string(past) + ": ";
  for (const auto* x : {&q, &k, &v}) {
    if (x->dim() != 4 || x->scalar_type() != at::kBFloat16 || !x->device().is_cpu()) {
      throw std::invalid_argument(what + "bf16 CPU tensors [B, H, T, D] only");
    }
  }
  if (k.sizes() != v.sizes() || k.size(0) != q.size(0) || k.size(3) != q.size(3)) {
    throw std::invalid_argument(what + "keys and values must match the queries' B and D");
  }
  if (past < 0 || q.size(2) < 1 || k.size(2) != past + q.size(2)) {
    throw std::invalid_argument(what + "the keys must hold past + T positions, T >= 1");
  }
  if (k.size(1) < 1 || q.size(1) % k.size(1) != 0) {
    throw std::invalid_argument(what + "query heads must be a multiple of key heads");
  }
  if (q.size(3) < kCols || q.size(3) % kCols != 0) {
    throw std::invalid_argument(what + "the head dimension must be a multiple of 64");
  }
}

struct CausalBf16 : public torch::autograd::Function<CausalBf16> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, int64_t past,
                            bool portable) {
    auto qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
    auto [o, lse] = run_forward(qc, kc, vc, past, portable);
    ctx->save_for_backward({qc, kc, vc, o, lse});
    ctx->saved_data["past"] = past;
    ctx->saved_data["portable"] = portable;
    return o;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (!grads[0].defined()) {
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    auto s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &k = s[1], &v = s[2], &o = s[3], &lse = s[4];
    const int64_t past = ctx->saved_data["past"].toInt();
    const Isa& isa = isa_for(ctx->saved_data["portable"].toBool());
    auto go = grads[0].to(at::kBFloat16).contiguous();
    const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3), hkv = k.size(1);
    const int64_t g = h / hkv, n = past + t;
    auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
    const float scale = 1.f / std::sqrt(float(d));
    at::parallel_for(0, b * hkv, 1, [&](int64_t begin, int64_t end) {
      for (int64_t x = begin; x < end; ++x) {
        const int64_t qo = x * g * t * d, ko = x * n * d;
        const Unit u{ptr(q) + qo, ptr(k) + ko, ptr(v) + ko, g, t, past, d, scale};
        backward_unit(isa, u, ptr(o) + qo, ptr(go) + qo, lse.const_data_ptr<float>() + x * g * t,
                      mut(dq) + qo, mut(dk) + ko, mut(dv) + ko);
      }
    });
    return {dq, dk, dv, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" int rtorch_causal_attention_fast(void) { return have_avx512_bf16() ? 1 : 0; }

extern "C" char* rtorch_causal_attention(void* q, void* k, void* v, int64_t past, int portable,
                                         void** out) {
  return rc10d::guard([&] {
    if (out == nullptr) {
      throw std::invalid_argument("null output slot");
    }
    const auto& qt = rc10d::tensor(q, "query");
    const auto& kt = rc10d::tensor(k, "key");
    const auto& vt = rc10d::tensor(v, "value");
    check(qt, kt, vt, past);
    auto y = CausalBf16::apply(qt, kt, vt, past, portable != 0);
    *out = new at::Tensor(std::move(y));
  });
}
