// The CUDA dequantization kernels against the CPU reference, formats/quant.h: every supported
// dtype, random blocks, F32 output compared bit for bit and BF16 output against the reference
// rounded by core/fp_convert.h, on odd row counts, padded / misaligned row strides and partial
// FP8 scale blocks. Padding in the destination must stay untouched. The same for the product of
// a weight as stored with a few activation rows (matvec.h), against the dequantized row dotted
// in double precision.
//
// Without a GPU the test still checks what it can on the host (the per-format decoders the
// kernels are built from, the product's inner loop split as a warp splits it, and the launchers'
// argument checks, the Q8_0 cache's arithmetic), then exits 77 (skipped), or fails
// when CUDA is broken rather than absent (gpu_gate.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/fp_convert.h"
#include "formats/quant.h"
#include "tests/gpu/gpu_gate.h"

#ifdef TANDEM_HAVE_CUDA
#include "ops/cpu/ref_ops.h"
#include "ops/cuda/cublas_api.h"
#include "ops/cuda/cuda_info.h"
#include "ops/cuda/cuda_util.h"
#include "ops/cuda/dequant.h"
#include "ops/cuda/dequant_decode.h"
#include "ops/cuda/dequant_formats.h"
#include "ops/cuda/matvec.h"
#include "ops/cuda/quant_dot.h"

namespace tandem {
namespace {

// Where a block keeps its F16 scales (offsetof on formats/quant.h's structs, not on the decoder's
// own offsets), so that random blocks get finite scales: a NaN scale would only test how the CPU
// and the GPU propagate NaN payloads, which IEEE leaves open.
struct BlockLayout {
  DType type;
  std::vector<size_t> half_offsets;
  bool f32_scale_at_0 = false;  // Q8_K
};

const std::vector<BlockLayout>& block_layouts() {
  static const std::vector<BlockLayout> layouts = {
      {DType::kQ4_0, {offsetof(BlockQ4_0, d)}},
      {DType::kQ4_1, {offsetof(BlockQ4_1, d), offsetof(BlockQ4_1, m)}},
      {DType::kQ5_0, {offsetof(BlockQ5_0, d)}},
      {DType::kQ5_1, {offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m)}},
      {DType::kQ8_0, {offsetof(BlockQ8_0, d)}},
      {DType::kQ8_1, {offsetof(BlockQ8_1, d), offsetof(BlockQ8_1, s)}},
      {DType::kQ2_K, {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)}},
      {DType::kQ3_K, {offsetof(BlockQ3_K, d)}},
      {DType::kQ4_K, {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)}},
      {DType::kQ5_K, {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)}},
      {DType::kQ6_K, {offsetof(BlockQ6_K, d)}},
      {DType::kQ8_K, {}, true},
      {DType::kMXFP4, {}},  // (an E8M0 byte: every value is a scale)
  };
  return layouts;
}

const std::vector<DType>& element_types() {
  static const std::vector<DType> types = {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3};
  return types;
}

bool is_block(DType type) {
  return dtype_info(type).is_block;
}
int64_t block_elems(DType type) {
  return dtype_info(type).block_elems;
}

uint16_t random_finite_f16(std::mt19937& rng) {
  for (;;) {
    const auto h = static_cast<uint16_t>(rng());
    if (((h >> 10) & 0x1F) != 0x1F) return h;
  }
}

