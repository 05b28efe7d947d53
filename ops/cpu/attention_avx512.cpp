// AVX-512 attention for one (query token, KV head group) task of kern::attention (compiled with
// the AVX-512 flags, selected at run time; see kernels.cpp). Per task: the group's scores against
// the n_ctx cached keys, scale, softmax (vectorized e^x), then the probability-weighted sum of
// the values.
//  - Scores in register blocks of 16 outputs (4 heads x 4 keys; 2 x 8 or 1 x 16 for small groups):
//    per 16 key dimensions NH + NS loads feed 16 FMAs, then one transposing add tree turns the 16
//    accumulators into the 16 dot products.
//  - Values: blocks of NH heads x NJ vectors of 16 output dimensions (NH x NJ = 16 accumulators),
//    over chunks of kChunk keys whose values stay in L2 while every block passes over them; each
//    output is one FMA chain over the keys in order.
// Every output depends only on its own query, the keys and the values, never on which tokens share
// the call: a token computes the same bits in a prefill batch and alone in decode.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/cpu/kern_gguf.h"
#include "ops/cpu/ref_ops.h"  // AttentionArgs

namespace tandem::kern::detail {
namespace {

// out[i] = the sum of v[i]'s 16 lanes, i = 0..15 (unpack / shuffle tree, 4 levels).
inline __m512 sum16(const __m512* v) {
  __m512 a[8], b[4];
  for (int i = 0; i < 8; ++i) {
    a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  // b[i], 128-bit lane k: the sums of lane k's four floats of v[4i..4i+3].
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
    b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const __m512 c0 =
      _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], 0x88), _mm512_shuffle_f32x4(b[0], b[1], 0xDD));
  const __m512 c1 =
      _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], 0x88), _mm512_shuffle_f32x4(b[2], b[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(c0, c1, 0x88), _mm512_shuffle_f32x4(c0, c1, 0xDD));
}

// out[h * NS + s] = dot(q[h], k[s]) over dk values, the NH query rows packed step-major
// (qp[step * NH + h]: row h's values 16 * step .. 16 * step + 15, zero past dk): one pointer for
// every row, so the loop keeps its addresses in registers (with a pointer per row the scores ran
// ~20% slower: BM_MlaDecodePhase). A zero-padded tail gives what masked loads of q gave. (qk_block
// and pv_block are forced inline: called from score_keys / value_dims, GCC kept them out of line
// and the decode step ran 1.5x slower.)
template <int NH, int NS>
__attribute__((always_inline)) inline void qk_block(const __m512* qp, const float* const* k,
                                                    int64_t dk, float* out) {
  static_assert(NH * NS == 16);
  __m512 acc[16];
  for (__m512& x : acc) x = _mm512_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= dk; d += 16, qp += NH) {
    __m512 kv[NS];
    for (int s = 0; s < NS; ++s) kv[s] = _mm512_loadu_ps(k[s] + d);
    for (int h = 0; h < NH; ++h) {
      for (int s = 0; s < NS; ++s) acc[h * NS + s] = _mm512_fmadd_ps(qp[h], kv[s], acc[h * NS + s]);
    }
  }
  if (d < dk) {
    const __mmask16 m = static_cast<__mmask16>((1u << (dk - d)) - 1);
    __m512 kv[NS];
    for (int s = 0; s < NS; ++s) kv[s] = _mm512_maskz_loadu_ps(m, k[s] + d);
    for (int h = 0; h < NH; ++h) {
      for (int s = 0; s < NS; ++s) acc[h * NS + s] = _mm512_fmadd_ps(qp[h], kv[s], acc[h * NS + s]);
    }
  }
  _mm512_storeu_ps(out, sum16(acc));
}

