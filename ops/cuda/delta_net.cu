// The Gated DeltaNet kernels of ops/cuda/delta_net.h.
// Not yet run on a GPU: it builds here (sm_80 to sm_90a); tests/gpu/cuda_delta_net_test.cpp
// checks it against the CPU on a device and skips without one.
#include <cmath>

#include "ops/cuda/delta_net.h"

namespace tandem {

namespace {

constexpr int kThreads = 128;
constexpr int kMaxConv = 8;     // the widest convolution (Qwen3-Next / Qwen3.5: 4)
constexpr int kTokens = 16;     // the delta rule's tokens staged in shared memory at a time
constexpr int kDeltaThreads = 256;
constexpr int64_t kMaxGrid = int64_t{1} << 31;

__device__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void delta_prep_kernel(const float* __restrict__ mixed, int64_t width,
                                  const int32_t* __restrict__ conv_src, int64_t channels,
                                  const int32_t* __restrict__ z_src, int64_t vdim,
                                  const int32_t* __restrict__ beta_src,
                                  const int32_t* __restrict__ alpha_src, const float* __restrict__ a,
                                  const float* __restrict__ dt_bias, int64_t nv,
                                  float* __restrict__ conv_in, float* __restrict__ z,
                                  float* __restrict__ beta, float* __restrict__ g) {
  const int64_t t = blockIdx.x;
  const float* row = mixed + t * width;
  for (int64_t i = threadIdx.x; i < channels; i += blockDim.x) {
    conv_in[t * channels + i] = row[conv_src[i]];
  }
  for (int64_t i = threadIdx.x; i < vdim; i += blockDim.x) z[t * vdim + i] = row[z_src[i]];
  for (int64_t h = threadIdx.x; h < nv; h += blockDim.x) {
    beta[t * nv + h] = sigmoidf(row[beta_src[h]]);
    const float x = row[alpha_src[h]] + dt_bias[h];
    g[t * nv + h] = a[h] * (x > 20.0f ? x : logf(1.0f + expf(x)));
  }
}

// A thread per (segment, channel): the window in registers, the tokens in order.
__global__ void conv_silu_kernel(const float* __restrict__ wt, int K, int64_t channels,
                                 DeltaSegments segs, const float* __restrict__ x,
                                 float* __restrict__ out) {
  const DeltaSegment sg = segs.s[blockIdx.y];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  float w[kMaxConv], win[kMaxConv];
#pragma unroll
  for (int j = 0; j < kMaxConv; ++j) {
    w[j] = j < K ? wt[j * channels + c] : 0.0f;
    win[j] = j < K - 1 ? sg.state[j * channels + c] : 0.0f;
  }
  for (int64_t t = 0; t < sg.n; ++t) {
    const int64_t row = (sg.t0 + t) * channels + c;
    const float xin = x[row];
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxConv; ++j) {
      if (j < K - 1) sum = fmaf(w[j], win[j], sum);
    }
#pragma unroll
    for (int j = 0; j < kMaxConv; ++j) {
      if (j == K - 1) sum = fmaf(w[j], xin, sum);
    }
    out[row] = sum / (1.0f + expf(-sum));
#pragma unroll
    for (int j = 0; j + 1 < kMaxConv; ++j) {
      if (j < K - 2) win[j] = win[j + 1];
      if (j == K - 2) win[j] = xin;
    }
  }
#pragma unroll
  for (int j = 0; j < kMaxConv; ++j) {
    if (j < K - 1) {
      sg.state[j * channels + c] = win[j];
      if (sg.snapshot != nullptr) sg.snapshot[j * channels + c] = win[j];
    }
  }
}

// A warp per (token, head of q or k).
__global__ void l2_normalize_qk_kernel(float* rows, int64_t channels, int64_t nk, int64_t hk,
                                       float eps, float q_scale) {
  const int64_t t = blockIdx.x, head = blockIdx.y;  // heads [0, nk): q; [nk, 2 nk): k
  float* x = rows + t * channels + head * hk;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < hk; i += 32) sum += static_cast<double>(x[i]) * x[i];
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float scale = 1.0f / fmaxf(sqrtf(static_cast<float>(sum)), eps);
  for (int64_t i = threadIdx.x; i < hk; i += 32) {
    const float v = x[i] * scale;
    x[i] = head < nk ? v * q_scale : v;
  }
}

