// The packed formats (ops/cpu/packed.h): pack error within the group-quantization bound, the
// activation encoding by hand, a hand-computed product, and conformance of every SIMD / AMX
// kernel on every ISA this CPU supports against the scalar reference (INT8 / INT4: bit for bit,
// since each group's dot product is an exact integer and the post-scaling is the same fma in the
// same order; FP8: within the F32 summation-order bound), and of the reference against the F32
// product of the dequantized weights within the activation-quantization bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/fp_convert.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "core/topology.h"
#include "formats/quant.h"
#include "ops/cpu/packed.h"
#include "ops/cpu/packed_kernels.h"
#include "tests/test_util.h"

namespace tandem::kern {
namespace {

using test::random_values;

ops::Weight f32_weight(std::vector<float>& v, int64_t rows, int64_t cols) {
  return ops::Weight(Tensor::dense(DType::kF32, {rows, cols}, v.data()));
}

TEST(PackedLayout, BytesAndGeometry) {
  // INT8 group 32: 16 rows x 32 values + 16 scales + 16 sums = 640 bytes per group block.
  EXPECT_EQ(packed_tile_bytes(WFormat::kInt8, 256, 32), 8 * 640);
  // INT4 group 128: 16 x 64 bytes of nibbles + 16 scales.
  EXPECT_EQ(packed_tile_bytes(WFormat::kInt4, 256, 128), 2 * (1024 + 64));
  EXPECT_EQ(packed_bytes(WFormat::kInt8, 40, 256, 32), 3u * 8 * 640);  // 40 rows: 3 tiles
  EXPECT_EQ(packed_bytes(WFormat::kBF16, 40, 256, 0), 40u * 256 * 2);
  EXPECT_EQ(packed_bytes(WFormat::kBF16Tile, 40, 256, 0), 48u * 256 * 2);  // 3 tiles, padded
  EXPECT_EQ(packed_tile_bytes(WFormat::kBF16Tile, 256, 0), 16 * 256 * 2);
  EXPECT_THROW(packed_bytes(WFormat::kBF16Tile, 16, 63, 0), Error);  // pairs of columns
  EXPECT_THROW(packed_bytes(WFormat::kInt8, 16, 100, 32), Error);  // not a multiple of the group
  EXPECT_THROW(packed_bytes(WFormat::kInt4, 16, 96, 48), Error);   // group not 32/64/128
  KMatrix m = packed_view(WFormat::kInt4, 40, 256, 64, nullptr, nullptr);
  EXPECT_EQ(packed_row_align(m), 16);
  EXPECT_EQ(m.row_bytes * 16, packed_tile_bytes(WFormat::kInt4, 256, 64));
}

TEST(PackedLayout, PackErrorWithinGroupBound) {
  const int64_t rows = 40, cols = 256;
  std::vector<float> w = random_values(rows * cols, 11);
  for (WFormat f : {WFormat::kInt8, WFormat::kInt4}) {
    const float qmax = f == WFormat::kInt8 ? 127.0f : 7.0f;
    for (int group : {32, 64, 128}) {
      KMatrix m = pack_weight(f32_weight(w, rows, cols), f, group, nullptr);
      ASSERT_EQ(m.rows, rows);
      for (int64_t n = 0; n < rows; ++n) {
        for (int64_t g = 0; g < cols / group; ++g) {
          float amax = 0.0f;
          for (int64_t k = g * group; k < (g + 1) * group; ++k) {
            amax = std::max(amax, std::fabs(w[n * cols + k]));
          }
          const float s = amax / qmax;  // |w - q*s| <= s/2 (plus the rounding of w/s in F32)
          for (int64_t k = g * group; k < (g + 1) * group; ++k) {
            const float err = std::fabs(w[n * cols + k] - packed_value(m, n, k));
            ASSERT_LE(err, s * 0.5f * (1.0f + 1e-5f)) << wformat_name(f) << " g" << group;
          }
        }
      }
    }
  }
  KMatrix b = pack_weight(f32_weight(w, rows, cols), WFormat::kBF16, 0, nullptr);
  for (int64_t i = 0; i < rows * cols; i += 7) {
    EXPECT_EQ(packed_value(b, i / cols, i % cols), bf16_to_f32(f32_to_bf16(w[i])));
  }
}

TEST(PackedLayout, PackIsDeterministicAndThreaded) {
  const int64_t rows = 70, cols = 128;
  std::vector<float> w = random_values(rows * cols, 5);
  ThreadPool pool(place_workers(detect_topology(), 2));
  KMatrix a = pack_weight(f32_weight(w, rows, cols), WFormat::kInt4, 32, nullptr);
  KMatrix b = pack_weight(f32_weight(w, rows, cols), WFormat::kInt4, 32, &pool);
  const uint64_t bytes = packed_bytes(WFormat::kInt4, rows, cols, 32);
  EXPECT_EQ(std::memcmp(a.data, b.data, bytes), 0);
}

TEST(PackedActivations, Int8EncodingByHand) {
  // One token, group 32: values k - 16 for the first group (amax 16), 0 for the second.
  std::vector<float> x(64, 0.0f);
  for (int k = 0; k < 32; ++k) x[k] = static_cast<float>(k - 16);
  Activations a;
  packed_quantize_activations(AFormat::kI8, 32, x.data(), 1, 64, 64, &a);
  ASSERT_EQ(a.row_bytes % 64, 0);
  const auto* q = reinterpret_cast<const int8_t*>(a.row(0));
  const auto* sa = reinterpret_cast<const float*>(a.row(0) + 64);
  const auto* sums = reinterpret_cast<const int32_t*>(a.row(0) + 64 + 8);
  EXPECT_FLOAT_EQ(sa[0], 16.0f / 127.0f);
  EXPECT_EQ(q[0], -127);                            // -16 / (16/127)
  EXPECT_EQ(q[16], 0);
  EXPECT_EQ(q[24], static_cast<int8_t>(std::lround(8 * 127.0 / 16)));  // 63.5 -> 64 (even)
  EXPECT_EQ(sa[1], 1.0f);                           // all-zero group
  int32_t s0 = 0;
  for (int k = 0; k < 32; ++k) s0 += q[k];
  EXPECT_EQ(sums[0], s0);
  EXPECT_EQ(sums[1], 0);
  // Then, 64-byte aligned after the sums (offset 128), q + 128 as unsigned bytes.
  const uint8_t* biased = a.row(0) + 128;
  EXPECT_EQ(biased[0], 1);     // -127 + 128
  EXPECT_EQ(biased[16], 128);  // 0 + 128
  EXPECT_EQ(biased[63], 128);
  EXPECT_EQ(a.row_bytes, 192);
}

TEST(PackedGemm, HandComputedInt4) {
  // w[n][k] = ((k + n) % 15 - 7) / 2: every group has amax 3.5, s = 0.5, q = (k + n) % 15 - 7
  // exactly; x = 1: sa = 1/127, q_a = 127. y[n] = sum_k q * 127 * (0.5 / 127) = sum_k w[n][k].
  const int64_t rows = 16, cols = 64;
  std::vector<float> w(rows * cols), x(cols, 1.0f);
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t k = 0; k < cols; ++k) w[n * cols + k] = static_cast<float>((k + n) % 15 - 7) / 2;
  }
  KMatrix m = pack_weight(f32_weight(w, rows, cols), WFormat::kInt4, 32, nullptr);
  Activations a;
  packed_quantize_activations(AFormat::kI8, 32, x.data(), 1, cols, cols, &a);
  for (Isa isa : supported_isas()) {
    std::vector<float> y(rows, -1.0f);
    packed_gemm(m, a, 0, rows, y.data(), rows, isa);
    for (int64_t n = 0; n < rows; ++n) {
      float expect = 0.0f;
      for (int64_t k = 0; k < cols; ++k) expect += w[n * cols + k];
      EXPECT_NEAR(y[n], expect, 1e-4f) << isa_name(isa) << " row " << n;
    }
  }
}

