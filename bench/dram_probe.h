// DRAM read bandwidth (and the compute peaks: PeakProbe below) measured inside a benchmark, next
// to what it compares with. This machine's
// DRAM speed swings by up to 2x within minutes (other guests on the host), so a fraction of a
// `tandem roofline` figure taken minutes earlier says little; a benchmark that alternates short
// rounds of its own work with rounds of this probe, and reports the median of the per-round
// ratios, measures both under the same conditions.
//
// The probe streams a huge-page buffer far larger than L3 (dram_sized_bytes) with roofline's read
// kernels (ops/cpu/roofline_kernels.h, the best of them per round, as `tandem roofline` keeps the
// best), on the benchmark's own threads: the pool's workers and the caller, pulling 4 MiB chunks
// as the fused MoE's tasks are pulled.
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
#include "core/topology.h"
#include "ops/cpu/roofline_kernels.h"

namespace tandem {

// Bytes a buffer needs to be read from DRAM rather than the caches: at least `minimum` and 3x
// the L3 in use (a server's L3 of several hundred MiB holds what a laptop's would not), at most
// a quarter of the memory available (where that is less than `minimum`, `minimum`).
inline uint64_t dram_sized_bytes(uint64_t minimum) {
  static const Topology t = detect_topology();
  const uint64_t l3 = t.l3_bytes * static_cast<uint64_t>(std::max(1, t.l3_instances));
  uint64_t bytes = std::max(minimum, 3 * l3);
  if (t.available_memory_bytes > 0) bytes = std::min(bytes, t.available_memory_bytes / 4);
  return std::max(bytes, minimum);
}

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
  explicit DramProbe(ThreadPool* pool, size_t bytes = dram_sized_bytes(size_t{512} << 20))
      : pool_(pool) {
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

// The compute peak the same way: `tandem roofline`'s multiply-add chains of one kind
// (ops/cpu/roofline_kernels.h, the best variant this CPU runs) on every thread of the pool at once,
// for ~10 ms per measure(). A shared VM's compute rate swings too (one core's INT8 GEMM task can
// take 600 or 900 thousand cycles by the minute, as if another guest shared the core).
class PeakProbe {
 public:
  // A CPU without a kernel of `kind` (bf16 without AVX-512 BF16) gets none: ok() is false.
  PeakProbe(ThreadPool* pool, cpu::ComputeKind kind)
      : pool_(pool), kernel_(cpu::best_compute_kernel(kind)) {
    if (kernel_ == nullptr) return;
    iterations_ = 1 << 12;
    while (iterations_ < (uint64_t{1} << 40) && pass() < 0.01) iterations_ *= 2;
  }
  bool ok() const { return kernel_ != nullptr; }
  const char* kernel_name() const { return kernel_ != nullptr ? kernel_->name : ""; }

  // One pass: G op/s (2 per multiply-add) of all threads together.
  double measure() {
    const double s = pass();
    return kernel_->ops_per_iteration * static_cast<double>(iterations_) * threads() / s * 1e-9;
  }

 private:
  int threads() const { return pool_->size() + 1; }
  // Seconds for every thread to run iterations_ rounds, from the moment the last one started
  // (waking a sleeping worker took up to tens of ms on this VM) to the last one's end; each task
  // waits until all have started, so no thread runs two (the caller helps as one of them).
  double pass() {
    using Clock = std::chrono::steady_clock;
    const int n = threads();
    std::atomic<int> arrived{0};
    std::atomic<int64_t> start{0}, end{0};
    auto now = [] { return Clock::now().time_since_epoch().count(); };
    pool_->run(static_cast<size_t>(n), [&](size_t) {
      if (arrived.fetch_add(1) + 1 == n) {
        start.store(now(), std::memory_order_release);
      } else {
        while (arrived.load(std::memory_order_acquire) < n) {
        }
      }
      sink_.fetch_add(static_cast<uint64_t>(kernel_->fn(iterations_)), std::memory_order_relaxed);
      const int64_t t = now();
      int64_t e = end.load();
      while (t > e && !end.compare_exchange_weak(e, t)) {
      }
    });
    return std::chrono::duration<double>(Clock::duration(end.load() - start.load())).count();
  }

  ThreadPool* pool_;
  const cpu::ComputeKernel* kernel_;
  uint64_t iterations_ = 0;
  std::atomic<uint64_t> sink_{0};  // keeps the sums alive
};

// Paired rounds: 8 times, ~20 ms of `step` (a callable returning the amount of work it did: the
// bytes it read for a DramProbe, the operations for a PeakProbe) then one probe pass. Returns
// {median of step rate / probe rate, median probe rate (GB/s or G op/s)}.
struct Paired {
  double ratio = 0, probe_rate = 0;
};
template <class Probe, class Step>
Paired paired_rounds(Probe& probe, Step&& step) {
  std::vector<double> ratio, rate;
  for (int round = 0; round < 8; ++round) {
    uint64_t amount = 0;
    double sec = 0;
    const auto t0 = std::chrono::steady_clock::now();
    do {
      amount += step();
      sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (sec < 0.02);
    rate.push_back(probe.measure());
    ratio.push_back(static_cast<double>(amount) * 1e-9 / sec / rate.back());
  }
  return {median(ratio), median(rate)};
}

// A many-token benchmark's of_peak / peak_Gops: paired_rounds of `step` (one call doing
// ops_per_call operations, 2 per multiply-add) against the compute peak of `kind` (int8 for the
// integer kernels; bf16 for BF16 / FP8 weights, or fp32 on a CPU without a BF16 dot, where those
// are widened to F32). One probe per kind and benchmark binary.
template <class Step>
void report_peak(benchmark::State& state, ThreadPool* pool, cpu::ComputeKind kind,
                 uint64_t ops_per_call, Step&& step) {
  static PeakProbe int8(pool, cpu::ComputeKind::kInt8Dot);
  static PeakProbe bf16(pool, cpu::ComputeKind::kBf16Dot);
  static PeakProbe fp32(pool, cpu::ComputeKind::kFp32Fma);
  PeakProbe* probe = kind == cpu::ComputeKind::kInt8Dot ? &int8 : bf16.ok() ? &bf16 : &fp32;
  if (!probe->ok()) return;
  const Paired r = paired_rounds(*probe, [&] {
    step();
    return ops_per_call;
  });
  state.counters["of_peak"] = r.ratio;
  state.counters["peak_Gops"] = r.probe_rate;
  state.SetLabel(probe->kernel_name());
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
  const Paired r = paired_rounds(probe, [&] {
    step();
    return static_cast<uint64_t>(bytes_per_call);
  });
  state.counters["of_dram"] = r.ratio;
  state.counters["dram_GBps"] = r.probe_rate;
}

}  // namespace tandem
