// The F32 kernels of ops/cuda/dense.h (an accelerator expert's activation, transposed products
// and scaled writes).
// Not yet run on a GPU: it builds here (sm_80 to sm_90a); tests/gpu/cuda_ops_test.cpp
// checks it against the CPU on a device and skips without one.
#include <cmath>

#include "ops/cuda/dense.h"
#include "ops/cuda/dequant_decode.h"

namespace tandem {

namespace {

constexpr int kWarp = 32;

// A thread per (token, output column): coalesced reads of w's rows across the threads.
__global__ void matmul_t_f32_kernel(const float* __restrict__ w, int64_t rows, int64_t cols,
                                    const float* __restrict__ x, int64_t ldx, int64_t n,
                                    float* __restrict__ y, int64_t ldy) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * cols) return;
  const int64_t t = i / cols, c = i % cols;
  float acc = 0.0f;
  for (int64_t r = 0; r < rows; ++r) acc += w[r * cols + c] * x[t * ldx + r];
  y[t * ldy + c] = acc;
}

__global__ void glu_kernel(float* __restrict__ g, const float* __restrict__ u, int64_t total,
                           int64_t ff, const float* __restrict__ gb, const float* __restrict__ ub,
                           float limit, float alpha) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t c = i % ff;
  float a = g[i] + (gb != nullptr ? gb[c] : 0.0f);
  float b = u[i] + (ub != nullptr ? ub[c] : 0.0f);
  if (limit > 0.0f) {
    a = fminf(a, limit);
    b = fminf(fmaxf(b, -limit), limit);
    g[i] = a / (1.0f + expf(alpha * -a)) * (b + 1.0f);
  } else {
    g[i] = a / (1.0f + expf(-a)) * b;
  }
}

__global__ void scale_rows_kernel(const float* __restrict__ src, int64_t total, int64_t cols,
                                  const float* __restrict__ bias, const float* __restrict__ scale,
                                  float* __restrict__ out, bool accumulate) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t t = i / cols, c = i % cols;
  const float v =
      (src[i] + (bias != nullptr ? bias[c] : 0.0f)) * (scale != nullptr ? scale[t] : 1.0f);
  out[i] = accumulate ? out[i] + v : v;
}

__global__ void sigmoid_gate_kernel(const float* __restrict__ x, const float* __restrict__ g,
                                    int64_t h, float* __restrict__ out) {
  __shared__ float part[kWarp];
  const int64_t t = blockIdx.x;
  float d = 0.0f;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) d += x[t * h + i] * g[i];
  for (int o = kWarp / 2; o > 0; o /= 2) d += __shfl_xor_sync(0xffffffffu, d, o);
  if (threadIdx.x % kWarp == 0) part[threadIdx.x / kWarp] = d;
  __syncthreads();
  if (threadIdx.x < kWarp) {
    d = threadIdx.x < blockDim.x / kWarp ? part[threadIdx.x] : 0.0f;
    for (int o = kWarp / 2; o > 0; o /= 2) d += __shfl_xor_sync(0xffffffffu, d, o);
    if (threadIdx.x == 0) part[0] = 1.0f / (1.0f + expf(-d));
  }
  __syncthreads();
  const float gate = part[0];
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) out[t * h + i] *= gate;
}

__global__ void split_bf16x3_kernel(const float* __restrict__ x, int64_t ldx, int64_t n,
                                    int64_t cols, uint16_t* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * cols) return;
  const int64_t plane = n * cols;
  dequant::split_bf16x3(x[(i / cols) * ldx + i % cols], out + i, out + plane + i,
                        out + 2 * plane + i);
}

__global__ void add_kernel(const float* __restrict__ a, float* __restrict__ out, int64_t count) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] += a[i];
}

constexpr int kThreads = 256;
unsigned blocks_for(int64_t count) {
  return static_cast<unsigned>((count + kThreads - 1) / kThreads);
}
constexpr int64_t kMaxGrid = int64_t{1} << 31;

}  // namespace

cudaError_t glu_cuda(float* g, const float* u, int64_t n, int64_t ff, const float* gate_bias,
                     const float* up_bias, float limit, float alpha, cudaStream_t stream) {
  const int64_t total = n * ff;
  if (n < 0 || ff < 0 || blocks_for(total) >= kMaxGrid) return cudaErrorInvalidValue;
  if (total == 0) return cudaSuccess;
  glu_kernel<<<blocks_for(total), kThreads, 0, stream>>>(g, u, total, ff, gate_bias, up_bias, limit,
                                                         alpha);
  return cudaGetLastError();
}

cudaError_t scale_rows_cuda(const float* src, int64_t n, int64_t cols, const float* bias,
                            const float* scale, float* out, bool accumulate, cudaStream_t stream) {
  const int64_t total = n * cols;
  if (n < 0 || cols < 0 || blocks_for(total) >= kMaxGrid) return cudaErrorInvalidValue;
  if (total == 0) return cudaSuccess;
  scale_rows_kernel<<<blocks_for(total), kThreads, 0, stream>>>(src, total, cols, bias, scale, out,
                                                                accumulate);
  return cudaGetLastError();
}

cudaError_t matmul_t_f32_cuda(const float* w, int64_t rows, int64_t cols, const float* x,
                              int64_t ldx, int64_t n, float* y, int64_t ldy, cudaStream_t stream) {
  if (rows <= 0 || cols < 0 || n < 0 || ldx < rows || ldy < cols ||
      blocks_for(n * cols) >= kMaxGrid) {
    return cudaErrorInvalidValue;
  }
  if (cols == 0 || n == 0) return cudaSuccess;
  matmul_t_f32_kernel<<<blocks_for(n * cols), kThreads, 0, stream>>>(w, rows, cols, x, ldx, n, y,
                                                                     ldy);
  return cudaGetLastError();
}

cudaError_t sigmoid_gate_rows_cuda(const float* x, const float* g, int64_t n, int64_t h, float* out,
                                   cudaStream_t stream) {
  if (n < 0 || h <= 0 || n >= kMaxGrid) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  sigmoid_gate_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, g, h, out);
  return cudaGetLastError();
}

cudaError_t split_bf16x3_cuda(const float* x, int64_t ldx, int64_t n, int64_t cols, uint16_t* out,
                              cudaStream_t stream) {
  if (n < 0 || cols < 0 || ldx < cols || blocks_for(n * cols) >= kMaxGrid) {
    return cudaErrorInvalidValue;
  }
  if (n * cols == 0) return cudaSuccess;
  split_bf16x3_kernel<<<blocks_for(n * cols), kThreads, 0, stream>>>(x, ldx, n, cols, out);
  return cudaGetLastError();
}

cudaError_t add_cuda(const float* a, float* out, int64_t count, cudaStream_t stream) {
  if (count < 0 || blocks_for(count) >= kMaxGrid) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  add_kernel<<<blocks_for(count), kThreads, 0, stream>>>(a, out, count);
  return cudaGetLastError();
}

}  // namespace tandem
