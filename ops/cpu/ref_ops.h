// Reference CPU ops for the model forward: F32 activations and accumulation, weights read in the
// dtype they are stored in (GGUF blocks, BF16, F16, ...) one row at a time through
// dequantize_row into a small per-thread scratch, so no weight is ever dequantized whole.
//
// These are the correctness baseline the fast kernels are checked against, not the fast path.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "formats/model_config.h"
#include "ops/types.h"

namespace tandem {
class ThreadPool;
}

namespace tandem::ops {

// Row r of w as F32 (into scratch unless w is unscaled F32).
const float* weight_row(const Weight& w, int64_t r, std::vector<float>& scratch);

// y[t][n] = sum_k x[t][k] * w[n][k] for t < n_tokens: w is [N, K] (or any tensor whose rows are
// K long), x is [n_tokens, K], y is [n_tokens, N]. Rows of w are split into tasks on `pool`
// (nullptr: the calling thread only).
void matmul(const Weight& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool);

// y[t][k] = sum_n x[t][n] * w[n][k]: the transposed product (w^T x), used where a checkpoint
// stores a matrix the other way round (GGUF attn_k_b vs HF kv_b_proj). Single-threaded.
void matmul_transposed(const Weight& w, const float* x, int64_t n_tokens, float* y);

// out[i] = table row ids[i]; throws Error(kOutOfRange) for an id outside the table.
void embedding(const Tensor& table, const int32_t* ids, int64_t n, float* out);

// Whole tensor (small: norms, biases) to F32.
std::vector<float> to_f32(const Tensor& t);

// out = x / rms(x) * w over n values (out may alias x).
void rms_norm(const float* x, const float* w, int64_t n, float eps, float* out);

// out = (x - mean(x)) / sqrt(var(x) + eps) * w + b over n values (out may alias x): the
// LayerNorm of DeepSeek Sparse Attention's indexer key.
void layer_norm(const float* x, const float* w, const float* b, int64_t n, float eps, float* out);

// x (n values, a power of two) times the orthonormal Walsh-Hadamard matrix (entries
// (-1)^popcount(i & j) / sqrt(n); its own inverse), in place: the rotation the indexer applies to
// its queries and keys (llama.cpp's attn_rot_k). Butterflies, then the scale.
void hadamard(float* x, int64_t n);

// DeepSeek Sparse Attention's score of one key: sum_h w[h] * relu(dot[h]) over the heads in
// order, from the query heads' dot products with the key. Shared by the reference and the kernel.
inline float index_score(const float* dot, const float* w, int64_t heads) {
  float s = 0.0f;
  for (int64_t h = 0; h < heads; ++h) s = std::fma(w[h], dot[h] > 0.0f ? dot[h] : 0.0f, s);
  return s;
}

// The indexer's scores of one query against the first n keys of a cache (the key fields of
// AttentionArgs: k / k16 / k8, paged or not; dk the key's size): out[s] = index_score over
// q_h . k_s for the heads' queries q [heads, dk] and weights w [heads]; each dot product one
// fused multiply-add chain from element 0 (kern::index_scores's bits). The reference.
void index_scores(const AttentionArgs& keys, const float* q, const float* w, int64_t heads,
                  int64_t n, float* out);

void softmax(float* x, int64_t n);  // in place, max-subtracted
// softmax with one more term e^(sink - m) in the denominator (m = max(x, sink)): gpt-oss's
// attention sinks. A sink of -infinity gives softmax's bits.
void softmax_with_sink(float* x, int64_t n, float sink);
// out[i] = silu(gate[i]) * up[i], silu(x) = x * sigmoid(x) (defined at the end)
void swiglu(const float* gate, const float* up, int64_t n, float* out);

// What gpt-oss's experts add to the SwiGLU FFN: biases after the gate, up and down products, and
// the clamped activation (limit > 0, ModelConfig::swiglu_limit): g = min(gate, limit),
// u = clamp(up, -limit, limit), out = g * sigmoid(1.702 g) * (u + 1), as llama.cpp's
// swiglu_oai computes it.
struct FfnExtras {
  const float* gate_bias = nullptr;  // [ff], or nullptr
  const float* up_bias = nullptr;    // [ff]
  const float* down_bias = nullptr;  // [hidden]
  float limit = 0.0f;                // 0: silu(gate) * up
  bool any() const {
    return gate_bias != nullptr || up_bias != nullptr || down_bias != nullptr || limit > 0.0f;
  }
};
inline constexpr float kSwigluOaiAlpha = 1.702f;
// In place over one row's columns [c0, c0 + n) of the gate / up products: gate[i] becomes the
// activation of (gate[i] + gate_bias[c0 + i], up[i] + up_bias[c0 + i]).
void glu_with_extras(float* gate, const float* up, int64_t n, int64_t c0, const FfnExtras& e);
// y[i] += down_bias[r0 + i] for one row's outputs [r0, r0 + n) (nothing without a down bias).
void add_down_bias(float* y, int64_t n, int64_t r0, const FfnExtras& e);

// The SwiGLU FFN of n rows of x: y = down(swiglu(gate x, up x)), each product by matmul (the
// reference: weights read in their stored dtype), with gpt-oss's extras when given. *g and *u:
// scratch, grown to n x gate.rows(). (kern::swiglu_ffn is the same FFN on the fast kernels.)
void swiglu_ffn(const Weight& gate, const Weight& up, const Weight& down, const float* x,
                int64_t n, float* y, ThreadPool* pool, std::vector<float>* g,
                std::vector<float>* u, const FfnExtras& extras = {});

// kNeox rotates pairs (x[i], x[i + d/2]) (HF rotate_half, llama.cpp NEOX); kInterleaved rotates
// (x[2i], x[2i+1]) (llama.cpp NORM, DeepSeek's interleaved q_pe / k_pe).
enum class RopeForm { kNeox, kInterleaved };

// Rotary embedding frequencies for `dim` rotated values: plain theta^(-2i/dim), linear scaling
// (divided by factor) or YaRN as DeepSeek does it (ramp between interpolated and extrapolated
// frequencies, cos/sin scaled by mscale(factor, mscale) / mscale(factor, mscale_all_dim)).
class Rope {
 public:
  Rope() = default;
  Rope(int64_t dim, float theta, const RopeScaling& scaling);
  int64_t dim() const { return dim_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  float cos_sin_scale() const { return cos_sin_scale_; }
  // Multiplier on the attention softmax scale: mscale(factor, mscale_all_dim)^2 for YaRN.
  float softmax_scale_factor() const { return softmax_factor_; }
  // Qwen3.5's interleaved multi-section RoPE (ModelConfig::rope_sections) for text positions:
  // pair i takes the token's position unless its section is the fourth (extra) one, whose
  // position is 0 for text (mrope_section_uses_position).
  void set_sections(const std::array<int64_t, 4>& sections);
  // Rotates x[0..dim) of one head at position pos.
  void apply(float* x, int64_t pos, RopeForm form) const;
  // The same in two steps, so a token's heads share one computation of the angles: c and s get
  // dim / 2 values for position pos; rotate() applies them to one head (apply() = both).
  void angles(int64_t pos, float* c, float* s) const;
  void rotate(float* x, const float* c, const float* s, RopeForm form) const;

 private:
  int64_t dim_ = 0;
  std::vector<float> inv_freq_;
  std::vector<uint8_t> zero_pair_;  // pairs of the extra section (angle 0 for text), or empty
  float cos_sin_scale_ = 1.0f;
  float softmax_factor_ = 1.0f;
};

// YaRN's mscale(s, m) = 0.1 m ln(s) + 1, 1 for s <= 1.
float yarn_mscale(float scale, float m);

// Interleaved multi-section RoPE (ggml's GGML_ROPE_TYPE_IMROPE, Qwen3-VL / Qwen3.5): whether
// rotary pair i takes one of the temporal / height / width positions (sector i % sum(sections):
// sector % 3 == 0, 1, 2 within 3 x sections[0], [1], [2]) rather than the extra one.
bool mrope_section_uses_position(const std::array<int64_t, 4>& sections, int64_t pair);

// Causal attention over a KV cache (AttentionArgs, ops/types.h), F32 arithmetic: the reference.
void attention(const AttentionArgs& a, ThreadPool* pool);

// Writes x[0..d) as one row whose values start at `values`: per block (the last one may be
// shorter) scale = max|x| / 127, value = round(x / scale) (halves away from zero; 0 for an
// all-zero block), as ggml's quantize_row_q8_0 with the scale kept in F32. A block holding a
// NaN or an infinity gets a NaN scale (its values read back as NaN, as an F32 cache's would).
void q8_quantize(const float* x, int64_t d, int8_t* values);
// Value i of the row whose values start at `values`: scale * int8, one F32 multiply.
inline float q8_value(const int8_t* values, int64_t i) {
  return reinterpret_cast<const float*>(values)[-1 - i / kQ8Block] * static_cast<float>(values[i]);
}

// The contiguous F32 arguments equal to a's: the cached rows (positions [0, pos0 + n_tokens)) of
// a paged, 16-bit or Q8_0 cache gathered, widened or dequantized into *k and *v, F32 rows of
// n_kv_heads * dk / dv per position (one copy where the keys and values are the same rows), for
// BF16 the queries rounded to BF16 into *q. A contiguous F32 cache's arguments come back as they
// are.
AttentionArgs widen_cache(const AttentionArgs& a, std::vector<float>* q, std::vector<float>* k,
                          std::vector<float>* v);
// The arithmetic of kern::attention over a BF16 cache with the AVX-512 BF16 instructions, in
// double: scores of the queries rounded to BF16 with the keys; per segment of `segment` keys
// from position 0, p = e^(scale x - m_s) against the segment's maximum, l_s = sum p, value sums
// with p rounded to BF16 (vdpbf16ps: the value side in BF16 too); segments folded by
// e^(m_s - M). (The kernel's F32 rounding and its e^x aside, equal; a probability at a BF16
// rounding tie may round the other way, a 2^-8 relative difference in one term.)
void attention_bf16_segments(const AttentionArgs& a, int64_t segment);

// e^x as SiLU needs it, by the SIMD kernels' algorithm so that they give the same bits
// (kern::swiglu): Cephes expf, x = n ln2 + r with n = nearbyint(x log2 e) and r by two fused
// steps (ln 2 = kLn2Hi + kLn2Lo), e^r by a degree-6 polynomial, times 2^n built from n's bits;
// each step one IEEE float operation (the fused ones by std::fma, as vfmadd rounds). Within 2 ulp
// of e^x on [kLow, kHigh]. Below kLow it returns e^kLow (< 2^-125: 1 + e^x is 1 either way, all
// SiLU uses), above kHigh +inf (e^x < FLT_MAX up to 88.72: SiLU of x < -88.3 gives -0 instead of
// a value below 4e-37 in magnitude).
namespace silu_exp {
inline constexpr float kLow = -87.0f, kHigh = 88.3f;  // nearbyint(x log2 e) in [-126, 127]
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
inline constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace silu_exp

inline float exp_for_silu(float x) {
  namespace c = silu_exp;
  const float lo = x > c::kLow ? x : c::kLow;  // vmaxps(x, kLow), then vminps(lo, kHigh)
  const float a = lo < c::kHigh ? lo : c::kHigh;
  const float n = __builtin_nearbyintf(a * c::kLog2e);
  float r = __builtin_fmaf(-n, c::kLn2Hi, a);
  r = __builtin_fmaf(-n, c::kLn2Lo, r);
  float p = c::kP[0];
  for (int i = 1; i < 6; ++i) p = __builtin_fmaf(p, r, c::kP[i]);
  p = __builtin_fmaf(p, r * r, r + 1.0f);
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, 4);
  return x > c::kHigh ? __builtin_inff() : p * scale;
}

// silu(x) = x * sigmoid(x) = x / (1 + e^-x).
inline float silu(float x) {
  return x / (1.0f + exp_for_silu(-x));
}

}  // namespace tandem::ops
