// Thread pool costs: the latency of dispatching an empty job (what every parallel op pays on
// top of its work), submit + wait, many tiny tasks (contention on the shared task counter), and
// the scaling of a fixed amount of compute over 1..N threads.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>

#include "core/thread_pool.h"

namespace tandem {
namespace {

ThreadingContext& context(int threads) {
  // One context per thread count (the caller one of them: threads - 1 workers), kept across
  // benchmarks (creating threads is not measured).
  static std::unique_ptr<ThreadingContext> contexts[256];
  auto& slot = contexts[threads];
  if (!slot) slot = std::make_unique<ThreadingContext>(ThreadingOptions{threads, true, 50});
  return *slot;
}

int max_threads() {
  return detect_topology().physical_cores();
}

void thread_counts(benchmark::internal::Benchmark* b) {
  for (int t = 1; t < max_threads(); t *= 2) b->Arg(t);
  b->Arg(max_threads());
}

void BM_RunEmpty(benchmark::State& state) {
  ThreadingContext& ctx = context(static_cast<int>(state.range(0)));
  ThreadPool& pool = ctx.pool();
  const size_t tasks = static_cast<size_t>(ctx.n_threads());
  for (auto _ : state) pool.run(tasks, [](size_t) {});
  state.counters["threads"] = ctx.n_threads();
}
BENCHMARK(BM_RunEmpty)->Apply(thread_counts)->UseRealTime();

void BM_RunEmptyWorkersOnly(benchmark::State& state) {
  ThreadPool& pool = context(static_cast<int>(state.range(0))).pool();
  const size_t tasks = static_cast<size_t>(std::max(1, pool.size()));
  for (auto _ : state) pool.run(RunOptions{-1, false}, tasks, [](size_t) {});
}
BENCHMARK(BM_RunEmptyWorkersOnly)->Apply(thread_counts)->UseRealTime();

void BM_SubmitWaitEmpty(benchmark::State& state) {
  ThreadPool& pool = context(static_cast<int>(state.range(0))).pool();
  const size_t tasks = static_cast<size_t>(std::max(1, pool.size()));
  for (auto _ : state) pool.submit(RunOptions{-1, false}, tasks, [](size_t) {}).wait();
}
BENCHMARK(BM_SubmitWaitEmpty)->Apply(thread_counts)->UseRealTime();

void BM_ManyTinyTasks(benchmark::State& state) {
  ThreadPool& pool = context(max_threads()).pool();
  const size_t tasks = static_cast<size_t>(state.range(0));
  std::atomic<uint64_t> sink{0};
  for (auto _ : state)
    pool.run(tasks, [&](size_t t) { sink.fetch_add(t, std::memory_order_relaxed); });
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * tasks));
}
BENCHMARK(BM_ManyTinyTasks)->Arg(1000)->Arg(100000)->UseRealTime();

// A fixed total of compute split into 256 tasks, on the workers and the helping caller: time
// should fall as 1/threads.
void BM_Scaling(benchmark::State& state) {
  ThreadPool& pool = context(static_cast<int>(state.range(0))).pool();
  constexpr size_t kTasks = 256, kStepsPerTask = 20000;
  std::atomic<uint64_t> sink{0};
  for (auto _ : state) {
    pool.run(kTasks, [&](size_t t) {
      double x = static_cast<double>(t) + 1.0;
      for (size_t i = 0; i < kStepsPerTask; ++i) x = std::sqrt(x + static_cast<double>(i));
      sink.fetch_add(static_cast<uint64_t>(x), std::memory_order_relaxed);
    });
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kTasks * kStepsPerTask));
}
BENCHMARK(BM_Scaling)->Apply(thread_counts)->UseRealTime();

}  // namespace
}  // namespace tandem

BENCHMARK_MAIN();
