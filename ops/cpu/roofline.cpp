#include "ops/cpu/roofline.h"

#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <tuple>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "ops/cpu/roofline_kernels.h"

namespace tandem::cpu {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kPage = 4096;

// Results of every kernel call land here, so no call is dead code.
std::atomic<uint64_t> g_sink{0};

// Fills the DRAM buffer with distinct values: pages of zeros can be deduplicated by a hypervisor
// (or be the kernel's shared zero page), and reading one physical page over and over measures a
// cache, not DRAM.
void fill_distinct(uint64_t* words, size_t n) {
  for (size_t i = 0; i < n; ++i) words[i] = (i + 1) * 0x9E3779B97F4A7C15ull;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// How n threads spread over the pool's nodes: round-robin over nodes that have room. The calling
// thread is a thread too (ThreadingOptions::n_threads counts it): node 0 has room for its workers
// and the caller, who takes node 0's last participant when node 0 gets more than its workers.
std::vector<int> threads_per_node(const ThreadPool& pool, int n) {
  std::vector<int> per(static_cast<size_t>(pool.node_count()), 0);
  for (int placed = 0; placed < n;) {
    bool any = false;
    for (int node = 0; node < pool.node_count() && placed < n; ++node) {
      if (per[node] < pool.workers_on_node(node) + (node == 0 ? 1 : 0)) {
        ++per[node];
        ++placed;
        any = true;
      }
    }
    TD_CHECK(any, "{} threads do not fit the pool's {} workers and the caller", n, pool.size());
  }
  return per;
}

int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

struct Timing {
  double wall_s = 0;  // from the barrier release until the last thread finished
  double cpu_s = 0;   // the most CPU time one thread spent in body (excludes preemption)
};

void atomic_max(std::atomic<int64_t>& a, int64_t v) {
  int64_t prev = a.load();
  while (prev < v && !a.compare_exchange_weak(prev, v)) {
  }
}

// Runs body(node, index within node, participant index) on sum(per_node) threads at once (the
// workers, each on its own node, and the caller), all released together by a spin barrier.
template <typename Body>
Timing timed_parallel(ThreadPool& pool, const std::vector<int>& per_node, const Body& body) {
  int total = 0;
  for (int t : per_node) total += t;
  std::atomic<int> arrived{0};
  std::atomic<bool> go{false};
  std::atomic<int64_t> start{0}, end{0}, cpu{0};
  auto task = [&](int node, int index, int participant) {
    // Each task blocks here until all have started, so no worker runs two of them.
    if (arrived.fetch_add(1) + 1 == total) {
      start.store(now_ns());
      go.store(true);
    } else {
      while (!go.load(std::memory_order_acquire)) _mm_pause();
    }
    const int64_t cpu0 = thread_cpu_ns();
    body(node, index, participant);
    atomic_max(cpu, thread_cpu_ns() - cpu0);
    atomic_max(end, now_ns());
  };
  // The caller's participant (node 0's last, see threads_per_node) runs here, after the workers'
  // jobs are out; the workers' jobs do not let the caller help (it must run one task only).
  const int caller = !per_node.empty() && per_node[0] > pool.workers_on_node(0) ? 1 : 0;
  std::vector<TaskHandle> handles;
  handles.reserve(per_node.size());
  int first = 0;
  for (size_t k = 0; k < per_node.size(); first += per_node[k], ++k) {
    const int workers = per_node[k] - (k == 0 ? caller : 0);
    if (workers == 0) continue;
    const int node = static_cast<int>(k), base = first;
    try {
      handles.push_back(pool.submit(RunOptions{node, false}, static_cast<size_t>(workers),
                                    [&task, node, base](size_t i) {
                                      task(node, static_cast<int>(i), base + static_cast<int>(i));
                                    }));
    } catch (...) {
      go.store(true);  // release the tasks already started, or their handles never return
      throw;
    }
  }
  if (caller == 1) task(0, per_node[0] - 1, per_node[0] - 1);
  for (TaskHandle& h : handles) h.wait();
  return Timing{static_cast<double>(end.load() - start.load()) * 1e-9,
                static_cast<double>(cpu.load()) * 1e-9};
}

// Grows `count` until one run(count) keeps a thread busy for `seconds` of CPU time (CPU time,
// not wall time: on a busy machine a preempted thread must not stop the growth early), then
// returns the best amount(count) / wall seconds of `repetitions` runs.
template <typename Run, typename Amount>
double best_rate(double seconds, int repetitions, const Run& run, const Amount& amount) {
  uint64_t count = 1;
  Timing t = run(count);
  while (t.cpu_s < seconds * 0.5) {
    const double grow = t.cpu_s > 0 ? seconds / t.cpu_s : 1000.0;
    count = static_cast<uint64_t>(
        std::ceil(static_cast<double>(count) * std::clamp(grow, 2.0, 1000.0)));
    t = run(count);
  }
  double best = 0;
  for (int r = 0; r < repetitions; ++r) best = std::max(best, amount(count) / run(count).wall_s);
  return best;
}

struct Chunk {
  const char* data = nullptr;
  size_t bytes = 0;
};

// GB/s of `kernel` reading each participant's chunk `passes` times.
double measure_read(ThreadPool& pool, const std::vector<int>& per_node, ReadFn kernel,
                    const std::vector<Chunk>& chunks, const RooflineOptions& opt) {
  size_t bytes_per_pass = 0;
  for (const Chunk& c : chunks) bytes_per_pass += c.bytes;
  auto run = [&](uint64_t passes) {
    return timed_parallel(pool, per_node, [&](int, int, int p) {
      uint64_t sum = 0;
      for (uint64_t i = 0; i < passes; ++i) sum += kernel(chunks[p].data, chunks[p].bytes);
      g_sink.fetch_add(sum, std::memory_order_relaxed);
    });
  };
  auto amount = [&](uint64_t passes) {
    return static_cast<double>(bytes_per_pass * passes) * 1e-9;
  };
  return best_rate(opt.seconds, opt.repetitions, run, amount);
}

double measure_compute(ThreadPool& pool, const std::vector<int>& per_node, const ComputeKernel& k,
                       const RooflineOptions& opt) {
  int threads = 0;
  for (int t : per_node) threads += t;
  auto run = [&](uint64_t iterations) {
    return timed_parallel(pool, per_node, [&](int, int, int) {
      const double r = k.fn(iterations);
      uint64_t bits;
      std::memcpy(&bits, &r, sizeof(bits));
      g_sink.fetch_add(bits, std::memory_order_relaxed);
    });
  };
  auto amount = [&](uint64_t iterations) {
    return k.ops_per_iteration * static_cast<double>(iterations) * threads * 1e-9;
  };
  return best_rate(opt.seconds, opt.repetitions, run, amount);
}

size_t round_down(size_t x, size_t to) {
  return x / to * to;
}

void validate(const ThreadPool& pool, const RooflineOptions& opt) {
  if (opt.threads < 0 || opt.threads > pool.size() + 1) {
    fail(ErrorKind::kInvalidArgument,
         "roofline: --threads {} is not in 1..{} (the pool's workers and the caller)", opt.threads,
         pool.size() + 1);
  }
  if (!(opt.seconds > 0) || !std::isfinite(opt.seconds) || opt.seconds > 60) {
    fail(ErrorKind::kInvalidArgument, "roofline: --seconds {} is not in (0, 60]", opt.seconds);
  }
  if (opt.repetitions < 1 || opt.repetitions > 100) {
    fail(ErrorKind::kInvalidArgument, "roofline: {} repetitions is not in 1..100", opt.repetitions);
  }
  if (opt.dram_bytes < size_t{1} << 20) {
    fail(ErrorKind::kInvalidArgument, "roofline: DRAM buffer of {} bytes is below 1 MiB",
         opt.dram_bytes);
  }
}

}  // namespace

std::vector<int> sweep_thread_counts(int n) {
  std::vector<int> counts;
  for (int t = 1; t < n; t *= 2) counts.push_back(t);
  if (n > 0) counts.push_back(n);
  return counts;
}

DramReadProbe::DramReadProbe(ThreadingContext& ctx, const RooflineOptions& opt)
    : pool_(&ctx.pool()), opt_(opt), kernels_(read_kernels()) {
  validate(*pool_, opt_);
  const Topology& topo = ctx.topology();
  threads_ = opt_.threads > 0 ? opt_.threads : pool_->size() + 1;
  per_node_ = threads_per_node(*pool_, threads_);
  for (int t : per_node_) numa_nodes_ += t > 0 ? 1 : 0;
  // One buffer per node that has threads, bound to it, huge pages, prefaulted.
  buffers_.resize(per_node_.size());
  per_node_bytes_ =
      std::max(kHugePageBytes,
               round_down(opt_.dram_bytes / static_cast<size_t>(numa_nodes_), kHugePageBytes));
  huge_pages_ = opt_.huge_pages;
  for (size_t k = 0; k < per_node_.size(); ++k) {
    if (per_node_[k] == 0) continue;
    AllocOptions a;
    a.huge_pages = opt_.huge_pages;
    a.prefault = true;
    a.numa_node = topo.numa_nodes() > 1 && k < topo.nodes.size() ? topo.nodes[k].os_index : -1;
    buffers_[k] = AlignedBuffer(per_node_bytes_, a);
    fill_distinct(buffers_[k].as<uint64_t>(), per_node_bytes_ / sizeof(uint64_t));
    buffer_bytes_ += per_node_bytes_;
    huge_pages_ = huge_pages_ && buffers_[k].huge_pages();
    huge_page_backed_bytes_ += buffers_[k].huge_page_bytes();
  }
  if (kernels_.size() > 1) kernels_.pop_back();  // the scalar one is never the fastest
  best_ = 0;
}

// Each participant reads its share of its node's buffer.
static std::vector<Chunk> dram_chunks(const std::vector<AlignedBuffer>& buffers,
                                      size_t per_node_bytes, const std::vector<int>& per_node) {
  std::vector<Chunk> chunks;
  for (size_t k = 0; k < per_node.size(); ++k) {
    const size_t share = round_down(per_node_bytes / std::max(1, per_node[k]), kPage);
    for (int i = 0; i < per_node[k]; ++i) {
      chunks.push_back({buffers[k].as<char>() + static_cast<size_t>(i) * share, share});
    }
  }
  return chunks;
}

double DramReadProbe::measure(std::vector<RooflinePoint>* variants) {
  const std::vector<Chunk> chunks = dram_chunks(buffers_, per_node_bytes_, per_node_);
  double best_gbs = 0;
  for (size_t i = 0; i < kernels_.size(); ++i) {
    const double gbs = measure_read(*pool_, per_node_, kernels_[i].fn, chunks, opt_);
    log_debug("roofline: DRAM read {} threads {}: {:.1f} GB/s", threads_, kernels_[i].name, gbs);
    if (variants != nullptr) variants->push_back({threads_, gbs, kernels_[i].name});
    if (gbs > best_gbs) {
      best_gbs = gbs;
      best_ = i;
    }
  }
  return best_gbs;
}

double DramReadProbe::measure_at(int threads) {
  const std::vector<int> per_node = threads_per_node(*pool_, threads);
  return measure_read(*pool_, per_node, kernels_[best_].fn,
                      dram_chunks(buffers_, per_node_bytes_, per_node), opt_);
}

double DramReadProbe::measure_once(double seconds) {
  RooflineOptions o = opt_;
  o.seconds = seconds;
  o.repetitions = 1;
  return measure_read(*pool_, per_node_, kernels_[best_].fn,
                      dram_chunks(buffers_, per_node_bytes_, per_node_), o);
}

RooflineResult measure_roofline(ThreadingContext& ctx, const RooflineOptions& opt) {
  ThreadPool& pool = ctx.pool();
  const Topology& topo = ctx.topology();
  validate(pool, opt);
  RooflineResult r;
  r.threads = opt.threads > 0 ? opt.threads : pool.size() + 1;
  r.isa = isa_name(best_isa());
  const std::vector<int> counts =
      opt.thread_sweep ? sweep_thread_counts(r.threads) : std::vector<int>{r.threads};
  const std::vector<ReadKernel> kernels = read_kernels();
  const ReadKernel* best = &kernels.front();
  {
    DramReadProbe probe(ctx, opt);
    r.numa_nodes = probe.numa_nodes();
    r.dram_buffer_bytes = probe.buffer_bytes();
    r.huge_pages = probe.huge_pages();
    r.huge_page_backed_bytes = probe.huge_page_backed_bytes();
    r.dram_read_gbs = probe.measure(&r.dram_variants);
    r.dram_kernel = probe.best_kernel();
    for (const RooflinePoint& v : r.dram_variants) {
      log_info("roofline: DRAM read {} threads {}: {:.1f} GB/s", v.threads, v.kernel, v.value);
    }
    for (const ReadKernel& k : kernels) {
      if (r.dram_kernel == k.name) best = &k;
    }
    for (int t : counts) {
      r.dram_sweep.push_back(
          {t, t == r.threads ? r.dram_read_gbs : probe.measure_at(t), r.dram_kernel});
    }
  }

  if (opt.cache_levels) {
    // Per-thread buffers that fit half of a private L2, and a share of the L3 that is still
    // well beyond L2 (so it is not the L2 number again).
    const size_t l2 = topo.l2_bytes > 0 ? topo.l2_bytes : size_t{256} << 10;
    r.l2_bytes_per_thread = std::max(kPage, round_down(l2 / 2, kPage));
    const size_t l3_total = topo.l3_bytes * static_cast<size_t>(std::max(1, topo.l3_instances));
    if (topo.l3_bytes > 0) {
      r.l3_bytes_per_thread =
          std::max(round_down(l3_total / 2 / static_cast<size_t>(r.threads), kPage), 2 * l2);
    }
    // Cache bandwidth is load-port bound: the widest plain loads, and the DRAM winner if other.
    std::vector<const ReadKernel*> cache_kernels = {&kernels.front()};
    if (best != &kernels.front()) cache_kernels.push_back(best);
    for (auto [bytes, gbs, kernel] :
         {std::tuple{r.l2_bytes_per_thread, &r.l2_read_gbs, &r.l2_kernel},
          std::tuple{r.l3_bytes_per_thread, &r.l3_read_gbs, &r.l3_kernel}}) {
      if (bytes == 0) continue;
      std::vector<AlignedBuffer> buffers;
      std::vector<Chunk> chunks;
      for (int i = 0; i < r.threads; ++i) {
        buffers.emplace_back(bytes, AllocOptions{kCacheLineBytes, false, -1, false, true});
        chunks.push_back({buffers.back().as<char>(), bytes});
      }
      const std::vector<int> per_node = threads_per_node(pool, r.threads);
      for (const ReadKernel* k : cache_kernels) {
        const double value = measure_read(pool, per_node, k->fn, chunks, opt);
        if (value > *gbs) {
          *gbs = value;
          *kernel = k->name;
        }
      }
    }
    log_info("roofline: L2 {:.1f} GB/s, L3 {:.1f} GB/s", r.l2_read_gbs, r.l3_read_gbs);
  }

  if (opt.compute) {
    struct Target {
      ComputeKind kind;
      double* peak;
      std::string* kernel;
      std::vector<RooflinePoint>* sweep;
    };
    for (const Target& target :
         {Target{ComputeKind::kFp32Fma, &r.fp32_gflops, &r.fp32_kernel, &r.fp32_sweep},
          Target{ComputeKind::kBf16Dot, &r.bf16_gflops, &r.bf16_kernel, &r.bf16_sweep},
          Target{ComputeKind::kInt8Dot, &r.int8_gops, &r.int8_kernel, &r.int8_sweep},
          Target{ComputeKind::kAmxInt8, &r.amx_int8_gops, &r.amx_int8_kernel, &r.amx_int8_sweep},
          Target{ComputeKind::kAmxBf16, &r.amx_bf16_gflops, &r.amx_bf16_kernel,
                 &r.amx_bf16_sweep}}) {
      const ComputeKernel* k = best_compute_kernel(target.kind);
      if (k == nullptr) continue;
      *target.kernel = k->name;
      for (int t : counts) {
        const double value = measure_compute(pool, threads_per_node(pool, t), *k, opt);
        target.sweep->push_back({t, value, k->name});
        if (t == r.threads) *target.peak = value;
      }
      log_info("roofline: {} {}: {:.1f} G/s", compute_kind_name(target.kind), k->name,
               *target.peak);
    }
  }
  return r;
}

namespace {

nlohmann::json points_json(const std::vector<RooflinePoint>& points) {
  nlohmann::json a = nlohmann::json::array();
  for (const RooflinePoint& p : points) {
    a.push_back({{"threads", p.threads}, {"value", p.value}, {"kernel", p.kernel}});
  }
  return a;
}

template <typename T>
T get(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) fail(ErrorKind::kFormat, "roofline JSON: key '{}' is missing", key);
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kFormat, "roofline JSON: key '{}' has the wrong type: {}", key, e.what());
  }
}

