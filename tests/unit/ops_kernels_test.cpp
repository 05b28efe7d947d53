// Conformance of the fast CPU kernels: every format x every ISA level this CPU supports x token
// counts across the GEMV / GEMM paths x odd row ranges, against the scalar reference of the same
// arithmetic; and the reference itself against the F32 product of the dequantized weights within
// the activation-quantization error bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/fp_convert.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "formats/quant.h"
#include "ops/cpu/kern_gguf.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/q0_x4.h"
#include "ops/cpu/q4k_x16.h"
#include "ops/cpu/q6k_x16.h"
#include "ops/cpu/ref_ops.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

struct Case {
  DType dtype;
  bool exact;  // integer dot products: SIMD == reference bit for bit
};

class Kernels : public ::testing::TestWithParam<Case> {};

using test::random_values;

struct Matrix {
  std::vector<uint8_t> bytes;
  Tensor t;
};

Matrix make_matrix(DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
  const std::vector<float> f = random_values(rows * cols, seed);
  Matrix m;
  const int64_t rb = static_cast<int64_t>(dtype_bytes(dtype, cols));
  m.bytes.resize(static_cast<size_t>(rb * rows));
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(dtype, f.data() + r * cols, m.bytes.data() + r * rb, cols);
  m.t.dtype = dtype;
  m.t.ndim = 2;
  m.t.shape[0] = rows;
  m.t.shape[1] = cols;
  m.t.data = m.bytes.data();
  return m;
}

TEST_P(Kernels, SimdEqualsReferenceOnEveryIsa) {
  const Case c = GetParam();
  const int64_t rows = 53, cols = 768;
  const Matrix m = make_matrix(c.dtype, rows, cols, 7);
  kern::KMatrix w;
  ASSERT_TRUE(kern::view_weight(ops::Weight(m.t), &w));
  for (int64_t tokens : {1, 2, 3, 4, 5, 17, 19, 30, 64}) {
    const std::vector<float> x = random_values(tokens * cols, 100 + static_cast<uint32_t>(tokens));
    kern::Activations a;
    kern::quantize_activations(kern::act_format(w.format), 0, x.data(), tokens, cols, cols, &a);
    for (auto [n0, n1] : {std::pair<int64_t, int64_t>{0, rows}, {5, 22}, {17, 18}}) {
      std::vector<float> ref(static_cast<size_t>(tokens * rows), -1.0f);
      kern::gemm_reference(w, a, n0, n1, ref.data(), rows);
      for (Isa isa : supported_isas()) {
        std::vector<float> y(static_cast<size_t>(tokens * rows), -1.0f);
        kern::gemm(w, a, n0, n1, y.data(), rows, isa);
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t r = 0; r < rows; ++r) {
            const float got = y[t * rows + r], want = ref[t * rows + r];
            if (r < n0 || r >= n1) {
              ASSERT_EQ(got, -1.0f) << "wrote outside its rows: r " << r;
            } else if (isa == Isa::kScalar) {
              ASSERT_EQ(got, want) << "the scalar level is the reference";
            } else if (c.dtype == DType::kQ4_K || c.dtype == DType::kQ5_K ||
                       c.dtype == DType::kQ6_K || c.dtype == DType::kQ2_K ||
                       c.dtype == DType::kQ3_K) {
              // The K-quants keep the reference's F32 steps on every ISA, rows or tiles
              // (>= 16 tokens on AVX-512 VNNI): bit for bit, whatever the batch.
              ASSERT_EQ(got, want) << isa_name(isa) << " t " << t << " r " << r;
            } else {
              // Integer block sums are exact; only the F32 summation order of the blocks' (or
              // values') contributions differs: rounding of a 768-term sum of O(1) terms.
              ASSERT_NEAR(got, want, 2e-5f * 768) << isa_name(isa) << " t " << t << " r " << r;
            }
          }
        }
      }
    }
  }
}

// A token's result does not depend on its batch: every format x ISA, a call with many tokens (the
// GEMM path: tiles for Q4_K / Q6_K / Q8_0 / Q5_0 on AVX-512 VNNI from 16 tokens) equals one call
// per token (the GEMV path) bit for bit. 800 columns: an odd number of 32-blocks (Q5_0's row kernel
// then ends with a 256-bit block, and its GEMM keeps the rows).
TEST_P(Kernels, ResultDoesNotDependOnTheBatch) {
  const Case c = GetParam();
  const bool k_quant = c.dtype == DType::kQ4_K || c.dtype == DType::kQ5_K ||
                       c.dtype == DType::kQ6_K || c.dtype == DType::kQ2_K ||
                       c.dtype == DType::kQ3_K;
  for (const int64_t cols : {int64_t{768}, int64_t{800}}) {
    if (k_quant && cols % 256 != 0) continue;
    const int64_t rows = 37, tokens = 39;  // token groups of 8, 4, 2, 1
    const Matrix m = make_matrix(c.dtype, rows, cols, 13);
    kern::KMatrix w;
    ASSERT_TRUE(kern::view_weight(ops::Weight(m.t), &w));
    const std::vector<float> x = random_values(tokens * cols, 14);
    kern::Activations a;
    kern::quantize_activations(kern::act_format(w.format), 0, x.data(), tokens, cols, cols, &a);
    for (Isa isa : supported_isas()) {
      std::vector<float> batch(static_cast<size_t>(tokens * rows));
      kern::gemm(w, a, 0, rows, batch.data(), rows, isa);
      for (int64_t t = 0; t < tokens; ++t) {
        kern::Activations one;
        kern::quantize_activations(kern::act_format(w.format), 0, x.data() + t * cols, 1, cols,
                                   cols, &one);
        std::vector<float> y(static_cast<size_t>(rows));
        kern::gemm(w, one, 0, rows, y.data(), rows, isa);
        for (int64_t r = 0; r < rows; ++r) {
          ASSERT_EQ(batch[t * rows + r], y[r])
              << isa_name(isa) << " cols " << cols << " t " << t << " r " << r;
        }
      }
    }
  }
}

