// kern::attention over a BF16 KV cache on AVX-512 BF16 (ModelOptions::kv_type; compiled with the
// BF16 flags, chosen at run time from Isa::kAvx512Bf16): the algorithm of attention_avx512.cpp
// (attention_avx512_impl.h) with
//  - the scores by vdpbf16ps: the query rounded to BF16 once per call (to nearest even, as
//    vcvtne2ps2bf16 does), each step 32 key dimensions, pairs of exact BF16 products added into
//    16 F32 accumulators;
//  - the value sums on the values widened to F32 (exact), the F32 kernel's FMA chains.
// Half the cache's bytes, and the scores' arithmetic at twice the width of F32 FMAs. Outputs
// follow only their own query, keys and values, as on F32: the same bits on any thread count
// or batch.
#include <immintrin.h>

#include <cstdint>

#include "ops/cpu/attention_avx512_impl.h"
#include "ops/cpu/kern_gguf.h"
#include "ops/cpu/ref_ops.h"  // AttentionArgs

namespace tandem::kern::detail {
namespace {

struct KvBf16 {
  using T = uint16_t;  // BF16 bits
  static constexpr int64_t kDims = 32;
  static const T* keys(const ops::AttentionArgs& a) { return a.kb; }
  static const T* values(const ops::AttentionArgs& a) { return a.vb; }
  static __m512 load_q(const float* q, int64_t left) {
    const __m512 lo = _mm512_maskz_loadu_ps(attn::tail_mask(0, left), q);
    const __m512 hi = _mm512_maskz_loadu_ps(attn::tail_mask(16, left), q + 16);
    return reinterpret_cast<__m512>(_mm512_cvtne2ps_pbh(hi, lo));
  }
  static __m512 load_k(const T* k) { return _mm512_castsi512_ps(_mm512_loadu_si512(k)); }
  static __m512 load_k(const T* k, int64_t left) {
    const __mmask32 m = static_cast<__mmask32>((uint64_t{1} << left) - 1);
    return _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, k));
  }
  static __m512 dot(__m512 acc, __m512 q, __m512 k) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(q), reinterpret_cast<__m512bh>(k));
  }
  static __m512 load_v(const T* v, __mmask16 m) {
    const __m256i x = _mm256_maskz_loadu_epi16(m, v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
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
