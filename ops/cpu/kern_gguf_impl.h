// The GGUF / dense kernel algorithms, written once over a SIMD traits struct S (AVX2: 256-bit,
// AVX-512: 512-bit, with or without VNNI). Included only by the kern_gguf_<isa>.cpp translation
// units, each compiled for its ISA: everything here has internal linkage (an anonymous namespace)
// so no AVX-512 copy of an inline function can leak into baseline code through the linker.
//
// Arithmetic contract: per block the integer dot products are exact int32 sums, as in the scalar
// reference; the float accumulation over blocks runs in vector lanes (one int->float conversion
// and one FMA per block, no horizontal sum until the row's end), so SIMD and reference differ only
// by the F32 summation order of the blocks' contributions.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "formats/quant.h"
#include "ops/cpu/kern_gguf.h"

namespace {

using tandem::BlockQ2_K;
using tandem::BlockQ3_K;
using tandem::BlockMXFP4;
using tandem::BlockQ4_0;
using tandem::BlockQ4_1;
using tandem::BlockQ4_K;
using tandem::BlockQ5_0;
using tandem::BlockQ5_1;
using tandem::BlockQ5_K;
using tandem::BlockQ6_K;
using tandem::BlockQ8_0;
using tandem::BlockQ8_K;
using tandem::kern::detail::GemmArgs;

inline float half_to_float(uint16_t h) {
  return _cvtsh_ss(h);
}

inline float hsum_ps256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int32_t hsum_epi32_256(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// The 6-bit scales and mins of the 8 sub-blocks of a Q4_K / Q5_K block, four at a time in 32-bit
// words: bytes 0-3 (A) hold scales 0-3 and the top bits of scales 4-7, bytes 4-7 (B) mins 0-3 and
// the top bits of mins 4-7, bytes 8-11 (C) the low nibbles of scales (low) and mins (high) 4-7.
inline void unpack_k4_scales(const uint8_t* s, uint8_t* sc, uint8_t* m) {
  uint32_t a, b, c;
  std::memcpy(&a, s, 4);
  std::memcpy(&b, s + 4, 4);
  std::memcpy(&c, s + 8, 4);
  const uint32_t sc_lo = a & 0x3F3F3F3Fu, m_lo = b & 0x3F3F3F3Fu;
  const uint32_t sc_hi = (c & 0x0F0F0F0Fu) | ((a >> 2) & 0x30303030u);
  const uint32_t m_hi = ((c >> 4) & 0x0F0F0F0Fu) | ((b >> 2) & 0x30303030u);
  std::memcpy(sc, &sc_lo, 4);
  std::memcpy(sc + 4, &sc_hi, 4);
  std::memcpy(m, &m_lo, 4);
  std::memcpy(m + 4, &m_hi, 4);
}

// Sum over the 8 sub-blocks of min * (sum of the activation's 32 quants there): the 16 bsums
// added pairwise, times the mins, in one multiply-add (SSE: available at every SIMD level).
inline int32_t k4_min_sum(const uint8_t* m, const int16_t* bsums) {
  const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bsums));
  const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bsums + 8));
  long long m8;
  std::memcpy(&m8, m, 8);
  __m128i p = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(m8)), _mm_hadd_epi16(b0, b1));
  p = _mm_add_epi32(p, _mm_shuffle_epi32(p, 0x4E));
  p = _mm_add_epi32(p, _mm_shuffle_epi32(p, 0xB1));
  return _mm_cvtsi128_si32(p);
}

// Software prefetch kPrefetchBytes ahead of the weight stream (rows are contiguous, so past a
// row's end it fetches the next row): one core's hardware prefetchers alone leave the GEMV short
// of DRAM bandwidth. 8 KiB: shorter distances (none, 1, 2, 4 KiB) read the GEMV benchmark or the
// native MoE layer's decode slower in same-minute A/Bs, and 8 KiB left end-to-end decode no
// slower; 12 KiB read the benchmark and the layer faster than 4 KiB but decoded slower end to end
// (the forward keeps activations, KV cache and the pool's state in L1 / L2, where more lines in
// flight per thread cost more). The x4 rows keep 4 KiB (kern_q0_vbmi.cpp). Into L2 (_MM_HINT_T1):
// the Q4_K / Q6_K row GEMVs read 0.71 of DRAM prefetching into L1, 0.73-0.79 into L2, and
// V2-Lite's native decode 1.03x (docs/performance.md, D5).
constexpr int kPrefetchBytes = 8192;
template <int kDistance = kPrefetchBytes>
inline void prefetch_ahead(const void* p, int bytes) {
  for (int o = 0; o < bytes; o += 64) {
    _mm_prefetch(static_cast<const char*>(p) + kDistance + o, _MM_HINT_T1);
  }
}

// Every row kernel below computes NR weight rows against NT token rows together: w[r] is row r's
// first block, a[t] token t's, out[r][t] the result. The arithmetic of each (row, token) pair is
// the same whatever NR and NT are (so results do not depend on how rows are grouped); grouping
// rows gives a single-token GEMV NR independent accumulation chains and shares each activation
// load between the NR rows.

