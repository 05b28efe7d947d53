// Launchers for dequant.cuh: argument checks and launch geometry (a runtime DType becomes a kernel
// template argument through dequant_formats.h's visit_format).
// Not yet run on a GPU: it builds here (sm_80 to sm_90a); tests/gpu/cuda_dequant_test.cpp
// checks it against the CPU on a device and skips without one.
#include <algorithm>

#include "ops/cuda/dequant.cuh"
#include "ops/cuda/dequant.h"
#include "ops/cuda/dequant_formats.h"

namespace tandem {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxGridY = 65535;

// A 2-D thread block: x over chunks of a row, y over rows, so rows shorter than 256 chunks share
// one thread block instead of leaving most of it idle (rows are contiguous in practice, so a
// warp spanning several rows still reads and writes contiguous memory).
struct LaunchShape {
  dim3 grid, block;
};

LaunchShape launch_shape(int64_t chunks_per_row, int64_t rows) {
  int tx = 1;
  while (tx < kThreadsPerBlock && tx < chunks_per_row) tx *= 2;
  const int ty = kThreadsPerBlock / tx;
  const int64_t gx = (chunks_per_row + tx - 1) / tx;
  const int64_t gy = std::min((rows + ty - 1) / ty, kMaxGridY);
  return {dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), dim3(tx, ty)};
}

template <typename Out>
cudaError_t launch_rows(DType type, const uint8_t* src, int64_t src_row_bytes,
                        const int32_t* row_ids, int64_t rows, int64_t cols, Out* dst,
                        int64_t dst_row_elems, const float* scale, int64_t scale_row_elems,
                        int64_t block_rows, int64_t block_cols, cudaStream_t stream) {
  cudaError_t status = cudaErrorInvalidValue;
  dequant::visit_format(type, [&](auto tag) {
    using Fmt = typename decltype(tag)::type;
    if constexpr (dequant::kIsBlockFormat<Fmt>) {
      if (scale || cols % Fmt::kBlockElems != 0) return;
      if (src_row_bytes < cols / Fmt::kBlockElems * Fmt::kBlockBytes) return;
      const int64_t chunks = cols / dequant::kChunk;
      const LaunchShape s = launch_shape(chunks, rows);
      dequant::dequantize_blocks_kernel<Fmt, Out><<<s.grid, s.block, 0, stream>>>(
          src, src_row_bytes, row_ids, rows, chunks, dst, dst_row_elems);
    } else {
      if (src_row_bytes < cols * Fmt::kBytes) return;
      const LaunchShape s = launch_shape((cols + dequant::kChunk - 1) / dequant::kChunk, rows);
      dequant::dequantize_elems_kernel<Fmt, Out><<<s.grid, s.block, 0, stream>>>(
          src, src_row_bytes, row_ids, rows, cols, dst, dst_row_elems, scale, scale_row_elems,
          block_rows, block_cols);
    }
    status = cudaGetLastError();
  });
  return status;
}

cudaError_t dispatch_out(DType type, const void* src, int64_t src_row_bytes, const int32_t* row_ids,
                         int64_t rows, int64_t cols, DType out_type, void* dst,
                         int64_t dst_row_elems, const float* scale, int64_t scale_row_elems,
                         int64_t block_rows, int64_t block_cols, cudaStream_t stream) {
  if (rows < 0 || cols < 0 || dst_row_elems < cols || src_row_bytes < 0) {
    return cudaErrorInvalidValue;
  }
  if (out_type != DType::kF32 && out_type != DType::kBF16) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0)
    return cuda_can_dequantize(type) ? cudaSuccess : cudaErrorInvalidValue;
  if (!src || !dst) return cudaErrorInvalidValue;
  const auto* bytes = static_cast<const uint8_t*>(src);
  if (out_type == DType::kF32) {
    return launch_rows(type, bytes, src_row_bytes, row_ids, rows, cols, static_cast<float*>(dst),
                       dst_row_elems, scale, scale_row_elems, block_rows, block_cols, stream);
  }
  return launch_rows(type, bytes, src_row_bytes, row_ids, rows, cols, static_cast<uint16_t*>(dst),
                     dst_row_elems, scale, scale_row_elems, block_rows, block_cols, stream);
}

}  // namespace

bool cuda_can_dequantize(DType type) {
  return dequant::visit_format(type, [](auto) {});
}

cudaError_t dequantize_rows_cuda(DType type, const void* src, int64_t src_row_bytes, int64_t rows,
                                 int64_t cols, DType out_type, void* dst, int64_t dst_row_elems,
                                 cudaStream_t stream) {
  return dispatch_out(type, src, src_row_bytes, nullptr, rows, cols, out_type, dst, dst_row_elems,
                      nullptr, 0, 1, 1, stream);
}

cudaError_t gather_rows_cuda(DType type, const void* src, int64_t src_row_bytes,
                             const int32_t* row_ids, int64_t rows, int64_t cols, float* dst,
                             int64_t dst_row_elems, cudaStream_t stream) {
  if (rows > 0 && row_ids == nullptr) return cudaErrorInvalidValue;
  return dispatch_out(type, src, src_row_bytes, row_ids, rows, cols, DType::kF32, dst,
                      dst_row_elems, nullptr, 0, 1, 1, stream);
}

cudaError_t dequantize_fp8_blocks_cuda(const uint8_t* w, int64_t w_row_bytes,
                                       const float* scale_inv, int64_t scale_row_elems,
                                       int64_t rows, int64_t cols, int64_t block_rows,
                                       int64_t block_cols, DType out_type, void* dst,
                                       int64_t dst_row_elems, cudaStream_t stream) {
  if (block_rows <= 0 || block_cols <= 0 || !scale_inv) return cudaErrorInvalidValue;
  if (scale_row_elems < (cols + block_cols - 1) / block_cols) return cudaErrorInvalidValue;
  return dispatch_out(DType::kF8E4M3, w, w_row_bytes, nullptr, rows, cols, out_type, dst,
                      dst_row_elems, scale_inv, scale_row_elems, block_rows, block_cols, stream);
}

}  // namespace tandem
