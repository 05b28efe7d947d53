// FP8Block GEMV (1-4 tokens) with AVX-512 VBMI on CPUs without AVX-512 BF16 (Ice Lake): compiled
// for AVX-512 + VBMI only; packed_vnni.cpp's avx512_vnni table calls it where the CPU has VBMI.
//
// The weights' expansion is packed_fp8_vbmi.cpp's: 64 E4M3 bytes through two 128-entry byte tables
// (vpermt2b) into each value's BF16 high and low byte (exact, subnormals included), the sign put
// back by one vpternlogd, two byte unpacks into 2 x 32 BF16. Without vdpbf16ps, four word unpacks
// against zero make those 4 x 16 F32 (a BF16 is the high half of its F32), multiplied into F32 by
// FMA with the token's activations widened to F32 once per call, permuted as the unpacks order the
// weights. Nine shuffles per 64 weights on one port, against the ~20 of the FP16 route
// (packed_avx512.cpp), which left the GEMV compute-bound on Ice Lake. Per row and scale block: four
// F32 partial sums per token (one per unpacked vector: the FMA chains), added and post-scaled once
// (acc = fma(scale, part, acc)), one reduction per row. (Same products as the other FP8 kernels;
// their F32 summation order differs, within the bound the conformance test asserts.)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstdint>
#include <vector>

#include "ops/cpu/packed_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi")

#include "ops/cpu/fp8_vbmi_impl.h"

namespace tandem::kern::detail {
namespace {

constexpr int kMaxTokens = 4;
constexpr int kPrefetchBytes = 8192;  // as packed_fp8_vbmi.cpp

// One token's BF16 row widened to F32 and permuted, per 64 columns, as the unpacks order the
// weights: vector v (0-3) holds, in 128-bit lane l, the columns 16 l + 4 v + (0..3), i.e. the
// 4 x 4 transpose of the 128-bit lanes of the four widened 16-column vectors.
void widen_permuted(const uint16_t* a, int64_t cols, float* out) {
  for (int64_t k0 = 0; k0 < cols; k0 += 64) {
    __m512 x[4];
    for (int m = 0; m < 4; ++m) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + k0 + 16 * m));
      x[m] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
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
                        const float* const* ar, const Fp8Tables& tab, float* out) {
  const __m512i zero = _mm512_setzero_si512();
  // The 64 weights at k as four F32 vectors (unpack order), their products into part[t][0..3].
  auto chunk = [&](int64_t k, __m512 (*part)[4]) __attribute__((always_inline)) {
    __builtin_prefetch(wr + k + kPrefetchBytes, 0, 3);
    __m512i hi, lo;
    fp8x64_bf16_bytes(_mm512_loadu_si512(wr + k), tab, &hi, &lo);
    const __m512i h0 = _mm512_unpacklo_epi8(lo, hi), h1 = _mm512_unpackhi_epi8(lo, hi);
    const __m512 f[4] = {_mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, h0)),
                         _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, h0)),
                         _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, h1)),
                         _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, h1))};
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
void rows_f32(const PackedArgs& p, const float* const* ar, const Fp8Tables& tab) {
  fp8_scale_rows<NT>(p, [&](const uint8_t* wr, const float* srow, float* out) {
    fp8_row_f32<NT>(*p.w, wr, srow, ar, tab, out);
  });
}

}  // namespace

void fp8_rows_vbmi_f32(const PackedArgs& p) {
  static const Fp8Tables tab = make_fp8_tables();
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