// The reference against the exact product of the dequantized weights and the F32 activations:
// the only difference is the activations' quantization, |err| <= sum_k |w_k| * step_k / 2 with
// step = the activation block's scale (Q8_K: amax/127-ish; Q8_0: amax/127; BF16: 2^-8 relative).
TEST_P(Kernels, ReferenceMatchesDequantizedProduct) {
  const Case c = GetParam();
  const int64_t rows = 9, cols = 512, tokens = 3;
  const Matrix m = make_matrix(c.dtype, rows, cols, 11);
  kern::KMatrix w;
  ASSERT_TRUE(kern::view_weight(ops::Weight(m.t), &w));
  const std::vector<float> x = random_values(tokens * cols, 5);
  kern::Activations a;
  const kern::AFormat af = kern::act_format(w.format);
  kern::quantize_activations(af, 0, x.data(), tokens, cols, cols, &a);
  std::vector<float> y(static_cast<size_t>(tokens * rows));
  kern::gemm_reference(w, a, 0, rows, y.data(), rows);
  const int64_t block = af == kern::AFormat::kQ8_K ? 256 : af == kern::AFormat::kQ8_0 ? 32 : 1;
  std::vector<float> wrow(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(c.dtype, m.bytes.data() + r * m.t.row_bytes(), wrow.data(), cols);
    for (int64_t t = 0; t < tokens; ++t) {
      const float* xt = x.data() + t * cols;
      double exact = 0.0, bound = 0.0;
      for (int64_t b0 = 0; b0 < cols; b0 += block) {
        float amax = 0.0f;
        for (int64_t i = b0; i < b0 + block; ++i) amax = std::max(amax, std::fabs(xt[i]));
        for (int64_t i = b0; i < b0 + block; ++i) {
          exact += static_cast<double>(wrow[i]) * xt[i];
          const double step = af == kern::AFormat::kF32    ? 0.0
                              : af == kern::AFormat::kBF16 ? std::fabs(xt[i]) / 128.0
                                                           : amax / 127.0;
          bound += std::fabs(wrow[i]) * (step / 2.0 + 1e-6 * std::fabs(xt[i]));
        }
      }
      EXPECT_NEAR(y[t * rows + r], exact, bound + 1e-3) << "r " << r << " t " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Kernels,
                         ::testing::Values(Case{DType::kQ4_K, true}, Case{DType::kQ5_K, true},
                                           Case{DType::kQ6_K, true}, Case{DType::kQ8_0, true},
                                           Case{DType::kQ5_0, true}, Case{DType::kQ4_0, true},
                                           Case{DType::kQ4_1, true}, Case{DType::kQ5_1, true},
                                           Case{DType::kQ2_K, true}, Case{DType::kQ3_K, true},
                                           Case{DType::kMXFP4, true}, Case{DType::kF32, false},
                                           Case{DType::kF16, false}, Case{DType::kBF16, false}),
                         [](const auto& info) {
                           return std::string(dtype_info(info.param.dtype).name);
                         });

// On AVX-512 VNNI CPUs with VBMI and BITALG, the GEMV of the legacy 4/5-bit formats takes
// kern_q0_vbmi.cpp (four blocks per step); the same level without them (Cascade Lake) keeps the
// VNNI rows. Both must give the same bits (the shared F32 order), for block counts that end in
// every partial group of four (1..8 blocks: the short-row kernels), several token counts and row
// ranges; and stay within the summation-order tolerance of the scalar reference.
TEST(KernelsLegacy, VbmiRowsEqualVnniRows) {
  if (best_isa() < Isa::kAvx512Vnni) GTEST_SKIP() << "no AVX-512 VNNI here";
  const CpuFeatures& f = cpu_features();
  if (!f.avx512_vbmi || !f.avx512_bitalg) GTEST_SKIP() << "no AVX-512 VBMI / BITALG here";
  using kern::detail::GgufKernels;
  for (const auto& [dtype, entry] :
       {std::pair{DType::kQ5_0, &GgufKernels::q5_0}, std::pair{DType::kQ4_0, &GgufKernels::q4_0},
        std::pair{DType::kQ4_1, &GgufKernels::q4_1}, std::pair{DType::kQ5_1, &GgufKernels::q5_1},
        std::pair{DType::kQ8_0, &GgufKernels::q8_0}}) {
    SCOPED_TRACE(dtype_info(dtype).name);
    const kern::detail::GemmFn with = kern::detail::gguf_kernels_avx512_vnni().*entry;
    const kern::detail::GemmFn without = kern::detail::gguf_kernels_avx512_vnni_base().*entry;
    ASSERT_NE(with, without) << "the VBMI kernel is not selected on this CPU";
    // 1 .. 8 blocks: the short-row kernels (16 rows at a time for <= 4 blocks, then 4 or 2 rows
    // per vector; 39 - 2 rows = 2 x 16 + 4 + a remainder).
    for (const int64_t cols : {int64_t{32}, int64_t{96}, int64_t{128}, int64_t{160},
                               int64_t{256}, int64_t{544}, int64_t{1408}}) {
      const int64_t rows = 39;
      const Matrix m = make_matrix(dtype, rows, cols, 5);
      for (const int64_t tokens : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{6}, int64_t{15}}) {
        const std::vector<float> x = random_values(tokens * cols, 6);
        kern::Activations a;
        kern::quantize_activations(kern::AFormat::kQ8_0, 0, x.data(), tokens, cols, cols, &a);
        kern::detail::GemmArgs g;
        g.w = m.bytes.data();
        g.row_bytes = static_cast<int64_t>(dtype_bytes(dtype, cols));
        g.cols = cols;
        g.act = a.data.data();
        g.act_row_bytes = a.row_bytes;
        g.tokens = tokens;
        g.n0 = 2;
        g.n1 = rows;
        g.ldy = rows;
        std::vector<float> y0(static_cast<size_t>(tokens * rows), -1.0f), y1(y0);
        g.y = y0.data();
        with(g);
        g.y = y1.data();
        without(g);
        EXPECT_EQ(y0, y1) << "cols " << cols << " tokens " << tokens;
        EXPECT_EQ(y0[0], -1.0f) << "wrote outside its rows";
        std::vector<float> ref(y0.size(), -1.0f);
        g.y = ref.data();
        (kern::detail::gguf_kernels_scalar().*entry)(g);
        for (size_t i = 0; i < ref.size(); ++i) {
          ASSERT_NEAR(y0[i], ref[i], 2e-5f * static_cast<float>(cols))
              << "cols " << cols << " i " << i;
        }
      }
    }
  }
}

// Raw random Q4_K blocks: every bit pattern of the packed 6-bit scales and mins reachable
// (quantize_row writes only some); d, dmin finite halves 2^-14 .. 2 (exponent 1 .. 16), either
// sign.
std::vector<BlockQ4_K> raw_q4k_blocks(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<BlockQ4_K> blocks(static_cast<size_t>(n));
  for (BlockQ4_K& b : blocks) {
    auto* bytes = reinterpret_cast<uint8_t*>(&b);
    for (size_t i = 0; i < sizeof(BlockQ4_K); ++i) bytes[i] = static_cast<uint8_t>(rng());
    b.d = static_cast<uint16_t>((rng() & 0x83FF) | ((1 + rng() % 16) << 10));
    b.dmin = static_cast<uint16_t>((rng() & 0x83FF) | ((1 + rng() % 16) << 10));
  }
  return blocks;
}

// A kernel view of rows x cols Q4_K blocks.
bool q4k_view(const std::vector<BlockQ4_K>& blocks, int64_t rows, int64_t cols, kern::KMatrix* w) {
  Tensor t;
  t.dtype = DType::kQ4_K;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.data = const_cast<BlockQ4_K*>(blocks.data());
  return kern::view_weight(ops::Weight(t), w);
}

// Q4_K one-token GEMV (16-row tiles, super-blocks in groups of four: kern_q4k_gemv16.h) on raw
// random blocks, every bit pattern of the packed 6-bit scales and mins reachable (quantize_row
// writes only some), and row lengths ending in every partial group of four: bit for bit the
// scalar reference on every ISA, rows as tiles and as the leftover row kernel.
TEST(KernelsQ4K, OneTokenEqualsReferenceOnRawBlocks) {
  for (const int64_t nb : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5},
                           int64_t{8}, int64_t{11}}) {
    const int64_t rows = 37, cols = nb * 256;  // 2 tiles of 16 + 5 rows
    const std::vector<BlockQ4_K> blocks = raw_q4k_blocks(rows * nb, static_cast<uint32_t>(nb));
    kern::KMatrix w;
    ASSERT_TRUE(q4k_view(blocks, rows, cols, &w));
    const std::vector<float> x = random_values(cols, 40 + static_cast<uint32_t>(nb));
    kern::Activations a;
    kern::quantize_activations(kern::AFormat::kQ8_K, 0, x.data(), 1, cols, cols, &a);
    std::vector<float> ref(static_cast<size_t>(rows), -1.0f);
    kern::gemm_reference(w, a, 0, rows, ref.data(), rows);
    for (Isa isa : supported_isas()) {
      for (auto [n0, n1] : {std::pair<int64_t, int64_t>{0, rows}, {3, 36}}) {
        std::vector<float> y(static_cast<size_t>(rows), -1.0f);
        kern::gemm(w, a, n0, n1, y.data(), rows, isa);
        for (int64_t r = 0; r < rows; ++r) {
          const float want = r < n0 || r >= n1 ? -1.0f : ref[static_cast<size_t>(r)];
          ASSERT_EQ(y[static_cast<size_t>(r)], want)
              << isa_name(isa) << " nb " << nb << " rows " << n0 << ".." << n1 << " r " << r;
        }
      }
    }
  }
}

// y (tokens rows of `rows` outputs) holds want's values in rows [n0, n1) and -1 elsewhere (a
// kern::gemm on a row range of a buffer filled with -1).
::testing::AssertionResult rows_match(const std::vector<float>& y, const std::vector<float>& want,
                                      int64_t tokens, int64_t rows, int64_t n0, int64_t n1) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      const size_t i = static_cast<size_t>(t * rows + r);
      const float expect = r < n0 || r >= n1 ? -1.0f : want[i];
      if (!(y[i] == expect)) {
        return ::testing::AssertionFailure() << "rows " << n0 << ".." << n1 << " t " << t
                                             << " r " << r << ": " << y[i] << " != " << expect;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// Q4_K x16 (ops/cpu/q4k_x16.h): repacking 16 rows into a tile and back gives the same bytes; the
// tile GEMV on raw random blocks (every scale / min bit pattern, d / dmin of either sign) is bit
// for bit the scalar reference on the GGUF rows, on every ISA; a last tile's missing rows give 0.
TEST(KernelsQ4KX16, TileGemvEqualsReferenceOnRawBlocks) {
  for (const int64_t nb : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{11}}) {
    const int64_t rows = 37, cols = nb * 256;  // 3 tiles, the last one with 5 rows
    const int64_t row_bytes = nb * static_cast<int64_t>(sizeof(BlockQ4_K));
    const std::vector<BlockQ4_K> blocks =
        raw_q4k_blocks(rows * nb, 100 + static_cast<uint32_t>(nb));
    const auto* raw = reinterpret_cast<const uint8_t*>(blocks.data());
    const int64_t tiles = 3;
    ASSERT_EQ(kern::q4k_x16_tile_bytes(cols), 16 * row_bytes);
    std::vector<uint8_t> packed(static_cast<size_t>(tiles * 16 * row_bytes), 0xAB);
    kern::q4k_x16_repack(raw, row_bytes, rows, cols, packed.data());
    std::vector<uint8_t> back(static_cast<size_t>(16 * row_bytes));
    for (int64_t t = 0; t < tiles; ++t) {
      kern::q4k_x16_unpack(packed.data() + t * 16 * row_bytes, cols, back.data());
      for (int64_t n = 0; n < 16; ++n) {
        const int64_t r = 16 * t + n;
        const uint8_t* got = back.data() + n * row_bytes;
        if (r < rows) {
          ASSERT_EQ(std::memcmp(got, raw + r * row_bytes, static_cast<size_t>(row_bytes)), 0)
              << "row " << r;
        } else {
          ASSERT_TRUE(std::all_of(got, got + row_bytes, [](uint8_t v) { return v == 0; }));
        }
      }
    }
    kern::KMatrix w;
    ASSERT_TRUE(q4k_view(blocks, rows, cols, &w));
    const std::vector<float> x = random_values(cols, 70 + static_cast<uint32_t>(nb));
    kern::Activations a;
    kern::quantize_activations(kern::AFormat::kQ8_K, 0, x.data(), 1, cols, cols, &a);
    std::vector<float> ref(static_cast<size_t>(rows));
    kern::gemm_reference(w, a, 0, rows, ref.data(), rows);
    for (Isa isa : supported_isas()) {
      std::vector<float> y(static_cast<size_t>(tiles * 16), -1.0f);
      kern::q4k_x16_gemv(packed.data(), tiles, cols, reinterpret_cast<const BlockQ8_K*>(a.row(0)),
                         y.data(), isa);
      for (int64_t r = 0; r < tiles * 16; ++r) {
        ASSERT_EQ(y[static_cast<size_t>(r)], r < rows ? ref[static_cast<size_t>(r)] : 0.0f)
            << isa_name(isa) << " nb " << nb << " r " << r;
      }
    }
  }
}

