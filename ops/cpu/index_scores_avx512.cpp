// kern::index_scores's key widening on AVX-512 (ops/cpu/index_scores.cpp picks it): a tile of
// cached indexer keys into F32 rows, 16 values per instruction -- vcvtph2ps for F16, a shift for
// BF16, int8 times the block's scale for Q8_0 (ops::q8_value's one multiply: the same bits).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/fp_convert.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/ref_ops.h"

namespace tandem::kern::detail {

void widen_keys_avx512(const ops::AttentionArgs& a, int64_t s0, int64_t rows, float* tile) {
  const int64_t d = a.dk, whole = d / 16 * 16;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t at = ops::k_offset(a, s0 + r);
    float* dst = tile + r * d;
    if (a.k8 != nullptr) {
      const int8_t* v = a.k8 + at;
      const float* scales = reinterpret_cast<const float*>(v);
      for (int64_t i = 0; i < whole; i += 16) {
        const __m512 x = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + i))));
        _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_set1_ps(scales[-1 - i / ops::kQ8Block]), x));
      }
      for (int64_t i = whole; i < d; ++i) dst[i] = ops::q8_value(v, i);
    } else if (a.k16 != nullptr) {
      const uint16_t* src = a.k16 + at;
      for (int64_t i = 0; i < whole; i += 16) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
        const __m512 x = a.f16 ? _mm512_cvtph_ps(h)
                               : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        _mm512_storeu_ps(dst + i, x);
      }
      for (int64_t i = whole; i < d; ++i) dst[i] = a.f16 ? f16_to_f32(src[i]) : bf16_to_f32(src[i]);
    } else {
      std::memcpy(dst, a.k + at, static_cast<size_t>(d) * 4);
    }
  }
}

}  // namespace tandem::kern::detail
