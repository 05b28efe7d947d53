// This machine's limits, measured: DRAM / L3 / L2 read bandwidth and peak fp32, bf16 and int8
// throughput of the CPU, per thread count. Benchmarks report their results as fractions of these
// numbers (ARCHITECTURE.md: performance is never asserted by timed tests), and the cost model can
// start from them. `tandem roofline` prints them; measure_roofline() is the library API.
//
// How: every number is the best of several timed repetitions in which all threads start
// together (a spin barrier) and the time runs until the last one finishes. DRAM reads stream
// over a buffer far larger than L3, split per NUMA node and bound to it, huge pages, prefaulted;
// every read-kernel variant (widths, prefetch, non-temporal loads) is tried and the best kept.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/memory.h"
#include "core/thread_pool.h"
#include "ops/cpu/roofline_kernels.h"

namespace tandem::cpu {

struct RooflineOptions {
  int threads = 0;                      // 0: every worker of the pool
  size_t dram_bytes = size_t{1} << 30;  // DRAM buffer, all nodes together
  double seconds = 0.25;                // minimum duration of one timed repetition
  int repetitions = 3;                  // the best of these is reported
  bool huge_pages = true;
  bool thread_sweep = true;  // also measure 1, 2, 4, ... threads (else only `threads`)
  bool cache_levels = true;  // L2 and L3 bandwidth
  bool compute = true;       // fp32 / bf16 / int8 peaks (and AMX's where the CPU has it)
};

// One measured value (GB/s, GFLOP/s or GOP/s) at a thread count, with the kernel that gave it.
struct RooflinePoint {
  int threads = 0;
  double value = 0;
  std::string kernel;
};

struct RooflineResult {
  int threads = 0;  // the thread count of the headline numbers below
  int numa_nodes = 1;
  std::string isa;  // best_isa() at measurement time
  // Read bandwidth in GB/s (1e9 bytes/s), 0 when not measured.
  double dram_read_gbs = 0, l3_read_gbs = 0, l2_read_gbs = 0;
  std::string dram_kernel, l3_kernel, l2_kernel;
  // Peak throughput: fp32 and bf16 in GFLOP/s, int8 in GOP/s (a multiply-add is 2); 0 = none.
  double fp32_gflops = 0, bf16_gflops = 0, int8_gops = 0;
  std::string fp32_kernel, bf16_kernel, int8_kernel;
  // The AMX tile units' peaks (GOP/s, GFLOP/s), 0 without AMX: what the AMX kernels compare with.
  double amx_int8_gops = 0, amx_bf16_gflops = 0;
  std::string amx_int8_kernel, amx_bf16_kernel;

  size_t dram_buffer_bytes = 0;
  size_t l3_bytes_per_thread = 0, l2_bytes_per_thread = 0;
  bool huge_pages = false;            // MADV_HUGEPAGE accepted on the DRAM buffers
  size_t huge_page_backed_bytes = 0;  // of them actually on huge pages

  std::vector<RooflinePoint> dram_variants;  // each read kernel at `threads`
  std::vector<RooflinePoint> dram_sweep, fp32_sweep, bf16_sweep, int8_sweep;  // by threads
  std::vector<RooflinePoint> amx_int8_sweep, amx_bf16_sweep;
};

// Measures with ctx's threads: the pool's workers and the calling thread, as the model runs
// (ctx.n_threads() by default). Throws Error(kInvalidArgument) for a bad option (threads beyond
// the workers and the caller, a zero buffer) and Error(kResource) when the
// buffer cannot be allocated.
RooflineResult measure_roofline(ThreadingContext& ctx, const RooflineOptions& options);

// DRAM read bandwidth on demand: measure_roofline's DRAM step with its buffers kept, so a caller
// can measure again right next to its own work (`tandem bench` after each decode repetition). On a
// shared host the bandwidth a guest gets changes within minutes; a fraction of a figure measured
// earlier says little. Uses options.threads, dram_bytes, seconds, repetitions, huge_pages; throws
// as measure_roofline does.
class DramReadProbe {
 public:
  DramReadProbe(ThreadingContext& ctx, const RooflineOptions& options);
  // Every read kernel once (best of options.repetitions each); the best GB/s. Appends each
  // kernel's figure to *variants when given.
  double measure(std::vector<RooflinePoint>* variants = nullptr);
  // The kernel that won the last measure() (the first one before any), on `threads` threads.
  double measure_at(int threads);
  // One timed repetition of at least `seconds` (one pass of the buffer at least) with that kernel
  // on every thread: the short probe of paired rounds (`tandem bench`'s decode).
  double measure_once(double seconds);
  const char* best_kernel() const { return kernels_[best_].name; }
  int threads() const { return threads_; }
  int numa_nodes() const { return numa_nodes_; }
  size_t buffer_bytes() const { return buffer_bytes_; }
  bool huge_pages() const { return huge_pages_; }
  size_t huge_page_backed_bytes() const { return huge_page_backed_bytes_; }

 private:
  ThreadPool* pool_;
  RooflineOptions opt_;
  std::vector<ReadKernel> kernels_;
  size_t best_ = 0;
  int threads_ = 0, numa_nodes_ = 0;
  std::vector<int> per_node_;
  std::vector<AlignedBuffer> buffers_;
  size_t per_node_bytes_ = 0, buffer_bytes_ = 0, huge_page_backed_bytes_ = 0;
  bool huge_pages_ = false;
};

// The thread counts a sweep visits: 1, 2, 4, ... below n, then n.
std::vector<int> sweep_thread_counts(int n);

std::string roofline_to_json(const RooflineResult& result, int indent = 2);
// Reads what roofline_to_json wrote (e.g. a saved `tandem roofline --json`); throws
// Error(kFormat) naming the key when it is malformed.
RooflineResult roofline_from_json(const std::string& text);

}  // namespace tandem::cpu
