// AVX-512 with VNNI and BF16 instances of the GGUF / dense kernel templates (compiled with the
// matching -mavx512* flags and -ffp-contract=off; see ops/cpu/CMakeLists.txt). Selected only when
// the CPU has them.
#include <vector>

#include "ops/cpu/avx512_transpose.h"
#include "ops/cpu/kern_gguf_impl.h"
// (after kern_gguf_impl.h: the traits use its block types)
#include "ops/cpu/kern_gguf_avx512.h"

namespace {

using S = Avx512<true>;

// Q4_K GEMM through 16-row tiles (many tokens): the rows' blocks are rearranged once per call into
// the tile layout of the packed formats (packed.h), then every token block reuses it:
//   qs: per super-block 32 chunks of 64 bytes, chunk c = byte-dword c (bytes 4c..4c+3) of the 16
//       rows' 128 quant bytes (a 16 x 16 dword transpose, twice). Dword c = 8g + q holds elements
//       64g + 4q.. (low nibbles, sub-block 2g) and 64g + 32 + 4q.. (high, sub-block 2g + 1).
//   sc, m: per super-block and sub-block j, 16 int32 (the rows' 6-bit scales / mins);
//   d, dmin: per super-block 16 F32.
// Per row lane and token: isum = sum_j sc_j * dot_j (vpdpbusd: nibbles unsigned x Q8_K signed),
// msum = sum_j m_j * bsum_j (exact integers), then acc + (da * d) * isum - (da * dmin) * msum per
// super-block, each step rounded as the scalar reference and the row kernels do: bit-identical.
// The rearrangement costs about as much as 8 tokens' arithmetic, so fewer tokens take the rows.
constexpr int64_t kQ4KTileMinTokens = 16;
constexpr int kQ4KTiles = 2, kQ4KTokens = 4;

struct Q4KTile {
  const uint8_t* qs;
  const int32_t *sc, *mn;
  const float *d, *dmin;
};

// Tile rows [row0, row0 + rows) (rows <= 16; the rest zero) of g's Q4_K matrix into the storage.
void q4k_expand(const GemmArgs& g, int64_t row0, int64_t rows, int64_t nb, uint8_t* qs, int32_t* sc,
                int32_t* mn, float* d, float* dmin) {
  const __m512i zero = _mm512_setzero_si512();
  const __mmask16 live = static_cast<__mmask16>((1u << rows) - 1);  // rows past the end: zero
  const __m512i offs =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(static_cast<int32_t>(g.row_bytes)));
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
    // Scales, mins, d and dmin of the 16 rows at once, a row per lane (unpack_k4_scales' bit
    // layout): gathers of the block's first four 32-bit words, then byte j of each word.
    const uint8_t* base = g.w + row0 * g.row_bytes + b * static_cast<int64_t>(sizeof(BlockQ4_K));
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
      _mm512_storeu_si512(mn + (b * 8 + j) * 16,
                          _mm512_and_si512(_mm512_srli_epi32(words[2], 8 * j), ff));
      _mm512_storeu_si512(mn + (b * 8 + 4 + j) * 16,
                          _mm512_and_si512(_mm512_srli_epi32(words[3], 8 * j), ff));
    }
    _mm512_storeu_ps(d + b * 16, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
    _mm512_storeu_ps(dmin + b * 16,
                     _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))));
  }
}

inline __m512i dpbusd(__m512i acc, __m512i u8, __m512i s8) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "v"(s8));  // in place (see packed_vnni.cpp)
  return acc;
}

