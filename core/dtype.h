// Element types of tensors: plain floats and ints, FP8, and the GGUF block-quantized types.
// A block type stores `block_elems` values in `block_bytes` bytes; a row of n values (n a
// multiple of block_elems) takes n / block_elems * block_bytes bytes. The bit-exact block layouts
// and the (de)quantization routines are in formats/quant.h; this header only names the types.
//
// This is the one place that enumerates dtypes (STYLE.md #5): code that needs per-dtype behaviour
// uses visit_dtype() or the traits table, never its own switch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tandem {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF8E4M3,  // FP8 E4M3FN (no infinities, saturating); block scales are a separate F32 tensor
  kI8,
  kU8,
  kI16,
  kI32,
  kI64,
  kF64,
  // GGUF block types (ggml): layouts in formats/quant.h
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ8_0,
  kQ8_1,
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kQ8_K,
  kMXFP4,  // OCP microscaling FP4: E2M1 values, one E8M0 exponent per 32 (gpt-oss's experts)
  kCount,
};

struct DTypeInfo {
  DType dtype;
  std::string_view name;  // as ggml / llama.cpp spell it: "f32", "bf16", "q4_K", ...
  int32_t block_elems;    // 1 for non-block types
  int32_t block_bytes;    // bytes of one block (element size for non-block types)
  int32_t ggml_type;      // the GGUF `ggml_type` id, -1 where GGUF has none
  bool is_float;          // F32/F16/BF16/F8/F64
  bool is_block;          // a GGUF block-quantized type
};

const DTypeInfo& dtype_info(DType dtype);
inline std::string_view dtype_name(DType dtype) { return dtype_info(dtype).name; }

// Bytes of `elems` values; elems must be a multiple of the block size (checked by callers that
// read untrusted shapes: see row_bytes_checked()).
inline int64_t dtype_bytes(DType dtype, int64_t elems) {
  const DTypeInfo& info = dtype_info(dtype);
  return elems / info.block_elems * info.block_bytes;
}

// Looks a dtype up by its ggml type id (GGUF) or its name (case-insensitive).
std::optional<DType> dtype_from_ggml(int32_t ggml_type);
std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace tandem
