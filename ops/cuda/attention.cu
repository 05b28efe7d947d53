// The kernels of ops/cuda/attention.h (the forward's dense part on a GPU).
// Not yet run on a GPU: it builds here (sm_80 to sm_90a); tests/gpu/cuda_ops_test.cpp
// checks it against the CPU on a device and skips without one.
#include <algorithm>
#include <cmath>

#include "ops/cuda/attention.h"
#include "ops/cuda/dequant_decode.h"

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

// The KV cache's element types: F32 as computed, BF16 and F16 as uint16_t bits, written and read
// with dequant_decode.h's conversions (the CPU cache's bits: core/fp_convert.h); Q8_0 rows as
// int8 values after their blocks' F32 scales (read here, written by kv_write_q8_kernel). load:
// value i of the row whose values start at `row`.
struct F32Cache {
  using T = float;
  static __device__ float load(const T* row, int64_t i) { return row[i]; }
  static __device__ T store(float v) { return v; }
};
struct Bf16Cache {
  using T = uint16_t;
  static __device__ float load(const T* row, int64_t i) { return dequant::bf16_to_f32(row[i]); }
  static __device__ T store(float v) { return dequant::f32_to_bf16(v); }
};
struct F16Cache {
  using T = uint16_t;
  static __device__ float load(const T* row, int64_t i) { return dequant::f16_to_f32(row[i]); }
  static __device__ T store(float v) { return dequant::f32_to_f16(v); }
};
struct Q8Cache {
  using T = int8_t;
  static __device__ float load(const T* row, int64_t i) { return dequant::q8_cache_load(row, i); }
};

template <typename C>
__global__ void kv_write_kernel(typename C::T* dst, const int64_t* __restrict__ offsets,
                                const float* __restrict__ src, int64_t src_stride, int64_t d) {
  const int64_t r = blockIdx.x;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) {
    dst[offsets[r] + i] = C::store(src[r * src_stride + i]);
  }
}

// Q8_0 rows of d values: a warp per block of 32 (its largest magnitude and finiteness shared by
// shuffles), lane 0 writing the block's scale before the values; the row's padding zeroed.
__global__ void kv_write_q8_kernel(int8_t* dst, const int64_t* __restrict__ offsets,
                                   const float* __restrict__ src, int64_t src_stride, int64_t d) {
  const int64_t r = blockIdx.x;
  int8_t* values = dst + offsets[r];
  const float* x = src + r * src_stride;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t b0 = static_cast<int64_t>(warp) * 32; b0 < d; b0 += kThreads) {
    const int64_t i = b0 + lane;
    const float v = i < d ? x[i] : 0.0f;
    float amax = fabsf(v);
    for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const bool finite = __all_sync(0xffffffffu, i >= d || isfinite(v));
    const float scale = dequant::q8_cache_scale(amax, finite);
    if (i < d) {
      values[i] = dequant::q8_cache_value(v, dequant::q8_cache_inverse(scale, finite), finite);
    }
    if (lane == 0) reinterpret_cast<float*>(values)[-1 - b0 / 32] = scale;
  }
  for (int64_t i = d + threadIdx.x; i < (d + 3) / 4 * 4; i += kThreads) values[i] = 0;
}

// Elements (bytes for Q8_0) between a position's KV heads (ops::k_head_stride's rule).
__host__ __device__ inline int64_t head_stride(int64_t head, int64_t d, bool q8) {
  return head != 0 ? head : q8 ? 4 * ((d + 31) / 32) + (d + 3) / 4 * 4 : d;
}

__device__ int64_t kv_row(const ops::AttentionArgs& a, int64_t s, int64_t stride, int64_t block) {
  if (a.blocks == nullptr) return s * stride;
  return static_cast<int64_t>(a.blocks[s / a.block_positions]) * block +
         (s % a.block_positions) * stride;
}