// A block per (segment, value head, kDeltaThreads / P value columns); P threads (adjacent lanes)
// per value column j, each holding
// 32 rows of the state's column S[:, j] in registers (rows past hk zero), their partial sums
// combined across the P lanes; kTokens tokens' queries, keys, decays and strengths staged in
// shared memory at a time (each 32 rows padded to 33 floats: the P lanes of a column read
// different banks).
template <int P>
__global__ void __launch_bounds__(kDeltaThreads) delta_rule_kernel(DeltaRuleShape sh, DeltaSegments segs,
                                  const float* __restrict__ qkv, const float* __restrict__ g,
                                  const float* __restrict__ beta, float* __restrict__ out) {
  constexpr int kRows = 32, kPadded = P * (kRows + 1);
  __shared__ float qs[kTokens][kPadded], ks[kTokens][kPadded], eg[kTokens], bs[kTokens];
  const DeltaSegment sg = segs.s[blockIdx.x];
  const int64_t h = blockIdx.y;
  const int64_t j = blockIdx.z * (kDeltaThreads / P) + threadIdx.x / P, part = threadIdx.x % P;
  const int64_t hk = sh.hk, hv = sh.hv, nv = sh.nv, nk = sh.nk;
  const bool live = j < hv;
  const int64_t kh = sh.tiled ? h % nk : h / (nv / nk);
  const int64_t row0 = part * kRows;  // this thread's first state row
  float* st = sg.state + sh.window + h * hk * hv;
  float s[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) s[r] = live && row0 + r < hk ? st[(row0 + r) * hv + j] : 0.0f;
  for (int64_t t0 = 0; t0 < sg.n; t0 += kTokens) {
    const int64_t m = sg.n - t0 < kTokens ? sg.n - t0 : kTokens;
    __syncthreads();  // (the last tokens' reads are done)
    for (int64_t idx = threadIdx.x; idx < m * P * kRows; idx += blockDim.x) {
      const int64_t tt = idx / (P * kRows), i = idx % (P * kRows);
      const int64_t at = i / kRows * (kRows + 1) + i % kRows;
      const float* row = qkv + (sg.t0 + t0 + tt) * sh.channels + kh * hk;
      qs[tt][at] = i < hk ? row[i] : 0.0f;
      ks[tt][at] = i < hk ? row[nk * hk + i] : 0.0f;
    }
    for (int64_t tt = threadIdx.x; tt < m; tt += blockDim.x) {
      const int64_t r = (sg.t0 + t0 + tt) * nv + h;
      eg[tt] = expf(g[r]);
      bs[tt] = beta[r];
    }
    __syncthreads();
    const int64_t base = part * (kRows + 1);
    for (int64_t tt = 0; tt < m; ++tt) {
      const int64_t t = sg.t0 + t0 + tt;
      const float v = live ? qkv[t * sh.channels + 2 * nk * hk + h * hv + j] : 0.0f;
      float kv = 0.0f;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        s[r] *= eg[tt];
        kv = fmaf(s[r], ks[tt][base + r], kv);
      }
#pragma unroll
      for (int o = P / 2; o > 0; o /= 2) kv += __shfl_xor_sync(0xffffffffu, kv, o);
      const float d = (v - kv) * bs[tt];
      float o = 0.0f;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        s[r] = fmaf(ks[tt][base + r], d, s[r]);
        o = fmaf(s[r], qs[tt][base + r], o);
      }
#pragma unroll
      for (int x = P / 2; x > 0; x /= 2) o += __shfl_xor_sync(0xffffffffu, o, x);
      if (live && part == 0) out[t * nv * hv + h * hv + j] = o;
    }
  }
  if (!live) return;
  float* snap = sg.snapshot != nullptr ? sg.snapshot + sh.window + h * hk * hv : nullptr;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (row0 + r < hk) {
      st[(row0 + r) * hv + j] = s[r];
      if (snap != nullptr) snap[(row0 + r) * hv + j] = s[r];
    }
  }
}

__global__ void sigmoid_mul_kernel(float* __restrict__ out, const float* __restrict__ gate,
                                   int64_t count) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] *= sigmoidf(gate[i]);
}

