// Host launchers for the dequantization kernels (dequant.cuh): GGUF block types, F16/BF16/F32 and
// FP8-E4M3 (plain or with DeepSeek-V3 block scales) to F32 or BF16 rows on the GPU. Results equal
// formats/quant.h's dequantize_row / dequantize_fp8_blocks bit for bit (BF16: that F32 value
// rounded to nearest even). Launchers are asynchronous on `stream`, never throw, and return
// cudaErrorInvalidValue for a dtype or shape they do not support (checked before any launch).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace tandem {

// Source types dequantize_rows_cuda accepts: F32, F16, BF16, F8E4M3 (unscaled) and the GGUF block
// types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, MXFP4.
bool cuda_can_dequantize(DType type);

// `rows` rows of `cols` values. Row r of the source starts at src + r * src_row_bytes (bytes; at
// least dtype_bytes(type, cols)) and its output at dst + r * dst_row_elems (elements of out_type,
// at least cols). For block types cols must be a multiple of the block size. out_type: kF32 or
// kBF16 (stored as uint16_t bits). Device pointers.
cudaError_t dequantize_rows_cuda(DType type, const void* src, int64_t src_row_bytes, int64_t rows,
                                 int64_t cols, DType out_type, void* dst, int64_t dst_row_elems,
                                 cudaStream_t stream);

// Row row_ids[r] (device memory, each < the source's rows) of the source into F32 row r, for
// r < rows: an embedding's rows of the step's tokens, which a graph's replay reads there.
cudaError_t gather_rows_cuda(DType type, const void* src, int64_t src_row_bytes,
                             const int32_t* row_ids, int64_t rows, int64_t cols, float* dst,
                             int64_t dst_row_elems, cudaStream_t stream);

// DeepSeek-V3 style FP8 weights [rows, cols] (row r at w + r * w_row_bytes) with F32 scale_inv
// [ceil(rows / block_rows), ceil(cols / block_cols)] (row stride scale_row_elems >= the latter):
// value = fp8 * scale_inv[r / block_rows][c / block_cols]. Edge blocks may be partial.
cudaError_t dequantize_fp8_blocks_cuda(const uint8_t* w, int64_t w_row_bytes,
                                       const float* scale_inv, int64_t scale_row_elems,
                                       int64_t rows, int64_t cols, int64_t block_rows,
                                       int64_t block_cols, DType out_type, void* dst,
                                       int64_t dst_row_elems, cudaStream_t stream);

}  // namespace tandem
