#include <gtest/gtest.h>
#include <sched.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace tandem {
namespace {

// Runs a job and checks that every task id ran exactly once.
void expect_each_task_once(ThreadPool& pool, size_t n_tasks, const RunOptions& options = {}) {
  std::vector<std::atomic<int>> hits(n_tasks);
  pool.run(options, n_tasks, [&](size_t task) { hits[task].fetch_add(1); });
  for (size_t i = 0; i < n_tasks; ++i) {
    ASSERT_EQ(hits[i].load(), 1) << "task " << i << " of " << n_tasks << " on " << pool.size()
                                 << " workers";
  }
}

std::vector<int> affinity_of_this_thread() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

TEST(ThreadPool, EveryTaskRunsExactlyOnce) {
  for (int threads : {0, 1, 2, 3, 5}) {
    ThreadingContext ctx(synthetic_topology(1, 4), ThreadingOptions{threads, true, 20});
    for (size_t n : {0u, 1u, 2u, 3u, 7u, 64u, 1000u, 10007u}) expect_each_task_once(ctx.pool(), n);
  }
}

TEST(ThreadPool, WorkerlessPoolRunsOnTheCaller) {
  ThreadPool pool({});
  EXPECT_EQ(pool.size(), 0);
  std::vector<int> threads;
  pool.run(5, [&](size_t, int thread) { threads.push_back(thread); });
  EXPECT_EQ(threads, std::vector<int>(5, 0));  // the caller's index is size() == 0
  TaskHandle h = pool.submit(3, [&](size_t, int thread) { threads.push_back(thread); });
  h.wait();
  EXPECT_EQ(threads.size(), 8u);
}

TEST(ThreadPool, ThreadIndexIsTheWorkersOwnOrSizeForTheCaller) {
  ThreadingContext ctx(synthetic_topology(1, 3), ThreadingOptions{3, false, 20});
  ThreadPool& pool = ctx.pool();
  std::vector<std::atomic<int>> index_of_task(2000);
  std::vector<std::atomic<int>> consistent(pool.size() + 1);
  pool.run(2000, [&](size_t task, int thread) {
    index_of_task[task] = thread;
    // The index passed in is the one the pool reports for this thread.
    if (pool.current_thread_index() == thread) consistent[thread].store(1);
  });
  for (auto& t : index_of_task) {
    ASSERT_GE(t.load(), 0);
    ASSERT_LE(t.load(), pool.size());
  }
  std::set<int> seen;
  for (auto& t : index_of_task) seen.insert(t.load());
  for (int t : seen) EXPECT_EQ(consistent[t].load(), 1) << "thread index " << t;
  EXPECT_EQ(pool.current_thread_index(), pool.size());  // the test thread is not a worker
}

TEST(ThreadPool, SubmitRunsAsynchronouslyAndWaitJoins) {
  ThreadingContext ctx(synthetic_topology(1, 2), ThreadingOptions{2, true, 20});
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  // Workers block until released: submit must return before any task can finish.
  TaskHandle h = ctx.pool().submit(RunOptions{-1, false}, 2, [&](size_t) {
    while (!release.load()) std::this_thread::yield();
    ran.fetch_add(1);
  });
  EXPECT_TRUE(h.valid());
  EXPECT_FALSE(h.done());
  EXPECT_EQ(ran.load(), 0);
  release = true;
  h.wait();
  EXPECT_EQ(ran.load(), 2);
  EXPECT_FALSE(h.valid());
  EXPECT_TRUE(h.done());
}

TEST(ThreadPool, ManyOutstandingSubmitsWaitedInAnyOrder) {
  ThreadingContext ctx(synthetic_topology(1, 2), ThreadingOptions{2, true, 20});
  constexpr int kJobs = 20;
  std::vector<std::vector<std::atomic<int>>> hits(kJobs);
  std::vector<TaskHandle> handles;
  for (int j = 0; j < kJobs; ++j) {
    hits[j] = std::vector<std::atomic<int>>(50 + j);
    handles.push_back(ctx.pool().submit(hits[j].size(), [&hits, j](size_t t) { hits[j][t]++; }));
  }
  for (int j = kJobs - 1; j >= 0; --j) handles[j].wait();
  for (int j = 0; j < kJobs; ++j) {
    for (auto& h : hits[j]) ASSERT_EQ(h.load(), 1) << "job " << j;
  }
}

TEST(ThreadPool, DroppedHandleWaitsForItsTasks) {
  ThreadingContext ctx(synthetic_topology(1, 2), ThreadingOptions{2, true, 20});
  std::atomic<int> ran{0};
  {
    TaskHandle h = ctx.pool().submit(100, [&](size_t) { ran.fetch_add(1); });
  }
  EXPECT_EQ(ran.load(), 100);
}

TEST(ThreadPool, NestedRunsInsideTasks) {
  ThreadingContext ctx(synthetic_topology(1, 3), ThreadingOptions{3, true, 20});
  ThreadPool& pool = ctx.pool();
  constexpr size_t kOuter = 16, kInner = 33;
  std::vector<std::atomic<int>> hits(kOuter * kInner);
  pool.run(kOuter, [&](size_t outer) {
    pool.run(kInner, [&](size_t inner) { hits[outer * kInner + inner]++; });
  });
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  // A submit inside a task, waited inside the same task.
  std::atomic<int> inner_total{0};
  pool.run(8, [&](size_t) {
    TaskHandle h = pool.submit(10, [&](size_t) { inner_total++; });
    h.wait();
  });
  EXPECT_EQ(inner_total.load(), 80);
}

TEST(ThreadPool, ConcurrentCallersShareThePool) {
  ThreadingContext ctx(synthetic_topology(1, 2), ThreadingOptions{2, true, 20});
  constexpr int kCallers = 4, kRounds = 50;
  std::atomic<long> sum{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&] {
      for (int r = 0; r < kRounds; ++r) {
        if (r % 2 == 0) {
          ctx.pool().run(17, [&](size_t t) { sum += static_cast<long>(t); });
        } else {
          ctx.pool().submit(17, [&](size_t t) { sum += static_cast<long>(t); }).wait();
        }
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(sum.load(), kCallers * kRounds * (16 * 17 / 2));
}

TEST(ThreadPool, TaskExceptionsReachTheCallerAsError) {
  ThreadingContext ctx(synthetic_topology(1, 2), ThreadingOptions{2, true, 20});
  ThreadPool& pool = ctx.pool();
  try {
    pool.run(100, [](size_t t) {
      if (t == 37) throw Error(ErrorKind::kFormat, "tensor 'blk.3.ffn_up' is truncated");
    });
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_STREQ(e.what(), "tensor 'blk.3.ffn_up' is truncated");
  }
  try {
    pool.submit(10,
                [](size_t t) {
                  if (t == 4) throw std::runtime_error("bad thing");
                })
        .wait();
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    EXPECT_NE(std::string(e.what()).find("task 4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad thing"), std::string::npos) << e.what();
  }
  // Once a task failed the rest are skipped; with one task per job the order is fixed.
  std::atomic<int> after{0};
  EXPECT_THROW(pool.run(RunOptions{-1, false}, 1, [](size_t) { throw 42; }), Error);
  // The pool is still fine afterwards.
  pool.run(50, [&](size_t) { after++; });
  EXPECT_EQ(after.load(), 50);
}

TEST(ThreadPool, FailedJobSkipsTasksNotYetStarted) {
  ThreadPool pool({});  // caller only: tasks run in order 0, 1, 2, ...
  std::vector<int> ran;
  EXPECT_THROW(pool.run(10,
                        [&](size_t t) {
                          ran.push_back(static_cast<int>(t));
                          if (t == 3) throw std::runtime_error("stop");
                        }),
               Error);
  EXPECT_EQ(ran, (std::vector<int>{0, 1, 2, 3}));
}

TEST(ThreadPool, RunOnNodeUsesOnlyThatNodesWorkers) {
  // Two synthetic nodes of two cores; 5 threads = 4 workers and the caller: workers 0 and 2 are on
  // node 0, 1 and 3 on node 1.
  ThreadingContext ctx(synthetic_topology(2, 2), ThreadingOptions{5, false, 20});
  ThreadPool& pool = ctx.pool();
  ASSERT_EQ(pool.node_count(), 2);
  EXPECT_EQ(pool.workers_on_node(0), 2);
  EXPECT_EQ(pool.workers_on_node(1), 2);
  for (int node = 0; node < 2; ++node) {
    std::vector<std::atomic<int>> who(500);
    pool.run(RunOptions{node, false}, who.size(), [&](size_t t, int thread) { who[t] = thread; });
    for (auto& w : who) {
      ASSERT_LT(w.load(), pool.size());
      ASSERT_EQ(pool.placement(w.load()).node, node);
    }
    expect_each_task_once(pool, 777, RunOptions{node, true});
  }
  EXPECT_THROW(pool.run_on_node(2, 1, [](size_t) {}), Error);
  EXPECT_THROW(pool.run_on_node(-2, 1, [](size_t) {}), Error);
}

TEST(ThreadPool, JobForANodeWithoutWorkersRunsOnTheCaller) {
  ThreadingContext ctx(synthetic_topology(2, 2), ThreadingOptions{2, false, 20});  // one worker
  ASSERT_EQ(ctx.pool().workers_on_node(0), 1);
  ASSERT_EQ(ctx.pool().workers_on_node(1), 0);
  expect_each_task_once(ctx.pool(), 40, RunOptions{1, false});
}

TEST(ThreadPool, TooManyJobsInFlightIsAnError) {
  ThreadingContext ctx(synthetic_topology(1, 2), ThreadingOptions{2, true, 20});
  std::atomic<bool> release{false};
  std::vector<TaskHandle> handles;
  for (int i = 0; i < ThreadPool::kMaxJobs; ++i) {
    handles.push_back(ctx.pool().submit(1, [&](size_t) {
      while (!release.load()) std::this_thread::yield();
    }));
  }
  try {
    ctx.pool().submit(1, [](size_t) {});
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kResource);
  }
  release = true;
  for (auto& h : handles) h.wait();
  expect_each_task_once(ctx.pool(), 100);
}

TEST(ThreadPool, PlacementInterleavesNodesAndWraps) {
  Topology t = synthetic_topology(2, 3);
  std::vector<WorkerPlacement> p = place_workers(t, 4);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0].node, 0);
  EXPECT_EQ(p[1].node, 1);
  EXPECT_EQ(p[2].node, 0);
  EXPECT_EQ(p[3].node, 1);
  EXPECT_EQ(p[0].cpus, t.nodes[0].cores[0].cpus);
  EXPECT_EQ(p[2].cpus, t.nodes[0].cores[1].cpus);
  EXPECT_EQ(p[3].cpus, t.nodes[1].cores[1].cpus);
  EXPECT_EQ(place_workers(t, 0).size(), 6u);  // default: one per physical core
  std::vector<WorkerPlacement> wrapped = place_workers(t, 8);
  ASSERT_EQ(wrapped.size(), 8u);
  EXPECT_EQ(wrapped[6].cpus, wrapped[0].cpus);
  EXPECT_EQ(wrapped[7].node, 1);
}

