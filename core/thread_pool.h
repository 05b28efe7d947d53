// CPU parallelism for kernels and the CPU MoE backend: a pool of worker threads, each pinned to
// one physical core and grouped by NUMA node, running data-parallel jobs of `n_tasks` tasks that
// workers pull from a shared atomic counter (KTransformers §3.2 dynamic scheduling: uneven
// experts balance themselves). run() blocks with the caller helping; submit() returns a handle
// whose wait() is the backend's sync, so the caller can launch GPU work in between (§3.3).
//
// Hot-path properties: no allocation per job (jobs live in a fixed table of slots, callables are
// stored inline), idle workers spin briefly on an epoch counter and then sleep on a futex
// (std::atomic::wait). Not a general task graph: no dependencies, no priorities.
//
// There is no global pool (STYLE.md #6): a ThreadingContext holds the topology and the pool and is
// passed by reference to whoever needs threads.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/topology.h"

namespace tandem {

// Where one worker runs: its NUMA node (index into Topology::nodes) and the CPUs it is pinned to
// (one physical core's logical CPUs; empty: not pinned).
struct WorkerPlacement {
  int node = 0;
  std::vector<int> cpus;
};

struct ThreadPoolOptions {
  bool pin = true;     // pin each worker to its placement's CPUs
  int spin_us = 50;    // idle workers and waiters spin this long before sleeping
  int node_count = 0;  // NUMA nodes jobs may name; 0: 1 + the highest node in the placements
  const char* track = "cpu worker";  // the workers' tracks in a timeline: "<track> <index>"
};

// How a job runs. node = -1: any worker; else only the workers of that node. The caller helps
// (runs tasks itself while it waits) unless caller_helps is false, or the job belongs to a node
// other than the one the caller runs on (keeps NUMA-local work local).
struct RunOptions {
  int node = -1;
  bool caller_helps = true;
};

class ThreadPool;

// The result of submit(): wait() blocks until every task ran (helping, per RunOptions) and
// rethrows the first task's exception as tandem::Error. Move-only; destroying a handle that was
// not waited for waits (and logs an error it cannot throw).
class TaskHandle {
 public:
  TaskHandle() = default;
  TaskHandle(TaskHandle&& other) noexcept { *this = std::move(other); }
  TaskHandle& operator=(TaskHandle&& other) noexcept;
  TaskHandle(const TaskHandle&) = delete;
  TaskHandle& operator=(const TaskHandle&) = delete;
  ~TaskHandle();

  void wait();
  bool valid() const { return pool_ != nullptr; }  // false once waited (or for an empty job)
  bool done() const;                               // every task has finished (non-blocking)

 private:
  friend class ThreadPool;
  TaskHandle(ThreadPool* pool, int slot, bool caller_helps)
      : pool_(pool), slot_(slot), caller_helps_(caller_helps) {}
  ThreadPool* pool_ = nullptr;
  int slot_ = -1;
  bool caller_helps_ = true;
};

class ThreadPool {
 public:
  // Jobs in flight at once (run + submitted-and-not-waited); more throws Error(kResource).
  static constexpr int kMaxJobs = 64;
  // Bytes a submitted callable may occupy (it is copied into the job slot).
  static constexpr size_t kInlineFnBytes = 192;

  explicit ThreadPool(std::vector<WorkerPlacement> placements,
                      const ThreadPoolOptions& options = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(placements_.size()); }  // worker threads
  int node_count() const { return node_count_; }
  int workers_on_node(int node) const;
  const WorkerPlacement& placement(int worker) const { return placements_[worker]; }
  // Whether worker `worker` is pinned to placement(worker).cpus (pinning can fail in containers).
  bool pinned(int worker) const;
  // This thread's index for fn's `thread` argument: its worker index inside this pool's workers,
  // size() for any other thread. Scratch indexed by it needs size() + 1 entries.
  int current_thread_index() const;

  // Runs fn(task) or fn(task, thread) for every task in [0, n_tasks), each exactly once, and
  // returns when all are done. The first exception a task throws is rethrown as Error; tasks
  // not yet started are then skipped. Tasks may run or submit jobs themselves, but a task that
  // waits for a job of another node whose workers wait for this node's job deadlocks.
  template <typename F>
  void run(size_t n_tasks, F&& fn) {
    run(RunOptions{}, n_tasks, std::forward<F>(fn));
  }
  template <typename F>
  void run_on_node(int node, size_t n_tasks, F&& fn) {
    run(RunOptions{node, true}, n_tasks, std::forward<F>(fn));
  }
  template <typename F>
  void run(const RunOptions& options, size_t n_tasks, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    if (n_tasks == 0) return;
    const int slot = reserve_slot(options.node);
    // fn outlives the job (we wait below), so the slot points at it instead of copying it.
    start_job(slot, options.node, n_tasks, &invoke<Fn>, nullptr,
              const_cast<void*>(static_cast<const volatile void*>(std::addressof(fn))));
    finish_job(slot, options.caller_helps, /*rethrow=*/true);
  }

