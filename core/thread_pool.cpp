#include "core/thread_pool.h"

#include <fmt/format.h>
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>

#include "core/error.h"
#include "core/log.h"
#include "core/trace_events.h"

namespace tandem {
namespace {

// Which pool (if any) this thread is a worker of, and its index there.
thread_local const ThreadPool* tls_pool = nullptr;
thread_local int tls_worker = -1;

}  // namespace

// One job. The poster writes the plain fields, then sets the slot's bit in active_ (release);
// a thread that sees the bit after incrementing `users` may read them. A slot is freed only once
// every task is done and no thread is inside it, so a stale reader can never see it reused
// half-written.
struct alignas(64) ThreadPool::JobSlot {
  size_t n_tasks = 0;
  int node = -1;
  InvokeFn invoke = nullptr;
  DestroyFn destroy = nullptr;
  void* fn = nullptr;
  std::exception_ptr error;  // written once, by the thread that set `failed`
  size_t error_task = 0;
  alignas(64) std::atomic<size_t> next{0};  // next task id to claim
  alignas(64) std::atomic<size_t> done{0};  // tasks finished or skipped
  std::atomic<uint32_t> finished{0};        // 1 once done == n_tasks (futex word for waiters)
  std::atomic<int> users{0};                // threads between entering and leaving work_on
  std::atomic<bool> failed{false};
  alignas(std::max_align_t) unsigned char storage[kInlineFnBytes];
};

template <typename Pred>
bool ThreadPool::spin_until(Pred pred) const {
  using Clock = std::chrono::steady_clock;
  if (options_.spin_us <= 0) return pred();
  const auto deadline = Clock::now() + std::chrono::microseconds(options_.spin_us);
  for (unsigned i = 0;; ++i) {
    if (pred()) return true;
    _mm_pause();
    if ((i & 63) == 63 && Clock::now() > deadline) return pred();
  }
}

ThreadPool::ThreadPool(std::vector<WorkerPlacement> placements, const ThreadPoolOptions& options)
    : placements_(std::move(placements)), options_(options), slots_(new JobSlot[kMaxJobs]) {
  static_assert(kMaxJobs == 64, "slot masks are one 64-bit word");
  int max_node = 0;
  for (const WorkerPlacement& p : placements_) {
    TD_CHECK(p.node >= 0, "worker placement with node {}", p.node);
    max_node = std::max(max_node, p.node);
  }
  node_count_ = std::max(options_.node_count, max_node + 1);
  workers_per_node_.assign(static_cast<size_t>(node_count_), 0);
  for (const WorkerPlacement& p : placements_) {
    ++workers_per_node_[static_cast<size_t>(p.node)];
    for (int cpu : p.cpus) {
      if (cpu < 0) continue;
      if (static_cast<size_t>(cpu) >= cpu_node_.size()) cpu_node_.resize(cpu + 1, -1);
      cpu_node_[static_cast<size_t>(cpu)] = p.node;
    }
  }
  pinned_.reset(new std::atomic<bool>[placements_.size()]);
  for (size_t i = 0; i < placements_.size(); ++i) pinned_[i] = false;

  // Workers pin themselves first thing; wait for that so pinned() is true from the start.
  std::atomic<int> started{0};
  threads_.reserve(placements_.size());
  for (int i = 0; i < size(); ++i) {
    try {
      start_worker(i, started);
    } catch (const std::exception& e) {  // no memory for a stack, a thread limit (system_error)
      const int created = static_cast<int>(threads_.size());
      for (int n = started.load(); n < created; n = started.load()) started.wait(n);
      stop_workers();
      fail(ErrorKind::kResource, "cannot start worker thread {} of {}: {} (fewer --threads?)",
           i + 1, size(), e.what());
    }
  }
  for (int n = started.load(); n < size(); n = started.load()) started.wait(n);
  for (int i = 0; i < size(); ++i) {
    if (options_.pin && !placements_[static_cast<size_t>(i)].cpus.empty() && !pinned(i)) {
      log_debug("worker {} could not be pinned to CPUs {}", i,
                format_cpu_list(placements_[static_cast<size_t>(i)].cpus));
    }
  }
}

void ThreadPool::start_worker(int i, std::atomic<int>& started) {
  threads_.emplace_back([this, i, &started] {
    tls_pool = this;
    tls_worker = i;
    const WorkerPlacement& p = placements_[static_cast<size_t>(i)];
    if (options_.pin && !p.cpus.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int cpu : p.cpus) CPU_SET(cpu, &set);
      pinned_[static_cast<size_t>(i)] =
          pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
    }
    char name[16];
    std::snprintf(name, sizeof(name), "tandem-w%d", i);
    pthread_setname_np(pthread_self(), name);
    trace::name_thread(fmt::format("{} {}", options_.track, i));
    started.fetch_add(1);
    started.notify_one();
    worker_main(i);
  });
}