std::vector<RooflinePoint> points_from_json(const nlohmann::json& j, const char* key) {
  std::vector<RooflinePoint> points;
  if (!j.contains(key)) return points;
  if (!j.at(key).is_array()) fail(ErrorKind::kFormat, "roofline JSON: '{}' is not an array", key);
  for (const nlohmann::json& p : j.at(key)) {
    if (!p.is_object()) fail(ErrorKind::kFormat, "roofline JSON: '{}' holds a non-object", key);
    points.push_back(
        {get<int>(p, "threads"), get<double>(p, "value"), get<std::string>(p, "kernel")});
  }
  return points;
}

}  // namespace

std::string roofline_to_json(const RooflineResult& r, int indent) {
  nlohmann::json j = {
      {"threads", r.threads},
      {"numa_nodes", r.numa_nodes},
      {"isa", r.isa},
      {"dram_read_gbs", r.dram_read_gbs},
      {"dram_kernel", r.dram_kernel},
      {"l3_read_gbs", r.l3_read_gbs},
      {"l3_kernel", r.l3_kernel},
      {"l2_read_gbs", r.l2_read_gbs},
      {"l2_kernel", r.l2_kernel},
      {"fp32_gflops", r.fp32_gflops},
      {"fp32_kernel", r.fp32_kernel},
      {"bf16_gflops", r.bf16_gflops},
      {"bf16_kernel", r.bf16_kernel},
      {"int8_gops", r.int8_gops},
      {"int8_kernel", r.int8_kernel},
      {"amx_int8_gops", r.amx_int8_gops},
      {"amx_int8_kernel", r.amx_int8_kernel},
      {"amx_bf16_gflops", r.amx_bf16_gflops},
      {"amx_bf16_kernel", r.amx_bf16_kernel},
      {"dram_buffer_bytes", r.dram_buffer_bytes},
      {"l3_bytes_per_thread", r.l3_bytes_per_thread},
      {"l2_bytes_per_thread", r.l2_bytes_per_thread},
      {"huge_pages", r.huge_pages},
      {"huge_page_backed_bytes", r.huge_page_backed_bytes},
      {"dram_variants", points_json(r.dram_variants)},
      {"dram_sweep", points_json(r.dram_sweep)},
      {"fp32_sweep", points_json(r.fp32_sweep)},
      {"bf16_sweep", points_json(r.bf16_sweep)},
      {"int8_sweep", points_json(r.int8_sweep)},
      {"amx_int8_sweep", points_json(r.amx_int8_sweep)},
      {"amx_bf16_sweep", points_json(r.amx_bf16_sweep)},
  };
  return j.dump(indent);
}