  // Starts the job and returns at once; the callable is copied into the job slot.
  template <typename F>
  TaskHandle submit(size_t n_tasks, F&& fn) {
    return submit(RunOptions{}, n_tasks, std::forward<F>(fn));
  }
  template <typename F>
  TaskHandle submit_on_node(int node, size_t n_tasks, F&& fn) {
    return submit(RunOptions{node, true}, n_tasks, std::forward<F>(fn));
  }
  template <typename F>
  TaskHandle submit(const RunOptions& options, size_t n_tasks, F&& fn) {
    using Fn = std::decay_t<F>;
    static_assert(sizeof(Fn) <= kInlineFnBytes && alignof(Fn) <= alignof(std::max_align_t),
                  "submit(): callable too large to store inline; capture a struct by reference");
    if (n_tasks == 0) return TaskHandle();
    const int slot = reserve_slot(options.node);
    void* storage = slot_storage(slot);
    try {
      ::new (storage) Fn(std::forward<F>(fn));
    } catch (...) {
      release_slot(slot);
      throw;
    }
    start_job(slot, options.node, n_tasks, &invoke<Fn>, &destroy<Fn>, storage);
    return TaskHandle(this, slot, options.caller_helps);
  }

 private:
  friend class TaskHandle;
  struct JobSlot;
  using InvokeFn = void (*)(void* fn, size_t task, int thread);
  using DestroyFn = void (*)(void* fn);

  template <typename Fn>
  static void invoke(void* fn, size_t task, int thread) {
    Fn& f = *static_cast<Fn*>(fn);
    if constexpr (std::is_invocable_v<Fn&, size_t, int>) {
      f(task, thread);
    } else {
      static_assert(std::is_invocable_v<Fn&, size_t>, "task must be fn(size_t) or fn(size_t, int)");
      f(task);
    }
  }
  template <typename Fn>
  static void destroy(void* fn) {
    static_cast<Fn*>(fn)->~Fn();
  }

  int reserve_slot(int node);
  void release_slot(int slot);
  void* slot_storage(int slot);
  void start_job(int slot, int node, size_t n_tasks, InvokeFn invoke, DestroyFn destroy, void* fn);
  // Helps (if allowed), waits for the last task, frees the slot, rethrows a task's error.
  void finish_job(int slot, bool caller_helps, bool rethrow);
  bool job_done(int slot) const;
  // Claims and runs tasks of `slot` until none are left; false if the slot had no job.
  bool work_on(int slot, int thread, bool as_caller);
  void worker_main(int index);
  void start_worker(int index, std::atomic<int>& started);  // throws std::system_error
  void stop_workers();
  bool caller_may_help(int node) const;
  template <typename Pred>
  bool spin_until(Pred pred) const;

  std::vector<WorkerPlacement> placements_;
  ThreadPoolOptions options_;
  int node_count_ = 1;
  std::unique_ptr<JobSlot[]> slots_;
  std::unique_ptr<std::atomic<bool>[]> pinned_;
  std::vector<int> workers_per_node_;
  std::vector<int> cpu_node_;  // NUMA node of each CPU some worker is pinned to (-1: unknown)
  alignas(64) std::atomic<uint64_t> active_{0};           // slots with tasks left to claim
  alignas(64) std::atomic<uint64_t> free_{~uint64_t{0}};  // slots that may be reserved
  alignas(64) std::atomic<uint32_t> epoch_{0};  // bumped on every post: wakes idle workers
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

// n_threads counts the threads that compute, the calling thread included (llama.cpp's -t): the
// pool gets n_threads - 1 workers and the caller, which helps while it waits, is the last one.
// Measured on 2 cores (V2-Lite Q4_K_M decode): 2 workers + the helping caller = 3 threads
// preempted one another mid-task (spins of 0.1-4 ms at the MoE operator's per-expert
// dependencies) and decoded 4% slower than 1 worker + the caller.
struct ThreadingOptions {
  int n_threads = 0;  // compute threads, caller included; 0: one per allowed physical core
  bool pin = true;
  int spin_us = 50;
};

// Spreads n_threads workers over the topology's cores: nodes interleaved (so k workers use every
// node evenly), one worker per physical core, wrapping around when there are more workers than
// cores. Exposed for tests.
std::vector<WorkerPlacement> place_workers(const Topology& topology, int n_threads);

// The topology and the thread pool, created once by the CLI (or a test) and passed by reference.
class ThreadingContext {
 public:
  explicit ThreadingContext(const ThreadingOptions& options = {});
  ThreadingContext(Topology topology, const ThreadingOptions& options);

  const Topology& topology() const { return topology_; }
  ThreadPool& pool() { return *pool_; }
  int n_threads() const { return pool_->size() + 1; }  // the workers and the calling thread

 private:
  Topology topology_;
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace tandem
