// AMX tile kernels of the packed formats (Sapphire Rapids+; used only when best_isa() == kAmx):
// INT8 / INT4 with tdpbssd, FP8Block with tdpbf16ps. A 16-row packed chunk (16 rows x 4 bytes per
// 64-byte line, packed.h) is exactly one line of an AMX B tile, so a group block of INT8 is loaded
// as B tiles in place; INT4 is first unpacked to that INT8 layout (nibble - 8), per group block
// (12-128 tokens) or per tile (more); GEMVs of few tokens (INT4 < 12, INT8 < 5, BF16 < 3) take
// the AVX-512 kernels.
// INT8 / INT4 / BF16 run two token tiles x two row tiles per step (four C tiles, Blocking2x2). The
// int32 C tiles of 16 tokens x 16 rows are post-scaled per group with the same fma as the
// reference, so the result is bit-identical to packed_gemm_reference. FP8 rows are expanded to
// BF16 pairs (the B layout of tdpbf16ps: 2 consecutive k of 16 rows per line) once per 16 rows
// and chunk, post-scaled per scale block.
// BF16 tiles are that layout already: loaded as B tiles in place.
// GCC 12 warns falsely inside its own AVX-512 intrinsic headers (undefined-vector idiom).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/cpu_features.h"
#include "core/fp_convert.h"
#include "ops/cpu/amx_tiles.h"
#include "ops/cpu/packed_kernels.h"

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,amx-bf16,avx512f,avx512bw,avx512vl")