TEST(ThreadPool, WorkersArePinnedWhereTheyReport) {
  ThreadingContext ctx;  // the real topology: one thread per physical core, the caller one of them
  ThreadPool& pool = ctx.pool();
  ASSERT_EQ(ctx.n_threads(), ctx.topology().physical_cores());
  ASSERT_EQ(pool.size(), ctx.n_threads() - 1);
  std::vector<std::vector<int>> seen(pool.size());
  std::vector<std::atomic<int>> recorded(pool.size());
  // Enough tasks that every worker takes some; each records its own affinity mask once.
  for (int round = 0; round < 100; ++round) {
    pool.run(RunOptions{-1, false}, 64 * pool.size(), [&](size_t, int thread) {
      if (recorded[thread].exchange(1) == 0) seen[thread] = affinity_of_this_thread();
      std::atomic<int> spin{0};
      while (spin.fetch_add(1, std::memory_order_relaxed) < 2000) {
      }
    });
    bool all = true;
    for (auto& r : recorded) all &= r.load() == 1;
    if (all) break;
  }
  std::set<std::vector<int>> distinct;
  for (int w = 0; w < pool.size(); ++w) {
    ASSERT_EQ(recorded[w].load(), 1) << "worker " << w << " never ran a task";
    // Pinning works on any machine where sched_setaffinity does; the report must match reality.
    EXPECT_TRUE(pool.pinned(w)) << "worker " << w;
    if (pool.pinned(w)) {
      EXPECT_EQ(seen[w], pool.placement(w).cpus) << "worker " << w;
    }
    distinct.insert(pool.placement(w).cpus);
  }
  EXPECT_EQ(static_cast<int>(distinct.size()), pool.size());  // one worker per physical core
}

