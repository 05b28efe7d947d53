// AVX-512 attention for the query rows of one KV head group (compiled with the AVX-512 flags,
// selected at run time; see kernels.cpp). The keys are taken in segments of kSegment positions
// aligned to position 0 (a row's last one ends at its own context); per segment:
//  - the scores in register blocks of 16 outputs (4 heads x 4 keys; 2 x 8 or 1 x 16 for small
//    groups): per 16 key dimensions NH + NS loads feed 16 FMAs, then one transposing add tree
//    turns the 16 accumulators into the 16 dot products;
//  - per row the segment's maximum m_s of the scaled scores, p = e^(scale * x - m_s) (vectorized
//    e^x) and their sum l_s;
//  - the value sums o_s = sum p v in blocks of NH heads x NJ vectors of 16 output dimensions (one
//    FMA chain per output over the segment's keys in order, read from L2 where the scores left
//    them: the cache is read once);
//  - the fold into the row's output: o = fma(o_s, b, o * a) with a = e^(M - M'), b = e^(m_s - M'),
//    M' = max(M, m_s) (SegmentFold, in segment order); at the end o / L.
// Every output depends only on its own query, the keys and the values, never on which tokens or
// heads share the call or on how the segments are spread over threads (the long-context decode
// computes segments on every thread and folds them afterwards with the same arithmetic): a token
// computes the same bits in a prefill batch, alone in decode, on one thread or on several.
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
// and pv_chunk are forced inline: called from score_keys / value_sums, GCC kept them out of line
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