// One block per (token, head): scores of every key it attends to into its scratch row, the
// softmax (with the head's sink), then the value sums, a thread per output value.
template <typename C>
__global__ void attention_kernel(ops::AttentionArgs a, const typename C::T* kc,
                                 const typename C::T* vc, float* scores, int64_t max_keys) {
  const int64_t t = blockIdx.x / a.n_heads, h = blockIdx.x % a.n_heads;
  const int64_t g = h / (a.n_heads / a.n_kv_heads);
  const int64_t pos = a.pos0 + t;
  const int64_t lo = a.window > 0 && pos >= a.window ? pos - a.window + 1 : 0;
  const int64_t n = pos + 1 - lo;
  const bool q8 = a.k8 != nullptr;
  const int64_t kh = head_stride(a.k_head, a.dk, q8), vh = head_stride(a.v_head, a.dv, q8);
  const float* q = a.q + t * a.q_stride + h * a.dk;
  float* sc = scores + static_cast<int64_t>(blockIdx.x) * max_keys;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    const typename C::T* k = kc + kv_row(a, lo + j, a.k_stride, a.k_block) + g * kh;
    float d = 0.0f;
    for (int64_t i = 0; i < a.dk; ++i) d += q[i] * C::load(k, i);
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
      acc += sc[j] * inv * C::load(vc + kv_row(a, lo + j, a.v_stride, a.v_block) + g * vh, i);
    }
    out[i] = acc;
  }
}

// ---- decode: the keys split across blocks, a block's heads sharing each key it reads ----
//
// Grid (token, KV head x head group, split): a block runs kSplitWarps query heads of one KV
// head (a warp each) over one split of the token's keys. It stages kSplitKeys key rows (and value
// rows, unless the values are the keys' leading dv floats, as MLA's latent cache has them) in
// shared memory, so each row is read from memory once per kSplitWarps heads instead of once per
// head: MLA's 128 heads share one latent row. Each warp keeps the online softmax of its head (max,
// sum, dv / 32 output values per lane) and writes it unnormalised; attention_combine_kernel then
// merges the splits (with the head's sink) into the output.
constexpr int kSplitWarps = 8;
constexpr int kSplitKeys = 16;
constexpr int kSplitMaxDk = 576;             // q values per lane: kSplitMaxDk / 32
constexpr int kSplitMaxDv = 512;             // output values per lane: kSplitMaxDv / 32
constexpr int kSplitSmemFloats = 12 * 1024;  // 48 KiB, the default limit
constexpr int kSplitMaxTokens = 8;           // decode; longer chunks take attention_kernel
constexpr int64_t kSplitMinKeys = 64;        // keys per split at least

// Whether the value rows are the key rows' first dv floats (MLA's latent cache: one KV head,
// KvCache::attention_args gives it the keys' pointer and strides).
__host__ __device__ inline bool values_in_keys(const ops::AttentionArgs& a) {
  const bool q8 = a.k8 != nullptr;
  const int64_t kh = head_stride(a.k_head, a.dk, q8), vh = head_stride(a.v_head, a.dv, q8);
  const void* k = a.k != nullptr     ? static_cast<const void*>(a.k)
                  : a.k16 != nullptr ? static_cast<const void*>(a.k16)
                                     : static_cast<const void*>(a.k8);
  const void* v = a.v != nullptr     ? static_cast<const void*>(a.v)
                  : a.v16 != nullptr ? static_cast<const void*>(a.v16)
                                     : static_cast<const void*>(a.v8);
  return k == v && a.v_stride == a.k_stride && a.v_block == a.k_block && a.dv <= a.dk &&
         (a.n_kv_heads == 1 || kh == vh);
}

// Split `split` of n_splits over a token's keys [0, keys): the keys cut into as many runs of at
// least kSplitMinKeys as there are splits (at most), the splits past them empty. Computed in
// the kernel from the keys it reads, so one launch shape serves every position (a graph's
// replays).
__host__ __device__ inline void split_range(int64_t keys, int n_splits, int split, int64_t* s0,
                                            int64_t* s1) {
  const int64_t most = (keys + kSplitMinKeys - 1) / kSplitMinKeys;
  const int64_t used = most < n_splits ? (most > 1 ? most : 1) : n_splits;
  const int64_t len = (keys + used - 1) / used;
  *s0 = split * len;
  *s1 = (split + 1) * len < keys ? (split + 1) * len : keys;
}