// Every packed integer format x ISA x tokens x group: SIMD == reference bit for bit, only the
// requested rows written, and the reference within the activation-quantization bound of the F32
// product of the dequantized weights: |y - sum_k x_k wq_k| <= sum_g (sa_g / 2) sum_k |wq_k|.
TEST(PackedGemm, IntConformance) {
  // 104 rows = 7 tiles (the last one padded): the GEMM's 4-, 2- and 1-tile steps all run. 1280
  // columns: the GEMM's K-blocks (512 INT8 / 1024 INT4 columns) with a partial last one; 128
  // tokens: two super-blocks of 16 token blocks.
  const int64_t rows = 104, cols = 1280;
  std::vector<float> w = random_values(rows * cols, 21);
  const std::vector<float> x_all = random_values(160 * cols, 22, 2.0f);
  for (WFormat f : {WFormat::kInt8, WFormat::kInt4}) {
    for (int group : {32, 64, 128}) {
      KMatrix m = pack_weight(f32_weight(w, rows, cols), f, group, nullptr);
      std::vector<float> wq(rows * cols);
      for (int64_t i = 0; i < rows * cols; ++i) wq[i] = packed_value(m, i / cols, i % cols);
      // 20 and 33 tokens: AMX's second 16-token tile partly used, and one alone. On AMX: INT8
      // 1-4 and INT4 1-5 tokens take the VNNI kernels, INT4 20-128 unpacks per group block, 160
      // per tile.
      for (int64_t tokens : {1, 2, 4, 5, 20, 33, 128, 160}) {
        Activations a;
        packed_quantize_activations(AFormat::kI8, group, x_all.data(), tokens, cols, cols, &a);
        std::vector<float> ref(tokens * rows, 0.0f);
        packed_gemm_reference(m, a, 0, rows, ref.data(), rows);
        for (int64_t t = 0; t < tokens; ++t) {
          const float* xt = x_all.data() + t * cols;
          for (int64_t n = 0; n < rows; ++n) {
            double exact = 0, bound = 0;
            for (int64_t g = 0; g < cols / group; ++g) {
              float amax = 0;
              for (int64_t k = g * group; k < (g + 1) * group; ++k) {
                amax = std::max(amax, std::fabs(xt[k]));
              }
              for (int64_t k = g * group; k < (g + 1) * group; ++k) {
                exact += static_cast<double>(xt[k]) * wq[n * cols + k];
                bound += amax / 127.0 / 2 * std::fabs(wq[n * cols + k]) +
                         1e-6 * std::fabs(xt[k] * wq[n * cols + k]);
              }
            }
            ASSERT_NEAR(ref[t * rows + n], exact, bound) << wformat_name(f) << " t" << t;
          }
        }
        for (Isa isa : supported_isas()) {
          std::vector<float> y(tokens * rows, -7.0f);
          packed_gemm(m, a, 0, rows, y.data(), rows, isa);
          ASSERT_EQ(y, ref) << wformat_name(f) << " g" << group << " tokens " << tokens << " "
                            << isa_name(isa);
          // Row ranges (one tile; five tiles = a 4-tile step and a 1-tile step; one that starts
          // and ends inside tiles): only those rows are written, the rest keeps its sentinel.
          for (const auto& [n0, n1] :
               {std::pair<int64_t, int64_t>{16, 32}, {16, 96}, {8, 72}}) {
            std::vector<float> part(tokens * rows, -7.0f);
            packed_gemm(m, a, n0, n1, part.data(), rows, isa);
            for (int64_t i = 0; i < tokens * rows; ++i) {
              const int64_t n = i % rows;
              ASSERT_EQ(part[i], n >= n0 && n < n1 ? ref[i] : -7.0f) << isa_name(isa);
            }
          }
        }
      }
    }
  }
}

