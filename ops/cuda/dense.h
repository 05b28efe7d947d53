// Host launchers for the F32 kernels an accelerator's expert FFN and matmul are made of besides
// the weight products (matvec.h): the product with a dequantized weight's transpose, the gated
// activation (SwiGLU, or gpt-oss's clamped form with biases), and the scaled write / accumulate
// of an output with an optional bias. Each is asynchronous on `stream`, never throws, and returns
// cudaErrorInvalidValue for a bad size (checked before any launch). Device pointers throughout.
// Numbers: F32 arithmetic as ops/cpu/ref_ops.h computes it, with the sums of the product in
// another order (warp-wide partial sums): equal to the CPU reference within F32 rounding, not
// bit for bit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem {

// y[t * ldy + c] = sum_r w[r * cols + c] * x[t * ldx + r], for c < cols, t < n: the product with
// w's transpose (DeepSeek's W_UK as Hugging Face stores it, [qk_nope, kv_lora]).
cudaError_t matmul_t_f32_cuda(const float* w, int64_t rows, int64_t cols, const float* x,
                              int64_t ldx, int64_t n, float* y, int64_t ldy, cudaStream_t stream);

// Qwen2-MoE's shared-expert gate: out[t][i] *= sigmoid(x[t] . g), n rows of h values.
cudaError_t sigmoid_gate_rows_cuda(const float* x, const float* g, int64_t n, int64_t h, float* out,
                                   cudaStream_t stream);

// For each of n rows of ff values: g = act(g + gate_bias) * (u + up_bias), in place in g. limit
// <= 0: act = silu, no clamp (biases may be null); limit > 0: gpt-oss's (ops::glu_with_extras):
// a = min(g + gb, limit), b = clamp(u + ub, -limit, limit), g = a * sigmoid(alpha a) * (b + 1).
cudaError_t glu_cuda(float* g, const float* u, int64_t n, int64_t ff, const float* gate_bias,
                     const float* up_bias, float limit, float alpha, cudaStream_t stream);

// out[t][i] (+)= scale[t] * (src[t][i] + bias[i]) for n rows of cols (scale, bias: null = 1, 0).
cudaError_t scale_rows_cuda(const float* src, int64_t n, int64_t cols, const float* bias,
                            const float* scale, float* out, bool accumulate, cudaStream_t stream);

// The n rows of cols values at x (row stride ldx) as three BF16 matrices [n, cols] at out, out +
// n * cols and out + 2 n * cols (dequant::split_bf16x3: their sum is x): F32 activations for
// three tensor-core products with BF16 weights.
cudaError_t split_bf16x3_cuda(const float* x, int64_t ldx, int64_t n, int64_t cols, uint16_t* out,
                              cudaStream_t stream);

// out[i] += a[i], count values.
cudaError_t add_cuda(const float* a, float* out, int64_t count, cudaStream_t stream);

}  // namespace tandem
