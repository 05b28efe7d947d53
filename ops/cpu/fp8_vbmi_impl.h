// Internal to the FP8 GEMVs with AVX-512 VBMI (packed_fp8_vbmi.cpp: BF16 dot, the E4M3 -> BF16
// byte tables; packed_fp8_vbmi_f32.cpp: F32 FMA, GFNI instead of the tables): the row loop.
// Include after the file's `#pragma GCC target` (AVX-512 + VBMI). Internal linkage (an anonymous
// namespace): each file keeps its own instances, compiled for its own ISA.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "ops/cpu/packed_kernels.h"

namespace tandem::kern::detail {
namespace {

// The two 128-entry byte tables of every E4M3 magnitude's BF16: its high and its low byte (the
// bytes of fp8_bf16_table, exact for subnormals too), each as two 64-byte halves.
struct Fp8Tables {
  __m512i hi0, hi1, lo0, lo1;  // bytes of the BF16 of magnitudes 0-63 and 64-127
};

inline Fp8Tables make_fp8_tables() {
  alignas(64) uint8_t hi[128], lo[128];
  const uint16_t* bf16 = fp8_bf16_table();
  for (int v = 0; v < 128; ++v) {
    hi[v] = static_cast<uint8_t>(bf16[v] >> 8);
    lo[v] = static_cast<uint8_t>(bf16[v] & 0xFF);
  }
  return {_mm512_load_si512(hi), _mm512_load_si512(hi + 64), _mm512_load_si512(lo),
          _mm512_load_si512(lo + 64)};
}

// Byte i of the result: byte b[i] & 127 of the 128-byte table (t0, t1). vpermt2b overwrites the
// table's first half (a register copy, free at rename); GCC's choice, vpermi2b, overwrites the
// index and reloads the weights for each use.
inline __m512i permute128(__m512i t0, __m512i b, __m512i t1) {
  asm("vpermt2b %2, %1, %0" : "+v"(t0) : "v"(b), "v"(t1));
  return t0;
}

// 64 E4M3 bytes as their BF16 high bytes (sign included) and low bytes.
inline void fp8x64_bf16_bytes(__m512i b, const Fp8Tables& tab, __m512i* hi, __m512i* lo) {
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  *hi = _mm512_ternarylogic_epi32(permute128(tab.hi0, b, tab.hi1), b, sign, 0xF8);  // A | (B & C)
  *lo = permute128(tab.lo0, b, tab.lo1);
}

// Rows [p.n0, p.n1) through row(row's bytes, its scale row, out[NT]), the scale row found by a
// running count and the token count fixed by the template: a 64-bit division and a dispatch per
// row are a visible part of a row's ~100 cycles of work.
template <int NT, class Row>
inline void fp8_scale_rows(const PackedArgs& p, Row&& row) {
  const KMatrix& w = *p.w;
  int64_t rb = (w.row0 + p.n0) / w.block_rows;
  int64_t left = (rb + 1) * w.block_rows - (w.row0 + p.n0);  // rows before the next scale row
  for (int64_t n = p.n0; n < p.n1; ++n) {
    if (left == 0) {
      ++rb;
      left = w.block_rows;
    }
    --left;
    float out[NT];
    row(w.data + n * w.row_bytes, w.scales + rb * w.scale_stride, out);
    for (int t = 0; t < NT; ++t) p.y[t * p.ldy + n] = out[t];
  }
}

}  // namespace
}  // namespace tandem::kern::detail
