// Host launchers for the kernels of the forward's dense part on a GPU (attention.cu): RMSNorm
// over rows, rotary embedding with a per-token cos / sin table (the host computes it with
// ops::Rope::angles, so YaRN and every scaling are the CPU's numbers), the KV cache's row writes,
// and causal attention over an F32, 16-bit or Q8_0 cache, contiguous or paged (ops::AttentionArgs:
// GQA, sliding windows, gpt-oss's sinks). Asynchronous on `stream`, never throw;
// cudaErrorInvalidValue for arguments they do not support (checked before any launch). Device
// pointers throughout (the AttentionArgs' block table too). F32 arithmetic as ops/cpu/ref_ops.h's,
// sums in another order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "ops/types.h"

namespace tandem {

// out[r * out_stride + i] = x[r * x_stride + i] / rms(x row) * w[i], i < n, for `rows` rows
// (out may alias x).
cudaError_t rms_norm_cuda(const float* x, int64_t x_stride, const float* w, int64_t rows, int64_t n,
                          float eps, float* out, int64_t out_stride, cudaStream_t stream);

// Rotates, for every token t < n_tokens and head h < n_heads, the dim values at
// x + t * token_stride + h * head_stride + offset by cos / sin [t * dim / 2 + i] (ops::Rope::
// rotate's pairs: (i, i + dim / 2) when neox, else (2 i, 2 i + 1)). dim even.
cudaError_t rope_cuda(float* x, int64_t n_tokens, int64_t token_stride, int64_t n_heads,
                      int64_t head_stride, int64_t offset, int64_t dim, const float* cos,
                      const float* sin, bool neox, cudaStream_t stream);

// dst[row_offsets[r] + i] = src[r * src_stride + i], i < d, for n_rows rows: cache rows at element
// offsets the host computed from the cache's block tables, in the cache's element type (kF32; kBF16
// or kF16 as uint16_t bits, rounded to nearest even as the CPU's cache rounds; kQ8_0: dst and the
// offsets in bytes, at each row's values, its block scales written before them, as
// ops::q8_quantize writes them).
cudaError_t kv_write_cuda(DType type, void* dst, const int64_t* row_offsets, int64_t n_rows,
                          const float* src, int64_t src_stride, int64_t d, cudaStream_t stream);

// Floats of scratch attention_cuda needs for a (its scores, or its splits' partial sums).
int64_t attention_scratch_floats(const ops::AttentionArgs& a);

// ops::attention over an F32 cache (a.k / a.v), a 16-bit one (a.k16 / a.v16, F16 with a.f16,
// else BF16; values widened to F32) or a Q8_0 one (a.k8 / a.v8: each value its block's scale times
// the int8, one rounded product, as ops::q8_value), the arithmetic F32, contiguous or paged.
// scores: attention_scratch_floats(a) floats of device memory.
// Decode (up to 8 tokens; dk <= 576, dv <= 512) splits each token's keys across blocks, a block
// running 8 query heads of one KV head over its split with the key rows staged in shared memory
// once for them all (MLA's heads share one latent row: FlashMLA's idea, F32 on CUDA cores), then
// merges the splits' online softmaxes; longer chunks run a block per token and head.
// device_pos0 (optional, device memory): the first position read there when the kernels run
// instead of a.pos0 (a graph's replays); only where attention_cuda_splits(a).
cudaError_t attention_cuda(const ops::AttentionArgs& a, float* scores, int64_t scores_floats,
                           cudaStream_t stream, const int64_t* device_pos0 = nullptr);

// Whether attention_cuda runs a with the split kernels: then its scratch and launch follow from
// a's shape alone (not a.pos0), and it may read the first position from device memory.
bool attention_cuda_splits(const ops::AttentionArgs& a);

}  // namespace tandem
