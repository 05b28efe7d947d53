// AVX-512 VNNI instances of the GGUF / dense kernel templates (compiled with -mavx512f/bw/vl/dq,
// -mavx512vnni and -ffp-contract=off, without BF16, so Cascade Lake and Ice Lake run them; see
// ops/cpu/CMakeLists.txt). Selected only when the CPU has them (Isa::kAvx512Vnni).
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/cpu_features.h"
#include "ops/cpu/avx512_transpose.h"
#include "ops/cpu/kern_gguf_impl.h"
// (after kern_gguf_impl.h: the traits use its block types)
#include "ops/cpu/kern_gguf_avx512.h"
#include "ops/cpu/kern_q4k_gemv16.h"
#include "ops/cpu/q4k_x16.h"

namespace {

using S = Avx512<true>;

// Q4_K GEMM through 16-row tiles (many tokens): the rows' blocks are rearranged once per call into
// the tile layout of the packed formats (packed.h), then every token block reuses it:
//   qs: per super-block 32 chunks of 64 bytes, chunk c = byte-dword c (bytes 4c..4c+3) of the 16
//       rows' 128 quant bytes (a 16 x 16 dword transpose, twice). Dword c = 8g + q holds elements
//       64g + 4q.. (low nibbles, sub-block 2g) and 64g + 32 + 4q.. (high, sub-block 2g + 1).
//   sc: per super-block and sub-block j, 16 int32 (the rows' 6-bit scales); m: the same for the
//       mins, as the int16 pair (m, m) (vpdpwssd against the token's bsums 2j, 2j + 1);
//   d, dmin: per super-block 16 F32.
// Per row lane and token: isum = sum_j sc_j * dot_j (vpdpbusd: nibbles unsigned x Q8_K signed),
// msum = sum_j m_j * bsum_j (exact integers), then acc + (da * d) * isum - (da * dmin) * msum per
// super-block, each step rounded as the scalar reference and the row kernels do: bit-identical.
// The rearrangement costs about as much as 8 tokens' arithmetic, so fewer tokens take the rows.
constexpr int64_t kQ4KTileMinTokens = 16;
constexpr int kQ4KTiles = 2;

struct Q4KTile {
  const uint8_t* qs;  // super-block b's chunks from qs + b * qs_stride
  int64_t qs_stride;
  const int32_t *sc, *mn;
  const float *d, *dmin;
};

// Scales, mins, d and dmin of super-block b of 16 rows (rows past `live`: zero) at once, a row
// per lane (unpack_k4_scales' bit layout: Q4_K and Q5_K share the first 16 bytes of a block):
// gathers of the block headers' four 32-bit words (row n's header at base + n * stride: GGUF rows,
// or a Q4_K x16 slice's 16-byte headers), then byte j of each word.
void k4_expand_scales(const uint8_t* base, int64_t stride, __mmask16 live, int64_t b, int32_t* sc,
                      int32_t* mn, float* d, float* dmin) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i offs =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(static_cast<int32_t>(stride)));
  const __m512i dd = _mm512_mask_i32gather_epi32(zero, live, offs, base, 1);
  const __m512i wa = _mm512_mask_i32gather_epi32(zero, live, offs, base + 4, 1);
  const __m512i wb = _mm512_mask_i32gather_epi32(zero, live, offs, base + 8, 1);
  const __m512i wc = _mm512_mask_i32gather_epi32(zero, live, offs, base + 12, 1);
  const __m512i m3f = _mm512_set1_epi32(0x3F3F3F3F), m0f = _mm512_set1_epi32(0x0F0F0F0F);
  const __m512i m30 = _mm512_set1_epi32(0x30303030);
  const __m512i words[4] = {
      _mm512_and_si512(wa, m3f),                  // scales 0-3
      _mm512_or_si512(_mm512_and_si512(wc, m0f),  // scales 4-7
                      _mm512_and_si512(_mm512_srli_epi32(wa, 2), m30)),
      _mm512_and_si512(wb, m3f),                                        // mins 0-3
      _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(wc, 4), m0f),  // mins 4-7
                      _mm512_and_si512(_mm512_srli_epi32(wb, 2), m30))};
  const __m512i ff = _mm512_set1_epi32(0xFF);
  for (int j = 0; j < 4; ++j) {
    _mm512_storeu_si512(sc + (b * 8 + j) * 16,
                        _mm512_and_si512(_mm512_srli_epi32(words[0], 8 * j), ff));
    _mm512_storeu_si512(sc + (b * 8 + 4 + j) * 16,
                        _mm512_and_si512(_mm512_srli_epi32(words[1], 8 * j), ff));
    // Mins as the int16 pair (m, m) per row: one vpdpwssd against a token's two bsums.
    const __m512i m_lo = _mm512_and_si512(_mm512_srli_epi32(words[2], 8 * j), ff);
    const __m512i m_hi = _mm512_and_si512(_mm512_srli_epi32(words[3], 8 * j), ff);
    _mm512_storeu_si512(mn + (b * 8 + j) * 16, _mm512_or_si512(m_lo, _mm512_slli_epi32(m_lo, 16)));
    _mm512_storeu_si512(mn + (b * 8 + 4 + j) * 16,
                        _mm512_or_si512(m_hi, _mm512_slli_epi32(m_hi, 16)));
  }
  _mm512_storeu_ps(d + b * 16, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
  _mm512_storeu_ps(dmin + b * 16,
                   _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))));
}

// Tile rows [row0, row0 + rows) (rows <= 16; the rest zero) of g's Q4_K matrix into the storage.
void q4k_expand(const GemmArgs& g, int64_t row0, int64_t rows, int64_t nb, uint8_t* qs, int32_t* sc,
                int32_t* mn, float* d, float* dmin) {
  const __mmask16 live = static_cast<__mmask16>((1u << rows) - 1);  // rows past the end: zero
  for (int64_t b = 0; b < nb; ++b) {
    for (int h = 0; h < 2; ++h) {
      __m512i r[16], out[16];
      for (int i = 0; i < 16; ++i) {
        r[i] = _mm512_setzero_si512();
        if (i < rows) {
          const auto* blk = reinterpret_cast<const BlockQ4_K*>(g.w + (row0 + i) * g.row_bytes) + b;
          r[i] = _mm512_loadu_si512(blk->qs + 64 * h);
        }
      }
      tandem::kern::detail::transpose16_epi32(r, out);
      for (int c = 0; c < 16; ++c) _mm512_storeu_si512(qs + (b * 32 + 16 * h + c) * 64, out[c]);
    }
    k4_expand_scales(g.w + row0 * g.row_bytes + b * sizeof(BlockQ4_K), g.row_bytes, live, b, sc,
                     mn, d, dmin);
  }
}

