// The legacy formats Q5_0, Q4_0, Q4_1, Q5_1 and Q8_0 x Q8_0 for fewer than 16 tokens (GEMV) with
// AVX-512 VBMI and BITALG on top of VNNI (compiled with those flags; kern_gguf_vnni.cpp calls it
// only on CPUs that have them: Ice Lake+, Zen 4+). Same arithmetic and F32 order as the VNNI row
// kernels and tiles (kern_gguf_vnni.cpp): exact int32 block sums, acc[b % 16] = fma(float(isum_b),
// dw_b * da_b, acc[b % 16]) (then fma(m_b, s_b, acc[b % 16]) for Q4_1 / Q5_1), the fixed tree; so
// results are bit-identical to them whatever the batch.
//
// What differs is how a block's quants are formed: four blocks (72-96 bytes) at a time, from one
// full and one masked 64-byte load, one vpermt2b gathers the four 16-byte nibble arrays into a
// vector; for the 5-bit formats a second the four 32-bit fifth-bit words, and vpshufbitqmb turns
// those into the two 64-bit masks that add 16 to the quants whose bit is set; one more the fp16
// scales (and mins). Q8_0's four blocks (136 bytes) take a second pair of loads from byte 8 for
// their quants 16-31, and u = q + 128 is one XOR. The token's quants are rearranged once per call
// to match (the 16 low-nibble / first partners of each block, then the 16 high / last). (The
// VNNI rows expand two blocks per vector with a 64-bit permute, a masked shift and a mask built in
// general registers, and gather the scales: about twice the instructions per block.)
// Rows in the x4 layout (q0_x4.h, `--cpu-experts repack`) hold each quad's scales, fifth-bit masks
// and quants where plain loads find them: no permute, no bit shuffle (load_quad_x4).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>
#include <vector>

#include "ops/cpu/kern_gguf_impl.h"
// (after kern_gguf_impl.h: the traits use its block types)
#include "ops/cpu/kern_gguf_avx512.h"

namespace {

constexpr int kMaxTokens = 4;

// Per format: block bytes; offsets of qs, qh (-1: none) and m (-1: none; d is at 0); the bias c of
// u = q + c as the shift of the activation's -128 * sum(a) (-1: c = 0).
template <class Block>
struct Fmt;
template <>
struct Fmt<BlockQ5_0> {
  static constexpr int kQs = 6, kQh = 2, kM = -1, kShift = 3;  // c = 16
};
template <>
struct Fmt<BlockQ4_0> {
  static constexpr int kQs = 2, kQh = -1, kM = -1, kShift = 4;  // c = 8
};
template <>
struct Fmt<BlockQ4_1> {
  static constexpr int kQs = 4, kQh = -1, kM = 2, kShift = -1;
};
template <>
struct Fmt<BlockQ5_1> {
  static constexpr int kQs = 8, kQh = 4, kM = 2, kShift = -1;
};
template <>
struct Fmt<BlockQ8_0> {  // 32 whole bytes, not nibbles (kIs8); c = 128
  static constexpr int kQs = 2, kQh = -1, kM = -1, kShift = 0;
};
template <>
struct Fmt<BlockMXFP4> {  // the E8M0 byte at 0; u = table[q] + 16 (c = 16)
  static constexpr int kQs = 1, kQh = -1, kM = -1, kShift = 3;
};
template <class Block>
constexpr bool kIs8 = std::is_same_v<Block, BlockQ8_0>;
template <class Block>
constexpr bool kIsMxfp4 = std::is_same_v<Block, BlockMXFP4>;
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 &&
                  sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34,
              "legacy blocks: fp16 d (+ fp16 m) (+ 4 bytes qh) + 16 bytes qs; Q8_0: d + 32 qs");

using Bytes64 = std::array<uint8_t, 64>;

// Byte indices into the 128 loaded bytes (block i of the four at bytes * i).
constexpr Bytes64 qs_index(int bytes, int qs) {  // out 16i + j = qs[j] of block i
  Bytes64 x{};
  for (int p = 0; p < 64; ++p) x[p] = static_cast<uint8_t>(bytes * (p / 16) + qs + p % 16);
  return x;
}
constexpr Bytes64 qh_index(int bytes, int qh) {  // 64-bit lanes 2i and 2i + 1: qh of block i
  Bytes64 x{};
  for (int p = 0; p < 64; ++p) x[p] = static_cast<uint8_t>(bytes * (p / 16) + qh + p % 4);
  return x;
}
constexpr Bytes64 half_index(int bytes, int off) {  // out 8k + 2i + e = byte e of block i's half
  Bytes64 x{};
  for (int p = 0; p < 64; ++p) x[p] = static_cast<uint8_t>(bytes * ((p % 8) / 2) + off + p % 2);
  return x;
}
constexpr Bytes64 bit_index(int first) {  // byte 16i + j: bit first + j of its 64-bit lane's qh
  Bytes64 x{};
  for (int p = 0; p < 64; ++p) x[p] = static_cast<uint8_t>(first + p % 16);
  return x;
}
template <class Block>
struct Tables {
  static constexpr int kBytes = static_cast<int>(sizeof(Block));
  static constexpr Bytes64 kQs = qs_index(kBytes, Fmt<Block>::kQs);
  // Q8_0: the qh slot holds the quants 16-31 of each block, indexed from byte 8 of the quad
  // (its 136 bytes do not fit one two-vector permute).
  static constexpr Bytes64 kQh = kIs8<Block> ? qs_index(kBytes, Fmt<Block>::kQs + 8)
                                             : qh_index(kBytes, std::max(0, Fmt<Block>::kQh));
  static constexpr Bytes64 kD = half_index(kBytes, 0);
  static constexpr Bytes64 kM = half_index(kBytes, Fmt<Block>::kM < 0 ? 0 : Fmt<Block>::kM);
};
constexpr Bytes64 kBitsLo = bit_index(0), kBitsHi = bit_index(16);

