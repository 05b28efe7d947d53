// Reference CPU ops against direct formulas: matmul in stored dtypes, embedding, RMSNorm,
// softmax, RoPE forms, YaRN frequencies and mscale, causal attention.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/quant.h"
#include "ops/cpu/ref_ops.h"

namespace tandem {
namespace {

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// W stored as `type`, then the expected product from its exact dequantization.
void check_matmul(DType type, ThreadPool* pool) {
  const int64_t rows = 37, k = 256, t = 3;
  const std::vector<float> wf = randn(rows * k, 1);
  std::vector<uint8_t> wq(dtype_bytes(type, rows * k));
  const int64_t rb = dtype_bytes(type, k);
  for (int64_t r = 0; r < rows; ++r) quantize_row(type, wf.data() + r * k, wq.data() + r * rb, k);
  std::vector<float> wd(rows * k);
  for (int64_t r = 0; r < rows; ++r) dequantize_row(type, wq.data() + r * rb, wd.data() + r * k, k);
  const Tensor w = Tensor::dense(type, {rows, k}, wq.data());
  const std::vector<float> x = randn(t * k, 2);
  std::vector<float> y(t * rows);
  ops::matmul(w, x.data(), t, y.data(), pool);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      double e = 0;
      for (int64_t j = 0; j < k; ++j) e += double(wd[r * k + j]) * x[i * k + j];
      EXPECT_NEAR(y[i * rows + r], e, 1e-3) << dtype_info(type).name << " " << i << "," << r;
    }
  }
  // The transposed product: y2[i][j] = sum_r x2[i][r] w[r][j].
  const std::vector<float> x2 = randn(t * rows, 3);
  std::vector<float> y2(t * k);
  ops::matmul_transposed(w, x2.data(), t, y2.data());
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < k; j += 17) {
      double e = 0;
      for (int64_t r = 0; r < rows; ++r) e += double(x2[i * rows + r]) * wd[r * k + j];
      EXPECT_NEAR(y2[i * k + j], e, 1e-3);
    }
  }
}

TEST(OpsRef, MatmulStoredDtypes) {
  ThreadingContext ctx(ThreadingOptions{2, false, 20});
  for (DType type :
       {DType::kF32, DType::kBF16, DType::kF16, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    check_matmul(type, nullptr);
    check_matmul(type, &ctx.pool());
  }
}

// FP8 with 128x128 block scales, read through a row view that starts inside a block: equal to
// the product with dequantize_fp8_blocks' output.
TEST(OpsRef, MatmulFp8BlockScales) {
  const int64_t rows = 300, cols = 256, br = 128, bc = 128, t = 2;
  std::vector<float> wf = randn(rows * cols, 5);
  for (int64_t r = 0; r < rows; ++r) wf[r * cols] *= 1.0f + r / 10.0f;  // distinct block amax
  std::vector<uint8_t> w8(rows * cols);
  std::vector<float> scale(3 * 2);
  quantize_fp8_blocks(wf.data(), rows, cols, br, bc, w8.data(), scale.data());
  std::vector<float> wd(rows * cols);
  dequantize_fp8_blocks(w8.data(), scale.data(), rows, cols, br, bc, wd.data());
  ops::Weight w(Tensor::dense(DType::kF8E4M3, {rows, cols}, w8.data()));
  w.scale_inv = scale.data();
  w.scale_cols = 2;
  w.block_rows = br;
  w.block_cols = bc;
  const ops::Weight part = w.row_range(100, 150);  // rows 100..249 span blocks 0, 1 and 2
  const std::vector<float> x = randn(t * cols, 6);
  std::vector<float> y(t * 150);
  ops::matmul(part, x.data(), t, y.data(), nullptr);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t r = 0; r < 150; ++r) {
      double e = 0;
      for (int64_t j = 0; j < cols; ++j) e += double(wd[(100 + r) * cols + j]) * x[i * cols + j];
      EXPECT_NEAR(y[i * 150 + r], e, 1e-3) << i << "," << r;
    }
  }
}

TEST(OpsRef, EmbeddingAndRange) {
  std::vector<float> table = {0, 1, 2, 3, 4, 5};  // 3 rows of 2
  const Tensor t = Tensor::dense(DType::kF32, {3, 2}, table.data());
  const int32_t ids[] = {2, 0};
  float out[4];
  ops::embedding(t, ids, 2, out);
  EXPECT_EQ(out[0], 4);
  EXPECT_EQ(out[1], 5);
  EXPECT_EQ(out[2], 0);
  const int32_t bad[] = {3};
  try {
    ops::embedding(t, bad, 1, out);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfRange);
  }
}