// The same for Q5_K, whose quants are 5 bits: per super-block 64 chunks, the 16 rows' values as
// whole bytes (0..31), chunk 32h + c the low nibbles' values of byte-dword c of the 64 quant bytes
// 64h.. (plus their fifth bits) and chunk 32h + 16 + c the high nibbles', so the tile kernel reads
// two chunks per step instead of splitting one. The fifth bit of element 32k + l (sub-block k) is
// bit k of qh[l].
void q5k_expand(const GemmArgs& g, int64_t row0, int64_t rows, int64_t nb, uint8_t* qs, int32_t* sc,
                int32_t* mn, float* d, float* dmin) {
  const __mmask16 live = static_cast<__mmask16>((1u << rows) - 1);
  const __m512i m0f = _mm512_set1_epi8(0x0F), m10 = _mm512_set1_epi8(0x10);
  for (int64_t b = 0; b < nb; ++b) {
    for (int h = 0; h < 2; ++h) {
      // Bytes 0-31 are sub-blocks 4h (low nibbles) and 4h + 1 (high), bytes 32-63 4h + 2 and
      // 4h + 3: qh shifted right by 4h (resp. 4h + 2) puts the low nibbles' fifth bits in bit 0
      // and the high nibbles' in bit 1 of each byte (16-bit shifts: the bits crossing into the
      // other byte are masked off).
      const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(4 * h)),
                                               _mm256_set1_epi16(static_cast<short>(4 * h + 2)), 1);
      __m512i lo[16], hi[16], out[16];
      for (int i = 0; i < 16; ++i) {
        lo[i] = hi[i] = _mm512_setzero_si512();
        if (i < rows) {
          const auto* blk = reinterpret_cast<const BlockQ5_K*>(g.w + (row0 + i) * g.row_bytes) + b;
          const __m512i raw = _mm512_loadu_si512(blk->qs + 64 * h);
          const __m512i bits = _mm512_srlv_epi16(
              _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qh))),
              shift);
          lo[i] = _mm512_or_si512(_mm512_and_si512(raw, m0f),
                                  _mm512_and_si512(_mm512_slli_epi16(bits, 4), m10));
          hi[i] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(raw, 4), m0f),
                                  _mm512_and_si512(_mm512_slli_epi16(bits, 3), m10));
        }
      }
      tandem::kern::detail::transpose16_epi32(lo, out);
      for (int c = 0; c < 16; ++c) _mm512_storeu_si512(qs + (b * 64 + 32 * h + c) * 64, out[c]);
      tandem::kern::detail::transpose16_epi32(hi, out);
      for (int c = 0; c < 16; ++c) {
        _mm512_storeu_si512(qs + (b * 64 + 32 * h + 16 + c) * 64, out[c]);
      }
    }
    k4_expand_scales(g.w + row0 * g.row_bytes + b * sizeof(BlockQ5_K), g.row_bytes, live, b, sc,
                     mn, d, dmin);
  }
}

inline __m512i dpbusd(__m512i acc, __m512i u8, __m512i s8) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "v"(s8));  // in place (see packed_vnni.cpp)
  return acc;
}

// acc + u8 x the 4 signed bytes at s8x4, broadcast (the load folded into vpdpbusd).
inline __m512i dpbusd_bcast(__m512i acc, __m512i u8, const int8_t* s8x4) {
  asm("vpdpbusd %2%{1to16%}, %1, %0"
      : "+v"(acc)
      : "v"(u8), "m"(*reinterpret_cast<const int32_t*>(s8x4)));
  return acc;
}