namespace tandem::kern::detail {
namespace {

using TileConfig = AmxTileConfig;

// The 2 x 2 blocking of the AMX kernels (KTransformers' AMX kernel does the same; FP8 uses one row
// tile of it):
// two A tiles of 16 tokens (tmm4, tmm5) and two B tiles of 16 rows (tmm6, tmm7) give four C tiles,
// C[2i + j] = A[i] x B[j] (tmm0..3), so each tile load feeds two tdp* instead of one. A missing
// second token tile or row tile (fewer than 17 tokens, an odd tile at the end of the range) is
// configured empty and skipped.
struct Blocking2x2 {
  int nt[2] = {0, 0};  // tokens of A tile 0 and 1 (nt[1] == 0: one token tile)
  bool two_rows = false;
  int a_bytes = -1, b_rows = -1;
  bool loaded = false;
  // The token tiles of tokens t0.. of a call's `tokens`: (16 or fewer, then 0..16).
  static void token_tiles(int64_t tokens, int64_t t0, int* nt0, int* nt1) {
    *nt0 = static_cast<int>(std::min<int64_t>(tokens - t0, 16));
    *nt1 = static_cast<int>(std::clamp<int64_t>(tokens - t0 - 16, 0, 16));
  }
  // Loads the configuration when it changes (which zeroes the tiles).
  void set(int nt0, int nt1, bool rows2, int a, int b) {
    if (loaded && nt0 == nt[0] && nt1 == nt[1] && rows2 == two_rows && a == a_bytes &&
        b == b_rows) {
      return;
    }
    TileConfig c;
    const int tokens[2] = {nt0, nt1};
    for (int i = 0; i < 2; ++i) {
      const bool used_a = tokens[i] > 0, used_b = i == 0 || rows2;
      for (int j = 0; j < 2; ++j) {
        const bool used = used_a && (j == 0 || rows2);
        c.rows[2 * i + j] = static_cast<uint8_t>(used ? tokens[i] : 0);
        c.colsb[2 * i + j] = static_cast<uint16_t>(used ? 64 : 0);
      }
      c.rows[4 + i] = static_cast<uint8_t>(tokens[i]);
      c.colsb[4 + i] = static_cast<uint16_t>(used_a ? a : 0);
      c.rows[6 + i] = static_cast<uint8_t>(used_b ? b : 0);
      c.colsb[6 + i] = static_cast<uint16_t>(used_b ? 64 : 0);
    }
    _tile_loadconfig(&c);
    nt[0] = nt0;
    nt[1] = nt1;
    two_rows = rows2;
    a_bytes = a;
    b_rows = b;
    loaded = true;
  }
  // The used C tiles to memory: out[2i + j] is C[2i + j] (16 x 64 bytes each).
  void store(void* out) const {
    char* o = static_cast<char*>(out);
    _tile_stored(0, o, 64);
    if (two_rows) _tile_stored(1, o + 1024, 64);
    if (nt[1] > 0) {
      _tile_stored(2, o + 2048, 64);
      if (two_rows) _tile_stored(3, o + 3072, 64);
    }
  }
  void load(const void* in) const {
    const char* i = static_cast<const char*>(in);
    _tile_loadd(0, i, 64);
    if (two_rows) _tile_loadd(1, i + 1024, 64);
    if (nt[1] > 0) {
      _tile_loadd(2, i + 2048, 64);
      if (two_rows) _tile_loadd(3, i + 3072, 64);
    }
  }
  void zero() const {
    _tile_zero(0);
    if (two_rows) _tile_zero(1);
    if (nt[1] > 0) {
      _tile_zero(2);
      if (two_rows) _tile_zero(3);
    }
  }
  // A tiles from a (token rows of a_stride bytes, the second 16 rows further), B tiles from b0 / b1
  // (64-byte lines), then the four products.
  template <bool kBf16>
  void step(const void* a, int64_t a_stride, const void* b0, const void* b1) const {
    _tile_loadd(4, a, a_stride);
    _tile_loadd(6, b0, 64);
    if (nt[1] > 0) _tile_loadd(5, static_cast<const char*>(a) + 16 * a_stride, a_stride);
    if (two_rows) _tile_loadd(7, b1, 64);
    if constexpr (kBf16) {
      _tile_dpbf16ps(0, 4, 6);
      if (two_rows) _tile_dpbf16ps(1, 4, 7);
      if (nt[1] > 0) {
        _tile_dpbf16ps(2, 5, 6);
        if (two_rows) _tile_dpbf16ps(3, 5, 7);
      }
    } else {
      _tile_dpbssd(0, 4, 6);
      if (two_rows) _tile_dpbssd(1, 4, 7);
      if (nt[1] > 0) {
        _tile_dpbssd(2, 5, 6);
        if (two_rows) _tile_dpbssd(3, 5, 7);
      }
    }
  }
};

// y rows [max(n0, tile0 * 16), min(n1, tile0 * 16 + 32)) of tokens t0.. from acc[token][32 rows].
void write_rows(const PackedArgs& p, int64_t tile0, int64_t t0, int tokens, const float* acc) {
  const int64_t r0 = std::max(tile0 * 16, p.n0), r1 = std::min(tile0 * 16 + 32, p.n1);
  for (int t = 0; t < tokens; ++t) {
    for (int64_t r = r0; r < r1; ++r) p.y[(t0 + t) * p.ldy + r] = acc[t * 32 + r - tile0 * 16];
  }
}

// One INT4 group block's values (group / 8 64-byte chunks of low nibbles' chunks, then as many of
// high) to the INT8 B-tile lines of the same block (nibble - 8): 16 x group bytes at dst.
inline void unpack_int4_block(const uint8_t* block, int group, int8_t* dst) {
  const int half = group / 8;
  const __m512i low = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
  for (int c = 0; c < half; ++c) {
    const __m512i v = _mm512_loadu_si512(block + c * 64);
    const __m512i lo = _mm512_sub_epi8(_mm512_and_si512(v, low), eight);
    const __m512i hi = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), low), eight);
    _mm512_storeu_si512(dst + c * 64, lo);
    _mm512_storeu_si512(dst + (c + half) * 64, hi);
  }
}

// Below these token counts the AVX-512 kernels run instead of AMX, which would use a few rows of
// each 16-row A tile (and for INT4 pay the unpacking for them). Measured on a 16-core Sapphire
// Rapids-class Xeon, 16 threads (bench_packed_bench BM_GemmFew), weights from DRAM (1 GiB) and
// from its L3 (96 MiB): INT4 VNNI faster from DRAM up to 8 tokens (13.6 vs 16.0 ms at 8), AMX
// from 16 (17.8 vs 22.1), from L3 AMX already at 8; INT8 equal up to 4 tokens from either, and a
// V2-Lite decode layer 1.14-1.33x faster on VNNI; BF16 `vdpbf16ps` faster from DRAM at 1-2 tokens
// (1.03-1.27x), AMX at 4 and more.
constexpr int64_t kAmxInt4MinTokens = 12;
constexpr int64_t kAmxInt8MinTokens = 5;
constexpr int64_t kAmxBf16MinTokens = 3;
// INT4 up to this many tokens unpacks a group block at a time, just before its tiles (4 KiB, in
// L1); more tokens unpack a pair of tiles whole (64 KiB at 2048 columns) once for every 32-token
// block. Whole-tile unpacking at few tokens ran 2.5-3x slower: the tile loads then read the
// unpacked lines back from L2.
constexpr int64_t kAmxInt4GroupMaxTokens = 128;
constexpr int kMaxGroup = 128;  // the largest packed group (packed.h)