// Q4_K x Q8_K. The F32 steps are the scalar reference's (exact integer sums per super-block, then
// acc + (da * dw) * isum - (da * dmin) * msum in block order), so every ISA and the tiled GEMM
// (kern_gguf_vnni.cpp) agree bit for bit and a token's result never depends on its batch.
template <class S, int NR, int NT>
inline void q4k_rows(const BlockQ4_K* const* w, const BlockQ8_K* const* a, int64_t nb,
                     float (*out)[NT]) {
  float acc[NR][NT];
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  }
  const typename S::V mask = S::set1_8(0x0F);
  // The second 256-bit half of an AVX-512 vector is group g + 1 (sub-blocks 2g+2, 2g+3); AVX2
  // has one half and must not index past the 8 scales.
  constexpr int kNext = S::kBytes == 64 ? 2 : 0;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t m[NR][8];
    typename S::V scales[NR];
    typename S::V sum[NR][NT];
    for (int r = 0; r < NR; ++r) {
      prefetch_ahead(&w[r][b], sizeof(BlockQ4_K));
      uint8_t sc[8];
      unpack_k4_scales(w[r][b].scales, sc, m[r]);
      scales[r] = S::scales_prepare(sc);
      for (int t = 0; t < NT; ++t) sum[r][t] = S::zero();
    }
    // Group g of 32 bytes holds sub-block 2g (low nibbles) and 2g+1 (high nibbles), whose
    // activations are at 64g and 64g + 32. An AVX-512 vector covers groups g and g + 1.
    for (int g = 0; g < 4; g += S::kBytes / 32) {
      typename S::V a_lo[NT], a_hi[NT];
      for (int t = 0; t < NT; ++t) S::load_act_pair(a[t][b].qs + 64 * g, &a_lo[t], &a_hi[t]);
      for (int r = 0; r < NR; ++r) {
        const typename S::V raw = S::load(w[r][b].qs + 32 * g);
        const typename S::V lo = S::and_(raw, mask);
        const typename S::V hi = S::and_(S::srli16(raw, 4), mask);
        const typename S::V s_lo = S::scale_pick(scales[r], 2 * g, 2 * g + kNext);
        const typename S::V s_hi = S::scale_pick(scales[r], 2 * g + 1, 2 * g + 1 + kNext);
        for (int t = 0; t < NT; ++t) {
          sum[r][t] = S::dot_acc(sum[r][t], lo, a_lo[t], s_lo);
          sum[r][t] = S::dot_acc(sum[r][t], hi, a_hi[t], s_hi);
        }
      }
    }
    for (int r = 0; r < NR; ++r) {
      const float dw = half_to_float(w[r][b].d), dmw = half_to_float(w[r][b].dmin);
      for (int t = 0; t < NT; ++t) {
        const float da = a[t][b].d;
        acc[r][t] = acc[r][t] + (da * dw) * static_cast<float>(S::hsum(sum[r][t]));
        acc[r][t] = acc[r][t] - (da * dmw) * static_cast<float>(k4_min_sum(m[r], a[t][b].bsums));
      }
    }
  }
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) out[r][t] = acc[r][t];
  }
}

// Q5_K x Q8_K: Q4_K's nibbles plus a fifth bit, bit j of qh[l] for element l of sub-block j (so
// group g's low nibbles take bit 2g, its high nibbles bit 2g+1).
template <class S, int NR, int NT>
inline void q5k_rows(const BlockQ5_K* const* w, const BlockQ8_K* const* a, int64_t nb,
                     float (*out)[NT]) {
  float acc[NR][NT];
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  }
  const typename S::V mask = S::set1_8(0x0F);
  // The second 256-bit half of an AVX-512 vector is group g + 1 (sub-blocks 2g+2, 2g+3); AVX2
  // has one half and must not index past the 8 scales.
  constexpr int kNext = S::kBytes == 64 ? 2 : 0;
  const typename S::V one = S::set1_8(0x01);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t sc[NR][8], m[NR][8];
    typename S::V sum[NR][NT];
    for (int r = 0; r < NR; ++r) {
      prefetch_ahead(&w[r][b], sizeof(BlockQ5_K));
      unpack_k4_scales(w[r][b].scales, sc[r], m[r]);
      for (int t = 0; t < NT; ++t) sum[r][t] = S::zero();
    }
    for (int g = 0; g < 4; g += S::kBytes / 32) {
      typename S::V a_lo[NT], a_hi[NT];
      for (int t = 0; t < NT; ++t) {
        const int8_t* q8 = a[t][b].qs + 64 * g;
        a_lo[t] = S::load_halves(q8, q8 + 64);
        a_hi[t] = S::load_halves(q8 + 32, q8 + 96);
      }
      for (int r = 0; r < NR; ++r) {
        const BlockQ5_K& x = w[r][b];
        const typename S::V raw = S::load(x.qs + 32 * g);
        typename S::V h_lo, h_hi;  // the fifth bits, as 0 / 1 per byte
        if constexpr (S::kBytes == 32) {
          const typename S::V hb = S::load(x.qh);
          h_lo = S::and_(S::srli16(hb, 2 * g), one);
          h_hi = S::and_(S::srli16(hb, 2 * g + 1), one);
        } else {
          const typename S::V hb = S::broadcast32(x.qh);
          h_lo = S::and_(S::srlv16_halves(hb, 2 * g, 2 * g + 2), one);
          h_hi = S::and_(S::srlv16_halves(hb, 2 * g + 1, 2 * g + 3), one);
        }
        const typename S::V lo = S::or_(S::and_(raw, mask), S::slli16(h_lo, 4));
        const typename S::V hi = S::or_(S::and_(S::srli16(raw, 4), mask), S::slli16(h_hi, 4));
        const typename S::V s_lo = S::scale16(sc[r][2 * g], sc[r][2 * g + kNext]);
        const typename S::V s_hi = S::scale16(sc[r][2 * g + 1], sc[r][2 * g + 1 + kNext]);
        for (int t = 0; t < NT; ++t) {
          sum[r][t] = S::dot_acc(sum[r][t], lo, a_lo[t], s_lo);
          sum[r][t] = S::dot_acc(sum[r][t], hi, a_hi[t], s_hi);
        }
      }
    }
    for (int r = 0; r < NR; ++r) {
      const float dw = half_to_float(w[r][b].d), dmw = half_to_float(w[r][b].dmin);
      for (int t = 0; t < NT; ++t) {
        const int32_t isum = S::hsum(sum[r][t]);
        const int32_t summs = k4_min_sum(m[r], a[t][b].bsums);
        const float da = a[t][b].d;
        acc[r][t] = acc[r][t] + (da * dw) * static_cast<float>(isum);
        acc[r][t] = acc[r][t] - (da * dmw) * static_cast<float>(summs);
      }
    }
  }
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) out[r][t] = acc[r][t];
  }
}

