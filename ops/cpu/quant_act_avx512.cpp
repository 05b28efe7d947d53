// Activation quantization on AVX-512 F/BW/VL/DQ (compiled with those flags and -ffp-contract=off;
// see ops/cpu/CMakeLists.txt): the GGUF dot products' Q8_K and Q8_0 activation rows, bit for bit
// what the scalar quantizers (formats/quant_k.cpp quantize_q8_k, formats/quant_legacy.cpp
// quantize_q8_0) and kernels.cpp's Q8_0 bias / scale arrays give, NaN and infinities included:
// the same products in the same precision, the scalar rounding tricks (nearest_int's and
// round_half_away's 1.5 * 2^23 bias) done lane by lane, the scalar maximum searches reproduced
// (max_ps(|x|, acc) keeps acc where |x| is NaN, as the scalar comparisons do).
#include <immintrin.h>

#include <cstring>

#include "core/fp_convert.h"
#include "formats/quant.h"
#include "ops/cpu/kern_gguf.h"
#include "ops/cpu/packed_kernels.h"

namespace tandem::kern::detail {

namespace {

const __m512 kBias = _mm512_set1_ps(12582912.0f);  // 1.5 * 2^23

inline __m512 abs_ps(__m512 v) {
  return _mm512_castsi512_ps(
      _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF)));
}

// nearest_int(v) per lane: (bits(v + 1.5 * 2^23) & 0x7FFFFF) - 0x400000.
inline __m512i nearest_int(__m512 v) {
  const __m512i bits = _mm512_castps_si512(_mm512_add_ps(v, kBias));
  return _mm512_sub_epi32(_mm512_and_si512(bits, _mm512_set1_epi32(0x007FFFFF)),
                          _mm512_set1_epi32(0x00400000));
}

// round_half_away(v) per lane: the nearest-even integer, moved away from zero on exact halves.
inline __m512i round_half_away(__m512 v) {
  const __m512 rne = _mm512_sub_ps(_mm512_add_ps(v, kBias), kBias);
  const __m512 diff = _mm512_sub_ps(v, rne);
  const __m512 zero = _mm512_setzero_ps();
  const __mmask16 up = _mm512_cmp_ps_mask(diff, _mm512_set1_ps(0.5f), _CMP_EQ_OQ) &
                       _mm512_cmp_ps_mask(v, zero, _CMP_GT_OQ);
  const __mmask16 down = _mm512_cmp_ps_mask(diff, _mm512_set1_ps(-0.5f), _CMP_EQ_OQ) &
                         _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ);
  __m512i r = _mm512_cvttps_epi32(rne);
  r = _mm512_mask_add_epi32(r, up, r, _mm512_set1_epi32(1));
  return _mm512_mask_sub_epi32(r, down, r, _mm512_set1_epi32(1));
}

}  // namespace

void quantize_q8_k_avx512(const float* x, BlockQ8_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    __m512 v[16];
    __m512 acc = _mm512_setzero_ps();
    for (int j = 0; j < 16; ++j) {
      v[j] = _mm512_loadu_ps(x + 16 * j);
      acc = _mm512_max_ps(abs_ps(v[j]), acc);  // a NaN lane keeps acc
    }
    const float amax = _mm512_reduce_max_ps(acc);
    if (amax == 0) {
      y[i] = BlockQ8_K{};
      continue;
    }
    // The scalar loop keeps the first x with the largest |x| (strictly greater replaces).
    float max = 0;
    const __m512 am = _mm512_set1_ps(amax);
    for (int j = 0; j < 16; ++j) {
      const __mmask16 hit = _mm512_cmp_ps_mask(abs_ps(v[j]), am, _CMP_EQ_OQ);
      if (hit != 0) {
        max = x[16 * j + __builtin_ctz(hit)];
        break;
      }
    }
    const float iscale = -127.f / max;
    const __m512 is = _mm512_set1_ps(iscale);
    alignas(64) int32_t sums[16];
    for (int j = 0; j < 16; ++j) {
      const __m512i q = _mm512_min_epi32(nearest_int(_mm512_mul_ps(is, v[j])),
                                         _mm512_set1_epi32(127));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y[i].qs + 16 * j), _mm512_cvtepi32_epi8(q));
      // bsums of the int8 values (the cast wraps as the scalar one does).
      sums[j] = _mm512_reduce_add_epi32(_mm512_srai_epi32(_mm512_slli_epi32(q, 24), 24));
    }
    for (int j = 0; j < 16; ++j) y[i].bsums[j] = static_cast<int16_t>(sums[j]);
    y[i].d = 1 / iscale;
  }
}