TEST(ThreadingContext, TheCallerIsOneOfTheThreads) {
  // n threads = n - 1 pinned workers and the calling thread, which helps while it waits.
  for (auto [threads, workers] : {std::pair{0, 3}, {1, 0}, {2, 1}, {4, 3}, {6, 5}}) {
    ThreadingContext ctx(synthetic_topology(1, 4), ThreadingOptions{threads, true, 20});
    EXPECT_EQ(ctx.pool().size(), workers) << threads << " threads";
    EXPECT_EQ(ctx.n_threads(), workers + 1) << threads << " threads";
    // The workers take the cores in order; with fewer threads than cores the last stays free.
    const auto& cores = ctx.topology().nodes[0].cores;
    for (int w = 0; w < workers && w < 4; ++w) {
      EXPECT_EQ(ctx.pool().placement(w).cpus, cores[static_cast<size_t>(w)].cpus) << threads;
    }
    expect_each_task_once(ctx.pool(), 100);
  }
}

// A thread that cannot be created (no address space for its stack here; a thread limit
// elsewhere) is an Error naming the thread, not std::terminate (--threads 400 under a memory
// limit). Run in a child process, which lowers its own limit: exit code 0 when the pool threw the
// Error.
[[noreturn]] void start_200_threads_in_little_memory() {
  std::ifstream status("/proc/self/status");
  std::string key;
  uint64_t vm_kib = 0;
  while (status >> key) {
    if (key == "VmSize:") {
      status >> vm_kib;
      break;
    }
  }
  // Room for a few 8 MiB stacks, not for 200.
  const rlimit limit{(vm_kib << 10) + (uint64_t{64} << 20), RLIM_INFINITY};
  if (vm_kib == 0 || setrlimit(RLIMIT_AS, &limit) != 0) std::_Exit(3);
  try {
    ThreadPool pool(std::vector<WorkerPlacement>(200), ThreadPoolOptions{false, 20, 0});
    std::_Exit(2);  // every thread started: the limit did not bite
  } catch (const Error& e) {
    const bool named =
        std::string(e.what()).find("cannot start worker thread") != std::string::npos;
    std::_Exit(named && e.kind() == ErrorKind::kResource ? 0 : 4);
  }
}

TEST(ThreadPool, AFailedThreadCreationIsAnError) {
  EXPECT_EXIT(start_200_threads_in_little_memory(), ::testing::ExitedWithCode(0), "");
}

TEST(ThreadingContext, NegativeThreadCountIsRejected) {
  EXPECT_THROW(ThreadingContext(synthetic_topology(1, 1), ThreadingOptions{-1, true, 20}), Error);
}

}  // namespace
}  // namespace tandem