// Q6_K x Q8_K. Quants are used unsigned (0..63) and the bias of 32 is removed afterwards through
// the activation's 16-value sums: isum -= 32 * sum(sc * bsum).
template <class S, int NR, int NT>
inline void q6k_rows(const BlockQ6_K* const* w, const BlockQ8_K* const* a, int64_t nb,
                     float (*out)[NT]) {
  float acc[NR][NT];
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  }
  const typename S::V m4 = S::set1_8(0x0F);
  const typename S::V m2 = S::set1_8(0x03);
  for (int64_t b = 0; b < nb; ++b) {
    typename S::V sum[NR][NT];
    for (int r = 0; r < NR; ++r) {
      prefetch_ahead(&w[r][b], sizeof(BlockQ6_K));
      for (int t = 0; t < NT; ++t) sum[r][t] = S::zero();
    }
    for (int h = 0; h < 2; ++h) {
      if constexpr (S::kBytes == 32) {
        for (int r = 0; r < NR; ++r) {
          const BlockQ6_K& x = w[r][b];
          const uint8_t* ql = x.ql + 64 * h;
          const uint8_t* qh = x.qh + 32 * h;
          const int8_t* sc = x.scales + 8 * h;
          const typename S::V l0 = S::load(ql), l1 = S::load(ql + 32), hb = S::load(qh);
          typename S::V q[4];
          q[0] = S::or_(S::and_(l0, m4), S::slli16(S::and_(hb, m2), 4));
          q[1] = S::or_(S::and_(l1, m4), S::slli16(S::and_(S::srli16(hb, 2), m2), 4));
          q[2] = S::or_(S::and_(S::srli16(l0, 4), m4), S::slli16(S::and_(S::srli16(hb, 4), m2), 4));
          q[3] = S::or_(S::and_(S::srli16(l1, 4), m4), S::slli16(S::and_(S::srli16(hb, 6), m2), 4));
          for (int i = 0; i < 4; ++i) {
            const typename S::V s = S::scale16_split(sc[2 * i], sc[2 * i + 1]);
            for (int t = 0; t < NT; ++t) {
              sum[r][t] = S::dot_acc(sum[r][t], q[i], S::load(a[t][b].qs + 128 * h + 32 * i), s);
            }
          }
        }
      } else {
        // 64 quants per vector: low nibbles = elements 0..63 of the half, high = 64..127.
        typename S::V a_lo[NT], a_hi[NT];
        for (int t = 0; t < NT; ++t) {
          const int8_t* q8 = a[t][b].qs + 128 * h;
          a_lo[t] = S::load(q8);
          a_hi[t] = S::load(q8 + 64);
        }
        for (int r = 0; r < NR; ++r) {
          const BlockQ6_K& x = w[r][b];
          const int8_t* sc = x.scales + 8 * h;
          const typename S::V l = S::load(x.ql + 64 * h);
          const typename S::V hb = S::broadcast32(x.qh + 32 * h);
          const typename S::V q_lo =
              S::or_(S::and_(l, m4), S::slli16(S::and_(S::srlv16_halves(hb, 0, 2), m2), 4));
          const typename S::V q_hi = S::or_(S::and_(S::srli16(l, 4), m4),
                                            S::slli16(S::and_(S::srlv16_halves(hb, 4, 6), m2), 4));
          const typename S::V s_lo = S::scale16_quarters(sc);
          const typename S::V s_hi = S::scale16_quarters(sc + 4);
          for (int t = 0; t < NT; ++t) {
            sum[r][t] = S::dot_acc(sum[r][t], q_lo, a_lo[t], s_lo);
            sum[r][t] = S::dot_acc(sum[r][t], q_hi, a_hi[t], s_hi);
          }
        }
      }
    }
    // The exact lane sums, four at a time where there are four (one transposing tree).
    int32_t hs[NR * NT];
    int p = 0;
    for (; p + 4 <= NR * NT; p += 4) {
      S::hsum4(sum[p / NT][p % NT], sum[(p + 1) / NT][(p + 1) % NT],
               sum[(p + 2) / NT][(p + 2) % NT], sum[(p + 3) / NT][(p + 3) % NT], hs + p);
    }
    for (; p < NR * NT; ++p) hs[p] = S::hsum(sum[p / NT][p % NT]);
    for (int r = 0; r < NR; ++r) {
      const BlockQ6_K& x = w[r][b];
      const float dw = half_to_float(x.d);
      // bias = sum_j scales[j] * bsums[j], exact (int16 x int16 pairs; AVX2 at every level).
      const __m256i sc16 =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales)));
      for (int t = 0; t < NT; ++t) {
        const int32_t bias = hsum_epi32_256(_mm256_madd_epi16(
            sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[t][b].bsums))));
        // The reference's F32 step per super-block on the exact isum (as Q4_K): every ISA and
        // the 16-row tiles give the same bits.
        const int32_t isum = hs[r * NT + t] - 32 * bias;
        acc[r][t] = acc[r][t] + (a[t][b].d * dw) * static_cast<float>(isum);
      }
    }
  }
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) out[r][t] = acc[r][t];
  }
}

