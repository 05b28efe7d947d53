// The Gated DeltaNet's ops (Qwen3-Next / Qwen3.5 linear-attention layers): the causal depthwise
// convolution over a window of earlier inputs, the L2 normalization of queries and keys, the
// decay and the update strength from the layer's projections, the gated delta rule in its
// recurrent form (token by token: decode) and its chunked form (chunks of 64 tokens with the
// triangular solve: prefill), and the gated RMSNorm of the output.
//
// The delta rule for one value head, with state S [dk][dv] (key index by value index, as
// transformers and fla keep it), log decay g <= 0 and strength beta in (0, 1):
//   S = e^g S;  d = beta (v - S^T k);  S = S + k d^T;  o = S^T q
// q and k are L2-normalized per head, q also scaled by 1 / sqrt(dk).
//
// ops:: holds the references (the formulas as transformers writes them, one token after the
// other). kern:: holds the kernels: every product a chain of fused multiply-adds over its
// reduction index in increasing order, vectorized over the output's contiguous index, so the
// scalar level (Isa::kScalar) and the AVX2 / AVX-512 levels give the same bits; the chunked
// form differs from the recurrent one by rounding only (tests/unit/ops_delta_net_test.cpp).
#pragma once

#include <cstdint>

#include "core/cpu_features.h"

namespace tandem::ops {

// One value head over n tokens. Token t's query is q + t * q_stride (dk values), its key
// k + t * k_stride, value v + t * v_stride (dv values), decay g[t * g_stride], strength
// beta[t * beta_stride]; its output goes to out + t * out_stride (dv values).
struct DeltaRuleArgs {
  int64_t n = 0;
  int64_t dk = 0, dv = 0;
  const float* q = nullptr;
  int64_t q_stride = 0;
  const float* k = nullptr;
  int64_t k_stride = 0;
  const float* v = nullptr;
  int64_t v_stride = 0;
  const float* g = nullptr;
  int64_t g_stride = 1;
  const float* beta = nullptr;
  int64_t beta_stride = 1;
  float* state = nullptr;  // [dk][dv], read and updated
  float* out = nullptr;
  int64_t out_stride = 0;
};

// transformers' torch_recurrent_gated_delta_rule for one head, F32.
void delta_rule_reference(const DeltaRuleArgs& a);

// x[0..n) *= 1 / max(||x||, eps), the sum of squares in double (ggml_l2_norm).
void l2_normalize(float* x, int64_t n, float eps);

// softplus(x) = ln(1 + e^x), as ggml computes it (x itself above 20).
float softplus(float x);
float sigmoid(float x);

// The causal depthwise convolution with SiLU, per channel c of `channels`:
//   out[t][c] = silu(sum_j w[c][j] x_{t - K + 1 + j}[c]),  j in [0, K)
// where x_{-K+1} .. x_{-1} are window [K - 1][channels] (the inputs before token 0, oldest
// first), updated to the last K - 1 inputs. w is [channels][K] as the checkpoints store it.
void conv_silu_reference(const float* w, int64_t K, int64_t channels, float* window,
                         const float* x, int64_t x_stride, int64_t n, float* out,
                         int64_t out_stride);

}  // namespace tandem::ops

namespace tandem::kern {

// The recurrent form: token by token, the state read and written twice per token.
void delta_rule_recurrent(const ops::DeltaRuleArgs& a, Isa isa = best_isa());

// The chunked form (the WY representation with a triangular solve, as transformers'
// torch_chunk_gated_delta_rule and fla's chunk kernels): chunks of kDeltaChunk tokens whose
// boundaries fall on multiples of kDeltaChunk of the sequence position (pos0: the first token's),
// so a sequence fed in pieces cut at such multiples gives the bits of one call.
inline constexpr int64_t kDeltaChunk = 64;
void delta_rule_chunked(const ops::DeltaRuleArgs& a, int64_t pos0, Isa isa = best_isa());

// ops::conv_silu_reference's arithmetic (the same bits), the taps transposed: wt [K][channels].
void conv_silu(const float* wt, int64_t K, int64_t channels, float* window, const float* x,
               int64_t x_stride, int64_t n, float* out, int64_t out_stride, Isa isa = best_isa());

namespace detail {
void delta_rule_recurrent_avx2(const ops::DeltaRuleArgs& a);
void delta_rule_recurrent_avx512(const ops::DeltaRuleArgs& a);
void delta_rule_chunked_avx2(const ops::DeltaRuleArgs& a, int64_t pos0);
void delta_rule_chunked_avx512(const ops::DeltaRuleArgs& a, int64_t pos0);
void conv_avx2(const float* wt, int64_t K, int64_t channels, const float* in, int64_t n,
               float* out, int64_t out_stride);
void conv_avx512(const float* wt, int64_t K, int64_t channels, const float* in, int64_t n,
                 float* out, int64_t out_stride);
}  // namespace detail

}  // namespace tandem::kern
