// formats/quant.h: hand-built blocks of every format dequantized and compared with values
// computed here from the format description; hand-computed quantizations; round-trip error
// bounds on random data; float / int rows; FP8 with block scales.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/fp_convert.h"
#include "formats/quant.h"

namespace tandem {
namespace {

constexpr Half kHalfOne = 0x3C00;       // 1.0
constexpr Half kHalfHalf = 0x3800;      // 0.5
constexpr Half kHalfQuarter = 0x3400;   // 0.25
constexpr Half kHalfMinusOne = 0xBC00;  // -1.0
constexpr Half kHalfTwo = 0x4000;       // 2.0

template <typename Block>
std::vector<float> dequant(DType type, const Block& block, int n) {
  std::vector<float> out(static_cast<size_t>(n), -999.0f);
  dequantize_row(type, &block, out.data(), n);
  return out;
}

// Sets the 2-bit field of element e of a 256-value super-block laid out as Q2_K / Q3_K low bits:
// byte (e / 128) * 32 + e % 32, bits 2 * ((e % 128) / 32).
void set_2bit(uint8_t* qs, int e, int v) {
  qs[(e / 128) * 32 + e % 32] |= static_cast<uint8_t>(v << (2 * ((e % 128) / 32)));
}

// Element e of a Q4_K / Q5_K super-block: group of 64 g = e / 64; low nibble of byte
// g * 32 + e % 32 for the first 32 of the group, high nibble for the second 32.
void set_4bit_k(uint8_t* qs, int e, int v) {
  const int byte = (e / 64) * 32 + e % 32;
  qs[byte] |= static_cast<uint8_t>(((e % 64) < 32 ? v : v << 4));
}

// Scale / min fixture for Q4_K and Q5_K with all 6 bits in use, packed by hand:
//   sc = {1, 2, 3, 4, 33, 45, 50, 63}, m = {0, 1, 2, 3, 17, 20, 40, 62}.
// bytes 0-3: sc[0..3] | top2(sc[4..7]) << 6   = 1|2<<6, 2|2<<6, 3|3<<6, 4|3<<6
// bytes 4-7: m[0..3] | top2(m[4..7]) << 6     = 0|1<<6, 1|1<<6, 2|2<<6, 3|3<<6
// bytes 8-11: low4(sc[4..7]) | low4(m[4..7]) << 4 = 1|1<<4, 13|4<<4, 2|8<<4, 15|14<<4
constexpr uint8_t kK4Scales[12] = {0x81, 0x82, 0xC3, 0xC4, 0x40, 0x41,
                                   0x82, 0xC3, 0x11, 0x4D, 0x82, 0xEF};
constexpr int kK4Sc[8] = {1, 2, 3, 4, 33, 45, 50, 63};
constexpr int kK4Min[8] = {0, 1, 2, 3, 17, 20, 40, 62};

TEST(QuantLayout, BlockSizes) {
  EXPECT_EQ(sizeof(BlockQ4_0), static_cast<size_t>(dtype_info(DType::kQ4_0).block_bytes));
  EXPECT_EQ(sizeof(BlockQ4_K), static_cast<size_t>(dtype_info(DType::kQ4_K).block_bytes));
  EXPECT_EQ(sizeof(BlockQ8_K), static_cast<size_t>(dtype_info(DType::kQ8_K).block_bytes));
  EXPECT_EQ(offsetof(BlockQ6_K, d), 208u);
  EXPECT_EQ(offsetof(BlockQ3_K, d), 108u);
  EXPECT_EQ(offsetof(BlockQ2_K, d), 80u);
  EXPECT_EQ(offsetof(BlockQ5_K, qs), 48u);
}

TEST(QuantDequant, Q4_0ByHand) {
  BlockQ4_0 b{};
  b.d = kHalfHalf;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const std::vector<float> y = dequant(DType::kQ4_0, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 0.5f) << j;       // low nibble j
    EXPECT_EQ(y[j + 16], (7 - j) * 0.5f) << j;  // high nibble 15 - j
  }
}

// MXFP4: value = table[nibble] * 2^(e - 128), the table E2M1's values doubled; element j in the
// low nibble of qs[j], j + 16 in its high nibble (ggml's block_mxfp4).
TEST(QuantDequant, Mxfp4ByHand) {
  EXPECT_EQ(sizeof(BlockMXFP4), static_cast<size_t>(dtype_info(DType::kMXFP4).block_bytes));
  EXPECT_EQ(dtype_info(DType::kMXFP4).ggml_type, 39);
  EXPECT_EQ(e8m0_half(128), 1.0f);
  EXPECT_EQ(e8m0_half(127), 0.5f);
  EXPECT_EQ(e8m0_half(130), 4.0f);
  EXPECT_EQ(e8m0_half(2), std::ldexp(1.0f, -126));
  EXPECT_EQ(e8m0_half(1), std::ldexp(1.0f, -127));  // denormals below
  EXPECT_EQ(e8m0_half(0), std::ldexp(1.0f, -128));
  const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  BlockMXFP4 b{};
  b.e = 129;  // 2^(129 - 127) = 4 on E2M1's values
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const std::vector<float> y = dequant(DType::kMXFP4, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], e2m1[j] * 4.0f) << j;
    EXPECT_EQ(y[j + 16], e2m1[15 - j] * 4.0f) << j;
  }
}