inline __m512i load_index(const Bytes64& x) {
  return _mm512_loadu_si512(x.data());
}

inline __mmask64 byte_mask(int n) {  // the first n bytes (0..64)
  return n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1;
}

// One token's activation, rearranged: per quad of blocks two vectors (the 16 low-nibble partners
// of each block, then the 16 high ones), zero past nb; and the row's aux arrays (kern_gguf.h).
struct Act {
  const __m512i* quads;
  const int32_t* negc;
  const float* d;
  const float* s;  // the Q8_1 sums (Q4_1 / Q5_1)
};

// The x4 rows' prefetch distance: 4 KiB (8 KiB, as the stored rows take, read the MoE layer with
// Q8_0 downs slower in same-minute A/Bs; spreading a prefetch per line over the quads did too),
// into L2 (the Q5_0 GEMV read 0.59-0.62 of DRAM with _MM_HINT_T0, 0.77 with _MM_HINT_T1: the L1's
// miss buffers stay free for the kernel's loads; docs/performance.md, D3).
constexpr int kX4PrefetchBytes = 4096;

// The constants of the quad expansion.
struct Consts {
  __m512i qs_idx, qh_idx, d_idx, m_idx, bits_lo, bits_hi, nib, sixteen;
  // Vector k's 128-bit lane i holds block i of quad k: dword 4i + k -> dword 4k + i.
  __m512i order;
};
template <class Block>
inline Consts consts() {
  using T = Tables<Block>;
  return {load_index(T::kQs),
          load_index(T::kQh),
          load_index(T::kD),
          load_index(T::kM),
          load_index(kBitsLo),
          load_index(kBitsHi),
          _mm512_set1_epi8(0x0F),
          _mm512_set1_epi8(0x10),
          _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0)};
}

// The 16 blocks' scales as F32 from the gathered halves: the fp16 d, or (MXFP4) 2^(e - 128) from
// the E8M0 byte e in the low byte of each half (formats/quant.h e8m0_half, denormal below 2).
template <class Block>
inline __m512 scales16(__m256i d16) {
  if constexpr (kIsMxfp4<Block>) {
    const __m512i e = _mm512_and_si512(_mm512_cvtepu16_epi32(d16), _mm512_set1_epi32(0xFF));
    const __mmask16 small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i denormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, denormal));
  } else {
    return _mm512_cvtph_ps(d16);
  }
}

// The fp16 scales (and mins) of the 16 blocks of a row's group, 8 bytes per quad.
struct Halves {
  __m512i d16 = _mm512_setzero_si512(), m16 = _mm512_setzero_si512();
};

