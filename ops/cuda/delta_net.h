// Host launchers for a Gated DeltaNet layer's kernels on a GPU (delta_net.cu; the layer's
// arithmetic is ops/cpu/delta_net.h's, and model/delta_net_layer.cpp runs it on the CPU): the
// split of the input projections into the convolution's input, the gate z, the strength beta and
// the log decay g; the causal convolution with SiLU over each sequence's window; the L2
// normalization of queries and keys; the delta rule token by token over each sequence's state;
// and the sigmoid gate of gated attention's output. Asynchronous on `stream`, never throw;
// cudaErrorInvalidValue for arguments they do not support (checked before any launch). Device
// pointers throughout. F32 arithmetic, sums in the references' order with fused multiply-adds:
// equal to the CPU within F32 rounding.
//
// The convolution and the delta rule run over segments: a sequence's tokens of the step, or a
// piece of them that ends at one of the step's checkpoints, whose state is then copied to the
// checkpoint's slot. A launch runs one segment of each of up to kDeltaMaxSegments sequences; the
// segments of one sequence go in successive launches.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem {

inline constexpr int kDeltaMaxSegments = 32;

struct DeltaSegment {
  int64_t t0 = 0;             // the segment's first token (row of the step's activations)
  int64_t n = 0;              // its tokens (0: only the checkpoint's copy)
  float* state = nullptr;     // the sequence's state of this layer: window, then the matrices
  float* snapshot = nullptr;  // the checkpoint's state of this layer after the segment, or null
};

struct DeltaSegments {
  int count = 0;
  DeltaSegment s[kDeltaMaxSegments];
};

// Per token t < n, from its row of the projections' concatenation (mixed + t * width):
//   conv_in[t][i] = row[conv_src[i]] (i < channels), z[t][i] = row[z_src[i]] (i < vdim),
//   beta[t][h] = sigmoid(row[beta_src[h]]), g[t][h] = a[h] softplus(row[alpha_src[h]] +
//   dt_bias[h]) (h < nv), as ops::sigmoid / ops::softplus.
cudaError_t delta_prep_cuda(const float* mixed, int64_t n, int64_t width, const int32_t* conv_src,
                            int64_t channels, const int32_t* z_src, int64_t vdim,
                            const int32_t* beta_src, const int32_t* alpha_src, const float* a,
                            const float* dt_bias, int64_t nv, float* conv_in, float* z,
                            float* beta, float* g, cudaStream_t stream);

// ops::conv_silu_reference per segment: x rows [n][channels] (the step's, at segment.t0) through
// wt [K][channels] (the taps transposed) into out (same rows), the window [K - 1][channels] at the
// start of segment.state read and updated, and copied to segment.snapshot's start. K <= 8.
cudaError_t conv_silu_cuda(const float* wt, int64_t K, int64_t channels, const DeltaSegments& segs,
                           const float* x, float* out, cudaStream_t stream);

// Each of n rows of `channels` (q: nk heads of hk, then k: nk heads of hk, then the values):
// ops::l2_normalize over every q and k head (the sum of squares in double), q then scaled by
// q_scale.
cudaError_t l2_normalize_qk_cuda(float* rows, int64_t n, int64_t channels, int64_t nk, int64_t hk,
                                 float eps, float q_scale, cudaStream_t stream);

// The delta rule (ops::delta_rule_reference) for every value head h < nv of each segment's
// sequence: token t's query at qkv + t * channels + kh * hk, key at + nk * hk further, value at
// qkv + t * channels + 2 nk hk + h * hv, where kh = tiled ? h % nk : h / (nv / nk); decay
// g[t * nv + h], strength beta[t * nv + h]; output out[t * nv * hv + h * hv ..]. Head h's state
// [hk][hv] is at segment.state + window + h * hk * hv (and so in its snapshot). hk <= 256.
struct DeltaRuleShape {
  int64_t nk = 0, nv = 0, hk = 0, hv = 0;
  int64_t channels = 0;  // a token's row of qkv
  int64_t window = 0;    // floats of the convolution's window before the matrices
  bool tiled = false;
};
cudaError_t delta_rule_cuda(const DeltaRuleShape& shape, const DeltaSegments& segs,
                            const float* qkv, const float* g, const float* beta, float* out,
                            cudaStream_t stream);

// out[i] *= sigmoid(gate[i]), count values (gated attention's output).
cudaError_t sigmoid_mul_cuda(float* out, const float* gate, int64_t count, cudaStream_t stream);

}  // namespace tandem