// The quantizer puts the block's largest magnitude in [4, 8) table units (e = floor(log2 amax) +
// 125) and every value on its nearest table entry: within half the local spacing (4 units at the
// top: 8 -> 12) times the scale.
TEST(QuantQuantize, Mxfp4NearestEntries) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * 3.3f;
  BlockMXFP4 b[2];
  quantize_row(DType::kMXFP4, x.data(), b, 64);
  EXPECT_EQ(b[0].e, 126);  // amax ~3.3: floor(log2) = 1 -> 1 - 2 + 127
  std::vector<float> y(64);
  dequantize_row(DType::kMXFP4, b, y.data(), 64);
  for (int i = 0; i < 64; ++i) {
    const float d = e8m0_half(b[i / 32].e);
    EXPECT_LE(std::fabs(y[i] - x[i]), 2.0f * d + 1e-6f) << i;
    // No other table entry is nearer.
    for (int8_t v : kMxfp4Values) EXPECT_LE(std::fabs(y[i] - x[i]), std::fabs(v * d - x[i]));
  }
}

TEST(QuantDequant, Q4_1ByHand) {
  BlockQ4_1 b{};
  b.d = kHalfHalf;
  b.m = kHalfMinusOne;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const std::vector<float> y = dequant(DType::kQ4_1, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j * 0.5f - 1.0f);
    EXPECT_EQ(y[j + 16], (15 - j) * 0.5f - 1.0f);
  }
}

TEST(QuantDequant, Q5_0ByHand) {
  // q[j] = j: low nibbles j | j << 4 (element j+16 has low nibble j too), bit 4 set for j >= 16.
  BlockQ5_0 b{};
  b.d = kHalfQuarter;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | (j << 4));
  const uint8_t qh[4] = {0x00, 0x00, 0xFF, 0xFF};
  std::memcpy(b.qh, qh, 4);
  const std::vector<float> y = dequant(DType::kQ5_0, b, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], (j - 16) * 0.25f) << j;
}

TEST(QuantDequant, Q5_1ByHand) {
  // q[j] = 31 - j: bit 4 set for j <= 15.
  BlockQ5_1 b{};
  b.d = kHalfHalf;
  b.m = kHalfTwo;
  for (int j = 0; j < 16; ++j) {
    b.qs[j] = static_cast<uint8_t>(((31 - j) & 15) | (((15 - j) & 15) << 4));
  }
  const uint8_t qh[4] = {0xFF, 0xFF, 0x00, 0x00};
  std::memcpy(b.qh, qh, 4);
  const std::vector<float> y = dequant(DType::kQ5_1, b, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], (31 - j) * 0.5f + 2.0f) << j;
}

TEST(QuantDequant, Q8_0AndQ8_1ByHand) {
  BlockQ8_0 b{};
  b.d = kHalfQuarter;
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j * 8 - 128);
  std::vector<float> y = dequant(DType::kQ8_0, b, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], (j * 8 - 128) * 0.25f);

  BlockQ8_1 c{};
  c.d = kHalfTwo;
  c.s = kHalfOne;  // not used by dequantization
  for (int j = 0; j < 32; ++j) c.qs[j] = static_cast<int8_t>(127 - j);
  y = dequant(DType::kQ8_1, c, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], (127 - j) * 2.0f);
}

TEST(QuantDequant, Q2_KByHand) {
  BlockQ2_K b{};
  b.d = kHalfHalf;
  b.dmin = kHalfQuarter;
  for (int i = 0; i < 16; ++i) b.scales[i] = static_cast<uint8_t>(i | ((15 - i) << 4));
  auto q = [](int e) { return (e / 7) % 4; };
  for (int e = 0; e < 256; ++e) set_2bit(b.qs, e, q(e));
  const std::vector<float> y = dequant(DType::kQ2_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 16;
    EXPECT_EQ(y[e], 0.5f * s * q(e) - 0.25f * (15 - s)) << e;
  }
}