RooflineResult roofline_from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kFormat, "roofline JSON does not parse: {}", e.what());
  }
  if (!j.is_object()) fail(ErrorKind::kFormat, "roofline JSON is not an object");
  RooflineResult r;
  r.threads = get<int>(j, "threads");
  r.numa_nodes = get<int>(j, "numa_nodes");
  r.isa = get<std::string>(j, "isa");
  r.dram_read_gbs = get<double>(j, "dram_read_gbs");
  r.dram_kernel = get<std::string>(j, "dram_kernel");
  r.l3_read_gbs = get<double>(j, "l3_read_gbs");
  r.l2_read_gbs = get<double>(j, "l2_read_gbs");
  r.l3_kernel = get<std::string>(j, "l3_kernel");
  r.l2_kernel = get<std::string>(j, "l2_kernel");
  r.fp32_gflops = get<double>(j, "fp32_gflops");
  r.fp32_kernel = get<std::string>(j, "fp32_kernel");
  r.bf16_gflops = get<double>(j, "bf16_gflops");
  r.bf16_kernel = get<std::string>(j, "bf16_kernel");
  r.int8_gops = get<double>(j, "int8_gops");
  r.int8_kernel = get<std::string>(j, "int8_kernel");
  // The AMX peaks came later: files written before them read as "no AMX".
  if (j.contains("amx_int8_gops")) {
    r.amx_int8_gops = get<double>(j, "amx_int8_gops");
    r.amx_int8_kernel = get<std::string>(j, "amx_int8_kernel");
    r.amx_bf16_gflops = get<double>(j, "amx_bf16_gflops");
    r.amx_bf16_kernel = get<std::string>(j, "amx_bf16_kernel");
  }
  r.dram_buffer_bytes = get<size_t>(j, "dram_buffer_bytes");
  r.l3_bytes_per_thread = get<size_t>(j, "l3_bytes_per_thread");
  r.l2_bytes_per_thread = get<size_t>(j, "l2_bytes_per_thread");
  r.huge_pages = get<bool>(j, "huge_pages");
  r.huge_page_backed_bytes = get<size_t>(j, "huge_page_backed_bytes");
  r.dram_variants = points_from_json(j, "dram_variants");
  r.dram_sweep = points_from_json(j, "dram_sweep");
  r.fp32_sweep = points_from_json(j, "fp32_sweep");
  r.bf16_sweep = points_from_json(j, "bf16_sweep");
  r.int8_sweep = points_from_json(j, "int8_sweep");
  r.amx_int8_sweep = points_from_json(j, "amx_int8_sweep");
  r.amx_bf16_sweep = points_from_json(j, "amx_bf16_sweep");
  return r;
}

}  // namespace tandem::cpu
