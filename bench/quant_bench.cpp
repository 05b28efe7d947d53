// Throughput of the scalar reference (de)quantizers in formats/quant.h, per dtype, on one row of
// 64K values (L2-resident, so this measures compute, not DRAM). bytes_processed counts the
// quantized bytes plus the F32 bytes, so the printed rate is memory traffic per second.
// Run: build/bench/bench_quant_bench [--benchmark_format=json]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "formats/quant.h"

namespace tandem {
namespace {

constexpr int64_t kElems = 64 * 1024;

std::vector<float> random_weights() {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> x(kElems);
  for (float& v : x) v = normal(rng);
  return x;
}

int64_t traffic_bytes(DType type) {
  return dtype_bytes(type, kElems) + kElems * 4;
}

void BM_Dequantize(benchmark::State& state, DType type) {
  const std::vector<float> x = random_weights();
  std::vector<uint8_t> q(static_cast<size_t>(dtype_bytes(type, kElems)));
  if (can_quantize(type)) {
    quantize_row(type, x.data(), q.data(), kElems);
  } else {
    for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<uint8_t>(i * 2654435761u >> 24);
  }
  std::vector<float> y(kElems);
  for (auto _ : state) {
    dequantize_row(type, q.data(), y.data(), kElems);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * traffic_bytes(type));
  state.SetItemsProcessed(state.iterations() * kElems);
}

void BM_Quantize(benchmark::State& state, DType type) {
  const std::vector<float> x = random_weights();
  std::vector<uint8_t> q(static_cast<size_t>(dtype_bytes(type, kElems)));
  for (auto _ : state) {
    quantize_row(type, x.data(), q.data(), kElems);
    benchmark::DoNotOptimize(q.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * traffic_bytes(type));
  state.SetItemsProcessed(state.iterations() * kElems);
}

void register_all() {
  for (int i = 0; i < static_cast<int>(DType::kCount); ++i) {
    const auto type = static_cast<DType>(i);
    const std::string name(dtype_name(type));
    benchmark::RegisterBenchmark(("dequantize_row/" + name).c_str(), BM_Dequantize, type);
    if (can_quantize(type)) {
      benchmark::RegisterBenchmark(("quantize_row/" + name).c_str(), BM_Quantize, type);
    }
  }
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