TEST(QuantDequant, Q3_KByHand) {
  BlockQ3_K b{};
  b.d = kHalfQuarter;
  // 6-bit scales s[j] = 4j + 1 (value s - 32): low nibble of j < 8 in byte j, of j >= 8 in the
  // high nibble of byte j - 8; top 2 bits in byte 8 + j % 4 at bit 2 * (j / 4).
  int s[16];
  for (int j = 0; j < 16; ++j) {
    s[j] = 4 * j + 1;
    if (j < 8)
      b.scales[j] |= static_cast<uint8_t>(s[j] & 15);
    else
      b.scales[j - 8] |= static_cast<uint8_t>((s[j] & 15) << 4);
    b.scales[8 + j % 4] |= static_cast<uint8_t>((s[j] >> 4) << (2 * (j / 4)));
  }
  uint8_t unpacked[16];
  unpack_q3_k_scales(b.scales, unpacked);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(unpacked[j], s[j]);
  // q in -4..3 stored as q + 4: low 2 bits like Q2_K, bit 2 in hmask[e % 32] bit e / 32.
  auto q = [](int e) { return (e * 5) % 8 - 4; };
  for (int e = 0; e < 256; ++e) {
    const int stored = q(e) + 4;
    set_2bit(b.qs, e, stored & 3);
    if (stored & 4) b.hmask[e % 32] |= static_cast<uint8_t>(1 << (e / 32));
  }
  const std::vector<float> y = dequant(DType::kQ3_K, b, 256);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], 0.25f * (s[e / 16] - 32) * q(e)) << e;
}

TEST(QuantDequant, Q4_KByHand) {
  BlockQ4_K b{};
  b.d = kHalfOne;
  b.dmin = kHalfHalf;
  std::memcpy(b.scales, kK4Scales, 12);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    unpack_scale_min_k4(j, b.scales, &sc, &m);
    EXPECT_EQ(sc, kK4Sc[j]) << j;
    EXPECT_EQ(m, kK4Min[j]) << j;
  }
  auto q = [](int e) { return (e * 3 + e / 64) % 16; };
  for (int e = 0; e < 256; ++e) set_4bit_k(b.qs, e, q(e));
  const std::vector<float> y = dequant(DType::kQ4_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const int sub = e / 32;
    EXPECT_EQ(y[e], 1.0f * kK4Sc[sub] * q(e) - 0.5f * kK4Min[sub]) << e;
  }
}

TEST(QuantDequant, Q5_KByHand) {
  BlockQ5_K b{};
  b.d = kHalfHalf;
  b.dmin = kHalfOne;
  std::memcpy(b.scales, kK4Scales, 12);
  auto q = [](int e) { return (e * 7 + 3) % 32; };
  for (int e = 0; e < 256; ++e) {
    set_4bit_k(b.qs, e, q(e) & 15);
    // Fifth bit: qh[e % 32], bit 2 * group (first 32 of the group of 64) or 2 * group + 1.
    if (q(e) & 16) b.qh[e % 32] |= static_cast<uint8_t>(1 << (2 * (e / 64) + ((e % 64) / 32)));
  }
  const std::vector<float> y = dequant(DType::kQ5_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const int sub = e / 32;
    EXPECT_EQ(y[e], 0.5f * kK4Sc[sub] * q(e) - 1.0f * kK4Min[sub]) << e;
  }
}

TEST(QuantDequant, Q6_KByHand) {
  BlockQ6_K b{};
  b.d = kHalfHalf;
  const int8_t scales[16] = {1, -2, 3, -4, 5, 127, -128, 8, 9, -10, 11, 12, -13, 14, 15, 16};
  std::memcpy(b.scales, scales, 16);
  auto q = [](int e) { return (e * 11 + 5) % 64; };  // stored 0..63, value q - 32
  for (int e = 0; e < 256; ++e) {
    // Half h = e / 128, r = e % 128, l = r % 32, quarter k = r / 32: low nibble in
    // ql[h*64 + l + 32*(k & 1)] (high nibble when k >= 2), top 2 bits in qh[h*32 + l] at 2k.
    const int h = e / 128, r = e % 128, l = r % 32, k = r / 32;
    const int v = q(e);
    b.ql[h * 64 + l + 32 * (k & 1)] |= static_cast<uint8_t>((v & 15) << (k >= 2 ? 4 : 0));
    b.qh[h * 32 + l] |= static_cast<uint8_t>((v >> 4) << (2 * k));
  }
  const std::vector<float> y = dequant(DType::kQ6_K, b, 256);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], 0.5f * scales[e / 16] * (q(e) - 32)) << e;
}

