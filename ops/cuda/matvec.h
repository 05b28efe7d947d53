// The product of a weight as stored (no dequantized copy) with a few F32 activation rows: the
// decode step's projections, read once per 8 tokens at the weight's own size in bytes (a Q4_K
// matrix moves 4.5 bits a value, not 32). The launcher is asynchronous on `stream`, never throws,
// and returns cudaErrorInvalidValue for a dtype or shape it does not support (checked before any
// launch). Device pointers throughout.
// Numbers: each weight value is formats/quant.h's dequantized value bit for bit; the sums run in
// another order than the CPU's (per thread over its chunks, then across the warp): equal to the
// CPU reference within F32 rounding, not bit for bit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace tandem {

// A row-major weight [rows, cols] in device memory: row r at data + r * row_bytes. With scale_inv
// (FP8-E4M3 with DeepSeek-V3 block scales) value (r, c) is multiplied by
// scale_inv[(r / block_rows) * scale_row_elems + c / block_cols].
struct QuantMatrix {
  DType type = DType::kF32;
  const void* data = nullptr;
  int64_t row_bytes = 0, rows = 0, cols = 0;
  const float* scale_inv = nullptr;
  int64_t scale_row_elems = 0, block_rows = 1, block_cols = 1;
};

// The dtypes matmul_quant_cuda reads: those of dequantize_rows_cuda (dequant.h).
bool cuda_can_matvec(DType type);

// y[t * ldy + r] = sum_c w(r, c) * x[t * ldx + c], for r < w.rows, t < n. Block formats need cols
// a multiple of the block; block scales need block_cols a multiple of 8.
cudaError_t matmul_quant_cuda(const QuantMatrix& w, const float* x, int64_t ldx, int64_t n,
                              float* y, int64_t ldy, cudaStream_t stream);

}  // namespace tandem
