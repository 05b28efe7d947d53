// The Q6_K x16 tile kernel (ops/cpu/q6k_x16.h), AVX-512 VNNI, one to four tokens per pass. Per
// super-block slice of a tile: 16 triples of chunks (A, B from ql, Q from qh), each giving four
// operands of 16 rows x 4 values (a nibble and its two high bits put together by AND / shift / OR)
// for four vpdpbusd per token into the sub-blocks' accumulators, a row per lane; then per
// sub-block isum += sc * (dot - 32 * bsum) in lanes (the header's scales are stored
// sub-block-major: one sign extension each) and the reference's F32 step, a row per lane.
#include <immintrin.h>

#include <cstdint>

#include "formats/quant.h"
#include "ops/cpu/q6k_x16.h"
#include "ops/cpu/x16_passes.h"

namespace tandem::kern {

namespace {

constexpr int64_t kHeader = 288;
constexpr int64_t kQuants = 3072;
// Software prefetch distance along the tile (as the Q4_K x16 kernel's: the hardware prefetchers
// alone leave a one-token GEMV well below the DRAM's rate).
constexpr int kPrefetch = 8192;

// An ordered statement into L2 (see q4k_x16_vnni.cpp: _mm_prefetch calls were hoisted into one
// burst; prefetcht0 kept the L1's miss buffers from the kernel's own loads).
inline void prefetch_l2(const uint8_t* p) {
  asm volatile("prefetcht1 %0" : : "m"(*reinterpret_cast<const char*>(p)));
}

inline __m512i act4(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// NT tokens (1-4) on one tile: each triple's values unpacked once for all of them. The triples
// go in four groups (h, p) of four (i = 4p .. 4p + 3), which feed sub-blocks 8h + p + 2m (m =
// 0..3): four accumulators per token, folded into the token's isum with those sub-blocks' scales
// after the group; y[k] = token k's 16 rows.
template <int NT>
void gemv_tile(const uint8_t* tile, int64_t nb, const BlockQ8_K* const* act, float* const* y) {
  const __m512i m0f = _mm512_set1_epi8(0x0F), m03 = _mm512_set1_epi8(0x03);
  const __m512i m0c = _mm512_set1_epi8(0x0C), m30 = _mm512_set1_epi8(0x30);
  __m512 acc[NT];
#pragma GCC unroll 4
  for (int k = 0; k < NT; ++k) acc[k] = _mm512_setzero_ps();
  const uint8_t* q = tile + nb * kHeader;
  for (int64_t b = 0; b < nb; ++b, q += kQuants) {
    const uint8_t* hd = tile + b * kHeader;
    __m512i isum[NT];
#pragma GCC unroll 4
    for (int k = 0; k < NT; ++k) isum[k] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int grp = 0; grp < 4; ++grp) {
      const int h = grp / 2, p = grp % 2;
      __m512i s[NT][4];
#pragma GCC unroll 4
      for (int k = 0; k < NT; ++k) {
        for (int m = 0; m < 4; ++m) s[k][m] = _mm512_setzero_si512();
      }
#pragma GCC unroll 4
      for (int ii = 0; ii < 4; ++ii) {
        const int i = 4 * p + ii, t = 8 * h + i;
        const uint8_t* c = q + 192 * t;
        for (int l = 0; l < 3; ++l) prefetch_l2(c + kPrefetch + 64 * l);
        const __m512i a = _mm512_loadu_si512(c), bb = _mm512_loadu_si512(c + 64);
        const __m512i qh = _mm512_loadu_si512(c + 128);
        // Values 0..63: a nibble, and its two high bits from qh moved to bits 4-5 (16-bit
        // shifts: what crosses into the neighbouring byte is masked off).
        const __m512i v1 = _mm512_or_si512(_mm512_and_si512(a, m0f),
                                           _mm512_slli_epi16(_mm512_and_si512(qh, m03), 4));
        const __m512i v2 = _mm512_or_si512(_mm512_and_si512(bb, m0f),
                                           _mm512_slli_epi16(_mm512_and_si512(qh, m0c), 2));
        const __m512i v3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(a, 4), m0f),
                                           _mm512_and_si512(qh, m30));
        const __m512i v4 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(bb, 4), m0f),
                                           _mm512_and_si512(_mm512_srli_epi16(qh, 2), m30));
#pragma GCC unroll 4
        for (int k = 0; k < NT; ++k) {
          const int8_t* x = act[k][b].qs + 128 * h + 4 * i;
          s[k][0] = _mm512_dpbusd_epi32(s[k][0], v1, act4(x));
          s[k][1] = _mm512_dpbusd_epi32(s[k][1], v2, act4(x + 32));
          s[k][2] = _mm512_dpbusd_epi32(s[k][2], v3, act4(x + 64));
          s[k][3] = _mm512_dpbusd_epi32(s[k][3], v4, act4(x + 96));
        }
      }
#pragma GCC unroll 4
      for (int m = 0; m < 4; ++m) {
        const int j = 8 * h + p + 2 * m;
        const __m512i sc =
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(hd + 16 * j)));
#pragma GCC unroll 4
        for (int k = 0; k < NT; ++k) {
          const __m512i dot =
              _mm512_sub_epi32(s[k][m], _mm512_set1_epi32(32 * act[k][b].bsums[j]));
          isum[k] = _mm512_add_epi32(isum[k], _mm512_mullo_epi32(sc, dot));
        }
      }
    }
    const __m512 d =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hd + 256)));
#pragma GCC unroll 4
    for (int k = 0; k < NT; ++k) {
      acc[k] = _mm512_add_ps(acc[k], _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(act[k][b].d), d),
                                                   _mm512_cvtepi32_ps(isum[k])));
    }
  }
#pragma GCC unroll 4
  for (int k = 0; k < NT; ++k) _mm512_storeu_ps(y[k], acc[k]);
}

}  // namespace

void q6k_x16_gemv_vnni(const uint8_t* tiles, int64_t n_tiles, int64_t nb, const BlockQ8_K* act,
                       float* y, int64_t tokens, int64_t act_row_bytes, int64_t ldy) {
  const auto pass = [nb](auto nt, const uint8_t* tile, const BlockQ8_K* const* a,
                        float* const* out) { gemv_tile<decltype(nt)::value>(tile, nb, a, out); };
  detail::x16_token_passes(tiles, n_tiles, nb * (kHeader + kQuants), act, tokens, act_row_bytes, y,
                           ldy, pass);
}

}  // namespace tandem::kern