TEST(QuantDequant, Q8_KByHand) {
  BlockQ8_K b{};
  b.d = 0.125f;
  for (int j = 0; j < 256; ++j) b.qs[j] = static_cast<int8_t>(j - 128);
  const std::vector<float> y = dequant(DType::kQ8_K, b, 256);
  for (int j = 0; j < 256; ++j) EXPECT_EQ(y[j], (j - 128) * 0.125f);
}

TEST(QuantDequant, RowsOfSeveralBlocks) {
  BlockQ8_0 blocks[3] = {};
  const Half ds[3] = {kHalfOne, kHalfTwo, kHalfHalf};
  for (int b = 0; b < 3; ++b) {
    blocks[b].d = ds[b];
    for (int j = 0; j < 32; ++j) blocks[b].qs[j] = static_cast<int8_t>(j + b);
  }
  std::vector<float> y(96);
  dequantize_row(DType::kQ8_0, blocks, y.data(), 96);
  const float scale[3] = {1.0f, 2.0f, 0.5f};
  for (int i = 0; i < 96; ++i) EXPECT_EQ(y[i], (i % 32 + i / 32) * scale[i / 32]) << i;
}

TEST(QuantDequant, FloatAndIntRows) {
  const uint16_t f16[3] = {0x3C00, 0xC000, 0x3555};
  const uint16_t bf16[3] = {0x3F80, 0xC040, 0x0000};
  const uint8_t f8[3] = {0x38, 0xFE, 0x01};
  const int8_t i8[3] = {-128, 0, 127};
  const uint8_t u8[3] = {0, 200, 255};
  const int16_t i16[3] = {-32768, 5, 32767};
  const int32_t i32[3] = {-7, 0, 1 << 24};
  const int64_t i64[3] = {-1, 3, int64_t{1} << 40};
  const double f64[3] = {0.5, -1e300, 1.0 / 3};
  const float f32[3] = {1.5f, -0.0f, 3e38f};
  float y[3];
  dequantize_row(DType::kF16, f16, y, 3);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.0f);
  EXPECT_EQ(y[2], 0x155 / 1024.0f * 0.25f + 0.25f);  // exponent 13 -> 2^-2, mantissa 0x155
  dequantize_row(DType::kBF16, bf16, y, 3);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -3.0f);
  EXPECT_EQ(y[2], 0.0f);
  dequantize_row(DType::kF8E4M3, f8, y, 3);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -448.0f);
  EXPECT_EQ(y[2], 1.0f / 512);
  dequantize_row(DType::kI8, i8, y, 3);
  EXPECT_EQ(y[0], -128.0f);
  EXPECT_EQ(y[2], 127.0f);
  dequantize_row(DType::kU8, u8, y, 3);
  EXPECT_EQ(y[1], 200.0f);
  EXPECT_EQ(y[2], 255.0f);
  dequantize_row(DType::kI16, i16, y, 3);
  EXPECT_EQ(y[0], -32768.0f);
  EXPECT_EQ(y[2], 32767.0f);
  dequantize_row(DType::kI32, i32, y, 3);
  EXPECT_EQ(y[0], -7.0f);
  EXPECT_EQ(y[2], 16777216.0f);
  dequantize_row(DType::kI64, i64, y, 3);
  EXPECT_EQ(y[0], -1.0f);
  EXPECT_EQ(y[2], 1099511627776.0f);
  dequantize_row(DType::kF64, f64, y, 3);
  EXPECT_EQ(y[0], 0.5f);
  EXPECT_TRUE(std::isinf(y[1]) && y[1] < 0);
  EXPECT_EQ(y[2], 1.0f / 3);
  dequantize_row(DType::kF32, f32, y, 3);
  EXPECT_EQ(std::memcmp(y, f32, sizeof(y)), 0);
}

