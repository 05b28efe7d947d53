// Internal interface between kernels.cpp (dispatch) and the per-ISA translation units of the
// GGUF / dense kernels (kern_gguf_<isa>.cpp, each compiled for its ISA; see
// ops/cpu/CMakeLists.txt).
#pragma once

#include <cstdint>

namespace tandem {
struct BlockQ8_K;
}
namespace tandem::ops {
struct AttentionArgs;
}

namespace tandem::kern::detail {

// One call: rows [n0, n1) of a weight whose row r starts at w + r * row_bytes, against
// `tokens` activation rows (act + t * act_row_bytes), writing y[t * ldy + r].
struct GemmArgs {
  const uint8_t* w = nullptr;
  int64_t row_bytes = 0;
  int64_t cols = 0;
  const uint8_t* act = nullptr;
  int64_t act_row_bytes = 0;
  int64_t tokens = 0;
  int64_t n0 = 0, n1 = 0;
  float* y = nullptr;
  int64_t ldy = 0;
};

using GemmFn = void (*)(const GemmArgs& args);

// A Q8_0 activation row: its nb blocks, then (from the next 64-byte boundary) three arrays of
// nbp = nb rounded up to 16 entries, zero past nb:
//   int32 -128 * (sum of the block's 32 quants): the AVX-512 VNNI kernels read weights as q + 128
//         (or q + 16, q + 8) unsigned bytes and subtract this bias, 16 blocks per vector
//         (kern_gguf_vnni.cpp);
//   F32 the block scale d (the stored F16, widened);
//   F32 s = F16(d * sum(q)) widened, with d the unrounded amax / 127: ggml's block_q8_1 `s`, the
//         activation side of the Q4_1 / Q5_1 min term (block_q8_1's d and qs equal block_q8_0's).
// Filled once per activation row by quantize_activations; gathering whole rows carries it along.
inline int64_t q8_0_act_aux_offset(int64_t nb) {
  return (nb * 34 + 63) / 64 * 64;  // 34 = sizeof(BlockQ8_0) (static_assert in formats/quant.h)
}
inline int64_t q8_0_act_padded_blocks(int64_t nb) {
  return (nb + 15) / 16 * 16;
}
inline int64_t q8_0_act_row_bytes(int64_t nb) {
  return q8_0_act_aux_offset(nb) + q8_0_act_padded_blocks(nb) * 12;
}
// The s array of the activation row starting at `row` (nb blocks).
inline const float* q8_0_act_sums(const uint8_t* row, int64_t nb) {
  return reinterpret_cast<const float*>(row + q8_0_act_aux_offset(nb) +
                                        q8_0_act_padded_blocks(nb) * 8);
}

// The kernels one ISA level provides (nullptr: not specialised at this level).
struct GgufKernels {
  GemmFn q4_k = nullptr;  // Q4_K x Q8_K
  GemmFn q5_k = nullptr;  // Q5_K x Q8_K
  GemmFn q6_k = nullptr;  // Q6_K x Q8_K
  GemmFn q8_0 = nullptr;  // Q8_0 x Q8_0
  GemmFn f32 = nullptr;   // F32 x F32
  GemmFn f16 = nullptr;   // F16 x F32
  GemmFn bf16 = nullptr;  // BF16 x BF16 (F32 accumulation)
  GemmFn q5_0 = nullptr;  // Q5_0 x Q8_0
  GemmFn q4_0 = nullptr;  // Q4_0 x Q8_0
  GemmFn q4_1 = nullptr;  // Q4_1 x Q8_0 (+ the s array: ggml's Q8_1)
  GemmFn q5_1 = nullptr;  // Q5_1 x Q8_0 (+ s)
  GemmFn q2_k = nullptr;  // Q2_K x Q8_K
  GemmFn q3_k = nullptr;  // Q3_K x Q8_K
  // Q4_K x16 tiles (q4k_x16.h) x Q8_K: g.w the tiles, g.row_bytes a GGUF row's bytes (a tile is
  // 16 of them), g.n0 a multiple of 16. Only the AVX-512 VNNI table has it; kern::gemm runs the
  // lower levels and the reference through each tile's rows unpacked (the same bits).
  GemmFn q4_kx16 = nullptr;
  // Q5_0 / Q8_0 rows in the x4 layout (q0_x4.h) x Q8_0: only the AVX-512 VNNI table has them, where
  // the CPU has VBMI and BITALG; kern::gemm runs the others through the rows unpacked.
  GemmFn q5_0x4 = nullptr;
  GemmFn q8_0x4 = nullptr;
  GemmFn mxfp4 = nullptr;  // MXFP4 x Q8_0
};

const GgufKernels& gguf_kernels_scalar();
const GgufKernels& gguf_kernels_avx2();
const GgufKernels& gguf_kernels_avx512();       // AVX-512 F/BW/VL/DQ
const GgufKernels& gguf_kernels_avx512_vnni();  // + VNNI and BF16 (+ VBMI / BITALG kernels
                                                // where the CPU has them)
const GgufKernels& gguf_kernels_avx512_vnni_base();  // the same without the VBMI / BITALG ones

// Activation rows on AVX-512 (quant_act_avx512.cpp) and AVX2, bit-identical to the scalar
// quantizers: nb Q8_K blocks of x; a Q8_0 activation row of cols values with its bias / scale
// arrays.
void quantize_q8_k_avx512(const float* x, BlockQ8_K* y, int64_t nb);
void quantize_q8_0_act_avx512(const float* x, uint8_t* dst, int64_t cols);
void quantize_q8_k_avx2(const float* x, BlockQ8_K* y, int64_t nb);  // quant_act_avx2.cpp
void quantize_q8_0_act_avx2(const float* x, uint8_t* dst, int64_t cols);

// Q5_0 / Q4_0 / Q4_1 / Q5_1 / Q8_0 x Q8_0 for fewer than 16 tokens on AVX-512 VNNI + VBMI + BITALG
// (kern_q0_vbmi.cpp; the caller checks the CPU): bit-identical to the VNNI rows and tiles.
void q5_0_rows_vbmi(const GemmArgs& g);
void q4_0_rows_vbmi(const GemmArgs& g);
void mxfp4_rows_vbmi(const GemmArgs& g);  // (the quad kernel, nibbles through the E2M1 table)
void q4_1_rows_vbmi(const GemmArgs& g);
void q5_1_rows_vbmi(const GemmArgs& g);
void q8_0_rows_vbmi(const GemmArgs& g);
void q5_0x4_rows_vbmi(const GemmArgs& g);  // the same on rows in the x4 layout (q0_x4.h)
void q8_0x4_rows_vbmi(const GemmArgs& g);

// Rows [g.n0, g.n1) of an x4 matrix of stored format `stored` (kQ5_0 / kQ8_0; q0_x4.cpp): a few
// rows at a time unpacked into GGUF blocks in a thread-local buffer, then `rows` (that format's
// kernel) on them: the same bits as the x4 kernels.
void q0_x4_through_rows(const GemmArgs& g, int stored_format, GemmFn rows);

// kern::attention on AVX-512 (attention_avx512.cpp): the keys in segments of kSegment positions
// aligned to position 0, each segment's softmax numerators and value sums folded into the output
// in segment order.
inline constexpr int64_t kSegment = 256;
// x[i] = e^(scale * x[i] - m), m = max scale * x; *m_out = m, *l_out = the sum of the e (a
// segment's softmax numerators; e^x within 2 ulp of std::exp).
void segment_exp_avx512(float* x, int64_t n, float scale, float* m_out, float* l_out);
// The three below read an F32 cache, or a 16-bit (a.k16) or Q8_0 (a.k8) one with its rows
// widened / dequantized as loaded (F16, Q8_0; BF16 on AVX-512 without BF16: ops::attention's
// contract within F32 rounding).
// The task (query token t, KV head group g): scores needs group * kSegment floats, dummy dv
// (written, never read). Heads [hb, he) of the group only (0 <= hb < he <= group).
void attention_task_avx512(const ops::AttentionArgs& a, int64_t t, int64_t g, int64_t hb,
                           int64_t he, float* scores, float* dummy);
// Query tokens [t0, t1) of KV head g where every head has its own keys (group 1): the tokens
// share each key block as a group's heads do (each token's outputs are the bits the one-token
// task gives). scores needs (t1 - t0) * kSegment floats.
void attention_tokens_avx512(const ops::AttentionArgs& a, int64_t t0, int64_t t1, int64_t g,
                             float* scores, float* dummy);
// One query token and one KV group (a.n_tokens == a.n_kv_heads == 1; n_ctx = pos0 + 1, segs =
// ceil(n_ctx / kSegment)) in two steps, each splittable over threads, with the task's bits:
// segments [seg_begin, seg_end) of every head, their value sums unscaled into
// partial[(seg * n_heads + h) * dv ..] and (m_s, l_s) into stats[(seg * n_heads + h) * 2 ..];
// then every segment folded in order into the outputs of heads [h_begin, h_end).
void decode_segments_avx512(const ops::AttentionArgs& a, int64_t seg_begin, int64_t seg_end,
                            float* partial, float* stats);
void decode_fold_avx512(const ops::AttentionArgs& a, const float* partial, const float* stats,
                        int64_t h_begin, int64_t h_end);
// The three above over a BF16 cache (a.k16, a.v16; attention_bf16.cpp, AVX-512 BF16): scores by
// vdpbf16ps on the queries rounded to BF16, value sums by vdpbf16ps on the probabilities
// rounded to BF16; partial and stats as above, folded by decode_fold_avx512.
void attention_task_bf16(const ops::AttentionArgs& a, int64_t t, int64_t g, int64_t hb,
                         int64_t he, float* scores, float* dummy);
void attention_tokens_bf16(const ops::AttentionArgs& a, int64_t t0, int64_t t1, int64_t g,
                           float* scores, float* dummy);
void decode_segments_bf16(const ops::AttentionArgs& a, int64_t seg_begin, int64_t seg_end,
                          float* partial, float* stats);
// kern::gemm_f32_kn on AVX-512 (attention_avx512.cpp): n a multiple of 64.
void gemm_f32_kn_avx512(const float* a, int64_t lda, int64_t m, const float* b, int64_t k,
                        int64_t n, float* c, int64_t ldc);

}  // namespace tandem::kern::detail
