// Internal to formats/quant*.cpp: the per-format routines behind dequantize_row / quantize_row.
// Each takes whole blocks (`nb` = number of blocks) of one format.
#pragma once

#include <bit>
#include <cstdint>

#include "formats/quant.h"

// The routines reproduce ggml's float arithmetic operation by operation, so the files that
// implement them are compiled with -ffp-contract=off (formats/CMakeLists.txt): a fused
// multiply-add rounds differently and changes quantized bytes.

namespace tandem::quant_impl {

// Rounds to the nearest integer, ties to even (the FPU's default mode), for |x| < 2^22: adding
// 1.5 * 2^23 leaves the integer in the low mantissa bits. Matches ggml's nearest_int exactly.
inline int nearest_int(float x) {
  const float biased = x + 12582912.0f;
  return static_cast<int>(std::bit_cast<uint32_t>(biased) & 0x007FFFFFu) - 0x00400000;
}

void dequantize_q4_0(const BlockQ4_0* x, float* y, int64_t nb);
void dequantize_q4_1(const BlockQ4_1* x, float* y, int64_t nb);
void dequantize_q5_0(const BlockQ5_0* x, float* y, int64_t nb);
void dequantize_q5_1(const BlockQ5_1* x, float* y, int64_t nb);
void dequantize_q8_0(const BlockQ8_0* x, float* y, int64_t nb);
void dequantize_q8_1(const BlockQ8_1* x, float* y, int64_t nb);
void quantize_q4_0(const float* x, BlockQ4_0* y, int64_t nb);
void quantize_q4_1(const float* x, BlockQ4_1* y, int64_t nb);
void quantize_q5_0(const float* x, BlockQ5_0* y, int64_t nb);
void quantize_q5_1(const float* x, BlockQ5_1* y, int64_t nb);
void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t nb);
void dequantize_mxfp4(const BlockMXFP4* x, float* y, int64_t nb);
void quantize_mxfp4(const float* x, BlockMXFP4* y, int64_t nb);
void quantize_q8_1(const float* x, BlockQ8_1* y, int64_t nb);

void dequantize_q2_k(const BlockQ2_K* x, float* y, int64_t nb);
void dequantize_q3_k(const BlockQ3_K* x, float* y, int64_t nb);
void dequantize_q4_k(const BlockQ4_K* x, float* y, int64_t nb);
void dequantize_q5_k(const BlockQ5_K* x, float* y, int64_t nb);
void dequantize_q6_k(const BlockQ6_K* x, float* y, int64_t nb);
void dequantize_q8_k(const BlockQ8_K* x, float* y, int64_t nb);
void quantize_q2_k(const float* x, BlockQ2_K* y, int64_t nb);
void quantize_q3_k(const float* x, BlockQ3_K* y, int64_t nb);
void quantize_q4_k(const float* x, BlockQ4_K* y, int64_t nb);
void quantize_q5_k(const float* x, BlockQ5_K* y, int64_t nb);
void quantize_q6_k(const float* x, BlockQ6_K* y, int64_t nb);
void quantize_q8_k(const float* x, BlockQ8_K* y, int64_t nb);

}  // namespace tandem::quant_impl