template <int NR, int NT>
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
          const __m512i raw = _mm512_loadu_si512(tile[r].qs + (b * 32 + gi * 8 + q) * 64);
          lo[r] = _mm512_and_si512(raw, mask);
          hi[r] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
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
        __m512i msum = _mm512_setzero_si512();
        for (int j = 0; j < 8; ++j) {
          const __m512i m = _mm512_loadu_si512(tile[r].mn + (b * 8 + j) * 16);
          msum = _mm512_add_epi32(
              msum, _mm512_mullo_epi32(m, _mm512_set1_epi32(x.bsums[2 * j] + x.bsums[2 * j + 1])));
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

template <int NR>
void q4k_tiles_all_tokens(const GemmArgs& g, const Q4KTile* tile, int64_t nb, int64_t n,
                          int64_t n_end) {
  alignas(64) float out[kQ4KTokens][16 * NR];
  const BlockQ8_K* a[kQ4KTokens];
  for (int64_t t0 = 0; t0 < g.tokens; t0 += kQ4KTokens) {
    const int nt = static_cast<int>(std::min<int64_t>(kQ4KTokens, g.tokens - t0));
    for (int t = 0; t < nt; ++t) {
      a[t] = reinterpret_cast<const BlockQ8_K*>(g.act + (t0 + t) * g.act_row_bytes);
    }
    if (nt == kQ4KTokens) {
      q4k_tiles<NR, kQ4KTokens>(tile, nb, a, out);
    } else {
      for (int t = 0; t < nt; ++t) {  // the last tokens one at a time (same arithmetic per token)
        q4k_tiles<NR, 1>(tile, nb, a + t, out + t);
      }
    }
    for (int t = 0; t < nt; ++t) {
      for (int64_t r = n; r < n_end; ++r) g.y[(t0 + t) * g.ldy + r] = out[t][r - n];
    }
  }
}

void q4k_tiled(const GemmArgs& g) {
  const int64_t nb = g.cols / tandem::kQK_K;
  thread_local std::vector<uint8_t> qs;
  thread_local std::vector<int32_t> sc, mn;
  thread_local std::vector<float> d, dmin;
  qs.resize(static_cast<size_t>(kQ4KTiles * nb * 32 * 64));
  sc.resize(static_cast<size_t>(kQ4KTiles * nb * 8 * 16));
  mn.resize(sc.size());
  d.resize(static_cast<size_t>(kQ4KTiles * nb * 16));
  dmin.resize(d.size());
  Q4KTile tile[kQ4KTiles];
  for (int64_t n = g.n0; n < g.n1; n += 16 * kQ4KTiles) {
    const int64_t n_end = std::min(g.n1, n + 16 * kQ4KTiles);
    const int tiles = static_cast<int>((n_end - n + 15) / 16);
    for (int r = 0; r < tiles; ++r) {
      uint8_t* q = qs.data() + r * nb * 32 * 64;
      int32_t* s = sc.data() + r * nb * 8 * 16;
      int32_t* m = mn.data() + r * nb * 8 * 16;
      float* dd = d.data() + r * nb * 16;
      float* dm = dmin.data() + r * nb * 16;
      q4k_expand(g, n + 16 * r, std::min<int64_t>(16, n_end - n - 16 * r), nb, q, s, m, dd, dm);
      tile[r] = {q, s, m, dd, dm};
    }
    if (tiles == 2) {
      q4k_tiles_all_tokens<2>(g, tile, nb, n, n_end);
    } else {
      q4k_tiles_all_tokens<1>(g, tile, nb, n, n_end);
    }
  }
}

// Q8_0 / Q5_0 GEMM through 16-row tiles (many tokens), bit-identical to their row kernels. The
// row kernels (q_0_rows, q5_0_rows in kern_gguf_impl.h) accumulate per row in F32 vector lanes:
// Q8_0 in 8 lanes (lane l: elements 4l..4l+3 of every block), Q5_0 in 16 (lanes 0-7 the even
// block of each pair, 8-15 the odd one), acc = fma(float(exact 4-element dot), dw * da, acc), then
// hsum_ps256 / _mm512_reduce_add_ps. Here each of those lane accumulators is a vector over the 16
// rows of a tile (8 or 16 per token), updated with the same fma in the same block order, and the
// same reduction tree is applied lane-wise: the same bits, so a token's result does not depend on
// its batch. Tile storage per block: 8 chunks of the 16 rows' signed quants (q, or q - 16 for Q5_0;
// chunk l = bytes 4l..4l+3 of each row, by the 16 x 16 dword transpose of two blocks at a time),
// 8 chunks of -128 * (the 4 quants' sum) per row (the vpdpbusd bias of the activations read as
// a + 128), 16 F32 dw.
constexpr int64_t kQ0TileMinTokens = 16;
constexpr int kQ80Tokens = 3;  // 8 accumulators per token; Q5_0 has 16, one token at a time

struct Q0Tile {
  const uint8_t* w;     // [nb][8][64]
  const int32_t* negw;  // [nb][8][16]
  const float* dw;      // [nb][16]
};

template <class Block, class Expand>
void q0_expand(const GemmArgs& g, int64_t row0, int64_t rows, int64_t nb, Expand expand, uint8_t* w,
               int32_t* negw, float* dw) {
  const __m512i u128 = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < nb; b += 2) {
    __m512i r[16], out[16];
    for (int i = 0; i < 16; ++i) {
      r[i] = _mm512_setzero_si512();
      if (i < rows) {
        const auto* blk = reinterpret_cast<const Block*>(g.w + (row0 + i) * g.row_bytes) + b;
        const __m256i lo = expand(blk[0]);
        const __m256i hi = b + 1 < nb ? expand(blk[1]) : _mm256_setzero_si256();
        r[i] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      }
    }
    tandem::kern::detail::transpose16_epi32(r, out);
    for (int c = 0; c < 16 && b + c / 8 < nb; ++c) {
      _mm512_storeu_si512(w + (b * 8 + c) * 64, out[c]);
      const __m512i sum128 = dpbusd(_mm512_setzero_si512(), u128, out[c]);
      _mm512_storeu_si512(negw + (b * 8 + c) * 16,
                          _mm512_sub_epi32(_mm512_setzero_si512(), sum128));
    }
    for (int64_t bb = b; bb < b + 2 && bb < nb; ++bb) {
      for (int i = 0; i < 16; ++i) {
        dw[bb * 16 + i] =
            i < rows ? half_to_float(
                           (reinterpret_cast<const Block*>(g.w + (row0 + i) * g.row_bytes) + bb)->d)
                     : 0.0f;
      }
    }
  }
}