// A Q4_K matrix repacked into x16 tiles (kern::q4k_x16_matrix, what `--cpu-experts repack`
// holds) through kern::gemm: for 1-20 tokens (the one-token GEMV, the in-place tiles), whole and
// partial row ranges on tiles, on every ISA, bit for bit the scalar reference on the GGUF rows;
// gemm_reference on the tiles too; a submatrix (tile rows x super-block columns) equals the same
// submatrix of the rows.
TEST(KernelsQ4KX16, MatrixThroughGemmEqualsReferenceOnRows) {
  const int64_t nb = 6, rows = 53, cols = nb * 256;  // 4 tiles, the last one with 5 rows
  const std::vector<BlockQ4_K> blocks = raw_q4k_blocks(rows * nb, 300);
  kern::KMatrix w;
  ASSERT_TRUE(q4k_view(blocks, rows, cols, &w));
  const kern::KMatrix x16 = kern::q4k_x16_matrix(w, AllocOptions{});
  ASSERT_EQ(x16.format, kern::WFormat::kQ4_KX16);
  ASSERT_EQ(x16.bytes(), static_cast<uint64_t>(64 * w.row_bytes));
  ASSERT_EQ(kern::row_align(x16), 16);
  ASSERT_EQ(kern::act_format(x16.format), kern::AFormat::kQ8_K);
  // 1-4 tokens: the tile kernel (four tokens per pass), more: the tiled GEMM.
  for (const int64_t tokens : {1, 2, 3, 4, 5, 20}) {
    const std::vector<float> x = random_values(tokens * cols, 80 + static_cast<uint32_t>(tokens));
    kern::Activations a;
    kern::quantize_activations(kern::AFormat::kQ8_K, 0, x.data(), tokens, cols, cols, &a);
    std::vector<float> ref(static_cast<size_t>(tokens * rows));
    kern::gemm_reference(w, a, 0, rows, ref.data(), rows);
    std::vector<float> on_tiles(ref.size(), -1.0f);
    kern::gemm_reference(x16, a, 0, rows, on_tiles.data(), rows);
    ASSERT_EQ(on_tiles, ref) << "reference on tiles, tokens " << tokens;
    for (Isa isa : supported_isas()) {
      for (auto [n0, n1] : {std::pair<int64_t, int64_t>{0, rows}, {16, 48}, {32, 40}, {48, 53}}) {
        std::vector<float> y(ref.size(), -1.0f);
        kern::gemm(x16, a, n0, n1, y.data(), rows, isa);
        ASSERT_TRUE(rows_match(y, ref, tokens, rows, n0, n1))
            << isa_name(isa) << " tokens " << tokens;
      }
    }
  }
  {  // rows must start on a tile
    const std::vector<float> x = random_values(cols, 90);
    kern::Activations a;
    kern::quantize_activations(kern::AFormat::kQ8_K, 0, x.data(), 1, cols, cols, &a);
    std::vector<float> y(static_cast<size_t>(rows));
    EXPECT_THROW(kern::gemm(x16, a, 8, 16, y.data(), rows), Error);
    EXPECT_NO_THROW(kern::gemm(x16, a, 16, 24, y.data(), rows));
  }
  // Rows [16, 53) x columns [256, 1024) of the tiles and of the GGUF rows: the same products.
  const kern::KMatrix sub = kern::copy_submatrix(x16, 16, 53, 256, 1024, AllocOptions{});
  const kern::KMatrix sub_rows = kern::copy_submatrix(w, 16, 53, 256, 1024, AllocOptions{});
  ASSERT_EQ(sub.format, kern::WFormat::kQ4_KX16);
  ASSERT_EQ(sub.rows, 37);
  ASSERT_EQ(sub.cols, 768);
  const std::vector<float> x = random_values(3 * 768, 91);
  kern::Activations a;
  kern::quantize_activations(kern::AFormat::kQ8_K, 0, x.data(), 3, 768, 768, &a);
  std::vector<float> want(3 * 37), got(want.size());
  kern::gemm_reference(sub_rows, a, 0, 37, want.data(), 37);
  kern::gemm(sub, a, 0, 37, got.data(), 37);
  EXPECT_EQ(got, want);
  EXPECT_THROW(kern::copy_submatrix(x16, 8, 32, 0, cols, AllocOptions{}), Error);
}

// Rows x cols of raw random Q6_K blocks (every bit pattern of the quants and the signed scales;
// d a finite F16 of either sign) and a kernel view of them.
struct RawQ6K {
  std::vector<BlockQ6_K> blocks;
  kern::KMatrix w;
};
RawQ6K raw_q6k(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  RawQ6K r;
  r.blocks.resize(static_cast<size_t>(rows * cols / 256));
  for (BlockQ6_K& b : r.blocks) {
    auto* bytes = reinterpret_cast<uint8_t*>(&b);
    for (size_t i = 0; i < sizeof(BlockQ6_K); ++i) bytes[i] = static_cast<uint8_t>(rng());
    b.d = static_cast<uint16_t>((rng() & 0x83FF) | ((1 + rng() % 16) << 10));
  }
  Tensor t;
  t.dtype = DType::kQ6_K;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.data = r.blocks.data();
  EXPECT_TRUE(kern::view_weight(ops::Weight(t), &r.w));
  return r;
}

