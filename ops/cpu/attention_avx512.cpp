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

#include "ops/cpu/attention_avx512_impl.h"
#include "ops/cpu/kern_gguf.h"
#include "ops/cpu/ref_ops.h"  // AttentionArgs

namespace tandem::kern::detail {
namespace {

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

// The cache as computed.
struct KvF32 : attn::ValuesByFma<KvF32> {
  using T = float;
  static constexpr int64_t kDims = 16;
  static const T* keys(const ops::AttentionArgs& a) { return a.k; }
  static const T* values(const ops::AttentionArgs& a) { return a.v; }
  static __m512 load_q(const float* q, int64_t left) {
    return _mm512_maskz_loadu_ps(attn::tail_mask(0, left), q);
  }
  static __m512 load_k(const T* k, int64_t d) { return _mm512_loadu_ps(k + d); }
  static __m512 load_k(const T* k, int64_t d, int64_t left) {
    return _mm512_maskz_loadu_ps(attn::tail_mask(0, left), k + d);
  }
  static __m512 dot(__m512 acc, __m512 q, __m512 k) { return _mm512_fmadd_ps(q, k, acc); }
  static __m512 load_v(const T* v, int64_t j, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, v + j);
  }
};

// A BF16 cache on AVX-512 without the BF16 instructions: the F32 kernel's arithmetic on the
// queries rounded to BF16 and the rows widened as they are loaded (ops::attention's BF16
// contract).
struct KvBf16Widened : attn::ValuesByFma<KvBf16Widened> {
  using T = uint16_t;
  static constexpr int64_t kDims = 16;
  static const T* keys(const ops::AttentionArgs& a) { return a.k16; }
  static const T* values(const ops::AttentionArgs& a) { return a.v16; }
  static __m512 widen(__m256i x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
  }
  static __m512 load_q(const float* q, int64_t left) {
    // To BF16 (nearest even, as f32_to_bf16 for finite values) and back.
    const __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(attn::tail_mask(0, left), q));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(~0xFFFF)));
  }
  static __m512 load_k(const T* k, int64_t d) {
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + d)));
  }
  static __m512 load_k(const T* k, int64_t d, int64_t left) {
    return widen(_mm256_maskz_loadu_epi16(attn::tail_mask(0, left), k + d));
  }
  static __m512 dot(__m512 acc, __m512 q, __m512 k) { return _mm512_fmadd_ps(q, k, acc); }
  static __m512 load_v(const T* v, int64_t j, __mmask16 m) {
    return widen(_mm256_maskz_loadu_epi16(m, v + j));
  }
};

// An F16 cache: the F32 kernel on the rows widened as loaded (vcvtph2ps), the query as it is.
struct KvF16Widened : attn::ValuesByFma<KvF16Widened> {
  using T = uint16_t;
  static constexpr int64_t kDims = 16;
  static const T* keys(const ops::AttentionArgs& a) { return a.k16; }
  static const T* values(const ops::AttentionArgs& a) { return a.v16; }
  static __m512 load_q(const float* q, int64_t left) {
    return _mm512_maskz_loadu_ps(attn::tail_mask(0, left), q);
  }
  static __m512 load_k(const T* k, int64_t d) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + d)));
  }
  static __m512 load_k(const T* k, int64_t d, int64_t left) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(attn::tail_mask(0, left), k + d));
  }
  static __m512 dot(__m512 acc, __m512 q, __m512 k) { return _mm512_fmadd_ps(q, k, acc); }
  static __m512 load_v(const T* v, int64_t j, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, v + j));
  }
};

