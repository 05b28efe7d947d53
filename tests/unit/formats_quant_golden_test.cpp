// formats/quant.h against llama.cpp: tests/data/golden holds F32 models (NAME.gguf) and the files
// llama-quantize made from them (NAME-q8_0.gguf, NAME-q4_k_m.gguf, no importance matrix).
//  (a) our Q8_0 quantizer reproduces every Q8_0 row of the q8_0 files byte for byte;
//  (b) every quantized tensor of the q4_k_m files dequantizes to within its format's error of
//      the F32 weights;
//  (c) our K-quant / Q5 quantizers reproduce llama-quantize's rows (counted per format; the
//      reference quantizers are deterministic, so all rows are expected to match).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "formats/gguf.h"
#include "formats/quant.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

const char* const kModels[] = {"qwen2moe", "qwen3moe", "mixtral", "deepseek2", "deepseek3"};

struct RowMatch {
  int64_t rows = 0;
  int64_t exact = 0;
};

// Quantizes every row of `f32` to the dtype of `quant` and counts the rows whose bytes match.
RowMatch match_rows(const Tensor& f32, const Tensor& quant) {
  RowMatch m;
  std::vector<uint8_t> ours(static_cast<size_t>(quant.row_bytes()));
  for (int64_t r = 0; r < f32.rows(); ++r) {
    quantize_row(quant.dtype, f32.row<float>(r), ours.data(), f32.row_elems());
    ++m.rows;
    if (std::memcmp(ours.data(), quant.row(r), ours.size()) == 0) ++m.exact;
  }
  return m;
}

void expect_same_shape(const Tensor& a, const Tensor& b, const std::string& name) {
  ASSERT_EQ(a.ndim, b.ndim) << name;
  for (int i = 0; i < a.ndim; ++i) ASSERT_EQ(a.shape[i], b.shape[i]) << name;
}

TEST(QuantGolden, Q8_0RowsEqualLlamaQuantize) {
  int64_t tensors = 0;
  for (const char* model : kModels) {
    const GgufFile f32 = GgufFile::open(test::data_path(std::string("golden/") + model + ".gguf"));
    const GgufFile q8 =
        GgufFile::open(test::data_path(std::string("golden/") + model + "-q8_0.gguf"));
    for (const GgufTensorInfo& info : q8.tensors()) {
      if (info.dtype != DType::kQ8_0) continue;
      const Tensor src = f32.tensor(info.name);
      const Tensor dst = q8.tensor(info.name);
      ASSERT_EQ(src.dtype, DType::kF32) << model << " " << info.name;
      expect_same_shape(src, dst, info.name);
      const RowMatch m = match_rows(src, dst);
      EXPECT_EQ(m.exact, m.rows) << model << " " << info.name;
      ++tensors;
    }
  }
  EXPECT_GT(tensors, 5 * 10);  // every model has its attention and expert weights in Q8_0
}

// Largest error of each format relative to the largest magnitude of the input row, over all rows
// of all q4_k_m tensors of that format. A wrong layout gives errors of the order of the weights.
//  Q8_0: half a step of amax / 127, plus the F16 rounding of d (127 * d * 2^-11).
//  Q5_1: half a step of (max - min) / 31 <= 2 amax / 31, plus F16 rounding of d and m.
//  Q5_0: one step of amax / 16 (values of the sign opposite to the largest are clamped at +15).
//  K-quants: scales are searched, quantized to 6 / 8 bits, and extremes may be clamped: a few
//  half-steps (Q6_K: amax / 64 per sub-block of 16; Q5_K, Q4_K: range / 31, range / 15).
const std::map<DType, double> kMaxRowError = {
    {DType::kQ8_0, 0.0045}, {DType::kQ5_1, 0.035}, {DType::kQ5_0, 0.065},
    {DType::kQ6_K, 0.03},   {DType::kQ5_K, 0.10},  {DType::kQ4_K, 0.20},
};

TEST(QuantGolden, Q4_K_MDequantizesCloseToF32AndRowsMatch) {
  std::map<DType, RowMatch> matches;
  std::map<DType, double> worst;
  std::vector<float> y;
  for (const char* model : kModels) {
    const GgufFile f32 = GgufFile::open(test::data_path(std::string("golden/") + model + ".gguf"));
    const GgufFile qk =
        GgufFile::open(test::data_path(std::string("golden/") + model + "-q4_k_m.gguf"));
    for (const GgufTensorInfo& info : qk.tensors()) {
      if (!dtype_info(info.dtype).is_block) continue;
      const Tensor src = f32.tensor(info.name);
      const Tensor dst = qk.tensor(info.name);
      expect_same_shape(src, dst, info.name);
      ASSERT_TRUE(kMaxRowError.count(info.dtype)) << "unexpected " << dtype_name(info.dtype);
      y.resize(static_cast<size_t>(dst.row_elems()));
      double tensor_worst = 0;
      for (int64_t r = 0; r < dst.rows(); ++r) {
        dequantize_row(dst.dtype, dst.row(r), y.data(), dst.row_elems());
        const float* x = src.row<float>(r);
        double amax = 0, err = 0;
        for (int64_t i = 0; i < dst.row_elems(); ++i) {
          amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
          err = std::max(err, std::fabs(static_cast<double>(x[i]) - y[i]));
        }
        tensor_worst = std::max(tensor_worst, amax > 0 ? err / amax : err);
      }
      EXPECT_LE(tensor_worst, kMaxRowError.at(info.dtype))
          << model << " " << info.name << " " << dtype_name(info.dtype);
      worst[info.dtype] = std::max(worst[info.dtype], tensor_worst);

      const RowMatch m = match_rows(src, dst);
      matches[info.dtype].rows += m.rows;
      matches[info.dtype].exact += m.exact;
    }
  }
  // The README lists what Q4_K_M made of these models.
  for (DType t :
       {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ5_0, DType::kQ5_1, DType::kQ8_0}) {
    EXPECT_GT(matches[t].rows, 0) << dtype_name(t);
  }
  for (const auto& [dtype, m] : matches) {
    std::printf("%-5s rows %6lld, byte-exact %6lld (%.2f%%), worst row error %.4f of max|x|\n",
                std::string(dtype_name(dtype)).c_str(), static_cast<long long>(m.rows),
                static_cast<long long>(m.exact), 100.0 * m.exact / m.rows, worst[dtype]);
    EXPECT_EQ(m.exact, m.rows) << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace tandem