// acc + per 32-bit lane the sum of the two int16 products with the int16 pair at p (broadcast).
inline __m512i dpwssd_bcast(__m512i acc, __m512i s16, const int16_t* p) {
  asm("vpdpwssd %2%{1to16%}, %1, %0"
      : "+v"(acc)
      : "v"(s16), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

// kFive: Q5_K tiles (q5k_expand: values as bytes, two chunks per step), else Q4_K's (nibbles).
template <int NR, int NT, bool kFive>
void q4k_tiles(const Q4KTile* tile, int64_t nb, const BlockQ8_K* const* a, float (*out)[16 * NR]) {
  const __m512i mask = _mm512_set1_epi8(0x0F);
  __m512 facc[NT][NR];
  for (int t = 0; t < NT; ++t) {
    for (int r = 0; r < NR; ++r) facc[t][r] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    __m512i isum[NT][NR];
    for (int t = 0; t < NT; ++t) {
      for (int r = 0; r < NR; ++r) isum[t][r] = _mm512_setzero_si512();
    }
    for (int gi = 0; gi < 4; ++gi) {
      __m512i dl[NT][NR], dh[NT][NR];
      for (int t = 0; t < NT; ++t) {
        for (int r = 0; r < NR; ++r) dl[t][r] = dh[t][r] = _mm512_setzero_si512();
      }
      for (int q = 0; q < 8; ++q) {
        __m512i lo[NR], hi[NR];
        for (int r = 0; r < NR; ++r) {
          const uint8_t* qb = tile[r].qs + b * tile[r].qs_stride;
          if constexpr (kFive) {
            const uint8_t* c = qb + (32 * (gi / 2) + 8 * (gi % 2) + q) * 64;
            lo[r] = _mm512_loadu_si512(c);
            hi[r] = _mm512_loadu_si512(c + 16 * 64);
          } else {
            const __m512i raw = _mm512_loadu_si512(qb + (gi * 8 + q) * 64);
            lo[r] = _mm512_and_si512(raw, mask);
            hi[r] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
          }
        }
        for (int t = 0; t < NT; ++t) {
          int32_t bl, bh;
          std::memcpy(&bl, a[t][b].qs + 64 * gi + 4 * q, 4);
          std::memcpy(&bh, a[t][b].qs + 64 * gi + 32 + 4 * q, 4);
          const __m512i al = _mm512_set1_epi32(bl), ah = _mm512_set1_epi32(bh);
          for (int r = 0; r < NR; ++r) {
            dl[t][r] = dpbusd(dl[t][r], lo[r], al);
            dh[t][r] = dpbusd(dh[t][r], hi[r], ah);
          }
        }
      }
      for (int r = 0; r < NR; ++r) {
        const __m512i s_lo = _mm512_loadu_si512(tile[r].sc + (b * 8 + 2 * gi) * 16);
        const __m512i s_hi = _mm512_loadu_si512(tile[r].sc + (b * 8 + 2 * gi + 1) * 16);
        for (int t = 0; t < NT; ++t) {
          isum[t][r] = _mm512_add_epi32(isum[t][r], _mm512_mullo_epi32(dl[t][r], s_lo));
          isum[t][r] = _mm512_add_epi32(isum[t][r], _mm512_mullo_epi32(dh[t][r], s_hi));
        }
      }
    }
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_K& x = a[t][b];
      for (int r = 0; r < NR; ++r) {
        // msum = sum_j m_j * (bsums[2j] + bsums[2j + 1]), exact int32.
        __m512i msum = _mm512_setzero_si512();
        for (int j = 0; j < 8; ++j) {
          msum = dpwssd_bcast(msum, _mm512_loadu_si512(tile[r].mn + (b * 8 + j) * 16),
                              x.bsums + 2 * j);
        }
        const __m512 da = _mm512_set1_ps(x.d);
        const __m512 dv = _mm512_mul_ps(_mm512_loadu_ps(tile[r].d + b * 16), da);
        const __m512 mv = _mm512_mul_ps(_mm512_loadu_ps(tile[r].dmin + b * 16), da);
        // The reference's steps, separately rounded: acc + (da * dw) * isum - (da * dmin) * msum.
        facc[t][r] = _mm512_add_ps(facc[t][r], _mm512_mul_ps(dv, _mm512_cvtepi32_ps(isum[t][r])));
        facc[t][r] = _mm512_sub_ps(facc[t][r], _mm512_mul_ps(mv, _mm512_cvtepi32_ps(msum)));
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    for (int r = 0; r < NR; ++r) _mm512_storeu_ps(out[t] + 16 * r, facc[t][r]);
  }
}

// Runs a K-quant tile kernel over all of g's tokens, 4 at a time (the last 1-3 in one pass too:
// a token's arithmetic does not depend on NT), storing rows [n, n_end). kernel(nt, a, out) with
// nt a std::integral_constant<int, 1..4>.
template <int NR, class Kernel>
void k_tiles_all_tokens(const GemmArgs& g, int64_t n, int64_t n_end, const Kernel& kernel) {
  constexpr int kTokens = 4;
  alignas(64) float out[kTokens][16 * NR];
  const BlockQ8_K* a[kTokens];
  for (int64_t t0 = 0; t0 < g.tokens; t0 += kTokens) {
    const int nt = static_cast<int>(std::min<int64_t>(kTokens, g.tokens - t0));
    for (int t = 0; t < nt; ++t) {
      a[t] = reinterpret_cast<const BlockQ8_K*>(g.act + (t0 + t) * g.act_row_bytes);
    }
    switch (nt) {
      case 4: kernel(std::integral_constant<int, 4>{}, a, out); break;
      case 3: kernel(std::integral_constant<int, 3>{}, a, out); break;
      case 2: kernel(std::integral_constant<int, 2>{}, a, out); break;
      default: kernel(std::integral_constant<int, 1>{}, a, out); break;
    }
    for (int t = 0; t < nt; ++t) {
      for (int64_t r = n; r < n_end; ++r) g.y[(t0 + t) * g.ldy + r] = out[t][r - n];
    }
  }
}

template <int NR, bool kFive>
void q4k_tiles_all_tokens(const GemmArgs& g, const Q4KTile* tile, int64_t nb, int64_t n,
                          int64_t n_end) {
  k_tiles_all_tokens<NR>(g, n, n_end,
                         [&](auto nt, const BlockQ8_K* const* a, float(*out)[16 * NR]) {
                           q4k_tiles<NR, decltype(nt)::value, kFive>(tile, nb, a, out);
                         });
}

// Prefetches weight rows [r0, r1) of g (contiguous), a cache line at a time.
template <_mm_hint kHint>
void prefetch_rows(const GemmArgs& g, int64_t r0, int64_t r1) {
  const uint8_t* e = g.w + r1 * g.row_bytes;
  for (const uint8_t* p = g.w + r0 * g.row_bytes; p < e; p += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(p), kHint);
  }
}

// Q4_K (kFive false) or Q5_K tiled GEMM.
template <bool kFive>
void q4k_tiled(const GemmArgs& g) {
  constexpr int64_t kChunks = kFive ? 64 : 32;  // 64-byte quant chunks per super-block and tile
  const int64_t nb = g.cols / tandem::kQK_K;
  thread_local std::vector<uint8_t> qs;
  thread_local std::vector<int32_t> sc, mn;
  thread_local std::vector<float> d, dmin;
  qs.resize(static_cast<size_t>(kQ4KTiles * nb * kChunks * 64));
  sc.resize(static_cast<size_t>(kQ4KTiles * nb * 8 * 16));
  mn.resize(sc.size());
  d.resize(static_cast<size_t>(kQ4KTiles * nb * 16));
  dmin.resize(d.size());
  Q4KTile tile[kQ4KTiles];
  // The expansion reads 16 rows a super-block at a time, 16 strided streams the hardware
  // prefetchers follow badly (perf: its loads were most of its time, the weights' first touch);
  // the rows of a tile pair are contiguous, so the next pair is prefetched into L2 ahead of its
  // expansion while this pair's tokens run, and the first pair up front.
  prefetch_rows<_MM_HINT_T0>(g, g.n0, std::min(g.n1, g.n0 + 16 * kQ4KTiles));
  for (int64_t n = g.n0; n < g.n1; n += 16 * kQ4KTiles) {
    const int64_t n_end = std::min(g.n1, n + 16 * kQ4KTiles);
    const int tiles = static_cast<int>((n_end - n + 15) / 16);
    for (int r = 0; r < tiles; ++r) {
      uint8_t* q = qs.data() + r * nb * kChunks * 64;
      int32_t* s = sc.data() + r * nb * 8 * 16;
      int32_t* m = mn.data() + r * nb * 8 * 16;
      float* dd = d.data() + r * nb * 16;
      float* dm = dmin.data() + r * nb * 16;
      const int64_t rows = std::min<int64_t>(16, n_end - n - 16 * r);
      if constexpr (kFive) {
        q5k_expand(g, n + 16 * r, rows, nb, q, s, m, dd, dm);
      } else {
        q4k_expand(g, n + 16 * r, rows, nb, q, s, m, dd, dm);
      }
      tile[r] = {q, kChunks * 64, s, m, dd, dm};
    }
    prefetch_rows<_MM_HINT_T1>(g, n_end, std::min(g.n1, n_end + 16 * kQ4KTiles));
    if (tiles == 2) {
      q4k_tiles_all_tokens<2, kFive>(g, tile, nb, n, n_end);
    } else {
      q4k_tiles_all_tokens<1, kFive>(g, tile, nb, n, n_end);
    }
  }
}

// Q4_K x16 (q4k_x16.h) with two or more tokens: its slices are q4k_tiles' layout already (chunk
// 8g + i = byte-dword 8g + i of the 16 rows' quants, after the slice's 256 header bytes), so the
// tiles read the quants in place; only the 16 headers per slice are unpacked (per call, into
// thread-local sc / mn / d / dmin), the next tile pair prefetched into L2 meanwhile.
void q4k_x16_tiled(const GemmArgs& g) {
  constexpr int64_t kSliceBytes = 16 * static_cast<int64_t>(sizeof(BlockQ4_K));
  const int64_t nb = g.cols / tandem::kQK_K, tile_bytes = nb * kSliceBytes;
  thread_local std::vector<int32_t> sc, mn;
  thread_local std::vector<float> d, dmin;
  sc.resize(static_cast<size_t>(kQ4KTiles * nb * 8 * 16));
  mn.resize(sc.size());
  d.resize(static_cast<size_t>(kQ4KTiles * nb * 16));
  dmin.resize(d.size());
  Q4KTile tile[kQ4KTiles];
  const int64_t t_end = (g.n1 + 15) / 16;
  for (int64_t n = g.n0; n < g.n1; n += 16 * kQ4KTiles) {
    const int64_t n_end = std::min(g.n1, n + 16 * kQ4KTiles);
    const int tiles = static_cast<int>((n_end - n + 15) / 16);
    const int64_t t0 = n / 16;
    // (A tile is 16 rows' bytes, so prefetch_rows' row r is byte r * row_bytes of the tiles.)
    prefetch_rows<_MM_HINT_T1>(g, 16 * (t0 + tiles), 16 * std::min(t_end, t0 + 2 * tiles));
    for (int r = 0; r < tiles; ++r) {
      const uint8_t* t = g.w + (t0 + r) * tile_bytes;
      int32_t* s = sc.data() + r * nb * 8 * 16;
      int32_t* m = mn.data() + r * nb * 8 * 16;
      float* dd = d.data() + r * nb * 16;
      float* dm = dmin.data() + r * nb * 16;
      for (int64_t b = 0; b < nb; ++b) {
        k4_expand_scales(t + b * kSliceBytes, 16, 0xFFFF, b, s, m, dd, dm);
      }
      tile[r] = {t + 256, kSliceBytes, s, m, dd, dm};
    }
    if (tiles == 2) {
      q4k_tiles_all_tokens<2, false>(g, tile, nb, n, n_end);
    } else {
      q4k_tiles_all_tokens<1, false>(g, tile, nb, n, n_end);
    }
  }
}

// Tokens up to this many run the x16 tile kernel, all of them in one pass over each tile (each
// chunk's nibbles unpacked once for them all); more run q4k_x16_tiled, whose per-call scale
// unpacking pays over more tokens (bench_kernels_bench BM_FewTokensX16/q4_k; decode steps of a
// V2-Lite-shaped model: docs/performance.md C12, C13).
constexpr int64_t kQ4KX16GemvMaxTokens = 4;

// Q4_K x16 entry: up to kQ4KX16GemvMaxTokens tokens through the x16 GEMV (q4k_x16_vnni.cpp; a
// last partial tile into a scratch row), more through q4k_x16_tiled.
void q4kx16(const GemmArgs& g) {
  if (g.tokens > kQ4KX16GemvMaxTokens) {
    q4k_x16_tiled(g);
    return;
  }
  const int64_t nb = g.cols / tandem::kQK_K, tile_bytes = 16 * g.row_bytes;
  const auto act = [&](int64_t k) {
    return reinterpret_cast<const BlockQ8_K*>(g.act + k * g.act_row_bytes);
  };
  const int64_t t0 = g.n0 / 16, full = g.n1 / 16;
  if (full > t0) {
    tandem::kern::q4k_x16_gemv_vnni(g.w + t0 * tile_bytes, full - t0, nb, act(0), g.y + 16 * t0,
                                    g.tokens, g.act_row_bytes, g.ldy);
  }
  if (full * 16 < g.n1) {
    alignas(64) float part[kQ4KX16GemvMaxTokens][16];
    tandem::kern::q4k_x16_gemv_vnni(g.w + full * tile_bytes, 1, nb, act(0), part[0], g.tokens,
                                    g.act_row_bytes, 16);
    for (int64_t k = 0; k < g.tokens; ++k) {
      for (int64_t r = full * 16; r < g.n1; ++r) g.y[k * g.ldy + r] = part[k][r - full * 16];
    }
  }
}

// Q6_K, Q3_K and Q2_K GEMM through 16-row tiles (many tokens), as Q4_K's. The three share a
// shape: 16 sub-blocks of 16 values with a scale each, values unsigned as bytes (Q6_K: the stored
// 6-bit q + 32, 0..63; Q3_K: u = q + 4, 0..7; Q2_K: q, 0..3). Per super-block of 16 rows
//   qs: 64 chunks of 64 bytes, chunk k = elements 4k..4k+3 of the 16 rows as those bytes;
//   sc: 16 x 16 int32, the rows' scale of sub-block j (elements 16j..16j+15; Q3_K: sc - 32,
//       Q2_K: sc & 15);
//   sp: 8 x 16 int32, per row the int16 pair (c[2i], c[2i + 1]) against the token's bsums, c the
//       scales (Q6_K, Q3_K: the values' offset times the scales is the bias) or Q2_K's mins;
//   d (and Q2_K's dmin): 16 F32.
// Per row lane and token: isum = sum_j sc_j * dot_j(u, a) and bias = sum_i c . bsums (exact
// integers); then Q6_K acc + (da * d) * (isum - 32 * bias), Q3_K acc + (da * d) * (isum - 4 *
// bias) (the references' isum: u - 32, u - 4 are the signed values), Q2_K acc + (da * d) * isum -
// (da * dmin) * bias, per super-block as the scalar references round: bit-identical.
constexpr int64_t kQ6KTileMinTokens = 16;
// Q2_K / Q3_K's row kernel (AVX2 width) is slower: their tiles win from 4 tokens (cache-resident
// `TANDEM_BENCH_TOKENS=4 bench_kernels_bench --benchmark_filter=BM_Gemv/q3_k`: 1.5x; at 2-3
// tokens even).
constexpr int64_t kK23TileMinTokens = 4;

struct K16Tile {
  const uint8_t* qs;
  const int32_t *sc, *sp;
  const float *d, *dmin;
};

template <class Block>
constexpr bool kIsQ2K = std::is_same_v<Block, BlockQ2_K>;

template <class Block>
void k16_expand(const GemmArgs& g, int64_t row0, int64_t rows, int64_t nb, uint8_t* qs,
                int32_t* sc, int32_t* sp, float* d, float* dmin) {
  const __m512i zero = _mm512_setzero_si512();
  const __mmask16 live = static_cast<__mmask16>((1u << rows) - 1);
  const __m512i offs =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(static_cast<int32_t>(g.row_bytes)));
  const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(0x03);
  // Per-half shift counts of the qh bytes: q_lo takes bits 0-1 (low 32 bytes) / 2-3 (high),
  // q_hi bits 4-5 / 6-7. (Q2_K / Q3_K: the same counts for runs 0-1 / 2-3 of a 128-half.)
  const __m512i sh_lo = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
  const __m512i sh_hi = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
  for (int64_t b = 0; b < nb; ++b) {
    __m512i v[4][16], scl[16], mnl[16];
    for (int i = 0; i < 16; ++i) {
      if (i >= rows) {
        for (int k = 0; k < 4; ++k) v[k][i] = zero;
        scl[i] = mnl[i] = zero;
        continue;
      }
      const auto& x = reinterpret_cast<const Block*>(g.w + (row0 + i) * g.row_bytes)[b];
      if constexpr (std::is_same_v<Block, BlockQ6_K>) {
        for (int h = 0; h < 2; ++h) {
          const __m512i l = _mm512_loadu_si512(x.ql + 64 * h);
          const __m512i hb = _mm512_broadcast_i64x4(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qh + 32 * h)));
          const __m512i hl = _mm512_and_si512(_mm512_srlv_epi16(hb, sh_lo), m2);
          const __m512i hh = _mm512_and_si512(_mm512_srlv_epi16(hb, sh_hi), m2);
          // Elements 128h + 0..63, then 128h + 64..127 (natural order).
          v[2 * h][i] = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_slli_epi16(hl, 4));
          v[2 * h + 1][i] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                            _mm512_slli_epi16(hh, 4));
        }
        scl[i] = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales)));
      } else {
        // Elements 64k .. 64k + 63 (k = 2n + kk): runs j = 2kk, 2kk + 1 of the 32 bytes qs + 32n
        // (element 128n + 32j + l is bits 2j of qs[32n + l]); Q3_K adds 4 where bit 4n + j of
        // hmask[l] is set.
        [[maybe_unused]] __m512i hm;
        if constexpr (!kIsQ2K<Block>) {
          hm = _mm512_broadcast_i64x4(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.hmask)));
        }
        for (int k = 0; k < 4; ++k) {
          const __m512i q = _mm512_broadcast_i64x4(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + 32 * (k / 2))));
          __m512i u = _mm512_and_si512(_mm512_srlv_epi16(q, k % 2 ? sh_hi : sh_lo), m2);
          if constexpr (!kIsQ2K<Block>) {
            const int m = 4 * (k / 2) + 2 * (k % 2);
            const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << m)),
                                                   _mm256_set1_epi8(static_cast<char>(2 << m)), 1);
            u = _mm512_mask_add_epi8(u, _mm512_test_epi8_mask(hm, bit), u, _mm512_set1_epi8(4));
          }
          v[k][i] = u;
        }
        if constexpr (kIsQ2K<Block>) {
          const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales));
          scl[i] = _mm512_cvtepu8_epi32(_mm_and_si128(raw, _mm_set1_epi8(0x0F)));
          mnl[i] = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F)));
        } else {
          scl[i] = _mm512_cvtepi16_epi32(q3k_scales16(x));
        }
      }
    }
    for (int k = 0; k < 4; ++k) {
      __m512i out[16];
      tandem::kern::detail::transpose16_epi32(v[k], out);
      for (int c = 0; c < 16; ++c) _mm512_storeu_si512(qs + (b * 64 + 16 * k + c) * 64, out[c]);
    }
    __m512i st[16];
    tandem::kern::detail::transpose16_epi32(scl, st);
    for (int j = 0; j < 16; ++j) _mm512_storeu_si512(sc + (b * 16 + j) * 16, st[j]);
    if constexpr (kIsQ2K<Block>) tandem::kern::detail::transpose16_epi32(mnl, st);
    const __m512i lo16 = _mm512_set1_epi32(0xFFFF);
    for (int i = 0; i < 8; ++i) {
      _mm512_storeu_si512(sp + (b * 8 + i) * 16,
                          _mm512_or_si512(_mm512_and_si512(st[2 * i], lo16),
                                          _mm512_slli_epi32(st[2 * i + 1], 16)));
    }
    const uint8_t* base = g.w + row0 * g.row_bytes + b * static_cast<int64_t>(sizeof(Block));
    if constexpr (kIsQ2K<Block>) {  // d, dmin: one dword
      const __m512i dd =
          _mm512_mask_i32gather_epi32(zero, live, offs, base + offsetof(BlockQ2_K, d), 1);
      _mm512_storeu_ps(d + b * 16, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
      _mm512_storeu_ps(dmin + b * 16,
                       _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))));
    } else {  // d: the high half of the dword ending the block: never past the row
      const __m512i dd =
          _mm512_mask_i32gather_epi32(zero, live, offs, base + offsetof(Block, d) - 2, 1);
      _mm512_storeu_ps(d + b * 16,
                       _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))));
    }
  }
}

