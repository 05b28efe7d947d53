// AVX-512 with VNNI and BF16 instances of the GGUF / dense kernel templates (compiled with the matching -mavx512* flags
// and -ffp-contract=off; see ops/cpu/CMakeLists.txt). Selected only when the CPU has them.
#include <vector>

#include "ops/cpu/avx512_transpose.h"
#include "ops/cpu/kern_gguf_impl.h"
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
void q4k_expand(const GemmArgs& g, int64_t row0, int64_t rows, int64_t nb, uint8_t* qs,
                int32_t* sc, int32_t* mn, float* d, float* dmin) {
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
    for (int i = 0; i < 16; ++i) {
      uint8_t s8[8] = {}, m8[8] = {};
      float di = 0.0f, dmi = 0.0f;
      if (i < rows) {
        const auto* blk = reinterpret_cast<const BlockQ4_K*>(g.w + (row0 + i) * g.row_bytes) + b;
        unpack_k4_scales(blk->scales, s8, m8);
        di = half_to_float(blk->d);
        dmi = half_to_float(blk->dmin);
      }
      for (int j = 0; j < 8; ++j) {
        sc[(b * 8 + j) * 16 + i] = s8[j];
        mn[(b * 8 + j) * 16 + i] = m8[j];
      }
      d[b * 16 + i] = di;
      dmin[b * 16 + i] = dmi;
    }
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

void q4k(const GemmArgs& g) {
  if (g.tokens >= kQ4KTileMinTokens) {
    q4k_tiled(g);
    return;
  }
  drive<Q4KKern<S>>(g);
}
void q5k(const GemmArgs& g) { drive<Q5KKern<S>>(g); }
void q6k(const GemmArgs& g) { drive<Q6KKern<S>>(g); }
void q50(const GemmArgs& g) { drive<Q50Kern<S>>(g); }
void q80(const GemmArgs& g) { drive<Q80Kern<S>>(g); }
void f32(const GemmArgs& g) { drive<DenseKern<S, Dense::kF32>>(g); }
void f16(const GemmArgs& g) { drive<DenseKern<S, Dense::kF16>>(g); }
void bf16(const GemmArgs& g) { drive<DenseKern<S, Dense::kBF16>>(g); }

}  // namespace

namespace tandem::kern::detail {

const GgufKernels& gguf_kernels_avx512_vnni() {
  static const GgufKernels k{q4k, q5k, q6k, q80, f32, f16, bf16, q50};
  return k;
}

}  // namespace tandem::kern::detail