TEST(QuantFloat, VectorRowsEqualScalarConversions) {
  // Every F16 code through dequantize_row, and F32 bit patterns (incl. NaN, inf, subnormals)
  // through quantize_row, against the scalar references (odd length: SIMD body + tail).
  std::vector<uint16_t> codes(65535);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint16_t>(i);
  std::vector<float> wide(codes.size());
  dequantize_row(DType::kF16, codes.data(), wide.data(), static_cast<int64_t>(codes.size()));
  for (size_t i = 0; i < codes.size(); ++i) {
    const float ref = f16_to_f32(codes[i]);
    ASSERT_EQ(std::memcmp(&wide[i], &ref, 4), 0) << i;
  }
  // Random bit patterns, plus every top half-word with low half-words that hit the FP8 / BF16
  // midpoints (low bits 0) and their neighbours.
  std::mt19937 rng(5);
  std::vector<float> src;
  auto push_bits = [&src](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    src.push_back(f);
  };
  for (int i = 0; i < 100003; ++i) push_bits(static_cast<uint32_t>(rng()));
  for (uint32_t hi = 0; hi < 65536; ++hi) {
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      push_bits((hi << 16) | lo);
    }
  }
  std::vector<uint16_t> h(src.size()), bf(src.size());
  std::vector<uint8_t> f8(src.size());
  const auto n = static_cast<int64_t>(src.size());
  quantize_row(DType::kF16, src.data(), h.data(), n);
  quantize_row(DType::kBF16, src.data(), bf.data(), n);
  quantize_row(DType::kF8E4M3, src.data(), f8.data(), n);
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(h[i], f32_to_f16(src[i])) << i;
    ASSERT_EQ(bf[i], f32_to_bf16(src[i])) << i;
    ASSERT_EQ(f8[i], f32_to_fp8_e4m3(src[i])) << i;
  }
  std::vector<float> back(src.size());
  quantize_row(DType::kF32, src.data(), back.data(), n);
  EXPECT_EQ(std::memcmp(back.data(), src.data(), src.size() * 4), 0);
}

TEST(QuantApi, CanQuantizeAndErrors) {
  for (DType t :
       {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kQ4_0, DType::kQ4_1,
        DType::kQ5_0, DType::kQ5_1, DType::kQ8_0, DType::kQ8_1, DType::kQ2_K, DType::kQ3_K,
        DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ8_K, DType::kMXFP4}) {
    EXPECT_TRUE(can_quantize(t)) << dtype_name(t);
  }
  for (DType t : {DType::kI8, DType::kU8, DType::kI16, DType::kI32, DType::kI64, DType::kF64}) {
    EXPECT_FALSE(can_quantize(t)) << dtype_name(t);
    float x = 1.0f;
    int64_t out = 0;
    try {
      quantize_row(t, &x, &out, 1);
      ADD_FAILURE() << "no error for " << dtype_name(t);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
      EXPECT_NE(std::string(e.what()).find(dtype_name(t)), std::string::npos) << e.what();
    }
  }
}

// ---- hand-computed quantizations ----

TEST(QuantQuantize, Q8_0ByHand) {
  // amax 127 -> d = 1 exactly; roundf rounds halves away from zero.
  float x[32] = {127.0f, -63.5f, 2.5f, -2.5f, 0.49f, -0.5f, 1.5f, 100.2f};
  BlockQ8_0 b{};
  quantize_row(DType::kQ8_0, x, &b, 32);
  EXPECT_EQ(b.d, kHalfOne);
  const int expect[8] = {127, -64, 3, -3, 0, -1, 2, 100};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(b.qs[j], expect[j]) << j;
  for (int j = 8; j < 32; ++j) EXPECT_EQ(b.qs[j], 0);
}

TEST(QuantQuantize, Q4_0ByHand) {
  // The value of largest magnitude is -8: d = -8 / -8 = 1, q = trunc(x / d + 8.5) clamped to 15.
  float x[32] = {-8.0f, 7.0f, 7.5f, 3.49f, 3.5f, -3.5f, 0.0f, -7.6f};
  BlockQ4_0 b{};
  quantize_row(DType::kQ4_0, x, &b, 32);
  EXPECT_EQ(b.d, kHalfOne);
  const int expect[8] = {0, 15, 15, 11, 12, 5, 8, 0};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(b.qs[j] & 15, expect[j]) << j;
  for (int j = 0; j < 16; ++j) EXPECT_EQ(b.qs[j] >> 4, 8) << j;  // x[16..31] = 0
}

TEST(QuantQuantize, Q8_KByHand) {
  // max = -254 -> iscale = 127 / 254 = 0.5, d = 1 / iscale = 2; q = nearest_int(x / 2) (ties to
  // even), bsums = sums of 16.
  std::vector<float> x(256, 0.0f);
  x[0] = -254.0f;
  x[1] = 3.0f;   // 1.5 -> 2
  x[2] = 5.0f;   // 2.5 -> 2
  x[3] = -1.0f;  // -0.5 -> 0
  x[20] = 100.0f;
  BlockQ8_K b{};
  quantize_row(DType::kQ8_K, x.data(), &b, 256);
  EXPECT_EQ(b.d, 2.0f);
  EXPECT_EQ(b.qs[0], -127);
  EXPECT_EQ(b.qs[1], 2);
  EXPECT_EQ(b.qs[2], 2);
  EXPECT_EQ(b.qs[3], 0);
  EXPECT_EQ(b.qs[20], 50);
  EXPECT_EQ(b.bsums[0], -127 + 2 + 2);
  EXPECT_EQ(b.bsums[1], 50);
  for (int j = 2; j < 16; ++j) EXPECT_EQ(b.bsums[j], 0);
}