template <int NR, int NT, class Block>
void k16_tiles(const K16Tile* tile, int64_t nb, const BlockQ8_K* const* a,
               float (*out)[16 * NR]) {
  __m512 facc[NT][NR];
  for (int t = 0; t < NT; ++t) {
    for (int r = 0; r < NR; ++r) facc[t][r] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    __m512i isum[NT][NR];
    for (int t = 0; t < NT; ++t) {
      for (int r = 0; r < NR; ++r) isum[t][r] = _mm512_setzero_si512();
    }
    for (int j = 0; j < 16; ++j) {
      __m512i dj[NT][NR];
      for (int t = 0; t < NT; ++t) {
        for (int r = 0; r < NR; ++r) dj[t][r] = _mm512_setzero_si512();
      }
      for (int q = 0; q < 4; ++q) {
        const int k = 4 * j + q;
        __m512i w[NR];
        for (int r = 0; r < NR; ++r) w[r] = _mm512_loadu_si512(tile[r].qs + (b * 64 + k) * 64);
        for (int t = 0; t < NT; ++t) {
          for (int r = 0; r < NR; ++r) dj[t][r] = dpbusd_bcast(dj[t][r], w[r], a[t][b].qs + 4 * k);
        }
      }
      for (int r = 0; r < NR; ++r) {
        const __m512i s = _mm512_loadu_si512(tile[r].sc + (b * 16 + j) * 16);
        for (int t = 0; t < NT; ++t) {
          isum[t][r] = _mm512_add_epi32(isum[t][r], _mm512_mullo_epi32(dj[t][r], s));
        }
      }
    }
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_K& x = a[t][b];
      const __m512 da = _mm512_set1_ps(x.d);
      for (int r = 0; r < NR; ++r) {
        __m512i bias = _mm512_setzero_si512();  // sum_j c_j * bsum_j, exact int32
        for (int i = 0; i < 8; ++i) {
          bias = dpwssd_bcast(bias, _mm512_loadu_si512(tile[r].sp + (b * 8 + i) * 16),
                              x.bsums + 2 * i);
        }
        const __m512 dv = _mm512_mul_ps(da, _mm512_loadu_ps(tile[r].d + b * 16));
        if constexpr (kIsQ2K<Block>) {
          const __m512 mv = _mm512_mul_ps(da, _mm512_loadu_ps(tile[r].dmin + b * 16));
          facc[t][r] = _mm512_add_ps(facc[t][r], _mm512_mul_ps(dv, _mm512_cvtepi32_ps(isum[t][r])));
          facc[t][r] = _mm512_sub_ps(facc[t][r], _mm512_mul_ps(mv, _mm512_cvtepi32_ps(bias)));
        } else {
          constexpr int kShift = std::is_same_v<Block, BlockQ6_K> ? 5 : 2;  // 32 or 4 times
          const __m512i is = _mm512_sub_epi32(isum[t][r], _mm512_slli_epi32(bias, kShift));
          facc[t][r] = _mm512_add_ps(facc[t][r], _mm512_mul_ps(dv, _mm512_cvtepi32_ps(is)));
        }
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    for (int r = 0; r < NR; ++r) _mm512_storeu_ps(out[t] + 16 * r, facc[t][r]);
  }
}

template <int NR, class Block>
void k16_tiles_all_tokens(const GemmArgs& g, const K16Tile* tile, int64_t nb, int64_t n,
                          int64_t n_end) {
  k_tiles_all_tokens<NR>(g, n, n_end,
                         [&](auto nt, const BlockQ8_K* const* a, float(*out)[16 * NR]) {
                           k16_tiles<NR, decltype(nt)::value, Block>(tile, nb, a, out);
                         });
}

template <class Block>
void k16_tiled(const GemmArgs& g) {
  constexpr int kTiles = 2;
  const int64_t nb = g.cols / tandem::kQK_K;
  thread_local std::vector<uint8_t> qs;
  thread_local std::vector<int32_t> sc, sp;
  thread_local std::vector<float> d, dmin;
  qs.resize(static_cast<size_t>(kTiles * nb * 64 * 64));
  sc.resize(static_cast<size_t>(kTiles * nb * 16 * 16));
  sp.resize(static_cast<size_t>(kTiles * nb * 8 * 16));
  d.resize(static_cast<size_t>(kTiles * nb * 16));
  dmin.resize(d.size());
  K16Tile tile[kTiles];
  prefetch_rows<_MM_HINT_T0>(g, g.n0, std::min(g.n1, g.n0 + 16 * kTiles));  // as q4k_tiled
  for (int64_t n = g.n0; n < g.n1; n += 16 * kTiles) {
    const int64_t n_end = std::min(g.n1, n + 16 * kTiles);
    const int tiles = static_cast<int>((n_end - n + 15) / 16);
    for (int r = 0; r < tiles; ++r) {
      uint8_t* q = qs.data() + r * nb * 64 * 64;
      int32_t* s = sc.data() + r * nb * 16 * 16;
      int32_t* p = sp.data() + r * nb * 8 * 16;
      float* dd = d.data() + r * nb * 16;
      float* dm = dmin.data() + r * nb * 16;
      k16_expand<Block>(g, n + 16 * r, std::min<int64_t>(16, n_end - n - 16 * r), nb, q, s, p,
                        dd, dm);
      tile[r] = {q, s, p, dd, dm};
    }
    prefetch_rows<_MM_HINT_T1>(g, n_end, std::min(g.n1, n_end + 16 * kTiles));
    if (tiles == 2) {
      k16_tiles_all_tokens<2, Block>(g, tile, nb, n, n_end);
    } else {
      k16_tiles_all_tokens<1, Block>(g, tile, nb, n, n_end);
    }
  }
}

// The legacy 32-blocks Q8_0 / Q5_0 / Q4_0 / Q4_1 / Q5_1 (x Q8_0 activations). Rows (few tokens)
// and 16-row tiles (many tokens) share one F32 accumulation order, so a token's result does not
// depend on its batch:
//   isum_b = the exact int32 dot product of block b's 32 quants (q - 8 for Q4_0, q - 16 for Q5_0,
//            q itself for Q4_1 / Q5_1),
//   acc[b % 16] = fma(float(isum_b), dw_b * da_b, acc[b % 16]) for b = 0, 1, ... in order,
//   then for Q4_1 / Q5_1 acc[b % 16] = fma(m_b, s_b, acc[b % 16]) (s: the Q8_1 sum, kern_gguf.h),
//   h8[i] = acc[i] + acc[i + 8], h4[i] = h8[i] + h8[i + 4], h2[i] = h4[i] + h4[i + 2],
//   result = h2[0] + h2[1].
// vpdpbusd multiplies unsigned by signed bytes: the weights enter as u = q + c (Q8_0: q ^ 0x80,
// c = 128; rows of the 4/5-bit formats: the stored value, c = 16 / 8 / 0; tiles: c = 128 for all)
// and c * sum(a) is subtracted per block, exactly. Rows take 16 blocks at a time: one vpdpbusd
// per pair of blocks (lanes 0-7 the even block, 8-15 the odd one), the 8 pair vectors reduced to
// the 16 block sums by a transposing add tree, one FMA per 16 blocks. Tiles keep each acc[L] as a
// vector over the 16 rows, lane L's blocks one after the other (q0_tiles_all_tokens: two tiles x
// six tokens). One order for rows and tiles costs the rows a 16-block tree; reproducing per-dword
// lane accumulators in the tiles instead would cost a conversion and an FMA per vpdpbusd.
constexpr int64_t kQ0TileMinTokens = 16;

// Token t's activation row: blocks, and the bias / scale arrays (kern_gguf.h).
struct Q0Act {
  const BlockQ8_0* blk;
  const int32_t* negc;  // -128 * sum(a) per block, padded to 16
  const float* d;
  const float* s;  // the Q8_1 sums
};
inline Q0Act q0_act(const GemmArgs& g, int64_t t) {
  const uint8_t* row = g.act + t * g.act_row_bytes;
  const int64_t nb = g.cols / tandem::kQK;
  const auto* negc =
      reinterpret_cast<const int32_t*>(row + tandem::kern::detail::q8_0_act_aux_offset(nb));
  return {reinterpret_cast<const BlockQ8_0*>(row), negc,
          reinterpret_cast<const float*>(negc + tandem::kern::detail::q8_0_act_padded_blocks(nb)),
          tandem::kern::detail::q8_0_act_sums(row, nb)};
}

// Per legacy format: the row kernel's u = q + c and its bias c * sum(a), taken from the
// activation's -128 * sum(a) by an arithmetic shift (kBiasShift; -1: c = 0, no bias); kMin: blocks
// carry a min m (F16 right after d), the term m * s.
template <class Block>
struct Q0Fmt;
template <>
struct Q0Fmt<BlockQ8_0> {
  static constexpr int kBiasShift = 0;  // c = 128
  static constexpr bool kMin = false;
};
template <>
struct Q0Fmt<BlockQ5_0> {
  static constexpr int kBiasShift = 3;  // c = 16
  static constexpr bool kMin = false;
};
template <>
struct Q0Fmt<BlockQ4_0> {
  static constexpr int kBiasShift = 4;  // c = 8
  static constexpr bool kMin = false;
};
template <>
struct Q0Fmt<BlockMXFP4> {  // (the tiles take expand_mxfp4's signed values; no raw-nibble rows)
  static constexpr int kBiasShift = -1;
  static constexpr bool kMin = false;
};
template <>
struct Q0Fmt<BlockQ4_1> {
  static constexpr int kBiasShift = -1;
  static constexpr bool kMin = true;
};
template <>
struct Q0Fmt<BlockQ5_1> {
  static constexpr int kBiasShift = -1;
  static constexpr bool kMin = true;
};

// The row kernel's u for blocks b and b + 1 of a row (only b when `one`): 64 unsigned bytes.
template <class Block>
inline __m512i q0_pair_u8(const Block* x, bool one) {
  if constexpr (std::is_same_v<Block, BlockQ8_0>) {
    const __m512i v =
        one ? _mm512_zextsi256_si512(expand_q8_0(x[0])) : S::load_halves(x[0].qs, x[1].qs);
    return _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80)));
  } else if constexpr (std::is_same_v<Block, BlockQ5_0>) {
    if (one) {
      return _mm512_zextsi256_si512(_mm256_add_epi8(expand_q5_0(x[0]), _mm256_set1_epi8(16)));
    }
    return S::q5_0_pair_u8(x[0], x[1]);
  } else if constexpr (std::is_same_v<Block, BlockQ5_1>) {
    if (one) return _mm512_zextsi256_si512(expand_q5_1(x[0]));
    return S::q5_pair_u8(x[0].qs, x[0].qh, x[1].qs, x[1].qh);
  } else {  // Q4_0 (c = 8), Q4_1: the nibbles
    if (one) return _mm512_zextsi256_si512(nibbles_32(x[0].qs));
    return S::nib_pair_u8(x[0].qs, x[1].qs);
  }
}