template <typename C>
__global__ void attention_split_kernel(ops::AttentionArgs a, const int64_t* pos0_at,
                                       const typename C::T* kc, const typename C::T* vc,
                                       int n_splits, int head_groups, float* part) {
  extern __shared__ float smem[];
  const int64_t t = blockIdx.x;
  const int64_t g = blockIdx.y / head_groups, hg = blockIdx.y % head_groups;
  const int split = static_cast<int>(blockIdx.z);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t per_kv = a.n_heads / a.n_kv_heads;
  const int64_t hl = hg * kSplitWarps + warp;  // head within the KV head's group
  const bool active = hl < per_kv;
  const int64_t h = g * per_kv + (active ? hl : 0);
  const int64_t pos0 = pos0_at != nullptr ? *pos0_at : a.pos0;
  const int64_t pos = pos0 + t;
  const int64_t lo = a.window > 0 && pos >= a.window ? pos - a.window + 1 : 0;
  int64_t r0 = 0, r1 = 0;
  split_range(pos0 + a.n_tokens, n_splits, split, &r0, &r1);
  const int64_t s0 = max(lo, r0), s1 = min(pos + 1, r1);
  const bool q8 = a.k8 != nullptr;
  const int64_t kh = head_stride(a.k_head, a.dk, q8), vh = head_stride(a.v_head, a.dv, q8);
  const bool shared_v = values_in_keys(a);
  float* ks = smem;                                        // [kSplitKeys][dk]
  float* vs = shared_v ? smem : smem + kSplitKeys * a.dk;  // [kSplitKeys][dk or dv]
  const int64_t v_row = shared_v ? a.dk : a.dv;
  constexpr int kQ = kSplitMaxDk / 32, kO = kSplitMaxDv / 32;
  float q[kQ], o[kO];
  const float* qh = a.q + t * a.q_stride + h * a.dk;
#pragma unroll
  for (int i = 0; i < kQ; ++i) {
    const int64_t d = lane + 32 * i;
    q[i] = d < a.dk ? qh[d] : 0.0f;
  }
#pragma unroll
  for (int i = 0; i < kO; ++i) o[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int64_t c0 = s0; c0 < s1; c0 += kSplitKeys) {
    const int nk = static_cast<int>(s1 - c0 < kSplitKeys ? s1 - c0 : kSplitKeys);
    __syncthreads();  // (the previous chunk's rows are no longer read)
    for (int j = warp; j < nk; j += kSplitWarps) {  // a warp per row: coalesced reads
      const typename C::T* kr = kc + kv_row(a, c0 + j, a.k_stride, a.k_block) + g * kh;
      for (int64_t d = lane; d < a.dk; d += 32) ks[j * a.dk + d] = C::load(kr, d);
      if (!shared_v) {
        const typename C::T* vr = vc + kv_row(a, c0 + j, a.v_stride, a.v_block) + g * vh;
        for (int64_t d = lane; d < a.dv; d += 32) vs[j * a.dv + d] = C::load(vr, d);
      }
    }
    __syncthreads();
    if (!active) continue;
    float sc[kSplitKeys];
    float cmax = -INFINITY;
#pragma unroll
    for (int j = 0; j < kSplitKeys; ++j) {
      if (j >= nk) break;
      float d = 0.0f;
#pragma unroll
      for (int i = 0; i < kQ; ++i) {
        const int64_t e = lane + 32 * i;
        if (e < a.dk) d += q[i] * ks[j * a.dk + e];
      }
      for (int off = 16; off > 0; off /= 2) d += __shfl_xor_sync(0xffffffffu, d, off);
      sc[j] = d * a.scale;
      cmax = fmaxf(cmax, sc[j]);
    }
    const float m_new = fmaxf(m, cmax);
    const float corr = expf(m - m_new);  // (0 for the first chunk: m = -inf)
    l *= corr;
#pragma unroll
    for (int i = 0; i < kO; ++i) o[i] *= corr;
#pragma unroll
    for (int j = 0; j < kSplitKeys; ++j) {
      if (j >= nk) break;
      const float p = expf(sc[j] - m_new);
      l += p;
#pragma unroll
      for (int i = 0; i < kO; ++i) {
        const int64_t e = lane + 32 * i;
        if (e < a.dv) o[i] += p * vs[j * v_row + e];
      }
    }
    m = m_new;
  }
  if (!active) return;
  // part: per (token, head, split): max, sum, then dv output values.
  float* pr = part + ((t * a.n_heads + h) * n_splits + split) * (a.dv + 2);
  if (lane == 0) {
    pr[0] = m;
    pr[1] = l;
  }
#pragma unroll
  for (int i = 0; i < kO; ++i) {
    const int64_t e = lane + 32 * i;
    if (e < a.dv) pr[2 + e] = o[i];
  }
}