TEST(QuantQuantize, ZeroRowsGiveZeroBlocks) {
  const std::vector<float> zeros(512, 0.0f);
  for (DType t :
       {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ8_0, DType::kQ8_1,
        DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ8_K,
        DType::kMXFP4}) {
    std::vector<uint8_t> q(static_cast<size_t>(dtype_bytes(t, 512)), 0xAB);
    quantize_row(t, zeros.data(), q.data(), 512);
    std::vector<float> y(512, 1.0f);
    dequantize_row(t, q.data(), y.data(), 512);
    for (float v : y) ASSERT_EQ(v, 0.0f) << dtype_name(t);
  }
}

// ---- round trips on random data ----

struct RoundTrip {
  float max_err_over_step;  // max over values of |x - y| / (quantization step of its group)
  float rel_rmse;           // sqrt(mean (x - y)^2) / sqrt(mean x^2)
};

// Quantizes `x` to `type`, dequantizes, and measures the error. `step(block bytes, e)` returns
// the quantization step that applies to element e of the block.
template <typename Block, typename Step>
RoundTrip round_trip(DType type, const std::vector<float>& x, Step step) {
  const auto n = static_cast<int64_t>(x.size());
  const int per_block = dtype_info(type).block_elems;
  std::vector<Block> q(x.size() / per_block);
  std::vector<float> y(x.size());
  quantize_row(type, x.data(), q.data(), n);
  dequantize_row(type, q.data(), y.data(), n);
  RoundTrip r{0, 0};
  double err2 = 0, x2 = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double err = std::fabs(static_cast<double>(x[i]) - y[i]);
    const float s = step(q[i / per_block], static_cast<int>(i % per_block));
    r.max_err_over_step = std::max(r.max_err_over_step, static_cast<float>(err / s));
    err2 += err * err;
    x2 += static_cast<double>(x[i]) * x[i];
  }
  r.rel_rmse = static_cast<float>(std::sqrt(err2 / x2));
  return r;
}

std::vector<float> random_rows(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = normal(rng);
  // Outliers and a shifted segment exercise the scale and min searches.
  for (int i = 0; i < n; i += 97) x[i] *= 8.0f;
  for (int i = n / 2; i < n / 2 + 256; ++i) x[i] += 0.05f;
  return x;
}

float half(Half h) {
  return f16_to_f32(h);
}

TEST(QuantRoundTrip, LegacyFormatsWithinTheirStep) {
  const std::vector<float> x = random_rows(32 * 512, 1);
  // Q8_0 / Q8_1 / Q4_1 / Q5_1: round to nearest -> half a step (plus the F16 rounding of d,
  // which moves q * d by up to 127 * d * 2^-11 ~ 0.06 step).
  RoundTrip r =
      round_trip<BlockQ8_0>(DType::kQ8_0, x, [](const BlockQ8_0& b, int) { return half(b.d); });
  EXPECT_LE(r.max_err_over_step, 0.5f + 127.0f / 2048) << "q8_0";
  EXPECT_LT(r.rel_rmse, 0.01f);
  r = round_trip<BlockQ8_1>(DType::kQ8_1, x, [](const BlockQ8_1& b, int) { return half(b.d); });
  EXPECT_LE(r.max_err_over_step, 0.5f + 127.0f / 2048) << "q8_1";
  r = round_trip<BlockQ4_1>(DType::kQ4_1, x, [](const BlockQ4_1& b, int) { return half(b.d); });
  EXPECT_LE(r.max_err_over_step, 0.5f + 16.0f / 1024) << "q4_1";  // d and m both F16-rounded
  EXPECT_LT(r.rel_rmse, 0.12f);
  r = round_trip<BlockQ5_1>(DType::kQ5_1, x, [](const BlockQ5_1& b, int) { return half(b.d); });
  EXPECT_LE(r.max_err_over_step, 0.5f + 32.0f / 1024) << "q5_1";
  EXPECT_LT(r.rel_rmse, 0.06f);
  // Q4_0 / Q5_0 map the largest magnitude to -8 / -16 exactly; values of the other sign beyond
  // +7 / +15 steps are clamped, so the bound is one step.
  r = round_trip<BlockQ4_0>(DType::kQ4_0, x,
                            [](const BlockQ4_0& b, int) { return std::fabs(half(b.d)); });
  EXPECT_LE(r.max_err_over_step, 1.0f + 8.0f / 1024) << "q4_0";
  EXPECT_LT(r.rel_rmse, 0.15f);
  r = round_trip<BlockQ5_0>(DType::kQ5_0, x,
                            [](const BlockQ5_0& b, int) { return std::fabs(half(b.d)); });
  EXPECT_LE(r.max_err_over_step, 1.0f + 16.0f / 1024) << "q5_0";
  EXPECT_LT(r.rel_rmse, 0.08f);
}

