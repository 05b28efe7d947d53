// Internal to the packed kernels: the per-ISA kernel tables packed.cpp dispatches on. Each table
// comes from one algorithm template (packed_impl.h) compiled for its ISA in its own file.
#pragma once

#include <cstdint>

#include "ops/cpu/kernels.h"

namespace tandem::kern::detail {

struct PackedArgs {
  const KMatrix* w;
  const Activations* a;
  int64_t n0, n1;
  float* y;
  int64_t ldy;
};
using PackedFn = void (*)(const PackedArgs&);

struct PackedKernels {
  PackedFn int8 = nullptr, int4 = nullptr, fp8 = nullptr, bf16 = nullptr;  // bf16: kBF16Tile
};

const PackedKernels& packed_kernels_avx2();
const PackedKernels& packed_kernels_avx512();
const PackedKernels& packed_kernels_vnni();  // AVX-512 VNNI + BF16 (+ VBMI where the CPU has it)
const PackedKernels& packed_kernels_vnni_base();  // the same without the VBMI FP8 GEMV
// Its INT8 / INT4 kernels and an FP8 kernel without BF16 (VBMI GEMV where the CPU has VBMI, else
// the AVX-512 one) and no BF16 tiles: the avx512_vnni level (Cascade Lake, Ice Lake).
const PackedKernels& packed_kernels_vnni_int();
const PackedKernels& packed_kernels_amx();   // AMX-INT8 / AMX-BF16 tiles (Sapphire Rapids+)

// An E4M3 byte sign-extended to 16 bits and shifted left by 7, ANDed with this: the FP16 of 2^-8
// times its value (sign in bit 15, exponent and mantissa in bits 7-13; subnormals included). The
// FP8 GEMV without BF16 instructions widens that with vcvtph2ps (packed_avx2.cpp,
// packed_avx512.cpp).
constexpr int16_t kFp8F16Bits = static_cast<int16_t>(0xBF80);
// E4M3 byte -> its BF16 bits (exact: E4M3's 3 mantissa bits and exponent range fit BF16).
const uint16_t* fp8_bf16_table();
// FP8Block GEMMs with more tokens than this expand the FP8 rows into BF16 tiles (packed_impl.h
// fp8_gemm) once for all tokens; fewer tokens stream the rows directly (the expansion would cost
// more than it saves).
constexpr int64_t kFp8TileMinTokens = 5;
// FP8Block GEMV with AVX-512 VBMI (packed_fp8_vbmi.cpp; call only on CPUs with VBMI + BF16) for
// the matrices and token counts fp8_rows_vbmi_fits accepts (<= 4 tokens, 64 | cols, 64 | block
// columns).
bool fp8_rows_vbmi_fits(const KMatrix& w, int64_t tokens);
void fp8_rows_vbmi(const PackedArgs& p);
// The same GEMV on CPUs with VBMI and GFNI but without BF16 (packed_fp8_vbmi_f32.cpp: the weights
// expanded to F32 by GF2P8AFFINEQB, FMA), for the matrices and token counts fp8_rows_vbmi_fits
// accepts.
void fp8_rows_vbmi_f32(const PackedArgs& p);
// 16 FP8 rows (src[i] == nullptr: a zero padding row) x 2 * pairs columns into BF16 tile chunks,
// dst[c * 32 + 2 i + j] = bf16(row i, column 2c + j): the B-tile lines of vdpbf16ps and AMX-BF16.
// AVX-512 (packed_vnni.cpp; call only on CPUs with AVX-512 VNNI + BF16).
void fp8_expand_vnni(const uint8_t* const* src, int64_t pairs, uint16_t* dst);

// Byte offsets inside one packed group block (see packed.h).
struct PackedGeometry {
  int64_t groups = 0;        // cols / group (kBF16Tile: cols / 2, one k pair per "group")
  int64_t values_bytes = 0;  // quantized values of one group block (16 rows)
  int64_t block_bytes = 0;   // values + 16 F32 scales (+ 16 int32 sums for INT8)
  int64_t tile_bytes = 0;    // groups * block_bytes
};
PackedGeometry packed_geometry(WFormat f, int64_t cols, int group);

// kI8 activation row: q int8 [cols], sa F32 [groups] at act_scales_offset, sums int32 [groups] after.
inline int64_t act_scales_offset(int64_t cols) {
  return (cols + 3) / 4 * 4;
}
// ... then, 64-byte aligned, q_a + 128 as u8 [cols] (q_a XOR 0x80): the unsigned operand of the
// VNNI INT8 dot product, made once per quantization instead of once per weight tile.
inline int64_t act_biased_offset(int64_t cols, int64_t groups) {
  return (act_scales_offset(cols) + groups * 8 + 63) / 64 * 64;
}

// kBF16 activation row: BF16 [cols], then at act_f32_offset the same values as F32 (exact): the
// activation pairs the BF16 tile / FP8 kernels without a BF16 dot broadcast (T::bf16_a_at), read
// as they are instead of widened from BF16 per chunk and token (two vector ops each).
inline int64_t act_f32_offset(int64_t cols) {
  return (cols * 2 + 63) / 64 * 64;
}

// One kI8 activation row (group a multiple of 16; AVX2: of 8) and one BF16 row on AVX-512
// (quant_act_avx512.cpp; AVX2: quant_act_avx2.cpp): the same bytes as
// packed_quantize_activations' scalar code for finite values (f32_to_bf16: for every input).
void quantize_i8_act_avx512(const float* x, uint8_t* dst, int64_t cols, int64_t group);
void f32_to_bf16_avx512(const float* x, uint16_t* y, int64_t n);
void quantize_i8_act_avx2(const float* x, uint8_t* dst, int64_t cols, int64_t group);  // 8 | group
void f32_to_bf16_avx2(const float* x, uint16_t* y, int64_t n);
// out[i] = ops::silu(gate[i]) * up[i], the same bits (silu_impl.h; out may alias gate or up).
void swiglu_avx512(const float* gate, const float* up, int64_t n, float* out);
void swiglu_avx2(const float* gate, const float* up, int64_t n, float* out);

}  // namespace tandem::kern::detail
