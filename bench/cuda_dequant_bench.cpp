// Throughput of the CUDA dequantization kernels (ops/cuda/dequant.h): bytes read + written per
// second for each source type and F32 / BF16 output, on a DeepSeek-V3-sized weight
// ([7168, 2048] expert projection, 8 of them). And of the products that read the weight as stored
// (ops/cuda/matvec.h) with 1 and 8 token rows, the decode step's case: weight bytes read per
// second (the activations are noise beside them). frac_peak is the rate over the device's DRAM
// peak (memory clock x bus width), the number to compare across GPUs. Without CUDA or a GPU it
// says why and exits 0.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <random>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/cuda_info.h"
#include "ops/cuda/cuda_util.h"
#include "ops/cuda/dequant.h"
#include "ops/cuda/matvec.h"

namespace tandem {
namespace {

constexpr int64_t kRows = 8 * 2048;
constexpr int64_t kCols = 7168;  // a multiple of every block size

double device_peak_bytes_per_s() {
  int device = 0, clock_khz = 0, bus_bits = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
    return 0.0;
  }
  return 2.0 * clock_khz * 1e3 * bus_bits / 8.0;  // double data rate
}

// Random bytes are a fair input: the kernels' work does not depend on the values.
std::vector<uint8_t> random_bytes(size_t n) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(42);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Times launch() (a cudaError_t-returning launcher) with CUDA events, one call per iteration
// after a warm-up, and reports `moved` bytes per call as GB/s and as a fraction of the DRAM peak.
template <typename Launch>
void time_launches(benchmark::State& state, Launch&& launch, double moved) {
  TD_CUDA_CHECK(launch());  // warm-up
  cudaEvent_t start, stop;
  TD_CUDA_CHECK(cudaEventCreate(&start));
  TD_CUDA_CHECK(cudaEventCreate(&stop));
  for (auto _ : state) {
    TD_CUDA_CHECK(cudaEventRecord(start));
    TD_CUDA_CHECK(launch());
    TD_CUDA_CHECK(cudaEventRecord(stop));
    TD_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    TD_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  state.SetBytesProcessed(static_cast<int64_t>(moved) * state.iterations());
  state.counters["GB/s"] =
      benchmark::Counter(moved * 1e-9 * state.iterations(), benchmark::Counter::kIsRate);
  const double peak = device_peak_bytes_per_s();
  if (peak > 0) {
    state.counters["frac_peak"] =
        benchmark::Counter(moved / peak * state.iterations(), benchmark::Counter::kIsRate);
  }
}

void bm_dequant(benchmark::State& state, DType type, DType out, bool fp8_blocks) {
  const int64_t src_row_bytes = dtype_bytes(type, kCols);
  const size_t src_bytes = static_cast<size_t>(kRows * src_row_bytes);
  const size_t dst_bytes = static_cast<size_t>(kRows * kCols * dtype_info(out).block_bytes);
  DeviceBuffer src(src_bytes), dst(dst_bytes);
  const std::vector<uint8_t> host = random_bytes(src_bytes);
  src.upload(host.data(), src_bytes);
  const int64_t scale_cols = (kCols + 127) / 128;
  DeviceBuffer scale(static_cast<size_t>((kRows + 127) / 128 * scale_cols) * sizeof(float));
  TD_CUDA_CHECK(cudaMemset(scale.data(), 0, scale.bytes()));
  const size_t scale_bytes = fp8_blocks ? scale.bytes() : 0;

  auto launch = [&] {
    if (fp8_blocks) {
      return dequantize_fp8_blocks_cuda(src.as<uint8_t>(), src_row_bytes, scale.as<float>(),
                                        scale_cols, kRows, kCols, 128, 128, out, dst.data(), kCols,
                                        nullptr);
    }
    return dequantize_rows_cuda(type, src.data(), src_row_bytes, kRows, kCols, out, dst.data(),
                                kCols, nullptr);
  };
  time_launches(state, launch, static_cast<double>(src_bytes + dst_bytes + scale_bytes));
  state.counters["values"] = static_cast<double>(kRows * kCols);
}

void bm_matvec(benchmark::State& state, DType type, int64_t tokens) {
  const int64_t row_bytes = dtype_bytes(type, kCols);
  const size_t w_bytes = static_cast<size_t>(kRows * row_bytes);
  DeviceBuffer w(w_bytes), x(static_cast<size_t>(tokens * kCols) * 4),
      y(static_cast<size_t>(tokens * kRows) * 4);
  const std::vector<uint8_t> host = random_bytes(w_bytes);
  w.upload(host.data(), w_bytes);
  TD_CUDA_CHECK(cudaMemset(x.data(), 0, x.bytes()));
  const QuantMatrix m{
      .type = type, .data = w.data(), .row_bytes = row_bytes, .rows = kRows, .cols = kCols};
  auto launch = [&] {
    return matmul_quant_cuda(m, x.as<float>(), kCols, tokens, y.as<float>(), kRows, nullptr);
  };
  time_launches(state, launch, static_cast<double>(w_bytes));
}

void register_all() {
  const DType types[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kF8E4M3,
                         DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                         DType::kQ8_0, DType::kQ8_1, DType::kQ2_K, DType::kQ3_K,
                         DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ8_K};
  for (DType out : {DType::kF32, DType::kBF16}) {
    for (DType type : types) {
      const std::string name =
          "cuda_dequant/" + std::string(dtype_name(type)) + "->" + std::string(dtype_name(out));
      benchmark::RegisterBenchmark(name.c_str(), bm_dequant, type, out, false)->UseManualTime();
    }
    const std::string name = "cuda_dequant/f8_e4m3_blocks128->" + std::string(dtype_name(out));
    benchmark::RegisterBenchmark(name.c_str(), bm_dequant, DType::kF8E4M3, out, true)
        ->UseManualTime();
  }
  for (DType type : {DType::kF32, DType::kBF16, DType::kF8E4M3, DType::kQ8_0, DType::kQ4_K,
                     DType::kQ5_K, DType::kQ6_K, DType::kMXFP4}) {
    for (int64_t tokens : {1, 8}) {
      const std::string name =
          "cuda_matvec/" + std::string(dtype_name(type)) + "/tokens:" + std::to_string(tokens);
      benchmark::RegisterBenchmark(name.c_str(), bm_matvec, type, tokens)->UseManualTime();
    }
  }
}

}  // namespace
}  // namespace tandem
#endif

int main(int argc, char** argv) {
#ifndef TANDEM_HAVE_CUDA
  std::printf("cuda_dequant_bench: built without CUDA, skipped\n");
  return 0;
#else
  std::string why;
  const auto devices = tandem::cuda_devices(&why);
  if (devices.empty()) {
    std::printf("cuda_dequant_bench: %s, skipped\n", why.c_str());
    return 0;
  }
  benchmark::AddCustomContext("cuda_device", devices[0].name);
  tandem::register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
#endif
}