// One block's 8 chunks for NT tokens into the lane accumulators acc[t][base + l].
template <int NT, int kAcc>
inline void q0_block(const Q0Tile& tl, int64_t b, const uint8_t* const* abias, const __m512* dd,
                     __m512 (*acc)[kAcc], int base) {
  for (int l = 0; l < 8; ++l) {
    const __m512i w = _mm512_loadu_si512(tl.w + (b * 8 + l) * 64);
    const __m512i nw = _mm512_loadu_si512(tl.negw + (b * 8 + l) * 16);
    for (int t = 0; t < NT; ++t) {
      int32_t bits;
      std::memcpy(&bits, abias[t] + b * 32 + 4 * l, 4);
      const __m512i dot = dpbusd(nw, _mm512_set1_epi32(bits), w);
      acc[t][base + l] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), dd[t], acc[t][base + l]);
    }
  }
}

// Q8_0: hsum_ps256's tree, ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
template <int NT>
void q80_tile(const Q0Tile& tl, int64_t nb, const BlockQ8_0* const* a, const uint8_t* const* abias,
              float (*out)[16]) {
  __m512 acc[NT][8];
  for (int t = 0; t < NT; ++t) {
    for (int l = 0; l < 8; ++l) acc[t][l] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 dwv = _mm512_loadu_ps(tl.dw + b * 16);
    __m512 dd[NT];
    for (int t = 0; t < NT; ++t)
      dd[t] = _mm512_mul_ps(dwv, _mm512_set1_ps(half_to_float(a[t][b].d)));
    q0_block<NT, 8>(tl, b, abias, dd, acc, 0);
  }
  for (int t = 0; t < NT; ++t) {
    const __m512 s0 = _mm512_add_ps(acc[t][0], acc[t][4]), s1 = _mm512_add_ps(acc[t][1], acc[t][5]);
    const __m512 s2 = _mm512_add_ps(acc[t][2], acc[t][6]), s3 = _mm512_add_ps(acc[t][3], acc[t][7]);
    _mm512_storeu_ps(out[t], _mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3)));
  }
}

// Q5_0 (even block count): _mm512_reduce_add_ps's tree over the 16 lane accumulators, then + 0.0f
// (the row kernel adds its empty odd-block tail).
void q50_tile(const Q0Tile& tl, int64_t nb, const BlockQ8_0* a, const uint8_t* abias, float* out) {
  __m512 acc[1][16];
  for (int l = 0; l < 16; ++l) acc[0][l] = _mm512_setzero_ps();
  const uint8_t* ab[1] = {abias};
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 dd[1] = {
        _mm512_mul_ps(_mm512_loadu_ps(tl.dw + b * 16), _mm512_set1_ps(half_to_float(a[b].d)))};
    q0_block<1, 16>(tl, b, ab, dd, acc, static_cast<int>(b % 2) * 8);
  }
  const __m512* v = acc[0];
  auto add = [](__m512 x, __m512 y) { return _mm512_add_ps(x, y); };
  const __m512 t8_0 =
      add(add(add(v[0], v[8]), add(v[4], v[12])), add(add(v[2], v[10]), add(v[6], v[14])));
  const __m512 t8_1 =
      add(add(add(v[1], v[9]), add(v[5], v[13])), add(add(v[3], v[11]), add(v[7], v[15])));
  _mm512_storeu_ps(out, add(add(t8_0, t8_1), _mm512_setzero_ps()));
}

