// E4M3 -> BF16 tile chunks with AVX-512 BW (internal linkage: include it only in translation units
// compiled for AVX-512, after their target pragma). The FP8 tile GEMM (packed_impl::fp8_rows)
// expands each 16-row tile chunk once for every token of the call through T::fp8_expand:
// packed_vnni.cpp (then vdpbf16ps) and packed_avx512.cpp (then widened to F32 and FMA: AVX-512
// CPUs without a BF16 dot, and VNNI ones such as Ice Lake) use this instead of the scalar table
// (packed_impl::fp8_expand_lut), the same bits.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "ops/cpu/avx512_transpose.h"
#include "ops/cpu/packed_impl.h"

namespace tandem::kern::detail {
namespace {

// 32 E4M3 bytes to 32 BF16: normal values rebias the exponent (+120) with one shift and add;
// subnormals (exponent 0: m * 2^-9, normal in BF16) come from an 8-entry table.
inline __m512i fp8x32_to_bf16(const uint8_t* p) {
  const __m512i x = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i mag = _mm512_and_si512(x, _mm512_set1_epi16(0x7F));
  const __m512i normal = _mm512_add_epi16(_mm512_slli_epi16(mag, 4), _mm512_set1_epi16(0x3C00));
  const __m512i sub_lut =
      _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  //
                       0, 0, 0, 0, 0, 0, 0, 0,                          //
                       0x3C60, 0x3C40, 0x3C20, 0x3C00, 0x3BC0, 0x3B80, 0x3B00, 0);
  const __mmask32 is_sub = _mm512_testn_epi16_mask(x, _mm512_set1_epi16(0x78));
  const __m512i v = _mm512_mask_permutexvar_epi16(normal, is_sub, mag, sub_lut);
  const __m512i sign = _mm512_slli_epi16(_mm512_and_si512(x, _mm512_set1_epi16(0x80)), 8);
  return _mm512_or_si512(v, sign);
}

// 16 FP8 rows x 32 columns per step: each row expanded to 16 BF16 pairs (dwords), then a 16 x 16
// dword transpose gives the 16 chunks (16 rows of one pair each). Padding rows are zero.
inline void fp8_expand_transpose(const uint8_t* const* src, int64_t pairs, uint16_t* dst) {
  for (int64_t c0 = 0; c0 < pairs; c0 += 16) {
    __m512i r[16], out[16];
    for (int i = 0; i < 16; ++i) {
      r[i] = src[i] != nullptr ? fp8x32_to_bf16(src[i] + 2 * c0) : _mm512_setzero_si512();
    }
    transpose16_epi32(r, out);
    for (int c = 0; c < 16; ++c) _mm512_storeu_si512(dst + (c0 + c) * 32, out[c]);
  }
}

// fp8_expand_lut's contract: the transposition where pairs is a multiple of 16, else the table.
inline void fp8_expand_avx512(const uint8_t* const* src, int64_t pairs, uint16_t* dst) {
  if (pairs % 16 == 0) {
    fp8_expand_transpose(src, pairs, dst);
  } else {
    packed_impl::fp8_expand_lut(src, pairs, dst);
  }
}

}  // namespace
}  // namespace tandem::kern::detail