// NR rows x NT tokens (rows r.., tokens t0..).
template <class Block, int NR, int NT>
void q0_rows(const GemmArgs& g, int64_t r, int64_t t0) {
  // isum = the block sums of u * a minus c * sum(a): + negc (c = 128) or + negc >> 3 (c = 16) ...
  constexpr int kBiasShift = Q0Fmt<Block>::kBiasShift;
  constexpr bool kMin = Q0Fmt<Block>::kMin;
  constexpr int kStride = static_cast<int>(sizeof(Block));
  const __m512i gidx =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(kStride));
  const int64_t nb = g.cols / tandem::kQK;
  const Block* w[NR];
  for (int i = 0; i < NR; ++i) w[i] = reinterpret_cast<const Block*>(g.w + (r + i) * g.row_bytes);
  Q0Act a[NT];
  for (int t = 0; t < NT; ++t) a[t] = q0_act(g, t0 + t);
  __m512 acc[NR][NT];
  for (int i = 0; i < NR; ++i) {
    for (int t = 0; t < NT; ++t) acc[i][t] = _mm512_setzero_ps();
  }
  for (int64_t g0 = 0; g0 < nb; g0 += 16) {
    const int m = static_cast<int>(nb - g0 < 16 ? nb - g0 : 16);
    const int pairs = (m + 1) / 2;
    const __mmask16 live = static_cast<__mmask16>((1u << m) - 1);
    for (int i = 0; i < NR; ++i) {
      const Block* x = w[i] + g0;
      prefetch_ahead(x, 16 * kStride);
      __m512i u[8];
      for (int p = 0; p < pairs; ++p) u[p] = q0_pair_u8(x + 2 * p, 2 * p + 1 == m);
      // d (and m, the next F16) of the 16 blocks.
      const __m512i dm = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, gidx, x, 1);
      const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
      __m512 mw = _mm512_setzero_ps();
      if constexpr (kMin) mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
      for (int t = 0; t < NT; ++t) {
        const BlockQ8_0* ab = a[t].blk + g0;
        __m512i v[8];
        for (int p = 0; p < 8; ++p) {
          if (p >= pairs) {
            v[p] = _mm512_setzero_si512();
          } else {
            const __m512i av = 2 * p + 1 == m ? _mm512_zextsi256_si512(expand_q8_0(ab[2 * p]))
                                              : S::load_halves(ab[2 * p].qs, ab[2 * p + 1].qs);
            v[p] = dpbusd(_mm512_setzero_si512(), u[p], av);
          }
        }
        __m512i isum = q0_block_sums(v);
        if constexpr (kBiasShift >= 0) {
          isum = _mm512_add_epi32(
              isum, _mm512_srai_epi32(_mm512_loadu_si512(a[t].negc + g0), kBiasShift));
        }
        const __m512 s = _mm512_mul_ps(dw, _mm512_loadu_ps(a[t].d + g0));
        acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), s, acc[i][t]);
        if constexpr (kMin) {
          acc[i][t] = _mm512_fmadd_ps(mw, _mm512_loadu_ps(a[t].s + g0), acc[i][t]);
        }
      }
    }
  }
  for (int i = 0; i < NR; ++i) {
    for (int t = 0; t < NT; ++t) g.y[(t0 + t) * g.ldy + r + i] = lane_tree_ps(acc[i][t]);
  }
}