// out[h][j0 + ...] continues acc = fma(p[h][s], v[s][j], acc) over s in [s0, s1), for the NJ * 16
// dimensions from j0 (mask m[z] for vector z).
template <int NH, int NJ>
__attribute__((always_inline)) inline void pv_block(const float* const* p, const float* v,
                                                    int64_t v_stride, int64_t s0, int64_t s1,
                                                    int64_t j0, const __mmask16* m,
                                                    float* const* out) {
  static_assert(NH * NJ == 16);
  __m512 acc[NH][NJ];
  for (int h = 0; h < NH; ++h) {
    for (int z = 0; z < NJ; ++z) acc[h][z] = _mm512_maskz_loadu_ps(m[z], out[h] + j0 + 16 * z);
  }
  for (int64_t s = s0; s < s1; ++s) {
    const float* vr = v + s * v_stride + j0;
    __m512 vv[NJ];
    for (int z = 0; z < NJ; ++z) vv[z] = _mm512_maskz_loadu_ps(m[z], vr + 16 * z);
    for (int h = 0; h < NH; ++h) {
      const __m512 ph = _mm512_set1_ps(p[h][s]);
      for (int z = 0; z < NJ; ++z) acc[h][z] = _mm512_fmadd_ps(ph, vv[z], acc[h][z]);
    }
  }
  for (int h = 0; h < NH; ++h) {
    for (int z = 0; z < NJ; ++z) _mm512_mask_storeu_ps(out[h] + j0 + 16 * z, m[z], acc[h][z]);
  }
}

// e^x for x <= 0 (Cephes expf: x = n ln2 + r, |r| <= ln2 / 2, degree-6 polynomial, times 2^n by
// vscalefps; within 2 ulp of std::exp; below -88 it underflows to 0 as std::exp does).
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

}  // namespace

// x[i] = softmax(scale * x)[i] (ops::softmax after the scaling, vectorized).
void softmax_scaled_avx512(float* x, int64_t n, float scale) {
  const __m512 sv = _mm512_set1_ps(scale);
  __m512 mx = _mm512_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), sv);
    _mm512_storeu_ps(x + i, v);
    mx = _mm512_max_ps(mx, v);
  }
  const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1);
  if (i < n) {
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, x + i), sv);
    _mm512_mask_storeu_ps(x + i, tail, v);
    mx = _mm512_mask_max_ps(mx, tail, mx, v);
  }
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(x + i), m));
    _mm512_storeu_ps(x + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (i < n) {
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + i), m));
    _mm512_mask_storeu_ps(x + i, tail, e);
    sum = _mm512_mask_add_ps(sum, tail, sum, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
  for (i = 0; i + 16 <= n; i += 16)
    _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
  if (i < n)
    _mm512_mask_storeu_ps(x + i, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, x + i), inv));
}