// The values a K-quant sub-block can represent: a * l - b for integer l in [lo, hi].
struct Grid {
  float a, b;
  int lo, hi;
};

struct GridCheck {
  int64_t not_nearest = 0;  // values whose dequantization is not the nearest grid value
  int64_t skipped = 0;      // values in sub-blocks with a zero scale
  float max_in_range = 0;   // max |x - y| / |a| over values inside the grid's range
  float rel_rmse = 0;
};

// K-quants re-quantize every value against the scales they store, so each dequantized value must
// be the grid value nearest to the input: within half a step inside the grid's range, the grid's
// end outside it.
template <typename Block, typename GridOf>
GridCheck check_nearest_grid(DType type, const std::vector<float>& x, GridOf grid_of) {
  const auto n = static_cast<int64_t>(x.size());
  std::vector<Block> q(x.size() / kQK_K);
  std::vector<float> y(x.size());
  quantize_row(type, x.data(), q.data(), n);
  dequantize_row(type, q.data(), y.data(), n);
  GridCheck c;
  double err2 = 0, x2 = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double err = std::fabs(static_cast<double>(x[i]) - y[i]);
    err2 += err * err;
    x2 += static_cast<double>(x[i]) * x[i];
    const Grid g = grid_of(q[i / kQK_K], static_cast<int>(i % kQK_K));
    if (g.a == 0) {
      ++c.skipped;
      continue;
    }
    const double t = (static_cast<double>(x[i]) + g.b) / g.a;
    const double l =
        std::clamp(std::nearbyint(t), static_cast<double>(g.lo), static_cast<double>(g.hi));
    const double best = std::fabs(static_cast<double>(g.a) * l - g.b - x[i]);
    if (err > best + 1e-4 * std::fabs(g.a)) ++c.not_nearest;
    if (t >= g.lo - 0.5 && t <= g.hi + 0.5) {
      c.max_in_range = std::max(c.max_in_range, static_cast<float>(err / std::fabs(g.a)));
    }
  }
  c.rel_rmse = static_cast<float>(std::sqrt(err2 / x2));
  return c;
}

Grid k4_grid(const uint8_t* scales, Half d, Half dmin, int e, int hi) {
  uint8_t sc, m;
  unpack_scale_min_k4(e / 32, scales, &sc, &m);
  return {half(d) * sc, half(dmin) * m, 0, hi};
}

TEST(QuantRoundTrip, KQuantsGiveTheNearestValueOfTheirGrid) {
  const std::vector<float> x = random_rows(256 * 64, 2);
  struct Case {
    const char* name;
    GridCheck check;
    float max_rel_rmse;  // about 1.3x what ggml's quantizers reach on this data
  };
  auto q2_k = [](const BlockQ2_K& b, int e) {
    const uint8_t s = b.scales[e / 16];
    return Grid{half(b.d) * (s & 15), half(b.dmin) * (s >> 4), 0, 3};
  };
  auto q3_k = [](const BlockQ3_K& b, int e) {
    uint8_t s[16];
    unpack_q3_k_scales(b.scales, s);
    return Grid{half(b.d) * (s[e / 16] - 32), 0.0f, -4, 3};
  };
  auto q4_k = [](const BlockQ4_K& b, int e) { return k4_grid(b.scales, b.d, b.dmin, e, 15); };
  auto q5_k = [](const BlockQ5_K& b, int e) { return k4_grid(b.scales, b.d, b.dmin, e, 31); };
  auto q6_k = [](const BlockQ6_K& b, int e) {
    return Grid{half(b.d) * b.scales[e / 16], 0.0f, -32, 31};
  };
  auto q8_k = [](const BlockQ8_K& b, int) { return Grid{b.d, 0.0f, -127, 127}; };
  const Case cases[] = {
      {"q2_k", check_nearest_grid<BlockQ2_K>(DType::kQ2_K, x, q2_k), 0.42f},
      {"q3_k", check_nearest_grid<BlockQ3_K>(DType::kQ3_K, x, q3_k), 0.24f},
      {"q4_k", check_nearest_grid<BlockQ4_K>(DType::kQ4_K, x, q4_k), 0.115f},
      {"q5_k", check_nearest_grid<BlockQ5_K>(DType::kQ5_K, x, q5_k), 0.058f},
      {"q6_k", check_nearest_grid<BlockQ6_K>(DType::kQ6_K, x, q6_k), 0.033f},
      {"q8_k", check_nearest_grid<BlockQ8_K>(DType::kQ8_K, x, q8_k), 0.025f},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.check.not_nearest, 0) << c.name;
    EXPECT_LT(c.check.skipped, static_cast<int64_t>(x.size() / 100)) << c.name;
    EXPECT_LE(c.check.max_in_range, 0.5f + 1e-4f) << c.name;
    EXPECT_LT(c.check.rel_rmse, c.max_rel_rmse) << c.name;
    std::printf("%s: rel rmse %.4f, in-range max err %.3f step, %lld skipped\n", c.name,
                c.check.rel_rmse, c.check.max_in_range, static_cast<long long>(c.check.skipped));
  }
}