// A legacy block's scale: its F16 d; MXFP4's E8M0 exponent as 2^(e - 128) (ggml's
// GGML_E8M0_TO_FP32_HALF, its value table being doubled).
template <class Block>
inline float weight_scale(const Block& x) {
  return half_to_float(x.d);
}
inline float weight_scale(const BlockMXFP4& x) {
  return tandem::e8m0_half(x.e);
}

// Q8_0 x Q8_0 and Q5_0 x Q8_0: per 32-block an exact int32 dot per 8-lane group, converted and
// accumulated in lanes as acc = fma(float(lanes), dw * da, acc); one horizontal sum per row.
// `expand(x)` gives the block's 32 quants as signed bytes in element order.
template <class S, int NR, int NT, class WBlock, class Expand>
inline void q_0_rows(const WBlock* const* w, const BlockQ8_0* const* a, int64_t nb,
                     float (*out)[NT], Expand expand) {
  __m256 acc[NR][NT];
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    // Blocks of 34 / 22 bytes: one prefetch per 64 bytes on average is enough.
    if (b % 2 == 0) {
      for (int r = 0; r < NR; ++r) prefetch_ahead(&w[r][b], 64);
    }
    float da[NT];
    for (int t = 0; t < NT; ++t) da[t] = half_to_float(a[t][b].d);
    for (int r = 0; r < NR; ++r) {
      const __m256i q = expand(w[r][b]);
      const float dw = weight_scale(w[r][b]);
      for (int t = 0; t < NT; ++t) {
        const __m256 d = _mm256_set1_ps(dw * da[t]);
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S::dot_s8_32_lanes(q, a[t][b].qs)), d,
                                    acc[r][t]);
      }
    }
  }
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) out[r][t] = hsum_ps256(acc[r][t]);
  }
}

inline __m256i expand_q8_0(const BlockQ8_0& x) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs));
}

// The 32 nibbles of a legacy 4/5-bit block (qs: element j low nibble, j + 16 high) as bytes
// 0..15 in element order. (AVX2 instructions: also available to the AVX-512 units.)
inline __m256i nibbles_32(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

// 0xFF in byte j where bit j of the 32-bit qh (element j's fifth bit) is set, else 0.
inline __m256i fifth_bits_32(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  // Byte i takes byte i / 8 of the bit mask, then tests its bit i % 8.
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i select = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
}

// The 32 quants of a Q5_0 block as signed bytes in element order: value = q - 16, i.e. the
// nibble with 0xF0 or'ed in (two's complement) when the fifth bit is clear.
inline __m256i expand_q5_0(const BlockQ5_0& x) {
  const __m256i f0 = _mm256_set1_epi8(static_cast<char>(0xF0));
  return _mm256_or_si256(nibbles_32(x.qs), _mm256_andnot_si256(fifth_bits_32(x.qh), f0));
}
// Q4_0: q - 8. Q4_1 / Q5_1: q itself (0..15 / 0..31; their offset is the min term).
inline __m256i expand_q4_0(const BlockQ4_0& x) {
  return _mm256_sub_epi8(nibbles_32(x.qs), _mm256_set1_epi8(8));
}
// MXFP4: each nibble through the (doubled) E2M1 table, as signed bytes in element order.
inline __m256i expand_mxfp4(const BlockMXFP4& x) {
  const __m256i table = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(tandem::kMxfp4Values)));
  return _mm256_shuffle_epi8(table, nibbles_32(x.qs));
}
inline __m256i expand_q4_1(const BlockQ4_1& x) {
  return nibbles_32(x.qs);
}
inline __m256i expand_q5_1(const BlockQ5_1& x) {
  return _mm256_or_si256(nibbles_32(x.qs),
                         _mm256_and_si256(fifth_bits_32(x.qh), _mm256_set1_epi8(0x10)));
}

