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

#include "ops/cpu/packed_impl.h"

namespace tandem::kern::detail {
namespace {

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
  static AB bf16_a(int32_t pair) {
    const VI p = _mm512_set1_epi32(pair);
    return bf16_w(p);
  }
  static VF bf16_dot(VF acc, const WB& w, const AB& a) {
    return _mm512_fmadd_ps(w.odd, a.odd, _mm512_fmadd_ps(w.even, a.even, acc));
  }
  static void fp8_expand(const uint8_t* const* src, int64_t pairs, uint16_t* dst) {
    packed_impl::fp8_expand_lut(src, pairs, dst);
  }
  static VI sub(VI a, VI b) { return _mm512_sub_epi32(a, b); }
  static VI shl7(VI a) { return _mm512_slli_epi32(a, 7); }
  static VF set1_f(float f) { return _mm512_set1_ps(f); }
  static VF load_f(const float* p) { return _mm512_loadu_ps(p); }
  static VF mul_f(VF a, VF b) { return _mm512_mul_ps(a, b); }
  static VF fmadd_f(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
  static VF cvt_f(VI a) { return _mm512_cvtepi32_ps(a); }
  static void store_f(float* p, VF v) { _mm512_storeu_ps(p, v); }
};

// 16 E4M3 bytes to F32 (see packed_avx2.cpp: magnitude bits in F32 position times 2^120).
inline __m512 fp8x16_to_f32(const uint8_t* p) {
  const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i mag = _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x7F)), 20);
  const __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(mag), _mm512_set1_ps(0x1p120f));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x80)), 24);
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign));
}

inline __m512 bf16x16_to_f32(const uint16_t* p) {
  const __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
}

void fp8_kernel(const PackedArgs& p) {
  if (p.a->tokens >= kFp8TileMinTokens) {
    packed_impl::fp8_gemm<Avx512>(p);
    return;
  }
  const KMatrix& w = *p.w;
  const Activations& a = *p.a;
  for (int64_t n = p.n0; n < p.n1; ++n) {
    const uint8_t* wr = w.data + n * w.row_bytes;
    const float* srow = w.scales + ((w.row0 + n) / w.block_rows) * w.scale_stride;
    for (int64_t t0 = 0; t0 < a.tokens; t0 += 4) {
      const int nt = static_cast<int>(a.tokens - t0 < 4 ? a.tokens - t0 : 4);
      const uint16_t* ar[4];
      for (int t = 0; t < nt; ++t) ar[t] = reinterpret_cast<const uint16_t*>(a.row(t0 + t));
      // Per lane: acc = fma(scale, block partial, acc); one reduction per row and token.
      __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                       _mm512_setzero_ps()};
      for (int64_t b0 = 0; b0 < w.cols; b0 += w.block_cols) {
        const int64_t b1 = b0 + w.block_cols < w.cols ? b0 + w.block_cols : w.cols;
        __m512 part[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                          _mm512_setzero_ps()};
        for (int64_t k = b0; k < b1; k += 16) {
          if (k % 64 == 0) _mm_prefetch(reinterpret_cast<const char*>(wr + k) + 4096, _MM_HINT_T0);
          const __m512 wf = fp8x16_to_f32(wr + k);
          for (int t = 0; t < nt; ++t)
            part[t] = _mm512_fmadd_ps(wf, bf16x16_to_f32(ar[t] + k), part[t]);
        }
        const float s = srow[b0 / w.block_cols];
        const __m512 sv = _mm512_set1_ps(s);
        for (int t = 0; t < nt; ++t) acc[t] = _mm512_fmadd_ps(sv, part[t], acc[t]);
      }
      for (int t = 0; t < nt; ++t) p.y[(t0 + t) * p.ldy + n] = _mm512_reduce_add_ps(acc[t]);
    }
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