TEST(OpsRef, RmsNormSoftmaxSwiglu) {
  const float x[] = {3, 4};
  const float w[] = {1, 2};
  float y[2];
  ops::rms_norm(x, w, 2, 0.0f, y);
  const float rms = std::sqrt(12.5f);
  EXPECT_FLOAT_EQ(y[0], 3 / rms);
  EXPECT_FLOAT_EQ(y[1], 8 / rms);
  float s[] = {1, 2, 3};
  ops::softmax(s, 3);
  const float z = std::exp(1.f) + std::exp(2.f) + std::exp(3.f);
  EXPECT_NEAR(s[2], std::exp(3.f) / z, 1e-6);
  const float g[] = {1.0f}, u[] = {2.0f};
  float o[1];
  ops::swiglu(g, u, 1, o);
  EXPECT_NEAR(o[0], 2.0f / (1.0f + std::exp(-1.0f)), 1e-6);
}

TEST(OpsRef, RopeFormsAndValues) {
  const ops::Rope rope(8, 10000.0f, RopeScaling{});
  EXPECT_NEAR(rope.inv_freq()[1], std::pow(10000.0, -2.0 / 8), 1e-7);
  // NeoX pairs (i, i+4) hold what the interleaved form pairs as (2i, 2i+1).
  const std::vector<float> x = randn(8, 4);
  std::vector<float> inter(8), neox(8);
  for (int i = 0; i < 4; ++i) {
    inter[2 * i] = neox[i] = x[i];
    inter[2 * i + 1] = neox[i + 4] = x[i + 4];
  }
  rope.apply(inter.data(), 5, ops::RopeForm::kInterleaved);
  rope.apply(neox.data(), 5, ops::RopeForm::kNeox);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(inter[2 * i], neox[i], 1e-6);
    EXPECT_NEAR(inter[2 * i + 1], neox[i + 4], 1e-6);
  }
  // Pair 0 at position 3 turns by 3 radians.
  const ops::Rope r2(2, 10000.0f, RopeScaling{});
  float v[] = {1, 0};
  r2.apply(v, 3, ops::RopeForm::kNeox);
  EXPECT_NEAR(v[0], std::cos(3.0), 1e-6);
  EXPECT_NEAR(v[1], std::sin(3.0), 1e-6);
}

TEST(OpsRef, YarnFrequenciesMatchFormula) {
  RopeScaling s;
  s.type = RopeScalingType::kYarn;
  s.factor = 40;
  s.original_max_position_embeddings = 4096;
  s.beta_fast = 32;
  s.beta_slow = 1;
  s.mscale = 0.707f;
  s.mscale_all_dim = 0.707f;
  const int dim = 64;
  const double base = 10000;
  const ops::Rope rope(dim, static_cast<float>(base), s);
  auto corr = [&](double rot) {
    return dim * std::log(4096 / (rot * 2 * std::numbers::pi)) / (2 * std::log(base));
  };
  const double low = std::max(0.0, std::floor(corr(32))), high = std::min(63.0, std::ceil(corr(1)));
  for (int i = 0; i < dim / 2; ++i) {
    const double extra = std::pow(base, -2.0 * i / dim);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double expect = extra / 40 * ramp + extra * (1 - ramp);
    EXPECT_NEAR(rope.inv_freq()[i], expect, 1e-6 * extra) << i;
  }
  EXPECT_NEAR(rope.inv_freq()[0], 1.0, 1e-6);                               // extrapolated
  EXPECT_NEAR(rope.inv_freq()[31], std::pow(base, -62.0 / 64) / 40, 1e-9);  // interpolated
  EXPECT_FLOAT_EQ(rope.cos_sin_scale(), 1.0f);  // mscale == mscale_all_dim
  const double m = 0.1 * 0.707 * std::log(40.0) + 1.0;
  EXPECT_NEAR(rope.softmax_scale_factor(), m * m, 1e-5);
  EXPECT_FLOAT_EQ(ops::yarn_mscale(1.0f, 1.0f), 1.0f);
}

TEST(OpsRef, CausalAttentionGqa) {
  // 2 query heads sharing 1 kv head, dk = dv = 2, two tokens prefilled at position 0.
  const float q[] = {1, 0, 0, 1, /*t1*/ 1, 1, 0, 0};
  const float k[] = {1, 0, 0, 2};
  const float v[] = {10, 0, 0, 20};
  float out[8];
  ops::AttentionArgs a;
  a.q = q;
  a.q_stride = 4;
  a.n_tokens = 2;
  a.n_heads = 2;
  a.n_kv_heads = 1;
  a.dk = a.dv = 2;
  a.k = k;
  a.v = v;
  a.k_stride = a.v_stride = 2;
  a.scale = 0.5f;
  a.out = out;
  ops::attention(a, nullptr);
  // Token 0 sees only itself.
  EXPECT_FLOAT_EQ(out[0], 10);
  EXPECT_FLOAT_EQ(out[3], 0);
  // Token 1, head 0: scores 0.5*1, 0.5*2.
  const double p0 = std::exp(0.5) / (std::exp(0.5) + std::exp(1.0));
  EXPECT_NEAR(out[4], 10 * p0, 1e-5);
  EXPECT_NEAR(out[5], 20 * (1 - p0), 1e-5);
  // Token 1, head 1: q = 0 -> uniform.
  EXPECT_NEAR(out[6], 5, 1e-5);
  EXPECT_NEAR(out[7], 10, 1e-5);
}

}  // namespace
}  // namespace tandem