// out[h][j0 + ...] = the value sums over n keys (values v, rows v_stride apart) for the NJ * 16
// output dimensions from j0 (mask m[z] for vector z) of NH rows: acc = fma(p[h][s], v[s][j], acc)
// over s in order, from 0 (first) or continuing out's sums.
template <int NH, int NJ>
__attribute__((always_inline)) inline void pv_chunk(const float* const* p, const float* v,
                                                    int64_t v_stride, int64_t n, int64_t j0,
                                                    const __mmask16* m, bool first,
                                                    float* const* out) {
  static_assert(NH * NJ == 16);
  __m512 acc[NH][NJ];
  for (int h = 0; h < NH; ++h) {
    for (int z = 0; z < NJ; ++z) {
      acc[h][z] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m[z], out[h] + j0 + 16 * z);
    }
  }
  for (int64_t s = 0; s < n; ++s) {
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

// The mask of the 16 values from j of n.
inline __mmask16 tail_mask(int64_t j, int64_t n) {
  const int64_t left = n - j;
  return left >= 16  ? static_cast<__mmask16>(0xFFFF)
         : left <= 0 ? static_cast<__mmask16>(0)
                     : static_cast<__mmask16>((1u << left) - 1);
}

// A segment's value sums folded into a row's output: out = fma(o_s, b, out * a).
inline __m512 fold_step(__m512 out, __m512 o_s, float a, float b) {
  return _mm512_fmadd_ps(o_s, _mm512_set1_ps(b), _mm512_mul_ps(out, _mm512_set1_ps(a)));
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

// x[i] = e^(scale * x[i] - m) for i < n, m = max_i scale * x[i] (ops::softmax's numerators
// after the scaling, vectorized); *m_out = m, *l_out = their sum (16 lanes over the keys in
// order, then the lanes' sum).
void segment_exp_avx512(float* x, int64_t n, float scale, float* m_out, float* l_out) {
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
  const float mf = _mm512_reduce_max_ps(mx);
  const __m512 m = _mm512_set1_ps(mf);
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
  *m_out = mf;
  *l_out = _mm512_reduce_add_ps(sum);
}

namespace {

constexpr int64_t kChunk = 64;  // keys per prefetch step of the scores (the next chunk's lines)
static_assert(kSegment % kChunk == 0);
constexpr int64_t kMaxRows = 256;  // query rows per rows_task call (every model's heads fit)

// One row's softmax over its segments, folded in segment order: after the segments' (m_s, l_s)
// so far, m is their maximum and l the sum of their exponentials relative to it. add gives the
// coefficients of the output's fold, o = fma(o_s, b, o * a) (the first segment: a 0, b 1).
struct SegmentFold {
  float m, l;
  bool started;
  void add(float m_s, float l_s, float* a, float* b) {
    if (!started) {
      started = true;
      m = m_s;
      l = l_s;
      *a = 0.0f;
      *b = 1.0f;
      return;
    }
    const float mn = std::max(m, m_s);
    *a = std::exp(m - mn);
    *b = std::exp(m_s - mn);
    l = std::fma(l_s, *b, l * *a);
    m = mn;
  }
};

// The query rows of one task: they share the keys k0 and values v0 (rows a.k_stride / a.v_stride
// apart); row r attends to the first n_ctx[r] of them (ascending in r) and writes out[r].
struct Rows {
  const float* q[kMaxRows];
  int64_t n_ctx[kMaxRows];
  float* out[kMaxRows];
  int64_t n = 0;
};

// Lines [l0, l1) (64 bytes each) of rows [r0, r1) of a cache (rows `stride` floats apart): the
// row blocks of a chunk prefetch the next chunk's keys between them, evenly over the chunk's time.
inline void prefetch_lines(const float* base, int64_t stride, int64_t r0, int64_t r1, int64_t l0,
                           int64_t l1) {
  for (int64_t r = r0; r < r1; ++r) {
    const char* p = reinterpret_cast<const char*>(base + r * stride);
    for (int64_t l = l0; l < l1; ++l) _mm_prefetch(p + 64 * l, _MM_HINT_T0);
  }
}

// The rows' queries packed per block of NH for qk_block (qp[(b * steps + step) * NH + h]), a
// short last block repeating its last row.
template <int NH>
const __m512* pack_rows(const ops::AttentionArgs& a, const Rows& rows) {
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
  return packed.data();
}

// What a task prefetches: with `on`, the keys a chunk ahead up to position `end` (across its
// segments), and the values too where they are other rows than the keys (prefill: off, its keys
// come from L2 / L3 for most tasks, where the prefetches cost 5-10%).
struct Prefetch {
  bool on = false;
  int64_t end = 0;
};

// The scores of every row against keys [s_begin, s_end) (at most kSegment of them):
// scores[r * kSegment + s - s_begin]. Row blocks of NH (a short last block repeats its last row),
// key blocks of NS (a short last block repeats the last key); repeated outputs are dropped. Every
// output is its own accumulator and lane tree, whichever rows and keys share its block.
template <int NH>
void score_keys(const ops::AttentionArgs& a, const Rows& rows, const __m512* packed,
                const float* k0, const float* v0, int64_t s_begin, int64_t s_end, Prefetch pf,
                float* scores) {
  constexpr int NS = 16 / NH;
  alignas(64) float blk[16];
  const int64_t steps = (a.dk + 15) / 16, blocks = (rows.n + NH - 1) / NH;
  // Each row block's share of a key's (and a value's) 64-byte lines to prefetch: lines
  // share[b] .. share[b + 1] (computed once per call, not with two divisions per block).
  const bool pf_values = pf.on && v0 != k0;
  const int64_t lines = (a.dk * 4 + 63) / 64, vlines = (a.dv * 4 + 63) / 64;
  thread_local std::vector<int64_t> share, vshare;
  share.resize(static_cast<size_t>(blocks + 1));
  vshare.resize(static_cast<size_t>(blocks + 1));
  for (int64_t b = 0; b <= blocks; ++b) {
    share[static_cast<size_t>(b)] = lines * b / blocks;
    vshare[static_cast<size_t>(b)] = vlines * b / blocks;
  }
  // Key chunks outer: a chunk's keys stay in L1 / L2 while every row block passes over them.
  for (int64_t c0 = s_begin; c0 < s_end; c0 += kChunk) {
    const int64_t c1 = std::min(s_end, c0 + kChunk);
    for (int64_t h0 = 0; h0 < rows.n; h0 += NH) {
      const int64_t b = h0 / NH;
      const __m512* qp = packed + b * steps * NH;
      for (int64_t s0 = c0; s0 < c1; s0 += NS) {
        // The row blocks prefetch the next chunk's keys between them as they go (without, a
        // long context read latency-bound).
        if (pf.on && s0 + kChunk < pf.end) {
          const int64_t r1 = std::min(pf.end, s0 + kChunk + NS);
          prefetch_lines(k0, a.k_stride, s0 + kChunk, r1, share[b], share[b + 1]);
          if (pf_values) {
            prefetch_lines(v0, a.v_stride, s0 + kChunk, r1, vshare[b], vshare[b + 1]);
          }
        }
        const float* k[NS];
        for (int s = 0; s < NS; ++s) k[s] = k0 + std::min(s0 + s, s_end - 1) * a.k_stride;
        qk_block<NH, NS>(qp, k, a.dk, blk);
        for (int h = 0; h < NH && h0 + h < rows.n; ++h) {
          for (int s = 0; s < NS && s0 + s < c1; ++s) {
            scores[(h0 + h) * kSegment + s0 + s - s_begin] = blk[h * NS + s];
          }
        }
      }
    }
  }
}

// The value sums of every row over keys [s_begin, s_end) with probabilities
// p[r * kSegment + s - s_begin] (0 past a row's own n_ctx: fma(0, v, acc) = acc), unscaled into
// sums[r] (dv floats; rows whose sums[r] is nullptr are computed into `dummy` and dropped). Key
// chunks outer, then the row blocks, then the dimension blocks: a chunk's values stay in L1 / L2
// while every block passes over them (the dimension blocks outside the row blocks measured
// 2-5% slower in prefill).
template <int NH>
void value_sums(const ops::AttentionArgs& a, const Rows& rows, const float* v0, int64_t s_begin,
                int64_t s_end, const float* p_all, float* const* sums, float* dummy) {
  constexpr int NJ = 16 / NH;
  for (int64_t c0 = s_begin; c0 < s_end; c0 += kChunk) {
    const int64_t c1 = std::min(s_end, c0 + kChunk);
    for (int64_t h0 = 0; h0 < rows.n; h0 += NH) {
      const float* p[NH];
      float* out[NH];
      for (int h = 0; h < NH; ++h) {
        const int64_t hh = std::min<int64_t>(h0 + h, rows.n - 1);
        p[h] = p_all + hh * kSegment + (c0 - s_begin);
        out[h] = h0 + h < rows.n && sums[hh] != nullptr ? sums[hh] : dummy;
      }
      for (int64_t j0 = 0; j0 < a.dv; j0 += 16 * NJ) {
        __mmask16 m[NJ];
        for (int z = 0; z < NJ; ++z) m[z] = tail_mask(j0 + 16 * z, a.dv);
        pv_chunk<NH, NJ>(p, v0 + c0 * a.v_stride, a.v_stride, c1 - c0, j0, m, c0 == s_begin,
                         out);
      }
    }
  }
}

// Each row's segment [s_begin, s_end) after its scores: p in place over its own keys (zeros past
// them), the segment's (m_s, l_s) into m_out / l_out. Returns whether the row has keys there.
inline bool segment_probabilities(const ops::AttentionArgs& a, const Rows& rows, int64_t r,
                                  int64_t s_begin, int64_t s_end, float* scores, float* m_out,
                                  float* l_out) {
  float* sc = scores + r * kSegment;
  const int64_t n = std::min(rows.n_ctx[r], s_end) - s_begin;
  if (n <= 0) {
    std::fill(sc, sc + (s_end - s_begin), 0.0f);
    return false;
  }
  segment_exp_avx512(sc, n, a.scale, m_out, l_out);
  std::fill(sc + n, sc + (s_end - s_begin), 0.0f);
  return true;
}

template <int NH>
void rows_task(const ops::AttentionArgs& a, const Rows& rows, const float* k0, const float* v0,
               float* scores, float* dummy, bool prefetch) {
  // Each row's arithmetic does not depend on which rows share the task: its dot products are the
  // same blocks' (one accumulator and lane tree per output), its segments end at its own n_ctx,
  // its probabilities past n_ctx are 0 (the value blocks' longer key range adds
  // fma(0, v, acc) = acc), and a segment past its n_ctx leaves it as it was.
  const int64_t n_max = rows.n_ctx[rows.n - 1];
  const __m512* packed = pack_rows<NH>(a, rows);
  thread_local std::vector<float> seg_sums;  // each row's value sums of the segment
  seg_sums.resize(static_cast<size_t>(rows.n * a.dv));
  SegmentFold fold[kMaxRows];
  float fa[kMaxRows], fb[kMaxRows];
  float* sums[kMaxRows];
  bool first[kMaxRows];
  for (int64_t r = 0; r < rows.n; ++r) fold[r].started = false;  // (a POD: only rows.n set)
  for (int64_t c0 = 0; c0 < n_max; c0 += kSegment) {
    const int64_t c1 = std::min(n_max, c0 + kSegment);
    score_keys<NH>(a, rows, packed, k0, v0, c0, c1, Prefetch{prefetch, n_max}, scores);
    for (int64_t r = 0; r < rows.n; ++r) {
      float m_s, l_s;
      sums[r] = nullptr;
      if (segment_probabilities(a, rows, r, c0, c1, scores, &m_s, &l_s)) {
        // A row's first segment: its sums are the output as they are (the fold with a = 0,
        // b = 1 gives fma(o_s, 1, +0) = o_s: sums from +0 are never -0).
        first[r] = !fold[r].started;
        fold[r].add(m_s, l_s, &fa[r], &fb[r]);
        sums[r] = first[r] ? rows.out[r] : seg_sums.data() + r * a.dv;
      }
    }
    value_sums<NH>(a, rows, v0, c0, c1, scores, sums, dummy);
    for (int64_t r = 0; r < rows.n; ++r) {
      if (sums[r] == nullptr || first[r]) continue;
      for (int64_t j = 0; j < a.dv; j += 16) {
        const __mmask16 m = tail_mask(j, a.dv);
        float* o = rows.out[r] + j;
        _mm512_mask_storeu_ps(o, m,
                              fold_step(_mm512_maskz_loadu_ps(m, o),
                                        _mm512_maskz_loadu_ps(m, sums[r] + j), fa[r], fb[r]));
      }
    }
  }
  for (int64_t r = 0; r < rows.n; ++r) {
    const __m512 inv = _mm512_set1_ps(1.0f / fold[r].l);
    for (int64_t j = 0; j < a.dv; j += 16) {
      const __mmask16 m = tail_mask(j, a.dv);
      _mm512_mask_storeu_ps(rows.out[r] + j, m,
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(m, rows.out[r] + j), inv));
    }
  }
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

template <int NH>
void decode_segments(const ops::AttentionArgs& a, int64_t seg_begin, int64_t seg_end,
                     float* partial, float* stats) {
  const Rows rows = decode_rows(a);
  const int64_t n_ctx = a.pos0 + 1;
  const __m512* packed = pack_rows<NH>(a, rows);
  thread_local std::vector<float> scores, dummy;
  scores.resize(static_cast<size_t>(rows.n * kSegment));
  dummy.resize(static_cast<size_t>(a.dv));
  const Prefetch pf{true, std::min(n_ctx, seg_end * kSegment)};
  float* sums[kMaxRows];
  for (int64_t seg = seg_begin; seg < seg_end; ++seg) {
    const int64_t c0 = seg * kSegment, c1 = std::min(n_ctx, c0 + kSegment);
    score_keys<NH>(a, rows, packed, a.k, a.v, c0, c1, pf, scores.data());
    for (int64_t r = 0; r < rows.n; ++r) {
      float* st = stats + (seg * rows.n + r) * 2;
      segment_probabilities(a, rows, r, c0, c1, scores.data(), st, st + 1);
      sums[r] = partial + (seg * rows.n + r) * a.dv;
    }
    value_sums<NH>(a, rows, a.v, c0, c1, scores.data(), sums, dummy.data());
  }
}

}  // namespace

void decode_segments_avx512(const ops::AttentionArgs& a, int64_t seg_begin, int64_t seg_end,
                            float* partial, float* stats) {
  switch (group_nh(a.n_heads)) {
    case 4: decode_segments<4>(a, seg_begin, seg_end, partial, stats); break;
    case 2: decode_segments<2>(a, seg_begin, seg_end, partial, stats); break;
    default: decode_segments<1>(a, seg_begin, seg_end, partial, stats); break;
  }
}

void decode_fold_avx512(const ops::AttentionArgs& a, const float* partial, const float* stats,
                        int64_t h_begin, int64_t h_end) {
  const int64_t segs = (a.pos0 + 1 + kSegment - 1) / kSegment;
  thread_local std::vector<float> coef;
  coef.resize(static_cast<size_t>(2 * segs));
  for (int64_t h = h_begin; h < h_end; ++h) {
    SegmentFold fold{0.0f, 0.0f, false};
    for (int64_t s = 0; s < segs; ++s) {
      const float* st = stats + (s * a.n_heads + h) * 2;
      fold.add(st[0], st[1], &coef[static_cast<size_t>(2 * s)],
               &coef[static_cast<size_t>(2 * s + 1)]);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / fold.l);
    for (int64_t j = 0; j < a.dv; j += 16) {
      const __mmask16 m = tail_mask(j, a.dv);
      __m512 o = _mm512_setzero_ps();
      for (int64_t s = 0; s < segs; ++s) {
        o = fold_step(o, _mm512_maskz_loadu_ps(m, partial + (s * a.n_heads + h) * a.dv + j),
                      coef[static_cast<size_t>(2 * s)], coef[static_cast<size_t>(2 * s + 1)]);
      }
      _mm512_mask_storeu_ps(a.out + h * a.dv + j, m, _mm512_mul_ps(o, inv));
    }
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