template <class Block>
void q0_rows_all(const GemmArgs& g) {
  for (int64_t r0 = g.n0; r0 < g.n1; r0 += 16) {
    const int64_t r1 = std::min(g.n1, r0 + 16);
    int64_t t0 = 0;
    for (; t0 + 4 <= g.tokens; t0 += 4) {
      int64_t r = r0;
      for (; r + 2 <= r1; r += 2) q0_rows<Block, 2, 4>(g, r, t0);
      for (; r < r1; ++r) q0_rows<Block, 1, 4>(g, r, t0);
    }
    const int64_t rest = g.tokens - t0;
    for (int64_t r = r0; r < r1; ++r) {
      if (rest == 3) q0_rows<Block, 1, 3>(g, r, t0);
      if (rest == 2) q0_rows<Block, 1, 2>(g, r, t0);
      if (rest == 1) q0_rows<Block, 1, 1>(g, r, t0);
    }
  }
}

// Tile storage per block: 8 chunks of 64 bytes, chunk l = bytes 4l..4l+3 of the 16 rows' quants
// as q - c + 128 (by the 16 x 16 dword transpose of two blocks at a time), then 16 F32 dw (and
// for Q4_1 / Q5_1 16 F32 m).
template <class Block>
constexpr int64_t kQ0TileBlockBytes = 8 * 64 + 16 * 4 * (Q0Fmt<Block>::kMin ? 2 : 1);

