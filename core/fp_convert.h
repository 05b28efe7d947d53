// Scalar conversions between F32 and the narrow float formats tandem stores weights in: IEEE
// binary16 (F16), bfloat16 (BF16) and OCP FP8 E4M3FN. These are the reference conversions: SIMD
// kernels must produce the same bits. All narrowing conversions round to nearest, ties to even,
// and handle subnormals (no flush to zero).
//
// E4M3FN ("FN": finite + NaN) has no infinities: exponent bias 7, 3 mantissa bits, largest finite
// 0x7E = 448, 0x7F/0xFF = NaN. Narrowing saturates: finite overflow and +-inf become +-448.
//
// Header-only and free of other tandem dependencies so that any module (and host code compiled by
// nvcc) can use it.
#pragma once

#include <bit>
#include <cstdint>

namespace tandem {

// ---- F16 (IEEE binary16: 1 sign, 5 exponent bits with bias 15, 10 mantissa bits) ----

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {  // inf, or NaN: payload kept and quieted, as F16C's vcvtph2ps does
    bits = sign | 0x7F800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u);
  } else if (exp != 0) {  // normal: rebias 15 -> 127
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: mant * 2^-24, renormalised for F32
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(bits);
}

namespace fp_detail {
// Shifts `value` right by `shift` bits (1..31), rounding to nearest, ties to even.
inline uint32_t shift_right_rne(uint32_t value, int shift) {
  const uint32_t half = 1u << (shift - 1);
  const uint32_t rest = value & ((1u << shift) - 1);
  uint32_t out = value >> shift;
  if (rest > half || (rest == half && (out & 1u))) ++out;
  return out;
}
}  // namespace fp_detail

inline uint16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) {  // NaN: keep the top payload bits, force quiet
    return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  }
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (abs >= 0x38800000u) {  // >= 2^-14: normal F16; a mantissa carry bumps the exponent
    return static_cast<uint16_t>(sign | fp_detail::shift_right_rne(abs - (112u << 23), 13));
  }
  if (abs < 0x33000000u) return sign;  // below half the smallest subnormal 2^-24
  // Subnormal F16: value / 2^-24 rounded; 24-bit significand shifted by 126 - exp.
  const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
  const int shift = 126 - static_cast<int>(abs >> 23);
  return static_cast<uint16_t>(sign | fp_detail::shift_right_rne(mant, shift));
}

// ---- BF16 (the top half of an F32) ----

inline float bf16_to_f32(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline uint16_t f32_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN: truncation could clear the payload -> force quiet
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  // Overflow rounds to inf, which is the IEEE result.
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// ---- FP8 E4M3FN ----

inline float fp8_e4m3_to_f32(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xFu;
  const uint32_t mant = v & 0x7u;
  if (exp == 0xF && mant == 0x7) return std::bit_cast<float>(sign | 0x7FC00000u);  // NaN
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 120u) << 23) | (mant << 20));
  // Subnormal: mant * 2^-9, exact in F32.
  const float mag = static_cast<float>(mant) * 0.001953125f;
  return sign ? -mag : mag;
}

inline uint8_t f32_to_fp8_e4m3(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return 0x7F;                                 // NaN
  if (abs >= 0x43E00000u) return static_cast<uint8_t>(sign | 0x7Eu);  // >= 448 (or inf)
  if (abs >= 0x3C800000u) {  // >= 2^-6: normal; rebias 127 -> 7; below 448 cannot round past 0x7E
    return static_cast<uint8_t>(sign | fp_detail::shift_right_rne(abs - (120u << 23), 20));
  }
  if (abs < 0x3A800000u) return sign;  // < 2^-10, half the smallest subnormal 2^-9: rounds to 0
  // Subnormal E4M3: value / 2^-9 rounded (8 = 0x08 is the smallest normal, which is correct).
  const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
  const int shift = 141 - static_cast<int>(abs >> 23);
  return static_cast<uint8_t>(sign | fp_detail::shift_right_rne(mant, shift));
}

}  // namespace tandem
