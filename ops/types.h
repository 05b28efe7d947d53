// The types every backend's ops share: a weight matrix in its stored dtype, and the arguments of
// attention over a KV cache (contiguous or paged, in any of the cache's element types). They hold
// pointers and strides only, no backend's types, so the same forward can hand them to the CPU
// kernels or to an accelerator whose memory holds the weights and the cache.
#pragma once

#include <cstdint>
#include <limits>

#include "core/tensor.h"

namespace tandem::ops {

// A weight matrix in its stored dtype, plus DeepSeek-V3 style FP8 block scales when it has them:
// value[r][c] = fp8[r][c] * scale_inv[(row0 + r) / block_rows][c / block_cols].
struct Weight {
  Tensor t;
  const float* scale_inv = nullptr;  // F32 [ceil(R / block_rows), scale_cols]; nullptr: none
  int64_t scale_cols = 0, block_rows = 0, block_cols = 0;
  int64_t row0 = 0;  // first row of t within the scaled matrix (row views of kv_b, experts)

  Weight() = default;
  Weight(const Tensor& tensor) : t(tensor) {}  // NOLINT: a plain tensor is an unscaled weight
  int64_t rows() const { return t.rows(); }
  int64_t cols() const { return t.row_elems(); }
  bool empty() const { return t.data == nullptr; }
  // Rows [r0, r0 + n) as a 2-D weight (scales follow). (Defined with the CPU reference ops.)
  Weight row_range(int64_t r0, int64_t n) const;
};

// Q8_0 cache rows. A row of d values is q8_lead_bytes(d) bytes of F32 block scales, the scale of
// block b (values 32 b ..) 4 (b + 1) bytes before the values (reverse order: a kernel finds it
// from the values' address alone), then the d int8 values, padded to a multiple of 4 bytes.
constexpr int64_t kQ8Block = 32;
inline int64_t q8_lead_bytes(int64_t d) { return 4 * ((d + kQ8Block - 1) / kQ8Block); }
inline int64_t q8_row_bytes(int64_t d) { return q8_lead_bytes(d) + (d + 3) / 4 * 4; }

// Causal attention over a KV cache. Query token t sits at position pos0 + t and attends to cached
// positions 0..pos0+t (with a sliding window of w: the last w of them, pos0+t-w+1..pos0+t). Query
// head h uses KV head h / (n_heads / n_kv_heads). out is [n_tokens, n_heads, dv]; q is
// [n_tokens, n_heads, dk] with q_stride floats between tokens. With sinks (gpt-oss), head h's
// softmax has one more term in its denominator, e^(sinks[h] - m) (m the maximum over the scaled
// scores and sinks[h]): a key whose value is zero.
//
// Where a row is: K of cached position s and KV head g is at
//   k + kv_offset(s, k_stride, k_block) + g * k_head
// (k_head 0: dk, the heads side by side in a position's row; a head-major cache, each KV head's
// positions together, sets it); V likewise with v_stride, v_block, v_head and dv.
// - Contiguous (blocks == nullptr): kv_offset = s * stride.
// - Paged (a KvCache): positions come in blocks of block_positions (a power of two, a multiple of
//   kKvBlockAlign); position s is row s % block_positions of block blocks[s / block_positions],
//   and blocks are k_block / v_block elements apart: kv_offset = blocks[s / B] * block +
//   (s % B) * stride. Within a block the layout is a contiguous cache's (k_head applies there).
//
// The element: F32 (k / v), or a 16-bit cache (k16 / v16 set instead, strides in elements):
// - BF16: the scores are the dot products of the query rounded to BF16 (to nearest even) with the
//   keys, the value sums those of the values widened to F32 (kern::attention below AVX-512 BF16;
//   with those instructions the probabilities are rounded to BF16 for the value sums too:
//   attention_bf16_segments);
// - F16 (f16): F32 attention on the cache widened, the query as it is.
// A Q8_0 cache (k8 / v8 set instead; strides in bytes): every KV head's row of d values is
// q8_row_bytes(d) bytes, its blocks' scales then its values (q8_quantize: llama.cpp's Q8_0
// blocks of 32 with F32 scales); k8 / v8 point at position 0's first head's values, head g's at
// g * q8_row_bytes(dk) (dv) bytes from there. F32 attention on the cache dequantized
// (q8_value), the query as it is.
struct AttentionArgs {
  const float* q = nullptr;
  int64_t q_stride = 0;
  int64_t n_tokens = 0, n_heads = 0, n_kv_heads = 0, dk = 0, dv = 0;
  const float* k = nullptr;
  const float* v = nullptr;
  const uint16_t* k16 = nullptr;  // BF16 bits, or F16 with f16
  const uint16_t* v16 = nullptr;
  bool f16 = false;
  const int8_t* k8 = nullptr;  // Q8_0 rows (the values of each head's row; scales before them)
  const int8_t* v8 = nullptr;
  int64_t k_stride = 0, v_stride = 0;
  int64_t k_head = 0, v_head = 0;  // between KV heads (0: dk / dv; Q8_0: q8_row_bytes)
  // Paged: the sequence's block table (blocks[i] holds positions [i B, (i + 1) B)), B, and the
  // distance between blocks; blocks == nullptr: contiguous.
  const int32_t* blocks = nullptr;
  int64_t block_positions = 0;
  int64_t k_block = 0, v_block = 0;
  int64_t pos0 = 0;
  float scale = 1.0f;
  int64_t window = 0;            // sliding window (keys per query, itself included); 0: all
  const float* sinks = nullptr;  // [n_heads] logits (unscaled), or nullptr: none
  float* out = nullptr;
};

// Head h's sink logit; -infinity (a term e^-inf = 0: no sink) without sinks.
inline float sink_of(const AttentionArgs& a, int64_t h) {
  return a.sinks != nullptr ? a.sinks[h] : -std::numeric_limits<float>::infinity();
}

// The first cached position a query at position `pos` attends to.
inline int64_t first_key(const AttentionArgs& a, int64_t pos) {
  return a.window > 0 && pos >= a.window ? pos - a.window + 1 : 0;
}

// A paged cache's block_positions is a multiple of this: the kernels read values in runs of up
// to 64 consecutive positions (kern::attention's chunks), which then never cross a block.
inline constexpr int64_t kKvBlockAlign = 64;

// Elements (bytes for Q8_0) from the cache's base pointer to position s's row, KV head 0.
inline int64_t kv_offset(const AttentionArgs& a, int64_t s, int64_t stride, int64_t block) {
  if (a.blocks == nullptr) return s * stride;
  return static_cast<int64_t>(a.blocks[s / a.block_positions]) * block +
         (s % a.block_positions) * stride;
}
inline int64_t k_offset(const AttentionArgs& a, int64_t s) {
  return kv_offset(a, s, a.k_stride, a.k_block);
}
inline int64_t v_offset(const AttentionArgs& a, int64_t s) {
  return kv_offset(a, s, a.v_stride, a.v_block);
}

// Elements (bytes for Q8_0) between a position's KV heads: k_head / v_head, or the rows side by
// side.
inline int64_t k_head_stride(const AttentionArgs& a) {
  return a.k_head != 0 ? a.k_head : a.k8 != nullptr ? q8_row_bytes(a.dk) : a.dk;
}
inline int64_t v_head_stride(const AttentionArgs& a) {
  return a.v_head != 0 ? a.v_head : a.v8 != nullptr ? q8_row_bytes(a.dv) : a.dv;
}

}  // namespace tandem::ops