// Q6_K x16 (ops/cpu/q6k_x16.h): repacking 16 rows into a tile and back gives the same bytes (a
// last tile's missing rows zero); a repacked matrix through kern::gemm for 1-40 tokens (the tile
// kernel up to 31, four tokens per pass; more through the rows), whole and partial row ranges on
// tiles on every ISA, is bit for bit the scalar reference on the GGUF rows, gemm_reference on the
// tiles too; a submatrix (tile rows x super-block columns) equals the same submatrix of the rows.
TEST(KernelsQ6KX16, RepackedMatrixEqualsReferenceOnRawBlocks) {
  for (const int64_t nb : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{11}}) {
    const int64_t rows = 53, cols = nb * 256;  // 4 tiles, the last one with 5 rows
    const RawQ6K raw = raw_q6k(rows, cols, 500 + static_cast<uint32_t>(nb));
    const kern::KMatrix& w = raw.w;
    const int64_t row_bytes = w.row_bytes;
    ASSERT_EQ(kern::q6k_x16_tile_bytes(cols), 16 * row_bytes);
    const kern::KMatrix x16 = kern::q6k_x16_matrix(w, AllocOptions{});
    ASSERT_EQ(x16.format, kern::WFormat::kQ6_KX16);
    ASSERT_EQ(x16.bytes(), static_cast<uint64_t>(64 * row_bytes));
    ASSERT_EQ(kern::row_align(x16), 16);
    ASSERT_EQ(kern::act_format(x16.format), kern::AFormat::kQ8_K);
    std::vector<uint8_t> back(static_cast<size_t>(16 * row_bytes));
    for (int64_t t = 0; t < 4; ++t) {
      kern::q6k_x16_unpack(x16.data + t * 16 * row_bytes, cols, back.data());
      for (int64_t n = 0; n < 16; ++n) {
        const int64_t r = 16 * t + n;
        const uint8_t* got = back.data() + n * row_bytes;
        if (r < rows) {
          ASSERT_EQ(std::memcmp(got, w.data + r * row_bytes, static_cast<size_t>(row_bytes)), 0)
              << "nb " << nb << " row " << r;
        } else {
          ASSERT_TRUE(std::all_of(got, got + row_bytes, [](uint8_t v) { return v == 0; }));
        }
      }
    }
    for (const int64_t tokens : {1, 2, 4, 5, 7, 20, 31, 40}) {
      const std::vector<float> x =
          random_values(tokens * cols, 600 + static_cast<uint32_t>(nb * 32 + tokens));
      kern::Activations a;
      kern::quantize_activations(kern::AFormat::kQ8_K, 0, x.data(), tokens, cols, cols, &a);
      std::vector<float> ref(static_cast<size_t>(tokens * rows));
      kern::gemm_reference(w, a, 0, rows, ref.data(), rows);
      std::vector<float> on_tiles(ref.size(), -1.0f);
      kern::gemm_reference(x16, a, 0, rows, on_tiles.data(), rows);
      ASSERT_EQ(on_tiles, ref) << "reference on tiles, nb " << nb << " tokens " << tokens;
      for (Isa isa : supported_isas()) {
        for (auto [n0, n1] :
             {std::pair<int64_t, int64_t>{0, rows}, {16, 48}, {32, 40}, {48, 53}}) {
          std::vector<float> y(ref.size(), -1.0f);
          kern::gemm(x16, a, n0, n1, y.data(), rows, isa);
          ASSERT_TRUE(rows_match(y, ref, tokens, rows, n0, n1))
              << isa_name(isa) << " nb " << nb << " tokens " << tokens;
        }
      }
    }
    if (nb < 3) continue;
    // Rows [16, 53) x columns [256, 768) of the tiles and of the GGUF rows: the same products.
    const kern::KMatrix sub = kern::copy_submatrix(x16, 16, 53, 256, 768, AllocOptions{});
    const kern::KMatrix sub_rows = kern::copy_submatrix(w, 16, 53, 256, 768, AllocOptions{});
    ASSERT_EQ(sub.format, kern::WFormat::kQ6_KX16);
    ASSERT_EQ(sub.rows, 37);
    ASSERT_EQ(sub.cols, 512);
    const std::vector<float> x = random_values(512, 91);
    kern::Activations a;
    kern::quantize_activations(kern::AFormat::kQ8_K, 0, x.data(), 1, 512, 512, &a);
    std::vector<float> want(37), got(want.size());
    kern::gemm_reference(sub_rows, a, 0, 37, want.data(), 37);
    kern::gemm(sub, a, 0, 37, got.data(), 37);
    EXPECT_EQ(got, want) << "nb " << nb;
    EXPECT_THROW(kern::copy_submatrix(x16, 8, 32, 0, cols, AllocOptions{}), Error);
    const std::vector<float> xw = random_values(cols, 92);
    kern::Activations aw;
    kern::quantize_activations(kern::AFormat::kQ8_K, 0, xw.data(), 1, cols, cols, &aw);
    std::vector<float> y(static_cast<size_t>(rows));
    EXPECT_THROW(kern::gemm(x16, aw, 8, 16, y.data(), rows), Error);  // rows start on a tile
    EXPECT_NO_THROW(kern::gemm(x16, aw, 16, 24, y.data(), rows));
  }
  kern::KMatrix q4;  // only Q6_K rows repack into Q6_K x16
  const std::vector<BlockQ4_K> q4_blocks = raw_q4k_blocks(16, 7);
  ASSERT_TRUE(q4k_view(q4_blocks, 16, 256, &q4));
  EXPECT_THROW(kern::q6k_x16_matrix(q4, AllocOptions{}), Error);
}

// Q5_0 / Q8_0 rows in the x4 layout (ops/cpu/q0_x4.h, what `--cpu-experts repack` holds on VBMI
// CPUs): a row repacked and unpacked gives its bytes back (and a row with a full quad is really
// rearranged); kern::gemm on the x4 rows for 1-20 tokens (the VBMI rows, the short-row path of
// <= 8 blocks, the tiles through unpacked rows), whole and partial row ranges, is bit for bit
// kern::gemm on the stored rows on every ISA, gemm_reference the reference's; a submatrix
// on quads equals the stored rows' one, and one off the quad grid is refused.
TEST(KernelsQ0X4, GemmEqualsReferenceOnStoredRows) {
  for (const DType dtype : {DType::kQ5_0, DType::kQ8_0}) {
    // (x4 rows: groups of 16 blocks, then 1-3 whole quads (20, 24, 12, 44) or a partial one.)
    for (const int64_t nb : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{8},
                             int64_t{12}, int64_t{20}, int64_t{24}, int64_t{44}, int64_t{67}}) {
      const int64_t rows = 21, cols = nb * 32;
      const Matrix m = make_matrix(dtype, rows, cols, 400 + static_cast<uint32_t>(nb));
      kern::KMatrix w;
      ASSERT_TRUE(kern::view_weight(ops::Weight(m.t), &w));
      kern::KMatrix x4 = w;
      ASSERT_TRUE(kern::q0_x4_format(w.format, &x4.format));
      std::vector<uint8_t> packed(m.bytes.size()), back(m.bytes.size());
      for (int64_t r = 0; r < rows; ++r) {
        kern::q0_x4_repack_row(w.format, w.data + r * w.row_bytes, nb,
                               packed.data() + r * w.row_bytes);
        kern::q0_x4_unpack_row(w.format, packed.data() + r * w.row_bytes, nb,
                               back.data() + r * w.row_bytes);
      }
      ASSERT_EQ(back, m.bytes) << "nb " << nb;
      if (nb >= 4) {
        ASSERT_NE(packed, m.bytes) << "nb " << nb;
      }
      x4.data = packed.data();
      const std::string what = std::string(kern::wformat_name(x4.format)) + " nb " +
                               std::to_string(nb);
      ASSERT_EQ(kern::act_format(x4.format), kern::AFormat::kQ8_0);
      for (const int64_t tokens : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5},
                                   int64_t{16}, int64_t{20}}) {
        const std::vector<float> x =
            random_values(tokens * cols, 500 + static_cast<uint32_t>(tokens));
        kern::Activations a;
        kern::quantize_activations(kern::AFormat::kQ8_0, 0, x.data(), tokens, cols, cols, &a);
        std::vector<float> ref(static_cast<size_t>(tokens * rows));
        kern::gemm_reference(w, a, 0, rows, ref.data(), rows);
        std::vector<float> on_x4(ref.size(), -1.0f);
        kern::gemm_reference(x4, a, 0, rows, on_x4.data(), rows);
        ASSERT_EQ(on_x4, ref) << "reference on x4, " << what << " tokens " << tokens;
        for (Isa isa : supported_isas()) {
          // (The legacy formats' SIMD levels sum the blocks in their own F32 order: the stored
          // rows' kernel of the same level is the expectation.)
          std::vector<float> want(ref.size());
          kern::gemm(w, a, 0, rows, want.data(), rows, isa);
          for (auto [n0, n1] : {std::pair<int64_t, int64_t>{0, rows}, {3, 10}, {20, 21}}) {
            std::vector<float> y(ref.size(), -1.0f);
            kern::gemm(x4, a, n0, n1, y.data(), rows, isa);
            ASSERT_TRUE(rows_match(y, want, tokens, rows, n0, n1))
                << isa_name(isa) << " " << what << " tokens " << tokens;
          }
        }
      }
      if (nb < 8) continue;
      // Rows [2, 19) x columns [128, cols) (from the second quad): the same products.
      const kern::KMatrix sub = kern::copy_submatrix(x4, 2, 19, 128, cols, AllocOptions{});
      const kern::KMatrix sub_rows = kern::copy_submatrix(w, 2, 19, 128, cols, AllocOptions{});
      ASSERT_EQ(sub.format, x4.format);
      const std::vector<float> x = random_values(3 * (cols - 128), 93);
      kern::Activations a;
      kern::quantize_activations(kern::AFormat::kQ8_0, 0, x.data(), 3, cols - 128, cols - 128,
                                 &a);
      std::vector<float> want(3 * 17), got(want.size());
      kern::gemm(sub_rows, a, 0, 17, want.data(), 17);
      kern::gemm(sub, a, 0, 17, got.data(), 17);
      EXPECT_EQ(got, want) << what;
      EXPECT_THROW(kern::copy_submatrix(x4, 0, rows, 32, cols, AllocOptions{}), Error) << what;
    }
  }
}

