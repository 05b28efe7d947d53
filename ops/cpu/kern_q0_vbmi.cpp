// Q5_0 x Q8_0 for fewer than 16 tokens (GEMV) with AVX-512 VBMI and BITALG on top of VNNI
// (compiled with those flags; kern_gguf_vnni.cpp calls it only on CPUs that have them: Ice Lake+,
// Zen 4+). Same arithmetic and F32 order as the VNNI row kernels and tiles (kern_gguf_vnni.cpp):
// exact int32 block sums, acc[b % 16] = fma(float(isum_b), dw_b * da_b, acc[b % 16]), the fixed
// tree; so results are bit-identical to them whatever the batch.
//
// What differs is how a block's 5-bit quants are formed: four blocks (88 bytes) at a time, from one
// full and one masked 64-byte load, one vpermt2b gathers the four 16-byte nibble arrays into a
// vector, a second the four 32-bit fifth-bit words, and vpshufbitqmb turns those into the two
// 64-bit masks that add 16 to the quants whose bit is set; a third the fp16 scales. The
// token's quants are rearranged once per call to match (16 low-nibble partners of each block, then
// 16 high). (The VNNI rows expand two blocks per vector with a 64-bit permute, a masked shift and a
// mask built in general registers, and gather the scales: about twice the instructions per block.)
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

constexpr int kBlockBytes = static_cast<int>(sizeof(BlockQ5_0));  // 22
static_assert(kBlockBytes == 22, "Q5_0 block: fp16 d, 4 bytes qh, 16 bytes qs");
constexpr int kMaxTokens = 4;

using Bytes64 = std::array<uint8_t, 64>;

// Byte indices into the 128 loaded bytes (block i of the four at 22 * i).
constexpr Bytes64 qs_index() {  // out 16i + j = qs[j] of block i
  Bytes64 x{};
  for (int p = 0; p < 64; ++p) x[p] = static_cast<uint8_t>(kBlockBytes * (p / 16) + 6 + p % 16);
  return x;
}
constexpr Bytes64 qh_index() {  // 64-bit lanes 2i and 2i + 1: qh of block i (low 4 bytes)
  Bytes64 x{};
  for (int p = 0; p < 64; ++p) x[p] = static_cast<uint8_t>(kBlockBytes * (p / 16) + 2 + p % 4);
  return x;
}
constexpr Bytes64 d_index() {  // out 8k + 2i + e = byte e of block i's d (any k)
  Bytes64 x{};
  for (int p = 0; p < 64; ++p) x[p] = static_cast<uint8_t>(kBlockBytes * ((p % 8) / 2) + p % 2);
  return x;
}
constexpr Bytes64 bit_index(int first) {  // byte 16i + j: bit first + j of its 64-bit lane's qh
  Bytes64 x{};
  for (int p = 0; p < 64; ++p) x[p] = static_cast<uint8_t>(first + p % 16);
  return x;
}
constexpr Bytes64 kQsIndex = qs_index(), kQhIndex = qh_index(), kDIndex = d_index();
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
};

// The constants of the quad expansion.
struct Consts {
  __m512i qs_idx, qh_idx, d_idx, bits_lo, bits_hi, nib, sixteen;
  // Vector k's 128-bit lane i holds block i of quad k: dword 4i + k -> dword 4k + i.
  __m512i order;
};
inline Consts consts() {
  return {load_index(kQsIndex),
          load_index(kQhIndex),
          load_index(kDIndex),
          load_index(kBitsLo),
          load_index(kBitsHi),
          _mm512_set1_epi8(0x0F),
          _mm512_set1_epi8(0x10),
          _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0)};
}

