// The measurement kernels behind `tandem roofline` (ops/cpu/roofline.h): streaming reads that
// keep many loads in flight, and independent FMA / dot-product chains that keep every SIMD
// pipe busy. Each does real arithmetic whose result the caller can predict, so a test proves the
// loop is not optimized away and a benchmark can trust the count of bytes or operations.
//
// One kernel per ISA variant, each an __attribute__((target)) function; the list functions return
// only those this CPU runs (capped by best_isa(), so TANDEM_ISA=avx2 measures the AVX2 machine).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/cpu_features.h"

namespace tandem::cpu {

// Sums the 64-bit words of [data, data + bytes) modulo 2^64 (order-independent, so exact for
// every variant). bytes must be a multiple of 8; data 64-byte aligned.
using ReadFn = uint64_t (*)(const void* data, size_t bytes);

struct ReadKernel {
  const char* name;  // "avx512", "avx512_prefetch", "avx512_stream", "avx2", ...
  Isa isa;
  ReadFn fn;
};

// The read variants this CPU can run, the widest first; always ends with the scalar one.
std::vector<ReadKernel> read_kernels();
uint64_t read_sum_scalar(const void* data, size_t bytes);

// kAmxInt8 / kAmxBf16: the AMX tile units (tdpbssd / tdpbf16ps), apart from the vector peaks.
enum class ComputeKind { kFp32Fma, kBf16Dot, kInt8Dot, kAmxInt8, kAmxBf16 };
const char* compute_kind_name(ComputeKind kind);  // "fp32", "bf16", "int8", "amx_int8", ...

// Runs `iterations` rounds of independent multiply-add chains and returns the sum over every
// accumulator lane. Every lane starts at kComputeStart and gains kComputeStep per round:
//   fp32: acc = acc * 1.0f + 0.5f        (one FMA: 2 flop per lane)
//   bf16: acc += 1.0 * 1.0 + 1.0 * 1.0   (vdpbf16ps: 2 bf16 pairs, 4 flop per lane)
//   int8: acc += 4 products of 1 * 1     (vpdpbusd or equivalent: 8 op per lane)
//   amx_int8: acc += 64 products of 1 * 1 (tdpbssd: 128 op per C tile lane)
//   amx_bf16: acc += 32 products of 1.0 * 1.0 (tdpbf16ps: 64 flop per C tile lane)
// so result = lanes * (start + step * iterations), exactly while the lane values stay below
// 2^24 (float) or 2^31 (int32).
using ComputeFn = double (*)(uint64_t iterations);

struct ComputeKernel {
  const char* name;  // "avx512_fma", "avx512_bf16", "avx512_vnni", "avx_vnni", "avx2_maddubs"...
  ComputeKind kind;
  Isa isa;
  int lanes;                 // accumulator lanes in total (accumulators x vector lanes)
  double start, step;        // per lane, as above
  double ops_per_iteration;  // flop (fp32, bf16) or int op (int8): 2 per multiply-add
  ComputeFn fn;
};

// The compute variants this CPU can run, best first within each kind.
std::vector<ComputeKernel> compute_kernels();
// The best kernel of `kind`, or nullptr when this CPU has none (bf16 without AVX512-BF16).
const ComputeKernel* best_compute_kernel(ComputeKind kind);

}  // namespace tandem::cpu