// The threaded dense entry equals the single-call kernel, and falls back for dtypes without one.
TEST(KernelsMatmul, ThreadedEqualsSingleCallAndFallsBack) {
  ThreadPool pool(place_workers(detect_topology(), 2));
  const int64_t rows = 300, cols = 512, tokens = 6;
  const Matrix m = make_matrix(DType::kQ4_K, rows, cols, 3);
  const std::vector<float> x = random_values(tokens * cols, 9);
  std::vector<float> y(static_cast<size_t>(tokens * rows)), want(y.size());
  kern::matmul(ops::Weight(m.t), x.data(), tokens, y.data(), &pool);
  kern::KMatrix w;
  ASSERT_TRUE(kern::view_weight(ops::Weight(m.t), &w));
  kern::Activations a;
  kern::quantize_activations(kern::AFormat::kQ8_K, 0, x.data(), tokens, cols, cols, &a);
  kern::gemm(w, a, 0, rows, want.data(), rows);  // one call, best ISA: the same per-row sums
  EXPECT_EQ(y, want);

  const Matrix q3 = make_matrix(DType::kQ8_1, 4, 256, 1);  // no fast kernel: ops::matmul
  kern::KMatrix none;
  EXPECT_FALSE(kern::view_weight(ops::Weight(q3.t), &none));
  std::vector<float> y5(2 * 4), r5(2 * 4);
  kern::matmul(ops::Weight(q3.t), x.data(), 2, y5.data(), &pool);
  ops::matmul(ops::Weight(q3.t), x.data(), 2, r5.data(), nullptr);
  EXPECT_EQ(y5, r5);
}

// Several matrices of one input in one call: each output equals its own matrix's kernel run as one
// call on this thread (for the K-quants also the scalar reference: they are exact), for one decode
// token and a 6-token batch; mixed activation encodings fall back to one call each; the KMatrix
// form rejects them; more than kMaxSharedInput matrices is an error.
TEST(KernelsMatmul, SharedInputEqualsReferencePerMatrix) {
  ThreadPool pool(place_workers(detect_topology(), 2));
  const int64_t cols = 512;
  // q / kv_a-like shapes (a large and a small matrix, both Q8_K activations), then a Q8_0 one.
  const Matrix a = make_matrix(DType::kQ4_K, 1040, cols, 21);
  const Matrix b = make_matrix(DType::kQ6_K, 96, cols, 22);
  const Matrix c = make_matrix(DType::kQ8_0, 48, cols, 23);
  for (int64_t tokens : {1, 6}) {
    const std::vector<float> x = random_values(tokens * cols, 31 + static_cast<uint32_t>(tokens));
    auto reference = [&](const Matrix& m, bool scalar) {
      kern::KMatrix w;
      EXPECT_TRUE(kern::view_weight(ops::Weight(m.t), &w));
      kern::Activations act;
      kern::quantize_activations(kern::act_format(w.format), 0, x.data(), tokens, cols, cols,
                                 &act);
      std::vector<float> y(static_cast<size_t>(tokens * w.rows));
      if (scalar) {
        kern::gemm_reference(w, act, 0, w.rows, y.data(), w.rows);
      } else {
        kern::gemm(w, act, 0, w.rows, y.data(), w.rows);
      }
      return y;
    };
    const ops::Weight wa(a.t), wb(b.t), wc(c.t);
    std::vector<float> ya(1040 * static_cast<size_t>(tokens)), yb(96 * tokens), yc(48 * tokens);
    const ops::Weight* same[2] = {&wa, &wb};
    float* same_y[2] = {ya.data(), yb.data()};
    kern::matmul_shared_input(same, x.data(), tokens, same_y, &pool);
    EXPECT_EQ(ya, reference(a, true)) << tokens;
    EXPECT_EQ(yb, reference(b, true)) << tokens;
    std::fill(ya.begin(), ya.end(), 0.0f);
    const ops::Weight* mixed[3] = {&wc, &wa, &wb};
    float* mixed_y[3] = {yc.data(), ya.data(), yb.data()};
    kern::matmul_shared_input(mixed, x.data(), tokens, mixed_y, &pool);
    EXPECT_EQ(yc, reference(c, false)) << tokens;
    EXPECT_EQ(ya, reference(a, true)) << tokens;
  }
  kern::KMatrix ka, kc;
  ASSERT_TRUE(kern::view_weight(ops::Weight(a.t), &ka));
  ASSERT_TRUE(kern::view_weight(ops::Weight(c.t), &kc));
  const kern::KMatrix* mixed[2] = {&ka, &kc};
  std::vector<float> x(cols, 1.0f), y1(1040), y2(48);
  float* ys[2] = {y1.data(), y2.data()};
  kern::Activations scratch;
  EXPECT_THROW(kern::matmul_shared_input(mixed, x.data(), 1, ys, &pool, &scratch), Error);
  // More matrices than the fixed task table holds: an error, not a write past it.
  const ops::Weight wa(a.t);
  const ops::Weight* five[5] = {&wa, &wa, &wa, &wa, &wa};
  std::vector<float> y5(5 * 1040);
  float* ys5[5] = {y5.data(), y5.data() + 1040, y5.data() + 2080, y5.data() + 3120,
                   y5.data() + 4160};
  EXPECT_THROW(kern::matmul_shared_input(five, x.data(), 1, ys5, &pool), Error);
}

// Activation rows with the corner cases of the scalar quantizers: a block of zeros, ties of the
// largest |x| (Q8_K keeps the first: its sign decides the scale's), values that scale to exact
// halves (Q8_K rounds them to even, Q8_0 away from zero), huge and tiny values; Q8_K also
// subnormals, infinities and NaN (skipped by the maximum searches).
std::vector<float> corner_rows(int64_t cols, bool non_finite) {
  std::vector<float> x = random_values(4 * cols, 21);
  float* r1 = x.data() + cols;
  std::fill(r1, r1 + 256, 0.0f);  // a whole Q8_K block (and 8 Q8_0 blocks) of zeros
  r1[300] = 20.0f;                // a tie, the positive first
  r1[301] = -20.0f;
  r1[520] = -30.0f;  // a tie, the negative first (Q8_K scale 127/30 vs -127/30)
  r1[700] = 30.0f;
  float* r2 = x.data() + 2 * cols;
  for (int64_t i = 0; i < cols; ++i) {
    // Max |x| 127 per block: Q8_0's d = 1 and Q8_K's iscale = +-1, so k + 0.5 stays a half.
    r2[i] = i % 32 == 0 ? (i % 64 == 0 ? 127.0f : -127.0f)
                        : static_cast<float>(static_cast<int>(i % 29) - 14) + 0.5f;
  }
  float* r3 = x.data() + 3 * cols;
  // (Subnormal Q8_0 blocks would scale by 1 / d = inf, whose int conversion C++ leaves undefined.)
  const float tiny = non_finite ? 1e-40f : 1e-30f;
  for (int64_t i = 0; i < cols; ++i) r3[i] *= (i / 256) % 2 == 0 ? 1e30f : tiny;
  if (non_finite) {
    r3[5] = std::numeric_limits<float>::infinity();
    r3[260] = std::numeric_limits<float>::quiet_NaN();
    r3[517] = -std::numeric_limits<float>::infinity();
  }
  return x;
}

TEST(KernelsActivations, SimdEqualsScalarBytes) {
  ThreadPool pool(place_workers(detect_topology(), 2));
  for (const auto format : {kern::AFormat::kQ8_K, kern::AFormat::kQ8_0}) {
    const bool k = format == kern::AFormat::kQ8_K;
    for (const int64_t cols : {int64_t{1024}, int64_t{768}}) {
      SCOPED_TRACE(::testing::Message() << (k ? "Q8_K" : "Q8_0") << " cols " << cols);
      const std::vector<float> x = corner_rows(cols, k);
      kern::Activations want;
      kern::quantize_activations(format, 0, x.data(), 4, cols, cols, &want, nullptr,
                                 Isa::kScalar);
      // The scalar level is the formats' quantizer, row by row.
      const DType dt = k ? DType::kQ8_K : DType::kQ8_0;
      std::vector<uint8_t> row(dtype_bytes(dt, cols));
      for (int64_t t = 0; t < 4; ++t) {
        quantize_row(dt, x.data() + t * cols, row.data(), cols);
        EXPECT_EQ(0, std::memcmp(row.data(), want.row(t), row.size())) << "token " << t;
      }
      for (int level = 1; level <= static_cast<int>(best_isa()); ++level) {
        kern::Activations got;
        kern::quantize_activations(format, 0, x.data(), 4, cols, cols, &got, nullptr,
                                   static_cast<Isa>(level));
        ASSERT_EQ(got.row_bytes, want.row_bytes);
        for (int64_t t = 0; t < 4; ++t) {
          EXPECT_EQ(0, std::memcmp(got.row(t), want.row(t), static_cast<size_t>(want.row_bytes)))
              << isa_name(static_cast<Isa>(level)) << " token " << t;
        }
      }
      // Many tokens on the pool: the same rows.
      std::vector<float> many;
      for (int rep = 0; rep < 10; ++rep) many.insert(many.end(), x.begin(), x.end());
      kern::Activations par;
      kern::quantize_activations(format, 0, many.data(), 40, cols, cols, &par, &pool);
      for (int64_t t = 0; t < 40; ++t) {
        EXPECT_EQ(0, std::memcmp(par.row(t), want.row(t % 4), static_cast<size_t>(want.row_bytes)))
            << "pool token " << t;
      }
    }
  }
}

