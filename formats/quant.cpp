// Row (de)quantization dispatch over every DType, the plain float / int conversions, and FP8
// with block scales. The block formats themselves are in quant_legacy.cpp and quant_k.cpp.
#include "formats/quant.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>

#include "core/error.h"
#include "core/fp_convert.h"
#include "formats/quant_impl.h"

namespace tandem {
namespace {

using DequantizeFn = void (*)(const void* src, float* dst, int64_t n);
using QuantizeFn = void (*)(const float* src, void* dst, int64_t n);

// ---- plain types: n is the number of elements ----

template <typename T>
void cast_to_f32(const void* src, float* dst, int64_t n) {
  const T* s = static_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
}

void f32_to_f32(const void* src, float* dst, int64_t n) {
  std::copy_n(static_cast<const float*>(src), n, dst);
}

void f32_store(const float* src, void* dst, int64_t n) {
  std::copy_n(src, n, static_cast<float*>(dst));
}

// F16C is part of the x86-64-v3 baseline; the instructions round exactly as f32_to_f16 (RNE,
// NaN payload truncated and quieted), which the tests check.
void f16_row_to_f32(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = f16_to_f32(s[i]);
}

void f32_row_to_f16(const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
  }
#endif
  for (; i < n; ++i) d[i] = f32_to_f16(src[i]);
}

void bf16_row_to_f32(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
}

void f32_row_to_bf16(const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
}

// All 256 E4M3 values, decoded once.
const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int v = 0; v < 256; ++v) t[v] = fp8_e4m3_to_f32(static_cast<uint8_t>(v));
    return t;
  }();
  return table;
}

void fp8_row_to_f32(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  const std::array<float, 256>& table = fp8_table();
  for (int64_t i = 0; i < n; ++i) dst[i] = table[s[i]];
}

// f32_to_fp8_e4m3 without branches, so that row loops vectorize (the branchy scalar reference
// runs at ~100M values/s): both roundings are computed and the result selected. Tested equal to
// the reference on every kind of input.
inline uint8_t f32_to_fp8_select(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t abs = u & 0x7FFFFFFFu;
  // Normal: rebias the exponent (127 -> 7) and round the mantissa to 3 bits, ties to even.
  const uint32_t rebased = abs - (120u << 23);
  const uint32_t normal = (rebased + 0x7FFFFu + ((rebased >> 20) & 1u)) >> 20;
  // Subnormal: the 24-bit significand shifted right by 141 - exponent (>= 31 gives 0), RNE.
  const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = std::min(31u, std::max(21u, 141u - std::min(141u, abs >> 23)));
  const uint32_t half = 1u << (shift - 1);
  const uint32_t rest = mant & ((half << 1) - 1);
  uint32_t sub = mant >> shift;
  sub += (rest > half || (rest == half && (sub & 1u))) ? 1u : 0u;
  uint32_t out = abs >= 0x3C800000u ? normal : sub;
  out = abs >= 0x43E00000u ? 0x7Eu : out;
  out |= sign;
  return static_cast<uint8_t>(abs > 0x7F800000u ? 0x7Fu : out);
}

void f32_row_to_fp8(const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_fp8_select(src[i]);
}

// ---- block types: adapters from (n elements) to (blocks) ----

template <typename Block, void (*Fn)(const Block*, float*, int64_t), int kElems>
void dequantize_blocks(const void* src, float* dst, int64_t n) {
  Fn(static_cast<const Block*>(src), dst, n / kElems);
}

template <typename Block, void (*Fn)(const float*, Block*, int64_t), int kElems>
void quantize_blocks(const float* src, void* dst, int64_t n) {
  Fn(src, static_cast<Block*>(dst), n / kElems);
}

struct RowCodec {
  DequantizeFn dequantize = nullptr;
  QuantizeFn quantize = nullptr;  // nullptr: cannot quantize to this type
};