// FP8 block-scaled weights (128 x 128 blocks) against BF16 activations: SIMD vs reference within
// the F32 summation-order bound (both sum exact BF16 x BF16 products in a different order:
// |error| <= 2 * cols * 2^-24 * sum |terms|), and the reference vs the F32 product of the
// dequantized FP8 and the BF16-rounded activations in double within the same bound.
// 104 rows in 24-row scale blocks: the many-token path's 4-, 2- and 1-tile steps, with tiles that
// straddle scale rows; row ranges that start inside a tile. 640 columns: the many-token path's
// two column chunks (512 + 128).
TEST(PackedGemm, Fp8Conformance) {
  const int64_t rows = 104, cols = 640, block_rows = 24, col_blocks = 5;
  std::vector<float> src = random_values(rows * cols, 31, 0.05f);
  for (int64_t i = 0; i < rows * cols; ++i) src[i] *= 1.0f + static_cast<float>(i / cols / 24);
  std::vector<uint8_t> fp8(rows * cols);
  std::vector<float> scale_inv(5 * col_blocks);
  quantize_fp8_blocks(src.data(), rows, cols, block_rows, 128, fp8.data(), scale_inv.data());
  // Make a few values subnormal E4M3 (exponent 0) to cover the expansion's table.
  for (int i = 0; i < 8; ++i) fp8[i * 37] = static_cast<uint8_t>(i | (i % 2 ? 0x80 : 0));
  ops::Weight wt(Tensor::dense(DType::kF8E4M3, {rows, cols}, fp8.data()));
  wt.scale_inv = scale_inv.data();
  wt.scale_cols = col_blocks;
  wt.block_rows = block_rows;
  wt.block_cols = 128;
  KMatrix m;
  ASSERT_TRUE(fp8_view(wt, &m));
  const std::vector<float> x_all = random_values(128 * cols, 32);
  for (int64_t tokens : {1, 2, 4, 5, 33, 128}) {
    Activations a;
    packed_quantize_activations(AFormat::kBF16, 0, x_all.data(), tokens, cols, cols, &a);
    std::vector<float> ref(tokens * rows);
    packed_gemm_reference(m, a, 0, rows, ref.data(), rows);
    std::vector<double> bound(tokens * rows);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t n = 0; n < rows; ++n) {
        double exact = 0, sum_abs = 0;
        for (int64_t k = 0; k < cols; ++k) {
          const double term = static_cast<double>(fp8_e4m3_to_f32(fp8[n * cols + k])) *
                              scale_inv[n / block_rows * col_blocks + k / 128] *
                              bf16_to_f32(f32_to_bf16(x_all[t * cols + k]));
          exact += term;
          sum_abs += std::fabs(term);
        }
        bound[t * rows + n] = 2.0 * cols * std::ldexp(1.0, -24) * sum_abs + 1e-30;
        ASSERT_NEAR(ref[t * rows + n], exact, bound[t * rows + n]);
      }
    }
    for (Isa isa : supported_isas()) {
      for (const auto& [n0, n1] : {std::pair<int64_t, int64_t>{0, rows}, {5, 90}}) {
        std::vector<float> y(tokens * rows, -7.0f);
        packed_gemm(m, a, n0, n1, y.data(), rows, isa);
        for (int64_t i = 0; i < tokens * rows; ++i) {
          const int64_t n = i % rows;
          if (n < n0 || n >= n1) {
            ASSERT_EQ(y[i], -7.0f) << isa_name(isa);
          } else {
            ASSERT_NEAR(y[i], ref[i], 2 * bound[i]) << isa_name(isa) << " tokens " << tokens;
          }
        }
      }
    }
  }
}

