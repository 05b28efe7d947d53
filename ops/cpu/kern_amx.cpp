// AMX tile kernels of the packed formats (Sapphire Rapids+; used only when best_isa() == kAmx):
// INT8 / INT4 with tdpbssd, FP8Block with tdpbf16ps. A 16-row packed chunk (16 rows x 4 bytes per
// 64-byte line, packed.h) is exactly one line of an AMX B tile, so a group block of INT8 is loaded
// as B tiles in place; INT4 is first unpacked to that INT8 layout (nibble - 8), once per tile. The
// int32 C tile of 16 tokens x 16 rows is post-scaled per group with the same fma as the reference,
// so the result is bit-identical to packed_gemm_reference. FP8 rows are expanded to BF16 pairs
// (the B layout of tdpbf16ps: 2 consecutive k of 16 rows per line) once per 16 rows and chunk,
// post-scaled per scale block.
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
#include "ops/cpu/packed_kernels.h"

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,amx-bf16,avx512f,avx512bw,avx512vl")

namespace tandem::kern::detail {
namespace {

// ldtilecfg's 64-byte palette-1 configuration.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tmm0: C [tokens, 16] (int32 or f32), tmm1: A [tokens, k_bytes], tmm2: B [k_bytes / 4, 64].
void configure(int tokens, int a_bytes, int b_rows) {
  TileConfig c;
  c.rows[0] = static_cast<uint8_t>(tokens);
  c.colsb[0] = 64;
  c.rows[1] = static_cast<uint8_t>(tokens);
  c.colsb[1] = static_cast<uint16_t>(a_bytes);
  c.rows[2] = static_cast<uint8_t>(b_rows);
  c.colsb[2] = 64;
  _tile_loadconfig(&c);
}

// Loads the tile configuration only when the token count changes (ldtilecfg costs tens of
// cycles and zeroes the tiles).
struct TileConfigCache {
  int tokens = -1, a_bytes = -1, b_rows = -1;
  void set(int t, int a, int b) {
    if (t == tokens && a == a_bytes && b == b_rows) return;
    configure(t, a, b);
    tokens = t;
    a_bytes = a;
    b_rows = b;
  }
};

// INT8 / INT4 blocks of one 16-row tile, every 16-token A tile over them. INT4 tiles are unpacked
// to INT8 once per tile (not per token tile); the post-scale is 16 lanes per token:
// acc = fma(sa * s, float(dot), acc), the reference's operations lane by lane.
template <bool kInt4>
void int_kernel(const PackedArgs& p) {
  const KMatrix& w = *p.w;
  const Activations& a = *p.a;
  const PackedGeometry geo = packed_geometry(w.format, w.cols, w.group);
  const int64_t so = act_scales_offset(w.cols);
  const int kstep = w.group < 64 ? w.group : 64;  // bytes of K per A tile line
  thread_local std::vector<int8_t> unpacked;
  if constexpr (kInt4) unpacked.resize(static_cast<size_t>(geo.groups * w.group * 16));
  alignas(64) int32_t c_out[16][16];
  alignas(64) float facc[16][16];
  TileConfigCache config;
  for (int64_t tile = p.n0 / 16; tile < (p.n1 + 15) / 16; ++tile) {
    const uint8_t* tp = w.data + tile * geo.tile_bytes;
    if constexpr (kInt4) {
      const int half = w.group / 8;  // 64-byte chunks of low nibbles, then as many of high
      const __m512i low = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
      for (int64_t g = 0; g < geo.groups; ++g) {
        const uint8_t* block = tp + g * geo.block_bytes;
        int8_t* dst = unpacked.data() + g * w.group * 16;
        for (int c = 0; c < half; ++c) {
          const __m512i v = _mm512_loadu_si512(block + c * 64);
          const __m512i lo = _mm512_sub_epi8(_mm512_and_si512(v, low), eight);
          const __m512i hi =
              _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), low), eight);
          _mm512_storeu_si512(dst + c * 64, lo);
          _mm512_storeu_si512(dst + (c + half) * 64, hi);
        }
      }
    }
    for (int64_t t0 = 0; t0 < a.tokens; t0 += 16) {
      const int nt = static_cast<int>(a.tokens - t0 < 16 ? a.tokens - t0 : 16);
      config.set(nt, kstep, kstep / 4);
      for (int t = 0; t < nt; ++t) _mm512_store_ps(facc[t], _mm512_setzero_ps());
      for (int64_t g = 0; g < geo.groups; ++g) {
        const uint8_t* block = tp + g * geo.block_bytes;
        const int8_t* values = kInt4 ? unpacked.data() + g * w.group * 16
                                     : reinterpret_cast<const int8_t*>(block);
        _tile_zero(0);
        for (int s = 0; s < w.group / kstep; ++s) {
          _tile_loadd(1, a.row(t0) + g * w.group + s * kstep, a.row_bytes);
          _tile_loadd(2, values + s * (kstep / 4) * 64, 64);
          _tile_dpbssd(0, 1, 2);
        }
        _tile_stored(0, c_out, 64);
        const __m512 sw = _mm512_loadu_ps(block + geo.values_bytes);
        for (int t = 0; t < nt; ++t) {
          float sa;
          std::memcpy(&sa, a.row(t0 + t) + so + g * 4, 4);
          const __m512 dot = _mm512_cvtepi32_ps(_mm512_load_si512(c_out[t]));
          _mm512_store_ps(facc[t], _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(sa), sw), dot,
                                                   _mm512_load_ps(facc[t])));
        }
      }
      const int64_t r0 = tile * 16 > p.n0 ? tile * 16 : p.n0;
      const int64_t r1 = tile * 16 + 16 < p.n1 ? tile * 16 + 16 : p.n1;
      for (int t = 0; t < nt; ++t) {
        for (int64_t r = r0; r < r1; ++r) p.y[(t0 + t) * p.ldy + r] = facc[t][r - tile * 16];
      }
    }
  }
  _tile_release();
}