// The one table of per-dtype (de)quantizers, indexed by DType.
constexpr std::array<RowCodec, static_cast<size_t>(DType::kCount)> make_codecs() {
  namespace qi = quant_impl;
  std::array<RowCodec, static_cast<size_t>(DType::kCount)> c{};
  auto set = [&c](DType t, DequantizeFn dq, QuantizeFn q) {
    c[static_cast<size_t>(t)] = RowCodec{dq, q};
  };
  set(DType::kF32, f32_to_f32, f32_store);
  set(DType::kF16, f16_row_to_f32, f32_row_to_f16);
  set(DType::kBF16, bf16_row_to_f32, f32_row_to_bf16);
  set(DType::kF8E4M3, fp8_row_to_f32, f32_row_to_fp8);
  set(DType::kI8, cast_to_f32<int8_t>, nullptr);
  set(DType::kU8, cast_to_f32<uint8_t>, nullptr);
  set(DType::kI16, cast_to_f32<int16_t>, nullptr);
  set(DType::kI32, cast_to_f32<int32_t>, nullptr);
  set(DType::kI64, cast_to_f32<int64_t>, nullptr);
  set(DType::kF64, cast_to_f32<double>, nullptr);
  set(DType::kQ4_0, dequantize_blocks<BlockQ4_0, qi::dequantize_q4_0, kQK>,
      quantize_blocks<BlockQ4_0, qi::quantize_q4_0, kQK>);
  set(DType::kQ4_1, dequantize_blocks<BlockQ4_1, qi::dequantize_q4_1, kQK>,
      quantize_blocks<BlockQ4_1, qi::quantize_q4_1, kQK>);
  set(DType::kQ5_0, dequantize_blocks<BlockQ5_0, qi::dequantize_q5_0, kQK>,
      quantize_blocks<BlockQ5_0, qi::quantize_q5_0, kQK>);
  set(DType::kQ5_1, dequantize_blocks<BlockQ5_1, qi::dequantize_q5_1, kQK>,
      quantize_blocks<BlockQ5_1, qi::quantize_q5_1, kQK>);
  set(DType::kQ8_0, dequantize_blocks<BlockQ8_0, qi::dequantize_q8_0, kQK>,
      quantize_blocks<BlockQ8_0, qi::quantize_q8_0, kQK>);
  set(DType::kQ8_1, dequantize_blocks<BlockQ8_1, qi::dequantize_q8_1, kQK>,
      quantize_blocks<BlockQ8_1, qi::quantize_q8_1, kQK>);
  set(DType::kQ2_K, dequantize_blocks<BlockQ2_K, qi::dequantize_q2_k, kQK_K>,
      quantize_blocks<BlockQ2_K, qi::quantize_q2_k, kQK_K>);
  set(DType::kQ3_K, dequantize_blocks<BlockQ3_K, qi::dequantize_q3_k, kQK_K>,
      quantize_blocks<BlockQ3_K, qi::quantize_q3_k, kQK_K>);
  set(DType::kQ4_K, dequantize_blocks<BlockQ4_K, qi::dequantize_q4_k, kQK_K>,
      quantize_blocks<BlockQ4_K, qi::quantize_q4_k, kQK_K>);
  set(DType::kQ5_K, dequantize_blocks<BlockQ5_K, qi::dequantize_q5_k, kQK_K>,
      quantize_blocks<BlockQ5_K, qi::quantize_q5_k, kQK_K>);
  set(DType::kQ6_K, dequantize_blocks<BlockQ6_K, qi::dequantize_q6_k, kQK_K>,
      quantize_blocks<BlockQ6_K, qi::quantize_q6_k, kQK_K>);
  set(DType::kQ8_K, dequantize_blocks<BlockQ8_K, qi::dequantize_q8_k, kQK_K>,
      quantize_blocks<BlockQ8_K, qi::quantize_q8_k, kQK_K>);
  set(DType::kMXFP4, dequantize_blocks<BlockMXFP4, qi::dequantize_mxfp4, kQK>,
      quantize_blocks<BlockMXFP4, qi::quantize_mxfp4, kQK>);
  return c;
}