void quantize_q8_0_act_avx512(const float* x, uint8_t* dst, int64_t cols) {
  const int64_t nb = cols / kQK, nbp = q8_0_act_padded_blocks(nb);
  auto* blk = reinterpret_cast<BlockQ8_0*>(dst);
  auto* negc = reinterpret_cast<int32_t*>(dst + q8_0_act_aux_offset(nb));
  auto* dv = reinterpret_cast<float*>(negc + nbp);
  for (int64_t b = 0; b < nb; ++b, x += kQK) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(
        _mm512_max_ps(abs_ps(v1), _mm512_max_ps(abs_ps(v0), _mm512_setzero_ps())));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const Half h = f32_to_f16(d);
    std::memcpy(&blk[b].d, &h, sizeof(h));
    const __m512 iv = _mm512_set1_ps(id);
    const __m512i q0 = round_half_away(_mm512_mul_ps(v0, iv));
    const __m512i q1 = round_half_away(_mm512_mul_ps(v1, iv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(blk[b].qs), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(blk[b].qs + 16), _mm512_cvtepi32_epi8(q1));
    const __m512i w0 = _mm512_srai_epi32(_mm512_slli_epi32(q0, 24), 24);
    const __m512i w1 = _mm512_srai_epi32(_mm512_slli_epi32(q1, 24), 24);
    negc[b] = -128 * _mm512_reduce_add_epi32(_mm512_add_epi32(w0, w1));
    dv[b] = f16_to_f32(h);
  }
  for (int64_t b = nb; b < nbp; ++b) {
    negc[b] = 0;
    dv[b] = 0.0f;
  }
}

void quantize_i8_act_avx512(const float* x, uint8_t* dst, int64_t cols, int64_t group) {
  const int64_t groups = cols / group;
  auto* q = reinterpret_cast<int8_t*>(dst);
  auto* sa = reinterpret_cast<float*>(dst + act_scales_offset(cols));
  auto* sums = reinterpret_cast<int32_t*>(dst + act_scales_offset(cols) + groups * 4);
  uint8_t* biased = dst + act_biased_offset(cols, groups);
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  for (int64_t g = 0; g < groups; ++g, x += group) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t k = 0; k < group; k += 16) acc = _mm512_max_ps(abs_ps(_mm512_loadu_ps(x + k)), acc);
    const float amax = _mm512_reduce_max_ps(acc);
    const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
    const __m512 inv = _mm512_set1_ps(1.0f / s);
    __m512i sum = _mm512_setzero_si512();
    for (int64_t k = 0; k < group; k += 16) {
      // nearbyint in the default rounding mode (to nearest even), then the clamp.
      const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x + k), inv),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m512i v = _mm512_cvttps_epi32(_mm512_max_ps(_mm512_min_ps(r, hi), lo));
      const __m128i b = _mm512_cvtepi32_epi8(v);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + g * group + k), b);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(biased + g * group + k),
                       _mm_xor_si128(b, _mm_set1_epi8(static_cast<char>(0x80))));
      sum = _mm512_add_epi32(sum, v);
    }
    sa[g] = s;
    sums[g] = _mm512_reduce_add_epi32(sum);
  }
}

void f32_to_bf16_avx512(const float* x, uint16_t* y, int64_t n) {
  const __m512i one = _mm512_set1_epi32(1), round = _mm512_set1_epi32(0x7FFF);
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(x + i);
    // Round to nearest even: u + 0x7FFF + bit 16; a NaN keeps its top bits, made quiet.
    const __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, round),
                         _mm512_and_si512(_mm512_srli_epi32(u, 16), one)),
        16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
    const __m512i h = _mm512_mask_or_epi32(
        r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), _mm512_cvtepi32_epi16(h));
  }
  for (; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}

}  // namespace tandem::kern::detail