// `blocks` (1..4) consecutive blocks at x as unsigned quants u = q + c (the stored value): u_lo
// the 16 low-nibble quants of each block (bytes 16i..16i+15), u_hi the 16 high ones; their fp16
// scales (and mins) into bytes 8k..8k+7 of h. Reads only the blocks' bytes.
template <class Block>
inline void load_quad(const uint8_t* x, int blocks, int k, const Consts& c, __m512i* u_lo,
                      __m512i* u_hi, Halves* h) {
  constexpr int kBytes = static_cast<int>(sizeof(Block));
  prefetch_ahead(x, 4 * kBytes);
  const int bytes = blocks * kBytes;
  const __m512i z0 = _mm512_maskz_loadu_epi8(byte_mask(bytes), x);
  const __m512i z1 = _mm512_maskz_loadu_epi8(byte_mask(std::max(0, bytes - 64)), x + 64);
  const __m512i q = _mm512_permutex2var_epi8(z0, c.qs_idx, z1);
  const __mmask64 lane = __mmask64{0xFF} << (8 * k);
  h->d16 = _mm512_mask_blend_epi8(lane, h->d16, _mm512_permutex2var_epi8(z0, c.d_idx, z1));
  if constexpr (kIs8<Block>) {  // u = q + 128: the sign bit flipped
    const __m512i z2 = _mm512_maskz_loadu_epi8(byte_mask(std::max(0, bytes - 8)), x + 8);
    const __m512i z3 = _mm512_maskz_loadu_epi8(byte_mask(std::max(0, bytes - 72)), x + 72);
    const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
    *u_lo = _mm512_xor_si512(q, sign);
    *u_hi = _mm512_xor_si512(_mm512_permutex2var_epi8(z2, c.qh_idx, z3), sign);
    return;
  }
  if constexpr (Fmt<Block>::kM >= 0) {
    h->m16 = _mm512_mask_blend_epi8(lane, h->m16, _mm512_permutex2var_epi8(z0, c.m_idx, z1));
  }
  const __m512i lo = _mm512_and_si512(q, c.nib);
  const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), c.nib);
  if constexpr (kIsMxfp4<Block>) {  // each nibble through the E2M1 table, + 16
    const __m512i table = _mm512_broadcast_i32x4(
        _mm_setr_epi8(16, 17, 18, 19, 20, 22, 24, 28, 16, 15, 14, 13, 12, 10, 8, 4));
    *u_lo = _mm512_shuffle_epi8(table, lo);
    *u_hi = _mm512_shuffle_epi8(table, hi);
  } else if constexpr (Fmt<Block>::kQh >= 0) {
    const __m512i qh = _mm512_permutex2var_epi8(z0, c.qh_idx, z1);
    *u_lo = _mm512_mask_add_epi8(lo, _mm512_bitshuffle_epi64_mask(qh, c.bits_lo), lo, c.sixteen);
    *u_hi = _mm512_mask_add_epi8(hi, _mm512_bitshuffle_epi64_mask(qh, c.bits_hi), hi, c.sixteen);
  } else {
    *u_lo = lo;
    *u_hi = hi;
  }
}

// The quants of a full x4 quad at x (q0_x4.h) as u = q + c: (Q5_0) the 64 nibble bytes and the two
// fifth-bit masks as stored, or (Q8_0) the 128 bytes of u already.
template <class Block>
inline void x4_quants(const uint8_t* x, const Consts& c, __m512i* u_lo, __m512i* u_hi) {
  if constexpr (kIs8<Block>) {
    *u_lo = _mm512_loadu_si512(x + 8);
    *u_hi = _mm512_loadu_si512(x + 72);
  } else {
    const __m512i q = _mm512_loadu_si512(x + 24);
    const __m512i lo = _mm512_and_si512(q, c.nib);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), c.nib);
    __mmask64 m_lo, m_hi;
    std::memcpy(&m_lo, x + 8, 8);
    std::memcpy(&m_hi, x + 16, 8);
    *u_lo = _mm512_mask_add_epi8(lo, m_lo, lo, c.sixteen);
    *u_hi = _mm512_mask_add_epi8(hi, m_hi, hi, c.sixteen);
  }
}

// The same for a full quad of the x4 layout (q0_x4.h): the fp16 d of the four blocks first (one
// masked load into bytes 8k..8k+7 of h), then (Q5_0) the two fifth-bit masks as stored and the
// 64 nibble bytes, or (Q8_0) the 128 bytes of u already.
template <class Block>
inline void load_quad_x4(const uint8_t* x, int k, const Consts& c, __m512i* u_lo, __m512i* u_hi,
                         Halves* h) {
  static_assert(std::is_same_v<Block, BlockQ5_0> || kIs8<Block>, "x4: Q5_0 and Q8_0");
  constexpr int kBytes = static_cast<int>(sizeof(Block));
  prefetch_ahead<kX4PrefetchBytes>(x, 4 * kBytes);
  const __mmask64 lane = __mmask64{0xFF} << (8 * k);
  // (Bytes 8k..8k+7 of the load are x[0..7]; the masked-off ones are never read.)
  h->d16 = _mm512_mask_loadu_epi8(h->d16, lane, x - 8 * k);
  x4_quants<Block>(x, c, u_lo, u_hi);
}

// A quad of either layout: full quads of an x4 row through load_quad_x4, the rest as stored.
template <class Block, bool kX4>
inline void any_quad(const uint8_t* x, int blocks, int k, const Consts& c, __m512i* u_lo,
                     __m512i* u_hi, Halves* h) {
  if constexpr (kX4) {
    if (blocks == 4) {
      load_quad_x4<Block>(x, k, c, u_lo, u_hi, h);
      return;
    }
  }
  load_quad<Block>(x, blocks, k, c, u_lo, u_hi, h);
}

// isum of 16 blocks from the exact sums of u: + c * sum(a) removed via the bias array.
template <class Block>
inline __m512i with_bias(__m512i sums, __m512i negc) {
  if constexpr (Fmt<Block>::kShift >= 0) {
    return _mm512_add_epi32(sums, _mm512_srai_epi32(negc, Fmt<Block>::kShift));
  } else {
    return sums;
  }
}

