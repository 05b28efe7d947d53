// core/fp_convert.h against independent expectations: decoding by the format formulas (ldexp),
// narrowing against a brute-force "nearest representable value, ties to the even code" search in
// double precision, the CPU's F16C instructions, and hand-computed ties.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/fp_convert.h"

namespace tandem {
namespace {

uint32_t bits(float f) {
  return std::bit_cast<uint32_t>(f);
}

// The value of a binary16 code from its fields.
double f16_formula(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
  double mag;
  if (exp == 31) {
    mag = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    mag = std::ldexp(mant, -24);
  } else {
    mag = std::ldexp(1024 + mant, exp - 25);
  }
  return sign ? -mag : mag;
}

// The OCP E4M3FN value of a code: bias 7, no infinities, S.1111.111 = NaN.
double fp8_formula(uint8_t v) {
  const int sign = v >> 7, exp = (v >> 3) & 15, mant = v & 7;
  double mag;
  if (exp == 15 && mant == 7) {
    mag = std::numeric_limits<double>::quiet_NaN();
  } else if (exp == 0) {
    mag = std::ldexp(mant, -9);
  } else {
    mag = std::ldexp(8 + mant, exp - 10);
  }
  return sign ? -mag : mag;
}

// Nearest of the finite non-negative codes 0..max_code (value increasing with the code) to |x|,
// ties to the even code. Returns the code without sign.
template <typename Decode>
uint32_t nearest_code(double ax, uint32_t max_code, Decode decode) {
  uint32_t lo = 0, hi = max_code;
  if (ax >= decode(max_code)) return max_code;
  while (hi - lo > 1) {  // decode(lo) <= ax < decode(hi)
    const uint32_t mid = (lo + hi) / 2;
    if (decode(mid) <= ax)
      lo = mid;
    else
      hi = mid;
  }
  const double dlo = ax - decode(lo), dhi = decode(hi) - ax;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(Fp16, DecodesEveryCodeByFormula) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const double expect = f16_formula(static_cast<uint16_t>(h));
    const float got = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(expect)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), expect) << "code " << h;
      ASSERT_EQ(std::signbit(got), (h >> 15) != 0) << h;
    }
  }
}

TEST(Fp16, EveryCodeRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t back = f32_to_f16(f16_to_f32(static_cast<uint16_t>(h)));
    if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0) {  // NaN: quieted, sign and payload kept
      EXPECT_EQ(back, h | 0x200u) << h;
    } else {
      ASSERT_EQ(back, h) << h;
    }
  }
}

TEST(Fp16, HandComputedRounding) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie -> even (down)
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie -> even (up)
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3C01);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // tie between 65504 (odd) and 65536 -> inf
  EXPECT_EQ(f32_to_f16(1e10f), 0x7C00);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);     // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);     // tie with 0 -> 0
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);     // above the tie
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);     // tie 1|2 -> 2
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.5f, -24)), 0x0400);  // tie into the smallest normal
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::quiet_NaN()) & 0x7E00, 0x7E00);
}

TEST(Fp16, NarrowingMatchesBruteForceAndF16C) {
  std::mt19937 rng(7);
  std::vector<float> samples;
  // Random bit patterns cover every exponent; add values near F16 codes and their midpoints.
  for (int i = 0; i < 200000; ++i)
    samples.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  for (uint32_t h = 0; h < 0x7C00; h += 7) {
    const float v = f16_to_f32(static_cast<uint16_t>(h));
    const float next = f16_to_f32(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((static_cast<double>(v) + next) / 2);
    for (float s : {v, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
      samples.push_back(s);
      samples.push_back(-s);
    }
  }
  auto decode = [](uint32_t c) { return f16_formula(static_cast<uint16_t>(c)); };
  for (float f : samples) {
    const uint16_t got = f32_to_f16(f);
    const auto hw = static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
    ASSERT_EQ(got, hw) << std::hex << bits(f);
    if (std::isnan(f)) continue;
    const double ax = std::fabs(static_cast<double>(f));
    // Beyond 65520 (the midpoint to the next power of two) IEEE rounds to inf.
    const uint32_t code = ax >= 65520.0 ? 0x7C00 : nearest_code(ax, 0x7BFF, decode);
    ASSERT_EQ(got, (std::signbit(f) ? 0x8000u : 0u) | code) << std::hex << bits(f);
  }
}

TEST(Bf16, EveryCodeRoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = bf16_to_f32(static_cast<uint16_t>(b));
    EXPECT_EQ(bits(f), b << 16);
    const uint16_t back = f32_to_bf16(f);
    if ((b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0) {
      EXPECT_EQ(back, b | 0x40u) << b;  // NaN: quieted
    } else {
      ASSERT_EQ(back, b) << b;
    }
  }
}

TEST(Bf16, HandComputedRoundingAndNan) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // tie -> even (down)
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to inf
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x00018000u)), 0x0002);  // subnormal tie -> even
  // A NaN whose payload is only in the low 16 bits must not become inf.
  const uint16_t nan = f32_to_bf16(std::bit_cast<float>(0x7F800001u));
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan)));
  EXPECT_EQ(nan, 0x7FC0);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0xFF800001u)), 0xFFC0);
}