// A Q8_0 cache (ops::q8_row_bytes' rows): the F32 kernel on the values dequantized as loaded,
// int8 -> int32 -> F32 times the block's scale (one multiply, as ops::q8_value), the query as it
// is. A 16-value step lies inside one 32-value block; its scale is the float 4 (b + 1) bytes
// before the row's values.
struct KvQ8 : attn::ValuesByFma<KvQ8> {
  using T = int8_t;
  static constexpr int64_t kDims = 16;
  static const T* keys(const ops::AttentionArgs& a) { return a.k8; }
  static const T* values(const ops::AttentionArgs& a) { return a.v8; }
  static int64_t head(int64_t d) { return ops::q8_row_bytes(d); }
  static int64_t lead(int64_t d) { return ops::q8_lead_bytes(d); }
  static __m512 dequantize(const T* row, int64_t d, __m128i q) {
    const float scale = reinterpret_cast<const float*>(row)[-1 - d / ops::kQ8Block];
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(scale));
  }
  static __m512 load_q(const float* q, int64_t left) {
    return _mm512_maskz_loadu_ps(attn::tail_mask(0, left), q);
  }
  static __m512 load_k(const T* k, int64_t d) {
    return dequantize(k, d, _mm_loadu_si128(reinterpret_cast<const __m128i*>(k + d)));
  }
  static __m512 load_k(const T* k, int64_t d, int64_t left) {
    return dequantize(k, d, _mm_maskz_loadu_epi8(attn::tail_mask(0, left), k + d));
  }
  static __m512 dot(__m512 acc, __m512 q, __m512 k) { return _mm512_fmadd_ps(q, k, acc); }
  static __m512 load_v(const T* v, int64_t j, __mmask16 m) {
    // (A step past the row's end reads nothing: its scale would lie before the row's scales, or
    // before the cache's first byte.)
    if (m == 0) return _mm512_setzero_ps();
    return dequantize(v, j, _mm_maskz_loadu_epi8(m, v + j));
  }
};

// Calls fn with the Kv of a's cache: F32, or 16-bit / Q8_0 rows widened as loaded.
template <class Fn>
void with_kv(const ops::AttentionArgs& a, Fn&& fn) {
  if (a.k8 != nullptr) {
    fn(KvQ8{});
  } else if (a.k16 == nullptr) {
    fn(KvF32{});
  } else if (a.f16) {
    fn(KvF16Widened{});
  } else {
    fn(KvBf16Widened{});
  }
}

}  // namespace

void attention_task_avx512(const ops::AttentionArgs& a, int64_t t, int64_t g, int64_t hb,
                           int64_t he, float* scores, float* dummy) {
  with_kv(a, [&](auto kv) { attn::task<decltype(kv)>(a, t, g, hb, he, scores, dummy); });
}

void attention_tokens_avx512(const ops::AttentionArgs& a, int64_t t0, int64_t t1, int64_t g,
                             float* scores, float* dummy) {
  with_kv(a, [&](auto kv) { attn::tokens<decltype(kv)>(a, t0, t1, g, scores, dummy); });
}

void decode_segments_avx512(const ops::AttentionArgs& a, int64_t seg_begin, int64_t seg_end,
                            float* partial, float* stats) {
  with_kv(a, [&](auto kv) {
    attn::decode_segments<decltype(kv)>(a, seg_begin, seg_end, partial, stats);
  });
}

void decode_fold_avx512(const ops::AttentionArgs& a, const float* partial, const float* stats,
                        int64_t h_begin, int64_t h_end) {
  const int64_t segs = (a.pos0 + 1 + kSegment - 1) / kSegment;
  thread_local std::vector<float> coef;
  coef.resize(static_cast<size_t>(2 * segs));
  for (int64_t h = h_begin; h < h_end; ++h) {
    attn::SegmentFold fold{0.0f, 0.0f, false};
    for (int64_t s = 0; s < segs; ++s) {
      const float* st = stats + (s * a.n_heads + h) * 2;
      fold.add(st[0], st[1], &coef[static_cast<size_t>(2 * s)],
               &coef[static_cast<size_t>(2 * s + 1)]);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / fold.l);
    for (int64_t j = 0; j < a.dv; j += 16) {
      const __mmask16 m = attn::tail_mask(j, a.dv);
      __m512 o = _mm512_setzero_ps();
      for (int64_t s = 0; s < segs; ++s) {
        o = attn::fold_step(o, _mm512_maskz_loadu_ps(m, partial + (s * a.n_heads + h) * a.dv + j),
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