namespace {

constexpr int64_t kChunk = 64;  // keys per pass of the value blocks (64 x dv floats in L2)
constexpr int64_t kMaxRows = 256;  // query rows per rows_task call (every model's heads fit)

// The query rows of one task: they share the keys k0 and values v0 (rows a.k_stride / a.v_stride
// apart); row r attends to the first n_ctx[r] of them (ascending in r) and writes out[r].
struct Rows {
  const float* q[kMaxRows];
  int64_t n_ctx[kMaxRows];
  float* out[kMaxRows];
  int64_t n = 0;
};

// Rows [r0, r1) of a cache (rows `stride` floats apart from base), their first `floats` values,
// prefetched (every 64-byte line they touch).
inline void prefetch_rows(const float* base, int64_t stride, int64_t r0, int64_t r1,
                          int64_t floats) {
  for (int64_t r = r0; r < r1; ++r) {
    const char* p = reinterpret_cast<const char*>(base + r * stride);
    const char* end = p + floats * 4;
    for (; p < end; p += 64) _mm_prefetch(p, _MM_HINT_T0);
    _mm_prefetch(end - 1, _MM_HINT_T0);
  }
}

// Lines [l0, l1) (64 bytes each) of rows [r0, r1) of a cache (rows `stride` floats apart): the
// row blocks of a chunk prefetch the next chunk's keys between them, evenly over the chunk's time.
inline void prefetch_lines(const float* base, int64_t stride, int64_t r0, int64_t r1, int64_t l0,
                           int64_t l1) {
  for (int64_t r = r0; r < r1; ++r) {
    const char* p = reinterpret_cast<const char*>(base + r * stride);
    for (int64_t l = l0; l < l1; ++l) _mm_prefetch(p + 64 * l, _MM_HINT_T0);
  }
}

// The scores of rows (all with at least s_end keys) against keys [s_begin, s_end):
// scores[r * n_max + s]. Row blocks of NH (a short last block repeats its last row), key blocks of
// NS (a short last block repeats the last key); repeated outputs are dropped. Every output is its
// own accumulator and lane tree, whichever rows and keys share its block.
template <int NH>
void score_keys(const ops::AttentionArgs& a, const Rows& rows, const float* k0, int64_t n_max,
                int64_t s_begin, int64_t s_end, float* scores, bool prefetch) {
  constexpr int NS = 16 / NH;
  alignas(64) float blk[16];
  // The rows packed per block of NH (qk_block), a short last block repeating its last row.
  const int64_t steps = (a.dk + 15) / 16, blocks = (rows.n + NH - 1) / NH;
  thread_local std::vector<__m512> packed;
  packed.resize(static_cast<size_t>(blocks * steps * NH));
  for (int64_t b = 0; b < blocks; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* q = rows.q[std::min<int64_t>(b * NH + h, rows.n - 1)];
      for (int64_t st = 0; st < steps; ++st) {
        const int64_t left = a.dk - 16 * st;
        const __mmask16 m = left >= 16 ? static_cast<__mmask16>(0xFFFF)
                                       : static_cast<__mmask16>((1u << left) - 1);
        packed[static_cast<size_t>((b * steps + st) * NH + h)] =
            _mm512_maskz_loadu_ps(m, q + 16 * st);
      }
    }
  }
  // Each row block's share of a key's 64-byte lines to prefetch: lines share[b] .. share[b + 1]
  // (computed once per call, not with two divisions per block).
  const int64_t lines = (a.dk * 4 + 63) / 64;
  thread_local std::vector<int64_t> share;
  share.resize(static_cast<size_t>(blocks + 1));
  for (int64_t b = 0; b <= blocks; ++b) share[static_cast<size_t>(b)] = lines * b / blocks;
  // Key chunks outer: a chunk's keys stay in L2 while every row block passes over them, instead
  // of every row block streaming all the keys from L3 / DRAM.
  for (int64_t c0 = s_begin; c0 < s_end; c0 += kChunk) {
    const int64_t c1 = std::min(s_end, c0 + kChunk);
    for (int64_t h0 = 0; h0 < rows.n; h0 += NH) {
      const __m512* qp = packed.data() + (h0 / NH) * steps * NH;
      for (int64_t s0 = c0; s0 < c1; s0 += NS) {
        // The first row block brings the chunk in from L3 / DRAM: in decode it prefetches the next
        // chunk's keys as it goes (without, a long context read latency-bound; a prefill's keys
        // come from L2 / L3 for most of its tasks, where the prefetches only cost 5-10%).
        if (prefetch && s0 + kChunk < s_end) {
          const int64_t b = h0 / NH;
          prefetch_lines(k0, a.k_stride, s0 + kChunk, std::min(s_end, s0 + kChunk + NS),
                         share[b], share[b + 1]);
        }
        const float* k[NS];
        for (int s = 0; s < NS; ++s) k[s] = k0 + std::min(s0 + s, s_end - 1) * a.k_stride;
        qk_block<NH, NS>(qp, k, a.dk, blk);
        for (int h = 0; h < NH && h0 + h < rows.n; ++h) {
          for (int s = 0; s < NS && s0 + s < c1; ++s) {
            scores[(h0 + h) * n_max + s0 + s] = blk[h * NS + s];
          }
        }
      }
    }
  }
}

// Output dimensions [j_begin, j_end) of every row (j_begin a multiple of 16 * NJ, j_end one or
// dv): zeroed, then the probability-weighted sum of the values over n_max keys (probabilities
// scores[r * n_max + s]; 0 past a row's own n_ctx adds fma(0, v, acc) = acc). Each output is one
// FMA chain over the keys in order, whichever dimensions and rows share its block.
template <int NH>
void value_dims(const ops::AttentionArgs& a, const Rows& rows, const float* v0, int64_t n_max,
                const float* scores, int64_t j_begin, int64_t j_end, float* dummy,
                bool prefetch) {
  constexpr int NJ = 16 / NH;
  for (int64_t r = 0; r < rows.n; ++r) std::fill(rows.out[r] + j_begin, rows.out[r] + j_end, 0.0f);
  // Key chunks outer, so a chunk's rows stay in cache for every (row, dim) block.
  for (int64_t c0 = 0; c0 < n_max; c0 += kChunk) {
    const int64_t c1 = std::min(n_max, c0 + kChunk);
    for (int64_t h0 = 0; h0 < rows.n; h0 += NH) {
      const float* p[NH];
      float* out[NH];
      for (int h = 0; h < NH; ++h) {
        const int64_t hh = std::min<int64_t>(h0 + h, rows.n - 1);
        p[h] = scores + hh * n_max;
        out[h] = h0 + h < rows.n ? rows.out[hh] : dummy;
      }
      for (int64_t j0 = j_begin; j0 < j_end; j0 += 16 * NJ) {
        __mmask16 m[NJ];
        for (int z = 0; z < NJ; ++z) {
          const int64_t left = j_end - j0 - 16 * z;
          m[z] = left >= 16  ? static_cast<__mmask16>(0xFFFF)
                 : left <= 0 ? static_cast<__mmask16>(0)
                             : static_cast<__mmask16>((1u << left) - 1);
        }
        if (prefetch && c1 < n_max) {  // the next chunk's values of these dimensions, a share
          const int64_t blocks = (rows.n + NH - 1) / NH, b = h0 / NH;
          const int64_t n_next = std::min(n_max, c1 + kChunk) - c1;
          prefetch_rows(v0 + j0, a.v_stride, c1 + n_next * b / blocks,
                        c1 + n_next * (b + 1) / blocks, std::min<int64_t>(16 * NJ, j_end - j0));
        }
        pv_block<NH, NJ>(p, v0, a.v_stride, c0, c1, j0, m, out);
      }
    }
  }
}