// Float bit patterns every `stride` over all 2^32, the finite ones, and the edges of SiLU's exp.
std::vector<float> silu_inputs(uint32_t stride) {
  std::vector<float> x;
  for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += stride) {
    float v;
    const uint32_t bits = static_cast<uint32_t>(b);
    std::memcpy(&v, &bits, 4);
    x.push_back(v);
  }
  for (const float v : {0.0f, -0.0f, 1.0f, -1.0f, 87.0f, -87.0f, 88.3f, -88.3f, 88.72f, -88.72f,
                        100.0f, -100.0f, 1e-45f, -1e-45f, 1e-38f, -17.5f, 17.5f,
                        std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::quiet_NaN()}) {
    for (const float w : {v, std::nextafter(v, 0.0f), std::nextafter(v, 1e30f),
                          std::nextafter(v, -1e30f)}) {
      x.push_back(w);
    }
  }
  return x;
}

// kern::swiglu on every ISA level gives ops::silu(g) * u's bits (NaN as NaN), in calls of every
// tail length.
TEST(KernelsActivations, SwigluEqualsSiluBitForBit) {
  const std::vector<float> g = silu_inputs(65521);
  std::vector<float> u = random_values(static_cast<int64_t>(g.size()), 4);
  u[0] = 0.0f;
  std::vector<float> want(g.size());
  for (size_t i = 0; i < g.size(); ++i) want[i] = ops::silu(g[i]) * u[i];
  for (int level = 0; level <= static_cast<int>(best_isa()); ++level) {
    const Isa isa = static_cast<Isa>(level);
    std::vector<float> got(g.size());
    size_t i = 0;
    for (int64_t len = 1; i < g.size(); len = len % 40 + 1) {
      const int64_t n = std::min<int64_t>(len, static_cast<int64_t>(g.size() - i));
      kern::swiglu(g.data() + i, u.data() + i, n, got.data() + i, isa);
      i += static_cast<size_t>(n);
    }
    for (size_t j = 0; j < g.size(); ++j) {
      if (std::isnan(want[j]) && std::isnan(got[j])) continue;
      uint32_t a, b;
      std::memcpy(&a, &want[j], 4);
      std::memcpy(&b, &got[j], 4);
      ASSERT_EQ(a, b) << isa_name(isa) << " g " << g[j] << " u " << u[j];
    }
    // In place (out == gate).
    std::vector<float> io = g;
    kern::swiglu(io.data(), u.data(), static_cast<int64_t>(io.size()), io.data(), isa);
    for (size_t j = 0; j < g.size(); ++j) {
      if (!std::isnan(want[j])) {
        ASSERT_EQ(io[j], want[j]) << isa_name(isa) << " in place";
      }
    }
  }
}

// Distance in ulps between two finite floats of the same sign.
int64_t ulps(float a, float b) {
  auto key = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, 4);
    return i < 0 ? -static_cast<int64_t>(i & 0x7FFFFFFF) : static_cast<int64_t>(i);
  };
  return std::llabs(key(a) - key(b));
}

