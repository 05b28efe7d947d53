// AVX-512 (F/BW/VL/DQ, no VNNI) instantiation of the packed kernels: the AVX2 algorithm at 16
// lanes (one zmm is one 16-row chunk). Every header is included before the target pragma so no
// inline library code is compiled for AVX-512 here (it could be picked for other translation
// units). GCC 12 warns falsely inside its own AVX-512 intrinsic headers (undefined-vector idiom).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "ops/cpu/packed_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

#include "ops/cpu/fp8_expand_avx512.h"
#include "ops/cpu/packed_impl.h"

namespace tandem::kern::detail {
namespace {

// 32 E4M3 bytes to 2^-8 times their F32 values (see packed_avx2.cpp: FP16 bits, vcvtph2ps).
struct F32x32 {
  __m512 lo, hi;
};

inline F32x32 fp8x32_to_f32(const uint8_t* p) {
  const __m512i x = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i h = _mm512_and_si512(_mm512_slli_epi16(x, 7), _mm512_set1_epi16(kFp8F16Bits));
  return {_mm512_cvtph_ps(_mm512_castsi512_si256(h)),
          _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1))};
}

struct Avx512 {
  using VI = __m512i;
  using VF = __m512;
  static constexpr int kLanes = 16, kVecs = 1, kMaxTokens = 8, kTiles = 2;
  static constexpr bool kBiasedS8 = false;
  static VI zero_i() { return _mm512_setzero_si512(); }
  static VF zero_f() { return _mm512_setzero_ps(); }
  static VI load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static VI bcast(int32_t bits) { return _mm512_set1_epi32(bits); }
  static VI dot_s8(VI acc, VI w, VI a) {
    // No vpsignb at 512 bits: negate a where w < 0.
    const __mmask64 neg = _mm512_movepi8_mask(w);
    const VI sa = _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a);
    const VI p = _mm512_maddubs_epi16(_mm512_abs_epi8(w), sa);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_set1_epi16(1)));
  }
  static VI dot_u4(VI acc, VI u, VI a) {
    const VI p = _mm512_maddubs_epi16(u, a);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_set1_epi16(1)));
  }
  static VI low_nibbles(VI b) { return _mm512_and_si512(b, _mm512_set1_epi8(0x0F)); }
  static VI high_nibbles(VI b) {
    return _mm512_and_si512(_mm512_srli_epi16(b, 4), _mm512_set1_epi8(0x0F));
  }
  // BF16 tiles without BF16 instructions: even / odd halves of each 32-bit lane widened to F32
  // (exact) and two FMAs, k order (bit-identical to the reference).
  struct WB {
    VF even, odd;
  };
  using AB = WB;
  static WB bf16_w(VI chunk) {
    return {_mm512_castsi512_ps(_mm512_slli_epi32(chunk, 16)),
            _mm512_castsi512_ps(_mm512_and_si512(chunk, _mm512_set1_epi32(-65536)))};
  }
  // The k pair c of an activation row, from its F32 copy (act_f32_offset): two broadcasts.
  static AB bf16_a_at(const uint8_t* row, int64_t c, int64_t cols) {
    const auto* f = reinterpret_cast<const float*>(row + act_f32_offset(cols)) + 2 * c;
    return {_mm512_set1_ps(f[0]), _mm512_set1_ps(f[1])};
  }
  static VF bf16_dot(VF acc, const WB& w, const AB& a) {
    return _mm512_fmadd_ps(w.odd, a.odd, _mm512_fmadd_ps(w.even, a.even, acc));
  }
  static void fp8_expand(const uint8_t* const* src, int64_t pairs, uint16_t* dst) {
    fp8_expand_avx512(src, pairs, dst);
  }
  // FP8 rows (few tokens): 32 E4M3 widened to F32 (times 2^-8), two FMAs with the BF16
  // activations' F32 copy (act_f32_offset), two partial sums per token and block.
  static constexpr int kFp8Step = 32;
  static constexpr float kFp8Scale = 256.0f;
  using F8 = F32x32;
  using FA = float;
  using FP = F32x32;
  static F8 fp8_load(const uint8_t* w) { return fp8x32_to_f32(w); }
  static FP fp8_zero() { return {_mm512_setzero_ps(), _mm512_setzero_ps()}; }
  static FP fp8_dot(const FP& part, const F8& w, const float* a) {
    return {_mm512_fmadd_ps(w.lo, _mm512_loadu_ps(a), part.lo),
            _mm512_fmadd_ps(w.hi, _mm512_loadu_ps(a + 16), part.hi)};
  }
  static VF fp8_part(const FP& p) { return _mm512_add_ps(p.lo, p.hi); }
  static float hsum_f(VF v) { return _mm512_reduce_add_ps(v); }
  static VI add_i(VI a, VI b) { return _mm512_add_epi32(a, b); }
  static VI sub(VI a, VI b) { return _mm512_sub_epi32(a, b); }
  static VI shl7(VI a) { return _mm512_slli_epi32(a, 7); }
  static VF set1_f(float f) { return _mm512_set1_ps(f); }
  static VF load_f(const float* p) { return _mm512_loadu_ps(p); }
  static VF mul_f(VF a, VF b) { return _mm512_mul_ps(a, b); }
  static VF fmadd_f(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
  static VF cvt_f(VI a) { return _mm512_cvtepi32_ps(a); }
  static void store_f(float* p, VF v) { _mm512_storeu_ps(p, v); }
};

void fp8_kernel(const PackedArgs& p) {
  if (p.a->tokens >= kFp8TileMinTokens) {
    packed_impl::fp8_gemm<Avx512>(p);
  } else {
    packed_impl::fp8_row_kernel<Avx512>(p);
  }
}

}  // namespace

const PackedKernels& packed_kernels_avx512() {
  static const PackedKernels k{&packed_impl::int_kernel<Avx512, false>,
                               &packed_impl::int_kernel<Avx512, true>, &fp8_kernel,
                               &packed_impl::bf16_kernel<Avx512>};
  return k;
}

}  // namespace tandem::kern::detail

#pragma GCC pop_options
