// Decoding of GGUF quantized blocks and narrow floats, one value at a time, written once for the
// CUDA dequantization kernels (dequant.cuh) and for host code that checks them without a GPU.
// Plain C++ when not compiled by nvcc; no framework types (STYLE.md #8): raw bytes in, floats out.
//
// Layouts are ggml's (formats/quant.h documents each block). Arithmetic reproduces
// formats/quant.h's dequantize_row operation by operation, each product and sum rounded on its
// own: a fused multiply-add would change the last bit, so products go through mul_rn(), which the
// compilers may not contract (nvcc contracts a * b - c into an FMA by default).
//
// Every format decodes 8 consecutive values at a time ("a chunk"): all block sizes are multiples
// of 8 and a chunk never straddles a sub-block, so a chunk has one scale (and min).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TD_HD __host__ __device__ __forceinline__
#define TD_UNROLL _Pragma("unroll")
#else
#define TD_HD inline
#define TD_UNROLL
#endif

namespace tandem::dequant {

inline constexpr int kChunk = 8;  // values decoded per call of decode8

// ---- bit-level helpers ----

TD_HD float bits_to_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

TD_HD uint32_t f32_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

// A rounded product that the compiler may not fuse with a following add. On the host an empty asm
// makes the product opaque, so GCC's default -ffp-contract=fast cannot form an FMA from it.
TD_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  float p = a * b;
#if defined(__x86_64__) && defined(__GNUC__)
  asm("" : "+x"(p));
#else
  volatile float v = p;
  p = v;
#endif
  return p;
#endif
}

TD_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

TD_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// Unaligned little-endian loads (blocks are 18, 22, 110, ... bytes, so fields are not aligned).
TD_HD uint32_t load_u16(const uint8_t* p) {
  return p[0] | (static_cast<uint32_t>(p[1]) << 8);
}
TD_HD uint32_t load_u32(const uint8_t* p) {
  return p[0] | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

// ---- narrow floats: the same bits as core/fp_convert.h ----

TD_HD float f16_to_f32(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) {  // inf, or NaN with its payload kept and quieted (as F16C converts)
    return bits_to_f32(sign | 0x7F800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u));
  }
  if (exp != 0) return bits_to_f32(sign | ((exp + 112u) << 23) | (mant << 13));
  // Zero or subnormal: mant * 2^-24 is exact in F32.
  const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign ? -mag : mag;
}

TD_HD float bf16_to_f32(uint32_t b) {
  return bits_to_f32(b << 16);
}