// INT8 / INT4 blocks of two 16-row tiles, every pair of 16-token A tiles over them. INT4 is
// unpacked to INT8 per group block or per tile (above). The post-scale is 16 lanes per token and
// tile: acc = fma(sa * s, float(dot), acc), the reference's operations lane by lane.
template <bool kInt4>
void int_kernel(const PackedArgs& p) {
  const KMatrix& w = *p.w;
  const Activations& a = *p.a;
  const PackedGeometry geo = packed_geometry(w.format, w.cols, w.group);
  const int64_t so = act_scales_offset(w.cols);
  const int kstep = w.group < 64 ? w.group : 64;  // bytes of K per A tile line
  const int64_t tile_values = geo.groups * w.group * 16;
  if (a.tokens < (kInt4 ? kAmxInt4MinTokens : kAmxInt8MinTokens)) {
    (kInt4 ? packed_kernels_vnni_int().int4 : packed_kernels_vnni_int().int8)(p);
    return;
  }
  // INT4: up to kAmxInt4GroupMaxTokens tokens, each group block is unpacked just before its
  // tiles, into an L1-resident buffer; more tokens unpack each tile whole once for all token
  // blocks.
  const bool per_group = kInt4 && a.tokens <= kAmxInt4GroupMaxTokens;
  thread_local std::vector<int8_t> unpacked;
  alignas(64) int8_t group_buf[2][kMaxGroup * 16];
  if (kInt4 && !per_group) unpacked.resize(static_cast<size_t>(2 * tile_values));
  alignas(64) int32_t c_out[4][16][16];
  alignas(64) float facc[32][32];  // [token][row of the two tiles]
  Blocking2x2 tiles;
  const int64_t tile_end = (p.n1 + 15) / 16;
  for (int64_t tile = p.n0 / 16; tile < tile_end; tile += 2) {
    const bool two_rows = tile + 1 < tile_end;
    const uint8_t* tp[2] = {w.data + tile * geo.tile_bytes,
                            w.data + (tile + (two_rows ? 1 : 0)) * geo.tile_bytes};
    if (kInt4 && !per_group) {
      for (int j = 0; j < (two_rows ? 2 : 1); ++j) {
        for (int64_t g = 0; g < geo.groups; ++g) {
          unpack_int4_block(tp[j] + g * geo.block_bytes, w.group,
                            unpacked.data() + j * tile_values + g * w.group * 16);
        }
      }
    }
    for (int64_t t0 = 0; t0 < a.tokens; t0 += 32) {
      int nt0, nt1;
      Blocking2x2::token_tiles(a.tokens, t0, &nt0, &nt1);
      tiles.set(nt0, nt1, two_rows, kstep, kstep / 4);
      for (int t = 0; t < nt0 + nt1; ++t) {
        _mm512_store_ps(facc[t], _mm512_setzero_ps());
        _mm512_store_ps(facc[t] + 16, _mm512_setzero_ps());
      }
      for (int64_t g = 0; g < geo.groups; ++g) {
        const int8_t* values[2];
        __m512 sw[2];
        for (int j = 0; j < 2; ++j) {
          const uint8_t* block = tp[j] + g * geo.block_bytes;
          if (kInt4 && per_group) {
            if (j == 0 || two_rows) unpack_int4_block(block, w.group, group_buf[j]);
            values[j] = group_buf[two_rows ? j : 0];
          } else {
            values[j] = kInt4 ? unpacked.data() + (two_rows ? j : 0) * tile_values +
                                    g * w.group * 16
                              : reinterpret_cast<const int8_t*>(block);
          }
          sw[j] = _mm512_loadu_ps(block + geo.values_bytes);
        }
        tiles.zero();
        for (int s = 0; s < w.group / kstep; ++s) {
          const int64_t b_off = s * (kstep / 4) * 64;
          tiles.step<false>(a.row(t0) + g * w.group + s * kstep, a.row_bytes,
                            values[0] + b_off, values[1] + b_off);
        }
        tiles.store(c_out);
        for (int i = 0; i < 2; ++i) {
          for (int t = 0; t < (i == 0 ? nt0 : nt1); ++t) {
            float sa;
            std::memcpy(&sa, a.row(t0 + 16 * i + t) + so + g * 4, 4);
            const __m512 vsa = _mm512_set1_ps(sa);
            float* acc = facc[16 * i + t];
            for (int j = 0; j < (two_rows ? 2 : 1); ++j) {
              const __m512 dot = _mm512_cvtepi32_ps(_mm512_load_si512(c_out[2 * i + j][t]));
              _mm512_store_ps(acc + 16 * j, _mm512_fmadd_ps(_mm512_mul_ps(vsa, sw[j]), dot,
                                                            _mm512_load_ps(acc + 16 * j)));
            }
          }
        }
      }
      write_rows(p, tile, t0, nt0 + nt1, &facc[0][0]);
    }
  }
  _tile_release();
}