// ops::silu against x / (1 + e^-x) in double rounded once: within 3 ulp wherever the result is a
// normal float (x >= -88.3); below, -0 where the exact value is below 4e-37 in magnitude. Its
// exp within 1 ulp of e^x on [-87, 88.3]. (Measured over every 7th float: 3 and 1.)
TEST(OpsRef, SiluWithinThreeUlpOfExact) {
  const std::vector<float> x = silu_inputs(257);
  for (const float v : x) {
    if (!std::isfinite(v)) continue;
    const float want = static_cast<float>(v / (1.0 + std::exp(-static_cast<double>(v))));
    const float got = ops::silu(v);
    if (v >= -88.3f) {
      if (std::fabs(want) >= std::numeric_limits<float>::min()) {
        ASSERT_LE(ulps(got, want), 3) << "x " << v;
      } else {
        ASSERT_LE(std::fabs(got - want), std::numeric_limits<float>::min()) << "x " << v;
      }
    } else {
      ASSERT_EQ(got, 0.0f) << "x " << v;
      ASSERT_LT(std::fabs(want), 4e-37f) << "x " << v;
    }
    if (v >= -87.0f && v <= 88.3f) {
      const float e = static_cast<float>(std::exp(static_cast<double>(v)));
      if (e >= std::numeric_limits<float>::min()) {
        ASSERT_LE(ulps(ops::exp_for_silu(v), e), 1) << "x " << v;
      }
    }
  }
  EXPECT_EQ(ops::silu(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(ops::silu(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// The fast attention equals the reference attention (the same formula, F32) for GQA groups, the
// one-KV-head shape of absorbed MLA and MHA (a KV head per head: naive MLA's 192 / 128 too, whose
// batches run in blocks of 16 query tokens sharing the keys, each token with its own causal
// length), with a cached prefix (pos0 > 0), 5 and 40 query tokens; token by token (decode) gives
// the same bits as the batch.
// A segment's softmax numerators in the AVX-512 attention against ops::softmax (std::exp): p / l
// within a few ulp of every probability (e^x within 2 ulp, then one sum and one quotient), m the
// largest scaled value, tails of every length, a range wide enough to underflow.
TEST(KernelsSoftmax, Avx512SegmentMatchesReference) {
  if (best_isa() < Isa::kAvx512) GTEST_SKIP() << "no AVX-512 here";
  std::mt19937 rng(9);
  for (const int64_t n : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{100}}) {
    for (const float spread : {1.0f, 30.0f, 200.0f}) {
      std::uniform_real_distribution<float> u(-spread, spread);
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = u(rng);
      std::vector<float> want = x, got = x;
      float top = -INFINITY;
      for (float& v : want) {
        v *= 0.3f;
        top = std::max(top, v);
      }
      ops::softmax(want.data(), n);
      float m = 0.0f, l = 0.0f;
      kern::detail::segment_exp_avx512(got.data(), n, 0.3f, &m, &l);
      ASSERT_EQ(m, top) << "n " << n << " spread " << spread;
      for (int64_t i = 0; i < n; ++i) {
        const float tol = std::max(5e-7f * want[static_cast<size_t>(i)], 1e-38f);
        ASSERT_NEAR(got[static_cast<size_t>(i)] / l, want[static_cast<size_t>(i)], tol)
            << "n " << n << " spread " << spread << " i " << i;
      }
    }
  }
}

// A cache's rows [positions][heads][row] rearranged head-major, [heads][positions][row] (row
// elements of T): what AttentionArgs::k_head / v_head describe.
template <class T>
std::vector<T> head_major(const T* src, int64_t positions, int64_t heads, int64_t row) {
  std::vector<T> out(static_cast<size_t>(positions * heads * row));
  for (int64_t p = 0; p < positions; ++p) {
    for (int64_t h = 0; h < heads; ++h) {
      std::copy_n(src + (p * heads + h) * row, row, out.data() + (h * positions + p) * row);
    }
  }
  return out;
}

TEST(KernelsAttention, EqualsReference) {
  ThreadPool pool(place_workers(detect_topology(), 2));
  for (auto [heads, kv_heads, dk, dv] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t>{8, 2, 64, 64},
        {16, 1, 96, 80},
        {6, 2, 40, 24},
        {4, 4, 16, 200},
        {3, 3, 192, 128},
        {16, 2, 64, 48},  // groups of 8: a decoded token's in one block of 8, a batch's in 4s
        {8, 1, 72, 64}}) {  // one group of 8: the same, and blocks of 4 where decode splits it
    // 40: blocks of 16 query tokens; 150: contexts of three key chunks (64 keys each), the
    // next chunk prefetched while one is read; 300: two softmax segments (256 keys each); 600:
    // three, and one-token calls past kLongDecodeContext (512), where one KV group of 16 heads
    // (16 / 1) spreads its segments over the pool's threads
    for (const int64_t n : {int64_t{5}, int64_t{40}, int64_t{150}, int64_t{300}, int64_t{600}}) {
      if (n == 600 && kv_heads != 1) continue;
      const int64_t pos0 = 7, ctx = pos0 + n;
      const std::vector<float> q = random_values(n * heads * dk, 1);
      const std::vector<float> k = random_values(ctx * kv_heads * dk, 2);
      const std::vector<float> v = random_values(ctx * kv_heads * dv, 3);
      ops::AttentionArgs a;
      a.q = q.data();
      a.q_stride = heads * dk;
      a.n_tokens = n;
      a.n_heads = heads;
      a.n_kv_heads = kv_heads;
      a.dk = dk;
      a.dv = dv;
      a.k = k.data();
      a.v = v.data();
      a.k_stride = kv_heads * dk;
      a.v_stride = kv_heads * dv;
      a.pos0 = pos0;
      a.scale = 0.125f;
      std::vector<float> want(static_cast<size_t>(n * heads * dv)), got(want.size());
      a.out = want.data();
      ops::attention(a, nullptr);
      a.out = got.data();
      kern::attention(a, &pool);
      for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5f) << i;
      if (kv_heads > 1) {  // a head-major cache: the same bits, reference and kernel
        const std::vector<float> kh = head_major(k.data(), ctx, kv_heads, dk);
        const std::vector<float> vh = head_major(v.data(), ctx, kv_heads, dv);
        ops::AttentionArgs h = a;
        h.k = kh.data();
        h.v = vh.data();
        h.k_stride = dk;
        h.v_stride = dv;
        h.k_head = ctx * dk;
        h.v_head = ctx * dv;
        std::vector<float> y(want.size());
        h.out = y.data();
        ops::attention(h, nullptr);
        ASSERT_EQ(y, want) << "head-major reference";
        kern::attention(h, &pool);
        ASSERT_EQ(y, got) << "head-major";
      }
      // Token by token as decode computes it (one query, the prefix cached): the same bits.
      for (int64_t t = 0; t < n; ++t) {
        ops::AttentionArgs one = a;
        one.q = q.data() + t * heads * dk;
        one.n_tokens = 1;
        one.pos0 = pos0 + t;
        // On the pool a one-token call splits a group of >= 8 heads over tasks (16 / 1 here).
        for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
          std::vector<float> y(static_cast<size_t>(heads * dv));
          one.out = y.data();
          kern::attention(one, p);
          for (int64_t i = 0; i < heads * dv; ++i) {
            ASSERT_EQ(y[i], got[t * heads * dv + i]) << t << (p != nullptr ? " pool" : "");
          }
        }
      }
    }
  }
}

// A 16-bit KV cache (ModelOptions::kv_type). ops::attention's contract: F32 attention on the
// cache widened and, for BF16, the queries rounded to BF16 (checked against rounding by hand
// here), which the F32 kernels compute on widened rows (AVX-512: as loaded; below: copies) within
// F32 rounding. With the BF16 instructions (vdpbf16ps scores, value sums on the probabilities
// rounded to BF16) a BF16 cache's kernel is checked against ops::attention_bf16_segments (its
// arithmetic in double), and the F32 contract's numbers are within the probabilities' BF16
// rounding (2^-9 of each term). A token decoded alone or on the pool gives the batch's bits.
// Shapes: 32-value dot steps with and without a tail (40; 16: a tail only), value dimensions in
// 32s with tails (80, 24, 200), the segments and the split decode path as for F32, and absorbed
// MLA's layout (values the first dv of the key rows), odd and even context lengths.
// A Q8_0 cache (ops::q8_quantize's rows: blocks of 32 with their scales before the values) the
// same way, its rows dequantized by hand (scale of the block times the int8); on AVX-512 its
// kernel (values dequantized as loaded) gives the F32 kernel's bits on the dequantized rows.
enum class TestCache { kBf16, kF16, kQ8 };

void check_narrow_cache(TestCache cache) {
  ThreadPool pool(place_workers(detect_topology(), 2));
  const bool f16 = cache == TestCache::kF16, q8 = cache == TestCache::kQ8;
  auto round = [f16](float x) { return f16 ? f32_to_f16(x) : f32_to_bf16(x); };
  auto widen = [f16](uint16_t h) { return f16 ? f16_to_f32(h) : bf16_to_f32(h); };
  struct Shape {
    int64_t heads, kv_heads, dk, dv;
    bool values_in_keys;
  };
  for (const Shape sh : {Shape{8, 2, 64, 64, false}, Shape{16, 1, 96, 80, false},
                         Shape{6, 2, 40, 24, false}, Shape{4, 4, 16, 200, false},
                         Shape{3, 3, 192, 128, false}, Shape{16, 1, 72, 64, true},
                         Shape{16, 2, 40, 48, false}}) {
    for (const int64_t n : {int64_t{5}, int64_t{40}, int64_t{300}, int64_t{600}}) {
      if (n == 600 && !sh.values_in_keys) continue;  // the split decode: MLA's layout
      const int64_t pos0 = 7, ctx = pos0 + n;
      const std::vector<float> q = random_values(n * sh.heads * sh.dk, 4);
      const std::vector<float> kf = random_values(ctx * sh.kv_heads * sh.dk, 5);
      const std::vector<float> vf = random_values(ctx * sh.kv_heads * sh.dv, 6);
      std::vector<uint16_t> kb(kf.size()), vb(vf.size());
      std::vector<float> q_r(q.size()), k_r(kf.size()), v_r(vf.size());
      for (size_t i = 0; i < kf.size(); ++i) kb[i] = round(kf[i]);
      for (size_t i = 0; i < vf.size(); ++i) vb[i] = round(vf[i]);
      for (size_t i = 0; i < q.size(); ++i) {
        q_r[i] = f16 || q8 ? q[i] : bf16_to_f32(f32_to_bf16(q[i]));
      }
      for (size_t i = 0; i < kf.size(); ++i) k_r[i] = widen(kb[i]);
      for (size_t i = 0; i < vf.size(); ++i) v_r[i] = widen(vb[i]);
      // Q8_0: every (position, KV head) row quantized; k_r / v_r its values dequantized by hand.
      const int64_t krow = ops::q8_row_bytes(sh.dk), vrow = ops::q8_row_bytes(sh.dv);
      std::vector<int32_t> k8_mem, v8_mem;  // (4-byte aligned rows)
      const int8_t* k8 = nullptr;
      const int8_t* v8 = nullptr;
      if (q8) {
        auto quantize = [&](const std::vector<float>& x, int64_t d, int64_t row,
                            std::vector<int32_t>* mem, std::vector<float>* deq) {
          mem->assign(static_cast<size_t>(ctx * sh.kv_heads * row / 4), 0);
          int8_t* base = reinterpret_cast<int8_t*>(mem->data()) + ops::q8_lead_bytes(d);
          for (int64_t r = 0; r < ctx * sh.kv_heads; ++r) {
            int8_t* values = base + r * row;
            ops::q8_quantize(x.data() + r * d, d, values);
            for (int64_t i = 0; i < d; ++i) {
              const float scale = reinterpret_cast<const float*>(values)[-1 - i / 32];
              (*deq)[r * d + i] = scale * static_cast<float>(values[i]);
            }
          }
          return base;
        };
        k8 = quantize(kf, sh.dk, krow, &k8_mem, &k_r);
        v8 = sh.values_in_keys ? k8 : quantize(vf, sh.dv, vrow, &v8_mem, &v_r);
      }
      ops::AttentionArgs a;
      a.q = q_r.data();
      a.q_stride = sh.heads * sh.dk;
      a.n_tokens = n;
      a.n_heads = sh.heads;
      a.n_kv_heads = sh.kv_heads;
      a.dk = sh.dk;
      a.dv = sh.dv;
      a.k = k_r.data();
      a.v = sh.values_in_keys ? k_r.data() : v_r.data();
      a.k_stride = sh.kv_heads * sh.dk;
      a.v_stride = sh.values_in_keys ? a.k_stride : sh.kv_heads * sh.dv;
      a.pos0 = pos0;
      a.scale = 0.125f;
      std::vector<float> want(static_cast<size_t>(n * sh.heads * sh.dv)), got(want.size());
      a.out = want.data();
      ops::attention(a, nullptr);  // F32 on the rounded values
      ops::AttentionArgs b = a;
      b.q = q.data();
      b.k = b.v = nullptr;
      if (q8) {
        b.k8 = k8;
        b.v8 = v8;
        b.k_stride = sh.kv_heads * krow;
        b.v_stride = sh.values_in_keys ? b.k_stride : sh.kv_heads * vrow;
      } else {
        b.k16 = kb.data();
        b.v16 = sh.values_in_keys ? kb.data() : vb.data();
        b.f16 = f16;
      }
      b.out = got.data();
      ops::attention(b, nullptr);
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "reference " << i;
      std::vector<float> want_bf16(want.size());
      if (cache == TestCache::kBf16) {
        b.out = want_bf16.data();
        ops::attention_bf16_segments(b, kern::detail::kSegment);
        b.out = got.data();
      }
      for (const Isa isa : {Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16}) {
        if (isa > best_isa()) continue;
        kern::attention(b, &pool, isa);
        if (sh.kv_heads > 1) {  // a head-major cache: the same bits
          const std::vector<uint16_t> kh = head_major(kb.data(), ctx, sh.kv_heads, sh.dk);
          const std::vector<uint16_t> vh = head_major(vb.data(), ctx, sh.kv_heads, sh.dv);
          const std::vector<int32_t> k8h =
              q8 ? head_major(k8_mem.data(), ctx, sh.kv_heads, krow / 4) : std::vector<int32_t>{};
          const std::vector<int32_t> v8h =
              q8 ? head_major(v8_mem.data(), ctx, sh.kv_heads, vrow / 4) : std::vector<int32_t>{};
          ops::AttentionArgs h = b;
          if (q8) {
            h.k8 = reinterpret_cast<const int8_t*>(k8h.data()) + ops::q8_lead_bytes(sh.dk);
            h.v8 = reinterpret_cast<const int8_t*>(v8h.data()) + ops::q8_lead_bytes(sh.dv);
            h.k_stride = krow;
            h.v_stride = vrow;
          } else {
            h.k16 = kh.data();
            h.v16 = vh.data();
            h.k_stride = sh.dk;
            h.v_stride = sh.dv;
          }
          h.k_head = ctx * h.k_stride;
          h.v_head = ctx * h.v_stride;
          std::vector<float> y(want.size());
          h.out = y.data();
          kern::attention(h, &pool, isa);
          ASSERT_EQ(y, got) << isa_name(isa) << " head-major " << n;
          if (isa == Isa::kAvx2) {
            ops::attention(h, nullptr);
            ASSERT_EQ(y, want) << "head-major reference " << n;
          }
        }
        if (q8) {  // the F32 kernel's arithmetic on the dequantized rows, as loaded or copied
          std::vector<float> f32(want.size());
          ops::AttentionArgs c = a;
          c.out = f32.data();
          kern::attention(c, &pool, isa);
          for (size_t i = 0; i < f32.size(); ++i) {
            ASSERT_EQ(got[i], f32[i]) << isa_name(isa) << " q8 as f32 " << n << " " << i;
          }
        }
        const bool dp = cache == TestCache::kBf16 && isa >= Isa::kAvx512Bf16;
        // With the BF16 instructions: a probability within the kernel's F32 error of a BF16
        // rounding tie rounds the other way now and then, moving its row by up to 2^-8 of that
        // term (measured: 0.1-0.25% of the outputs beyond 2e-5, at most 4.8e-4, rows of a
        // token and head); the others agree to F32 rounding.
        int64_t close = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          const float e = std::fabs(got[i] - (dp ? want_bf16[i] : want[i]));
          close += e <= 2e-5f;
          ASSERT_LE(e, dp ? 1e-3f : 2e-5f) << isa_name(isa) << " " << n << " " << i;
          if (dp) {
            ASSERT_NEAR(got[i], want[i], 4e-3f) << isa_name(isa) << " " << n << " " << i;
          }
        }
        EXPECT_GE(close * 1000, static_cast<int64_t>(want.size()) * 995) << isa_name(isa) << n;
        for (int64_t t = 0; t < n; t += (n > 50 ? 37 : 1)) {
          ops::AttentionArgs one = b;
          one.q = q.data() + t * sh.heads * sh.dk;
          one.n_tokens = 1;
          one.pos0 = pos0 + t;
          for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
            std::vector<float> y(static_cast<size_t>(sh.heads * sh.dv));
            one.out = y.data();
            kern::attention(one, p, isa);
            for (int64_t i = 0; i < sh.heads * sh.dv; ++i) {
              ASSERT_EQ(y[i], got[t * sh.heads * sh.dv + i])
                  << isa_name(isa) << " token " << t << (p != nullptr ? " pool" : "");
            }
          }
        }
        // The last token, whose decode takes the split path at 600.
        ops::AttentionArgs last = b;
        last.q = q.data() + (n - 1) * sh.heads * sh.dk;
        last.n_tokens = 1;
        last.pos0 = pos0 + n - 1;
        std::vector<float> y(static_cast<size_t>(sh.heads * sh.dv));
        last.out = y.data();
        kern::attention(last, &pool, isa);
        for (int64_t i = 0; i < sh.heads * sh.dv; ++i) {
          ASSERT_EQ(y[i], got[(n - 1) * sh.heads * sh.dv + i]) << isa_name(isa) << " last";
        }
      }
    }
  }
}