// One block per (token, head): out = sum_s o_s e^(m_s - M) / (sum_s l_s e^(m_s - M) + e^(sink -
// M)), M the largest of the splits' maxima and the sink. An empty split has m = -inf, l = 0.
__global__ void attention_combine_kernel(ops::AttentionArgs a, int n_splits, const float* part) {
  const int64_t th = blockIdx.x, h = th % a.n_heads;
  const float* pr = part + th * n_splits * (a.dv + 2);
  const float sink = a.sinks != nullptr ? a.sinks[h] : -INFINITY;
  float mx = sink;
  for (int s = 0; s < n_splits; ++s) mx = fmaxf(mx, pr[s * (a.dv + 2)]);
  float den = a.sinks != nullptr ? expf(sink - mx) : 0.0f;
  for (int s = 0; s < n_splits; ++s) {
    const float ms = pr[s * (a.dv + 2)];
    if (ms != -INFINITY) den += pr[s * (a.dv + 2) + 1] * expf(ms - mx);
  }
  const float inv = 1.0f / den;
  float* out = a.out + th * a.dv;
  for (int64_t i = threadIdx.x; i < a.dv; i += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
      const float ms = pr[s * (a.dv + 2)];
      if (ms != -INFINITY) acc += pr[s * (a.dv + 2) + 2 + i] * expf(ms - mx);
    }
    out[i] = acc * inv;
  }
}

// How attention_cuda runs a: splits of the keys (> 0: the split kernels, a block per split
// whatever the keys, split_range cutting them) or 0 (one block per token and head,
// attention_kernel).
struct SplitPlan {
  int splits = 0, head_groups = 0;
};