// Every E4M3 value through the FP8 GEMV kernels exactly: row n holds the byte values (k + 3n) mod
// 256 (the two NaNs replaced by zero); a token that is one-hot at column k gives y[n] =
// fl(scale * e4m3(w[n][k])), one product and one rounding whatever a kernel's summation order. The
// AVX2 and AVX-512 kernels (E4M3 through FP16 bits and vcvtph2ps: rows for 1-4 tokens, the BF16
// tile table for more), with VBMI and without BF16 the byte tables into F32, the VNNI kernels
// (shifts and a subnormal table: rows for 1-4 tokens, BF16 tiles for 5 and 17) and, on CPUs with
// VBMI, the VBMI GEMV (byte tables, activations permuted to the unpacks' order; more
// tokens take the VNNI tiles), and on CPUs with AMX its tdpbf16ps tiles (17 and 33 tokens: one and
// three 16-token A tiles), scale blocks 16 x 128.
TEST(PackedGemm, Fp8KernelsExpandEveryValueExactly) {
  const CpuFeatures& f = cpu_features();
  const int64_t rows = 20, cols = 256;
  std::vector<uint8_t> fp8(rows * cols);
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t k = 0; k < cols; ++k) {
      const auto v = static_cast<uint8_t>((k + 3 * n) & 0xFF);
      fp8[n * cols + k] = (v & 0x7F) == 0x7F ? 0 : v;
    }
  }
  std::vector<float> scale_inv = {0.75f, 1.5f, 3e-3f, 0.1f};  // [row block][column block]
  ops::Weight wt(Tensor::dense(DType::kF8E4M3, {rows, cols}, fp8.data()));
  wt.scale_inv = scale_inv.data();
  wt.scale_cols = 2;
  wt.block_rows = 16;
  wt.block_cols = 128;
  KMatrix m;
  ASSERT_TRUE(fp8_view(wt, &m));
  std::vector<std::pair<const char*, detail::PackedFn>> kernels;
  if (best_isa() >= Isa::kAvx2) kernels.emplace_back("avx2", detail::packed_kernels_avx2().fp8);
  if (best_isa() >= Isa::kAvx512) {
    kernels.emplace_back("avx512", detail::packed_kernels_avx512().fp8);
  }
  if (best_isa() >= Isa::kAvx512Vnni) {  // VBMI + GFNI without BF16: packed_fp8_vbmi_f32.cpp
    kernels.emplace_back("avx512_vnni", detail::packed_kernels_vnni_int().fp8);
  }
  if (best_isa() >= Isa::kAvx512Bf16) {
    kernels.emplace_back("avx512_bf16", detail::packed_kernels_vnni_base().fp8);
    if (f.avx512_vbmi) kernels.emplace_back("avx512_vbmi", detail::packed_kernels_vnni().fp8);
  }
  if (f.amx_tile && f.amx_bf16) kernels.emplace_back("amx", detail::packed_kernels_amx().fp8);
  ASSERT_FALSE(kernels.empty()) << "no FP8 kernel for this CPU";
  for (const auto& [name, fn] : kernels) {
    for (int64_t tokens : {1, 2, 3, 4, 5, 17, 33}) {
      for (int64_t k0 = 0; k0 < cols; k0 += tokens) {
        std::vector<float> x(tokens * cols, 0.0f);
        for (int64_t t = 0; t < tokens; ++t) x[t * cols + (k0 + t) % cols] = 1.0f;
        Activations a;
        packed_quantize_activations(AFormat::kBF16, 0, x.data(), tokens, cols, cols, &a);
        std::vector<float> y(tokens * rows, -7.0f);
        fn(detail::PackedArgs{&m, &a, 0, rows, y.data(), rows});
        for (int64_t t = 0; t < tokens; ++t) {
          const int64_t k = (k0 + t) % cols;
          for (int64_t n = 0; n < rows; ++n) {
            const float want =
                scale_inv[n / 16 * 2 + k / 128] * fp8_e4m3_to_f32(fp8[n * cols + k]);
            ASSERT_EQ(y[t * rows + n], want)
                << name << " tokens " << tokens << " row " << n << " byte "
                << static_cast<int>(fp8[n * cols + k]);
          }
        }
      }
    }
  }
}