// FP8Block: per 16 rows, a chunk of whole scale blocks (~1024 columns) is expanded to BF16 B-tile
// lines once (fp8_expand_vnni, AVX-512), then every pair of 16-token A tiles runs tdpbf16ps over it
// (Blocking2x2 with one row tile: a B tile load feeds two tdp*), a C tile per token tile and scale
// block post-scaled as the reference: acc = fma(scale, block sum, acc). (Expanded per token tile,
// element by element, the 512-token GEMM ran 12x slower than AVX-512 on a Sapphire Rapids: the
// expansion, not the tiles, is the cost.) GEMVs take the VBMI or VNNI row kernels: one token would
// use one tile row.
void fp8_kernel(const PackedArgs& p) {
  static const bool vbmi = cpu_features().avx512_vbmi && cpu_features().avx512_bf16;
  if (vbmi && fp8_rows_vbmi_fits(*p.w, p.a->tokens)) {
    fp8_rows_vbmi(p);
    return;
  }
  if (p.a->tokens < kFp8TileMinTokens) {
    packed_kernels_vnni_base().fp8(p);
    return;
  }
  const KMatrix& w = *p.w;
  const Activations& a = *p.a;
  const int64_t chunk_cols =
      w.block_cols >= 1024 ? w.block_cols : 1024 / w.block_cols * w.block_cols;
  const int64_t max_blocks = (chunk_cols + w.block_cols - 1) / w.block_cols;
  thread_local std::vector<uint16_t> buf;
  thread_local std::vector<float> acc, scales;
  buf.resize(static_cast<size_t>(16 * chunk_cols));
  scales.resize(static_cast<size_t>(16 * max_blocks));
  acc.resize(static_cast<size_t>(a.tokens * 16));
  alignas(64) float c_out[4][16][16];
  Blocking2x2 tiles;
  for (int64_t n0 = p.n0; n0 < p.n1; n0 += 16) {
    const int nn = static_cast<int>(p.n1 - n0 < 16 ? p.n1 - n0 : 16);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t k0 = 0; k0 < w.cols; k0 += chunk_cols) {
      const int64_t k1 = k0 + chunk_cols < w.cols ? k0 + chunk_cols : w.cols;
      const int64_t blocks = (k1 - k0 + w.block_cols - 1) / w.block_cols;
      const uint8_t* src[16];
      for (int i = 0; i < 16; ++i) {
        src[i] = i < nn ? w.data + (n0 + i) * w.row_bytes + k0 : nullptr;
        const float* srow =
            i < nn ? w.scales + ((w.row0 + n0 + i) / w.block_rows) * w.scale_stride : nullptr;
        for (int64_t b = 0; b < blocks; ++b) {
          scales[b * 16 + i] = srow != nullptr ? srow[k0 / w.block_cols + b] : 0.0f;
        }
      }
      fp8_expand_vnni(src, (k1 - k0) / 2, buf.data());
      for (int64_t t0 = 0; t0 < a.tokens; t0 += 32) {  // two token tiles over the one B tile
        int nt[2];
        Blocking2x2::token_tiles(a.tokens, t0, &nt[0], &nt[1]);
        tiles.set(nt[0], nt[1], false, 64, 16);
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t kb0 = k0 + b * w.block_cols;
          const int64_t kb1 = kb0 + w.block_cols < k1 ? kb0 + w.block_cols : k1;
          tiles.zero();
          for (int64_t k = kb0; k < kb1; k += 32) {
            tiles.step<true>(a.row(t0) + k * 2, a.row_bytes, buf.data() + (k - k0) / 2 * 32,
                             nullptr);
          }
          tiles.store(c_out);
          const __m512 s = _mm512_loadu_ps(scales.data() + b * 16);
          for (int i = 0; i < 2; ++i) {
            for (int t = 0; t < nt[i]; ++t) {
              float* at = acc.data() + (t0 + 16 * i + t) * 16;
              const __m512 sum = _mm512_load_ps(c_out[2 * i][t]);
              _mm512_storeu_ps(at, _mm512_fmadd_ps(s, sum, _mm512_loadu_ps(at)));
            }
          }
        }
      }
    }
    for (int64_t t = 0; t < a.tokens; ++t) {
      for (int n = 0; n < nn; ++n) p.y[t * p.ldy + n0 + n] = acc[t * 16 + n];
    }
  }
  _tile_release();
}

