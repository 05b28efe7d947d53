// The Q4_K x16 one-token kernel (ops/cpu/q4k_x16.h), AVX-512 VNNI. Per super-block slice of a
// tile: 32 vpdpbusd pairs (low nibbles by AND, high nibbles as AND 0xF0, i.e. 16 x the value:
// its sub-block's sum is shifted right by 4 once, exactly), one accumulator per sub-block with a
// row per lane; the 16 rows' 16-byte headers transposed into four vectors (a word per row), the
// scales and mins unpacked in lanes; then isum = sum of scale * dot and msum = sum of min *
// (bsums pair) by vpmulld, and the reference's F32 steps a row per lane.
#include <immintrin.h>

#include <cstdint>

#include "formats/quant.h"
#include "ops/cpu/q4k_x16.h"

namespace tandem::kern {

namespace {

constexpr int64_t kSlice = 16 * static_cast<int64_t>(sizeof(BlockQ4_K));
// Software prefetch distance: every line of the stream, this far ahead (the hardware prefetchers
// alone left the kernel at ~half the DRAM bandwidth).
constexpr int kPrefetch = 8192;

// One prefetch as an ordered statement: with _mm_prefetch the compiler hoisted a slice's 36
// prefetches into one burst at its start (more than the core's L1 miss buffers take at once),
// which read DRAM ~10% slower than spreading them over the slice (docs/cpu-kernels.md).
inline void prefetch_t0(const uint8_t* p) {
  asm volatile("prefetcht0 %0" : : "m"(*reinterpret_cast<const char*>(p)));
}

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

// Row n's header word k (bytes 4k .. 4k + 3 of its 16) in lane n.
inline void header_words(const uint8_t* h, __m512i* word) {
  const __m512i z0 = _mm512_loadu_si512(h), z1 = _mm512_loadu_si512(h + 64);
  const __m512i z2 = _mm512_loadu_si512(h + 128), z3 = _mm512_loadu_si512(h + 192);
  const __m512i lo = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i hi = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 8, 12, 16, 20, 24, 28);
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const __m512i kk = _mm512_set1_epi32(k);
    const __m512i a = _mm512_permutex2var_epi32(z0, _mm512_add_epi32(lo, kk), z1);
    const __m512i b = _mm512_permutex2var_epi32(z2, _mm512_add_epi32(hi, kk), z3);
    word[k] = _mm512_mask_mov_epi32(a, 0xFF00, b);
  }
}

void gemv_tile(const uint8_t* t, int64_t nb, const BlockQ8_K* act, float* y) {
  const __m512i m0f = _mm512_set1_epi8(0x0F), mf0 = _mm512_set1_epi8(static_cast<char>(0xF0));
  const __m512i m3f = _mm512_set1_epi32(0x3F3F3F3F), m0f32 = _mm512_set1_epi32(0x0F0F0F0F);
  const __m512i m30 = _mm512_set1_epi32(0x30303030), ff = _mm512_set1_epi32(0xFF);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, t += kSlice) {
    const int8_t* aq = act[b].qs;
    const uint8_t* q = t + 256;
    for (int l = 0; l < 4; ++l) prefetch_t0(t + kPrefetch + 64 * l);
    __m512i s[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) s[j] = _mm512_setzero_si512();
#pragma GCC unroll 32
    for (int c = 0; c < 32; ++c) {
      if (c % 4 == 0) {  // four lines at a time, one group per four chunks
        for (int l = 0; l < 4; ++l) prefetch_t0(q + kPrefetch + 64 * (c + l));
      }
      const __m512i w = _mm512_loadu_si512(q + 64 * c);
      const int g = c / 8, i = c % 8;
      s[2 * g] = _mm512_dpbusd_epi32(s[2 * g], _mm512_and_si512(w, m0f),
                                     _mm512_set1_epi32(load_i32(aq + 64 * g + 4 * i)));
      s[2 * g + 1] = _mm512_dpbusd_epi32(s[2 * g + 1], _mm512_and_si512(w, mf0),
                                         _mm512_set1_epi32(load_i32(aq + 64 * g + 32 + 4 * i)));
    }
    // Header words: 0 = d | dmin << 16; 1 (A) scales 0-3 and the top bits of scales 4-7; 2 (B)
    // mins 0-3 and the top bits of mins 4-7; 3 (C) the low nibbles of scales / mins 4-7.
    __m512i wd[4];
    header_words(t, wd);
    const __m512i sm[4] = {
        _mm512_and_si512(wd[1], m3f),  // scales 0-3
        _mm512_or_si512(_mm512_and_si512(wd[3], m0f32),
                        _mm512_and_si512(_mm512_srli_epi32(wd[1], 2), m30)),  // scales 4-7
        _mm512_and_si512(wd[2], m3f),                                         // mins 0-3
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(wd[3], 4), m0f32),
                        _mm512_and_si512(_mm512_srli_epi32(wd[2], 2), m30))};  // mins 4-7
    __m512i isum = _mm512_setzero_si512(), msum = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512i sc = _mm512_and_si512(_mm512_srli_epi32(sm[j / 4], 8 * (j % 4)), ff);
      const __m512i mn = _mm512_and_si512(_mm512_srli_epi32(sm[2 + j / 4], 8 * (j % 4)), ff);
      const __m512i dot = j % 2 == 1 ? _mm512_srai_epi32(s[j], 4) : s[j];
      isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(sc, dot));
      const int32_t pair = act[b].bsums[2 * j] + act[b].bsums[2 * j + 1];
      msum = _mm512_add_epi32(msum, _mm512_mullo_epi32(mn, _mm512_set1_epi32(pair)));
    }
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(wd[0]));
    const __m512 dmw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(wd[0], 16)));
    const __m512 da = _mm512_set1_ps(act[b].d);
    acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(da, dw), _mm512_cvtepi32_ps(isum)));
    acc = _mm512_sub_ps(acc, _mm512_mul_ps(_mm512_mul_ps(da, dmw), _mm512_cvtepi32_ps(msum)));
  }
  _mm512_storeu_ps(y, acc);
}

}  // namespace

void q4k_x16_gemv_vnni(const uint8_t* tiles, int64_t n_tiles, int64_t nb, const BlockQ8_K* act,
                       float* y) {
  for (int64_t t = 0; t < n_tiles; ++t) gemv_tile(tiles + t * nb * kSlice, nb, act, y + 16 * t);
}

}  // namespace tandem::kern