constexpr std::array<RowCodec, static_cast<size_t>(DType::kCount)> kCodecs = make_codecs();

constexpr bool all_dequantizable() {
  for (const RowCodec& c : kCodecs) {
    if (c.dequantize == nullptr) return false;
  }
  return true;
}
static_assert(all_dequantizable(), "every DType needs a dequantizer");

const RowCodec& codec(DType type) {
  const auto index = static_cast<size_t>(type);
  TD_CHECK(index < kCodecs.size(), "dtype id {}", index);
  return kCodecs[index];
}

void check_whole_blocks(DType type, int64_t n) {
  const DTypeInfo& info = dtype_info(type);
  TD_CHECK(n >= 0 && n % info.block_elems == 0, "{} values of {}: not whole blocks of {}", n,
           info.name, info.block_elems);
}

}  // namespace

void dequantize_row(DType type, const void* src, float* dst, int64_t n) {
  const RowCodec& c = codec(type);
  check_whole_blocks(type, n);
  c.dequantize(src, dst, n);
}

bool can_quantize(DType type) {
  return codec(type).quantize != nullptr;
}

void quantize_row(DType type, const float* src, void* dst, int64_t n) {
  const RowCodec& c = codec(type);
  if (c.quantize == nullptr) {
    fail(ErrorKind::kUnsupported, "cannot quantize to {}: not a float or block type",
         dtype_name(type));
  }
  check_whole_blocks(type, n);
  c.quantize(src, dst, n);
}

void dequantize_fp8_blocks(const uint8_t* w, const float* scale_inv, int64_t rows, int64_t cols,
                           int64_t block_rows, int64_t block_cols, float* dst) {
  TD_CHECK(rows >= 0 && cols >= 0 && block_rows > 0 && block_cols > 0, "fp8 blocks {}x{} of {}x{}",
           rows, cols, block_rows, block_cols);
  const std::array<float, 256>& table = fp8_table();
  const int64_t scale_cols = (cols + block_cols - 1) / block_cols;
  for (int64_t r = 0; r < rows; ++r) {
    const float* scale_row = scale_inv + (r / block_rows) * scale_cols;
    const uint8_t* src = w + r * cols;
    float* out = dst + r * cols;
    for (int64_t c0 = 0; c0 < cols; c0 += block_cols) {
      const float scale = scale_row[c0 / block_cols];
      const int64_t c1 = std::min(cols, c0 + block_cols);
      for (int64_t c = c0; c < c1; ++c) out[c] = table[src[c]] * scale;
    }
  }
}

void quantize_fp8_blocks(const float* src, int64_t rows, int64_t cols, int64_t block_rows,
                         int64_t block_cols, uint8_t* w, float* scale_inv) {
  TD_CHECK(rows >= 0 && cols >= 0 && block_rows > 0 && block_cols > 0, "fp8 blocks {}x{} of {}x{}",
           rows, cols, block_rows, block_cols);
  constexpr float kFp8Max = 448.0f;
  const int64_t scale_cols = (cols + block_cols - 1) / block_cols;
  for (int64_t r0 = 0; r0 < rows; r0 += block_rows) {
    const int64_t r1 = std::min(rows, r0 + block_rows);
    for (int64_t c0 = 0; c0 < cols; c0 += block_cols) {
      const int64_t c1 = std::min(cols, c0 + block_cols);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(src[r * cols + c]));
      }
      // An all-zero block keeps scale 1 so that every stored scale is a usable divisor.
      const float scale = amax > 0.0f ? amax / kFp8Max : 1.0f;
      scale_inv[(r0 / block_rows) * scale_cols + c0 / block_cols] = scale;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c)
          w[r * cols + c] = f32_to_fp8_select(src[r * cols + c] / scale);
      }
    }
  }
}

}  // namespace tandem
