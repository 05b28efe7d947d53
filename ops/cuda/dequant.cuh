// CUDA kernels that expand quantized weights (GGUF blocks, F16/BF16, FP8-E4M3 with block scales)
// into F32 or BF16 rows, e.g. to feed cuBLAS or to check a quantized kernel. Raw pointers and
// strides only (STYLE.md #8); the launchers that pick the template arguments from a DType are in
// dequant.cu / dequant.h. Values are bit-identical to formats/quant.h (see dequant_decode.h).
//
// Work split: one thread decodes one chunk of 8 consecutive values of a row and writes them with
// two 16-byte stores (F32) or one (BF16) when the destination allows. A 2-D thread block covers
// several rows when rows are short, so narrow tensors still fill the block.
#pragma once

#include <cstdint>

#include "ops/cuda/dequant_decode.h"

namespace tandem::dequant {

// Output element types: F32, or BF16 as raw uint16_t bits.
__device__ __forceinline__ void store_value(float* dst, float v) {
  *dst = v;
}
__device__ __forceinline__ void store_value(uint16_t* dst, float v) {
  *dst = f32_to_bf16(v);
}

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Writes n <= 8 values; full, 16-byte-aligned chunks go out as vector stores.
__device__ __forceinline__ void store_chunk(float* dst, const float* v, int n) {
  if (n == kChunk && aligned16(dst)) {
    reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    if (i < n) dst[i] = v[i];
  }
}

__device__ __forceinline__ void store_chunk(uint16_t* dst, const float* v, int n) {
  if (n == kChunk && aligned16(dst)) {
    uint32_t w[4];
    for (int i = 0; i < 4; ++i) {
      w[i] = f32_to_bf16(v[2 * i]) | (static_cast<uint32_t>(f32_to_bf16(v[2 * i + 1])) << 16);
    }
    *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    return;
  }
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    if (i < n) store_value(dst + i, v[i]);
  }
}

// The source row of output row r: row_ids[r] (a gather: an embedding's token rows), or r.
__device__ __forceinline__ int64_t source_row(const int32_t* row_ids, int64_t r) {
  return row_ids != nullptr ? static_cast<int64_t>(row_ids[r]) : r;
}

// Rows of GGUF blocks. Row r starts at src + source_row(r) * src_row_bytes and holds
// chunks_per_row * 8 values (a whole number of blocks); its output starts at
// dst + r * dst_row_elems. Thread (x, y) of the grid handles chunk x of rows y,
// y + gridDim.y * blockDim.y, ...
template <typename Fmt, typename Out>
__global__ void dequantize_blocks_kernel(const uint8_t* __restrict__ src, int64_t src_row_bytes,
                                         const int32_t* __restrict__ row_ids, int64_t rows,
                                         int64_t chunks_per_row, Out* __restrict__ dst,
                                         int64_t dst_row_elems) {
  constexpr int kChunksPerBlock = Fmt::kBlockElems / kChunk;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= chunks_per_row) return;
  const int64_t block = c / kChunksPerBlock;
  const int k = static_cast<int>(c % kChunksPerBlock);
  const int64_t row_step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < rows;
       r += row_step) {
    float v[kChunk];
    Fmt::decode8(src + source_row(row_ids, r) * src_row_bytes + block * Fmt::kBlockBytes, k, v);
    store_chunk(dst + r * dst_row_elems + c * kChunk, v, kChunk);
  }
}

// Reads 8 elements of `kBytes` each into raw bytes, with vector loads when the address allows.
template <int kBytes>
__device__ __forceinline__ void load_elems(const uint8_t* p, int n, uint8_t* raw) {
  constexpr int kTotal = kBytes * kChunk;
  if (n == kChunk && (reinterpret_cast<uintptr_t>(p) & (kTotal >= 16 ? 15 : kTotal - 1)) == 0) {
    if constexpr (kTotal >= 16) {
      for (int i = 0; i < kTotal / 16; ++i) {
        reinterpret_cast<uint4*>(raw)[i] = reinterpret_cast<const uint4*>(p)[i];
      }
    } else {
      *reinterpret_cast<uint2*>(raw) = *reinterpret_cast<const uint2*>(p);
    }
    return;
  }
  // Constant trip count so that `raw` stays in registers.
#pragma unroll
  for (int i = 0; i < kTotal; ++i) {
    if (i < n * kBytes) raw[i] = p[i];
  }
}

// Rows of `cols` plain elements (F32/F16/BF16/FP8), any row length (source rows as above). With
// `scale` (FP8 with block scales, DeepSeek-V3 style; no row_ids) value (r, c) is multiplied by
// scale[(r / block_rows) * scale_row_elems + c / block_cols].
template <typename Fmt, typename Out>
__global__ void dequantize_elems_kernel(const uint8_t* __restrict__ src, int64_t src_row_bytes,
                                        const int32_t* __restrict__ row_ids, int64_t rows,
                                        int64_t cols, Out* __restrict__ dst, int64_t dst_row_elems,
                                        const float* __restrict__ scale, int64_t scale_row_elems,
                                        int64_t block_rows, int64_t block_cols) {
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kChunk;
  if (c0 >= cols) return;
  const int n = cols - c0 < kChunk ? static_cast<int>(cols - c0) : kChunk;
  // Column block of each value, found without a division per value.
  int64_t first_block = 0, next_boundary = INT64_MAX;
  if (scale) {
    first_block = c0 / block_cols;
    next_boundary = (first_block + 1) * block_cols;
  }
  const int64_t row_step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < rows;
       r += row_step) {
    alignas(16) uint8_t raw[Fmt::kBytes * kChunk];
    load_elems<Fmt::kBytes>(src + source_row(row_ids, r) * src_row_bytes + c0 * Fmt::kBytes, n,
                            raw);
    float v[kChunk];
    for (int i = 0; i < kChunk; ++i) v[i] = i < n ? Fmt::load(raw + i * Fmt::kBytes) : 0.0f;
    if (scale) {
      const float* scale_row = scale + (r / block_rows) * scale_row_elems;
      int64_t b = first_block, boundary = next_boundary;
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        if (i >= n) break;
        if (c0 + i == boundary) {
          ++b;
          boundary += block_cols;
        }
        v[i] = mul_rn(v[i], scale_row[b]);
      }
    }
    store_chunk(dst + r * dst_row_elems + c0, v, n);
  }
}

}  // namespace tandem::dequant
