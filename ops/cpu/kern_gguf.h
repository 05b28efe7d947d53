// Internal interface between kernels.cpp (dispatch) and the per-ISA translation units of the
// GGUF / dense kernels (kern_gguf_<isa>.cpp, each compiled for its ISA; see ops/cpu/CMakeLists.txt).
#pragma once

#include <cstdint>

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
};

const GgufKernels& gguf_kernels_scalar();
const GgufKernels& gguf_kernels_avx2();
const GgufKernels& gguf_kernels_avx512();       // AVX-512 F/BW/VL/DQ
const GgufKernels& gguf_kernels_avx512_vnni();  // + VNNI and BF16

}  // namespace tandem::kern::detail