// BF16 tiles: the layout by packed_value (every element is bf16(w), zero padding rows), then every
// ISA against the scalar reference (sequential F32 sum of exact products in k order): the FMA
// fallbacks bit for bit (same products, same order), vdpbf16ps / AMX-BF16 within the F32
// summation-order bound (their internal order and denormal flushing are the hardware's). The
// reference against the double product of the BF16 values within the same bound. 70 columns:
// not a multiple of 32 (AMX's tail step); 104 rows: 7 tiles, the 4-, 2- and 1-tile steps.
TEST(PackedGemm, Bf16TileConformance) {
  for (const int64_t cols : {int64_t{384}, int64_t{70}}) {
    const int64_t rows = 104;
    std::vector<float> w = random_values(rows * cols, 41, 0.05f);
    KMatrix m = pack_weight(f32_weight(w, rows, cols), WFormat::kBF16Tile, 0, nullptr);
    ASSERT_EQ(m.format, WFormat::kBF16Tile);
    ASSERT_EQ(packed_row_align(m), 16);
    for (int64_t i = 0; i < rows * cols; ++i) {
      ASSERT_EQ(packed_value(m, i / cols, i % cols), bf16_to_f32(f32_to_bf16(w[i]))) << i;
    }
    const auto* padding = reinterpret_cast<const uint16_t*>(m.data);
    for (int64_t c = 0; c < cols / 2; ++c) {  // tile 6 rows 8..15 (rows 104..111) are zero
      for (int n = 8; n < 16; ++n) {
        ASSERT_EQ(padding[6 * 16 * cols + c * 32 + n * 2], 0);
        ASSERT_EQ(padding[6 * 16 * cols + c * 32 + n * 2 + 1], 0);
      }
    }
    const std::vector<float> x_all = random_values(128 * cols, 42);
    for (int64_t tokens : {1, 2, 4, 5, 20, 33, 128}) {
      Activations a;
      packed_quantize_activations(AFormat::kBF16, 0, x_all.data(), tokens, cols, cols, &a);
      std::vector<float> ref(tokens * rows);
      packed_gemm_reference(m, a, 0, rows, ref.data(), rows);
      std::vector<double> bound(tokens * rows);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t n = 0; n < rows; ++n) {
          double exact = 0, sum_abs = 0;
          for (int64_t k = 0; k < cols; ++k) {
            const double term = static_cast<double>(bf16_to_f32(f32_to_bf16(w[n * cols + k]))) *
                                bf16_to_f32(f32_to_bf16(x_all[t * cols + k]));
            exact += term;
            sum_abs += std::fabs(term);
          }
          bound[t * rows + n] = 2.0 * cols * std::ldexp(1.0, -24) * sum_abs + 1e-30;
          ASSERT_NEAR(ref[t * rows + n], exact, bound[t * rows + n]);
        }
      }
      for (Isa isa : supported_isas()) {
        const bool exact_isa = isa < Isa::kAvx512Bf16;
        for (const auto& [n0, n1] :
             {std::pair<int64_t, int64_t>{0, rows}, {16, 32}, {16, 96}, {8, 72}}) {
          std::vector<float> y(tokens * rows, -7.0f);
          packed_gemm(m, a, n0, n1, y.data(), rows, isa);
          for (int64_t i = 0; i < tokens * rows; ++i) {
            const int64_t n = i % rows;
            if (n < n0 || n >= n1) {
              ASSERT_EQ(y[i], -7.0f) << isa_name(isa);
            } else if (exact_isa) {
              ASSERT_EQ(y[i], ref[i]) << isa_name(isa) << " cols " << cols << " tokens " << tokens;
            } else {
              ASSERT_NEAR(y[i], ref[i], 2 * bound[i]) << isa_name(isa) << " tokens " << tokens;
            }
          }
        }
      }
    }
    // A token's result does not depend on its batch (every step keeps one accumulator per row
    // and token, chunks in k order): the 128-token GEMM's rows equal one-token GEMVs bit for bit.
    // (AMX tiles sum in the hardware's own order.)
    Activations all;
    packed_quantize_activations(AFormat::kBF16, 0, x_all.data(), 128, cols, cols, &all);
    for (Isa isa : supported_isas()) {
      if (isa == Isa::kAmx) continue;
      std::vector<float> batch(128 * rows);
      packed_gemm(m, all, 0, rows, batch.data(), rows, isa);
      for (const int64_t t : {0, 5, 127}) {
        Activations one;
        packed_quantize_activations(AFormat::kBF16, 0, x_all.data() + t * cols, 1, cols, cols,
                                    &one);
        std::vector<float> y(rows);
        packed_gemm(m, one, 0, rows, y.data(), rows, isa);
        for (int64_t n = 0; n < rows; ++n) {
          ASSERT_EQ(y[n], batch[t * rows + n]) << isa_name(isa) << " token " << t << " row " << n;
        }
      }
    }
  }
}

