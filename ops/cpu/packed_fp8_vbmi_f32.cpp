// FP8Block GEMV (1-4 tokens) with AVX-512 VBMI + GFNI on CPUs without AVX-512 BF16 (Ice Lake):
// compiled for AVX-512 + VBMI + GFNI only; packed_vnni.cpp's avx512_vnni table calls it where the
// CPU has both.
//
// Each E4M3 byte's BF16 (= the high half of its F32) as two bytes computed in place by
// GF2P8AFFINEQB, a bit-linear map of each byte: for a normal value (exponent e = 1..15) the BF16
// exponent e + 120 has the bits e3, ~e3, ~e3, ~e3, ~e3, e2, e1, e0, so the high byte is sign, e3,
// four copies of ~e3 (an affine constant), e2, e1 and the low byte e0 and the three mantissa bits
// (kHighRows / kLowRows below). The subnormals and zeros (e = 0: their BF16 is normalized, not
// affine) are overwritten by a masked vpermb from 8-entry tables (the bytes of fp8_bf16_table)
// and their sign put back by one vpternlogd, in a branch taken only by the 64 bytes that hold one
// (~1% of a block-quantized checkpoint's). Two byte unpacks make 2 x 32 BF16, and each dword of
// those (two BF16) two F32: the low BF16 shifted up, the high one masked. Thirteen vector uops per
// 64 weights, four FMA among them, against ~20 with vpermt2b's 128-entry byte tables (three uops
// each on Ice Lake) and ~30 with the FP16 route (packed_avx512.cpp). Like that route, E4M3's NaN bytes (0x7F, 0xFF) read as 480 (no checkpoint
// holds them). Multiplied into F32 by FMA with the token's activations widened to F32 once per call
// and permuted as the expansion orders the weights. Per row and scale block: four
// F32 partial sums per token (one per expanded vector: the FMA chains), added and post-scaled once
// (acc = fma(scale, part, acc)), one reduction per row. (Same products as the other FP8 kernels;
// their F32 summation order differs, within the bound the conformance test asserts.)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstdint>
#include <vector>

#include "ops/cpu/packed_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,gfni")

#include "ops/cpu/fp8_vbmi_impl.h"

namespace tandem::kern::detail {
namespace {

constexpr int kMaxTokens = 4;
constexpr int kPrefetchBytes = 8192;  // as packed_fp8_vbmi.cpp

// GF2P8AFFINEQB's matrix: output bit i of each byte is the parity of (byte & rows[i]); the
// instruction reads row i from byte 7 - i of the qword.
constexpr uint64_t gf_matrix(const uint8_t (&rows)[8]) {
  uint64_t m = 0;
  for (int i = 0; i < 8; ++i) m |= static_cast<uint64_t>(rows[i]) << (8 * (7 - i));
  return m;
}
// Input bits: 7 sign, 6-3 exponent e3-e0, 2-0 mantissa. High byte (with kHighConstant: bits 5-2
// are ~e3): bit 7 sign, 6 e3, 5-2 e3 (inverted), 1 e2, 0 e1. Low byte: bit 7 e0, 6-4 the mantissa.
constexpr uint8_t kHighRows[8] = {0x10, 0x20, 0x40, 0x40, 0x40, 0x40, 0x40, 0x80};
constexpr uint8_t kLowRows[8] = {0, 0, 0, 0, 0x01, 0x02, 0x04, 0x08};
constexpr uint64_t kHighMatrix = gf_matrix(kHighRows), kLowMatrix = gf_matrix(kLowRows);
constexpr int kHighConstant = 0x3C;

// The BF16 high and low bytes of the subnormal magnitudes m = 0..7 (byte m; vpermb reads the
// index's low six bits, which for e = 0 are m).
struct SubnormalTables {
  __m512i hi, lo;
};

SubnormalTables make_subnormal_tables() {
  alignas(64) uint8_t hi[64] = {}, lo[64] = {};
  const uint16_t* bf16 = fp8_bf16_table();
  for (int m = 0; m < 8; ++m) {
    hi[m] = static_cast<uint8_t>(bf16[m] >> 8);
    lo[m] = static_cast<uint8_t>(bf16[m] & 0xFF);
  }
  return {_mm512_load_si512(hi), _mm512_load_si512(lo)};
}

// One token's BF16 row widened to F32 and permuted, per 64 columns, as the expansion orders the
// weights: vector v (0-3) holds, in 128-bit lane l, the columns 16 l + 8 (v / 2) + (v % 2) + 2 i
// (i = 0..3): each widened 16-column vector's elements regrouped by vpermps (lane v: what vector
// v takes from it), then the 4 x 4 transpose of the 128-bit lanes.
void widen_permuted(const uint16_t* a, int64_t cols, float* out) {
  const __m512i regroup = _mm512_set_epi32(15, 13, 11, 9, 14, 12, 10, 8, 7, 5, 3, 1, 6, 4, 2, 0);
  for (int64_t k0 = 0; k0 < cols; k0 += 64) {
    __m512 x[4];
    for (int m = 0; m < 4; ++m) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + k0 + 16 * m));
      x[m] = _mm512_permutexvar_ps(
          regroup, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
    }
    const __m512 t0 = _mm512_shuffle_f32x4(x[0], x[1], 0x44);
    const __m512 t1 = _mm512_shuffle_f32x4(x[0], x[1], 0xEE);
    const __m512 t2 = _mm512_shuffle_f32x4(x[2], x[3], 0x44);
    const __m512 t3 = _mm512_shuffle_f32x4(x[2], x[3], 0xEE);
    _mm512_storeu_ps(out + k0, _mm512_shuffle_f32x4(t0, t2, 0x88));
    _mm512_storeu_ps(out + k0 + 16, _mm512_shuffle_f32x4(t0, t2, 0xDD));
    _mm512_storeu_ps(out + k0 + 32, _mm512_shuffle_f32x4(t1, t3, 0x88));
    _mm512_storeu_ps(out + k0 + 48, _mm512_shuffle_f32x4(t1, t3, 0xDD));
  }
}

