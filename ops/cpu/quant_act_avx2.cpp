// Activation quantization on AVX2 (the baseline x86-64-v3 every supported CPU has; -ffp-contract=off
// like the other kernel units): quant_act_avx512.cpp's algorithms 8 lanes at a time, the same
// bytes as the scalar quantizers (see that file for the rounding tricks reproduced lane by lane).
#include <immintrin.h>

#include <cstring>

#include "core/fp_convert.h"
#include "formats/quant.h"
#include "ops/cpu/kern_gguf.h"
#include "ops/cpu/packed_kernels.h"

namespace tandem::kern::detail {

namespace {

inline __m256 bias() {
  return _mm256_set1_ps(12582912.0f);  // 1.5 * 2^23
}

inline __m256 abs_ps(__m256 v) {
  return _mm256_castsi256_ps(
      _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7FFFFFFF)));
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

// The low byte of each 32-bit lane (C++'s wrapping cast to int8), 8 bytes in lane order.
inline void store_low_bytes(__m256i v, void* dst) {
  const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        -1, -1);
  const __m256i b = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, pick),
                                                _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), _mm256_castsi256_si128(b));
}

// The int8 value the wrapping cast gives, sign-extended back to 32 bits.
inline __m256i as_int8(__m256i v) {
  return _mm256_srai_epi32(_mm256_slli_epi32(v, 24), 24);
}

inline __m256i nearest_int(__m256 v) {
  const __m256i bits = _mm256_castps_si256(_mm256_add_ps(v, bias()));
  return _mm256_sub_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x007FFFFF)),
                          _mm256_set1_epi32(0x00400000));
}

inline __m256i round_half_away(__m256 v) {
  const __m256 rne = _mm256_sub_ps(_mm256_add_ps(v, bias()), bias());
  const __m256 diff = _mm256_sub_ps(v, rne);
  const __m256 zero = _mm256_setzero_ps();
  const __m256 up = _mm256_and_ps(_mm256_cmp_ps(diff, _mm256_set1_ps(0.5f), _CMP_EQ_OQ),
                                  _mm256_cmp_ps(v, zero, _CMP_GT_OQ));
  const __m256 down = _mm256_and_ps(_mm256_cmp_ps(diff, _mm256_set1_ps(-0.5f), _CMP_EQ_OQ),
                                    _mm256_cmp_ps(v, zero, _CMP_LT_OQ));
  // A true comparison is all ones (-1): subtracting it adds 1.
  const __m256i r = _mm256_sub_epi32(_mm256_cvttps_epi32(rne), _mm256_castps_si256(up));
  return _mm256_add_epi32(r, _mm256_castps_si256(down));
}

}  // namespace

void quantize_q8_k_avx2(const float* x, BlockQ8_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    __m256 acc = _mm256_setzero_ps();
    for (int j = 0; j < 32; ++j) acc = _mm256_max_ps(abs_ps(_mm256_loadu_ps(x + 8 * j)), acc);
    const float amax = hmax(acc);
    if (amax == 0) {
      y[i] = BlockQ8_K{};
      continue;
    }
    float max = 0;
    const __m256 am = _mm256_set1_ps(amax);
    for (int j = 0; j < 32; ++j) {
      const int hit = _mm256_movemask_ps(
          _mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x + 8 * j)), am, _CMP_EQ_OQ));
      if (hit != 0) {
        max = x[8 * j + __builtin_ctz(static_cast<unsigned>(hit))];
        break;
      }
    }
    const float iscale = -127.f / max;
    const __m256 is = _mm256_set1_ps(iscale);
    for (int j = 0; j < 16; ++j) {
      __m256i q[2];
      for (int k = 0; k < 2; ++k) {
        q[k] = _mm256_min_epi32(nearest_int(_mm256_mul_ps(is, _mm256_loadu_ps(x + 16 * j + 8 * k))),
                                _mm256_set1_epi32(127));
        store_low_bytes(q[k], y[i].qs + 16 * j + 8 * k);
      }
      y[i].bsums[j] = static_cast<int16_t>(hsum(_mm256_add_epi32(as_int8(q[0]), as_int8(q[1]))));
    }
    y[i].d = 1 / iscale;
  }
}

void quantize_q8_0_act_avx2(const float* x, uint8_t* dst, int64_t cols) {
  const int64_t nb = cols / kQK, nbp = q8_0_act_padded_blocks(nb);
  auto* blk = reinterpret_cast<BlockQ8_0*>(dst);
  auto* negc = reinterpret_cast<int32_t*>(dst + q8_0_act_aux_offset(nb));
  auto* dv = reinterpret_cast<float*>(negc + nbp);
  for (int64_t b = 0; b < nb; ++b, x += kQK) {
    __m256 v[4];
    __m256 acc = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(x + 8 * k);
      acc = _mm256_max_ps(abs_ps(v[k]), acc);
    }
    const float d = hmax(acc) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const Half h = f32_to_f16(d);
    std::memcpy(&blk[b].d, &h, sizeof(h));
    const __m256 iv = _mm256_set1_ps(id);
    __m256i sum = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
      const __m256i q = round_half_away(_mm256_mul_ps(v[k], iv));
      store_low_bytes(q, blk[b].qs + 8 * k);
      sum = _mm256_add_epi32(sum, as_int8(q));
    }
    negc[b] = -128 * hsum(sum);
    dv[b] = f16_to_f32(h);
  }
  for (int64_t b = nb; b < nbp; ++b) {
    negc[b] = 0;
    dv[b] = 0.0f;
  }
}

void quantize_i8_act_avx2(const float* x, uint8_t* dst, int64_t cols, int64_t group) {
  const int64_t groups = cols / group;
  auto* q = reinterpret_cast<int8_t*>(dst);
  auto* sa = reinterpret_cast<float*>(dst + act_scales_offset(cols));
  auto* sums = reinterpret_cast<int32_t*>(dst + act_scales_offset(cols) + groups * 4);
  uint8_t* biased = dst + act_biased_offset(cols, groups);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  for (int64_t g = 0; g < groups; ++g, x += group) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t k = 0; k < group; k += 8) acc = _mm256_max_ps(abs_ps(_mm256_loadu_ps(x + k)), acc);
    const float amax = hmax(acc);
    const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
    const __m256 inv = _mm256_set1_ps(1.0f / s);
    __m256i sum = _mm256_setzero_si256();
    for (int64_t k = 0; k < group; k += 8) {
      const __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + k), inv),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m256i v = _mm256_cvttps_epi32(_mm256_max_ps(_mm256_min_ps(r, hi), lo));
      store_low_bytes(v, q + g * group + k);
      store_low_bytes(_mm256_xor_si256(v, _mm256_set1_epi32(0x80)), biased + g * group + k);
      sum = _mm256_add_epi32(sum, v);
    }
    sa[g] = s;
    sums[g] = hsum(sum);
  }
}

void f32_to_bf16_avx2(const float* x, uint16_t* y, int64_t n) {
  const __m256i one = _mm256_set1_epi32(1), round = _mm256_set1_epi32(0x7FFF);
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i h[2];
    for (int k = 0; k < 2; ++k) {
      const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8 * k));
      const __m256i r = _mm256_srli_epi32(
          _mm256_add_epi32(_mm256_add_epi32(u, round),
                           _mm256_and_si256(_mm256_srli_epi32(u, 16), one)),
          16);
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
      const __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
      h[k] = _mm256_blendv_epi8(r, q, nan);
    }
    // Both halves are 0..0xFFFF: the unsigned saturation keeps them; then undo the lane order.
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(h[0], h[1]), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), p);
  }
  for (; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}

}  // namespace tandem::kern::detail