// The four quad vectors' dot products -> the 16 exact block sums (of u), in vector-major order.
inline __m512i block_sums(const __m512i* v, const Consts& c) {
  return _mm512_permutexvar_epi32(c.order,
                                  tree4_epi32(tree2_epi32(v[0], v[1]), tree2_epi32(v[2], v[3])));
}

// Q (1..4) whole quads of an x4 row from block g0 as row()'s step for one group of 16 blocks,
// straight-line: the quads at fixed offsets, no per-quad branches, the scales gathered by Q 8-byte
// loads instead of merging masked loads, one prefetch per 64 bytes; quads past Q add what row()'s
// empty quads add (zero sums, zero scales).
template <class Block, int NT, int Q>
inline void x4_group(const uint8_t* x, int64_t g0, const Act* act, const Consts& c, __m512* acc) {
  constexpr int kQuad = 4 * static_cast<int>(sizeof(Block));
  for (int o = 0; o < Q * kQuad; o += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(x) + kX4PrefetchBytes + o, _MM_HINT_T1);
  }
  __m512i v[NT][4];
  __m128i dq[4];
  for (int k = 0; k < 4; ++k) {
    if (k >= Q) {
      dq[k] = _mm_setzero_si128();
      for (int t = 0; t < NT; ++t) v[t][k] = _mm512_setzero_si512();
      continue;
    }
    const uint8_t* xq = x + k * kQuad;
    dq[k] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(xq));
    __m512i u_lo, u_hi;
    x4_quants<Block>(xq, c, &u_lo, &u_hi);
    for (int t = 0; t < NT; ++t) {
      const __m512i* aq = act[t].quads + 2 * ((g0 >> 2) + k);
      v[t][k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u_lo, aq[0]),
                                    u_hi, aq[1]);
    }
  }
  const __m256i d16 = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_unpacklo_epi64(dq[0], dq[1])), _mm_unpacklo_epi64(dq[2], dq[3]),
      1);
  const __m512 dw = _mm512_cvtph_ps(d16);
  for (int t = 0; t < NT; ++t) {
    const __m512i isum =
        with_bias<Block>(block_sums(v[t], c), _mm512_loadu_si512(act[t].negc + g0));
    const __m512 s = _mm512_mul_ps(dw, _mm512_loadu_ps(act[t].d + g0));
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), s, acc[t]);
  }
}

// The whole quads of an x4 row through x4_group: the full 16-block groups, then, when the row
// ends in a whole quad, the 1-3 quads after them (V2-Lite's 44-block downs: two groups and three
// quads). Returns the first block not done: a group's start (row()'s lanes are per group).
template <class Block, int NT>
__attribute__((always_inline)) inline int64_t x4_groups(const uint8_t* w, int64_t nb,
                                                        const Act* act, const Consts& c,
                                                        __m512* acc) {
  constexpr int kBytes = static_cast<int>(sizeof(Block));
  __m512 a[NT];  // (local: stores through acc would be kept in step with every group)
  for (int t = 0; t < NT; ++t) a[t] = acc[t];
  int64_t g0 = 0;
  for (; g0 + 16 <= nb; g0 += 16) x4_group<Block, NT, 4>(w + g0 * kBytes, g0, act, c, a);
  const int64_t quads = nb % 4 == 0 ? (nb - g0) / 4 : 0;
  if (quads == 3) x4_group<Block, NT, 3>(w + g0 * kBytes, g0, act, c, a);
  if (quads == 2) x4_group<Block, NT, 2>(w + g0 * kBytes, g0, act, c, a);
  if (quads == 1) x4_group<Block, NT, 1>(w + g0 * kBytes, g0, act, c, a);
  for (int t = 0; t < NT; ++t) acc[t] = a[t];
  return g0 + 4 * quads;
}

// One row's 16 F32 lane sums per token (acc), before the lane tree.
template <class Block, bool kX4, int NT>
void row_lanes(const uint8_t* w, int64_t nb, const Act* act, __m512* acc) {
  constexpr int kBytes = static_cast<int>(sizeof(Block));
  const Consts c = consts<Block>();
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  int64_t first = 0;
  if constexpr (kX4 && (std::is_same_v<Block, BlockQ5_0> || kIs8<Block>)) {
    first = x4_groups<Block, NT>(w, nb, act, c, acc);
  }
  for (int64_t g0 = first; g0 < nb; g0 += 16) {
    const int m = static_cast<int>(std::min<int64_t>(16, nb - g0));
    Halves hv;
    __m512i v[NT][4];
    for (int k = 0; k < 4; ++k) {
      const int blocks = std::clamp(m - 4 * k, 0, 4);
      if (blocks == 0) {
        for (int t = 0; t < NT; ++t) v[t][k] = _mm512_setzero_si512();
        continue;
      }
      __m512i u_lo, u_hi;
      any_quad<Block, kX4>(w + (g0 + 4 * k) * kBytes, blocks, k, c, &u_lo, &u_hi, &hv);
      for (int t = 0; t < NT; ++t) {
        const __m512i* aq = act[t].quads + 2 * ((g0 >> 2) + k);
        v[t][k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u_lo, aq[0]),
                                      u_hi, aq[1]);
      }
    }
    const __m512 dw = scales16<Block>(_mm512_castsi512_si256(hv.d16));
    for (int t = 0; t < NT; ++t) {
      // u = q + c: isum = dot(u, a) - c * sum(a) = sums + (negc >> shift).
      const __m512i isum =
          with_bias<Block>(block_sums(v[t], c), _mm512_loadu_si512(act[t].negc + g0));
      const __m512 s = _mm512_mul_ps(dw, _mm512_loadu_ps(act[t].d + g0));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), s, acc[t]);
    }
    if constexpr (Fmt<Block>::kM >= 0) {
      const __m512 mw = _mm512_cvtph_ps(_mm512_castsi512_si256(hv.m16));
      for (int t = 0; t < NT; ++t) {
        acc[t] = _mm512_fmadd_ps(mw, _mm512_loadu_ps(act[t].s + g0), acc[t]);
      }
    }
  }
}