template <int NH>
void rows_task(const ops::AttentionArgs& a, const Rows& rows, const float* k0, const float* v0,
               float* scores, float* dummy, bool prefetch) {
  // scores[r * n_max ..] for row r; each row's arithmetic does not depend on which rows share
  // the task: its dot products are the same blocks' (one accumulator and lane tree per output),
  // its softmax runs over its own n_ctx scores, and its probabilities past n_ctx are 0, so the
  // value blocks' longer key range adds fma(0, v, acc) = acc.
  const int64_t n_max = rows.n_ctx[rows.n - 1];
  score_keys<NH>(a, rows, k0, n_max, 0, n_max, scores, prefetch);
  for (int64_t r = 0; r < rows.n; ++r) {
    float* sc = scores + r * n_max;
    softmax_scaled_avx512(sc, rows.n_ctx[r], a.scale);
    std::fill(sc + rows.n_ctx[r], sc + n_max, 0.0f);
  }
  value_dims<NH>(a, rows, v0, n_max, scores, 0, a.dv, dummy, prefetch);
}

// The row block of a KV group's heads: it follows the group's size (not a task's share of it),
// so splitting a group over tasks or phases leaves every head's arithmetic as it was.
int group_nh(int64_t group) {
  return group >= 4 ? 4 : group >= 2 ? 2 : 1;
}

void rows_any(const ops::AttentionArgs& a, int nh, const Rows& rows, const float* k0,
              const float* v0, float* scores, float* dummy, bool prefetch) {
  if (nh == 4) {
    rows_task<4>(a, rows, k0, v0, scores, dummy, prefetch);
  } else if (nh == 2) {
    rows_task<2>(a, rows, k0, v0, scores, dummy, prefetch);
  } else {
    rows_task<1>(a, rows, k0, v0, scores, dummy, prefetch);
  }
}

}  // namespace

void attention_task_avx512(const ops::AttentionArgs& a, int64_t t, int64_t g, int64_t hb,
                           int64_t he, float* scores, float* dummy) {
  const int64_t group = a.n_heads / a.n_kv_heads, base = g * group;
  const int nh = group_nh(group);
  const float* q0 = a.q + t * a.q_stride + base * a.dk;
  for (int64_t h0 = hb; h0 < he; h0 += kMaxRows) {
    Rows rows;
    rows.n = std::min<int64_t>(kMaxRows, he - h0);
    for (int64_t r = 0; r < rows.n; ++r) {
      rows.q[r] = q0 + (h0 + r) * a.dk;
      rows.n_ctx[r] = a.pos0 + t + 1;
      rows.out[r] = a.out + (t * a.n_heads + base + h0 + r) * a.dv;
    }
    rows_any(a, nh, rows, a.k + g * a.dk, a.v + g * a.dv, scores, dummy, a.n_tokens == 1);
  }
}

void attention_tokens_avx512(const ops::AttentionArgs& a, int64_t t0, int64_t t1, int64_t g,
                             float* scores, float* dummy) {
  for (int64_t b = t0; b < t1; b += kMaxRows) {
    Rows rows;
    rows.n = std::min<int64_t>(kMaxRows, t1 - b);
    for (int64_t r = 0; r < rows.n; ++r) {
      rows.q[r] = a.q + (b + r) * a.q_stride + g * a.dk;
      rows.n_ctx[r] = a.pos0 + b + r + 1;
      rows.out[r] = a.out + ((b + r) * a.n_heads + g) * a.dv;
    }
    rows_any(a, 4, rows, a.k + g * a.dk, a.v + g * a.dv, scores, dummy, false);
  }
}

