// The packed formats (ops/cpu/packed.h) per ISA level:
//  - GEMV: 1 token against 96 MiB of packed weights, or 3x the L3 where that is more (so
//    DRAM-bound), the pool's threads; bytes_per_second = weight bytes read (incl. scales), vs
//    `tandem roofline` DRAM; GBps the same in 1e9 units, of_dram the fraction of a DRAM probe run
//    in alternating rounds.
//  - GEMM: 512 tokens x a 2048 x 2048 matrix; items_per_second = 2 x multiply-adds (OP/s), vs
//    the int8 VNNI / bf16 peaks of `tandem roofline`; of_peak that fraction of the peak measured
//    in rounds alternating with the GEMM's (bench/dram_probe.h). Gemm48Dram: 48 tokens x 96 MiB
//    (DRAM-fed); Gemm512Task: one 64-row task of Gemm512 on one thread (the kernel alone).
// bf16 is the packed BF16 tile format (`--cpu-experts bf16`: BF16 activations, vdpbf16ps);
// bf16_rows the plain row-major BF16 of native BF16 models (F32 activations, FMA), for comparison.
// Run: build-kp/bench/bench_packed_bench [--benchmark_filter=Gemv] [--benchmark_min_time=1]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/cpu_features.h"
#include "core/fp_convert.h"
#include "core/memory.h"
#include "core/thread_pool.h"
#include "core/topology.h"
#include "bench/dram_probe.h"
#include "ops/cpu/packed.h"