// BF16 tiles: 32 columns of a 16-row tile (16 chunks of 64 bytes) are one B tile in place; two
// row tiles and two token tiles per step (Blocking2x2), the sums kept in the C tiles over all K.
void bf16_kernel(const PackedArgs& p) {
  if (p.a->tokens < kAmxBf16MinTokens) {
    packed_kernels_vnni().bf16(p);
    return;
  }
  const KMatrix& w = *p.w;
  const Activations& a = *p.a;
  const int64_t tile_bytes = packed_geometry(w.format, w.cols, w.group).tile_bytes;
  alignas(64) float c_out[4][16][16];
  alignas(64) float acc[32][32];
  Blocking2x2 tiles;
  const int64_t tile_end = (p.n1 + 15) / 16;
  for (int64_t tile = p.n0 / 16; tile < tile_end; tile += 2) {
    const bool two_rows = tile + 1 < tile_end;
    const uint8_t* tp0 = w.data + tile * tile_bytes;
    const uint8_t* tp1 = tp0 + (two_rows ? tile_bytes : 0);
    for (int64_t t0 = 0; t0 < a.tokens; t0 += 32) {
      int nt0, nt1;
      Blocking2x2::token_tiles(a.tokens, t0, &nt0, &nt1);
      tiles.set(nt0, nt1, two_rows, 64, 16);
      tiles.zero();
      int64_t k = 0;
      for (; k + 32 <= w.cols; k += 32) {
        tiles.step<true>(a.row(t0) + k * 2, a.row_bytes, tp0 + (k / 2) * 64, tp1 + (k / 2) * 64);
      }
      if (k < w.cols) {  // the last cols % 32 columns: narrower A tiles, fewer B lines
        const int rest = static_cast<int>(w.cols - k);
        tiles.store(c_out);
        tiles.set(nt0, nt1, two_rows, rest * 2, rest / 2);
        tiles.load(c_out);
        tiles.step<true>(a.row(t0) + k * 2, a.row_bytes, tp0 + (k / 2) * 64, tp1 + (k / 2) * 64);
      }
      tiles.store(c_out);
      for (int i = 0; i < 2; ++i) {
        for (int t = 0; t < (i == 0 ? nt0 : nt1); ++t) {
          for (int j = 0; j < (two_rows ? 2 : 1); ++j) {
            _mm512_store_ps(acc[16 * i + t] + 16 * j, _mm512_load_ps(c_out[2 * i + j][t]));
          }
        }
      }
      write_rows(p, tile, t0, nt0 + nt1, &acc[0][0]);
    }
  }
  _tile_release();
}

}  // namespace

const PackedKernels& packed_kernels_amx() {
  static const PackedKernels k{&int_kernel<false>, &int_kernel<true>, &fp8_kernel, &bf16_kernel};
  return k;
}

}  // namespace tandem::kern::detail

#pragma GCC pop_options