// `blocks` (1..4) consecutive blocks at x as unsigned quants u = q + 16: u_lo the 16 low-nibble
// quants of each block (bytes 16i..16i+15), u_hi the 16 high ones; their fp16 scales into bytes
// 8k..8k+7 of d16. Reads only the blocks' bytes.
inline void load_quad(const uint8_t* x, int blocks, int k, const Consts& c, __m512i* u_lo,
                      __m512i* u_hi, __m512i* d16) {
  prefetch_ahead(x, 4 * kBlockBytes);
  const int bytes = blocks * kBlockBytes;
  const __m512i z0 = _mm512_maskz_loadu_epi8(byte_mask(bytes), x);
  const __m512i z1 = _mm512_maskz_loadu_epi8(byte_mask(std::max(0, bytes - 64)), x + 64);
  const __m512i q = _mm512_permutex2var_epi8(z0, c.qs_idx, z1);
  const __m512i h = _mm512_permutex2var_epi8(z0, c.qh_idx, z1);
  *d16 = _mm512_mask_blend_epi8(__mmask64{0xFF} << (8 * k), *d16,
                                _mm512_permutex2var_epi8(z0, c.d_idx, z1));
  const __m512i lo = _mm512_and_si512(q, c.nib);
  const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), c.nib);
  *u_lo = _mm512_mask_add_epi8(lo, _mm512_bitshuffle_epi64_mask(h, c.bits_lo), lo, c.sixteen);
  *u_hi = _mm512_mask_add_epi8(hi, _mm512_bitshuffle_epi64_mask(h, c.bits_hi), hi, c.sixteen);
}

// The four quad vectors' dot products -> the 16 exact block sums (of u), in vector-major order.
inline __m512i block_sums(const __m512i* v, const Consts& c) {
  return _mm512_permutexvar_epi32(c.order,
                                  tree4_epi32(tree2_epi32(v[0], v[1]), tree2_epi32(v[2], v[3])));
}

template <int NT>
void row(const uint8_t* w, int64_t nb, const Act* act, float* out) {
  const Consts c = consts();
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t g0 = 0; g0 < nb; g0 += 16) {
    const int m = static_cast<int>(std::min<int64_t>(16, nb - g0));
    __m512i d16 = _mm512_setzero_si512();
    __m512i v[NT][4];
    for (int k = 0; k < 4; ++k) {
      const int blocks = std::clamp(m - 4 * k, 0, 4);
      if (blocks == 0) {
        for (int t = 0; t < NT; ++t) v[t][k] = _mm512_setzero_si512();
        continue;
      }
      __m512i u_lo, u_hi;
      load_quad(w + (g0 + 4 * k) * kBlockBytes, blocks, k, c, &u_lo, &u_hi, &d16);
      for (int t = 0; t < NT; ++t) {
        const __m512i* aq = act[t].quads + 2 * ((g0 >> 2) + k);
        v[t][k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u_lo, aq[0]),
                                      u_hi, aq[1]);
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(d16));
    for (int t = 0; t < NT; ++t) {
      // u = q + 16: isum = dot(u, a) - 16 * sum(a) = sums + negc / 8.
      const __m512i isum = _mm512_add_epi32(
          block_sums(v[t], c), _mm512_srai_epi32(_mm512_loadu_si512(act[t].negc + g0), 3));
      const __m512 s = _mm512_mul_ps(dw, _mm512_loadu_ps(act[t].d + g0));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), s, acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = lane_tree_ps(acc[t]);
}