void ThreadPool::stop_workers() {
  stop_.store(true);
  epoch_.fetch_add(1);
  epoch_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

ThreadPool::~ThreadPool() {
  const uint64_t in_flight = ~free_.load();
  TD_CHECK(in_flight == 0, "thread pool destroyed with jobs in flight (mask {:#x})", in_flight);
  stop_workers();
}

int ThreadPool::workers_on_node(int node) const {
  if (node < 0 || node >= node_count_) return 0;
  return workers_per_node_[static_cast<size_t>(node)];
}

bool ThreadPool::pinned(int worker) const {
  return pinned_[static_cast<size_t>(worker)].load();
}

int ThreadPool::current_thread_index() const {
  return tls_pool == this ? tls_worker : size();
}

bool ThreadPool::caller_may_help(int node) const {
  if (node < 0) return true;
  if (tls_pool == this) return placements_[static_cast<size_t>(tls_worker)].node == node;
  const int cpu = sched_getcpu();
  if (cpu < 0 || static_cast<size_t>(cpu) >= cpu_node_.size() || cpu_node_[cpu] < 0) return true;
  return cpu_node_[static_cast<size_t>(cpu)] == node;
}

int ThreadPool::reserve_slot(int node) {
  if (node < -1 || node >= node_count_) {
    fail(ErrorKind::kInvalidArgument, "thread pool: NUMA node {} does not exist (pool has {})",
         node, node_count_);
  }
  uint64_t free = free_.load();
  for (;;) {
    if (free == 0) {
      fail(ErrorKind::kResource, "thread pool: more than {} jobs in flight (submit without wait?)",
           kMaxJobs);
    }
    const int slot = __builtin_ctzll(free);
    if (free_.compare_exchange_weak(free, free & ~(uint64_t{1} << slot))) return slot;
  }
}

void ThreadPool::release_slot(int slot) {
  free_.fetch_or(uint64_t{1} << slot);
}

void* ThreadPool::slot_storage(int slot) {
  return slots_[slot].storage;
}

void ThreadPool::start_job(int slot, int node, size_t n_tasks, InvokeFn invoke, DestroyFn destroy,
                           void* fn) {
  JobSlot& j = slots_[slot];
  j.n_tasks = n_tasks;
  j.node = node;
  j.invoke = invoke;
  j.destroy = destroy;
  j.fn = fn;
  j.error = nullptr;
  j.error_task = 0;
  j.next.store(0, std::memory_order_relaxed);
  j.done.store(0, std::memory_order_relaxed);
  j.finished.store(0, std::memory_order_relaxed);
  j.failed.store(false, std::memory_order_relaxed);
  active_.fetch_or(uint64_t{1} << slot);  // publishes the fields above
  epoch_.fetch_add(1);
  epoch_.notify_all();  // a no-op (no syscall) when no worker sleeps
}

bool ThreadPool::work_on(int slot, int thread, bool as_caller) {
  JobSlot& j = slots_[slot];
  const uint64_t bit = uint64_t{1} << slot;
  j.users.fetch_add(1);
  // Workers take only jobs for any node or their own; a helping caller takes its own job.
  const bool eligible =
      (active_.load() & bit) != 0 &&
      (as_caller || j.node < 0 || placements_[static_cast<size_t>(thread)].node == j.node);
  size_t completed = 0;  // counted locally: one shared atomic per task is enough (`next`)
  while (eligible) {
    const size_t task = j.next.fetch_add(1, std::memory_order_relaxed);
    if (task + 1 >= j.n_tasks) active_.fetch_and(~bit);  // nothing left to claim
    if (task >= j.n_tasks) break;
    if (!j.failed.load(std::memory_order_relaxed)) {
      try {
        j.invoke(j.fn, task, thread);
      } catch (...) {
        if (!j.failed.exchange(true)) {
          j.error = std::current_exception();
          j.error_task = task;
        }
      }
    }
    ++completed;
  }
  // We leave only once every task is claimed, so whoever brings `done` to n_tasks is last.
  if (completed > 0 &&
      j.done.fetch_add(completed, std::memory_order_acq_rel) + completed == j.n_tasks) {
    j.finished.store(1, std::memory_order_release);
    j.finished.notify_all();
  }
  j.users.fetch_sub(1);
  return completed > 0;
}

void ThreadPool::worker_main(int index) {
  for (;;) {
    // Read the epoch before scanning: a job posted after the scan changes it, so we never sleep
    // past a job we did not see.
    const uint32_t seen = epoch_.load();
    if (stop_.load()) return;
    bool worked = false;
    for (uint64_t mask = active_.load(); mask != 0; mask &= mask - 1) {
      worked |= work_on(__builtin_ctzll(mask), index, /*as_caller=*/false);
    }
    if (worked) continue;
    if (!spin_until([&] { return epoch_.load(std::memory_order_relaxed) != seen; })) {
      epoch_.wait(seen);
    }
  }
}

bool ThreadPool::job_done(int slot) const {
  return slots_[slot].finished.load(std::memory_order_acquire) != 0;
}

void ThreadPool::finish_job(int slot, bool caller_helps, bool rethrow) {
  JobSlot& j = slots_[slot];
  // Nobody else could run a job for a node without workers: the caller must.
  const bool orphan = j.node >= 0 ? workers_on_node(j.node) == 0 : size() == 0;
  if (orphan || (caller_helps && caller_may_help(j.node))) {
    work_on(slot, current_thread_index(), /*as_caller=*/true);
  }
  if (!spin_until([&] { return job_done(slot); })) {
    while (j.finished.load(std::memory_order_acquire) == 0) j.finished.wait(0);
  }
  // The last task is done; wait for threads still leaving work_on before the slot is reused.
  for (unsigned i = 0; j.users.load() != 0; ++i) {
    if (i < 1024) {
      _mm_pause();
    } else {
      std::this_thread::yield();
    }
  }
  std::exception_ptr error = std::move(j.error);
  const size_t error_task = j.error_task;
  j.error = nullptr;
  if (j.destroy != nullptr) j.destroy(j.fn);
  j.destroy = nullptr;
  j.fn = nullptr;
  release_slot(slot);
  if (!error) return;
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    if (rethrow) throw;
    log_error("a task of an abandoned thread-pool job failed: {}", e.what());
  } catch (const std::bad_alloc&) {
    if (rethrow)
      fail(ErrorKind::kResource, "task {} of a thread-pool job ran out of memory", error_task);
    log_error("task {} of an abandoned thread-pool job ran out of memory", error_task);
  } catch (const std::exception& e) {
    if (rethrow)
      fail(ErrorKind::kInternal, "task {} of a thread-pool job failed: {}", error_task, e.what());
    log_error("task {} of an abandoned thread-pool job failed: {}", error_task, e.what());
  } catch (...) {
    if (rethrow)
      fail(ErrorKind::kInternal, "task {} of a thread-pool job threw a non-standard exception",
           error_task);
    log_error("task {} of an abandoned thread-pool job threw a non-standard exception", error_task);
  }
}

