// The Q6_K x16 one-token kernel (ops/cpu/q6k_x16.h), AVX-512 VNNI. Per super-block slice of a
// tile: 16 triples of chunks (A, B from ql, Q from qh), each giving four operands of 16 rows x 4
// values (a nibble and its two high bits put together by AND / shift / OR) for four vpdpbusd
// into the sub-blocks' accumulators, a row per lane; then per sub-block isum += sc * (dot - 32 *
// bsum) in lanes (the header's scales are stored sub-block-major: one sign extension each) and
// the reference's F32 step, a row per lane.
#include <immintrin.h>

#include <cstdint>

#include "formats/quant.h"
#include "ops/cpu/q6k_x16.h"

namespace tandem::kern {

namespace {

constexpr int64_t kHeader = 288;
constexpr int64_t kQuants = 3072;
// Software prefetch distance along the tile (as the Q4_K x16 kernel's: the hardware prefetchers
// alone leave a one-token GEMV well below the DRAM's rate).
constexpr int kPrefetch = 8192;

// An ordered statement (see q4k_x16_vnni.cpp: _mm_prefetch calls were hoisted into one burst).
inline void prefetch_t0(const uint8_t* p) {
  asm volatile("prefetcht0 %0" : : "m"(*reinterpret_cast<const char*>(p)));
}

inline __m512i act4(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

void gemv_tile(const uint8_t* tile, int64_t nb, const BlockQ8_K* act, float* y) {
  const __m512i m0f = _mm512_set1_epi8(0x0F), m03 = _mm512_set1_epi8(0x03);
  const __m512i m0c = _mm512_set1_epi8(0x0C), m30 = _mm512_set1_epi8(0x30);
  __m512 acc = _mm512_setzero_ps();
  const uint8_t* q = tile + nb * kHeader;
  for (int64_t b = 0; b < nb; ++b, q += kQuants) {
    __m512i s[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) s[j] = _mm512_setzero_si512();
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t) {
      const uint8_t* c = q + 192 * t;
      for (int l = 0; l < 3; ++l) prefetch_t0(c + kPrefetch + 64 * l);
      const __m512i a = _mm512_loadu_si512(c), bb = _mm512_loadu_si512(c + 64);
      const __m512i qh = _mm512_loadu_si512(c + 128);
      // Values 0..63: a nibble, and its two high bits from qh moved to bits 4-5 (16-bit shifts:
      // what crosses into the neighbouring byte is masked off).
      const __m512i v1 = _mm512_or_si512(_mm512_and_si512(a, m0f),
                                         _mm512_slli_epi16(_mm512_and_si512(qh, m03), 4));
      const __m512i v2 = _mm512_or_si512(_mm512_and_si512(bb, m0f),
                                         _mm512_slli_epi16(_mm512_and_si512(qh, m0c), 2));
      const __m512i v3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(a, 4), m0f),
                                         _mm512_and_si512(qh, m30));
      const __m512i v4 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(bb, 4), m0f),
                                         _mm512_and_si512(_mm512_srli_epi16(qh, 2), m30));
      const int h = t / 8, i = t % 8, j = 8 * h + i / 4;
      const int8_t* x = act[b].qs + 128 * h + 4 * i;
      s[j] = _mm512_dpbusd_epi32(s[j], v1, act4(x));
      s[j + 2] = _mm512_dpbusd_epi32(s[j + 2], v2, act4(x + 32));
      s[j + 4] = _mm512_dpbusd_epi32(s[j + 4], v3, act4(x + 64));
      s[j + 6] = _mm512_dpbusd_epi32(s[j + 6], v4, act4(x + 96));
    }
    const uint8_t* hd = tile + b * kHeader;
    __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      const __m512i sc =
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(hd + 16 * j)));
      const __m512i dot = _mm512_sub_epi32(s[j], _mm512_set1_epi32(32 * act[b].bsums[j]));
      isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(sc, dot));
    }
    const __m512 d =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hd + 256)));
    acc = _mm512_add_ps(
        acc, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(act[b].d), d), _mm512_cvtepi32_ps(isum)));
  }
  _mm512_storeu_ps(y, acc);
}

}  // namespace

void q6k_x16_gemv_vnni(const uint8_t* tiles, int64_t n_tiles, int64_t nb, const BlockQ8_K* act,
                       float* y, int64_t tokens, int64_t act_row_bytes, int64_t ldy) {
  const int64_t tile_bytes = nb * (kHeader + kQuants);
  for (int64_t t = 0; t < n_tiles; ++t) {
    // Token after token on the same tile: from the second on, its bytes come from L1 / L2.
    for (int64_t k = 0; k < tokens; ++k) {
      const auto* a = reinterpret_cast<const BlockQ8_K*>(reinterpret_cast<const uint8_t*>(act) +
                                                         k * act_row_bytes);
      gemv_tile(tiles + t * tile_bytes, nb, a, y + k * ldy + 16 * t);
    }
  }
}

}  // namespace tandem::kern