// ---- FP8 with block scales ----

TEST(QuantFp8Blocks, DequantizeByHand) {
  // 3 x 5 weight, blocks of 2 x 3: scale grid 2 x 2 with partial edge blocks.
  const uint8_t w[15] = {0x38, 0x40, 0xB8, 0x01, 0x7E,   // 1, 2, -1, 2^-9, 448
                         0x30, 0x3C, 0x00, 0x80, 0xC0,   // 0.5, 1.5, 0, -0, -2
                         0x48, 0x08, 0x39, 0x44, 0xFE};  // 4, 2^-6, 1.125, 3, -448
  const float scale_inv[4] = {2.0f, 0.5f, 10.0f, -1.0f};
  float y[15];
  dequantize_fp8_blocks(w, scale_inv, 3, 5, 2, 3, y);
  const float expect[15] = {2.0f,  4.0f,  -2.0f, 0.5f / 512, 224.0f, 1.0f,  3.0f,  0.0f,
                            -0.0f, -1.0f, 40.0f, 10.0f / 64, 11.25f, -3.0f, 448.0f};
  for (int i = 0; i < 15; ++i) EXPECT_EQ(y[i], expect[i]) << i;
}

TEST(QuantFp8Blocks, RoundTripWithPartialBlocksAndPerRowScales) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& [rows, cols, br, bc] :
       std::vector<std::array<int, 4>>{{130, 200, 128, 128}, {7, 33, 1, 33}, {5, 7, 2, 3}}) {
    std::vector<float> x(static_cast<size_t>(rows) * cols);
    for (float& v : x) v = normal(rng) * 0.1f;
    // An all-zero block (the first) keeps scale 1.
    for (int r = 0; r < std::min(br, rows); ++r) {
      for (int c = 0; c < std::min(bc, cols); ++c) x[static_cast<size_t>(r) * cols + c] = 0.0f;
    }
    const int srows = (rows + br - 1) / br, scols = (cols + bc - 1) / bc;
    std::vector<uint8_t> w(x.size());
    std::vector<float> scale(static_cast<size_t>(srows) * scols, -1.0f);
    quantize_fp8_blocks(x.data(), rows, cols, br, bc, w.data(), scale.data());
    std::vector<float> y(x.size());
    dequantize_fp8_blocks(w.data(), scale.data(), rows, cols, br, bc, y.data());
    EXPECT_EQ(scale[0], 1.0f);
    for (int sr = 0; sr < srows; ++sr) {
      for (int sc = 0; sc < scols; ++sc) {
        float amax = 0.0f;
        for (int r = sr * br; r < std::min(rows, (sr + 1) * br); ++r) {
          for (int c = sc * bc; c < std::min(cols, (sc + 1) * bc); ++c) {
            amax = std::max(amax, std::fabs(x[static_cast<size_t>(r) * cols + c]));
          }
        }
        if (amax > 0) {
          EXPECT_FLOAT_EQ(scale[sr * scols + sc], amax / 448.0f);
        }
      }
    }
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        const size_t i = static_cast<size_t>(r) * cols + c;
        const float s = scale[(r / br) * scols + c / bc];
        // E4M3 keeps 3 mantissa bits: relative error <= 2^-4 for normals; below 2^-6 (in units
        // of the scale) the absolute error is <= half the subnormal step 2^-10.
        const float bound = std::max(std::fabs(x[i]) / 16, s * std::ldexp(1.0f, -10)) * 1.0001f;
        ASSERT_LE(std::fabs(x[i] - y[i]), bound) << rows << "x" << cols << " at " << r << "," << c;
      }
    }
  }
}

}  // namespace
}  // namespace tandem
