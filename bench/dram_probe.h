// DRAM read bandwidth measured inside a benchmark, next to what it compares with. This machine's
// DRAM speed swings by up to 2x within minutes (other guests on the host), so a fraction of a
// `tandem roofline` figure taken minutes earlier says little; a benchmark that alternates short
// rounds of its own work with rounds of this probe, and reports the median of the per-round
// ratios, measures both under the same conditions.
//
// The probe streams a huge-page buffer far larger than L3 with roofline's read kernels
// (ops/cpu/roofline_kernels.h, the best of them per round, as `tandem roofline` keeps the best),
// on the benchmark's own threads: the pool's workers and the caller, pulling 4 MiB chunks as the
// fused MoE's tasks are pulled.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "core/memory.h"
#include "core/thread_pool.h"
#include "ops/cpu/roofline_kernels.h"

namespace tandem {

// The benchmarks' thread pool, as the model's (ThreadingOptions::n_threads): one thread per
// physical core, the calling thread (which helps) one of them, so cores - 1 workers.
// TANDEM_BENCH_WORKERS=N: N workers instead (N + 1 threads).
inline ThreadPool& bench_pool() {
  static ThreadingContext ctx([] {
    const char* env = std::getenv("TANDEM_BENCH_WORKERS");
    return ThreadingOptions{env != nullptr ? std::atoi(env) + 1 : 0, true, 50};
  }());
  return ctx.pool();
}

class DramProbe {
 public:
  explicit DramProbe(ThreadPool* pool, size_t bytes = size_t{512} << 20) : pool_(pool) {
    AllocOptions a;
    a.huge_pages = true;
    a.prefault = true;
    buffer_ = AlignedBuffer(bytes, a);
    uint64_t* w = buffer_.as<uint64_t>();
    // Distinct values: pages of one value could be deduplicated by a hypervisor.
    for (size_t i = 0; i < bytes / sizeof(uint64_t); ++i) w[i] = i * 0x9E3779B97F4A7C15ull;
    for (const cpu::ReadKernel& k : cpu::read_kernels()) {
      if (k.isa != Isa::kScalar) kernels_.push_back(k.fn);
    }
    if (kernels_.empty()) kernels_.push_back(&cpu::read_sum_scalar);
  }

  // One pass over the buffer per read kernel; the best rate in GB/s (1e9 bytes per second).
  double measure() {
    constexpr size_t kChunk = size_t{4} << 20;
    const size_t chunks = buffer_.size() / kChunk;
    double best = 0;
    for (cpu::ReadFn fn : kernels_) {
      std::atomic<uint64_t> sink{0};
      const auto t0 = std::chrono::steady_clock::now();
      pool_->run(chunks, [&](size_t c) {
        sink.fetch_add(fn(buffer_.as<char>() + c * kChunk, kChunk), std::memory_order_relaxed);
      });
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      sink_ += sink.load();
      best = std::max(best, static_cast<double>(chunks * kChunk) / s * 1e-9);
    }
    return best;
  }

 private:
  ThreadPool* pool_;
  AlignedBuffer buffer_;
  std::vector<cpu::ReadFn> kernels_;
  uint64_t sink_ = 0;  // keeps the sums alive
};

// The median of v (v non-empty; reordered).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Paired rounds: 8 times, ~20 ms of `step` (a callable returning the bytes it read) then one
// probe pass. Returns {median of step GB/s / probe GB/s, median probe GB/s}.
struct OfDram {
  double of_dram = 0, dram_gbs = 0;
};
template <class Step>
OfDram paired_rounds(DramProbe& probe, Step&& step) {
  std::vector<double> ratio, dram;
  for (int round = 0; round < 8; ++round) {
    uint64_t bytes = 0;
    double sec = 0;
    const auto t0 = std::chrono::steady_clock::now();
    do {
      bytes += step();
      sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (sec < 0.02);
    dram.push_back(probe.measure());
    ratio.push_back(static_cast<double>(bytes) * 1e-9 / sec / dram.back());
  }
  return {median(ratio), median(dram)};
}

// An A/B in the same minute: 16 rounds of ~20 ms of `a` then ~20 ms of `b` (callables doing one
// call each); the median over the rounds of b's calls per second / a's.
template <class A, class B>
double ab_rounds(A&& a, B&& b) {
  auto rate = [](auto&& fn) {
    int calls = 0;
    double sec = 0;
    const auto t0 = std::chrono::steady_clock::now();
    do {
      fn();
      ++calls;
      sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (sec < 0.02);
    return calls / sec;
  };
  std::vector<double> ratio;
  for (int round = 0; round < 16; ++round) {
    const double ra = rate(a);
    ratio.push_back(rate(b) / ra);
  }
  return median(ratio);
}

// A one-token GEMV benchmark's rates: GBps (1e9 bytes/s; Google Benchmark's "G/s" is 2^30) and,
// unless TANDEM_BENCH_GEMV_KIB made it cache-resident, of_dram / dram_GBps from paired_rounds
// against a DRAM probe on `pool` (one probe per benchmark binary).
template <class Step>
void report_gemv(benchmark::State& state, ThreadPool* pool, int64_t bytes_per_call, Step&& step) {
  state.counters["GBps"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * static_cast<double>(bytes_per_call) * 1e-9,
      benchmark::Counter::kIsRate);
  if (std::getenv("TANDEM_BENCH_GEMV_KIB") != nullptr) return;
  static DramProbe probe(pool);
  const OfDram r = paired_rounds(probe, [&] {
    step();
    return static_cast<uint64_t>(bytes_per_call);
  });
  state.counters["of_dram"] = r.of_dram;
  state.counters["dram_GBps"] = r.dram_gbs;
}

}  // namespace tandem
