// AMX tile kernels of the packed formats (Sapphire Rapids+; used only when best_isa() == kAmx):
// INT8 / INT4 with tdpbssd, FP8Block with tdpbf16ps. A 16-row packed chunk (16 rows x 4 bytes per
// 64-byte line, packed.h) is exactly one line of an AMX B tile, so a group block of INT8 is loaded
// as B tiles in place; INT4 is first unpacked to that INT8 layout (nibble - 8) on the stack. The
// int32 C tile of 16 tokens x 16 rows is post-scaled per group with the same fma as the reference,
// so the result is bit-identical to packed_gemm_reference. FP8 rows are expanded to BF16 pairs
// (the B layout of tdpbf16ps: 2 consecutive k of 16 rows per line), post-scaled per scale block.
// BF16 tiles are that layout already: loaded as B tiles in place.
// GCC 12 warns falsely inside its own AVX-512 intrinsic headers (undefined-vector idiom).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstdint>
#include <cstring>

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

template <bool kInt4>
void int_kernel(const PackedArgs& p) {
  const KMatrix& w = *p.w;
  const Activations& a = *p.a;
  const PackedGeometry geo = packed_geometry(w.format, w.cols, w.group);
  const int64_t so = act_scales_offset(w.cols);
  const int kstep = w.group < 64 ? w.group : 64;  // bytes of K per A tile line
  alignas(64) int8_t unpacked[128 * 16];
  alignas(64) int32_t c_out[16][16];
  float facc[16][16];
  for (int64_t tile = p.n0 / 16; tile < (p.n1 + 15) / 16; ++tile) {
    const uint8_t* tp = w.data + tile * geo.tile_bytes;
    for (int64_t t0 = 0; t0 < a.tokens; t0 += 16) {
      const int nt = static_cast<int>(a.tokens - t0 < 16 ? a.tokens - t0 : 16);
      configure(nt, kstep, kstep / 4);
      for (int t = 0; t < nt; ++t) {
        for (int n = 0; n < 16; ++n) facc[t][n] = 0.0f;
      }
      for (int64_t g = 0; g < geo.groups; ++g) {
        const uint8_t* block = tp + g * geo.block_bytes;
        const int8_t* values = reinterpret_cast<const int8_t*>(block);
        if constexpr (kInt4) {
          const int half = w.group / 8;
          for (int c = 0; c < half; ++c) {
            for (int b = 0; b < 64; ++b) {
              const uint8_t v = block[c * 64 + b];
              unpacked[c * 64 + b] = static_cast<int8_t>((v & 0x0F) - 8);
              unpacked[(c + half) * 64 + b] = static_cast<int8_t>((v >> 4) - 8);
            }
          }
          values = unpacked;
        }
        _tile_zero(0);
        for (int s = 0; s < w.group / kstep; ++s) {
          _tile_loadd(1, a.row(t0) + g * w.group + s * kstep, a.row_bytes);
          _tile_loadd(2, values + s * (kstep / 4) * 64, 64);
          _tile_dpbssd(0, 1, 2);
        }
        _tile_stored(0, c_out, 64);
        const float* sw = reinterpret_cast<const float*>(block + geo.values_bytes);
        for (int t = 0; t < nt; ++t) {
          float sa;
          std::memcpy(&sa, a.row(t0 + t) + so + g * 4, 4);
          for (int n = 0; n < 16; ++n) {
            facc[t][n] = __builtin_fmaf(sa * sw[n], static_cast<float>(c_out[t][n]), facc[t][n]);
          }
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

void fp8_kernel(const PackedArgs& p) {
  // A GEMV would use one tile row of 16: the VBMI row kernel streams the FP8 bytes instead.
  static const bool vbmi = cpu_features().avx512_vbmi && cpu_features().avx512_bf16;
  if (vbmi && fp8_rows_vbmi_fits(*p.w, p.a->tokens)) {
    fp8_rows_vbmi(p);
    return;
  }
  const KMatrix& w = *p.w;
  const Activations& a = *p.a;
  alignas(64) uint16_t b_tile[16][16][2];  // [k pair][row][2]: 32 columns of 16 rows
  alignas(64) float c_out[16][16];
  float acc[16][16];
  for (int64_t n0 = p.n0; n0 < p.n1; n0 += 16) {
    const int nn = static_cast<int>(p.n1 - n0 < 16 ? p.n1 - n0 : 16);
    for (int64_t t0 = 0; t0 < a.tokens; t0 += 16) {
      const int nt = static_cast<int>(a.tokens - t0 < 16 ? a.tokens - t0 : 16);
      configure(nt, 64, 16);
      for (int t = 0; t < nt; ++t) {
        for (int n = 0; n < 16; ++n) acc[t][n] = 0.0f;
      }
      for (int64_t b0 = 0; b0 < w.cols; b0 += w.block_cols) {
        _tile_zero(0);
        for (int64_t k = b0; k < b0 + w.block_cols && k < w.cols; k += 32) {
          for (int n = 0; n < 16; ++n) {
            const uint8_t* wr = w.data + (n0 + (n < nn ? n : 0)) * w.row_bytes + k;
            for (int j = 0; j < 32; ++j) {
              b_tile[j / 2][n][j % 2] =
                  n < nn ? f32_to_bf16(fp8_e4m3_to_f32(wr[j])) : static_cast<uint16_t>(0);
            }
          }
          _tile_loadd(1, a.row(t0) + k * 2, a.row_bytes);
          _tile_loadd(2, b_tile, 64);
          _tile_dpbf16ps(0, 1, 2);
        }
        _tile_stored(0, c_out, 64);
        for (int n = 0; n < nn; ++n) {
          const float s =
              w.scales[((w.row0 + n0 + n) / w.block_rows) * w.scale_stride + b0 / w.block_cols];
          for (int t = 0; t < nt; ++t) acc[t][n] = __builtin_fmaf(s, c_out[t][n], acc[t][n]);
        }
      }
      for (int t = 0; t < nt; ++t) {
        for (int n = 0; n < nn; ++n) p.y[(t0 + t) * p.ldy + n0 + n] = acc[t][n];
      }
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