template <class Block, bool kX4, int NT>
void row(const uint8_t* w, int64_t nb, const Act* act, float* out) {
  __m512 acc[NT];
  row_lanes<Block, kX4, NT>(w, nb, act, acc);
  for (int t = 0; t < NT; ++t) out[t] = lane_tree_ps(acc[t]);
}

// lane_tree_ps of sixteen rows' lane sums at once, rows in order: the same pairs added at each
// level (h8[i] = a[i] + a[i + 8], h4, h2, h2[0] + h2[1]), two rows per vector after the first,
// four after the second; the last level leaves row 4e + q at element 4q + e (one permute).
inline __m512 lane_trees16(const __m512* a) {
  __m512 x[8], y[4], z[2];
  for (int k = 0; k < 8; ++k) {
    x[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0xEE));
  }
  for (int j = 0; j < 4; ++j) {
    y[j] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * j], x[2 * j + 1], 0x88),
                         _mm512_shuffle_f32x4(x[2 * j], x[2 * j + 1], 0xDD));
  }
  for (int m = 0; m < 2; ++m) {
    z[m] = _mm512_add_ps(_mm512_shuffle_ps(y[2 * m], y[2 * m + 1], 0x44),
                         _mm512_shuffle_ps(y[2 * m], y[2 * m + 1], 0xEE));
  }
  const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], 0x88),
                                 _mm512_shuffle_ps(z[0], z[1], 0xDD));
  return _mm512_permutexvar_ps(
      _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0), f);
}

// Sixteen long rows from r: row_lanes each, then their lane trees together (one store per
// token instead of sixteen scalar trees).
template <class Block, bool kX4, int NT>
void rows16(const uint8_t* w, int64_t row_bytes, int64_t nb, const Act* act, float* y,
            int64_t ldy) {
  __m512 lanes[NT][16];
  if constexpr (kX4 && (std::is_same_v<Block, BlockQ5_0> || kIs8<Block>)) {
    if (nb % 4 == 0) {  // whole quads: x4_groups alone, in line, its constants loaded once
      const Consts c = consts<Block>();
      for (int i = 0; i < 16; ++i) {
        __m512 acc[NT];
        for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
        x4_groups<Block, NT>(w + i * row_bytes, nb, act, c, acc);
        for (int t = 0; t < NT; ++t) lanes[t][i] = acc[t];
      }
      for (int t = 0; t < NT; ++t) _mm512_storeu_ps(y + t * ldy, lane_trees16(lanes[t]));
      return;
    }
  }
  for (int i = 0; i < 16; ++i) {
    __m512 acc[NT];
    row_lanes<Block, kX4, NT>(w + i * row_bytes, nb, act, acc);
    for (int t = 0; t < NT; ++t) lanes[t][i] = acc[t];
  }
  for (int t = 0; t < NT; ++t) _mm512_storeu_ps(y + t * ldy, lane_trees16(lanes[t]));
}

