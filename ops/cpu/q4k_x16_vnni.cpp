// The Q4_K x16 tile kernel (ops/cpu/q4k_x16.h), AVX-512 VNNI, one to four tokens per pass. Per
// super-block slice of a tile: the 16 rows' 16-byte headers transposed into four vectors (a word
// per row), the scales and mins unpacked in lanes; per chunk the nibbles split once (low by AND,
// high as AND 0xF0, i.e. 16 x the value: its sub-block's sum is shifted right by 4 once, exactly)
// and one vpdpbusd pair per token, two accumulators per token and group of eight chunks, a row per
// lane; isum = sum of scale * dot and msum = sum of min * (bsums pair) by vpmulld, and the
// reference's F32 steps a row per lane.
#include <immintrin.h>

#include <cstdint>

#include "formats/quant.h"
#include "ops/cpu/q4k_x16.h"
#include "ops/cpu/x16_passes.h"

namespace tandem::kern {

namespace {

constexpr int64_t kSlice = 16 * static_cast<int64_t>(sizeof(BlockQ4_K));
// Software prefetch distance: every line of the stream, this far ahead (the hardware prefetchers
// alone left the kernel at ~half the DRAM bandwidth).
constexpr int kPrefetch = 8192;

// One prefetch as an ordered statement: with _mm_prefetch the compiler hoisted a slice's 36
// prefetches into one burst at its start (more than the core's L1 miss buffers take at once),
// which read DRAM ~10% slower than spreading them over the slice (docs/cpu-kernels.md). Into L2
// (prefetcht1), not L1: the line reaches L1 when the kernel loads it, 8 KiB later, and the L1's
// miss buffers stay free for those loads (the GEMV read 0.56-0.61 of DRAM with prefetcht0, 0.76
// with prefetcht1: docs/performance.md, D3).
inline void prefetch_l2(const uint8_t* p) {
  asm volatile("prefetcht1 %0" : : "m"(*reinterpret_cast<const char*>(p)));
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

// NT tokens (1-4) on one tile: each chunk's nibbles unpacked once for all of them; per group of 8
// chunks (sub-blocks 2g and 2g + 1) two accumulators per token, folded into the token's isum
// with the group's scales; y[k] = token k's 16 rows.
template <int NT>
void gemv_tile(const uint8_t* t, int64_t nb, const BlockQ8_K* const* act, float* const* y) {
  const __m512i m0f = _mm512_set1_epi8(0x0F), mf0 = _mm512_set1_epi8(static_cast<char>(0xF0));
  const __m512i m3f = _mm512_set1_epi32(0x3F3F3F3F), m0f32 = _mm512_set1_epi32(0x0F0F0F0F);
  const __m512i m30 = _mm512_set1_epi32(0x30303030), ff = _mm512_set1_epi32(0xFF);
  __m512 acc[NT];
#pragma GCC unroll 4
  for (int k = 0; k < NT; ++k) acc[k] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, t += kSlice) {
    const uint8_t* q = t + 256;
    for (int l = 0; l < 4; ++l) prefetch_l2(t + kPrefetch + 64 * l);
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
    __m512i isum[NT], msum[NT];
#pragma GCC unroll 4
    for (int k = 0; k < NT; ++k) isum[k] = msum[k] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      __m512i s0[NT], s1[NT];
#pragma GCC unroll 4
      for (int k = 0; k < NT; ++k) s0[k] = s1[k] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        const int c = 8 * g + i;
        if (c % 4 == 0) {  // four lines at a time, one group per four chunks
          for (int l = 0; l < 4; ++l) prefetch_l2(q + kPrefetch + 64 * (c + l));
        }
        const __m512i w = _mm512_loadu_si512(q + 64 * c);
        const __m512i lo = _mm512_and_si512(w, m0f), hi = _mm512_and_si512(w, mf0);
#pragma GCC unroll 4
        for (int k = 0; k < NT; ++k) {
          const int8_t* aq = act[k][b].qs + 64 * g + 4 * i;
          s0[k] = _mm512_dpbusd_epi32(s0[k], lo, _mm512_set1_epi32(load_i32(aq)));
          s1[k] = _mm512_dpbusd_epi32(s1[k], hi, _mm512_set1_epi32(load_i32(aq + 32)));
        }
      }
      // Sub-blocks 2g (low nibbles) and 2g + 1 (high nibbles, 16 x the value: shifted back).
      const __m512i sc0 = _mm512_and_si512(_mm512_srli_epi32(sm[g / 2], 16 * (g % 2)), ff);
      const __m512i sc1 = _mm512_and_si512(_mm512_srli_epi32(sm[g / 2], 16 * (g % 2) + 8), ff);
#pragma GCC unroll 4
      for (int k = 0; k < NT; ++k) {
        isum[k] = _mm512_add_epi32(isum[k], _mm512_mullo_epi32(sc0, s0[k]));
        isum[k] = _mm512_add_epi32(isum[k], _mm512_mullo_epi32(sc1, _mm512_srai_epi32(s1[k], 4)));
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512i mn = _mm512_and_si512(_mm512_srli_epi32(sm[2 + j / 4], 8 * (j % 4)), ff);
#pragma GCC unroll 4
      for (int k = 0; k < NT; ++k) {
        const int32_t pair = act[k][b].bsums[2 * j] + act[k][b].bsums[2 * j + 1];
        msum[k] = _mm512_add_epi32(msum[k], _mm512_mullo_epi32(mn, _mm512_set1_epi32(pair)));
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(wd[0]));
    const __m512 dmw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(wd[0], 16)));
#pragma GCC unroll 4
    for (int k = 0; k < NT; ++k) {
      const __m512 da = _mm512_set1_ps(act[k][b].d);
      acc[k] = _mm512_add_ps(acc[k],
                             _mm512_mul_ps(_mm512_mul_ps(da, dw), _mm512_cvtepi32_ps(isum[k])));
      acc[k] = _mm512_sub_ps(acc[k],
                             _mm512_mul_ps(_mm512_mul_ps(da, dmw), _mm512_cvtepi32_ps(msum[k])));
    }
  }
#pragma GCC unroll 4
  for (int k = 0; k < NT; ++k) _mm512_storeu_ps(y[k], acc[k]);
}

}  // namespace

void q4k_x16_gemv_vnni(const uint8_t* tiles, int64_t n_tiles, int64_t nb, const BlockQ8_K* act,
                       float* y, int64_t tokens, int64_t act_row_bytes, int64_t ldy) {
  const auto pass = [nb](auto nt, const uint8_t* tile, const BlockQ8_K* const* a,
                        float* const* out) { gemv_tile<decltype(nt)::value>(tile, nb, a, out); };
  detail::x16_token_passes(tiles, n_tiles, nb * kSlice, act, tokens, act_row_bytes, y, ldy, pass);
}

}  // namespace tandem::kern