template <int NT>
inline void fp8_row_f32(const KMatrix& w, const uint8_t* wr, const float* srow,
                        const float* const* ar, const SubnormalTables& tab, float* out) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const __m512i exponent = _mm512_set1_epi8(0x78), sign = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i high_matrix = _mm512_set1_epi64(static_cast<int64_t>(kHighMatrix));
  const __m512i low_matrix = _mm512_set1_epi64(static_cast<int64_t>(kLowMatrix));
  // The 64 weights at k as four F32 vectors (the order above), their products into
  // part[t][0..3]. Each dword of the unpacked BF16 pairs gives two F32: its low BF16 shifted up,
  // its high one masked (a shift and an AND, off the shuffle port: 4 shuffles per 64 weights).
  auto chunk = [&](int64_t k, __m512 (*part)[4]) __attribute__((always_inline)) {
    __builtin_prefetch(wr + k + kPrefetchBytes, 0, 3);
    const __m512i b = _mm512_loadu_si512(wr + k);
    const __mmask64 sub = _mm512_testn_epi8_mask(b, exponent);  // e = 0
    __m512i hi = _mm512_gf2p8affine_epi64_epi8(b, high_matrix, kHighConstant);
    __m512i lo = _mm512_gf2p8affine_epi64_epi8(b, low_matrix, 0);
    if (__builtin_expect(sub != 0, 0)) {
      hi = _mm512_mask_permutexvar_epi8(hi, sub, b, tab.hi);
      lo = _mm512_mask_permutexvar_epi8(lo, sub, b, tab.lo);
      hi = _mm512_ternarylogic_epi32(hi, b, sign, 0xF8);  // hi | (b & sign)
    }
    const __m512i h0 = _mm512_unpacklo_epi8(lo, hi), h1 = _mm512_unpackhi_epi8(lo, hi);
    const __m512 f[4] = {_mm512_castsi512_ps(_mm512_slli_epi32(h0, 16)),
                         _mm512_castsi512_ps(_mm512_and_si512(h0, high)),
                         _mm512_castsi512_ps(_mm512_slli_epi32(h1, 16)),
                         _mm512_castsi512_ps(_mm512_and_si512(h1, high))};
    for (int t = 0; t < NT; ++t) {
      for (int v = 0; v < 4; ++v) {
        part[t][v] = _mm512_fmadd_ps(f[v], _mm512_loadu_ps(ar[t] + k + 16 * v), part[t][v]);
      }
    }
  };
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  int64_t bi = 0;
  for (int64_t b0 = 0; b0 < w.cols; b0 += w.block_cols, ++bi) {
    __m512 part[NT][4];
    for (int t = 0; t < NT; ++t) {
      for (int v = 0; v < 4; ++v) part[t][v] = _mm512_setzero_ps();
    }
    if (w.block_cols == 128 && b0 + 128 <= w.cols) {
      chunk(b0, part);
      chunk(b0 + 64, part);
    } else {
      const int64_t b1 = b0 + w.block_cols < w.cols ? b0 + w.block_cols : w.cols;
      for (int64_t k = b0; k < b1; k += 64) chunk(k, part);
    }
    const __m512 sv = _mm512_set1_ps(srow[bi]);
    for (int t = 0; t < NT; ++t) {
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(part[t][0], part[t][1]),
                                       _mm512_add_ps(part[t][2], part[t][3]));
      acc[t] = _mm512_fmadd_ps(sv, sum, acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = _mm512_reduce_add_ps(acc[t]);
}

template <int NT>
void rows_f32(const PackedArgs& p, const float* const* ar, const SubnormalTables& tab) {
  fp8_scale_rows<NT>(p, [&](const uint8_t* wr, const float* srow, float* out) {
    fp8_row_f32<NT>(*p.w, wr, srow, ar, tab, out);
  });
}

}  // namespace

void fp8_rows_vbmi_f32(const PackedArgs& p) {
  static const SubnormalTables tab = make_subnormal_tables();
  const KMatrix& w = *p.w;
  const Activations& a = *p.a;
  const int nt = static_cast<int>(a.tokens);
  thread_local std::vector<float> wide;
  wide.resize(static_cast<size_t>(nt * w.cols));
  const float* ar[kMaxTokens];
  for (int t = 0; t < nt; ++t) {
    widen_permuted(reinterpret_cast<const uint16_t*>(a.row(t)), w.cols, wide.data() + t * w.cols);
    ar[t] = wide.data() + t * w.cols;
  }
  if (nt == 1) rows_f32<1>(p, ar, tab);
  if (nt == 2) rows_f32<2>(p, ar, tab);
  if (nt == 3) rows_f32<3>(p, ar, tab);
  if (nt == 4) rows_f32<4>(p, ar, tab);
}

}  // namespace tandem::kern::detail

#pragma GCC pop_options