bool segments_ok(const DeltaSegments& segs) {
  if (segs.count < 0 || segs.count > kDeltaMaxSegments) return false;
  for (int i = 0; i < segs.count; ++i) {
    if (segs.s[i].n < 0 || segs.s[i].t0 < 0 || segs.s[i].state == nullptr) return false;
  }
  return true;
}

}  // namespace

cudaError_t delta_prep_cuda(const float* mixed, int64_t n, int64_t width, const int32_t* conv_src,
                            int64_t channels, const int32_t* z_src, int64_t vdim,
                            const int32_t* beta_src, const int32_t* alpha_src, const float* a,
                            const float* dt_bias, int64_t nv, float* conv_in, float* z,
                            float* beta, float* g, cudaStream_t stream) {
  if (n < 0 || n >= kMaxGrid || width <= 0 || channels <= 0 || vdim < 0 || nv <= 0) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  delta_prep_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
      mixed, width, conv_src, channels, z_src, vdim, beta_src, alpha_src, a, dt_bias, nv, conv_in,
      z, beta, g);
  return cudaGetLastError();
}

cudaError_t conv_silu_cuda(const float* wt, int64_t K, int64_t channels, const DeltaSegments& segs,
                           const float* x, float* out, cudaStream_t stream) {
  if (K < 1 || K > kMaxConv || channels <= 0 || !segments_ok(segs)) return cudaErrorInvalidValue;
  if (segs.count == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((channels + kThreads - 1) / kThreads),
                  static_cast<unsigned>(segs.count));
  conv_silu_kernel<<<grid, kThreads, 0, stream>>>(wt, static_cast<int>(K), channels, segs, x, out);
  return cudaGetLastError();
}

cudaError_t l2_normalize_qk_cuda(float* rows, int64_t n, int64_t channels, int64_t nk, int64_t hk,
                                 float eps, float q_scale, cudaStream_t stream) {
  if (n < 0 || n >= kMaxGrid || nk <= 0 || hk <= 0 || 2 * nk * hk > channels || 2 * nk > 65535) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(2 * nk));
  l2_normalize_qk_kernel<<<grid, 32, 0, stream>>>(rows, channels, nk, hk, eps, q_scale);
  return cudaGetLastError();
}

cudaError_t delta_rule_cuda(const DeltaRuleShape& sh, const DeltaSegments& segs,
                            const float* qkv, const float* g, const float* beta, float* out,
                            cudaStream_t stream) {
  if (sh.nk <= 0 || sh.nv <= 0 || sh.hk <= 0 || sh.hk > 256 || sh.hv <= 0 ||
      sh.nv > 65535 || (!sh.tiled && sh.nv % sh.nk != 0) || sh.window < 0 ||
      sh.channels < 2 * sh.nk * sh.hk + sh.nv * sh.hv || !segments_ok(segs)) {
    return cudaErrorInvalidValue;
  }
  if (segs.count == 0) return cudaSuccess;
  const int64_t p = sh.hk <= 32 ? 1 : sh.hk <= 64 ? 2 : sh.hk <= 128 ? 4 : 8;
  const int64_t columns = kDeltaThreads / p;
  const dim3 grid(static_cast<unsigned>(segs.count), static_cast<unsigned>(sh.nv),
                  static_cast<unsigned>((sh.hv + columns - 1) / columns));
  if (grid.z > 65535) return cudaErrorInvalidValue;
  const unsigned threads = kDeltaThreads;
  switch (p) {
    case 1:
      delta_rule_kernel<1><<<grid, threads, 0, stream>>>(sh, segs, qkv, g, beta, out);
      break;
    case 2:
      delta_rule_kernel<2><<<grid, threads, 0, stream>>>(sh, segs, qkv, g, beta, out);
      break;
    case 4:
      delta_rule_kernel<4><<<grid, threads, 0, stream>>>(sh, segs, qkv, g, beta, out);
      break;
    default:
      delta_rule_kernel<8><<<grid, threads, 0, stream>>>(sh, segs, qkv, g, beta, out);
      break;
  }
  return cudaGetLastError();
}

cudaError_t sigmoid_mul_cuda(float* out, const float* gate, int64_t count, cudaStream_t stream) {
  if (count < 0 || (count + 255) / 256 >= kMaxGrid) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  sigmoid_mul_kernel<<<static_cast<unsigned>((count + 255) / 256), 256, 0, stream>>>(out, gate,
                                                                                     count);
  return cudaGetLastError();
}

}  // namespace tandem
