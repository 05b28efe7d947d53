// The inner loop of the quantized matrix-vector kernels (matvec.cu): a weight row as stored (a
// GGUF block format, F32 / F16 / BF16, or FP8-E4M3 with optional DeepSeek-V3 block scales), read
// 8 values at a time through dequant_decode.h's decoders and dotted with up to kMaxTokens
// activation rows. Plain C++ when not compiled by nvcc, so the host tests check the chunk
// addressing (blocks, row tails, scale blocks) without a GPU; a thread of the kernel calls it with
// its own first chunk and the warp's stride.
#pragma once

#include <cstdint>

#include "ops/cuda/dequant_decode.h"

namespace tandem::dequant {

// The column-block scales of one weight row (FP8 with block scales): value c is multiplied by
// row[c / block_cols], block_cols a multiple of 8 (a chunk has one scale). row == nullptr: none.
struct RowScales {
  const float* row = nullptr;
  int64_t block_cols = 1;
};

// Values 8c .. 8c + 7 of a row of `cols` values into v; returns how many are real (fewer at the
// tail of an element-format row; the rest are 0). Block formats: cols is a multiple of the block.
// Each value equals formats/quant.h's dequantize_row (and dequantize_fp8_blocks) bit for bit.
template <typename Fmt>
TD_HD int load_chunk(const uint8_t* row, int64_t c, int64_t cols, RowScales s, float* v) {
  if constexpr (kIsBlockFormat<Fmt>) {
    constexpr int kChunksPerBlock = Fmt::kBlockElems / kChunk;
    Fmt::decode8(row + (c / kChunksPerBlock) * Fmt::kBlockBytes,
                 static_cast<int>(c % kChunksPerBlock), v);
    return kChunk;
  } else {
    const int64_t e0 = c * kChunk;
    const int n = cols - e0 < kChunk ? static_cast<int>(cols - e0) : kChunk;
    const float scale = s.row != nullptr ? s.row[e0 / s.block_cols] : 1.0f;
    TD_UNROLL
    for (int i = 0; i < kChunk; ++i) {
      v[i] = i < n ? Fmt::load(row + (e0 + i) * Fmt::kBytes) : 0.0f;
      if (s.row != nullptr) v[i] = mul_rn(v[i], scale);
    }
    return n;
  }
}

// Chunks of a row of `cols` values.
TD_HD int64_t row_chunks(int64_t cols) {
  return (cols + kChunk - 1) / kChunk;
}

// acc[j] += sum over chunks c = c0, c0 + step, ... of row . x_j over those chunks' columns, for
// the nt <= kMaxTokens activation rows x_j = x + j * ldx (F32).
template <typename Fmt, int kMaxTokens>
TD_HD void dot_chunks(const uint8_t* row, int64_t cols, RowScales s, int64_t c0, int64_t step,
                      const float* x, int64_t ldx, int nt, float* acc) {
  const int64_t chunks = row_chunks(cols);
  for (int64_t c = c0; c < chunks; c += step) {
    float v[kChunk];
    const int n = load_chunk<Fmt>(row, c, cols, s, v);
    const float* xc = x + c * kChunk;
    TD_UNROLL
    for (int j = 0; j < kMaxTokens; ++j) {
      if (j >= nt) break;
      float sum = 0.0f;
      for (int i = 0; i < n; ++i) sum += v[i] * xc[j * ldx + i];
      acc[j] += sum;
    }
  }
}

}  // namespace tandem::dequant