// Q4_1 / Q5_1 x Q8_0 with the Q8_1 sums (kern_gguf.h; a[t] are whole activation rows): q_0_rows'
// lanes for the (dw * da) * isum parts, the min terms m * s summed in block order beside them.
template <class S, int NR, int NT, class WBlock, class Expand>
inline void q_1_rows(const WBlock* const* w, const BlockQ8_0* const* a, int64_t nb,
                     float (*out)[NT], Expand expand) {
  __m256 acc[NR][NT];
  float macc[NR][NT];
  const float* sa[NT];
  for (int t = 0; t < NT; ++t) {
    sa[t] = tandem::kern::detail::q8_0_act_sums(reinterpret_cast<const uint8_t*>(a[t]), nb);
  }
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) {
      acc[r][t] = _mm256_setzero_ps();
      macc[r][t] = 0.0f;
    }
  }
  for (int64_t b = 0; b < nb; ++b) {
    if (b % 2 == 0) {
      for (int r = 0; r < NR; ++r) prefetch_ahead(&w[r][b], 64);
    }
    float da[NT];
    for (int t = 0; t < NT; ++t) da[t] = half_to_float(a[t][b].d);
    for (int r = 0; r < NR; ++r) {
      const __m256i q = expand(w[r][b]);
      const float dw = half_to_float(w[r][b].d), mw = half_to_float(w[r][b].m);
      for (int t = 0; t < NT; ++t) {
        const __m256 d = _mm256_set1_ps(dw * da[t]);
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S::dot_s8_32_lanes(q, a[t][b].qs)), d,
                                    acc[r][t]);
        macc[r][t] = macc[r][t] + mw * sa[t][b];
      }
    }
  }
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) out[r][t] = hsum_ps256(acc[r][t]) + macc[r][t];
  }
}

// Q2_K / Q3_K x Q8_K (16 sub-blocks of 16 values), as llama.cpp's AVX2 dot products do it: per
// 32-value run i (sub-blocks 2i, 2i + 1: the 2-bit fields at bits 2j of qs[32n ..], i = 4n + j)
// the values as unsigned bytes u (Q3_K: q + 4, 0..7), one vpmaddubsw per token (int16 pair sums,
// |u * a| pairs <= 2 * 7 * 128) and one vpmaddwd (VNNI: vpdpwssd) by the run's int16 scales (lanes
// 0-7 sub-block 2i, 8-15 sub-block 2i + 1), summed exactly in int32 lanes; Q3_K's bias
// 4 * sum_j sc_j * bsum_j and Q2_K's min sum_j m_j * bsum_j by one vpmaddwd against the token's
// bsums. Then the reference's F32 steps per super-block: bit-identical on every ISA. AVX2
// instructions only: one kernel serves every level.
inline __m256i madd16_acc(__m256i acc, __m256i p16, __m256i s16) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, p16, s16);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p16, s16));
#endif
}
// int16 lanes 0-7 sc8[2i], lanes 8-15 sc8[2i + 1].
inline __m256i run_scales16(__m128i sc8, int i) {
  const __m128i idx = _mm_add_epi8(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                   _mm_set1_epi8(static_cast<char>(2 * i)));
  return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, idx));
}
// The 2-bit fields of run i (bits 2j of the 32 bytes at qs + 32n) as bytes 0..3.
inline __m256i run_low2(const uint8_t* qs, int i) {
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (i / 4)));
  return _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * (i % 4))),
                          _mm256_set1_epi8(3));
}
inline __m256i load_bsums(const BlockQ8_K& a) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bsums));
}

// Q3_K's 16 6-bit scales (unpack_q3_k_scales' bytes, 0..63) in four 32-bit words: low nibbles
// from bytes 0-7 (sub-blocks 0-7 low, 8-15 high), top bits from bytes 8-11 (bits 2 * (j / 4)).
inline __m128i q3k_scales8(const uint8_t* packed) {
  uint32_t a0, a1, t;
  std::memcpy(&a0, packed, 4);
  std::memcpy(&a1, packed + 4, 4);
  std::memcpy(&t, packed + 8, 4);
  const uint32_t lo = 0x0F0F0F0Fu, hi = 0x03030303u;
  return _mm_setr_epi32(static_cast<int>((a0 & lo) | ((t & hi) << 4)),
                        static_cast<int>((a1 & lo) | (((t >> 2) & hi) << 4)),
                        static_cast<int>(((a0 >> 4) & lo) | (((t >> 4) & hi) << 4)),
                        static_cast<int>(((a1 >> 4) & lo) | (((t >> 6) & hi) << 4)));
}