template <class Block, class Expand>
void q0_tiled(const GemmArgs& g, Expand expand, bool q5) {
  const int64_t nb = g.cols / tandem::kQK;
  thread_local std::vector<uint8_t> w, abias;
  thread_local std::vector<int32_t> negw;
  thread_local std::vector<float> dw;
  w.resize(static_cast<size_t>(nb * 8 * 64));
  negw.resize(static_cast<size_t>(nb * 8 * 16));
  dw.resize(static_cast<size_t>(nb * 16));
  // Every token's quants as a + 128 (the unsigned operand of vpdpbusd), contiguous.
  abias.resize(static_cast<size_t>(g.tokens * nb * 32));
  for (int64_t t = 0; t < g.tokens; ++t) {
    const auto* at = reinterpret_cast<const BlockQ8_0*>(g.act + t * g.act_row_bytes);
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at[b].qs));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(abias.data() + (t * nb + b) * 32),
                          _mm256_xor_si256(q, _mm256_set1_epi8(static_cast<char>(0x80))));
    }
  }
  const Q0Tile tl{w.data(), negw.data(), dw.data()};
  alignas(64) float out[kQ80Tokens][16];
  for (int64_t n = g.n0; n < g.n1; n += 16) {
    const int64_t n_end = std::min(g.n1, n + 16);
    q0_expand<Block>(g, n, n_end - n, nb, expand, w.data(), negw.data(), dw.data());
    for (int64_t t0 = 0; t0 < g.tokens;) {
      const BlockQ8_0* a[kQ80Tokens];
      const uint8_t* ab[kQ80Tokens];
      int nt = 1;
      if (!q5 && g.tokens - t0 >= kQ80Tokens) nt = kQ80Tokens;
      for (int t = 0; t < nt; ++t) {
        a[t] = reinterpret_cast<const BlockQ8_0*>(g.act + (t0 + t) * g.act_row_bytes);
        ab[t] = abias.data() + (t0 + t) * nb * 32;
      }
      if (q5) {
        q50_tile(tl, nb, a[0], ab[0], out[0]);
      } else if (nt == kQ80Tokens) {
        q80_tile<kQ80Tokens>(tl, nb, a, ab, out);
      } else {
        q80_tile<1>(tl, nb, a, ab, out);
      }
      for (int t = 0; t < nt; ++t) {
        for (int64_t r = n; r < n_end; ++r) g.y[(t0 + t) * g.ldy + r] = out[t][r - n];
      }
      t0 += nt;
    }
  }
}

void q80(const GemmArgs& g) {
  if (g.tokens >= kQ0TileMinTokens) {
    q0_tiled<BlockQ8_0>(g, expand_q8_0, false);
    return;
  }
  drive<Q80Kern<S>>(g);
}

void q50(const GemmArgs& g) {
  // An odd block count ends the row kernel with a 256-bit tail block: rows only.
  if (g.tokens >= kQ0TileMinTokens && (g.cols / tandem::kQK) % 2 == 0) {
    q0_tiled<BlockQ5_0>(g, expand_q5_0, true);
    return;
  }
  drive<Q50Kern<S>>(g);
}

void q4k(const GemmArgs& g) {
  // (The rearrangement gathers the 16 rows' scales with 32-bit row offsets.)
  if (g.tokens >= kQ4KTileMinTokens && g.row_bytes < (int64_t{1} << 27)) {
    q4k_tiled(g);
    return;
  }
  drive<Q4KKern<S>>(g);
}
void q5k(const GemmArgs& g) {
  drive<Q5KKern<S>>(g);
}
void q6k(const GemmArgs& g) {
  drive<Q6KKern<S>>(g);
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

const GgufKernels& gguf_kernels_avx512_vnni() {
  static const GgufKernels k{q4k, q5k, q6k, q80, f32, f16, bf16, q50};
  return k;
}

}  // namespace tandem::kern::detail
