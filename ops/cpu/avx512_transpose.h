// A 16 x 16 transpose of 32-bit elements in AVX-512 registers (internal linkage: include it only
// in translation units compiled for AVX-512, after their target pragma or with -mavx512f).
// Used to turn 16 row-major weight rows into the 16-row chunks of the tile layouts (one dword of
// each row per 64-byte chunk): FP8 -> BF16 tiles (packed_vnni.cpp), Q4_K nibbles
// (kern_gguf_vnni.cpp).
#pragma once

#include <immintrin.h>

namespace tandem::kern::detail {
namespace {

// out[c] = (r[0][c], r[1][c], ..., r[15][c]): unpack 32 / 64-bit, then two rounds of 128-bit lane
// shuffles. r and out may not alias.
inline void transpose16_epi32(const __m512i* r, __m512i* out) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4i + j], 128-bit lane L: rows 4i..4i+3 of column j + 4L.
  for (int i = 0; i < 4; ++i) {
    u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i v = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88);  // lanes 0, 2 of each
    const __m512i w = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xDD);  // lanes 1, 3
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
    const __m512i w2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xDD);
    out[j] = _mm512_shuffle_i32x4(v, v2, 0x88);
    out[j + 4] = _mm512_shuffle_i32x4(w, w2, 0x88);
    out[j + 8] = _mm512_shuffle_i32x4(v, v2, 0xDD);
    out[j + 12] = _mm512_shuffle_i32x4(w, w2, 0xDD);
  }
}

}  // namespace
}  // namespace tandem::kern::detail