// Block b of a row as q0_expand reads it: expand(the stored block); in an x4 row (q0_x4.h, kX4)
// the blocks of its full quads from their rearranged bytes (the same quants and d).
template <class Block, bool kX4, class Expand>
inline __m256i block_quants(const uint8_t* row, int64_t b, int64_t nb, Expand expand) {
  if constexpr (kX4) {
    if (b < nb / 4 * 4) {
      const uint8_t* quad = row + b / 4 * 4 * static_cast<int64_t>(sizeof(Block));
      const int i = static_cast<int>(b % 4);
      if constexpr (std::is_same_v<Block, BlockQ8_0>) {  // stored as q + 128
        const __m256i u = _mm256_set_m128i(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(quad + 72 + 16 * i)),
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(quad + 8 + 16 * i)));
        return _mm256_xor_si256(u, _mm256_set1_epi8(static_cast<char>(0x80)));
      } else {
        static_assert(std::is_same_v<Block, BlockQ5_0>, "x4: Q5_0 and Q8_0");
        uint64_t lo, hi;
        std::memcpy(&lo, quad + 8, 8);
        std::memcpy(&hi, quad + 16, 8);
        const uint32_t qh = static_cast<uint32_t>((lo >> (16 * i)) & 0xFFFF) |
                            static_cast<uint32_t>((hi >> (16 * i)) & 0xFFFF) << 16;
        uint8_t qh_bytes[4];
        std::memcpy(qh_bytes, &qh, 4);
        const __m256i f0 = _mm256_set1_epi8(static_cast<char>(0xF0));
        return _mm256_or_si256(nibbles_32(quad + 24 + 16 * i),
                               _mm256_andnot_si256(fifth_bits_32(qh_bytes), f0));
      }
    }
  }
  return expand(reinterpret_cast<const Block*>(row)[b]);
}
template <class Block, bool kX4>
inline float block_d(const uint8_t* row, int64_t b, int64_t nb) {
  if (kX4 && b < nb / 4 * 4) {
    uint16_t d;
    std::memcpy(&d, row + b / 4 * 4 * static_cast<int64_t>(sizeof(Block)) + 2 * (b % 4), 2);
    return half_to_float(d);
  }
  return weight_scale(reinterpret_cast<const Block*>(row)[b]);
}

template <class Block, bool kX4, class Expand>
void q0_expand(const GemmArgs& g, int64_t row0, int64_t rows, int64_t nb, Expand expand,
               uint8_t* tile) {
  static_assert(!kX4 || !Q0Fmt<Block>::kMin, "x4: no min term");
  const __m512i u128 = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < nb; b += 2) {
    __m512i r[16], out[16];
    for (int i = 0; i < 16; ++i) {
      r[i] = _mm512_setzero_si512();
      if (i < rows) {
        const uint8_t* row = g.w + (row0 + i) * g.row_bytes;
        const __m256i lo = block_quants<Block, kX4>(row, b, nb, expand);
        const __m256i hi =
            b + 1 < nb ? block_quants<Block, kX4>(row, b + 1, nb, expand) : _mm256_setzero_si256();
        r[i] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      }
    }
    tandem::kern::detail::transpose16_epi32(r, out);
    for (int64_t bb = b; bb < b + 2 && bb < nb; ++bb) {
      uint8_t* dst = tile + bb * kQ0TileBlockBytes<Block>;
      for (int l = 0; l < 8; ++l) {
        _mm512_storeu_si512(dst + l * 64, _mm512_xor_si512(out[(bb - b) * 8 + l], u128));
      }
      float* dw = reinterpret_cast<float*>(dst + 8 * 64);
      for (int i = 0; i < 16; ++i) {
        const uint8_t* row = g.w + (row0 + i) * g.row_bytes;
        dw[i] = i < rows ? block_d<Block, kX4>(row, bb, nb) : 0.0f;
        if constexpr (Q0Fmt<Block>::kMin) {
          dw[16 + i] = i < rows ? half_to_float(reinterpret_cast<const Block*>(row)[bb].m) : 0.0f;
        }
      }
    }
  }
}


// NT tokens (t0..) against NR tiles (16 * NR rows): out[t][16 * r + row]. Each activation
// broadcast feeds NR tiles' dot products (the broadcasts are the port limit with one tile). A
// row's sums run as with one tile (lane L: blocks L, L + 16, .., then the lanes in a tree).
template <class Block, int NR, int NT>
void q0_tile(const uint8_t* const* tiles, const GemmArgs& g, int64_t t0, float (*out)[16 * NR]) {
  const int64_t nb = g.cols / tandem::kQK;
  Q0Act a[NT];
  for (int t = 0; t < NT; ++t) a[t] = q0_act(g, t0 + t);
  alignas(64) float lanes[NT][NR][16][16];
  for (int L = 0; L < 16; ++L) {
    __m512 acc[NR][NT];
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
    }
    for (int64_t b = L; b < nb; b += 16) {
      const uint8_t* c[NR];
      for (int r = 0; r < NR; ++r) c[r] = tiles[r] + b * kQ0TileBlockBytes<Block>;
      __m512i isum[NR][NT];
      for (int t = 0; t < NT; ++t) {
        const __m512i init = _mm512_set1_epi32(a[t].negc[b]);
        for (int r = 0; r < NR; ++r) isum[r][t] = init;
      }
      for (int l = 0; l < 8; ++l) {
        __m512i wv[NR];
        for (int r = 0; r < NR; ++r) wv[r] = _mm512_loadu_si512(c[r] + l * 64);
        for (int t = 0; t < NT; ++t) {
          if constexpr (NR == 1) {
            isum[0][t] = dpbusd_bcast(isum[0][t], wv[0], a[t].blk[b].qs + 4 * l);
          } else {
            int32_t bits;
            std::memcpy(&bits, a[t].blk[b].qs + 4 * l, 4);
            const __m512i av = _mm512_set1_epi32(bits);
            for (int r = 0; r < NR; ++r) isum[r][t] = _mm512_dpbusd_epi32(isum[r][t], wv[r], av);
          }
        }
      }
      for (int r = 0; r < NR; ++r) {
        const __m512 dw = _mm512_loadu_ps(reinterpret_cast<const float*>(c[r] + 8 * 64));
        for (int t = 0; t < NT; ++t) {
          const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(a[t].d[b]));
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][t]), s, acc[r][t]);
        }
        if constexpr (Q0Fmt<Block>::kMin) {
          const __m512 mw = _mm512_loadu_ps(reinterpret_cast<const float*>(c[r] + 8 * 64) + 16);
          for (int t = 0; t < NT; ++t) {
            acc[r][t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a[t].s[b]), acc[r][t]);
          }
        }
      }
    }
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) _mm512_store_ps(lanes[t][r][L], acc[r][t]);
    }
  }
  for (int t = 0; t < NT; ++t) {
    for (int r = 0; r < NR; ++r) {
      __m512 h8[8], h4[4];
      for (int i = 0; i < 8; ++i) {
        h8[i] = _mm512_add_ps(_mm512_load_ps(lanes[t][r][i]), _mm512_load_ps(lanes[t][r][i + 8]));
      }
      for (int i = 0; i < 4; ++i) h4[i] = _mm512_add_ps(h8[i], h8[i + 4]);
      const __m512 h2_0 = _mm512_add_ps(h4[0], h4[2]), h2_1 = _mm512_add_ps(h4[1], h4[3]);
      _mm512_storeu_ps(out[t] + 16 * r, _mm512_add_ps(h2_0, h2_1));
    }
  }
}

// NR tiles of rows [n, n_end) for every token, in token blocks of kQ0Tokens<NR> (then 4, 2, 1):
// two tiles x 6 tokens keep 12 integer and 12 F32 accumulators in registers (x 4: 1.12-1.16x
// slower, x 7: within noise of 6; 6 divides a V2-Lite expert's 48 tokens).
template <int NR>
inline constexpr int kQ0Tokens = NR == 1 ? 8 : 6;
template <class Block, int NR>
void q0_tiles_all_tokens(const GemmArgs& g, const uint8_t* const* tiles, int64_t n,
                         int64_t n_end) {
  alignas(64) float out[8][16 * NR];
  for (int64_t t0 = 0; t0 < g.tokens;) {
    const int64_t rest = g.tokens - t0;
    const int nt = rest >= kQ0Tokens<NR> ? kQ0Tokens<NR> : rest >= 4 ? 4 : rest >= 2 ? 2 : 1;
    if (nt == kQ0Tokens<NR>) {
      q0_tile<Block, NR, kQ0Tokens<NR>>(tiles, g, t0, out);
    } else if (nt == 4) {
      q0_tile<Block, NR, 4>(tiles, g, t0, out);
    } else if (nt == 2) {
      q0_tile<Block, NR, 2>(tiles, g, t0, out);
    } else {
      q0_tile<Block, NR, 1>(tiles, g, t0, out);
    }
    for (int t = 0; t < nt; ++t) {
      for (int64_t r = n; r < n_end; ++r) g.y[(t0 + t) * g.ldy + r] = out[t][r - n];
    }
    t0 += nt;
  }
}