// Short rows (nb <= 4 * Q, Q = 1 or 2 quads) R = 4 / Q at a time: row r's blocks in lanes
// 4Qr .. 4Qr + 4Q - 1 of one vector. Row r's result is what row() computes, step for step: the
// products fma(float(isum), dw * da, +0) in lanes 0..nb-1, +0 elsewhere, the tree's levels above
// 4Q lanes adding those zeros, then the 4Q lanes' own levels.
template <int Q, int NT>
void short_rows(const uint8_t* w, int64_t row_bytes, int64_t nb, const Act* act, float (*out)[NT]) {
  constexpr int R = 4 / Q;
  const Consts c = consts();
  __m512i d16 = _mm512_setzero_si512();
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
      load_quad(w + r * row_bytes + 4 * qd * kBlockBytes, blocks, k, c, &u_lo, &u_hi, &d16);
      for (int t = 0; t < NT; ++t) {
        const __m512i* aq = act[t].quads + 2 * qd;
        v[t][k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u_lo, aq[0]),
                                      u_hi, aq[1]);
      }
    }
  }
  const __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(d16));
  const __m512 zero = _mm512_setzero_ps();
  for (int t = 0; t < NT; ++t) {
    __m512i bias;
    __m512 ad;
    if constexpr (Q == 1) {
      bias = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(act[t].negc)));
      ad = _mm512_broadcast_f32x4(_mm_loadu_ps(act[t].d));
    } else {
      bias =
          _mm512_broadcast_i32x8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(act[t].negc)));
      ad = _mm512_broadcast_f32x8(_mm256_loadu_ps(act[t].d));
    }
    const __m512i isum = _mm512_add_epi32(block_sums(v[t], c), _mm512_srai_epi32(bias, 3));
    const __m512 p = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, ad), zero);
    // h8 (and for Q == 1, h4) add the untouched lanes: + 0.
    __m512 h = _mm512_add_ps(p, zero);
    if constexpr (Q == 1) {
      h = _mm512_add_ps(h, zero);
    } else {  // h4: lanes i and i + 4 of each row's 8
      h = _mm512_add_ps(h, _mm512_shuffle_f32x4(h, h, 0xB1));
    }
    h = _mm512_add_ps(h, _mm512_permute_ps(h, 0x4E));  // h2: lanes i and i + 2
    h = _mm512_add_ps(h, _mm512_permute_ps(h, 0xB1));  // h1: lanes 0 and 1
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, h);
    for (int r = 0; r < R; ++r) out[r][t] = lanes[4 * Q * r];
  }
}

// short_rows for nb <= 8 and nt <= kMaxTokens tokens: out[row][token].
inline void short_rows_any(const uint8_t* w, int64_t row_bytes, int64_t nb, const Act* a,
                           int64_t nt, float (*out)[kMaxTokens]) {
  float o[4][kMaxTokens];
  auto run = [&](auto q, auto t) {
    constexpr int kQ = decltype(q)::value, kT = decltype(t)::value;
    float tmp[4][kT];
    short_rows<kQ, kT>(w, row_bytes, nb, a, tmp);
    for (int i = 0; i < 4 / kQ; ++i) {
      for (int j = 0; j < kT; ++j) o[i][j] = tmp[i][j];
    }
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
  std::memcpy(out, o, sizeof(o));
}

}  // namespace

namespace tandem::kern::detail {

void q5_0_rows_vbmi(const GemmArgs& g) {
  const int64_t nb = g.cols / kQK;
  const int64_t quads = (nb + 3) / 4;
  thread_local std::vector<__m512i> arranged;
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
        reinterpret_cast<const float*>(negc + q8_0_act_padded_blocks(nb))};
  }
  int64_t r = g.n0;
  if (nb <= 8) {  // short rows (e.g. MLA's per-head K up-projections): 4 or 2 per vector
    const int per = nb <= 4 ? 4 : 2;
    const int64_t r_end = g.n0 + (g.n1 - g.n0) / per * per;
    for (int64_t t0 = 0; t0 < g.tokens; t0 += kMaxTokens) {
      const int64_t nt = std::min<int64_t>(kMaxTokens, g.tokens - t0);
      for (int64_t rr = g.n0; rr < r_end; rr += per) {
        float out[4][kMaxTokens];
        short_rows_any(g.w + rr * g.row_bytes, g.row_bytes, nb, acts.data() + t0, nt, out);
        for (int i = 0; i < per; ++i) {
          for (int64_t t = 0; t < nt; ++t) g.y[(t0 + t) * g.ldy + rr + i] = out[i][t];
        }
      }
    }
    r = r_end;  // the rest row by row
  }
  for (; r < g.n1; ++r) {
    const uint8_t* w = g.w + r * g.row_bytes;
    for (int64_t t0 = 0; t0 < g.tokens; t0 += kMaxTokens) {
      const int64_t nt = std::min<int64_t>(kMaxTokens, g.tokens - t0);
      float out[kMaxTokens];
      const Act* a = acts.data() + t0;
      if (nt == 4) row<4>(w, nb, a, out);
      if (nt == 3) row<3>(w, nb, a, out);
      if (nt == 2) row<2>(w, nb, a, out);
      if (nt == 1) row<1>(w, nb, a, out);
      for (int64_t t = 0; t < nt; ++t) g.y[(t0 + t) * g.ldy + r] = out[t];
    }
  }
}

}  // namespace tandem::kern::detail