// rows x row_bytes random bytes holding values of `type`: every bit pattern of the quants and
// sub-block scales, finite F16 / F32 block scales. Element types get any pattern (no FP8 NaN with
// `no_nan`: NaN times a scale would again only test NaN propagation).
std::vector<uint8_t> random_data(DType type, int64_t rows, int64_t row_bytes, std::mt19937& rng,
                                 bool no_nan = false) {
  std::vector<uint8_t> data(static_cast<size_t>(rows * row_bytes));
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
  const DTypeInfo& info = dtype_info(type);
  if (info.is_block) {
    const BlockLayout* layout = nullptr;
    for (const BlockLayout& l : block_layouts()) {
      if (l.type == type) layout = &l;
    }
    for (int64_t r = 0; r < rows; ++r) {
      // Only whole blocks get finite scales; bytes past them are row padding, left random.
      const int64_t blocks = row_bytes / info.block_bytes;
      for (int64_t b = 0; b < blocks; ++b) {
        uint8_t* block = data.data() + r * row_bytes + b * info.block_bytes;
        for (size_t off : layout->half_offsets) {
          const uint16_t h = random_finite_f16(rng);
          std::memcpy(block + off, &h, 2);
        }
        if (layout->f32_scale_at_0) {
          const float d = std::uniform_real_distribution<float>(-4.0f, 4.0f)(rng);
          std::memcpy(block, &d, 4);
        }
      }
    }
  } else if (type == DType::kF8E4M3 && no_nan) {
    for (uint8_t& b : data) {
      if ((b & 0x7F) == 0x7F) b = 0x00;
    }
  }
  return data;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- host checks: run everywhere ----

// The decoders behind the kernels, run on the host, equal dequantize_row bit for bit. This catches
// a wrong layout without a GPU; the GPU tests below check the kernels that call them.
template <typename Fmt>
void check_host_decoder(DType type, std::mt19937& rng) {
  SCOPED_TRACE(std::string(dtype_name(type)));
  const int64_t n = 64 * Fmt::kBlockElems;
  const std::vector<uint8_t> src = random_data(type, 1, dtype_bytes(type, n), rng);
  std::vector<float> ref(n), got(n);
  dequantize_row(type, src.data(), ref.data(), n);
  for (int64_t c = 0; c < n / dequant::kChunk; ++c) {
    const int64_t e = c * dequant::kChunk;
    Fmt::decode8(src.data() + e / Fmt::kBlockElems * Fmt::kBlockBytes,
                 static_cast<int>(e % Fmt::kBlockElems / dequant::kChunk), got.data() + e);
  }
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (bits(got[i]) != bits(ref[i]) && mismatches++ < 5) {
      ADD_FAILURE() << "value " << i << ": decoder " << got[i] << " reference " << ref[i];
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(CudaDequantHost, BlockDecodersMatchReference) {
  std::mt19937 rng(7);
  namespace dq = dequant;
  check_host_decoder<dq::Q4_0>(DType::kQ4_0, rng);
  check_host_decoder<dq::Q4_1>(DType::kQ4_1, rng);
  check_host_decoder<dq::Q5_0>(DType::kQ5_0, rng);
  check_host_decoder<dq::Q5_1>(DType::kQ5_1, rng);
  check_host_decoder<dq::Q8_0>(DType::kQ8_0, rng);
  check_host_decoder<dq::Q8_1>(DType::kQ8_1, rng);
  check_host_decoder<dq::Q2_K>(DType::kQ2_K, rng);
  check_host_decoder<dq::Q3_K>(DType::kQ3_K, rng);
  check_host_decoder<dq::Q4_K>(DType::kQ4_K, rng);
  check_host_decoder<dq::Q5_K>(DType::kQ5_K, rng);
  check_host_decoder<dq::Q6_K>(DType::kQ6_K, rng);
  check_host_decoder<dq::Q8_K>(DType::kQ8_K, rng);
  check_host_decoder<dq::MXFP4>(DType::kMXFP4, rng);
}

template <typename Fmt>
void check_host_element_decoder(DType type) {
  SCOPED_TRACE(std::string(dtype_name(type)));
  // Every F16 / BF16 / FP8 bit pattern; for F32 a spread of patterns.
  const int64_t n = Fmt::kBytes == 4 ? 1 << 16 : int64_t{1} << (8 * Fmt::kBytes);
  std::vector<uint8_t> src(n * Fmt::kBytes);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t v =
        Fmt::kBytes == 4 ? static_cast<uint32_t>(i) * 65537u : static_cast<uint32_t>(i);
    std::memcpy(&src[i * Fmt::kBytes], &v, Fmt::kBytes);
  }
  std::vector<float> ref(n);
  // Element by element: the scalar conversions of core/fp_convert.h.
  for (int64_t i = 0; i < n; ++i) dequantize_row(type, &src[i * Fmt::kBytes], &ref[i], 1);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float got = Fmt::load(&src[i * Fmt::kBytes]);
    if (bits(got) != bits(ref[i]) && mismatches++ < 5) {
      ADD_FAILURE() << "pattern " << i << ": decoder " << std::hex << bits(got) << " reference "
                    << bits(ref[i]);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(CudaDequantHost, ElementDecodersMatchReference) {
  check_host_element_decoder<dequant::F32>(DType::kF32);
  check_host_element_decoder<dequant::F16>(DType::kF16);
  check_host_element_decoder<dequant::BF16>(DType::kBF16);
  check_host_element_decoder<dequant::F8E4M3>(DType::kF8E4M3);
}

TEST(CudaDequantHost, Bf16RoundingMatchesReference) {
  std::mt19937 rng(11);
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = static_cast<uint32_t>(rng());
    if (i < 4) u = std::array<uint32_t, 4>{0x7F800001u, 0xFFC00000u, 0x7F7FFFFFu, 0x00008000u}[i];
    float f;
    std::memcpy(&f, &u, 4);
    ASSERT_EQ(dequant::f32_to_bf16(f), f32_to_bf16(f)) << std::hex << u;
  }
}

TEST(CudaDequantHost, F16RoundingMatchesReference) {
  std::mt19937 rng(12);
  const std::array<uint32_t, 10> edges = {0x7F800001u, 0xFFC00000u, 0x477FEFFFu, 0x477FF000u,
                                          0x38800000u, 0x387FFFFFu, 0x33000000u, 0x32FFFFFFu,
                                          0x33800001u, 0x80000000u};
  for (int i = 0; i < 400000; ++i) {
    uint32_t u = static_cast<uint32_t>(rng());
    if (i < static_cast<int>(edges.size())) u = edges[static_cast<size_t>(i)];
    if (i % 3 == 0) u = (u & 0x87FFFFFFu) | 0x38000000u;  // near F16's range and subnormals
    float f;
    std::memcpy(&f, &u, 4);
    ASSERT_EQ(dequant::f32_to_f16(f), f32_to_f16(f)) << std::hex << u;
  }
}

// The Q8_0 cache's arithmetic as kv_write_q8_kernel runs it (a block's largest magnitude and
// finiteness over its 32 lanes, then the shared scale, inverse and values) writes the CPU cache's
// bytes (ops::q8_quantize), and its reads are ops::q8_value's: random rows of odd lengths, blocks
// of zeros, of huge and tiny values, with a NaN or an infinity.
TEST(CudaDequantHost, Q8CacheRowsEqualTheCpuCaches) {
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const int64_t d : {int64_t{1}, int64_t{31}, int64_t{32}, int64_t{100}, int64_t{576}}) {
    for (int kind = 0; kind < 6; ++kind) {
      std::vector<float> x(static_cast<size_t>(d));
      for (float& v : x) v = normal(rng) * (kind == 2 ? 1e30f : kind == 3 ? 1e-30f : 1.0f);
      if (kind == 1) std::fill(x.begin(), x.begin() + std::min<int64_t>(d, 40), 0.0f);
      if (kind == 4) x[static_cast<size_t>(d / 2)] = std::numeric_limits<float>::quiet_NaN();
      if (kind == 5) x[static_cast<size_t>(d - 1)] = -std::numeric_limits<float>::infinity();
      const int64_t bytes = ops::q8_row_bytes(d), lead = ops::q8_lead_bytes(d);
      std::vector<int8_t> want(static_cast<size_t>(bytes), 0x55), got(want.size(), 0x55);
      ops::q8_quantize(x.data(), d, want.data() + lead);
      int8_t* values = got.data() + lead;
      for (int64_t b0 = 0; b0 < d; b0 += 32) {  // a warp per block
        float amax = 0.0f;
        bool finite = true;
        for (int64_t i = b0; i < b0 + 32; ++i) {
          const float v = i < d ? x[static_cast<size_t>(i)] : 0.0f;
          amax = std::fmax(amax, std::fabs(v));
          finite = finite && (i >= d || std::isfinite(v));
        }
        const float scale = dequant::q8_cache_scale(amax, finite);
        for (int64_t i = b0; i < std::min(d, b0 + 32); ++i) {
          values[i] = dequant::q8_cache_value(x[static_cast<size_t>(i)],
                                              dequant::q8_cache_inverse(scale, finite), finite);
        }
        std::memcpy(values - 4 * (1 + b0 / 32), &scale, 4);
      }
      for (int64_t i = d; i < (d + 3) / 4 * 4; ++i) values[i] = 0;
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size()))
          << "d " << d << " kind " << kind;
      for (int64_t i = 0; i < d; ++i) {
        const float a = dequant::q8_cache_load(values, i), b = ops::q8_value(want.data() + lead, i);
        ASSERT_TRUE(std::memcmp(&a, &b, 4) == 0 || (std::isnan(a) && std::isnan(b))) << i;
      }
    }
  }
}

// The three BF16 parts of an F32 value (what a BF16 weight's tensor-core products take) add up
// to it exactly for |x| >= 2^-110, over random values of every exponent, with zeros, signs,
// infinities and F32's largest; below, within 2^-133.
TEST(CudaDequantHost, Bf16PartsSumToTheF32Value) {
  std::mt19937 rng(31);
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           1.0f,
                           -1.5f,
                           std::numeric_limits<float>::max(),
                           -std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::min(),
                           1e-35f};
  for (int i = 0; i < 300000; ++i) {
    const uint32_t u = static_cast<uint32_t>(rng());
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isfinite(f)) xs.push_back(f);
  }
  for (const float x : xs) {
    uint16_t p[3];
    dequant::split_bf16x3(x, &p[0], &p[1], &p[2]);
    double sum = 0;
    for (uint16_t b : p) sum += static_cast<double>(bf16_to_f32(b));
    if (std::fabs(x) >= std::ldexp(1.0, -110)) {
      ASSERT_EQ(sum, static_cast<double>(x)) << std::hexfloat << x;
    } else {
      ASSERT_LE(std::fabs(sum - x), std::ldexp(1.0, -133)) << std::hexfloat << x;
    }
  }
  uint16_t p[3];
  dequant::split_bf16x3(std::numeric_limits<float>::infinity(), &p[0], &p[1], &p[2]);
  EXPECT_EQ(bf16_to_f32(p[0]), std::numeric_limits<float>::infinity());
}

TEST(CudaDequantHost, LaunchersRejectBadArguments) {
  float dummy[64];
  void* p = dummy;
  EXPECT_FALSE(cuda_can_dequantize(DType::kI8));
  EXPECT_FALSE(cuda_can_dequantize(DType::kF64));
  EXPECT_TRUE(cuda_can_dequantize(DType::kQ6_K));
  // Unsupported source or output type, a partial block, a short source row or destination row:
  // all refused before anything reaches the device.
  EXPECT_EQ(dequantize_rows_cuda(DType::kI32, p, 128, 1, 32, DType::kF32, p, 32, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(dequantize_rows_cuda(DType::kQ8_0, p, 34, 1, 32, DType::kF16, p, 32, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(dequantize_rows_cuda(DType::kQ8_0, p, 68, 1, 48, DType::kF32, p, 48, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(dequantize_rows_cuda(DType::kQ8_0, p, 33, 1, 32, DType::kF32, p, 32, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(dequantize_rows_cuda(DType::kF16, p, 64, 2, 32, DType::kF32, p, 31, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(dequantize_fp8_blocks_cuda(static_cast<uint8_t*>(p), 32, dummy, 1, 4, 32, 128, 0,
                                       DType::kF32, p, 32, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(dequantize_fp8_blocks_cuda(static_cast<uint8_t*>(p), 32, dummy, 1, 4, 32, 4, 16,
                                       DType::kF32, p, 32, nullptr),
            cudaErrorInvalidValue);  // 2 scale columns needed
  // Nothing to do is not an error.
  EXPECT_EQ(
      dequantize_rows_cuda(DType::kQ4_K, nullptr, 0, 0, 256, DType::kF32, nullptr, 256, nullptr),
      cudaSuccess);
}

// ---- the quantized product (matvec.h) ----

// `rows` rows of `cols` finite values of `type` (row stride row_bytes): block types as
// random_data makes them, element types converted from normal floats.
std::vector<uint8_t> finite_rows(DType type, int64_t rows, int64_t cols, int64_t row_bytes,
                                 std::mt19937& rng) {
  if (type == DType::kMXFP4) {  // exponents near 2^0: the dot products stay finite
    std::vector<uint8_t> data = random_data(type, rows, row_bytes, rng);
    const int64_t bb = dtype_info(type).block_bytes;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < cols / block_elems(type); ++b) {
        data[r * row_bytes + b * bb] = static_cast<uint8_t>(118 + rng() % 20);
      }
    }
    return data;
  }
  if (is_block(type) || type == DType::kF8E4M3) {
    return random_data(type, rows, row_bytes, rng, true);
  }
  std::vector<uint8_t> data(static_cast<size_t>(rows * row_bytes), 0x5A);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float v = normal(rng);
      uint8_t* p = data.data() + r * row_bytes + c * dtype_info(type).block_bytes;
      if (type == DType::kF32) std::memcpy(p, &v, 4);
      if (type == DType::kF16) {
        const uint16_t h = f32_to_f16(v);
        std::memcpy(p, &h, 2);
      }
      if (type == DType::kBF16) {
        const uint16_t b = f32_to_bf16(v);
        std::memcpy(p, &b, 2);
      }
    }
  }
  return data;
}

// The product's reference: row (dequantized by formats/quant.h) . x in double, and the sum of
// |w x| that bounds the F32 rounding of any summation order.
struct RefDot {
  double value = 0, magnitude = 0;
};
RefDot ref_dot(const float* row, const float* x, int64_t cols) {
  RefDot d;
  for (int64_t c = 0; c < cols; ++c) {
    d.value += static_cast<double>(row[c]) * x[c];
    d.magnitude += std::abs(static_cast<double>(row[c]) * x[c]);
  }
  return d;
}

bool close_to(float got, const RefDot& ref) {
  return std::abs(got - ref.value) <= 2e-5 * ref.magnitude + 1e-30;
}

// dot_chunks over one row split as a warp of `lanes` splits it (lane j: chunks j, j + lanes,
// ...), the lanes' sums added, for 3 activation rows, against ref_dot. `scales`: FP8 block
// scales of the row (block_cols values each).
void check_host_dot(DType type, int64_t cols, int lanes, std::mt19937& rng,
                    const std::vector<float>& scales = {}, int64_t block_cols = 1) {
  SCOPED_TRACE(fmt::format("{} cols {} lanes {} block_cols {}", dtype_name(type), cols, lanes,
                           scales.empty() ? 0 : block_cols));
  const int64_t row_bytes = dtype_bytes(type, cols);
  const std::vector<uint8_t> w = finite_rows(type, 1, cols, row_bytes, rng);
  constexpr int kTokens = 3;
  const int64_t ldx = cols + 5;
  std::vector<float> x(static_cast<size_t>(kTokens * ldx));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  std::vector<float> row(static_cast<size_t>(cols));
  dequant::RowScales s;
  if (scales.empty()) {
    dequantize_row(type, w.data(), row.data(), cols);
  } else {
    dequantize_fp8_blocks(w.data(), scales.data(), 1, cols, 1, block_cols, row.data());
    s.row = scales.data();
    s.block_cols = block_cols;
  }
  float acc[kTokens] = {};
  const bool known = dequant::visit_format(type, [&](auto tag) {
    using Fmt = typename decltype(tag)::type;
    for (int lane = 0; lane < lanes; ++lane) {
      float part[kTokens] = {};
      dequant::dot_chunks<Fmt, 8>(w.data(), cols, s, lane, lanes, x.data(), ldx, kTokens, part);
      for (int j = 0; j < kTokens; ++j) acc[j] += part[j];
    }
  });
  ASSERT_TRUE(known);
  for (int j = 0; j < kTokens; ++j) {
    const RefDot ref = ref_dot(row.data(), x.data() + j * ldx, cols);
    EXPECT_TRUE(close_to(acc[j], ref)) << "token " << j << ": " << acc[j] << " vs " << ref.value;
  }
}

TEST(CudaMatvecHost, ChunkLoopMatchesReference) {
  std::mt19937 rng(21);
  for (DType type : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3}) {
    for (int64_t cols : {int64_t{1}, int64_t{8}, int64_t{13}, int64_t{1003}}) {
      for (int lanes : {1, 32}) check_host_dot(type, cols, lanes, rng);
    }
  }
  for (const BlockLayout& l : block_layouts()) {
    const int64_t be = block_elems(l.type);
    for (int64_t blocks : {1, 3, 9}) {
      for (int lanes : {1, 32}) check_host_dot(l.type, blocks * be, lanes, rng);
    }
  }
}

TEST(CudaMatvecHost, Fp8BlockScalesMatchReference) {
  std::mt19937 rng(22);
  std::uniform_real_distribution<float> dist(1e-3f, 3.0f);
  // Whole DeepSeek-V3 blocks, a partial last block, blocks of one chunk.
  for (const auto& [cols, block_cols] :
       std::vector<std::pair<int64_t, int64_t>>{{512, 128}, {1000, 128}, {77, 8}, {45, 16}}) {
    std::vector<float> scales(static_cast<size_t>((cols + block_cols - 1) / block_cols));
    for (float& v : scales) v = dist(rng);
    for (int lanes : {1, 32}) check_host_dot(DType::kF8E4M3, cols, lanes, rng, scales, block_cols);
  }
}

TEST(CudaMatvecHost, LauncherRejectsBadArguments) {
  float dummy[64];
  const QuantMatrix w{.type = DType::kQ8_0, .data = dummy, .row_bytes = 34, .rows = 2, .cols = 32};
  EXPECT_TRUE(cuda_can_matvec(DType::kQ4_K));
  EXPECT_TRUE(cuda_can_matvec(DType::kMXFP4));
  EXPECT_FALSE(cuda_can_matvec(DType::kI32));
  auto launch = [&](const QuantMatrix& m, int64_t ldx, int64_t n, int64_t ldy) {
    return matmul_quant_cuda(m, dummy, ldx, n, dummy, ldy, nullptr);
  };
  QuantMatrix bad = w;
  bad.type = DType::kI32;
  EXPECT_EQ(launch(bad, 32, 1, 2), cudaErrorInvalidValue);  // no decoder
  bad = w;
  bad.cols = 48;
  bad.row_bytes = 68;
  EXPECT_EQ(launch(bad, 48, 1, 2), cudaErrorInvalidValue);  // a partial block
  bad = w;
  bad.row_bytes = 33;
  EXPECT_EQ(launch(bad, 32, 1, 2), cudaErrorInvalidValue);  // a short row
  EXPECT_EQ(launch(w, 31, 1, 2), cudaErrorInvalidValue);    // ldx < cols
  EXPECT_EQ(launch(w, 32, 1, 1), cudaErrorInvalidValue);    // ldy < rows
  EXPECT_EQ(launch(w, 32, -1, 2), cudaErrorInvalidValue);
  QuantMatrix fp8{.type = DType::kF8E4M3,
                  .data = dummy,
                  .row_bytes = 40,
                  .rows = 4,
                  .cols = 40,
                  .scale_inv = dummy,
                  .scale_row_elems = 4,
                  .block_rows = 2,
                  .block_cols = 12};  // not a multiple of the 8-value chunk
  EXPECT_EQ(launch(fp8, 40, 1, 4), cudaErrorInvalidValue);
  fp8.block_cols = 16;
  fp8.scale_row_elems = 2;  // 3 scale columns needed
  EXPECT_EQ(launch(fp8, 40, 1, 4), cudaErrorInvalidValue);
  bad = w;
  bad.scale_inv = dummy;  // block scales on a non-FP8 type
  bad.scale_row_elems = 1;
  EXPECT_EQ(launch(bad, 32, 1, 2), cudaErrorInvalidValue);
  // Nothing to do is not an error.
  EXPECT_EQ(matmul_quant_cuda(w, nullptr, 32, 0, nullptr, 2, nullptr), cudaSuccess);
}

// cuBLAS (the prefill products' GEMM) loads from the toolkit this build used, without a GPU.
TEST(CudaBlasHost, Loads) {
  std::string why;
  const CublasApi* api = cublas_api(&why);
  ASSERT_NE(api, nullptr) << why;
  EXPECT_STREQ(api->status_string(CUBLAS_STATUS_NOT_INITIALIZED),
               "the library was not initialized");
}

// ---- GPU tests ----

// One dequantization problem: `rows` rows of `cols` values, the source row stride padded by
// `src_pad` bytes (odd pads make rows start at odd addresses), the destination row stride by
// `dst_pad` elements and the destination start shifted by `dst_shift` elements.
struct Case {
  int64_t rows, cols;
  int64_t src_pad = 0, dst_pad = 0, dst_shift = 0;
};

std::string describe(DType type, DType out, const Case& c) {
  return std::string(dtype_name(type)) + " -> " + std::string(dtype_name(out)) + " rows " +
         std::to_string(c.rows) + " cols " + std::to_string(c.cols) + " src_pad " +
         std::to_string(c.src_pad) + " dst_pad " + std::to_string(c.dst_pad) + " dst_shift " +
         std::to_string(c.dst_shift);
}

constexpr uint8_t kSentinel = 0xA5;

// Runs the kernel into a sentinel-filled buffer and compares every element, padding included.
// `reference` gives the F32 value of row r (cols values).
template <typename Launch, typename Reference>
void run_and_compare(const std::string& what, const Case& c, DType out, Launch&& launch,
                     Reference&& reference) {
  SCOPED_TRACE(what);
  const int64_t out_bytes = dtype_info(out).block_bytes;
  const int64_t dst_row = c.cols + c.dst_pad;
  const int64_t dst_elems = c.dst_shift + c.rows * dst_row;
  DeviceBuffer dst(static_cast<size_t>(dst_elems * out_bytes));
  TD_CUDA_CHECK(cudaMemset(dst.data(), kSentinel, dst.bytes()));
  void* dst_start = static_cast<uint8_t*>(dst.data()) + c.dst_shift * out_bytes;
  ASSERT_EQ(launch(dst_start, dst_row), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> got(dst.bytes());
  dst.download(got.data(), got.size());

  std::vector<float> ref(static_cast<size_t>(c.cols));
  int64_t mismatches = 0;
  auto report = [&](int64_t r, int64_t col, const std::string& msg) {
    if (mismatches++ < 5) ADD_FAILURE() << "row " << r << " col " << col << ": " << msg;
  };
  for (int64_t i = 0; i < c.dst_shift * out_bytes; ++i) {
    if (got[i] != kSentinel) report(-1, i, "wrote before the destination");
  }
  for (int64_t r = 0; r < c.rows; ++r) {
    reference(r, ref.data());
    const uint8_t* row = got.data() + (c.dst_shift + r * dst_row) * out_bytes;
    for (int64_t col = 0; col < c.cols; ++col) {
      if (out == DType::kF32) {
        uint32_t g;
        std::memcpy(&g, row + col * 4, 4);
        if (g != bits(ref[col])) {
          report(r, col, fmt::format("gpu {:08x} cpu {:08x} ({})", g, bits(ref[col]), ref[col]));
        }
      } else {
        uint16_t g;
        std::memcpy(&g, row + col * 2, 2);
        if (g != f32_to_bf16(ref[col])) {
          report(r, col, fmt::format("gpu {:04x} cpu {:04x}", g, f32_to_bf16(ref[col])));
        }
      }
    }
    for (int64_t i = c.cols * out_bytes; i < dst_row * out_bytes; ++i) {
      if (row[i] != kSentinel) report(r, i / out_bytes, "wrote into the row padding");
    }
  }
  EXPECT_EQ(mismatches, 0);
}

void check_rows(DType type, DType out, const Case& c, std::mt19937& rng) {
  const int64_t row_bytes = dtype_bytes(type, c.cols);
  const int64_t src_row = row_bytes + c.src_pad;
  const std::vector<uint8_t> host = random_data(type, c.rows, src_row, rng);
  DeviceBuffer src(host.size());
  src.upload(host.data(), host.size());
  run_and_compare(
      describe(type, out, c), c, out,
      [&](void* dst, int64_t dst_row) {
        return dequantize_rows_cuda(type, src.data(), src_row, c.rows, c.cols, out, dst, dst_row,
                                    nullptr);
      },
      [&](int64_t r, float* ref) { dequantize_row(type, host.data() + r * src_row, ref, c.cols); });
}

std::vector<DType> all_types() {
  std::vector<DType> types = element_types();
  for (const BlockLayout& l : block_layouts()) types.push_back(l.type);
  return types;
}

class CudaDequantGpu : public testing::Test {
 protected:
  std::mt19937 rng_{1234};
};

TEST_F(CudaDequantGpu, SupportsEveryTypeTested) {
  for (DType t : all_types()) EXPECT_TRUE(cuda_can_dequantize(t)) << dtype_name(t);
}

TEST_F(CudaDequantGpu, RowsMatchReference) {
  for (DType type : all_types()) {
    const int64_t be = block_elems(type);
    // Element types also get lengths that are not a multiple of the 8-value chunk.
    std::vector<Case> cases = {{1, be},
                               {3, 5 * be},
                               {7, 33 * be, 0, 0, 0},
                               {5, 9 * be, 3, 1, 1},
                               {2, 64 * be, 1, 5, 3},
                               {129, 3 * be, 2, 0, 0}};
    if (!is_block(type)) {
      cases.push_back({3, 1});
      cases.push_back({5, 13, 1, 0, 1});
      cases.push_back({4, 1003, 0, 3, 0});
      cases.push_back({1, 4096 + 7, 5, 0, 2});
    }
    for (DType out : {DType::kF32, DType::kBF16}) {
      for (const Case& c : cases) check_rows(type, out, c, rng_);
    }
  }
}

TEST_F(CudaDequantGpu, QuantizedWeightsMatchReference) {
  // Blocks as quantize_row writes them (realistic scales), not only random bytes.
  for (DType type : all_types()) {
    if (!is_block(type) || !can_quantize(type)) continue;
    const Case c{11, 4 * block_elems(type)};
    std::vector<float> weights(static_cast<size_t>(c.rows * c.cols));
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (float& w : weights) w = normal(rng_);
    const int64_t row_bytes = dtype_bytes(type, c.cols);
    std::vector<uint8_t> host(static_cast<size_t>(c.rows * row_bytes));
    for (int64_t r = 0; r < c.rows; ++r) {
      quantize_row(type, weights.data() + r * c.cols, host.data() + r * row_bytes, c.cols);
    }
    DeviceBuffer src(host.size());
    src.upload(host.data(), host.size());
    run_and_compare(
        describe(type, DType::kF32, c), c, DType::kF32,
        [&](void* dst, int64_t dst_row) {
          return dequantize_rows_cuda(type, src.data(), row_bytes, c.rows, c.cols, DType::kF32, dst,
                                      dst_row, nullptr);
        },
        [&](int64_t r, float* ref) {
          dequantize_row(type, host.data() + r * row_bytes, ref, c.cols);
        });
  }
}

TEST_F(CudaDequantGpu, MoreRowsThanOneGridCovers) {
  // The grid is at most 65535 thread blocks high and a thread block holds 256 / chunks rows when
  // a row has few 8-value chunks; these shapes need the kernels' loop over further rows.
  check_rows(DType::kF8E4M3, DType::kF32, Case{65535 * 256 + 4097, 1}, rng_);
  check_rows(DType::kQ4_0, DType::kBF16, Case{65535 * 64 + 999, 32}, rng_);
}

TEST_F(CudaDequantGpu, Fp8BlocksMatchReference) {
  struct Fp8Case {
    int64_t rows, cols, block_rows, block_cols;
    int64_t src_pad, dst_pad;
  };
  const std::vector<Fp8Case> cases = {
      {256, 512, 128, 128, 0, 0},   // DeepSeek-V3 blocks, whole
      {300, 1000, 128, 128, 0, 0},  // partial edge blocks in both directions
      {33, 77, 1, 77, 3, 1},        // one scale per row
      {17, 45, 7, 5, 1, 3},         // blocks that straddle the 8-value chunks
      {9, 3, 2, 2, 0, 0},
  };
  for (const Fp8Case& f : cases) {
    const std::vector<uint8_t> w = random_data(DType::kF8E4M3, f.rows, f.cols, rng_, true);
    const int64_t scale_rows = (f.rows + f.block_rows - 1) / f.block_rows;
    const int64_t scale_cols = (f.cols + f.block_cols - 1) / f.block_cols;
    std::vector<float> scale(static_cast<size_t>(scale_rows * scale_cols));
    std::uniform_real_distribution<float> dist(1e-4f, 3.0f);
    for (float& s : scale) s = dist(rng_);
    std::vector<float> ref(static_cast<size_t>(f.rows * f.cols));
    dequantize_fp8_blocks(w.data(), scale.data(), f.rows, f.cols, f.block_rows, f.block_cols,
                          ref.data());

    // The device copy has padded rows: row r at r * (cols + src_pad).
    const int64_t src_row = f.cols + f.src_pad;
    std::vector<uint8_t> padded(static_cast<size_t>(f.rows * src_row), 0x7F);
    for (int64_t r = 0; r < f.rows; ++r) {
      std::memcpy(&padded[r * src_row], &w[r * f.cols], f.cols);
    }
    DeviceBuffer d_w(padded.size()), d_scale(scale.size() * sizeof(float));
    d_w.upload(padded.data(), padded.size());
    d_scale.upload(scale.data(), d_scale.bytes());
    const Case c{f.rows, f.cols, f.src_pad, f.dst_pad, 1};
    for (DType out : {DType::kF32, DType::kBF16}) {
      run_and_compare(
          fmt::format("fp8 {}x{} blocks {}x{} -> {}", f.rows, f.cols, f.block_rows, f.block_cols,
                      dtype_name(out)),
          c, out,
          [&](void* dst, int64_t dst_row) {
            return dequantize_fp8_blocks_cuda(d_w.as<uint8_t>(), src_row, d_scale.as<float>(),
                                              scale_cols, f.rows, f.cols, f.block_rows,
                                              f.block_cols, out, dst, dst_row, nullptr);
          },
          [&](int64_t r, float* row) {
            std::memcpy(row, &ref[r * f.cols], f.cols * sizeof(float));
          });
    }
  }
}

TEST_F(CudaDequantGpu, RunsOnAStream) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const int64_t cols = 4 * 256;
  const std::vector<uint8_t> host =
      random_data(DType::kQ6_K, 1, dtype_bytes(DType::kQ6_K, cols), rng_);
  DeviceBuffer src(host.size()), dst(cols * sizeof(float));
  src.upload(host.data(), host.size());
  ASSERT_EQ(dequantize_rows_cuda(DType::kQ6_K, src.data(), host.size(), 1, cols, DType::kF32,
                                 dst.data(), cols, stream),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<float> got(cols), ref(cols);
  dst.download(got.data(), cols * sizeof(float));
  dequantize_row(DType::kQ6_K, host.data(), ref.data(), cols);
  EXPECT_EQ(std::memcmp(got.data(), ref.data(), cols * sizeof(float)), 0);
  cudaStreamDestroy(stream);
}

// The product on the GPU: `rows` rows of `type`, row stride padded by `src_pad` bytes, n
// activation rows with strides ldx = cols + 3 and ldy = rows + 2; the output padding must stay
// untouched. `host`: the weight bytes (random when empty).
void check_matvec(DType type, int64_t rows, int64_t cols, int64_t n, int64_t src_pad,
                  std::mt19937& rng, std::vector<uint8_t> host = {}) {
  SCOPED_TRACE(fmt::format("{} {}x{} n {} pad {}", dtype_name(type), rows, cols, n, src_pad));
  const int64_t row_bytes = dtype_bytes(type, cols) + src_pad;
  if (host.empty()) host = finite_rows(type, rows, cols, row_bytes, rng);
  const int64_t ldx = cols + 3, ldy = rows + 2;
  std::vector<float> x(static_cast<size_t>(std::max<int64_t>(n, 1) * ldx));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  DeviceBuffer d_w(host.size()), d_x(x.size() * 4), d_y(static_cast<size_t>(n * ldy) * 4 + 4);
  d_w.upload(host.data(), host.size());
  d_x.upload(x.data(), d_x.bytes());
  TD_CUDA_CHECK(cudaMemset(d_y.data(), kSentinel, d_y.bytes()));
  const QuantMatrix w{
      .type = type, .data = d_w.data(), .row_bytes = row_bytes, .rows = rows, .cols = cols};
  ASSERT_EQ(matmul_quant_cuda(w, d_x.as<float>(), ldx, n, d_y.as<float>(), ldy, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> y(d_y.bytes() / 4);
  d_y.download(y.data(), d_y.bytes());
  std::vector<float> row(static_cast<size_t>(cols));
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(type, host.data() + r * row_bytes, row.data(), cols);
    for (int64_t t = 0; t < n; ++t) {
      const RefDot ref = ref_dot(row.data(), x.data() + t * ldx, cols);
      const float got = y[t * ldy + r];
      if (!close_to(got, ref) && bad++ < 5) {
        ADD_FAILURE() << "row " << r << " token " << t << ": gpu " << got << " cpu " << ref.value;
      }
    }
  }
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = rows; i < ldy; ++i) {
      if (bits(y[t * ldy + i]) != 0xA5A5A5A5u && bad++ < 5) {
        ADD_FAILURE() << "token " << t << " wrote into the output padding at " << i;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

class CudaMatvecGpu : public testing::Test {
 protected:
  std::mt19937 rng_{4321};
};

TEST_F(CudaMatvecGpu, ProductsMatchReference) {
  for (DType type : all_types()) {
    const int64_t be = block_elems(type);
    // One pass of 8 tokens, a partial pass, several passes; odd row counts, misaligned rows.
    for (int64_t n : {1, 3, 8, 9, 20}) check_matvec(type, 37, 3 * be, n, 0, rng_);
    check_matvec(type, 129, 9 * be, 2, 3, rng_);
    if (!is_block(type)) {
      check_matvec(type, 11, 1003, 5, 1, rng_);
      check_matvec(type, 3, 13, 1, 0, rng_);
    }
  }
}

TEST_F(CudaMatvecGpu, QuantizedWeightsMatchReference) {
  // Blocks as quantize_row writes them (realistic scales), as a model's weights are.
  for (DType type : all_types()) {
    if (!is_block(type) || !can_quantize(type)) continue;
    const int64_t rows = 19, cols = 8 * block_elems(type), row_bytes = dtype_bytes(type, cols);
    std::vector<float> weights(static_cast<size_t>(rows * cols));
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (float& w : weights) w = normal(rng_);
    std::vector<uint8_t> host(static_cast<size_t>(rows * row_bytes));
    for (int64_t r = 0; r < rows; ++r) {
      quantize_row(type, weights.data() + r * cols, host.data() + r * row_bytes, cols);
    }
    check_matvec(type, rows, cols, 4, 0, rng_, host);
  }
}

TEST_F(CudaMatvecGpu, Fp8BlockScalesMatchReference) {
  struct Fp8Case {
    int64_t rows, cols, block_rows, block_cols, row0;  // row0: a row view's first row
  };
  for (const Fp8Case& f : std::vector<Fp8Case>{{300, 1000, 128, 128, 0},
                                               {256, 512, 128, 128, 128},
                                               {33, 77, 1, 8, 5},
                                               {17, 45, 7, 16, 7}}) {
    SCOPED_TRACE(fmt::format("fp8 {}x{} blocks {}x{} from row {}", f.rows, f.cols, f.block_rows,
                             f.block_cols, f.row0));
    const int64_t all_rows = f.row0 + f.rows;
    const std::vector<uint8_t> w = random_data(DType::kF8E4M3, all_rows, f.cols, rng_, true);
    const int64_t scale_rows = (all_rows + f.block_rows - 1) / f.block_rows;
    const int64_t scale_cols = (f.cols + f.block_cols - 1) / f.block_cols;
    std::vector<float> scale(static_cast<size_t>(scale_rows * scale_cols));
    std::uniform_real_distribution<float> dist(1e-3f, 3.0f);
    for (float& s : scale) s = dist(rng_);
    std::vector<float> ref(static_cast<size_t>(all_rows * f.cols));
    dequantize_fp8_blocks(w.data(), scale.data(), all_rows, f.cols, f.block_rows, f.block_cols,
                          ref.data());
    const int64_t n = 3;
    std::vector<float> x(static_cast<size_t>(n * f.cols));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : x) v = normal(rng_);
    DeviceBuffer d_w(w.size()), d_s(scale.size() * 4), d_x(x.size() * 4),
        d_y(static_cast<size_t>(n * f.rows) * 4);
    d_w.upload(w.data(), w.size());
    d_s.upload(scale.data(), d_s.bytes());
    d_x.upload(x.data(), d_x.bytes());
    // The view of rows row0 .. row0 + rows, as CudaDevice passes it.
    const QuantMatrix m{.type = DType::kF8E4M3,
                        .data = d_w.as<uint8_t>() + f.row0 * f.cols,
                        .row_bytes = f.cols,
                        .rows = f.rows,
                        .cols = f.cols,
                        .scale_inv = d_s.as<float>() + f.row0 / f.block_rows * scale_cols,
                        .scale_row_elems = scale_cols,
                        .block_rows = f.block_rows,
                        .block_cols = f.block_cols};
    ASSERT_EQ(matmul_quant_cuda(m, d_x.as<float>(), f.cols, n, d_y.as<float>(), f.rows, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> y(static_cast<size_t>(n * f.rows));
    d_y.download(y.data(), d_y.bytes());
    int64_t bad = 0;
    for (int64_t r = 0; r < f.rows; ++r) {
      for (int64_t t = 0; t < n; ++t) {
        const RefDot d = ref_dot(&ref[(f.row0 + r) * f.cols], &x[t * f.cols], f.cols);
        if (!close_to(y[t * f.rows + r], d) && bad++ < 5) {
          ADD_FAILURE() << "row " << r << " token " << t << ": gpu " << y[t * f.rows + r] << " cpu "
                        << d.value;
        }
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

}  // namespace
}  // namespace tandem
#endif

int main(int argc, char** argv) {
  // The host-side checks run everywhere: they need no device.
  return tandem::test::gpu_test_main(argc, argv,
                                     "CudaDequantHost.*:CudaMatvecHost.*:CudaBlasHost.*");
}
