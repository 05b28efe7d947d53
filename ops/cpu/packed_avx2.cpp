// AVX2 instantiation of the packed kernels (the x86-64-v3 baseline: no pragma needed). No VNNI:
// the signed INT8 dot is vpmaddubsw(|w|, sign(a, w)) (|w|, |a| <= 127: pair sums fit int16), then
// vpmaddwd with ones; INT4 nibbles (0..15) are already unsigned. No BF16 instructions exist at this
// level: FP8 is expanded to F32 (through FP16) and the BF16 activations widened (exact), then FMA.
#include <immintrin.h>

#include "ops/cpu/packed_impl.h"

namespace tandem::kern::detail {
namespace {

// 16 E4M3 bytes to 2^-8 times their F32 values, exactly: sign-extended to 16 bits and shifted left
// by 7, a byte is an FP16 (sign in bit 15, its copy in bit 14 masked off by kFp8F16Bits, exponent
// and mantissa in bits 7-13: FP16's bias 15 against E4M3's 7, subnormals included), which
// vcvtph2ps widens. (Not a multiply of F32 subnormal bits by 2^120: Intel cores take a microcode
// assist per vector with a subnormal input, measured 16x slower on random E4M3 bytes.)
struct F32x16 {
  __m256 lo, hi;
};

inline F32x16 fp8x16_to_f32(const uint8_t* p) {
  const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i h = _mm256_and_si256(_mm256_slli_epi16(x, 7), _mm256_set1_epi16(kFp8F16Bits));
  return {_mm256_cvtph_ps(_mm256_castsi256_si128(h)),
          _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

struct Avx2 {
  using VI = __m256i;
  using VF = __m256;
  static constexpr int kLanes = 8, kVecs = 2, kMaxTokens = 4, kTiles = 1;
  static constexpr bool kBiasedS8 = false;
  static VI zero_i() { return _mm256_setzero_si256(); }
  static VF zero_f() { return _mm256_setzero_ps(); }
  static VI load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const VI*>(p)); }
  static VI bcast(int32_t bits) { return _mm256_set1_epi32(bits); }
  static VI dot_s8(VI acc, VI w, VI a) {
    const VI p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }
  static VI dot_u4(VI acc, VI u, VI a) {
    const VI p = _mm256_maddubs_epi16(u, a);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }
  static VI low_nibbles(VI b) { return _mm256_and_si256(b, _mm256_set1_epi8(0x0F)); }
  static VI high_nibbles(VI b) {
    return _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi8(0x0F));
  }
  // BF16 tiles: even / odd halves of each 32-bit lane widened to F32 (exact), two FMAs in k order.
  struct WB {
    VF even, odd;
  };
  using AB = WB;
  static WB bf16_w(VI chunk) {
    return {_mm256_castsi256_ps(_mm256_slli_epi32(chunk, 16)),
            _mm256_castsi256_ps(_mm256_and_si256(chunk, _mm256_set1_epi32(-65536)))};
  }
  // The k pair c of an activation row, from its F32 copy (act_f32_offset): two broadcasts.
  static AB bf16_a_at(const uint8_t* row, int64_t c, int64_t cols) {
    const auto* f = reinterpret_cast<const float*>(row + act_f32_offset(cols)) + 2 * c;
    return {_mm256_set1_ps(f[0]), _mm256_set1_ps(f[1])};
  }
  static VF bf16_dot(VF acc, const WB& w, const AB& a) {
    return _mm256_fmadd_ps(w.odd, a.odd, _mm256_fmadd_ps(w.even, a.even, acc));
  }
  static void fp8_expand(const uint8_t* const* src, int64_t pairs, uint16_t* dst) {
    packed_impl::fp8_expand_lut(src, pairs, dst);
  }
  // FP8 rows (few tokens): 16 E4M3 widened to F32 (times 2^-8), two FMAs with the BF16
  // activations' F32 copy (act_f32_offset), two partial sums per token and block.
  static constexpr int kFp8Step = 16;
  static constexpr float kFp8Scale = 256.0f;
  using F8 = F32x16;
  using FA = float;
  using FP = F32x16;
  static F8 fp8_load(const uint8_t* w) { return fp8x16_to_f32(w); }
  static FP fp8_zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static FP fp8_dot(const FP& part, const F8& w, const float* a) {
    return {_mm256_fmadd_ps(w.lo, _mm256_loadu_ps(a), part.lo),
            _mm256_fmadd_ps(w.hi, _mm256_loadu_ps(a + 8), part.hi)};
  }
  static VF fp8_part(const FP& p) { return _mm256_add_ps(p.lo, p.hi); }
  static float hsum_f(VF v) { return hsum(v); }
  static VI add_i(VI a, VI b) { return _mm256_add_epi32(a, b); }
  static VI sub(VI a, VI b) { return _mm256_sub_epi32(a, b); }
  static VI shl7(VI a) { return _mm256_slli_epi32(a, 7); }
  static VF set1_f(float f) { return _mm256_set1_ps(f); }
  static VF load_f(const float* p) { return _mm256_loadu_ps(p); }
  static VF mul_f(VF a, VF b) { return _mm256_mul_ps(a, b); }
  static VF fmadd_f(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
  static VF cvt_f(VI a) { return _mm256_cvtepi32_ps(a); }
  static void store_f(float* p, VF v) { _mm256_storeu_ps(p, v); }
};

void fp8_kernel(const PackedArgs& p) {
  if (p.a->tokens >= kFp8TileMinTokens) {
    packed_impl::fp8_gemm<Avx2>(p);
  } else {
    packed_impl::fp8_row_kernel<Avx2>(p);
  }
}

}  // namespace

const PackedKernels& packed_kernels_avx2() {
  static const PackedKernels k{&packed_impl::int_kernel<Avx2, false>,
                               &packed_impl::int_kernel<Avx2, true>, &fp8_kernel,
                               &packed_impl::bf16_kernel<Avx2>};
  return k;
}

}  // namespace tandem::kern::detail
