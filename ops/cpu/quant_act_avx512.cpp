// Activation quantization and SwiGLU on AVX-512 F/BW/VL/DQ (compiled with those flags and
// -ffp-contract=off; see ops/cpu/CMakeLists.txt): the algorithms of quant_act_impl.h and
// silu_impl.h over 16-lane traits.
#include <immintrin.h>

#include "ops/cpu/quant_act_impl.h"
#include "ops/cpu/silu_impl.h"

namespace tandem::kern::detail {
namespace {

struct Avx512 {
  using F = __m512;
  using I = __m512i;
  static constexpr int kLanes = 16;
  static F fzero() { return _mm512_setzero_ps(); }
  static I zero() { return _mm512_setzero_si512(); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static I set1_i(int32_t v) { return _mm512_set1_epi32(v); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  static F abs(F v) {
    return _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF)));
  }
  static F max(F a, F acc) { return _mm512_max_ps(a, acc); }  // a NaN lane of a keeps acc
  static float hmax(F v) { return _mm512_reduce_max_ps(v); }
  static uint32_t eq_mask(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
  static int32_t hsum(I v) { return _mm512_reduce_add_epi32(v); }
  static I min127(I v) { return _mm512_min_epi32(v, _mm512_set1_epi32(127)); }
  static I as_int8(I v) { return _mm512_srai_epi32(_mm512_slli_epi32(v, 24), 24); }
  static I nearest_int(F v) {
    const I bits = _mm512_castps_si512(_mm512_add_ps(v, _mm512_set1_ps(12582912.0f)));
    return _mm512_sub_epi32(_mm512_and_si512(bits, _mm512_set1_epi32(0x007FFFFF)),
                            _mm512_set1_epi32(0x00400000));
  }
  static I round_half_away(F v) {
    const F bias = _mm512_set1_ps(12582912.0f);
    const F rne = _mm512_sub_ps(_mm512_add_ps(v, bias), bias);
    const F diff = _mm512_sub_ps(v, rne);
    const __mmask16 up = _mm512_cmp_ps_mask(diff, _mm512_set1_ps(0.5f), _CMP_EQ_OQ) &
                         _mm512_cmp_ps_mask(v, fzero(), _CMP_GT_OQ);
    const __mmask16 down = _mm512_cmp_ps_mask(diff, _mm512_set1_ps(-0.5f), _CMP_EQ_OQ) &
                           _mm512_cmp_ps_mask(v, fzero(), _CMP_LT_OQ);
    I r = _mm512_cvttps_epi32(rne);
    r = _mm512_mask_add_epi32(r, up, r, _mm512_set1_epi32(1));
    return _mm512_mask_sub_epi32(r, down, r, _mm512_set1_epi32(1));
  }
  // nearbyint (to nearest even, the default mode), clamped to +-127, converted.
  static I nearbyint_clamp127(F v) {
    const F r = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_cvttps_epi32(
        _mm512_max_ps(_mm512_min_ps(r, _mm512_set1_ps(127.0f)), _mm512_set1_ps(-127.0f)));
  }
  static void store_low_bytes(I v, void* dst) {
    _mm_storeu_si128(static_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(v));
  }
  static void bf16_16(const float* p, uint16_t* dst) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi32_epi16(bf16_bits(p)));
  }
  // f32_to_bf16 per lane: u + 0x7FFF + bit 16, the top half; a NaN keeps its top bits, quiet.
  static I bf16_bits(const float* p) {
    const I u = _mm512_loadu_si512(p);
    const I r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)),
                         _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))),
        16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
    return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
  }
  // SwiGLU (silu_impl.h).
  static F fadd(F a, F b) { return _mm512_add_ps(a, b); }
  static F fdiv(F a, F b) { return _mm512_div_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static F fmin(F a, F b) { return _mm512_min_ps(a, b); }
  static F neg(F v) { return _mm512_xor_ps(v, _mm512_set1_ps(-0.0f)); }
  static F round_even(F v) {
    return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static F pow2(F n) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static F inf_if_gt(F x, F t, F v) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, t, _CMP_GT_OQ), v,
                                _mm512_set1_ps(__builtin_inff()));
  }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
};

}  // namespace

void quantize_q8_k_avx512(const float* x, BlockQ8_K* y, int64_t nb) {
  quantize_q8_k_impl<Avx512>(x, y, nb);
}
void quantize_q8_0_act_avx512(const float* x, uint8_t* dst, int64_t cols) {
  quantize_q8_0_act_impl<Avx512>(x, dst, cols);
}
void quantize_i8_act_avx512(const float* x, uint8_t* dst, int64_t cols, int64_t group) {
  quantize_i8_act_impl<Avx512>(x, dst, cols, group);
}
void f32_to_bf16_avx512(const float* x, uint16_t* y, int64_t n) {
  f32_to_bf16_impl<Avx512>(x, y, n);
}
void swiglu_avx512(const float* gate, const float* up, int64_t n, float* out) {
  swiglu_impl<Avx512>(gate, up, n, out);
}

}  // namespace tandem::kern::detail
