#include <gtest/gtest.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace tandem {
namespace {

TEST(DType, BlockSizesMatchGgml) {
  // Sizes from ggml-common.h: sizeof(block_q4_K) = 2*2 + 12 + 128 = 144, etc.
  EXPECT_EQ(dtype_info(DType::kQ4_0).block_bytes, 2 + 16);
  EXPECT_EQ(dtype_info(DType::kQ8_0).block_bytes, 2 + 32);
  EXPECT_EQ(dtype_info(DType::kQ4_K).block_bytes, 4 + 12 + 128);
  EXPECT_EQ(dtype_info(DType::kQ5_K).block_bytes, 4 + 12 + 32 + 128);
  EXPECT_EQ(dtype_info(DType::kQ6_K).block_bytes, 128 + 64 + 16 + 2);
  EXPECT_EQ(dtype_info(DType::kQ8_K).block_bytes, 4 + 256 + 32);
  EXPECT_EQ(dtype_info(DType::kQ2_K).block_bytes, 16 + 64 + 4);
  EXPECT_EQ(dtype_info(DType::kQ3_K).block_bytes, 32 + 64 + 12 + 2);
  EXPECT_EQ(dtype_bytes(DType::kQ4_K, 512), 288);
  EXPECT_EQ(dtype_bytes(DType::kBF16, 10), 20);
}

TEST(DType, LookupByGgmlIdAndName) {
  EXPECT_EQ(dtype_from_ggml(12), DType::kQ4_K);
  EXPECT_EQ(dtype_from_ggml(30), DType::kBF16);
  EXPECT_FALSE(dtype_from_ggml(999).has_value());
  EXPECT_EQ(dtype_from_name("Q6_K"), DType::kQ6_K);
  EXPECT_EQ(dtype_from_name("f8_e4m3"), DType::kF8E4M3);
  EXPECT_FALSE(dtype_from_name("q9_9").has_value());
}

TEST(Tensor, DenseStridesAndSlices) {
  alignas(64) static char buf[4 * 3 * 64 * 4];
  Tensor t = Tensor::dense(DType::kF32, {4, 3, 64}, buf);
  EXPECT_EQ(t.numel(), 4 * 3 * 64);
  EXPECT_EQ(t.rows(), 12);
  EXPECT_EQ(t.row_bytes(), 256);
  EXPECT_EQ(t.stride_bytes[0], 3 * 256);
  EXPECT_EQ(t.stride_bytes[1], 256);
  EXPECT_TRUE(t.is_contiguous());
  Tensor e = t.slice0(2);
  EXPECT_EQ(e.ndim, 2);
  EXPECT_EQ(e.data, buf + 2 * 3 * 256);
  EXPECT_EQ(e.shape_string(), "[3, 64]");
  EXPECT_THROW(t.slice0(4), Error);

  Tensor q = Tensor::dense(DType::kQ4_K, {2, 512}, buf);
  EXPECT_EQ(q.row_bytes(), 288);
  EXPECT_EQ(q.nbytes(), 576);
  EXPECT_EQ(q.row<char>(1), buf + 288);
}

}  // namespace
}  // namespace tandem
