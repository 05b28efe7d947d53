// matvec.h's kernel: a warp per output row, each lane dotting every 32nd chunk of 8 values of the
// row (quant_dot.h) with up to kTokensPerPass activation rows, then a warp-wide sum. Consecutive
// lanes read consecutive chunks, so a warp reads a run of the row's bytes at a time; the weight row
// is read once per pass of kTokensPerPass tokens.
// Not yet run on a GPU: it builds here (sm_80 to sm_90a); tests/gpu/cuda_dequant_test.cpp
// checks it against the CPU on a device and skips without one.
#include "ops/cuda/dequant_formats.h"
#include "ops/cuda/matvec.h"
#include "ops/cuda/quant_dot.h"

namespace tandem {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;  // warps per thread block
constexpr int kTokensPerPass = 8;

template <typename Fmt>
__global__ void matmul_quant_kernel(QuantMatrix w, const float* __restrict__ x, int64_t ldx,
                                    int64_t n, float* __restrict__ y, int64_t ldy) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= w.rows) return;
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
  dequant::RowScales s;
  if (w.scale_inv != nullptr) {
    s.row = w.scale_inv + (r / w.block_rows) * w.scale_row_elems;
    s.block_cols = w.block_cols;
  }
  for (int64_t t0 = 0; t0 < n; t0 += kTokensPerPass) {
    const int nt = static_cast<int>(n - t0 < kTokensPerPass ? n - t0 : kTokensPerPass);
    float acc[kTokensPerPass] = {};
    dequant::dot_chunks<Fmt, kTokensPerPass>(row, w.cols, s, lane, kWarp, x + t0 * ldx, ldx, nt,
                                             acc);
#pragma unroll
    for (int j = 0; j < kTokensPerPass; ++j) {
      if (j >= nt) break;
      float v = acc[j];
      for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) y[(t0 + j) * ldy + r] = v;
    }
  }
}

}  // namespace

bool cuda_can_matvec(DType type) {
  return dequant::visit_format(type, [](auto) {});
}

cudaError_t matmul_quant_cuda(const QuantMatrix& w, const float* x, int64_t ldx, int64_t n,
                              float* y, int64_t ldy, cudaStream_t stream) {
  if (w.rows < 0 || w.cols < 0 || n < 0 || ldx < w.cols || ldy < w.rows) {
    return cudaErrorInvalidValue;
  }
  if (w.scale_inv != nullptr && (w.type != DType::kF8E4M3 || w.block_rows <= 0 ||
                                 w.block_cols <= 0 || w.block_cols % dequant::kChunk != 0 ||
                                 w.scale_row_elems < (w.cols + w.block_cols - 1) / w.block_cols)) {
    return cudaErrorInvalidValue;
  }
  cudaError_t status = cudaErrorInvalidValue;
  dequant::visit_format(w.type, [&](auto tag) {
    using Fmt = typename decltype(tag)::type;
    if constexpr (dequant::kIsBlockFormat<Fmt>) {
      if (w.cols % Fmt::kBlockElems != 0) return;
      if (w.row_bytes < w.cols / Fmt::kBlockElems * Fmt::kBlockBytes) return;
    } else {
      if (w.row_bytes < w.cols * Fmt::kBytes) return;
    }
    if (w.rows == 0 || n == 0) {
      status = cudaSuccess;
      return;
    }
    if (w.data == nullptr || x == nullptr || y == nullptr) return;
    const int64_t blocks = (w.rows + kRowsPerBlock - 1) / kRowsPerBlock;
    if (blocks > 0x7FFFFFFF) return;
    matmul_quant_kernel<Fmt>
        <<<static_cast<unsigned>(blocks), kRowsPerBlock * kWarp, 0, stream>>>(w, x, ldx, n, y, ldy);
    status = cudaGetLastError();
  });
  return status;
}

}  // namespace tandem