// kThree: Q3_K (u = q + 4 from the hmask bits, scales - 32, bias), else Q2_K (scales & 15,
// mins >> 4).
template <bool kThree, class Block, int NR, int NT>
inline void k23_rows(const Block* const* w, const BlockQ8_K* const* a, int64_t nb,
                     float (*out)[NT]) {
  float acc[NR][NT];
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  }
  for (int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < NR; ++r) prefetch_ahead(&w[r][b], sizeof(Block));
    __m256i bsum[NT];
    for (int t = 0; t < NT; ++t) bsum[t] = load_bsums(a[t][b]);
    for (int r = 0; r < NR; ++r) {
      const Block& x = w[r][b];
      __m128i sc8;
      __m256i corr16;  // Q3_K: -4 * sc per sub-block; Q2_K: the mins
      if constexpr (kThree) {
        sc8 = _mm_sub_epi8(q3k_scales8(x.scales), _mm_set1_epi8(32));
        corr16 = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(sc8), _mm256_set1_epi16(-4));
      } else {
        const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales));
        const __m128i lo4 = _mm_set1_epi8(0x0F);
        sc8 = _mm_and_si128(sc, lo4);
        corr16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), lo4));
      }
      __m256i hm = _mm256_setzero_si256();
      if constexpr (kThree) hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.hmask));
      __m256i isum[NT];
      for (int t = 0; t < NT; ++t) isum[t] = _mm256_setzero_si256();
      for (int i = 0; i < 8; ++i) {
        __m256i u = run_low2(x.qs, i);
        if constexpr (kThree) {  // + 4 where bit i (= 4n + j) of hmask is set
          const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << i));
          u = _mm256_or_si256(u, _mm256_and_si256(
                                     _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit),
                                     _mm256_set1_epi8(4)));
        }
        const __m256i s16 = run_scales16(sc8, i);
        for (int t = 0; t < NT; ++t) {
          const __m256i av =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[t][b].qs + 32 * i));
          isum[t] = madd16_acc(isum[t], _mm256_maddubs_epi16(u, av), s16);
        }
      }
      const float dw = half_to_float(x.d);
      for (int t = 0; t < NT; ++t) {
        const int32_t corr = hsum_epi32_256(_mm256_madd_epi16(corr16, bsum[t]));
        if constexpr (kThree) {
          const int32_t is = hsum_epi32_256(isum[t]) + corr;
          acc[r][t] = acc[r][t] + (a[t][b].d * dw) * static_cast<float>(is);
        } else {
          acc[r][t] = acc[r][t] + (a[t][b].d * dw) * static_cast<float>(hsum_epi32_256(isum[t]));
          acc[r][t] = acc[r][t] - (a[t][b].d * half_to_float(x.dmin)) * static_cast<float>(corr);
        }
      }
    }
  }
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) out[r][t] = acc[r][t];
  }
}

template <class S, int NR, int NT>
inline void q2k_rows(const BlockQ2_K* const* w, const BlockQ8_K* const* a, int64_t nb,
                     float (*out)[NT]) {
  k23_rows<false, BlockQ2_K, NR, NT>(w, a, nb, out);
}
template <class S, int NR, int NT>
inline void q3k_rows(const BlockQ3_K* const* w, const BlockQ8_K* const* a, int64_t nb,
                     float (*out)[NT]) {
  k23_rows<true, BlockQ3_K, NR, NT>(w, a, nb, out);
}

template <class S, int NR, int NT>
inline void q4_0_rows(const BlockQ4_0* const* w, const BlockQ8_0* const* a, int64_t nb,
                      float (*out)[NT]) {
  q_0_rows<S, NR, NT>(w, a, nb, out, expand_q4_0);
}
template <class S, int NR, int NT>
inline void mxfp4_rows(const BlockMXFP4* const* w, const BlockQ8_0* const* a, int64_t nb,
                       float (*out)[NT]) {
  q_0_rows<S, NR, NT>(w, a, nb, out, expand_mxfp4);
}
template <class S, int NR, int NT>
inline void q4_1_rows(const BlockQ4_1* const* w, const BlockQ8_0* const* a, int64_t nb,
                      float (*out)[NT]) {
  q_1_rows<S, NR, NT>(w, a, nb, out, expand_q4_1);
}
template <class S, int NR, int NT>
inline void q5_1_rows(const BlockQ5_1* const* w, const BlockQ8_0* const* a, int64_t nb,
                      float (*out)[NT]) {
  q_1_rows<S, NR, NT>(w, a, nb, out, expand_q5_1);
}

template <class S, int NR, int NT>
inline void q8_0_rows(const BlockQ8_0* const* w, const BlockQ8_0* const* a, int64_t nb,
                      float (*out)[NT]) {
  q_0_rows<S, NR, NT>(w, a, nb, out, expand_q8_0);
}

// Q5_0 x Q8_0. AVX-512 takes two blocks per vector as unsigned quants u = q + 16 (0..31):
// per block, dot(q, a) = dot(u, a) - 16 * sum(a), both exact int32 (one u8 x s8 dot each), then
// converted and accumulated in lanes like q_0_rows; an odd last block goes through q_0_rows.
template <class S, int NR, int NT>
inline void q5_0_rows(const BlockQ5_0* const* w, const BlockQ8_0* const* a, int64_t nb,
                      float (*out)[NT]) {
  if constexpr (S::kBytes == 64) {
    typename S::F acc[NR][NT];
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) acc[r][t] = S::fzero();
    }
    const typename S::V sixteen = S::set1_8(16);
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
      for (int r = 0; r < NR; ++r) prefetch_ahead(&w[r][b], 64);
      typename S::V av[NT], bias[NT];
      float da0[NT], da1[NT];
      for (int t = 0; t < NT; ++t) {
        av[t] = S::load_halves(a[t][b].qs, a[t][b + 1].qs);
        bias[t] = S::dot_u8s8(S::zero(), sixteen, av[t]);
        da0[t] = half_to_float(a[t][b].d);
        da1[t] = half_to_float(a[t][b + 1].d);
      }
      for (int r = 0; r < NR; ++r) {
        const typename S::V u = S::q5_0_pair_u8(w[r][b], w[r][b + 1]);
        const float dw0 = half_to_float(w[r][b].d), dw1 = half_to_float(w[r][b + 1].d);
        for (int t = 0; t < NT; ++t) {
          const typename S::V dot = S::sub32(S::dot_u8s8(S::zero(), u, av[t]), bias[t]);
          acc[r][t] = S::fmadd(S::to_float(dot), S::fpair(dw0 * da0[t], dw1 * da1[t]), acc[r][t]);
        }
      }
    }
    float tail[NR][NT] = {};
    if (b < nb) {
      const BlockQ5_0* wt[NR];
      const BlockQ8_0* at[NT];
      for (int r = 0; r < NR; ++r) wt[r] = w[r] + b;
      for (int t = 0; t < NT; ++t) at[t] = a[t] + b;
      q_0_rows<S, NR, NT>(wt, at, nb - b, tail, expand_q5_0);
    }
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) out[r][t] = S::fhsum(acc[r][t]) + tail[r][t];
    }
  } else {
    q_0_rows<S, NR, NT>(w, a, nb, out, expand_q5_0);
  }
}