TEST(KernelsAttention, Bf16CacheEqualsReference) { check_narrow_cache(TestCache::kBf16); }
TEST(KernelsAttention, F16CacheEqualsReference) { check_narrow_cache(TestCache::kF16); }
TEST(KernelsAttention, Q8CacheEqualsReference) { check_narrow_cache(TestCache::kQ8); }

// ops::q8_quantize against its definition: per block of 32 (the last one shorter) the scale is
// max|x| / 127 stored 4 (b + 1) bytes before the values, every value round(x / scale) (halves
// away from zero), so within half a scale of x and the block's largest at +-127; an all-zero
// block has scale 0 and zeros. Worked by hand: 1.27 / 127 = 0.01, -0.635 -> -63.5 -> -64.
TEST(KernelsAttention, Q8RowsQuantizeAsDefined) {
  std::vector<float> x(32 * 3 + 5, 0.0f);
  x[0] = 1.27f;
  x[1] = -0.635f;
  x[2] = 0.2f;
  const std::vector<float> r = random_values(32 + 5, 9);
  std::copy(r.begin(), r.end(), x.begin() + 64);  // blocks 2 and 3 (5 values); block 1 zeros
  const int64_t d = static_cast<int64_t>(x.size());
  ASSERT_EQ(ops::q8_lead_bytes(d), 16);
  ASSERT_EQ(ops::q8_row_bytes(d), 16 + 104);
  std::vector<int32_t> mem(static_cast<size_t>(ops::q8_row_bytes(d) / 4), -1);
  int8_t* values = reinterpret_cast<int8_t*>(mem.data()) + ops::q8_lead_bytes(d);
  ops::q8_quantize(x.data(), d, values);
  const float* scales = reinterpret_cast<const float*>(values);
  EXPECT_EQ(scales[-1], 1.27f / 127.0f);
  EXPECT_EQ(values[0], 127);
  EXPECT_EQ(values[1], -64);
  EXPECT_EQ(values[2], 20);
  EXPECT_EQ(values[3], 0);
  EXPECT_EQ(scales[-2], 0.0f);
  for (int64_t i = 32; i < 64; ++i) EXPECT_EQ(values[i], 0) << i;
  for (int64_t b = 2; b < 4; ++b) {
    const int64_t b0 = 32 * b, n = std::min<int64_t>(32, d - b0);
    float amax = 0.0f;
    int top = 0;
    for (int64_t i = b0; i < b0 + n; ++i) amax = std::max(amax, std::fabs(x[i]));
    EXPECT_EQ(scales[-1 - b], amax / 127.0f) << b;
    for (int64_t i = b0; i < b0 + n; ++i) {
      top = std::max(top, std::abs(static_cast<int>(values[i])));
      EXPECT_LE(std::fabs(ops::q8_value(values, i) - x[i]), scales[-1 - b] * 0.5f * 1.0001f) << i;
      EXPECT_EQ(ops::q8_value(values, i), scales[-1 - b] * static_cast<float>(values[i]));
    }
    EXPECT_EQ(top, 127) << b;
  }
  for (int64_t i = d; i < 104; ++i) EXPECT_EQ(values[i], 0) << "padding " << i;
  // A non-finite value makes its block read back NaN (no int8 of a NaN), the others as before.
  x[40] = std::numeric_limits<float>::infinity();
  x[70] = std::numeric_limits<float>::quiet_NaN();
  ops::q8_quantize(x.data(), d, values);
  for (int64_t i = 32; i < 96; ++i) EXPECT_TRUE(std::isnan(ops::q8_value(values, i))) << i;
  EXPECT_EQ(ops::q8_value(values, 0), 1.27f);
  EXPECT_EQ(values[1], -64);
  EXPECT_FALSE(std::isnan(ops::q8_value(values, 96)));
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// kern::gemm_f32_kn (expanded MLA's F32 product with a [k, n] weight): every ISA gives the
// scalar reference's bits (one fma chain per output, p in order), which are within float rounding
// of the exact sum (double), for row counts around the 6-row blocks, k from 1, n multiples of 64
// and one that is not (the reference path), lda and ldc wider than the data.
TEST(KernelsGemmF32Kn, EveryIsaEqualsReference) {
  for (const int64_t m : {int64_t{1}, int64_t{5}, int64_t{6}, int64_t{7}, int64_t{13}}) {
    for (const int64_t k : {int64_t{1}, int64_t{17}, int64_t{512}}) {
      for (const int64_t n : {int64_t{64}, int64_t{128}, int64_t{40}}) {
        const int64_t lda = k + 3, ldc = n + 5;
        const std::vector<float> a = random_values(m * lda, 11), b = random_values(k * n, 12);
        std::vector<float> want(static_cast<size_t>(m * ldc), -1.0f);
        kern::gemm_f32_kn(a.data(), lda, m, b.data(), k, n, want.data(), ldc, Isa::kScalar);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double exact = 0, mag = 0;
            for (int64_t p = 0; p < k; ++p) {
              exact += double(a[i * lda + p]) * b[p * n + j];
              mag += std::fabs(double(a[i * lda + p]) * b[p * n + j]);
            }
            ASSERT_NEAR(want[i * ldc + j], exact, 1e-6 * mag + 1e-30) << m << " " << k << " " << n;
          }
        }
        for (const Isa isa : {Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16}) {
          if (isa > best_isa()) continue;
          std::vector<float> got(want.size(), -1.0f);
          kern::gemm_f32_kn(a.data(), lda, m, b.data(), k, n, got.data(), ldc, isa);
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_EQ(got[i], want[i]) << isa_name(isa) << " m " << m << " k " << k << " n " << n
                                       << " i " << i;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem
