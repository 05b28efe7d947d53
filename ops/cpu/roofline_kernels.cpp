#include "ops/cpu/roofline_kernels.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "ops/cpu/amx_tiles.h"

namespace tandem::cpu {
namespace {

#define TD_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define TD_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define TD_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vnni")))
#define TD_AVX_VNNI __attribute__((target("avxvnni")))
#define TD_AMX __attribute__((target("amx-tile,amx-int8,amx-bf16")))

// Far enough ahead to cover DRAM latency at a few GB/s per thread, near enough to stay in L1/L2.
constexpr size_t kPrefetchBytes = 2048;

// Loop constants come from volatile storage so the compiler cannot fold the chains away.
volatile float g_fp32_mul = 1.0f, g_fp32_add = 0.5f;
volatile uint16_t g_bf16_one = 0x3F80;  // 1.0 in bfloat16
volatile uint8_t g_u8_one = 1;
volatile int8_t g_s8_one = 1;

// Makes the compiler treat v as unknown (no instruction is emitted): accumulators that start
// equal must not be merged into one chain, and loop-invariant products must not be hoisted.
#define TD_OPAQUE(v) __asm__ volatile("" : "+v"(v))

uint64_t tail_words(const char* p, const char* end) {
  uint64_t sum = 0;
  for (; p + 8 <= end; p += 8) sum += *reinterpret_cast<const uint64_t*>(p);
  return sum;
}

// ---- streaming reads ----------------------------------------------------------------------

enum ReadMode { kPlain, kPrefetch, kStream };

template <int kMode>
TD_AVX512 uint64_t read_sum_avx512(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  const char* end = p + bytes;
  const char* blocks_end = p + (bytes & ~size_t{511});
  __m512i acc[8];
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) acc[k] = _mm512_setzero_si512();
  for (; p < blocks_end; p += 512) {
    if constexpr (kMode == kPrefetch) {
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) _mm_prefetch(p + kPrefetchBytes + 64 * k, _MM_HINT_T0);
    }
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      __m512i v;
      if constexpr (kMode == kStream) {
        v = _mm512_stream_load_si512(const_cast<char*>(p + 64 * k));
      } else {
        v = _mm512_load_si512(p + 64 * k);
      }
      acc[k] = _mm512_add_epi64(acc[k], v);
    }
  }
  for (; p + 64 <= end; p += 64) acc[0] = _mm512_add_epi64(acc[0], _mm512_load_si512(p));
#pragma GCC unroll 4
  for (int k = 1; k < 8; ++k) acc[0] = _mm512_add_epi64(acc[0], acc[k]);
  // Lane sums through memory: GCC 12's _mm512_reduce_* warn under target attributes.
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, acc[0]);
  uint64_t sum = tail_words(p, end);
  for (uint64_t v : lanes) sum += v;
  return sum;
}

template <int kMode>
uint64_t read_sum_avx2(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  const char* end = p + bytes;
  const char* blocks_end = p + (bytes & ~size_t{255});
  __m256i acc[8];
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) acc[k] = _mm256_setzero_si256();
  for (; p < blocks_end; p += 256) {
    if constexpr (kMode == kPrefetch) {
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) _mm_prefetch(p + kPrefetchBytes + 64 * k, _MM_HINT_T0);
    }
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32 * k));
      acc[k] = _mm256_add_epi64(acc[k], v);
    }
  }
  for (; p + 32 <= end; p += 32) {
    acc[0] = _mm256_add_epi64(acc[0], _mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
  }
#pragma GCC unroll 4
  for (int k = 1; k < 8; ++k) acc[0] = _mm256_add_epi64(acc[0], acc[k]);
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[0]);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + tail_words(p, end);
}

// ---- compute peaks ------------------------------------------------------------------------

constexpr int kAcc512 = 16;  // of 32 zmm: enough chains for 2 pipes x 4-5 cycles latency
constexpr int kAcc256 = 12;  // of 16 ymm, leaving room for the operands

// Each kernel runs n independent chains acc[k] = step(acc[k]) from opaque starting values, then
// adds the chains up as vectors in a fully unrolled loop (indexing acc[] only with constants is
// what lets GCC keep every chain in a register) and sums the lanes in double.
#define TD_CHAINS(n, init, step)                     \
  _Pragma("GCC unroll 16") for (int k = 0; k < n; ++k) { \
    acc[k] = init;                                   \
    TD_OPAQUE(acc[k]);                               \
  }                                                  \
  for (uint64_t i = 0; i < iterations; ++i) {        \
    _Pragma("GCC unroll 16") for (int k = 0; k < n; ++k) acc[k] = step; \
  }

TD_AVX512 double fma_fp32_avx512(uint64_t iterations) {
  const __m512 mul = _mm512_set1_ps(g_fp32_mul), add = _mm512_set1_ps(g_fp32_add);
  __m512 acc[kAcc512];
  TD_CHAINS(kAcc512, _mm512_set1_ps(1.0f), _mm512_fmadd_ps(acc[k], mul, add))
  __m512 total = acc[0];
#pragma GCC unroll 16
  for (int k = 1; k < kAcc512; ++k) total = _mm512_add_ps(total, acc[k]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, total);
  double sum = 0;
  for (float v : lanes) sum += v;
  return sum;
}

double fma_fp32_avx2(uint64_t iterations) {
  const __m256 mul = _mm256_set1_ps(g_fp32_mul), add = _mm256_set1_ps(g_fp32_add);
  __m256 acc[kAcc256];
  TD_CHAINS(kAcc256, _mm256_set1_ps(1.0f), _mm256_fmadd_ps(acc[k], mul, add))
  __m256 total = acc[0];
#pragma GCC unroll 16
  for (int k = 1; k < kAcc256; ++k) total = _mm256_add_ps(total, acc[k]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, total);
  double sum = 0;
  for (float v : lanes) sum += v;
  return sum;
}

double fma_fp32_scalar(uint64_t iterations) {
  const float mul = g_fp32_mul, add = g_fp32_add;
  float acc[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  for (uint64_t i = 0; i < iterations; ++i) {
    for (float& a : acc) a = std::fma(a, mul, add);
  }
  double sum = 0;
  for (float a : acc) sum += a;
  return sum;
}

TD_AVX512_BF16 double dot_bf16_avx512(uint64_t iterations) {
  const __m512i bits = _mm512_set1_epi16(static_cast<short>(g_bf16_one));
  const __m512bh one = (__m512bh)bits;
  __m512 acc[kAcc512];
  TD_CHAINS(kAcc512, _mm512_setzero_ps(), _mm512_dpbf16_ps(acc[k], one, one))
  __m512 total = acc[0];
#pragma GCC unroll 16
  for (int k = 1; k < kAcc512; ++k) total = _mm512_add_ps(total, acc[k]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, total);
  double sum = 0;
  for (float v : lanes) sum += v;
  return sum;
}

TD_AVX512_VNNI double dot_int8_avx512_vnni(uint64_t iterations) {
  const __m512i a = _mm512_set1_epi8(static_cast<char>(g_u8_one));
  const __m512i b = _mm512_set1_epi8(g_s8_one);
  __m512i acc[kAcc512];
  TD_CHAINS(kAcc512, _mm512_setzero_si512(), _mm512_dpbusd_epi32(acc[k], a, b))
  __m512i total = acc[0];
#pragma GCC unroll 16
  for (int k = 1; k < kAcc512; ++k) total = _mm512_add_epi32(total, acc[k]);
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, total);
  double sum = 0;
  for (int32_t v : lanes) sum += v;
  return sum;
}

double sum_epi32_lanes(__m256i total) {
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), total);
  double sum = 0;
  for (int32_t v : lanes) sum += v;
  return sum;
}

TD_AVX_VNNI double dot_int8_avx_vnni(uint64_t iterations) {
  const __m256i a = _mm256_set1_epi8(static_cast<char>(g_u8_one));
  const __m256i b = _mm256_set1_epi8(g_s8_one);
  __m256i acc[kAcc256];
  TD_CHAINS(kAcc256, _mm256_setzero_si256(), _mm256_dpbusd_avx_epi32(acc[k], a, b))
  __m256i total = acc[0];
#pragma GCC unroll 16
  for (int k = 1; k < kAcc256; ++k) total = _mm256_add_epi32(total, acc[k]);
  return sum_epi32_lanes(total);
}

// Without VNNI: u8 x s8 pairs to int16 (vpmaddubsw), pairs of those to int32 (vpmaddwd by 1),
// then an add: three instructions for what vpdpbusd does in one.
constexpr int kAccMaddubs = 4;

double dot_int8_avx2(uint64_t iterations) {
  // 2 activation x 2 weight vectors give 4 distinct products per round; the accumulate is a
  // 1-cycle add, so 4 chains suffice and everything stays in the 16 ymm registers.
  __m256i a[2], b[2];
  for (__m256i& v : a) v = _mm256_set1_epi8(static_cast<char>(g_u8_one));
  for (__m256i& v : b) v = _mm256_set1_epi8(g_s8_one);
  const __m256i ones16 = _mm256_set1_epi16(1);
  __m256i acc[kAccMaddubs];
#pragma GCC unroll 4
  for (int k = 0; k < kAccMaddubs; ++k) {
    acc[k] = _mm256_setzero_si256();
    TD_OPAQUE(acc[k]);
  }
  for (uint64_t i = 0; i < iterations; ++i) {
    // As if new vectors arrived each round: the products cannot be hoisted or shared.
#pragma GCC unroll 2
    for (__m256i& v : a) TD_OPAQUE(v);
#pragma GCC unroll 2
    for (__m256i& v : b) TD_OPAQUE(v);
#pragma GCC unroll 4
    for (int k = 0; k < kAccMaddubs; ++k) {
      const __m256i pairs = _mm256_maddubs_epi16(a[k % 2], b[k / 2]);
      acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(pairs, ones16));
    }
  }
  __m256i total = acc[0];
#pragma GCC unroll 16
  for (int k = 1; k < kAccMaddubs; ++k) total = _mm256_add_epi32(total, acc[k]);
  return sum_epi32_lanes(total);
}

double dot_int8_scalar(uint64_t iterations) {
  const int a = g_u8_one, b = g_s8_one;
  int32_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (uint64_t i = 0; i < iterations; ++i) {
    for (int32_t& v : acc) v += a * b + a * b + a * b + a * b;
  }
  double sum = 0;
  for (int32_t v : acc) sum += v;
  return sum;
}

// AMX: six C tiles (tmm0-5) of 16 x 16 int32 / f32 accumulate A (tmm6) x B (tmm7), both 16 rows
// of 64 bytes of ones loaded once: six independent tdp* per round (more than the latency over
// the throughput of one), no loads in the loop. Per C lane and round: int8, 64 products of 1 * 1;
// bf16, 32 products of 1.0 * 1.0.
constexpr int kAmxC = 6;

TD_AMX void amx_configure() {
  kern::AmxTileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  _tile_loadconfig(&c);
}

// The sum of every lane of the six C tiles (stored to memory, then released).
template <typename T>
TD_AMX double amx_c_sum() {
  alignas(64) T c[kAmxC][16][16];
  _tile_stored(0, c[0], 64);
  _tile_stored(1, c[1], 64);
  _tile_stored(2, c[2], 64);
  _tile_stored(3, c[3], 64);
  _tile_stored(4, c[4], 64);
  _tile_stored(5, c[5], 64);
  _tile_release();
  double sum = 0;
  for (const auto& tile : c) {
    for (const auto& row : tile) {
      for (T v : row) sum += v;
    }
  }
  return sum;
}

#define TD_AMX_ZERO_C() \
  _tile_zero(0);        \
  _tile_zero(1);        \
  _tile_zero(2);        \
  _tile_zero(3);        \
  _tile_zero(4);        \
  _tile_zero(5)

// kBf16: tdpbf16ps over ones of bfloat16 (f32 C tiles), else tdpbssd over int8 ones.
template <bool kBf16>
TD_AMX double dot_amx(uint64_t iterations) {
  alignas(64) uint8_t ones[16][64];
  for (auto& row : ones) {
    for (int i = 0; i < 64; i += 2) {
      const uint16_t pair =
          kBf16 ? g_bf16_one : static_cast<uint16_t>(static_cast<uint8_t>(g_s8_one) * 0x0101);
      std::memcpy(&row[i], &pair, 2);
    }
  }
  amx_configure();
  _tile_loadd(6, ones, 64);
  _tile_loadd(7, ones, 64);
  TD_AMX_ZERO_C();
  for (uint64_t i = 0; i < iterations; ++i) {
    if constexpr (kBf16) {
      _tile_dpbf16ps(0, 6, 7);
      _tile_dpbf16ps(1, 6, 7);
      _tile_dpbf16ps(2, 6, 7);
      _tile_dpbf16ps(3, 6, 7);
      _tile_dpbf16ps(4, 6, 7);
      _tile_dpbf16ps(5, 6, 7);
    } else {
      _tile_dpbssd(0, 6, 7);
      _tile_dpbssd(1, 6, 7);
      _tile_dpbssd(2, 6, 7);
      _tile_dpbssd(3, 6, 7);
      _tile_dpbssd(4, 6, 7);
      _tile_dpbssd(5, 6, 7);
    }
  }
  return kBf16 ? amx_c_sum<float>() : amx_c_sum<int32_t>();
}

#undef TD_AMX_ZERO_C

}  // namespace

uint64_t read_sum_scalar(const void* data, size_t bytes) {
  const uint64_t* w = static_cast<const uint64_t*>(data);
  const size_t n = bytes / 8;
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += w[i];
    s1 += w[i + 1];
    s2 += w[i + 2];
    s3 += w[i + 3];
  }
  for (; i < n; ++i) s0 += w[i];
  return s0 + s1 + s2 + s3;
}

std::vector<ReadKernel> read_kernels() {
  const Isa isa = best_isa();
  std::vector<ReadKernel> out;
  if (isa >= Isa::kAvx512) {
    out.push_back({"avx512", Isa::kAvx512, &read_sum_avx512<kPlain>});
    out.push_back({"avx512_prefetch", Isa::kAvx512, &read_sum_avx512<kPrefetch>});
    out.push_back({"avx512_stream", Isa::kAvx512, &read_sum_avx512<kStream>});
  }
  if (isa >= Isa::kAvx2) {
    out.push_back({"avx2", Isa::kAvx2, &read_sum_avx2<kPlain>});
    out.push_back({"avx2_prefetch", Isa::kAvx2, &read_sum_avx2<kPrefetch>});
  }
  out.push_back({"scalar", Isa::kScalar, &read_sum_scalar});
  return out;
}

const char* compute_kind_name(ComputeKind kind) {
  switch (kind) {
    case ComputeKind::kFp32Fma:
      return "fp32";
    case ComputeKind::kBf16Dot:
      return "bf16";
    case ComputeKind::kInt8Dot:
      return "int8";
    case ComputeKind::kAmxInt8:
      return "amx_int8";
    case ComputeKind::kAmxBf16:
      return "amx_bf16";
  }
  return "?";
}

std::vector<ComputeKernel> compute_kernels() {
  using K = ComputeKind;
  const Isa isa = best_isa();
  const CpuFeatures& f = cpu_features();
  std::vector<ComputeKernel> out;
  // lanes = accumulators x vector lanes; ops = lanes x (2 per multiply-add) x (products per lane)
  if (isa >= Isa::kAvx512) {
    out.push_back({"avx512_fma", K::kFp32Fma, Isa::kAvx512, 256, 1.0, 0.5, 512, &fma_fp32_avx512});
  }
  if (isa >= Isa::kAvx2) {
    out.push_back({"avx2_fma", K::kFp32Fma, Isa::kAvx2, 96, 1.0, 0.5, 192, &fma_fp32_avx2});
  }
  out.push_back({"scalar_fma", K::kFp32Fma, Isa::kScalar, 8, 1.0, 0.5, 16, &fma_fp32_scalar});
  if (isa >= Isa::kAvx512Bf16 && f.avx512_bf16) {
    out.push_back(
        {"avx512_bf16", K::kBf16Dot, Isa::kAvx512Bf16, 256, 0.0, 2.0, 1024, &dot_bf16_avx512});
  }
  if (isa >= Isa::kAvx512Vnni) {
    out.push_back({"avx512_vnni", K::kInt8Dot, Isa::kAvx512Vnni, 256, 0.0, 4.0, 2048,
                   &dot_int8_avx512_vnni});
  }
  if (isa >= Isa::kAvx2 && f.avx_vnni) {
    out.push_back({"avx_vnni", K::kInt8Dot, Isa::kAvx2, 96, 0.0, 4.0, 768, &dot_int8_avx_vnni});
  }
  if (isa >= Isa::kAvx2) {
    out.push_back({"avx2_maddubs", K::kInt8Dot, Isa::kAvx2, 32, 0.0, 4.0, 256, &dot_int8_avx2});
  }
  out.push_back({"scalar_int8", K::kInt8Dot, Isa::kScalar, 8, 0.0, 4.0, 64, &dot_int8_scalar});
  // AMX: 6 C tiles x 256 lanes; int8 64 products per lane and round, bf16 32.
  if (isa >= Isa::kAmx && f.amx_tile && f.amx_int8) {
    out.push_back({"amx_int8", K::kAmxInt8, Isa::kAmx, 1536, 0.0, 64.0, 196608, &dot_amx<false>});
  }
  if (isa >= Isa::kAmx && f.amx_tile && f.amx_bf16) {
    out.push_back({"amx_bf16", K::kAmxBf16, Isa::kAmx, 1536, 0.0, 32.0, 98304, &dot_amx<true>});
  }
  return out;
}

const ComputeKernel* best_compute_kernel(ComputeKind kind) {
  static const std::vector<ComputeKernel> kernels = compute_kernels();
  for (const ComputeKernel& k : kernels) {
    if (k.kind == kind) return &k;
  }
  return nullptr;
}

}  // namespace tandem::cpu