// Short rows (nb <= 4 * Q, Q = 1 or 2 quads) R = 4 / Q at a time: row r's blocks in lanes
// 4Qr .. 4Qr + 4Q - 1 of one vector. Row r's result is what row() computes, step for step: the
// products fma(float(isum), dw * da, +0) in lanes 0..nb-1, +0 elsewhere, the tree's levels above
// 4Q lanes adding those zeros, then the 4Q lanes' own levels.
// Results go straight to y[t * ldy + r] (rows r < R contiguous per token): one permute and one
// store per token (through a stack array and a memcpy, MLA's k_b measured 2x slower:
// the wide reload of narrow stores cannot be forwarded).
template <class Block, bool kX4, int Q, int NT>
void short_rows(const uint8_t* w, int64_t row_bytes, int64_t nb, const Act* act, float* y,
                int64_t ldy) {
  constexpr int R = 4 / Q;
  constexpr int kBytes = static_cast<int>(sizeof(Block));
  const Consts c = consts<Block>();
  Halves hv;
  __m512i v[NT][4];
  for (int r = 0; r < R; ++r) {
    for (int qd = 0; qd < Q; ++qd) {
      const int k = r * Q + qd;
      const int blocks = std::clamp(static_cast<int>(nb) - 4 * qd, 0, 4);
      if (blocks == 0) {
        for (int t = 0; t < NT; ++t) v[t][k] = _mm512_setzero_si512();
        continue;
      }
      __m512i u_lo, u_hi;
      any_quad<Block, kX4>(w + r * row_bytes + 4 * qd * kBytes, blocks, k, c, &u_lo, &u_hi,
                           &hv);
      for (int t = 0; t < NT; ++t) {
        const __m512i* aq = act[t].quads + 2 * qd;
        v[t][k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u_lo, aq[0]),
                                      u_hi, aq[1]);
      }
    }
  }
  const __m512 dw = scales16<Block>(_mm512_castsi512_si256(hv.d16));
  const __m512 mw = _mm512_cvtph_ps(_mm512_castsi512_si256(hv.m16));
  const __m512 zero = _mm512_setzero_ps();
  for (int t = 0; t < NT; ++t) {
    __m512i bias;
    __m512 ad, as;
    if constexpr (Q == 1) {
      bias = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(act[t].negc)));
      ad = _mm512_broadcast_f32x4(_mm_loadu_ps(act[t].d));
      as = _mm512_broadcast_f32x4(_mm_loadu_ps(act[t].s));
    } else {
      bias =
          _mm512_broadcast_i32x8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(act[t].negc)));
      ad = _mm512_broadcast_f32x8(_mm256_loadu_ps(act[t].d));
      as = _mm512_broadcast_f32x8(_mm256_loadu_ps(act[t].s));
    }
    const __m512i isum = with_bias<Block>(block_sums(v[t], c), bias);
    __m512 p = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, ad), zero);
    if constexpr (Fmt<Block>::kM >= 0) p = _mm512_fmadd_ps(mw, as, p);
    // h8 (and for Q == 1, h4) add the untouched lanes: + 0.
    __m512 h = _mm512_add_ps(p, zero);
    if constexpr (Q == 1) {
      h = _mm512_add_ps(h, zero);
    } else {  // h4: lanes i and i + 4 of each row's 8
      h = _mm512_add_ps(h, _mm512_shuffle_f32x4(h, h, 0xB1));
    }
    h = _mm512_add_ps(h, _mm512_permute_ps(h, 0x4E));  // h2: lanes i and i + 2
    h = _mm512_add_ps(h, _mm512_permute_ps(h, 0xB1));  // h1: lanes 0 and 1
    // Row r's result is lane 4Qr: gathered into lanes 0..R-1.
    const __m128 rows = _mm512_castps512_ps128(_mm512_permutexvar_ps(
        Q == 1 ? _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
               : _mm512_setr_epi32(0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        h));
    if constexpr (Q == 1) {
      _mm_storeu_ps(y + t * ldy, rows);
    } else {
      _mm_storel_pi(reinterpret_cast<__m64*>(y + t * ldy), rows);
    }
  }
}

// One token's per-block activation terms for short_rows16 in its block-major order (dword
// 4i + k: block i of row k): the bias, d and Q8_1 sum of block i, once per call.
struct ShortAct {
  __m512i bias;
  __m512 ad, as;
};
inline ShortAct short_act(const Act& a) {
  const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  return {_mm512_permutexvar_epi32(
              spread, _mm512_castsi128_si512(
                          _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.negc)))),
          _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_loadu_ps(a.d))),
          _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_loadu_ps(a.s)))};
}