TaskHandle& TaskHandle::operator=(TaskHandle&& other) noexcept {
  if (this != &other) {
    if (valid()) pool_->finish_job(slot_, caller_helps_, /*rethrow=*/false);
    pool_ = std::exchange(other.pool_, nullptr);
    slot_ = std::exchange(other.slot_, -1);
    caller_helps_ = other.caller_helps_;
  }
  return *this;
}

TaskHandle::~TaskHandle() {
  if (valid()) pool_->finish_job(slot_, caller_helps_, /*rethrow=*/false);
}

void TaskHandle::wait() {
  if (!valid()) return;
  ThreadPool* pool = std::exchange(pool_, nullptr);
  pool->finish_job(std::exchange(slot_, -1), caller_helps_, /*rethrow=*/true);
}

bool TaskHandle::done() const {
  return !valid() || pool_->job_done(slot_);
}

std::vector<WorkerPlacement> place_workers(const Topology& topology, int n_threads) {
  // Cores in node-interleaved order: node0 core0, node1 core0, node0 core1, ...
  std::vector<WorkerPlacement> cores;
  size_t most = 0;
  for (const NumaNodeInfo& node : topology.nodes) most = std::max(most, node.cores.size());
  for (size_t c = 0; c < most; ++c) {
    for (size_t n = 0; n < topology.nodes.size(); ++n) {
      if (c < topology.nodes[n].cores.size()) {
        cores.push_back(WorkerPlacement{static_cast<int>(n), topology.nodes[n].cores[c].cpus});
      }
    }
  }
  if (n_threads <= 0) n_threads = std::max<int>(1, static_cast<int>(cores.size()));
  if (cores.empty()) cores.push_back(WorkerPlacement{0, {}});
  std::vector<WorkerPlacement> out;
  out.reserve(static_cast<size_t>(n_threads));
  for (int i = 0; i < n_threads; ++i) out.push_back(cores[static_cast<size_t>(i) % cores.size()]);
  return out;
}

ThreadingContext::ThreadingContext(const ThreadingOptions& options)
    : ThreadingContext(detect_topology(), options) {}

ThreadingContext::ThreadingContext(Topology topology, const ThreadingOptions& options)
    : topology_(std::move(topology)) {
  if (options.n_threads < 0) {
    fail(ErrorKind::kInvalidArgument, "thread count {} is negative", options.n_threads);
  }
  ThreadPoolOptions pool_options;
  pool_options.pin = options.pin;
  pool_options.spin_us = options.spin_us;
  pool_options.node_count = topology_.numa_nodes();
  // The caller is one of the n threads: n - 1 workers take the first cores place_workers picks
  // and the caller (not pinned: it may be a server's thread) runs on what is left.
  const int cores = static_cast<int>(place_workers(topology_, 0).size());
  const int n = options.n_threads > 0 ? options.n_threads : cores;
  if (n > cores) log_info("{} threads on {} physical cores: some cores run two", n, cores);
  std::vector<WorkerPlacement> workers;
  if (n > 1) workers = place_workers(topology_, n - 1);
  pool_ = std::make_unique<ThreadPool>(std::move(workers), pool_options);
}

}  // namespace tandem
