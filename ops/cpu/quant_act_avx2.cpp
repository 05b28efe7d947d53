// Activation quantization and SwiGLU on AVX2 (the baseline x86-64-v3; -ffp-contract=off like the
// other kernel units): the algorithms of quant_act_impl.h and silu_impl.h over 8-lane traits.
#include <immintrin.h>

#include "ops/cpu/quant_act_impl.h"
#include "ops/cpu/silu_impl.h"

namespace tandem::kern::detail {
namespace {

struct Avx2 {
  using F = __m256;
  using I = __m256i;
  static constexpr int kLanes = 8;
  static F fzero() { return _mm256_setzero_ps(); }
  static I zero() { return _mm256_setzero_si256(); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static I set1_i(int32_t v) { return _mm256_set1_epi32(v); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static I add(I a, I b) { return _mm256_add_epi32(a, b); }
  static F abs(F v) {
    return _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7FFFFFFF)));
  }
  static F max(F a, F acc) { return _mm256_max_ps(a, acc); }  // a NaN lane of a keeps acc
  static float hmax(F v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
  }
  static uint32_t eq_mask(F a, F b) {
    return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_EQ_OQ)));
  }
  static int32_t hsum(I v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
  }
  static I min127(I v) { return _mm256_min_epi32(v, _mm256_set1_epi32(127)); }
  static I as_int8(I v) { return _mm256_srai_epi32(_mm256_slli_epi32(v, 24), 24); }
  static I nearest_int(F v) {
    const I bits = _mm256_castps_si256(_mm256_add_ps(v, _mm256_set1_ps(12582912.0f)));
    return _mm256_sub_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x007FFFFF)),
                            _mm256_set1_epi32(0x00400000));
  }
  static I round_half_away(F v) {
    const F bias = _mm256_set1_ps(12582912.0f);
    const F rne = _mm256_sub_ps(_mm256_add_ps(v, bias), bias);
    const F diff = _mm256_sub_ps(v, rne);
    const F up = _mm256_and_ps(_mm256_cmp_ps(diff, _mm256_set1_ps(0.5f), _CMP_EQ_OQ),
                               _mm256_cmp_ps(v, fzero(), _CMP_GT_OQ));
    const F down = _mm256_and_ps(_mm256_cmp_ps(diff, _mm256_set1_ps(-0.5f), _CMP_EQ_OQ),
                                 _mm256_cmp_ps(v, fzero(), _CMP_LT_OQ));
    // A true comparison is all ones (-1): subtracting it adds 1.
    const I r = _mm256_sub_epi32(_mm256_cvttps_epi32(rne), _mm256_castps_si256(up));
    return _mm256_add_epi32(r, _mm256_castps_si256(down));
  }
  static I nearbyint_clamp127(F v) {
    const F r = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_cvttps_epi32(
        _mm256_max_ps(_mm256_min_ps(r, _mm256_set1_ps(127.0f)), _mm256_set1_ps(-127.0f)));
  }
  // The low byte of each lane, 8 bytes in lane order.
  static void store_low_bytes(I v, void* dst) {
    const I pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                    0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const I b = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, pick),
                                            _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
    _mm_storel_epi64(static_cast<__m128i*>(dst), _mm256_castsi256_si128(b));
  }
  // Two vectors' lanes (0..0xFFFF: the unsigned saturation keeps them) as 16 uint16 in order.
  static void bf16_16(const float* p, uint16_t* dst) {
    const I v = _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16_bits(p), bf16_bits(p + 8)), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), v);
  }
  static I bf16_bits(const float* p) {
    const I u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const I r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)),
                         _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))),
        16);
    const I nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                     _mm256_set1_epi32(0x7F800000));
    const I q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
    return _mm256_blendv_epi8(r, q, nan);
  }
  // SwiGLU (silu_impl.h).
  static F fadd(F a, F b) { return _mm256_add_ps(a, b); }
  static F fdiv(F a, F b) { return _mm256_div_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static F fmin(F a, F b) { return _mm256_min_ps(a, b); }
  static F neg(F v) { return _mm256_xor_ps(v, _mm256_set1_ps(-0.0f)); }
  static F round_even(F v) {
    return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static F pow2(F n) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static F inf_if_gt(F x, F t, F v) {
    return _mm256_blendv_ps(v, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(x, t, _CMP_GT_OQ));
  }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
};

}  // namespace

void quantize_q8_k_avx2(const float* x, BlockQ8_K* y, int64_t nb) {
  quantize_q8_k_impl<Avx2>(x, y, nb);
}
void quantize_q8_0_act_avx2(const float* x, uint8_t* dst, int64_t cols) {
  quantize_q8_0_act_impl<Avx2>(x, dst, cols);
}
void quantize_i8_act_avx2(const float* x, uint8_t* dst, int64_t cols, int64_t group) {
  quantize_i8_act_impl<Avx2>(x, dst, cols, group);
}
void f32_to_bf16_avx2(const float* x, uint16_t* y, int64_t n) {
  f32_to_bf16_impl<Avx2>(x, y, n);
}
void swiglu_avx2(const float* gate, const float* up, int64_t n, float* out) {
  swiglu_impl<Avx2>(gate, up, n, out);
}

}  // namespace tandem::kern::detail