// Dense rows: F32 / F16 / BF16 weights against F32 activations (lane-parallel FMA, one horizontal
// sum at the end: not bit-equal to the scalar reference, which sums in order). BF16 weights keep
// F32 activations: the product is then exact up to F32 rounding, as the golden files require.
enum class Dense { kF32, kF16, kBF16 };

inline float bf16_bits_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <class S, int NR, int NT, Dense kKind>
inline void dense_rows(const uint8_t* const* w, const float* const* a, int64_t k,
                       float (*out)[NT]) {
  typename S::F acc[NR][NT];
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) acc[r][t] = S::fzero();
  }
  int64_t i = 0;
  for (; i + S::kFloats <= k; i += S::kFloats) {
    if (i % (64 / (kKind == Dense::kF32 ? 4 : 2)) == 0) {
      for (int r = 0; r < NR; ++r) {
        prefetch_ahead(w[r] + i * (kKind == Dense::kF32 ? 4 : 2), 64);
      }
    }
    typename S::F av[NT];
    for (int t = 0; t < NT; ++t) av[t] = S::fload(a[t] + i);
    for (int r = 0; r < NR; ++r) {
      typename S::F wv;
      if constexpr (kKind == Dense::kF16) {
        wv = S::load_half(reinterpret_cast<const uint16_t*>(w[r]) + i);
      } else if constexpr (kKind == Dense::kBF16) {
        wv = S::load_bf16(reinterpret_cast<const uint16_t*>(w[r]) + i);
      } else {
        wv = S::fload(reinterpret_cast<const float*>(w[r]) + i);
      }
      for (int t = 0; t < NT; ++t) acc[r][t] = S::fmadd(wv, av[t], acc[r][t]);
    }
  }
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) {
      float s = S::fhsum(acc[r][t]);
      for (int64_t j = i; j < k; ++j) {
        const uint16_t* w16 = reinterpret_cast<const uint16_t*>(w[r]);
        const float wj = kKind == Dense::kF16    ? half_to_float(w16[j])
                         : kKind == Dense::kBF16 ? bf16_bits_to_float(w16[j])
                                                 : reinterpret_cast<const float*>(w[r])[j];
        s += wj * a[t][j];
      }
      out[r][t] = s;
    }
  }
}

// The driver: rows [n0, n1) in tiles of kTileRows, tokens in groups of up to 4; a tile's weight
// rows stay in L1 while every token group passes over them (GEMM), and with <= 4 tokens each
// weight block is read once for all of them (GEMV). In the GEMM part, kernels with kGemmRows == 2
// take two rows x 4 tokens at once (8 accumulation chains, each activation load shared by two
// rows: +13-27% GOP/s for Q4_K, Q8_0, Q5_0, BF16 at 512 tokens; Q6_K, short of registers, stays at
// one row). The GEMV part stays one row at a time: reading 4 rows in lock step (4 streams per
// thread) measured 2-3x slower than one sequential stream with software prefetch.
template <class Kern>
inline void drive(const GemmArgs& g) {
  constexpr int64_t kTileRows = 16;
  for (int64_t r0 = g.n0; r0 < g.n1; r0 += kTileRows) {
    const int64_t r1 = r0 + kTileRows < g.n1 ? r0 + kTileRows : g.n1;
    int64_t t0 = 0;
    for (; t0 + 4 <= g.tokens; t0 += 4) {
      int64_t r = r0;
      if constexpr (Kern::kGemmRows == 2) {
        for (; r + 2 <= r1; r += 2) Kern::template rows<2, 4>(g, r, t0);
      }
      for (; r < r1; ++r) Kern::template rows<1, 4>(g, r, t0);
    }
    const int64_t rest = g.tokens - t0;
    for (int64_t r = r0; r < r1; ++r) {
      if (rest == 3) Kern::template rows<1, 3>(g, r, t0);
      if (rest == 2) Kern::template rows<1, 2>(g, r, t0);
      if (rest == 1) Kern::template rows<1, 1>(g, r, t0);
    }
  }
}

