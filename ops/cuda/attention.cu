#include <cmath>

#include "ops/cuda/attention.h"

namespace tandem {

namespace {

constexpr int kThreads = 128;

// The sum (op = 0) or maximum (op = 1) of v over the block; every thread gets the result.
__device__ float block_reduce(float v, int op) {
  __shared__ float part[kThreads / 32];
  for (int o = 16; o > 0; o /= 2) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = op == 0 ? v + w : fmaxf(v, w);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // (part is reused by consecutive calls)
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? part[lane] : (op == 0 ? 0.0f : -INFINITY);
  for (int o = 16; o > 0; o /= 2) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = op == 0 ? v + w : fmaxf(v, w);
  }
  return v;
}

__global__ void rms_norm_kernel(const float* x, int64_t x_stride, const float* __restrict__ w,
                                int64_t n, float eps, float* out, int64_t out_stride) {
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * x_stride;
  float* o = out + static_cast<int64_t>(blockIdx.x) * out_stride;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) ss += xr[i] * xr[i];
  ss = block_reduce(ss, 0);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  __syncthreads();  // (every read of x before an aliased write)
  for (int64_t i = threadIdx.x; i < n; i += kThreads) o[i] = xr[i] * inv * w[i];
}

__global__ void rope_kernel(float* x, int64_t n_heads, int64_t token_stride, int64_t head_stride,
                            int64_t offset, int64_t dim, const float* __restrict__ cs,
                            const float* __restrict__ sn, bool neox) {
  const int64_t t = blockIdx.x, half = dim / 2;
  for (int64_t j = threadIdx.x; j < n_heads * half; j += kThreads) {
    const int64_t h = j / half, i = j % half;
    float* base = x + t * token_stride + h * head_stride + offset;
    float* a = neox ? base + i : base + 2 * i;
    float* b = neox ? base + i + half : base + 2 * i + 1;
    const float c = cs[t * half + i], s = sn[t * half + i];
    const float x0 = *a, x1 = *b;
    *a = x0 * c - x1 * s;
    *b = x0 * s + x1 * c;
  }
}

__global__ void kv_write_kernel(float* dst, const int64_t* __restrict__ offsets,
                                const float* __restrict__ src, int64_t src_stride, int64_t d) {
  const int64_t r = blockIdx.x;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) dst[offsets[r] + i] = src[r * src_stride + i];
}

__device__ int64_t kv_row(const ops::AttentionArgs& a, int64_t s, int64_t stride, int64_t block) {
  if (a.blocks == nullptr) return s * stride;
  return static_cast<int64_t>(a.blocks[s / a.block_positions]) * block +
         (s % a.block_positions) * stride;
}

// One block per (token, head): scores of every key it attends to into its scratch row, the
// softmax (with the head's sink), then the value sums, a thread per output value.
__global__ void attention_kernel(ops::AttentionArgs a, float* scores, int64_t max_keys) {
  const int64_t t = blockIdx.x / a.n_heads, h = blockIdx.x % a.n_heads;
  const int64_t g = h / (a.n_heads / a.n_kv_heads);
  const int64_t pos = a.pos0 + t;
  const int64_t lo = a.window > 0 && pos >= a.window ? pos - a.window + 1 : 0;
  const int64_t n = pos + 1 - lo;
  const int64_t kh = a.k_head != 0 ? a.k_head : a.dk, vh = a.v_head != 0 ? a.v_head : a.dv;
  const float* q = a.q + t * a.q_stride + h * a.dk;
  float* sc = scores + static_cast<int64_t>(blockIdx.x) * max_keys;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    const float* k = a.k + kv_row(a, lo + j, a.k_stride, a.k_block) + g * kh;
    float d = 0.0f;
    for (int64_t i = 0; i < a.dk; ++i) d += q[i] * k[i];
    d *= a.scale;
    sc[j] = d;
    mx = fmaxf(mx, d);
  }
  mx = block_reduce(mx, 1);
  const float sink = a.sinks != nullptr ? a.sinks[h] : -INFINITY;
  mx = fmaxf(mx, sink);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    const float e = expf(sc[j] - mx);
    sc[j] = e;
    sum += e;
  }
  sum = block_reduce(sum, 0);
  if (a.sinks != nullptr) sum += expf(sink - mx);
  const float inv = 1.0f / sum;
  __syncthreads();  // (every probability written before any is read)
  float* out = a.out + (t * a.n_heads + h) * a.dv;
  for (int64_t i = threadIdx.x; i < a.dv; i += kThreads) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      acc += sc[j] * inv * a.v[kv_row(a, lo + j, a.v_stride, a.v_block) + g * vh + i];
    }
    out[i] = acc;
  }
}

constexpr int64_t kMaxGrid = int64_t{1} << 31;

}  // namespace

cudaError_t rms_norm_cuda(const float* x, int64_t x_stride, const float* w, int64_t rows, int64_t n,
                          float eps, float* out, int64_t out_stride, cudaStream_t stream) {
  if (rows < 0 || n <= 0 || x_stride < n || out_stride < n || rows >= kMaxGrid) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  rms_norm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, x_stride, w, n, eps, out,
                                                                        out_stride);
  return cudaGetLastError();
}

cudaError_t rope_cuda(float* x, int64_t n_tokens, int64_t token_stride, int64_t n_heads,
                      int64_t head_stride, int64_t offset, int64_t dim, const float* cos,
                      const float* sin, bool neox, cudaStream_t stream) {
  if (n_tokens < 0 || n_heads < 0 || dim <= 0 || dim % 2 != 0 || offset < 0 ||
      n_tokens >= kMaxGrid) {
    return cudaErrorInvalidValue;
  }
  if (n_tokens == 0 || n_heads == 0) return cudaSuccess;
  rope_kernel<<<static_cast<unsigned>(n_tokens), kThreads, 0, stream>>>(
      x, n_heads, token_stride, head_stride, offset, dim, cos, sin, neox);
  return cudaGetLastError();
}

cudaError_t kv_write_f32_cuda(float* dst, const int64_t* row_offsets, int64_t n_rows,
                              const float* src, int64_t src_stride, int64_t d,
                              cudaStream_t stream) {
  if (n_rows < 0 || d <= 0 || src_stride < d || n_rows >= kMaxGrid) return cudaErrorInvalidValue;
  if (n_rows == 0) return cudaSuccess;
  kv_write_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, stream>>>(dst, row_offsets, src,
                                                                          src_stride, d);
  return cudaGetLastError();
}

int64_t attention_scratch_floats(const ops::AttentionArgs& a) {
  return a.n_tokens * a.n_heads * (a.pos0 + a.n_tokens);
}

cudaError_t attention_f32_cuda(const ops::AttentionArgs& a, float* scores, int64_t scores_floats,
                               cudaStream_t stream) {
  if (a.k == nullptr || a.v == nullptr || a.k16 != nullptr || a.k8 != nullptr || a.n_tokens < 0 ||
      a.n_heads <= 0 || a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0 || a.dk <= 0 ||
      a.dv <= 0 || a.pos0 < 0 || a.window < 0 || (a.blocks != nullptr && a.block_positions <= 0) ||
      scores_floats < attention_scratch_floats(a) || a.n_tokens * a.n_heads >= kMaxGrid) {
    return cudaErrorInvalidValue;
  }
  if (a.n_tokens == 0) return cudaSuccess;
  attention_kernel<<<static_cast<unsigned>(a.n_tokens * a.n_heads), kThreads, 0, stream>>>(
      a, scores, a.pos0 + a.n_tokens);
  return cudaGetLastError();
}

}  // namespace tandem