namespace {

// Token 0's rows of KV group 0 (all a.n_heads of them: one group) with n_ctx = pos0 + 1 keys.
Rows decode_rows(const ops::AttentionArgs& a) {
  Rows rows;
  rows.n = a.n_heads;
  for (int64_t r = 0; r < rows.n; ++r) {
    rows.q[r] = a.q + r * a.dk;
    rows.n_ctx[r] = a.pos0 + 1;
    rows.out[r] = a.out + r * a.dv;
  }
  return rows;
}

}  // namespace

void decode_scores_avx512(const ops::AttentionArgs& a, int64_t s_begin, int64_t s_end,
                          float* scores) {
  const Rows rows = decode_rows(a);
  const int64_t n_ctx = a.pos0 + 1;
  switch (group_nh(a.n_heads)) {
    case 4: score_keys<4>(a, rows, a.k, n_ctx, s_begin, s_end, scores, true); break;
    case 2: score_keys<2>(a, rows, a.k, n_ctx, s_begin, s_end, scores, true); break;
    default: score_keys<1>(a, rows, a.k, n_ctx, s_begin, s_end, scores, true); break;
  }
}

int64_t decode_value_step(const ops::AttentionArgs& a) {
  return 16 * (16 / group_nh(a.n_heads));
}

void decode_values_avx512(const ops::AttentionArgs& a, const float* scores, int64_t j_begin,
                          int64_t j_end, float* dummy) {
  const Rows rows = decode_rows(a);
  const int64_t n_ctx = a.pos0 + 1;
  switch (group_nh(a.n_heads)) {
    case 4: value_dims<4>(a, rows, a.v, n_ctx, scores, j_begin, j_end, dummy, true); break;
    case 2: value_dims<2>(a, rows, a.v, n_ctx, scores, j_begin, j_end, dummy, true); break;
    default: value_dims<1>(a, rows, a.v, n_ctx, scores, j_begin, j_end, dummy, true); break;
  }
}

}  // namespace tandem::kern::detail

namespace tandem::kern::detail {
namespace {

// NR rows of c, columns [j0, j0 + 64): acc[r][z] = fma(a[r][p], b[p][j], acc) over p in order.
template <int NR>
inline void f32_kn_block(const float* a, int64_t lda, const float* b, int64_t k, int64_t n,
                         int64_t j0, float* c, int64_t ldc) {
  __m512 acc[NR][4];
  for (int r = 0; r < NR; ++r) {
    for (int z = 0; z < 4; ++z) acc[r][z] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < k; ++p) {
    const float* bp = b + p * n + j0;
    __m512 bv[4];
    for (int z = 0; z < 4; ++z) bv[z] = _mm512_loadu_ps(bp + 16 * z);
    for (int r = 0; r < NR; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda + p]);
      for (int z = 0; z < 4; ++z) acc[r][z] = _mm512_fmadd_ps(av, bv[z], acc[r][z]);
    }
  }
  for (int r = 0; r < NR; ++r) {
    for (int z = 0; z < 4; ++z) _mm512_storeu_ps(c + r * ldc + j0 + 16 * z, acc[r][z]);
  }
}

}  // namespace

void gemm_f32_kn_avx512(const float* a, int64_t lda, int64_t m, const float* b, int64_t k,
                        int64_t n, float* c, int64_t ldc) {
  constexpr int kRows = 6;
  for (int64_t i = 0; i < m; i += kRows) {
    const int64_t rows = std::min<int64_t>(kRows, m - i);
    for (int64_t j0 = 0; j0 < n; j0 += 64) {
      const float* ai = a + i * lda;
      float* ci = c + i * ldc;
      switch (rows) {
        case 6: f32_kn_block<6>(ai, lda, b, k, n, j0, ci, ldc); break;
        case 5: f32_kn_block<5>(ai, lda, b, k, n, j0, ci, ldc); break;
        case 4: f32_kn_block<4>(ai, lda, b, k, n, j0, ci, ldc); break;
        case 3: f32_kn_block<3>(ai, lda, b, k, n, j0, ci, ldc); break;
        case 2: f32_kn_block<2>(ai, lda, b, k, n, j0, ci, ldc); break;
        default: f32_kn_block<1>(ai, lda, b, k, n, j0, ci, ldc); break;
      }
    }
  }
}

}  // namespace tandem::kern::detail