// Rows of nb <= 4 blocks (one quad) sixteen at a time: what short_rows<Q = 1> computes for four
// groups of four, step for step, with the lane trees of the sixteen rows done together. Group g's
// products stay block-major (dword 4i + k: row 4g + k, block i: the scales are transposed to
// them instead of the sums to the rows), so a row's tree (p0 + p2) + (p1 + p3) runs across the
// 128-bit lanes: two levels of 128-bit shuffles and adds for all four groups, rows 0..15 in
// order in the result. (short_rows' "+ 0" levels are dropped: p is never -0, so p + 0 == p.)
template <class Block, bool kX4, int NT>
void short_rows16(const uint8_t* w, int64_t row_bytes, int64_t nb, const Act* act,
                  const ShortAct* sa, float* y, int64_t ldy) {
  const Consts c = consts<Block>();
  const __m512 zero = _mm512_setzero_ps();
  const int blocks = static_cast<int>(nb);
  __m512 p[NT][4];
  for (int g = 0; g < 4; ++g) {
    Halves hv;
    __m512i v[NT][4];
    for (int k = 0; k < 4; ++k) {
      __m512i u_lo, u_hi;
      any_quad<Block, kX4>(w + (4 * g + k) * row_bytes, blocks, k, c, &u_lo, &u_hi, &hv);
      for (int t = 0; t < NT; ++t) {
        const __m512i* aq = act[t].quads;
        v[t][k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u_lo, aq[0]),
                                      u_hi, aq[1]);
      }
    }
    // (c.order is a transpose of 4 x 4 dwords per vector: row-major scales -> block-major.)
    const __m512 dw =
        _mm512_permutexvar_ps(c.order, scales16<Block>(_mm512_castsi512_si256(hv.d16)));
    for (int t = 0; t < NT; ++t) {
      const __m512i sums =
          tree4_epi32(tree2_epi32(v[t][0], v[t][1]), tree2_epi32(v[t][2], v[t][3]));
      const __m512i isum = with_bias<Block>(sums, sa[t].bias);
      p[t][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, sa[t].ad), zero);
    }
    if constexpr (Fmt<Block>::kM >= 0) {
      const __m512 mw =
          _mm512_permutexvar_ps(c.order, _mm512_cvtph_ps(_mm512_castsi512_si256(hv.m16)));
      for (int t = 0; t < NT; ++t) p[t][g] = _mm512_fmadd_ps(mw, sa[t].as, p[t][g]);
    }
  }
  for (int t = 0; t < NT; ++t) {
    // Groups a, b: [a0 + a2, a1 + a3, b0 + b2, b1 + b3] (128-bit lanes = blocks); then the pairs.
    const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(p[t][0], p[t][1], 0x44),
                                    _mm512_shuffle_f32x4(p[t][0], p[t][1], 0xEE));
    const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(p[t][2], p[t][3], 0x44),
                                    _mm512_shuffle_f32x4(p[t][2], p[t][3], 0xEE));
    const __m512 rows = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88),
                                      _mm512_shuffle_f32x4(ab, cd, 0xDD));
    _mm512_storeu_ps(y + t * ldy, rows);
  }
}

// short_rows for nb <= 8 and nt <= kMaxTokens tokens.
template <class Block, bool kX4>
inline void short_rows_any(const uint8_t* w, int64_t row_bytes, int64_t nb, const Act* a,
                           int64_t nt, float* y, int64_t ldy) {
  auto run = [&](auto q, auto t) {
    short_rows<Block, kX4, decltype(q)::value, decltype(t)::value>(w, row_bytes, nb, a, y, ldy);
  };
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  using Three = std::integral_constant<int, 3>;
  using Four = std::integral_constant<int, 4>;
  if (nb <= 4) {
    if (nt == 1) run(One{}, One{});
    if (nt == 2) run(One{}, Two{});
    if (nt == 3) run(One{}, Three{});
    if (nt == 4) run(One{}, Four{});
  } else {
    if (nt == 1) run(Two{}, One{});
    if (nt == 2) run(Two{}, Two{});
    if (nt == 3) run(Two{}, Three{});
    if (nt == 4) run(Two{}, Four{});
  }
}