TEST(PackedGemm, RejectsMismatchedActivations) {
  const int64_t rows = 16, cols = 64;
  std::vector<float> w = random_values(rows * cols, 3);
  KMatrix m = pack_weight(f32_weight(w, rows, cols), WFormat::kInt8, 64, nullptr);
  std::vector<float> x(cols, 1.0f), y(rows);
  Activations a;
  packed_quantize_activations(AFormat::kI8, 32, x.data(), 1, cols, cols, &a);  // group 32 != 64
  EXPECT_THROW(packed_gemm(m, a, 0, rows, y.data(), rows, best_isa()), Error);
  EXPECT_THROW(packed_quantize_activations(AFormat::kI8, 48, x.data(), 1, cols, cols, &a), Error);
}

// The SIMD activation encoders give the scalar code's bytes: int8 rows with a group of zeros,
// exact halves (nearest even), huge and tiny values, every group size; BF16 rows with rounding
// ties, subnormals, infinities and NaN; many tokens on the pool alike.
TEST(PackedActivations, SimdEqualsScalarBytes) {
  ThreadPool pool(place_workers(detect_topology(), 2));
  const int64_t cols = 512;
  std::vector<float> x = random_values(4 * cols, 17);
  std::fill(x.begin() + cols, x.begin() + cols + 128, 0.0f);
  for (int64_t i = 0; i < cols; ++i) {  // |x| <= 127 with 127 in every group: halves stay halves
    x[2 * cols + i] =
        i % 32 == 0 ? 127.0f : static_cast<float>(static_cast<int>(i % 23) - 11) + 0.5f;
    x[3 * cols + i] *= (i / 128) % 2 == 0 ? 1e30f : 1e-30f;
  }
  std::vector<float> xb = x;  // BF16 corner cases
  const uint32_t bits[] = {0x3F808000u, 0x3F818000u, 0xBF808000u, 0x00000001u, 0x807FFFFFu,
                           0x7F800000u, 0xFF800000u, 0x7FC00001u, 0xFF800001u, 0x7F7FFFFFu};
  for (size_t i = 0; i < std::size(bits); ++i) std::memcpy(&xb[cols + 200 + i], &bits[i], 4);
  struct Run {
    AFormat f;
    int group;
    const std::vector<float>* x;
  };
  for (const Run& r : {Run{AFormat::kI8, 32, &x}, Run{AFormat::kI8, 64, &x},
                       Run{AFormat::kI8, 128, &x}, Run{AFormat::kBF16, 0, &xb}}) {
    SCOPED_TRACE(::testing::Message() << (r.f == AFormat::kI8 ? "int8 group " : "bf16 ")
                                      << r.group);
    Activations want;
    packed_quantize_activations(r.f, r.group, r.x->data(), 4, cols, cols, &want, nullptr,
                                Isa::kScalar);
    for (int level = 1; level <= static_cast<int>(best_isa()); ++level) {
      Activations got;
      packed_quantize_activations(r.f, r.group, r.x->data(), 4, cols, cols, &got, nullptr,
                                  static_cast<Isa>(level));
      ASSERT_EQ(got.row_bytes, want.row_bytes);
      EXPECT_EQ(0, std::memcmp(got.data.data(), want.data.data(),
                               static_cast<size_t>(4 * want.row_bytes)))
          << isa_name(static_cast<Isa>(level));
    }
    std::vector<float> many;
    for (int rep = 0; rep < 10; ++rep) many.insert(many.end(), r.x->begin(), r.x->end());
    Activations par;
    packed_quantize_activations(r.f, r.group, many.data(), 40, cols, cols, &par, &pool);
    for (int64_t t = 0; t < 40; ++t) {
      EXPECT_EQ(0, std::memcmp(par.row(t), want.row(t % 4), static_cast<size_t>(want.row_bytes)))
          << "pool token " << t;
    }
  }
}

}  // namespace
}  // namespace tandem::kern