SplitPlan split_plan(const ops::AttentionArgs& a) {
  SplitPlan p;
  const bool shared_v = values_in_keys(a);
  const int64_t smem = kSplitKeys * (a.dk + (shared_v ? 0 : a.dv));
  if (a.n_tokens > kSplitMaxTokens || a.dk > kSplitMaxDk || a.dv > kSplitMaxDv ||
      smem > kSplitSmemFloats) {
    return p;
  }
  const int64_t per_kv = a.n_heads / a.n_kv_heads;
  p.head_groups = static_cast<int>((per_kv + kSplitWarps - 1) / kSplitWarps);
  // Enough blocks to fill a large GPU twice over (~132 multiprocessors); a short context leaves
  // most of them empty (split_range).
  const int64_t base = a.n_tokens * a.n_kv_heads * p.head_groups;
  p.splits = static_cast<int>((264 + base - 1) / base);
  return p;
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

cudaError_t kv_write_cuda(DType type, void* dst, const int64_t* row_offsets, int64_t n_rows,
                          const float* src, int64_t src_stride, int64_t d, cudaStream_t stream) {
  if (n_rows < 0 || d <= 0 || src_stride < d || n_rows >= kMaxGrid) return cudaErrorInvalidValue;
  if (type != DType::kF32 && type != DType::kBF16 && type != DType::kF16 && type != DType::kQ8_0) {
    return cudaErrorInvalidValue;
  }
  if (n_rows == 0) return cudaSuccess;
  const auto grid = static_cast<unsigned>(n_rows);
  if (type == DType::kQ8_0) {
    kv_write_q8_kernel<<<grid, kThreads, 0, stream>>>(static_cast<int8_t*>(dst), row_offsets, src,
                                                      src_stride, d);
  } else if (type == DType::kF32) {
    kv_write_kernel<F32Cache>
        <<<grid, kThreads, 0, stream>>>(static_cast<float*>(dst), row_offsets, src, src_stride, d);
  } else if (type == DType::kBF16) {
    kv_write_kernel<Bf16Cache><<<grid, kThreads, 0, stream>>>(static_cast<uint16_t*>(dst),
                                                              row_offsets, src, src_stride, d);
  } else {
    kv_write_kernel<F16Cache><<<grid, kThreads, 0, stream>>>(static_cast<uint16_t*>(dst),
                                                             row_offsets, src, src_stride, d);
  }
  return cudaGetLastError();
}

int64_t attention_scratch_floats(const ops::AttentionArgs& a) {
  const SplitPlan p = split_plan(a);
  if (p.splits > 0) return a.n_tokens * a.n_heads * p.splits * (a.dv + 2);
  return a.n_tokens * a.n_heads * (a.pos0 + a.n_tokens);
}

namespace {

template <typename C>
cudaError_t launch_attention(const ops::AttentionArgs& a, const int64_t* pos0,
                             const typename C::T* k, const typename C::T* v, float* scores,
                             cudaStream_t stream) {
  const SplitPlan p = split_plan(a);
  if (p.splits > 0) {
    const int64_t smem = kSplitKeys * (a.dk + (values_in_keys(a) ? 0 : a.dv)) * 4;
    const dim3 grid(static_cast<unsigned>(a.n_tokens),
                    static_cast<unsigned>(a.n_kv_heads * p.head_groups),
                    static_cast<unsigned>(p.splits));
    attention_split_kernel<C><<<grid, kSplitWarps * 32, static_cast<size_t>(smem), stream>>>(
        a, pos0, k, v, p.splits, p.head_groups, scores);
    attention_combine_kernel<<<static_cast<unsigned>(a.n_tokens * a.n_heads), kThreads, 0,
                               stream>>>(a, p.splits, scores);
    return cudaGetLastError();
  }
  attention_kernel<C><<<static_cast<unsigned>(a.n_tokens * a.n_heads), kThreads, 0, stream>>>(
      a, k, v, scores, a.pos0 + a.n_tokens);
  return cudaGetLastError();
}

}  // namespace

bool attention_cuda_splits(const ops::AttentionArgs& a) {
  return split_plan(a).splits > 0;
}

cudaError_t attention_cuda(const ops::AttentionArgs& a, float* scores, int64_t scores_floats,
                           cudaStream_t stream, const int64_t* device_pos0) {
  const bool f32 = a.k != nullptr && a.v != nullptr && a.k16 == nullptr;
  const bool b16 = a.k == nullptr && a.k16 != nullptr && a.v16 != nullptr && a.k8 == nullptr;
  const bool q8 = a.k == nullptr && a.k16 == nullptr && a.k8 != nullptr && a.v8 != nullptr;
  if ((!f32 && !b16 && !q8) || a.n_tokens < 0 || a.n_heads <= 0 || a.n_kv_heads <= 0 ||
      a.n_heads % a.n_kv_heads != 0 || a.dk <= 0 || a.dv <= 0 || a.pos0 < 0 || a.window < 0 ||
      (a.blocks != nullptr && a.block_positions <= 0) ||
      scores_floats < attention_scratch_floats(a) || a.n_tokens * a.n_heads >= kMaxGrid) {
    return cudaErrorInvalidValue;
  }
  if (a.n_tokens == 0) return cudaSuccess;
  if (device_pos0 != nullptr && !attention_cuda_splits(a)) return cudaErrorInvalidValue;
  if (f32) return launch_attention<F32Cache>(a, device_pos0, a.k, a.v, scores, stream);
  if (q8) return launch_attention<Q8Cache>(a, device_pos0, a.k8, a.v8, scores, stream);
  if (a.f16) return launch_attention<F16Cache>(a, device_pos0, a.k16, a.v16, scores, stream);
  return launch_attention<Bf16Cache>(a, device_pos0, a.k16, a.v16, scores, stream);
}

}  // namespace tandem