// kX4: the rows are in the x4 layout (q0_x4.h).
template <class Block, bool kX4 = false>
void rows_vbmi(const GemmArgs& g) {
  using tandem::kern::detail::q8_0_act_aux_offset;
  using tandem::kern::detail::q8_0_act_padded_blocks;
  using tandem::kern::detail::q8_0_act_sums;
  using tandem::kQK;
  const int64_t nb = g.cols / kQK;
  const int64_t quads = (nb + 3) / 4;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"  // (a vector of SIMD values: fine)
  thread_local std::vector<__m512i> arranged;
#pragma GCC diagnostic pop
  arranged.assign(static_cast<size_t>(2 * quads * g.tokens), _mm512_setzero_si512());
  thread_local std::vector<Act> acts;
  acts.resize(static_cast<size_t>(g.tokens));
  for (int64_t t = 0; t < g.tokens; ++t) {
    const uint8_t* rowp = g.act + t * g.act_row_bytes;
    const auto* blk = reinterpret_cast<const BlockQ8_0*>(rowp);
    auto* dst = reinterpret_cast<int8_t*>(arranged.data() + 2 * quads * t);
    for (int64_t b = 0; b < nb; ++b) {
      int8_t* quad = dst + (b / 4) * 128 + (b % 4) * 16;
      std::memcpy(quad, blk[b].qs, 16);
      std::memcpy(quad + 64, blk[b].qs + 16, 16);
    }
    const auto* negc = reinterpret_cast<const int32_t*>(rowp + q8_0_act_aux_offset(nb));
    acts[static_cast<size_t>(t)] = {
        arranged.data() + 2 * quads * t, negc,
        reinterpret_cast<const float*>(negc + q8_0_act_padded_blocks(nb)),
        q8_0_act_sums(rowp, nb)};
  }
  int64_t r = g.n0;
  if (nb <= 4 && g.n1 - r >= 16) {  // one-quad rows (MLA's K up-projections) 16 at a time
    const int64_t r_end = r + (g.n1 - r) / 16 * 16;
    for (int64_t t0 = 0; t0 < g.tokens; t0 += kMaxTokens) {
      const int64_t nt = std::min<int64_t>(kMaxTokens, g.tokens - t0);
      ShortAct sa[kMaxTokens];
      for (int64_t t = 0; t < nt; ++t) sa[t] = short_act(acts[static_cast<size_t>(t0 + t)]);
      const Act* a = acts.data() + t0;
      for (int64_t rr = r; rr < r_end; rr += 16) {
        const uint8_t* w = g.w + rr * g.row_bytes;
        float* y = g.y + t0 * g.ldy + rr;
        if (nt == 1) short_rows16<Block, kX4, 1>(w, g.row_bytes, nb, a, sa, y, g.ldy);
        if (nt == 2) short_rows16<Block, kX4, 2>(w, g.row_bytes, nb, a, sa, y, g.ldy);
        if (nt == 3) short_rows16<Block, kX4, 3>(w, g.row_bytes, nb, a, sa, y, g.ldy);
        if (nt == 4) short_rows16<Block, kX4, 4>(w, g.row_bytes, nb, a, sa, y, g.ldy);
      }
    }
    r = r_end;
  }
  if (nb <= 8) {  // short rows (e.g. MLA's per-head K up-projections): 4 or 2 per vector
    const int per = nb <= 4 ? 4 : 2;
    const int64_t r_begin = r;
    const int64_t r_end = r_begin + (g.n1 - r_begin) / per * per;
    for (int64_t t0 = 0; t0 < g.tokens; t0 += kMaxTokens) {
      const int64_t nt = std::min<int64_t>(kMaxTokens, g.tokens - t0);
      for (int64_t rr = r_begin; rr < r_end; rr += per) {
        short_rows_any<Block, kX4>(g.w + rr * g.row_bytes, g.row_bytes, nb, acts.data() + t0, nt,
                              g.y + t0 * g.ldy + rr, g.ldy);
      }
    }
    r = r_end;  // the rest row by row
  }
  for (; r + 16 <= g.n1; r += 16) {
    const uint8_t* w = g.w + r * g.row_bytes;
    for (int64_t t0 = 0; t0 < g.tokens; t0 += kMaxTokens) {
      const int64_t nt = std::min<int64_t>(kMaxTokens, g.tokens - t0);
      const Act* a = acts.data() + t0;
      float* y = g.y + t0 * g.ldy + r;
      if (nt == 4) rows16<Block, kX4, 4>(w, g.row_bytes, nb, a, y, g.ldy);
      if (nt == 3) rows16<Block, kX4, 3>(w, g.row_bytes, nb, a, y, g.ldy);
      if (nt == 2) rows16<Block, kX4, 2>(w, g.row_bytes, nb, a, y, g.ldy);
      if (nt == 1) rows16<Block, kX4, 1>(w, g.row_bytes, nb, a, y, g.ldy);
    }
  }
  for (; r < g.n1; ++r) {
    const uint8_t* w = g.w + r * g.row_bytes;
    for (int64_t t0 = 0; t0 < g.tokens; t0 += kMaxTokens) {
      const int64_t nt = std::min<int64_t>(kMaxTokens, g.tokens - t0);
      float out[kMaxTokens];
      const Act* a = acts.data() + t0;
      if (nt == 4) row<Block, kX4, 4>(w, nb, a, out);
      if (nt == 3) row<Block, kX4, 3>(w, nb, a, out);
      if (nt == 2) row<Block, kX4, 2>(w, nb, a, out);
      if (nt == 1) row<Block, kX4, 1>(w, nb, a, out);
      for (int64_t t = 0; t < nt; ++t) g.y[(t0 + t) * g.ldy + r] = out[t];
    }
  }
}

}  // namespace

namespace tandem::kern::detail {

void q5_0_rows_vbmi(const GemmArgs& g) {
  rows_vbmi<BlockQ5_0>(g);
}
void q4_0_rows_vbmi(const GemmArgs& g) {
  rows_vbmi<BlockQ4_0>(g);
}
void q4_1_rows_vbmi(const GemmArgs& g) {
  rows_vbmi<BlockQ4_1>(g);
}
void q5_1_rows_vbmi(const GemmArgs& g) {
  rows_vbmi<BlockQ5_1>(g);
}
void mxfp4_rows_vbmi(const GemmArgs& g) {
  rows_vbmi<BlockMXFP4>(g);
}
void q8_0_rows_vbmi(const GemmArgs& g) {
  rows_vbmi<BlockQ8_0>(g);
}
void q5_0x4_rows_vbmi(const GemmArgs& g) {
  rows_vbmi<BlockQ5_0, true>(g);
}
void q8_0x4_rows_vbmi(const GemmArgs& g) {
  rows_vbmi<BlockQ8_0, true>(g);
}

}  // namespace tandem::kern::detail