namespace tandem {
namespace {

using kern::WFormat;

struct Packed {
  std::shared_ptr<AlignedBuffer> bytes;
  std::vector<float> scales;
  kern::KMatrix m;
};

// rows x cols packed: the first 256 rows packed from random values, their tiles repeated (packing
// 100 MB from F32 would dominate the run; the kernels' speed does not depend on the values).
// The weights sit in transparent huge pages, as a model or packed cache copied at load does
// (core/mapped_file.h, LoadMode::kCopy); TANDEM_BENCH_HUGE=0 puts them in 4 KiB pages.
std::shared_ptr<AlignedBuffer> weight_buffer(uint64_t bytes) {
  const char* env = std::getenv("TANDEM_BENCH_HUGE");
  AllocOptions opt;
  opt.huge_pages = env == nullptr || std::atoi(env) != 0;
  return std::make_shared<AlignedBuffer>(static_cast<size_t>(bytes), opt);
}

Packed make_packed(WFormat f, int64_t rows, int64_t cols, int group) {
  Packed p;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const int64_t seed_rows = std::min<int64_t>(rows, 256);
  if (f == WFormat::kFP8Block) {
    const uint64_t n = static_cast<uint64_t>(rows * cols);
    p.bytes = weight_buffer(n);
    uint8_t* bytes = p.bytes->as<uint8_t>();
    for (uint64_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(rng() % 0x7E);
    p.scales.assign(static_cast<size_t>((rows + 127) / 128 * ((cols + 127) / 128)), 1e-3f);
    p.m.format = f;
    p.m.rows = rows;
    p.m.cols = cols;
    p.m.data = bytes;
    p.m.row_bytes = cols;
    p.m.scales = p.scales.data();
    p.m.scale_stride = (cols + 127) / 128;
    p.m.block_rows = p.m.block_cols = 128;
    return p;
  }
  std::vector<float> w(static_cast<size_t>(seed_rows * cols));
  for (float& v : w) v = normal(rng);
  const kern::KMatrix seed = kern::pack_weight(
      ops::Weight(Tensor::dense(DType::kF32, {seed_rows, cols}, w.data())), f, group, nullptr);
  const uint64_t total = kern::packed_bytes(f, rows, cols, group);
  const uint64_t seed_bytes = kern::packed_bytes(f, seed_rows, cols, group);
  p.bytes = weight_buffer(total);
  uint8_t* bytes = p.bytes->as<uint8_t>();
  for (uint64_t off = 0; off < total; off += seed_bytes) {
    std::memcpy(bytes + off, seed.data, std::min(seed_bytes, total - off));
  }
  p.m = kern::packed_view(f, rows, cols, group, bytes, p.bytes);
  return p;
}

ThreadPool& pool() {
  return bench_pool();
}

// per_task < 0: one task of all rows on the calling thread (no pool): the kernel's own
// speed, to compare with the one-thread peaks of `tandem roofline`.
void run(benchmark::State& state, WFormat f, int64_t rows, int64_t cols, int64_t tokens, Isa isa,
         int64_t per_task = 0) {
  if (isa > best_isa()) {
    state.SkipWithError("ISA not supported here");
    return;
  }
  const int group = 128;
  const Packed w = make_packed(f, rows, cols, group);
  std::vector<float> x(static_cast<size_t>(tokens * cols));
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  std::vector<float> y(static_cast<size_t>(tokens * rows));
  kern::Activations a;
  kern::quantize_activations(kern::act_format(f), group, x.data(), tokens, cols, cols, &a);
  // Tasks as the fused MoE cuts them: 64 rows for a GEMM, up to 1024 rows (one long stream) for a
  // GEMV.
  const bool one_thread = per_task < 0;
  if (per_task <= 0) per_task = tokens > 4 ? 64 : 1024;
  const size_t n_tasks = static_cast<size_t>((rows + per_task - 1) / per_task);
  auto call = [&] {
    if (one_thread) {
      kern::gemm(w.m, a, 0, rows, y.data(), rows, isa);
      benchmark::DoNotOptimize(y.data());
      return;
    }
    pool().run(n_tasks, [&](size_t i) {
      const int64_t r0 = static_cast<int64_t>(i) * per_task;
      const int64_t r1 = std::min(rows, r0 + per_task);
      kern::gemm(w.m, a, r0, r1, y.data(), rows, isa);
    });
    benchmark::DoNotOptimize(y.data());
  };
  for (auto _ : state) call();
  const int64_t bytes = f == WFormat::kFP8Block
                            ? rows * cols + static_cast<int64_t>(w.scales.size()) * 4
                            : static_cast<int64_t>(kern::packed_bytes(f, rows, cols, group));
  state.SetBytesProcessed(state.iterations() * bytes);
  state.SetItemsProcessed(state.iterations() * 2 * rows * cols * tokens);
  state.counters["threads"] = one_thread ? 1 : pool().size() + 1;
  // GEMV: GBps and, from DRAM, of_dram / dram_GBps (bench/dram_probe.h). GEMM on the pool:
  // of_peak / peak_Gops against the int8 peak (INT4 / INT8) or the bf16 one (fp32 without a BF16
  // dot), measured in rounds alternating with the GEMM's.
  if (tokens == 1) report_gemv(state, &pool(), bytes, call);
  if (tokens > 1 && !one_thread) {
    const bool integer = f == WFormat::kInt4 || f == WFormat::kInt8;
    report_peak(state, &pool(), integer ? cpu::ComputeKind::kInt8Dot : cpu::ComputeKind::kBf16Dot,
                static_cast<uint64_t>(2 * rows * cols * tokens), call);
  }
}

int64_t gemv_rows(WFormat f, int64_t cols) {
  const int64_t per_row = f == WFormat::kInt4                                 ? cols / 2
                          : f == WFormat::kBF16 || f == WFormat::kBF16Tile ? cols * 2
                                                                           : cols;
  // TANDEM_BENCH_GEMV_KIB=N: N KiB of weights instead of 96 MiB or 3x the L3 (dram_sized_bytes;
  // e.g. 8192: L3-resident, so the kernel's own speed, without DRAM).
  const char* kib = std::getenv("TANDEM_BENCH_GEMV_KIB");
  const int64_t bytes =
      kib != nullptr ? std::atoll(kib) << 10 : static_cast<int64_t>(dram_sized_bytes(96ll << 20));
  return std::max<int64_t>(16, bytes / per_row / 16 * 16);
}

void BM_Gemv(benchmark::State& state, WFormat f, Isa isa) {
  run(state, f, gemv_rows(f, 2048), 2048, 1, isa);
}

void BM_Gemm512(benchmark::State& state, WFormat f, Isa isa) {
  run(state, f, 2048, 2048, 512, isa);
}

// One task of that GEMM (the fused MoE's 64 rows x 512 tokens) on one thread: its weights stay
// in L2, so this is the tile kernel's own speed (vs the one-thread int8 / fp32 peaks).
void BM_Gemm512Task(benchmark::State& state, WFormat f, Isa isa) {
  run(state, f, 64, 2048, 512, isa, -64);
}

// A MoE prefill's expert GEMM: 48 tokens (a V2-Lite layer's 512 tokens x 6 of 64 experts) against
// 96 MiB of weights (from DRAM, as each expert's weights are at their first token block) in tasks
// of 512 rows (the fused MoE's gate / up chunks of a 512-token V2-Lite layer).
void BM_Gemm48Dram(benchmark::State& state, WFormat f, Isa isa) {
  run(state, f, gemv_rows(f, 2048), 2048, 48, isa, 512);
}

// A few tokens (a decode step's 1-4, a prefill expert's handful) against 96 MiB of weights (from
// DRAM here; a CPU with a larger L3 holds them), in the fused MoE's tasks (1024 rows up to 4
// tokens, 64 above): where the AMX tiles start to pay over the AVX-512 kernels. The argument is
// the token count.
void BM_GemmFew(benchmark::State& state, WFormat f, Isa isa) {
  run(state, f, gemv_rows(f, 2048), 2048, state.range(0), isa);
}

// One benchmark per ISA level (on a level without a kernel for the format, the one below runs:
// INT4 / INT8 have none at avx512_bf16, BF16 / FP8 none at avx512_vnni).
#define TD_PACKED_BENCH(fn, f, name)                                                            \
  BENCHMARK_CAPTURE(fn, name##_avx2, f, Isa::kAvx2)->UseRealTime()->MinTime(0.3);               \
  BENCHMARK_CAPTURE(fn, name##_avx512, f, Isa::kAvx512)->UseRealTime()->MinTime(0.3);           \
  BENCHMARK_CAPTURE(fn, name##_avx512_vnni, f, Isa::kAvx512Vnni)->UseRealTime()->MinTime(0.3); \
  BENCHMARK_CAPTURE(fn, name##_avx512_bf16, f, Isa::kAvx512Bf16)->UseRealTime()->MinTime(0.3); \
  BENCHMARK_CAPTURE(fn, name##_amx, f, Isa::kAmx)->UseRealTime()->MinTime(0.3)

TD_PACKED_BENCH(BM_Gemv, WFormat::kInt4, int4);
TD_PACKED_BENCH(BM_Gemv, WFormat::kInt8, int8);
TD_PACKED_BENCH(BM_Gemv, WFormat::kBF16Tile, bf16);
TD_PACKED_BENCH(BM_Gemv, WFormat::kBF16, bf16_rows);
TD_PACKED_BENCH(BM_Gemv, WFormat::kFP8Block, fp8);
TD_PACKED_BENCH(BM_Gemm512Task, WFormat::kInt4, int4);
TD_PACKED_BENCH(BM_Gemm512Task, WFormat::kInt8, int8);
TD_PACKED_BENCH(BM_Gemm512Task, WFormat::kBF16Tile, bf16);
TD_PACKED_BENCH(BM_Gemm512, WFormat::kInt4, int4);
TD_PACKED_BENCH(BM_Gemm512, WFormat::kInt8, int8);
TD_PACKED_BENCH(BM_Gemm512, WFormat::kBF16Tile, bf16);
TD_PACKED_BENCH(BM_Gemm512, WFormat::kBF16, bf16_rows);
TD_PACKED_BENCH(BM_Gemm512, WFormat::kFP8Block, fp8);
TD_PACKED_BENCH(BM_Gemm48Dram, WFormat::kInt4, int4);
TD_PACKED_BENCH(BM_Gemm48Dram, WFormat::kInt8, int8);
TD_PACKED_BENCH(BM_Gemm48Dram, WFormat::kBF16Tile, bf16);
#define TD_FEW_BENCH(f, name, isa_name, isa)                     \
  BENCHMARK_CAPTURE(BM_GemmFew, name##_##isa_name, f, isa)       \
      ->UseRealTime()                                            \
      ->MinTime(0.3)                                             \
      ->RangeMultiplier(2)                                       \
      ->Range(1, 128)
TD_FEW_BENCH(WFormat::kInt4, int4, avx512_vnni, Isa::kAvx512Vnni);
TD_FEW_BENCH(WFormat::kInt4, int4, amx, Isa::kAmx);
TD_FEW_BENCH(WFormat::kInt8, int8, avx512_vnni, Isa::kAvx512Vnni);
TD_FEW_BENCH(WFormat::kInt8, int8, amx, Isa::kAmx);
TD_FEW_BENCH(WFormat::kBF16Tile, bf16, avx512_bf16, Isa::kAvx512Bf16);
TD_FEW_BENCH(WFormat::kBF16Tile, bf16, amx, Isa::kAmx);

}  // namespace
}  // namespace tandem

BENCHMARK_MAIN();