// kQ0Tiles tiles (16 rows each, expanded per call into a thread-local buffer) per step, the last
// rows one tile at a time; the next step's rows prefetched into L2 meanwhile. (Four tiles x four
// tokens: 0.90-1.0x of two x four, the accumulators spill.)
constexpr int kQ0Tiles = 2;
template <class Block, class Expand, bool kX4 = false>
void q0_tiled(const GemmArgs& g, Expand expand) {
  const int64_t nb = g.cols / tandem::kQK;
  const int64_t tile_bytes = nb * kQ0TileBlockBytes<Block>;
  thread_local std::vector<uint8_t> buf;
  buf.resize(static_cast<size_t>(kQ0Tiles * tile_bytes));
  const uint8_t* tiles[kQ0Tiles];
  for (int r = 0; r < kQ0Tiles; ++r) tiles[r] = buf.data() + r * tile_bytes;
  prefetch_rows<_MM_HINT_T0>(g, g.n0, std::min(g.n1, g.n0 + 16 * kQ0Tiles));  // as q4k_tiled
  for (int64_t n = g.n0; n < g.n1;) {
    const int nr = g.n1 - n > 16 ? kQ0Tiles : 1;
    const int64_t n_end = std::min(g.n1, n + 16 * nr);
    for (int r = 0; r < nr; ++r) {
      const int64_t r0 = n + 16 * r;
      q0_expand<Block, kX4>(g, r0, std::min<int64_t>(16, n_end - r0), nb, expand,
                            buf.data() + r * tile_bytes);
    }
    prefetch_rows<_MM_HINT_T1>(g, n_end, std::min(g.n1, n_end + 16 * kQ0Tiles));
    if (nr == kQ0Tiles) {
      q0_tiles_all_tokens<Block, kQ0Tiles>(g, tiles, n, n_end);
    } else {
      q0_tiles_all_tokens<Block, 1>(g, tiles, n, n_end);
    }
    n = n_end;
  }
}

template <class Block, class Expand>
void q0_gemm(const GemmArgs& g, Expand expand) {
  if (g.tokens >= kQ0TileMinTokens) {
    q0_tiled<Block>(g, expand);
  } else {
    q0_rows_all<Block>(g);
  }
}

void q80(const GemmArgs& g) {
  q0_gemm<BlockQ8_0>(g, expand_q8_0);
}

void q50(const GemmArgs& g) {
  q0_gemm<BlockQ5_0>(g, expand_q5_0);
}
// Q2_K / Q3_K: 4+ tokens through the tiles, else k_rows (kern_q4k_gemv16.h).
template <class Block>
void k23(const GemmArgs& g) {
  if (g.tokens >= kK23TileMinTokens && g.row_bytes < (int64_t{1} << 27)) {
    k16_tiled<Block>(g);
  } else {
    k_rows<S, Block>(g);
  }
}
void q2k(const GemmArgs& g) {
  k23<BlockQ2_K>(g);
}
void q3k(const GemmArgs& g) {
  k23<BlockQ3_K>(g);
}
void q40(const GemmArgs& g) {
  q0_gemm<BlockQ4_0>(g, expand_q4_0);
}
// MXFP4: 16+ tokens through the tiles (expand_mxfp4's signed values, as every legacy format's),
// fewer through the row kernel (the VBMI table: the quad kernel).
void mxfp4(const GemmArgs& g) {
  if (g.tokens >= kQ0TileMinTokens) {
    q0_tiled<BlockMXFP4>(g, expand_mxfp4);
  } else {
    drive<Mxfp4Kern<S>>(g);
  }
}
void q41(const GemmArgs& g) {
  q0_gemm<BlockQ4_1>(g, expand_q4_1);
}
void q51(const GemmArgs& g) {
  q0_gemm<BlockQ5_1>(g, expand_q5_1);
}
// Fewer than 16 tokens through kern_q0_vbmi.cpp, else the tiles.
template <tandem::kern::detail::GemmFn kVbmi, tandem::kern::detail::GemmFn kVnni>
void q0_vbmi(const GemmArgs& g) {
  if (g.tokens < kQ0TileMinTokens) {
    kVbmi(g);
  } else {
    kVnni(g);
  }
}

// Q5_0 / Q8_0 in the x4 layout (q0_x4.h): below 16 tokens the VBMI rows on it, from 16 the tiles
// (their per-call expansion reads the x4 quads in place).
template <tandem::kern::detail::GemmFn kX4Rows, class Block, class Expand>
void q0_x4(const GemmArgs& g, Expand expand) {
  if (g.tokens < kQ0TileMinTokens) {
    kX4Rows(g);
  } else {
    q0_tiled<Block, Expand, true>(g, expand);
  }
}
void q50x4(const GemmArgs& g) {
  q0_x4<tandem::kern::detail::q5_0x4_rows_vbmi, BlockQ5_0>(g, expand_q5_0);
}
void q80x4(const GemmArgs& g) {
  q0_x4<tandem::kern::detail::q8_0x4_rows_vbmi, BlockQ8_0>(g, expand_q8_0);
}

void q4k(const GemmArgs& g) {
  // (The rearrangement gathers the 16 rows' scales with 32-bit row offsets.)
  if (g.tokens >= kQ4KTileMinTokens && g.row_bytes < (int64_t{1} << 27)) {
    q4k_tiled<false>(g);
    return;
  }
  k_rows<S, BlockQ4_K>(g);
}
void q5k(const GemmArgs& g) {
  // (As Q4_K's: the same tiles, from 16 tokens.)
  if (g.tokens >= kQ4KTileMinTokens && g.row_bytes < (int64_t{1} << 27)) {
    q4k_tiled<true>(g);
    return;
  }
  k_rows<S, BlockQ5_K>(g);
}
void q6k(const GemmArgs& g) {
  // (The rearrangement gathers the 16 rows' scales with 32-bit row offsets.)
  if (g.tokens >= kQ6KTileMinTokens && g.row_bytes < (int64_t{1} << 27)) {
    k16_tiled<BlockQ6_K>(g);
    return;
  }
  k_rows<S, BlockQ6_K>(g);
}
void f32(const GemmArgs& g) {
  drive<DenseKern<S, Dense::kF32>>(g);
}
void f16(const GemmArgs& g) {
  drive<DenseKern<S, Dense::kF16>>(g);
}
void bf16(const GemmArgs& g) {
  drive<DenseKern<S, Dense::kBF16>>(g);
}

}  // namespace

namespace tandem::kern::detail {

const GgufKernels& gguf_kernels_avx512_vnni_base() {
  static const GgufKernels k = [] {
    GgufKernels t{q4k, q5k, q6k, q80, f32, f16, bf16, q50, q40, q41, q51, q2k, q3k, q4kx16};
    t.mxfp4 = mxfp4;
    return t;
  }();
  return k;
}

const GgufKernels& gguf_kernels_avx512_vnni() {
  using namespace tandem::kern::detail;  // NOLINT: the *_rows_vbmi entry points
  static const GgufKernels k{q4k,
                             q5k,
                             q6k,
                             q0_vbmi<q8_0_rows_vbmi, q80>,
                             f32,
                             f16,
                             bf16,
                             q0_vbmi<q5_0_rows_vbmi, q50>,
                             q0_vbmi<q4_0_rows_vbmi, q40>,
                             q0_vbmi<q4_1_rows_vbmi, q41>,
                             q0_vbmi<q5_1_rows_vbmi, q51>,
                             q2k,
                             q3k,
                             q4kx16,
                             q50x4,
                             q80x4,
                             q0_vbmi<mxfp4_rows_vbmi, mxfp4>};
  static const bool vbmi = cpu_features().avx512_vbmi && cpu_features().avx512_bitalg;
  return vbmi ? k : gguf_kernels_avx512_vnni_base();
}

}  // namespace tandem::kern::detail
