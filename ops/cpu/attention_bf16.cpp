// kern::attention over a BF16 KV cache on AVX-512 BF16 (ModelOptions::kv_type; compiled with the
// BF16 flags, chosen at run time from Isa::kAvx512Bf16): the algorithm of attention_avx512.cpp
// (attention_avx512_impl.h) with
//  - the scores by vdpbf16ps: the query rounded to BF16 once per call (to nearest even, as
//    vcvtne2ps2bf16 does), each step 32 key dimensions, pairs of exact BF16 products added into
//    16 F32 accumulators;
//  - the value sums by vdpbf16ps too, on each segment's probabilities rounded to BF16 (their
//    sum l_s, the softmax's denominator, stays F32), two keys per step (KvBf16::pv).
// Half the cache's bytes, and twice the F32 FMAs' multiply-adds per instruction: ~1.7-2x the F32
// kernel (bench BM_Attention/*_bf16). Outputs follow only their own query, keys and values, as
// on F32: the same bits on any thread count or batch. (ops::attention_bf16_segments is this
// arithmetic in double.)
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "ops/cpu/attention_avx512_impl.h"
#include "ops/cpu/kern_gguf.h"
#include "ops/cpu/ref_ops.h"  // AttentionArgs

namespace tandem::kern::detail {
namespace {

struct KvBf16 {
  using T = uint16_t;  // BF16 bits
  static constexpr int64_t kDims = 32;
  static const T* keys(const ops::AttentionArgs& a) { return a.k16; }
  static const T* values(const ops::AttentionArgs& a) { return a.v16; }
  static __m512 load_q(const float* q, int64_t left) {
    const __m512 lo = _mm512_maskz_loadu_ps(attn::tail_mask(0, left), q);
    const __m512 hi = _mm512_maskz_loadu_ps(attn::tail_mask(16, left), q + 16);
    return reinterpret_cast<__m512>(_mm512_cvtne2ps_pbh(hi, lo));
  }
  static __m512 load_k(const T* k, int64_t d) {
    return _mm512_castsi512_ps(_mm512_loadu_si512(k + d));
  }
  static __m512 load_k(const T* k, int64_t d, int64_t left) {
    const __mmask32 m = static_cast<__mmask32>((uint64_t{1} << left) - 1);
    return _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, k + d));
  }
  static __m512 dot(__m512 acc, __m512 q, __m512 k) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(q), reinterpret_cast<__m512bh>(k));
  }
  // The value sums by vdpbf16ps too: the probabilities rounded to BF16 (to nearest even), two
  // keys per step. out[0..n] = p[0..n] rounded, out[n] = 0 (the partner of an odd last key).
  using P = uint16_t;
  static void round_p(const float* p, int64_t n, P* out) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      _mm512_storeu_si512(out + i, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(
                                       _mm512_loadu_ps(p + i + 16), _mm512_loadu_ps(p + i))));
    }
    if (i < n) {
      const __m512 lo = _mm512_maskz_loadu_ps(attn::tail_mask(i, n), p + i);
      const __m512 hi = _mm512_maskz_loadu_ps(attn::tail_mask(i + 16, n), p + i + 16);
      const __mmask32 m = static_cast<__mmask32>((uint64_t{1} << (n - i + 1)) - 1);
      _mm512_mask_storeu_epi16(out + i, m,
                               reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
    } else {
      out[n] = 0;
    }
  }

  // pv_chunk's contract: per pair of keys (s, s + 1) and 32 output dimensions, the two value rows
  // interleaved by vpunpck{l,h}wd into (v[s][j], v[s + 1][j]) pairs and multiplied by the pair
  // (p[s], p[s + 1]); the accumulators hold the dimensions in the unpacks' order (per 128-bit
  // lane: lo 4 of every 8, hi the next 4) and are permuted from / to out's order once per call.
  template <int NH, int NJ>
  __attribute__((always_inline)) static void pv(const P* p, const T* v, int64_t v_stride,
                                                int64_t n, int64_t j0, const __mmask16* m,
                                                bool first, float* const* out) {
    static_assert(NJ % 2 == 0);
    constexpr int NU = NJ / 2;  // units of 32 dimensions: accumulators 2u (lo), 2u + 1 (hi)
    const __m512i to_out0 =
        _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i to_out1 =
        _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    const __m512i to_lo =
        _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i to_hi =
        _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    __mmask32 mu[NU];
    for (int u = 0; u < NU; ++u) {
      mu[u] = static_cast<__mmask32>(m[2 * u]) | (static_cast<__mmask32>(m[2 * u + 1]) << 16);
    }
    __m512 acc[NH][NJ];
    for (int h = 0; h < NH; ++h) {
      for (int u = 0; u < NU; ++u) {
        if (first) {
          acc[h][2 * u] = acc[h][2 * u + 1] = _mm512_setzero_ps();
        } else {
          const __m512 o0 = _mm512_maskz_loadu_ps(m[2 * u], out[h] + j0 + 32 * u);
          const __m512 o1 = _mm512_maskz_loadu_ps(m[2 * u + 1], out[h] + j0 + 32 * u + 16);
          acc[h][2 * u] = _mm512_permutex2var_ps(o0, to_lo, o1);
          acc[h][2 * u + 1] = _mm512_permutex2var_ps(o0, to_hi, o1);
        }
      }
    }
    for (int64_t s = 0; s < n; s += 2) {
      const T* va = v + s * v_stride + j0;
      __m512i lo[NU], hi[NU];
      for (int u = 0; u < NU; ++u) {
        const __m512i a = _mm512_maskz_loadu_epi16(mu[u], va + 32 * u);
        const __m512i b = s + 1 < n ? _mm512_maskz_loadu_epi16(mu[u], va + v_stride + 32 * u)
                                    : _mm512_setzero_si512();
        lo[u] = _mm512_unpacklo_epi16(a, b);
        hi[u] = _mm512_unpackhi_epi16(a, b);
      }
      for (int h = 0; h < NH; ++h) {
        uint32_t pair;
        std::memcpy(&pair, p + h * attn::kPRow<P> + s, 4);  // (p[h][s], p[h][s + 1])
        const __m512bh pp = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pair)));
        for (int u = 0; u < NU; ++u) {
          acc[h][2 * u] =
              _mm512_dpbf16_ps(acc[h][2 * u], reinterpret_cast<__m512bh>(lo[u]), pp);
          acc[h][2 * u + 1] =
              _mm512_dpbf16_ps(acc[h][2 * u + 1], reinterpret_cast<__m512bh>(hi[u]), pp);
        }
      }
    }
    for (int h = 0; h < NH; ++h) {
      for (int u = 0; u < NU; ++u) {
        const __m512 l = acc[h][2 * u], r = acc[h][2 * u + 1];
        _mm512_mask_storeu_ps(out[h] + j0 + 32 * u, m[2 * u],
                              _mm512_permutex2var_ps(l, to_out0, r));
        _mm512_mask_storeu_ps(out[h] + j0 + 32 * u + 16, m[2 * u + 1],
                              _mm512_permutex2var_ps(l, to_out1, r));
      }
    }
  }
};

}  // namespace

void attention_task_bf16(const ops::AttentionArgs& a, int64_t t, int64_t g, int64_t hb,
                         int64_t he, float* scores, float* dummy) {
  attn::task<KvBf16>(a, t, g, hb, he, scores, dummy);
}

void attention_tokens_bf16(const ops::AttentionArgs& a, int64_t t0, int64_t t1, int64_t g,
                           float* scores, float* dummy) {
  attn::tokens<KvBf16>(a, t0, t1, g, scores, dummy);
}

void decode_segments_bf16(const ops::AttentionArgs& a, int64_t seg_begin, int64_t seg_end,
                          float* partial, float* stats) {
  attn::decode_segments<KvBf16>(a, seg_begin, seg_end, partial, stats);
}

}  // namespace tandem::kern::detail