TD_HD float fp8_e4m3_to_f32(uint32_t v) {
  const uint32_t sign = (v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xFu;
  const uint32_t mant = v & 0x7u;
  if (exp == 0xF && mant == 0x7) return bits_to_f32(sign | 0x7FC00000u);  // NaN
  if (exp != 0) return bits_to_f32(sign | ((exp + 120u) << 23) | (mant << 20));
  const float mag = static_cast<float>(mant) * 0.001953125f;  // subnormal: mant * 2^-9
  return sign ? -mag : mag;
}

// Round to nearest even; NaN stays NaN (quiet bit forced, as fp_convert.h does).
TD_HD uint16_t f32_to_bf16(float f) {
  const uint32_t u = f32_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// `value` >> shift (1..31), rounded to nearest, ties to even.
TD_HD uint32_t shift_right_rne(uint32_t value, int shift) {
  const uint32_t half = 1u << (shift - 1);
  const uint32_t rest = value & ((1u << shift) - 1);
  uint32_t out = value >> shift;
  if (rest > half || (rest == half && (out & 1u))) ++out;
  return out;
}

// Round to nearest even, subnormals kept, overflow to infinity; NaN keeps its top payload bits,
// quieted (as fp_convert.h does).
TD_HD uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_to_bits(f);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (abs >= 0x38800000u) {
    return static_cast<uint16_t>(sign | shift_right_rne(abs - (112u << 23), 13));
  }
  if (abs < 0x33000000u) return sign;
  const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
  return static_cast<uint16_t>(sign | shift_right_rne(mant, 126 - static_cast<int>(abs >> 23)));
}

// x as three BF16 values whose sum is x, each the leading 8 significant bits of what the ones
// before left (truncated, so nothing rounds up past F32's range): exact for |x| >= 2^-110 (below,
// the last part falls under BF16's subnormals and a few low bits are lost). A product of F32
// activations with BF16 weights is then three BF16 products, each exact, summed in F32: what
// tensor cores can compute at F32's accuracy.
TD_HD void split_bf16x3(float x, uint16_t* hi, uint16_t* mid, uint16_t* lo) {
  const uint32_t u = f32_to_bits(x);
  *hi = static_cast<uint16_t>(u >> 16);
  const float r1 = x - bf16_to_f32(*hi);
  *mid = static_cast<uint16_t>(f32_to_bits(r1) >> 16);
  const float r2 = r1 - bf16_to_f32(*mid);
  *lo = static_cast<uint16_t>(f32_to_bits(r2) >> 16);
}

// ---- the KV cache's Q8_0 rows (ops/types.h: F32 block scales before the int8 values) ----
// ops::q8_quantize's arithmetic, operation by operation: a block's scale from its largest
// magnitude (NaN for a block holding a NaN or an infinity), its inverse (0 for an all-zero block),
// a value rounded half away from zero and clamped to +-127 (0 in a non-finite block); and a value
// read back as scale * int8, one rounded product (ops::q8_value).
TD_HD float q8_cache_scale(float amax, bool finite) {
  return finite ? amax / 127.0f : bits_to_f32(0x7FC00000u);
}
TD_HD float q8_cache_inverse(float scale, bool finite) {
  return finite && scale != 0.0f ? 1.0f / scale : 0.0f;
}
TD_HD int8_t q8_cache_value(float x, float inverse, bool finite) {
  if (!finite) return 0;
  const float r = roundf(mul_rn(x, inverse));
  return static_cast<int8_t>(r < -127.0f ? -127.0f : r > 127.0f ? 127.0f : r);
}
TD_HD float q8_cache_load(const int8_t* values, int64_t i) {
  float scale;
  std::memcpy(&scale, values - 4 * (1 + i / 32), 4);
  return mul_rn(scale, static_cast<float>(values[i]));
}

// A GGUF block format (decode8 over kBlockElems values) rather than an element format (load).
template <typename Fmt>
constexpr bool kIsBlockFormat = requires {
  Fmt::kBlockElems;
};

// ---- element formats (one value per element, any row length) ----

struct F32 {
  static constexpr int kBytes = 4;
  static TD_HD float load(const uint8_t* p) { return bits_to_f32(load_u32(p)); }
};
struct F16 {
  static constexpr int kBytes = 2;
  static TD_HD float load(const uint8_t* p) { return f16_to_f32(load_u16(p)); }
};
struct BF16 {
  static constexpr int kBytes = 2;
  static TD_HD float load(const uint8_t* p) { return bf16_to_f32(load_u16(p)); }
};
struct F8E4M3 {
  static constexpr int kBytes = 1;
  static TD_HD float load(const uint8_t* p) { return fp8_e4m3_to_f32(p[0]); }
};

// ---- GGUF block formats: decode8(block, k, out) writes values 8k .. 8k+7 of the block ----

// x = (q - 8) * d; qs[j] holds value j (low nibble) and j + 16 (high nibble).
struct Q4_0 {
  static constexpr int kBlockElems = 32, kBlockBytes = 18;
  static TD_HD void decode8(const uint8_t* b, int k, float* out) {
    const float d = f16_to_f32(load_u16(b));
    const uint8_t* qs = b + 2 + (k & 1) * 8;
    const int shift = (k >> 1) * 4;
    for (int i = 0; i < kChunk; ++i) {
      out[i] = mul_rn(static_cast<float>(((qs[i] >> shift) & 0xF) - 8), d);
    }
  }
};

// MXFP4: x = table[q] * 2^(e - 128) (formats/quant.h), nibbles laid out as Q4_0's after the
// one-byte exponent.
struct MXFP4 {
  static constexpr int kBlockElems = 32, kBlockBytes = 17;
  static TD_HD void decode8(const uint8_t* b, int k, float* out) {
    const uint8_t e = b[0];
    const float d = bits_to_f32(e < 2 ? uint32_t{0x00200000} << e : uint32_t(e - 1) << 23);
    const uint8_t* qs = b + 1 + (k & 1) * 8;
    const int shift = (k >> 1) * 4;
    constexpr int8_t kValues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    for (int i = 0; i < kChunk; ++i) {
      out[i] = mul_rn(static_cast<float>(kValues[(qs[i] >> shift) & 0xF]), d);
    }
  }
};

// x = q * d + m.
struct Q4_1 {
  static constexpr int kBlockElems = 32, kBlockBytes = 20;
  static TD_HD void decode8(const uint8_t* b, int k, float* out) {
    const float d = f16_to_f32(load_u16(b));
    const float m = f16_to_f32(load_u16(b + 2));
    const uint8_t* qs = b + 4 + (k & 1) * 8;
    const int shift = (k >> 1) * 4;
    for (int i = 0; i < kChunk; ++i) {
      out[i] = add_rn(mul_rn(static_cast<float>((qs[i] >> shift) & 0xF), d), m);
    }
  }
};

// The 5-bit value e (0..31) of a Q5_0 / Q5_1 block: low nibble as Q4_0, bit 4 = bit e of qh.
TD_HD int q5_value(const uint8_t* qs, uint32_t qh, int e) {
  const int low = e < 16 ? qs[e] & 0xF : qs[e - 16] >> 4;
  return low | static_cast<int>(((qh >> e) & 1u) << 4);
}

// x = (q - 16) * d.
struct Q5_0 {
  static constexpr int kBlockElems = 32, kBlockBytes = 22;
  static TD_HD void decode8(const uint8_t* b, int k, float* out) {
    const float d = f16_to_f32(load_u16(b));
    const uint32_t qh = load_u32(b + 2);
    for (int i = 0; i < kChunk; ++i) {
      out[i] = mul_rn(static_cast<float>(q5_value(b + 6, qh, k * kChunk + i) - 16), d);
    }
  }
};

// x = q * d + m.
struct Q5_1 {
  static constexpr int kBlockElems = 32, kBlockBytes = 24;
  static TD_HD void decode8(const uint8_t* b, int k, float* out) {
    const float d = f16_to_f32(load_u16(b));
    const float m = f16_to_f32(load_u16(b + 2));
    const uint32_t qh = load_u32(b + 4);
    for (int i = 0; i < kChunk; ++i) {
      out[i] = add_rn(mul_rn(static_cast<float>(q5_value(b + 8, qh, k * kChunk + i)), d), m);
    }
  }
};

// x = q * d, q int8 (Q8_1 only adds a sum s after d).
template <int kQsOffset, int kBytes>
struct Q8Legacy {
  static constexpr int kBlockElems = 32, kBlockBytes = kBytes;
  static TD_HD void decode8(const uint8_t* b, int k, float* out) {
    const float d = f16_to_f32(load_u16(b));
    const uint8_t* qs = b + kQsOffset + k * kChunk;
    for (int i = 0; i < kChunk; ++i)
      out[i] = mul_rn(static_cast<float>(static_cast<int8_t>(qs[i])), d);
  }
};
using Q8_0 = Q8Legacy<2, 34>;
using Q8_1 = Q8Legacy<4, 36>;

// 2-bit field of value e of a Q2_K / Q3_K block: per half of 128, byte e % 32 holds values
// e % 32 + {0, 32, 64, 96} in bit pairs 0-1, 2-3, 4-5, 6-7.
TD_HD int q2_field(const uint8_t* qs, int e) {
  return (qs[(e >> 7) * 32 + (e & 31)] >> (2 * ((e >> 5) & 3))) & 3;
}

// 16 sub-blocks of 16: x = (d * (sc & 15)) * q - dmin * (sc >> 4).
struct Q2_K {
  static constexpr int kBlockElems = 256, kBlockBytes = 84;
  static TD_HD void decode8(const uint8_t* b, int k, float* out) {
    const int e0 = k * kChunk;
    const uint8_t sc = b[e0 >> 4];
    const float dl = mul_rn(f16_to_f32(load_u16(b + 80)), static_cast<float>(sc & 0xF));
    const float ml = mul_rn(f16_to_f32(load_u16(b + 82)), static_cast<float>(sc >> 4));
    for (int i = 0; i < kChunk; ++i) {
      out[i] = sub_rn(mul_rn(dl, static_cast<float>(q2_field(b + 16, e0 + i))), ml);
    }
  }
};

// 16 sub-blocks of 16: x = (d * (s - 32)) * (q - 4 * !hbit), s a 6-bit scale packed in 12 bytes.
struct Q3_K {
  static constexpr int kBlockElems = 256, kBlockBytes = 110;
  static TD_HD void decode8(const uint8_t* b, int k, float* out) {
    const int e0 = k * kChunk;
    const int j = e0 >> 4;  // sub-block
    const uint8_t* packed = b + 96;
    const int low = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
    const int high = (packed[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
    const float dl =
        mul_rn(f16_to_f32(load_u16(b + 108)), static_cast<float>((low | (high << 4)) - 32));
    const uint8_t* hmask = b;
    for (int i = 0; i < kChunk; ++i) {
      const int e = e0 + i;
      const int hbit = (hmask[e & 31] >> (e >> 5)) & 1;
      out[i] = mul_rn(dl, static_cast<float>(q2_field(b + 32, e) - (hbit ? 0 : 4)));
    }
  }
};

// Scale and min of sub-block j (0..7) of Q4_K / Q5_K, as formats/quant.h unpack_scale_min_k4.
TD_HD void scale_min_k4(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// 8 sub-blocks of 32: x = (d * sc) * q - (dmin * m); with kHighBits, bit 4 of q from qh.
template <bool kHighBits>
struct QK4or5 {
  static constexpr int kBlockElems = 256, kBlockBytes = kHighBits ? 176 : 144;
  static TD_HD void decode8(const uint8_t* b, int k, float* out) {
    const int e0 = k * kChunk;
    const int j = e0 >> 5;  // sub-block
    int sc, m;
    scale_min_k4(j, b + 4, &sc, &m);
    const float d1 = mul_rn(f16_to_f32(load_u16(b)), static_cast<float>(sc));
    const float m1 = mul_rn(f16_to_f32(load_u16(b + 2)), static_cast<float>(m));
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + (kHighBits ? 48 : 16) + (j >> 1) * 32;
    const int shift = (j & 1) * 4;
    for (int i = 0; i < kChunk; ++i) {
      const int l = (e0 + i) & 31;
      int q = (qs[l] >> shift) & 0xF;
      if (kHighBits) q |= ((qh[l] >> j) & 1) << 4;
      out[i] = sub_rn(mul_rn(d1, static_cast<float>(q)), m1);
    }
  }
};
using Q4_K = QK4or5<false>;
using Q5_K = QK4or5<true>;

// 16 sub-blocks of 16: x = (d * sc) * (q - 32), q 6 bits (ql nibbles + 2 bits of qh).
struct Q6_K {
  static constexpr int kBlockElems = 256, kBlockBytes = 210;
  static TD_HD void decode8(const uint8_t* b, int k, float* out) {
    const int e0 = k * kChunk;
    const int h = e0 >> 7, g = (e0 >> 5) & 3;  // half of 128, group of 32 in it
    const uint8_t* ql = b + h * 64 + (g & 1) * 32;
    const uint8_t* qh = b + 128 + h * 32;
    const int low_shift = (g >> 1) * 4;
    const float dl = mul_rn(f16_to_f32(load_u16(b + 208)),
                            static_cast<float>(static_cast<int8_t>(b[192 + (e0 >> 4)])));
    for (int i = 0; i < kChunk; ++i) {
      const int l = (e0 + i) & 31;
      const int q = (((ql[l] >> low_shift) & 0xF) | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
      out[i] = mul_rn(dl, static_cast<float>(q));
    }
  }
};

// x = q * d with an F32 d (the K-quant dot-product activation format).
struct Q8_K {
  static constexpr int kBlockElems = 256, kBlockBytes = 292;
  static TD_HD void decode8(const uint8_t* b, int k, float* out) {
    const float d = bits_to_f32(load_u32(b));
    const uint8_t* qs = b + 4 + k * kChunk;
    for (int i = 0; i < kChunk; ++i)
      out[i] = mul_rn(static_cast<float>(static_cast<int8_t>(qs[i])), d);
  }
};

}  // namespace tandem::dequant