TEST(Bf16, NarrowingMatchesBruteForce) {
  std::mt19937 rng(11);
  auto decode = [](uint32_t c) {
    return static_cast<double>(bf16_to_f32(static_cast<uint16_t>(c)));
  };
  for (int i = 0; i < 200000; ++i) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (std::isnan(f)) continue;
    const double ax = std::fabs(static_cast<double>(f));
    // Above the midpoint of the largest finite BF16 and 2^128, rounding gives inf.
    const double overflow = (decode(0x7F7F) + std::ldexp(1.0, 128)) / 2;
    const uint32_t code = ax >= overflow ? 0x7F80 : nearest_code(ax, 0x7F7F, decode);
    ASSERT_EQ(f32_to_bf16(f), (std::signbit(f) ? 0x8000u : 0u) | code) << std::hex << bits(f);
  }
}

TEST(Fp8E4M3, DecodesEveryCodeToTheOcpTable) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(fp8_e4m3_to_f32(0x80)));
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_e4m3_to_f32(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x3C), 1.5f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x77), 240.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x78), 256.0f);  // exponent 15 is finite in E4M3FN
  EXPECT_EQ(fp8_e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0xFE), -448.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xFF)));
  for (int v = 0; v < 256; ++v) {
    const double expect = fp8_formula(static_cast<uint8_t>(v));
    const float got = fp8_e4m3_to_f32(static_cast<uint8_t>(v));
    if (std::isnan(expect)) {
      EXPECT_TRUE(std::isnan(got)) << v;
    } else {
      EXPECT_EQ(static_cast<double>(got), expect) << v;
      EXPECT_EQ(std::signbit(got), v >= 128) << v;
    }
  }
}

TEST(Fp8E4M3, EveryCodeRoundTrips) {
  for (int v = 0; v < 256; ++v) {
    const uint8_t back = f32_to_fp8_e4m3(fp8_e4m3_to_f32(static_cast<uint8_t>(v)));
    EXPECT_EQ(back, (v & 0x7F) == 0x7F ? 0x7F : v) << v;
  }
}

TEST(Fp8E4M3, HandComputedRoundingAndSaturation) {
  EXPECT_EQ(f32_to_fp8_e4m3(1.0f + 1.0f / 16), 0x38);  // tie 1.0 | 1.125 -> even (1.0)
  EXPECT_EQ(f32_to_fp8_e4m3(1.0f + 3.0f / 16), 0x3A);  // tie 1.125 | 1.25 -> even (1.25)
  EXPECT_EQ(f32_to_fp8_e4m3(1.07f), 0x39);
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.0f, -10)), 0x00);  // tie 0 | 2^-9 -> 0
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.01f, -10)), 0x01);
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(3.0f, -10)), 0x02);   // tie 1 | 2 -> 2
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(15.0f, -10)), 0x08);  // tie 7 | 8 -> 8 = 2^-6
  EXPECT_EQ(f32_to_fp8_e4m3(-std::ldexp(5.0f, -10)), 0x82);  // tie 2 | 3 -> 2, negative
  EXPECT_EQ(f32_to_fp8_e4m3(440.0f), 0x7E);                  // nearer 448 than 416
  EXPECT_EQ(f32_to_fp8_e4m3(432.0f), 0x7E);                  // tie 416 | 448 -> 448 (even mantissa)
  EXPECT_EQ(f32_to_fp8_e4m3(431.0f), 0x7D);
  EXPECT_EQ(f32_to_fp8_e4m3(464.0f), 0x7E);  // would round to 480: saturates
  EXPECT_EQ(f32_to_fp8_e4m3(1e9f), 0x7E);
  EXPECT_EQ(f32_to_fp8_e4m3(-1e9f), 0xFE);
  EXPECT_EQ(f32_to_fp8_e4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(f32_to_fp8_e4m3(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(f32_to_fp8_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(f32_to_fp8_e4m3(-std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(f32_to_fp8_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_fp8_e4m3(1e-30f), 0x00);
}

TEST(Fp8E4M3, NarrowingMatchesBruteForce) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> log_mag(-14.0f, 10.0f);
  auto decode = [](uint32_t c) { return fp8_formula(static_cast<uint8_t>(c)); };
  for (int i = 0; i < 200000; ++i) {
    float f = std::exp2(log_mag(rng));
    if (rng() & 1) f = -f;
    const double ax = std::fabs(static_cast<double>(f));
    const uint32_t code = nearest_code(ax, 0x7E, decode);  // saturating: never above 448
    ASSERT_EQ(f32_to_fp8_e4m3(f), (f < 0 ? 0x80u : 0u) | code) << f;
  }
  // Every midpoint between neighbouring codes, and one ulp either side.
  for (uint32_t c = 0; c < 0x7E; ++c) {
    const double mid = (decode(c) + decode(c + 1)) / 2;
    const auto m = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(m), mid);
    EXPECT_EQ(f32_to_fp8_e4m3(m), (c & 1) ? c + 1 : c) << c;
    EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(m, 0.0f)), c) << c;
    EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(m, 1e9f)), c + 1) << c;
  }
}

}  // namespace
}  // namespace tandem