// NR weight rows of a block format against NT token rows: gathers the rows' and the tokens'
// pointers, runs the format's kernel (Dot::run<NR, NT>, one of the *_rows templates above) and
// stores.
template <class WBlock, class ABlock, int kBlock, class Dot>
struct BlockKern {
  static constexpr int kGemmRows = Dot::kGemmRows;
  template <int NR, int NT>
  static inline void rows(const GemmArgs& g, int64_t r, int64_t t0) {
    const WBlock* w[NR];
    for (int i = 0; i < NR; ++i) w[i] = reinterpret_cast<const WBlock*>(g.w + (r + i) * g.row_bytes);
    const ABlock* a[NT];
    for (int t = 0; t < NT; ++t) {
      a[t] = reinterpret_cast<const ABlock*>(g.act + (t0 + t) * g.act_row_bytes);
    }
    float out[NR][NT];
    Dot::template run<NR, NT>(w, a, g.cols / kBlock, out);
    for (int i = 0; i < NR; ++i) {
      for (int t = 0; t < NT; ++t) g.y[(t0 + t) * g.ldy + r + i] = out[i][t];
    }
  }
};

#define TD_ROW_DOT(name, fn, WBlock, ABlock, gemm_rows)                                          \
  template <class S>                                                                             \
  struct name {                                                                                  \
    static constexpr int kGemmRows = gemm_rows;                                                  \
    template <int NR, int NT>                                                                    \
    static inline void run(const WBlock* const* w, const ABlock* const* a, int64_t nb,           \
                           float (*out)[NT]) {                                                   \
      fn<S, NR, NT>(w, a, nb, out);                                                              \
    }                                                                                            \
  };
TD_ROW_DOT(Q4KDot, q4k_rows, BlockQ4_K, BlockQ8_K, 2)
TD_ROW_DOT(Q5KDot, q5k_rows, BlockQ5_K, BlockQ8_K, 2)
TD_ROW_DOT(Q6KDot, q6k_rows, BlockQ6_K, BlockQ8_K, 1)
TD_ROW_DOT(Q80Dot, q8_0_rows, BlockQ8_0, BlockQ8_0, 2)
TD_ROW_DOT(Q50Dot, q5_0_rows, BlockQ5_0, BlockQ8_0, 2)
TD_ROW_DOT(Q40Dot, q4_0_rows, BlockQ4_0, BlockQ8_0, 2)
TD_ROW_DOT(Mxfp4Dot, mxfp4_rows, BlockMXFP4, BlockQ8_0, 2)
TD_ROW_DOT(Q2KDot, q2k_rows, BlockQ2_K, BlockQ8_K, 2)
TD_ROW_DOT(Q3KDot, q3k_rows, BlockQ3_K, BlockQ8_K, 2)
TD_ROW_DOT(Q41Dot, q4_1_rows, BlockQ4_1, BlockQ8_0, 2)
TD_ROW_DOT(Q51Dot, q5_1_rows, BlockQ5_1, BlockQ8_0, 2)
#undef TD_ROW_DOT

template <class S>
using Q4KKern = BlockKern<BlockQ4_K, BlockQ8_K, 256, Q4KDot<S>>;
template <class S>
using Q5KKern = BlockKern<BlockQ5_K, BlockQ8_K, 256, Q5KDot<S>>;
template <class S>
using Q6KKern = BlockKern<BlockQ6_K, BlockQ8_K, 256, Q6KDot<S>>;
template <class S>
using Q80Kern = BlockKern<BlockQ8_0, BlockQ8_0, 32, Q80Dot<S>>;
template <class S>
using Q50Kern = BlockKern<BlockQ5_0, BlockQ8_0, 32, Q50Dot<S>>;
template <class S>
using Q40Kern = BlockKern<BlockQ4_0, BlockQ8_0, 32, Q40Dot<S>>;
template <class S>
using Mxfp4Kern = BlockKern<BlockMXFP4, BlockQ8_0, 32, Mxfp4Dot<S>>;
template <class S>
using Q2KKern = BlockKern<BlockQ2_K, BlockQ8_K, 256, Q2KDot<S>>;
template <class S>
using Q3KKern = BlockKern<BlockQ3_K, BlockQ8_K, 256, Q3KDot<S>>;
template <class S>
using Q41Kern = BlockKern<BlockQ4_1, BlockQ8_0, 32, Q41Dot<S>>;
template <class S>
using Q51Kern = BlockKern<BlockQ5_1, BlockQ8_0, 32, Q51Dot<S>>;

template <class S, Dense kKind>
struct DenseKern {
  static constexpr int kGemmRows = 2;
  template <int NR, int NT>
  static inline void rows(const GemmArgs& g, int64_t r, int64_t t0) {
    const uint8_t* w[NR];
    for (int i = 0; i < NR; ++i) w[i] = g.w + (r + i) * g.row_bytes;
    const float* a[NT];
    for (int t = 0; t < NT; ++t) {
      a[t] = reinterpret_cast<const float*>(g.act + (t0 + t) * g.act_row_bytes);
    }
    float out[NR][NT];
    dense_rows<S, NR, NT, kKind>(w, a, g.cols, out);
    for (int i = 0; i < NR; ++i) {
      for (int t = 0; t < NT; ++t) g.y[(t0 + t) * g.ldy + r + i] = out[i][t];
    }
  }
};

}  // namespace