// FP8Block: per 16 rows, a chunk of whole scale blocks (~1024 columns) is expanded to BF16 B-tile
// lines once (fp8_expand_vnni, AVX-512), then every 16-token A tile runs tdpbf16ps over it, one C
// tile per scale block post-scaled as the reference: acc = fma(scale, block sum, acc). (Expanding
// per token tile, element by element, made the 512-token GEMM 12x slower than AVX-512 on a
// Sapphire Rapids.) GEMVs take the VBMI or VNNI row kernels: one token would use one tile row.
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
  alignas(64) float c_out[16][16];
  TileConfigCache config;
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
      for (int64_t t0 = 0; t0 < a.tokens; t0 += 16) {
        const int nt = static_cast<int>(a.tokens - t0 < 16 ? a.tokens - t0 : 16);
        config.set(nt, 64, 16);
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t kb0 = k0 + b * w.block_cols;
          const int64_t kb1 = kb0 + w.block_cols < k1 ? kb0 + w.block_cols : k1;
          _tile_zero(0);
          for (int64_t k = kb0; k < kb1; k += 32) {
            _tile_loadd(1, a.row(t0) + k * 2, a.row_bytes);
            _tile_loadd(2, buf.data() + (k - k0) / 2 * 32, 64);
            _tile_dpbf16ps(0, 1, 2);
          }
          _tile_stored(0, c_out, 64);
          const __m512 s = _mm512_loadu_ps(scales.data() + b * 16);
          for (int t = 0; t < nt; ++t) {
            float* at = acc.data() + (t0 + t) * 16;
            const __m512 sum = _mm512_load_ps(c_out[t]);
            _mm512_storeu_ps(at, _mm512_fmadd_ps(s, sum, _mm512_loadu_ps(at)));
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

// BF16 tiles: 32 columns of a 16-row tile (16 chunks of 64 bytes) are one B tile in place.
void bf16_kernel(const PackedArgs& p) {
  const KMatrix& w = *p.w;
  const Activations& a = *p.a;
  const int64_t tile_bytes = packed_geometry(w.format, w.cols, w.group).tile_bytes;
  alignas(64) float c_out[16][16];
  for (int64_t tile = p.n0 / 16; tile < (p.n1 + 15) / 16; ++tile) {
    const uint8_t* tp = w.data + tile * tile_bytes;
    for (int64_t t0 = 0; t0 < a.tokens; t0 += 16) {
      const int nt = static_cast<int>(a.tokens - t0 < 16 ? a.tokens - t0 : 16);
      configure(nt, 64, 16);  // (ldtilecfg clears the tiles: once per C tile)
      _tile_zero(0);
      int64_t k = 0;
      for (; k + 32 <= w.cols; k += 32) {
        _tile_loadd(1, a.row(t0) + k * 2, a.row_bytes);
        _tile_loadd(2, tp + (k / 2) * 64, 64);
        _tile_dpbf16ps(0, 1, 2);
      }
      if (k < w.cols) {  // the last cols % 32 columns: a narrower A tile, fewer B lines
        const int rest = static_cast<int>(w.cols - k);
        _tile_stored(0, c_out, 64);
        configure(nt, rest * 2, rest / 2);
        _tile_loadd(0, c_out, 64);
        _tile_loadd(1, a.row(t0) + k * 2, a.row_bytes);
        _tile_loadd(2, tp + (k / 2) * 64, 64);
        _tile_dpbf16ps(0, 1, 2);
      }
      _tile_stored(0, c_out, 64);
      const int64_t r0 = tile * 16 > p.n0 ? tile * 16 : p.n0;
      const int64_t r1 = tile * 16 + 16 < p.n1 ? tile * 16 + 16 : p.n1;
      for (int t = 0; t < nt; ++t) {
        for (int64_t r = r0; r < r1; ++r) p.y[(t0 + t) * p.ldy + r] = c_out[t][r - tile * 16];
      }
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
