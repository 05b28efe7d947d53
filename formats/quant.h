// Quantized weight formats: the GGUF (ggml) block layouts, bit-exact, and the scalar reference
// (de)quantization routines for every DType, plus FP8 E4M3 with separate block scales
// (DeepSeek-V3 checkpoints).
//
// What this is for: loading GGUF / safetensors weights, converting between formats (tandem
// convert, synth) and serving as the reference that SIMD and CUDA kernels are tested against.
// Dequantization reproduces ggml's float arithmetic operation by operation (e.g. Q4_K is
// (d * sc) * q - (dmin * m)), so dequantized weights equal llama.cpp's bit for bit. Quantization
// follows ggml's reference quantizers (the ones llama-quantize uses without an importance
// matrix) so that converting the same F32 weights gives the same bytes.
//
// What it is not for: fast matmuls. Kernels for quantized dot products live in ops/.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace tandem {

inline constexpr int kQK = 32;     // values per block of the legacy types (Q4_0 .. Q8_1)
inline constexpr int kQK_K = 256;  // values per super-block of the K-quants

// IEEE half as stored in blocks (bits, converted with core/fp_convert.h).
using Half = uint16_t;

// x = d * (q - 8), q in 0..15; qs[j] holds element j (low nibble) and j + 16 (high nibble).
struct BlockQ4_0 {
  Half d;
  uint8_t qs[kQK / 2];
};
// x = d * q + m.
struct BlockQ4_1 {
  Half d;
  Half m;
  uint8_t qs[kQK / 2];
};
// x = d * (q - 16), q 5 bits: low nibbles as Q4_0, bit 4 of element j is bit j of qh (LE u32).
struct BlockQ5_0 {
  Half d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
// x = d * q + m, q 5 bits as in Q5_0.
struct BlockQ5_1 {
  Half d;
  Half m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
// x = d * q.
struct BlockQ8_0 {
  Half d;
  int8_t qs[kQK];
};
// x = d * q; s = d * sum(q) (used by dot products with Q4_1 / Q5_1).
struct BlockQ8_1 {
  Half d;
  Half s;
  int8_t qs[kQK];
};
// 16 sub-blocks of 16: x = d * (scales[i] & 15) * q - dmin * (scales[i] >> 4), q 2 bits.
// qs: 2 halves of 128; in each, byte l holds elements l, l+32, l+64, l+96 (bits 0-1, 2-3, ...).
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  Half d;
  Half dmin;
};
// 16 sub-blocks of 16: x = d * (s - 32) * (q - 4 * !hbit), 6-bit scales s packed in 12 bytes,
// q low 2 bits in qs (as Q2_K), the third bit of element j in bit (j / 32) of hmask[j % 32].
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  Half d;
};
// 8 sub-blocks of 32: x = d * sc * q - dmin * m, 6-bit sc / m packed in 12 bytes
// (unpack_scale_min_k4). qs: 4 groups of 64, byte l holds elements l (low) and l+32 (high).
struct BlockQ4_K {
  Half d;
  Half dmin;
  uint8_t scales[12];
  uint8_t qs[kQK_K / 2];
};
// As Q4_K with a fifth bit: bit 2g (low nibbles) / 2g+1 (high nibbles) of qh[l] for group g.
struct BlockQ5_K {
  Half d;
  Half dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
// 16 sub-blocks of 16: x = d * scales[i] * (q - 32), q 6 bits. Per half of 128: ql[l] / ql[l+32]
// hold the low nibbles of elements l, l+32 (low) and l+64, l+96 (high); qh[l] their top 2 bits.
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  Half d;
};
// MXFP4 (OCP microscaling): x = kMxfp4Values[q] * 2^(e - 128) (the table holds twice the E2M1
// values, so the scale is half of E8M0's 2^(e - 127)); element j in the low nibble of qs[j],
// element j + 16 in its high nibble.
struct BlockMXFP4 {
  uint8_t e;
  uint8_t qs[kQK / 2];
};
inline constexpr int8_t kMxfp4Values[16] = {0,  1,  2,  3,  4,  6,  8,  12,
                                             0, -1, -2, -3, -4, -6, -8, -12};
// 2^(e - 128) exactly (ggml's GGML_E8M0_TO_FP32_HALF: denormal for e < 2).
inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? uint32_t{0x00200000} << e : uint32_t(e - 1) << 23;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// Activation format for K-quant dot products: x = d * q, bsums = sums of 16 consecutive q.
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockMXFP4) == 17);

// Scale and min of sub-block j (0..7) of Q4_K / Q5_K: bytes 0-3 hold the low 6 bits of the scales
// of sub-blocks 0-3, bytes 4-7 their mins; bytes 8-11 the low 4 bits of the scale (low nibble)
// and min (high nibble) of sub-blocks 4-7, whose top 2 bits are the top bits of bytes 0-7.
inline void unpack_scale_min_k4(int j, const uint8_t* scales, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// The 16 signed 6-bit scales of a Q3_K block, without the bias of 32 removed (0..63): low nibbles
// of sub-blocks 0-7 in bytes 0-7 (low), 8-15 in bytes 0-7 (high), top 2 bits of sub-block j in
// bits 2 * (j / 4) of byte 8 + j % 4.
inline void unpack_q3_k_scales(const uint8_t* packed, uint8_t out[16]) {
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
    const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = static_cast<uint8_t>(low | (high << 4));
  }
}

// Converts n values of any DType (float, int and block types) to F32; n must be a multiple of the
// block size. F64 and I64 are converted with a C cast (rounded to nearest F32).
void dequantize_row(DType type, const void* src, float* dst, int64_t n);

// Whether quantize_row supports `type` (every float and block type; not the int types).
bool can_quantize(DType type);

// F32 -> type, n a multiple of the block size. Float types round to nearest even (F8E4M3 is
// unscaled and saturates at +-448). Block types use ggml's reference quantizers. Throws
// Error(kUnsupported) for types can_quantize() rejects.
void quantize_row(DType type, const float* src, void* dst, int64_t n);

// DeepSeek-V3 style FP8: weight [rows, cols] E4M3 bytes, scale_inv
// [ceil(rows / block_rows), ceil(cols / block_cols)] F32; value = fp8 * scale_inv[r / br][c / bc].
// (128, 128) blocks for DeepSeek-V3; (1, cols) is one scale per row. Edge blocks may be partial.
void dequantize_fp8_blocks(const uint8_t* w, const float* scale_inv, int64_t rows, int64_t cols,
                           int64_t block_rows, int64_t block_cols, float* dst);

// The inverse: scale = amax / 448 per block (an all-zero block gets scale 1), w = fp8(x / scale).
void quantize_fp8_blocks(const float* src, int64_t rows, int64_t cols, int64_t block_rows,
                         int64_t block_cols, uint8_t* w, float* scale_inv);

// compressed-tensors' pack-quantized INT4 (Kimi-K2-Thinking / K2.5's experts: symmetric, one BF16
// scale per group of `group` values along a row): packed [rows, cols / 8] int32, value i of a row
// in bits 4 (i % 8) of word i / 8 as q + 8; value = q * scale[r][i / group].
// Onto Q4_0 without loss (its x = d * (q - 8) over blocks of 32): group a multiple of 32 (each
// group's scale repeated over its blocks) and every scale exact as an F16. Returns false, with the
// first scale that is not in *bad_scale, where one is not (nothing useful is then in out).
bool int4_groups_to_q4_0(const int32_t* packed, const uint16_t* scales_bf16, int64_t rows,
                         int64_t cols, int64_t group, BlockQ4_0* out, float* bad_scale);
// The writer's side, as compressed-tensors quantizes: scale = amax / 7.5 per group (BF16; an
// all-zero group gets 1), q = clamp(round(x / scale), -8, 7).
void quantize_int4_groups(const float* src, int64_t rows, int64_t cols, int64_t group,
                          int32_t* packed, uint16_t* scales_bf16);

// GPTQ's symmetric INT4 (AutoGPTQ / GPTQModel checkpoints: Qwen3-30B-A3B-GPTQ-Int4, ...), a
// weight [rows, cols] (out, in) stored transposed: qweight [cols / 8, rows] int32, value (r, k) in
// bits 4 (k % 8) of qweight[k / 8][r] as q; scales [cols / group, rows] F16; the zero point 8;
// value = (q - 8) * scale[k / group][r]. Onto Q4_0 always without loss (F16 scales, the same
// offset): group a multiple of 32.
void gptq_int4_to_q4_0(const int32_t* qweight, const uint16_t* scales_f16, int64_t rows,
                       int64_t cols, int64_t group, BlockQ4_0* out);
// The writer's side, as GPTQ's symmetric quantizer rounds (without its error feedback): scale =
// 2 amax / 15 per group (F16; an all-zero group gets 1), q = clamp(round(x / scale) + 8, 0, 15).
void quantize_gptq_int4(const float* src, int64_t rows, int64_t cols, int64_t group,
                        int32_t* qweight, uint16_t* scales_f16);

}  // namespace tandem
