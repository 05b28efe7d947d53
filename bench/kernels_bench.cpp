// The fast CPU kernels (ops/cpu/kernels.h) per format and ISA level:
//  - GEMV: 1 token against 96 MiB of weights, or 3x the L3 where that is more (dram_sized_bytes:
//    DRAM-bound also under a server's L3 of hundreds of MiB), all pool threads; bytes_per_second =
//    weight bytes read, to compare with `tandem roofline`'s DRAM figure.
//    TANDEM_BENCH_GEMV_KIB=8192 makes the weights cache-resident (the kernel's own speed),
//    TANDEM_BENCH_HUGE=1 puts them in transparent huge pages. BM_GemvQ4KX16: the Q4_K x16 tile
//    GEMV on the same weights (TANDEM_BENCH_TASK_KIB=N: tasks of N KiB instead of 256).
//    BM_GemvReadOnly: the same bytes read in the same tasks without arithmetic. From DRAM each
//    also reports GBps (1e9 bytes/s) and of_dram: the median ratio to a DRAM probe run in
//    rounds alternating with it (bench/dram_probe.h), i.e. the fraction of DRAM in the same
//    minute. BM_MatmulChain: kern::matmul over a chain of small matrices (per-call costs);
//    BM_DenseDecodeX16: a V2-Lite layer's q + kv_a and wo in x16 tiles, as decode runs them;
//    BM_LmHeadQ6K(X16): V2-Lite's Q6_K lm_head as stored (in Q6_K x16 tiles).
//  - GEMM: 512 tokens against a 2048 x 2048 matrix (L2/L3-resident): items_per_second = multiply-
//    adds x 2 (OP/s), to compare with the int8 / bf16 / fp32 peaks.
// Run: build/bench/bench_kernels_bench [--benchmark_filter=Gemv] [--benchmark_format=json]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <random>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "core/cpu_features.h"
#include "core/fp_convert.h"
#include "core/memory.h"
#include "core/thread_pool.h"
#include "core/topology.h"
#include "formats/quant.h"
#include "ops/cpu/kern_gguf.h"
#include "ops/cpu/kernels.h"
#include "core/error.h"
#include "ops/cpu/q0_x4.h"
#include "ops/cpu/q4k_x16.h"
#include "ops/cpu/q6k_x16.h"
#include "ops/cpu/ref_ops.h"
#include "ops/cpu/roofline_kernels.h"
#include "bench/dram_probe.h"

namespace tandem {
namespace {

// The GEMV benchmarks' weights: 96 MiB, or 3x the L3 where that is more.
int64_t gemv_bytes() {
  return static_cast<int64_t>(dram_sized_bytes(uint64_t{96} << 20));
}

struct Weights {
  AlignedBuffer bytes;
  kern::KMatrix m;
};

// rows x cols in `dtype`, the first row block random and repeated (quantizing 100 MB would take
// longer than the benchmark; the kernels' speed does not depend on the values).
Weights make_weights(DType dtype, int64_t rows, int64_t cols) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const int64_t rb = static_cast<int64_t>(dtype_bytes(dtype, cols));
  constexpr int64_t kDistinct = 64;
  std::vector<float> f(static_cast<size_t>(cols));
  Weights w;
  // TANDEM_BENCH_HUGE=1: the weights in transparent huge pages (2 MiB: fewer TLB misses).
  const char* huge = std::getenv("TANDEM_BENCH_HUGE");
  AllocOptions opt;
  opt.huge_pages = huge != nullptr && std::atoi(huge) != 0;
  w.bytes = AlignedBuffer(static_cast<size_t>(rb * rows), opt);
  uint8_t* bytes = w.bytes.as<uint8_t>();
  for (int64_t r = 0; r < std::min(rows, kDistinct); ++r) {
    for (float& v : f) v = normal(rng);
    quantize_row(dtype, f.data(), bytes + r * rb, cols);
  }
  for (int64_t r = kDistinct; r < rows; ++r) {
    std::copy_n(bytes + (r % kDistinct) * rb, rb, bytes + r * rb);
  }
  Tensor t;
  t.dtype = dtype;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.data = bytes;
  kern::view_weight(ops::Weight(t), &w.m);
  return w;
}

ThreadPool& pool() {
  return bench_pool();
}

// One token of absorbed-MLA decode over a latent cache of ctx rows of dk floats (one KV head: the
// keys are whole rows, the values their first dv floats), the query rows [heads, dk].
ops::AttentionArgs mla_decode_args(const float* q, int64_t heads, int64_t dk, int64_t dv,
                                   const float* cache, int64_t ctx, float scale, float* out) {
  ops::AttentionArgs a;
  a.q = q;
  a.q_stride = heads * dk;
  a.n_tokens = 1;
  a.n_heads = heads;
  a.n_kv_heads = 1;
  a.dk = dk;
  a.dv = dv;
  a.k = a.v = cache;
  a.k_stride = a.v_stride = dk;
  a.pos0 = ctx - 1;
  a.scale = scale;
  a.out = out;
  return a;
}

// Decode GEMVs: bytes_per_second, threads and report_gemv's GBps / of_dram (bench/dram_probe.h).
template <class Step>
void gemv_counters(benchmark::State& state, int64_t bytes_per_call, Step&& step) {
  state.SetBytesProcessed(state.iterations() * bytes_per_call);
  state.counters["threads"] = pool().size() + 1;
  report_gemv(state, &pool(), bytes_per_call, step);
}

void run(benchmark::State& state, DType dtype, int64_t rows, int64_t cols, int64_t tokens,
         Isa isa) {
  if (isa > best_isa()) {
    state.SkipWithError("ISA not supported here");
    return;
  }
  const Weights w = make_weights(dtype, rows, cols);
  std::vector<float> x(static_cast<size_t>(tokens * cols));
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  std::vector<float> y(static_cast<size_t>(tokens * rows));
  kern::Activations a;
  kern::quantize_activations(kern::act_format(w.m.format), 0, x.data(), tokens, cols, cols, &a);
  // Tasks of 64 rows for a GEMM, ~256 KiB of weights for a GEMV (each task one long stream: 64-row
  // GEMV tasks read 20-30% slower). kern::matmul runs a GEMV this large in RangeShares instead
  // (BM_LmHeadQ6K shares_vs_tasks); tasks_4m_vs_256k below measures what task length costs.
  auto rows_of = [&](int64_t task_bytes) {
    return std::max<int64_t>(16, task_bytes / w.m.row_bytes / 16 * 16);
  };
  auto call_with = [&](int64_t per_task) {
    const size_t n_tasks = static_cast<size_t>((rows + per_task - 1) / per_task);
    pool().run(n_tasks, [&](size_t i) {
      const int64_t r0 = static_cast<int64_t>(i) * per_task;
      kern::gemm(w.m, a, r0, std::min(rows, r0 + per_task), y.data(), rows, isa);
    });
    benchmark::DoNotOptimize(y.data());
  };
  const int64_t per_task = tokens > 4 ? 64 : rows_of(256 << 10);
  auto call = [&] { call_with(per_task); };
  for (auto _ : state) call();
  state.SetItemsProcessed(state.iterations() * 2 * rows * cols * tokens);
  if (tokens == 1) {
    gemv_counters(state, static_cast<int64_t>(w.m.bytes()), call);
    // tasks_4m_vs_256k: ~4 MiB tasks (the fused MoE's longest decode streams) against these
    // ~256 KiB ones, A/B in the same minute (ab_rounds).
    if (std::getenv("TANDEM_BENCH_GEMV_KIB") == nullptr) {
      state.counters["tasks_4m_vs_256k"] =
          ab_rounds(call, [&] { call_with(rows_of(int64_t{4} << 20)); });
    }
  } else {
    state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(w.m.bytes()));
    state.counters["threads"] = pool().size() + 1;
  }
}

void BM_Gemv(benchmark::State& state, DType dtype, Isa isa) {
  // TANDEM_BENCH_GEMV_KIB=N: N KiB of weights instead of gemv_bytes() (e.g. 512: cache-resident,
  // so the kernel's own speed, without DRAM).
  const char* kib = std::getenv("TANDEM_BENCH_GEMV_KIB");
  const int64_t bytes = kib != nullptr ? std::atoll(kib) << 10 : gemv_bytes();
  const int64_t cols = 2048;
  const int64_t rows = bytes / static_cast<int64_t>(dtype_bytes(dtype, cols));
  // TANDEM_BENCH_TOKENS=N: N tokens (2-15: the few-token paths between GEMV and tiles).
  const char* tokens = std::getenv("TANDEM_BENCH_TOKENS");
  run(state, dtype, rows, cols, tokens != nullptr ? std::max(1, std::atoi(tokens)) : 1, isa);
}

// The Q4_K x16 tile GEMV (ops/cpu/q4k_x16.h) on BM_Gemv/q4_k's weights repacked: the same bytes,
// the same task size, bytes_per_second comparable with BM_Gemv/q4_k_*.
void BM_GemvQ4KX16(benchmark::State& state, Isa isa) {
  if (isa > best_isa()) {
    state.SkipWithError("ISA not supported here");
    return;
  }
  const char* kib = std::getenv("TANDEM_BENCH_GEMV_KIB");
  const int64_t bytes = kib != nullptr ? std::atoll(kib) << 10 : gemv_bytes();
  const int64_t cols = 2048;
  const int64_t tile_bytes = kern::q4k_x16_tile_bytes(cols);
  const int64_t tiles = std::max<int64_t>(1, bytes / tile_bytes), rows = 16 * tiles;
  const Weights w = make_weights(DType::kQ4_K, rows, cols);
  const char* huge = std::getenv("TANDEM_BENCH_HUGE");
  AllocOptions opt;
  opt.huge_pages = huge != nullptr && std::atoi(huge) != 0;
  AlignedBuffer packed(static_cast<size_t>(tiles * tile_bytes), opt);
  kern::q4k_x16_repack(w.m.data, w.m.row_bytes, rows, cols, packed.as<uint8_t>());
  std::vector<float> x(static_cast<size_t>(cols)), y(static_cast<size_t>(rows));
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  kern::Activations a;
  kern::quantize_activations(kern::AFormat::kQ8_K, 0, x.data(), 1, cols, cols, &a);
  const auto* act = reinterpret_cast<const BlockQ8_K*>(a.row(0));
  // Tasks of ~256 KiB as BM_Gemv's (TANDEM_BENCH_TASK_KIB=N: N KiB).
  const char* task_kib = std::getenv("TANDEM_BENCH_TASK_KIB");
  const int64_t per_task = std::max<int64_t>(
      1, (task_kib != nullptr ? std::atoll(task_kib) << 10 : 256 << 10) / tile_bytes);
  const size_t n_tasks = static_cast<size_t>((tiles + per_task - 1) / per_task);
  auto call = [&] {
    pool().run(n_tasks, [&](size_t i) {
      const int64_t t0 = static_cast<int64_t>(i) * per_task;
      const int64_t n = std::min(tiles, t0 + per_task) - t0;
      kern::q4k_x16_gemv(packed.as<uint8_t>() + t0 * tile_bytes, n, cols, act, y.data() + 16 * t0,
                         isa);
    });
    benchmark::DoNotOptimize(y.data());
  };
  for (auto _ : state) call();
  gemv_counters(state, tiles * tile_bytes, call);
  // vs_rows: against the row kernel on the stored rows (BM_Gemv/q4_k's tasks), A/B in the same
  // minute (ab_rounds).
  const int64_t row_task = std::max<int64_t>(16, (256 << 10) / w.m.row_bytes / 16 * 16);
  const size_t row_tasks = static_cast<size_t>((rows + row_task - 1) / row_task);
  auto rows_call = [&] {
    pool().run(row_tasks, [&](size_t i) {
      const int64_t r0 = static_cast<int64_t>(i) * row_task;
      kern::gemm(w.m, a, r0, std::min(rows, r0 + row_task), y.data(), rows, isa);
    });
    benchmark::DoNotOptimize(y.data());
  };
  state.counters["vs_rows"] = ab_rounds(rows_call, call);
}
BENCHMARK_CAPTURE(BM_GemvQ4KX16, avx512_vnni, Isa::kAvx512Vnni)->UseRealTime()->MinTime(0.3);

// Q5_0 / Q8_0 rows in the x4 layout (ops/cpu/q0_x4.h, what `--cpu-experts repack` holds them in
// on VBMI CPUs) on BM_Gemv's weights: the same bytes and tasks, bytes_per_second comparable with
// BM_Gemv/q5_0_* / q8_0_*; vs_rows: against the stored rows, A/B in the same minute (ab_rounds).
// TANDEM_BENCH_GEMV_KIB / _HUGE / _TOKENS as BM_Gemv.
void BM_GemvQ0X4(benchmark::State& state, DType dtype) {
  if (!kern::q0_x4_native()) {
    state.SkipWithError("no AVX-512 VBMI / BITALG here");
    return;
  }
  const char* kib = std::getenv("TANDEM_BENCH_GEMV_KIB");
  const int64_t bytes = kib != nullptr ? std::atoll(kib) << 10 : gemv_bytes();
  // TANDEM_BENCH_COLS=N: rows of N columns (a multiple of 32) instead of 2048, e.g. 1408:
  // DeepSeek-V2-Lite's expert downs, 44 blocks (two groups of 16 and three quads).
  const char* cols_env = std::getenv("TANDEM_BENCH_COLS");
  const int64_t cols = cols_env != nullptr ? std::atoll(cols_env) : 2048, nb = cols / kQK;
  TD_CHECK(cols > 0 && cols % kQK == 0, "TANDEM_BENCH_COLS={}: a positive multiple of 32", cols);
  const int64_t rows = bytes / static_cast<int64_t>(dtype_bytes(dtype, cols));
  const char* tok = std::getenv("TANDEM_BENCH_TOKENS");
  const int64_t tokens = tok != nullptr ? std::max(1, std::atoi(tok)) : 1;
  const Weights w = make_weights(dtype, rows, cols);
  const char* huge = std::getenv("TANDEM_BENCH_HUGE");
  AllocOptions opt;
  opt.huge_pages = huge != nullptr && std::atoi(huge) != 0;
  AlignedBuffer packed(static_cast<size_t>(w.m.bytes()), opt);
  kern::KMatrix x4 = w.m;
  TD_CHECK(kern::q0_x4_format(w.m.format, &x4.format), "x4 of {}", kern::wformat_name(w.m.format));
  for (int64_t r = 0; r < rows; ++r) {
    kern::q0_x4_repack_row(w.m.format, w.m.data + r * w.m.row_bytes, nb,
                           packed.as<uint8_t>() + r * w.m.row_bytes);
  }
  x4.data = packed.as<uint8_t>();
  std::vector<float> x(static_cast<size_t>(tokens * cols)), y(static_cast<size_t>(tokens * rows));
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  kern::Activations a;
  kern::quantize_activations(kern::AFormat::kQ8_0, 0, x.data(), tokens, cols, cols, &a);
  const int64_t per_task = std::max<int64_t>(16, (256 << 10) / w.m.row_bytes / 16 * 16);
  const size_t n_tasks = static_cast<size_t>((rows + per_task - 1) / per_task);
  auto call_on = [&](const kern::KMatrix& m) {
    pool().run(n_tasks, [&](size_t i) {
      const int64_t r0 = static_cast<int64_t>(i) * per_task;
      kern::gemm(m, a, r0, std::min(rows, r0 + per_task), y.data(), rows);
    });
    benchmark::DoNotOptimize(y.data());
  };
  auto call = [&] { call_on(x4); };
  for (auto _ : state) call();
  gemv_counters(state, static_cast<int64_t>(w.m.bytes()), call);
  state.counters["vs_rows"] = ab_rounds([&] { call_on(w.m); }, call);
}
BENCHMARK_CAPTURE(BM_GemvQ0X4, q5_0, DType::kQ5_0)->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_GemvQ0X4, q8_0, DType::kQ8_0)->UseRealTime()->MinTime(0.3);

// No arithmetic: BM_Gemv/q4_k's buffer (same size, same huge-page setting) read in the same
// ~256 KiB tasks by one of `tandem roofline`'s read kernels. What a GEMV would reach if its
// arithmetic were free: the gap between this and BM_Gemv is the kernel's, the gap between this
// and dram_GBps is the task split's and the pool's.
void BM_GemvReadOnly(benchmark::State& state, std::string_view kernel) {
  const char* kib = std::getenv("TANDEM_BENCH_GEMV_KIB");
  const int64_t bytes = kib != nullptr ? std::atoll(kib) << 10 : gemv_bytes();
  const Weights w = make_weights(DType::kQ4_K, bytes / 1152, 2048);
  cpu::ReadFn read = nullptr;
  for (const cpu::ReadKernel& k : cpu::read_kernels()) {
    if (k.name == kernel) read = k.fn;
  }
  if (read == nullptr) {
    state.SkipWithError("read kernel not supported here");
    return;
  }
  const char* task_kib = std::getenv("TANDEM_BENCH_TASK_KIB");
  const int64_t task = (task_kib != nullptr ? std::atoll(task_kib) : 256) << 10;
  const int64_t total = static_cast<int64_t>(w.m.bytes()) / 64 * 64;
  const size_t n_tasks = static_cast<size_t>((total + task - 1) / task);
  std::vector<uint64_t> sums(n_tasks);
  auto call = [&] {
    pool().run(n_tasks, [&](size_t i) {
      const int64_t b0 = static_cast<int64_t>(i) * task;
      sums[i] = read(w.m.data + b0, static_cast<size_t>(std::min(total, b0 + task) - b0));
    });
    benchmark::DoNotOptimize(sums.data());
  };
  for (auto _ : state) call();
  gemv_counters(state, total, call);
}
BENCHMARK_CAPTURE(BM_GemvReadOnly, avx512, "avx512")->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_GemvReadOnly, avx512_prefetch, "avx512_prefetch")
    ->UseRealTime()
    ->MinTime(0.3);


void BM_Gemm512(benchmark::State& state, DType dtype, Isa isa) {
  run(state, dtype, 2048, 2048, 512, isa);
}

#define TD_FORMAT_BENCH(fn, dt, name)                                                  \
  BENCHMARK_CAPTURE(fn, name##_scalar, dt, Isa::kScalar)->UseRealTime()->MinTime(0.3); \
  BENCHMARK_CAPTURE(fn, name##_avx2, dt, Isa::kAvx2)->UseRealTime()->MinTime(0.3);     \
  BENCHMARK_CAPTURE(fn, name##_avx512, dt, Isa::kAvx512)->UseRealTime()->MinTime(0.3); \
  BENCHMARK_CAPTURE(fn, name##_avx512_vnni, dt, Isa::kAvx512Vnni)->UseRealTime()->MinTime(0.3)

TD_FORMAT_BENCH(BM_Gemv, DType::kQ2_K, q2_k);
TD_FORMAT_BENCH(BM_Gemv, DType::kQ3_K, q3_k);
TD_FORMAT_BENCH(BM_Gemv, DType::kQ4_K, q4_k);
TD_FORMAT_BENCH(BM_Gemv, DType::kQ5_K, q5_k);
TD_FORMAT_BENCH(BM_Gemv, DType::kQ6_K, q6_k);
TD_FORMAT_BENCH(BM_Gemv, DType::kQ5_0, q5_0);
TD_FORMAT_BENCH(BM_Gemv, DType::kQ4_0, q4_0);
TD_FORMAT_BENCH(BM_Gemv, DType::kQ4_1, q4_1);
TD_FORMAT_BENCH(BM_Gemv, DType::kQ5_1, q5_1);
TD_FORMAT_BENCH(BM_Gemv, DType::kQ8_0, q8_0);
TD_FORMAT_BENCH(BM_Gemv, DType::kBF16, bf16);
TD_FORMAT_BENCH(BM_Gemv, DType::kF32, f32);
TD_FORMAT_BENCH(BM_Gemm512, DType::kQ2_K, q2_k);
TD_FORMAT_BENCH(BM_Gemm512, DType::kQ3_K, q3_k);
TD_FORMAT_BENCH(BM_Gemm512, DType::kQ4_K, q4_k);
TD_FORMAT_BENCH(BM_Gemm512, DType::kQ5_K, q5_k);
TD_FORMAT_BENCH(BM_Gemm512, DType::kQ6_K, q6_k);
TD_FORMAT_BENCH(BM_Gemm512, DType::kQ5_0, q5_0);
TD_FORMAT_BENCH(BM_Gemm512, DType::kQ4_0, q4_0);
TD_FORMAT_BENCH(BM_Gemm512, DType::kQ4_1, q4_1);
TD_FORMAT_BENCH(BM_Gemm512, DType::kQ5_1, q5_1);
TD_FORMAT_BENCH(BM_Gemm512, DType::kQ8_0, q8_0);
TD_FORMAT_BENCH(BM_Gemm512, DType::kBF16, bf16);

// Decode's pattern: one token through a chain of distinct matrices (rows x 2048 each, 128 MiB in
// all, so DRAM-bound), each by kern::matmul on the pool (one job per matrix, as the forward pass
// does): bytes_per_second against BM_Gemv's one large matrix shows the per-call cost.
void BM_MatmulChain(benchmark::State& state, DType dtype, int64_t rows) {
  const int64_t cols = 2048;
  const int64_t rb = static_cast<int64_t>(dtype_bytes(dtype, cols));
  const int64_t n = std::max<int64_t>(1, (128ll << 20) / (rb * rows));
  const Weights w = make_weights(dtype, rows * n, cols);
  std::vector<Tensor> parts(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    Tensor& t = parts[static_cast<size_t>(i)];
    t.dtype = dtype;
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.data = const_cast<uint8_t*>(w.bytes.as<uint8_t>()) + i * rows * rb;
  }
  std::vector<float> x(static_cast<size_t>(cols), 0.5f), y(static_cast<size_t>(rows));
  auto call = [&] {
    for (const Tensor& t : parts) kern::matmul(ops::Weight(t), x.data(), 1, y.data(), &pool());
    benchmark::DoNotOptimize(y.data());
  };
  for (auto _ : state) call();
  gemv_counters(state, n * rows * rb, call);
  state.counters["calls"] = static_cast<double>(n);
}
// One token's GEMV of the matrices ws as one pool job of fixed tasks (per thread about two of at
// most 4 MiB, whole 16-row tiles): the alternative to kern::matmul_shared_input's RangeShares, for
// the A/B against it (shares_vs_tasks).
void gemv_in_fixed_tasks(std::span<const kern::KMatrix* const> ws, const float* x,
                         std::span<float* const> ys, kern::Activations* a) {
  kern::quantize_activations(kern::act_format(ws[0]->format), ws[0]->group, x, 1, ws[0]->cols,
                             ws[0]->cols, a);
  const int64_t threads = pool().size() + 1;
  int64_t call_bytes = 0;
  for (const kern::KMatrix* w : ws) call_bytes += w->rows * w->row_bytes;
  const int64_t per_thread = (call_bytes + threads - 1) / threads;
  const int64_t n = std::max<int64_t>(2, (per_thread + (int64_t{4} << 20) - 1) >> 22);
  const int64_t bytes = std::max<int64_t>(int64_t{64} << 10, (per_thread + n - 1) / n);
  std::vector<std::pair<size_t, int64_t>> tasks;  // (matrix, first row)
  std::vector<int64_t> per(ws.size());
  for (size_t m = 0; m < ws.size(); ++m) {
    per[m] = std::max<int64_t>(16, ((bytes + ws[m]->row_bytes - 1) / ws[m]->row_bytes + 15) / 16 *
                                       16);
    for (int64_t r = 0; r < ws[m]->rows; r += per[m]) tasks.emplace_back(m, r);
  }
  pool().run(tasks.size(), [&](size_t i) {
    const auto [m, r0] = tasks[i];
    kern::gemm(*ws[m], *a, r0, std::min(ws[m]->rows, r0 + per[m]), ys[m], ws[m]->rows);
  });
}

// The dense decode matmuls of a V2-Lite layer as `repack` holds them (Q4_K in x16 tiles): per
// "layer" q (3072 x 2048) with kv_a (576 x 2048) in one kern::matmul_shared_input, then wo (2048 x
// 2048) by kern::matmul, one job each on the pool, ~128 MiB of layers cycled (DRAM-bound as in
// decode). of_dram against the probe: what the attention's projections lose to their per-call
// costs (each task's stream start, the job's tail).
void BM_DenseDecodeX16(benchmark::State& state) {
  if (best_isa() < Isa::kAvx512Vnni) {
    state.SkipWithError("no AVX-512 VNNI here (the x16 tile GEMV)");
    return;
  }
  constexpr int64_t kCols = 2048, kQ = 3072, kKv = 576, kO = 2048;
  const int64_t rb = static_cast<int64_t>(dtype_bytes(DType::kQ4_K, kCols));
  const int64_t per_layer = (kQ + kKv + kO) * rb;
  const int64_t layers = (128ll << 20) / per_layer;
  const Weights w = make_weights(DType::kQ4_K, (kQ + kKv + kO) * layers, kCols);
  AllocOptions opt;
  opt.huge_pages = true;
  const kern::KMatrix all = kern::q4k_x16_matrix(w.m, opt);
  const int64_t tile = kern::q4k_x16_tile_bytes(kCols);
  std::vector<kern::KMatrix> q, kv, o;
  for (int64_t l = 0; l < layers; ++l) {
    int64_t row = l * (kQ + kKv + kO);
    for (auto [v, rows] : {std::pair{&q, kQ}, {&kv, kKv}, {&o, kO}}) {
      kern::KMatrix m = all;
      m.rows = rows;
      m.data = all.data + row / kern::kQ4KX16Rows * tile;
      v->push_back(m);
      row += rows;
    }
  }
  std::vector<float> x(static_cast<size_t>(kCols), 0.5f), yq(kQ), ykv(kKv), yo(kO);
  kern::Activations scratch;
  auto call = [&] {
    for (int64_t l = 0; l < layers; ++l) {
      const kern::KMatrix* ws[2] = {&q[l], &kv[l]};
      float* ys[2] = {yq.data(), ykv.data()};
      kern::matmul_shared_input(ws, x.data(), 1, ys, &pool(), &scratch);
      kern::matmul(o[l], x.data(), 1, yo.data(), &pool(), &scratch);
    }
    benchmark::DoNotOptimize(yo.data());
  };
  for (auto _ : state) call();
  gemv_counters(state, layers * per_layer, call);
  state.counters["calls"] = static_cast<double>(2 * layers);
  // shares_vs_tasks: against the same matmuls as a job of fixed tasks each
  // (gemv_in_fixed_tasks), A/B in the same minute (ab_rounds).
  auto tasks_call = [&] {
    for (int64_t l = 0; l < layers; ++l) {
      const kern::KMatrix* ws[2] = {&q[l], &kv[l]};
      float* ys[2] = {yq.data(), ykv.data()};
      gemv_in_fixed_tasks(ws, x.data(), ys, &scratch);
      const kern::KMatrix* wo[1] = {&o[l]};
      float* yos[1] = {yo.data()};
      gemv_in_fixed_tasks(wo, x.data(), yos, &scratch);
    }
    benchmark::DoNotOptimize(yo.data());
  };
  state.counters["shares_vs_tasks"] = ab_rounds(tasks_call, call);
}
BENCHMARK(BM_DenseDecodeX16)->UseRealTime()->MinTime(0.3);

// DeepSeek-V2-Lite's lm_head as decode runs it: one token against 102400 x 2048 Q6_K (the Q4_K_M
// file's output.weight, 172 MB) in its stored rows by kern::matmul on the pool (BM_LmHeadQ6KX16:
// in x16 tiles, as `repack` holds it).
// shares_vs_tasks: against the same rows as a job of fixed tasks (gemv_in_fixed_tasks), A/B in
// the same minute.
void BM_LmHeadQ6K(benchmark::State& state) {
  constexpr int64_t kRows = 102400, kCols = 2048;
  const Weights w = make_weights(DType::kQ6_K, kRows, kCols);
  std::vector<float> x(static_cast<size_t>(kCols)), y(static_cast<size_t>(kRows));
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  kern::Activations scratch;
  auto call = [&] {
    kern::matmul(w.m, x.data(), 1, y.data(), &pool(), &scratch);
    benchmark::DoNotOptimize(y.data());
  };
  for (auto _ : state) call();
  gemv_counters(state, static_cast<int64_t>(w.m.bytes()), call);
  const kern::KMatrix* ws[1] = {&w.m};
  float* ys[1] = {y.data()};
  state.counters["shares_vs_tasks"] = ab_rounds(
      [&] {
        gemv_in_fixed_tasks(ws, x.data(), ys, &scratch);
        benchmark::DoNotOptimize(y.data());
      },
      call);
}
BENCHMARK(BM_LmHeadQ6K)->UseRealTime()->MinTime(0.3);

// The same lm_head in Q6_K x16 tiles (ops/cpu/q6k_x16.h, what `--cpu-experts repack` holds it in
// on AVX-512 VNNI CPUs) by kern::matmul. vs_rows: against BM_LmHeadQ6K's stored rows, A/B in the
// same minute. TANDEM_BENCH_GEMV_KIB=N: N KiB of rows instead (e.g. 512: cache-resident, the
// kernels' own speed; then no of_dram).
void BM_LmHeadQ6KX16(benchmark::State& state) {
  if (best_isa() < Isa::kAvx512Vnni) {
    state.SkipWithError("no AVX-512 VNNI here (the x16 tile GEMV)");
    return;
  }
  constexpr int64_t kCols = 2048;
  const int64_t row_bytes = static_cast<int64_t>(dtype_bytes(DType::kQ6_K, kCols));
  const char* kib = std::getenv("TANDEM_BENCH_GEMV_KIB");
  const int64_t rows =
      kib != nullptr ? std::max<int64_t>(16, (std::atoll(kib) << 10) / row_bytes / 16 * 16)
                     : 102400;
  const Weights w = make_weights(DType::kQ6_K, rows, kCols);
  AllocOptions opt;
  opt.huge_pages = true;
  const kern::KMatrix x16 = kern::q6k_x16_matrix(w.m, opt);
  std::vector<float> x(static_cast<size_t>(kCols)), y(static_cast<size_t>(rows));
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  kern::Activations scratch;
  auto on = [&](const kern::KMatrix& m) {
    kern::matmul(m, x.data(), 1, y.data(), &pool(), &scratch);
    benchmark::DoNotOptimize(y.data());
  };
  for (auto _ : state) on(x16);
  gemv_counters(state, static_cast<int64_t>(x16.bytes()), [&] { on(x16); });
  state.counters["vs_rows"] = ab_rounds([&] { on(w.m); }, [&] { on(x16); });
  const kern::KMatrix* ws[1] = {&x16};
  float* ys[1] = {y.data()};
  state.counters["shares_vs_tasks"] = ab_rounds(
      [&] {
        gemv_in_fixed_tasks(ws, x.data(), ys, &scratch);
        benchmark::DoNotOptimize(y.data());
      },
      [&] { on(x16); });
}
BENCHMARK(BM_LmHeadQ6KX16)->UseRealTime()->MinTime(0.3);

// A few tokens (the arg: 1-32, a batched decode step's tokens per expert or per dense matrix) on
// 1 MiB of Q4_K or Q6_K rows of 2048 columns in x16 tiles, by kern::gemm on one thread: the
// kernels' own speed from L2 (with more than one token they are compute-bound: the weights come
// once from DRAM, the tokens after the first from cache). items_per_second = 2 x multiply-adds.
// TANDEM_BENCH_GEMV_KIB=N: N KiB instead.
void BM_FewTokensX16(benchmark::State& state, DType dtype) {
  if (best_isa() < Isa::kAvx512Vnni) {
    state.SkipWithError("no AVX-512 VNNI here (the x16 tile kernels)");
    return;
  }
  constexpr int64_t kCols = 2048;
  const int64_t tokens = state.range(0);
  const char* kib = std::getenv("TANDEM_BENCH_GEMV_KIB");
  const int64_t bytes = kib != nullptr ? std::atoll(kib) << 10 : int64_t{1} << 20;
  const int64_t rows = std::max<int64_t>(
      16, bytes / static_cast<int64_t>(dtype_bytes(dtype, kCols)) / 16 * 16);
  const Weights w = make_weights(dtype, rows, kCols);
  const kern::KMatrix x16 = dtype == DType::kQ4_K ? kern::q4k_x16_matrix(w.m, AllocOptions{})
                                                  : kern::q6k_x16_matrix(w.m, AllocOptions{});
  std::vector<float> x(static_cast<size_t>(tokens * kCols));
  std::vector<float> y(static_cast<size_t>(tokens * rows));
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  kern::Activations a;
  kern::quantize_activations(kern::AFormat::kQ8_K, 0, x.data(), tokens, kCols, kCols, &a);
  for (auto _ : state) {
    kern::gemm(x16, a, 0, rows, y.data(), rows);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(x16.bytes()));
  state.SetItemsProcessed(state.iterations() * 2 * rows * kCols * tokens);
}
BENCHMARK_CAPTURE(BM_FewTokensX16, q4_k, DType::kQ4_K)
    ->Arg(1)->Arg(2)->Arg(3)->Arg(4)->Arg(6)->Arg(8)->Arg(12)->Arg(16)->Arg(32)
    ->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_FewTokensX16, q6_k, DType::kQ6_K)
    ->Arg(1)->Arg(2)->Arg(3)->Arg(4)->Arg(6)->Arg(8)->Arg(12)->Arg(16)->Arg(32)
    ->UseRealTime()->MinTime(0.3);

// MLA's projections of one token's hidden state, q (3072 x 2048) and kv_a (576 x 2048) in Q4_K,
// over ~128 MiB of distinct pairs (DRAM-bound as in decode): both in one
// kern::matmul_shared_input (one conversion, one dispatch; the timed loop), against one
// kern::matmul each. shared_vs_separate: the rate ratio, A/B in the same minute (ab_rounds).
void BM_QKvA(benchmark::State& state) {
  const int64_t cols = 2048, rq = 3072, rkv = 576;
  const int64_t rb = static_cast<int64_t>(dtype_bytes(DType::kQ4_K, cols));
  const int64_t pairs = (128ll << 20) / (rb * (rq + rkv));
  const Weights w = make_weights(DType::kQ4_K, (rq + rkv) * pairs, cols);
  std::vector<ops::Weight> q, kv;
  for (int64_t i = 0; i < pairs; ++i) {
    for (int k = 0; k < 2; ++k) {
      Tensor t;
      t.dtype = DType::kQ4_K;
      t.ndim = 2;
      t.shape[0] = k == 0 ? rq : rkv;
      t.shape[1] = cols;
      t.data = const_cast<uint8_t*>(w.bytes.as<uint8_t>()) + (i * (rq + rkv) + k * rq) * rb;
      (k == 0 ? q : kv).emplace_back(t);
    }
  }
  std::vector<float> x(static_cast<size_t>(cols), 0.5f), yq(rq), ykv(rkv);
  auto call = [&](bool shared) {
    for (int64_t i = 0; i < pairs; ++i) {
      if (shared) {
        const ops::Weight* ws[2] = {&q[i], &kv[i]};
        float* ys[2] = {yq.data(), ykv.data()};
        kern::matmul_shared_input(ws, x.data(), 1, ys, &pool());
      } else {
        kern::matmul(q[i], x.data(), 1, yq.data(), &pool());
        kern::matmul(kv[i], x.data(), 1, ykv.data(), &pool());
      }
    }
    benchmark::DoNotOptimize(yq.data());
  };
  for (auto _ : state) call(true);
  const int64_t bytes = pairs * (rq + rkv) * rb;
  gemv_counters(state, bytes, [&] { call(true); });
  state.counters["shared_vs_separate"] = ab_rounds([&] { call(false); }, [&] { call(true); });
}
BENCHMARK(BM_QKvA)->UseRealTime()->MinTime(0.3);

// MLA absorbed decode's per-head up-projections as Model::attention_mla runs them: 16 heads, one
// pool task each, each a single-threaded kern::matmul of its own [rows x cols] slice (k_b: 512 x
// 128, 88-byte Q5_0 rows; v_b: 128 x 512) for one token, over ~128 MiB of distinct layers
// (DRAM-bound as in decode; TANDEM_BENCH_GEMV_KIB=N: N KiB, cache-resident). GBps / of_dram
// against BM_Gemv's one large matrix show the cost of many small matrices.
void BM_MlaHeads(benchmark::State& state, int64_t rows, int64_t cols) {
  constexpr int64_t kHeads = 16;
  const int64_t rb = static_cast<int64_t>(dtype_bytes(DType::kQ5_0, cols));
  const char* kib = std::getenv("TANDEM_BENCH_GEMV_KIB");  // N KiB: cache-resident
  const int64_t bytes = kib != nullptr ? std::atoll(kib) << 10 : 128ll << 20;
  const int64_t layers = std::max<int64_t>(1, bytes / (rb * rows * kHeads));
  const Weights w = make_weights(DType::kQ5_0, rows * kHeads * layers, cols);
  std::vector<ops::Weight> heads;
  for (int64_t i = 0; i < kHeads * layers; ++i) {
    Tensor t;
    t.dtype = DType::kQ5_0;
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.data = const_cast<uint8_t*>(w.bytes.as<uint8_t>()) + i * rows * rb;
    heads.emplace_back(t);
  }
  std::vector<float> x(static_cast<size_t>(kHeads * cols), 0.5f);
  std::vector<float> y(static_cast<size_t>(kHeads * rows));
  auto call = [&] {
    for (int64_t l = 0; l < layers; ++l) {
      pool().run(kHeads, [&](size_t h) {
        kern::matmul(heads[static_cast<size_t>(l * kHeads) + h], x.data() + h * cols, 1,
                     y.data() + h * rows, nullptr);
      });
    }
    benchmark::DoNotOptimize(y.data());
  };
  for (auto _ : state) call();
  gemv_counters(state, layers * kHeads * rows * rb, call);
  // ranges_vs_heads: one task per thread, each a contiguous range of heads (one stream), against
  // a task per head pulled in any order (A/B in the same minute, ab_rounds).
  const size_t threads = pool().size() + 1;
  auto ranges = [&] {
    for (int64_t l = 0; l < layers; ++l) {
      pool().run(threads, [&](size_t part) {
        const size_t h0 = part * kHeads / threads, h1 = (part + 1) * kHeads / threads;
        for (size_t h = h0; h < h1; ++h) {
          kern::matmul(heads[static_cast<size_t>(l * kHeads) + h], x.data() + h * cols, 1,
                       y.data() + h * rows, nullptr);
        }
      });
    }
    benchmark::DoNotOptimize(y.data());
  };
  state.counters["ranges_vs_heads"] = ab_rounds(call, ranges);
  state.counters["us_per_layer"] =
      benchmark::Counter(static_cast<double>(state.iterations() * layers) * 1e-6,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK_CAPTURE(BM_MlaHeads, k_b_512x128, 512, 128)->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_MlaHeads, v_b_128x512, 128, 512)->UseRealTime()->MinTime(0.3);

// The absorbed-MLA decode step between the projections, V2-Lite's shape as `--cpu-experts repack`
// holds it (Model::attention_mla, one token): per head W_UK (512 x 128, Q5_0 in x4 rows) of the
// query's 128 nope values, then the 16 heads' attention over a latent cache of `ctx` positions
// (576 / 512 values), then per head W_UV (128 x 512, Q4_K in x16 tiles). The weights of ~96
// layers (128 MiB) are cycled, so they come from DRAM as each layer's own do. The timed form is the
// model's: one job, each thread a contiguous range of heads through all three steps, unless
// kern::attention would split the cache over the threads (kern::attention_splits_cache: from
// kLongDecodeContext cached positions on), then three jobs (the head ranges' W_UK, kern::attention
// on the pool, the ranges' W_UV). one_vs_three: the
// one job against the three, A/B in the same minute (ab_rounds). bf16: the latent cache in BF16
// (ModelOptions::kv_type), half the bytes.
void BM_MlaDecodeHeads(benchmark::State& state, int64_t ctx, bool bf16) {
  if (!kern::q0_x4_native() || best_isa() < Isa::kAvx512Vnni) {
    state.SkipWithError("no AVX-512 VNNI / VBMI here (the repacked layouts)");
    return;
  }
  constexpr int64_t kHeads = 16, kLat = 512, kNope = 128, kRope = 64, kV = 128;
  constexpr int64_t kKr = kLat + kRope;
  const int64_t kb_bytes = kHeads * kLat * static_cast<int64_t>(dtype_bytes(DType::kQ5_0, kNope));
  const int64_t vb_bytes = kHeads * kV * static_cast<int64_t>(dtype_bytes(DType::kQ4_K, kLat));
  const int64_t layers = (128ll << 20) / (kb_bytes + vb_bytes);
  const Weights kb = make_weights(DType::kQ5_0, layers * kHeads * kLat, kNope);
  const Weights vb = make_weights(DType::kQ4_K, layers * kHeads * kV, kLat);
  AllocOptions opt;
  opt.huge_pages = true;
  AlignedBuffer kb4(static_cast<size_t>(kb.m.bytes()), opt);
  for (int64_t r = 0; r < kb.m.rows; ++r) {
    kern::q0_x4_repack_row(kb.m.format, kb.m.data + r * kb.m.row_bytes, kNope / kQK,
                           kb4.as<uint8_t>() + r * kb.m.row_bytes);
  }
  const kern::KMatrix vb16 = kern::q4k_x16_matrix(vb.m, opt);
  std::vector<kern::KMatrix> k_up, v_up;
  for (int64_t i = 0; i < layers * kHeads; ++i) {
    kern::KMatrix k = kb.m;
    TD_CHECK(kern::q0_x4_format(kb.m.format, &k.format), "x4 of Q5_0");
    k.rows = kLat;
    k.data = kb4.as<uint8_t>() + i * kLat * kb.m.row_bytes;
    k_up.push_back(k);
    kern::KMatrix v = vb16;
    v.rows = kV;
    v.data = vb16.data + i * (kV / kern::kQ4KX16Rows) * kern::q4k_x16_tile_bytes(kLat);
    v_up.push_back(v);
  }
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Latent caches cycled with the layers too (>= 64 MiB of them: not L3-resident, as 27 layers'
  // caches in the model are not).
  const int64_t cache_floats = ctx * kKr, elem = bf16 ? 2 : 4;
  const int64_t caches =
      std::max<int64_t>(1, ((64ll << 20) / elem + cache_floats - 1) / cache_floats);
  std::vector<float> q(static_cast<size_t>(kHeads * (kNope + kRope))),
      cache(static_cast<size_t>((bf16 ? 1 : caches) * cache_floats));
  std::vector<uint16_t> cache16(static_cast<size_t>((bf16 ? caches : 0) * cache_floats));
  for (float& v : q) v = normal(rng);
  for (int64_t i = 0; i < cache_floats; ++i) cache[static_cast<size_t>(i)] = normal(rng);
  for (int64_t c = bf16 ? 0 : 1; c < caches; ++c) {
    if (bf16) {
      for (int64_t i = 0; i < cache_floats; ++i) {
        cache16[static_cast<size_t>(c * cache_floats + i)] = f32_to_bf16(cache[i]);
      }
    } else {
      std::copy_n(cache.begin(), cache_floats, cache.begin() + c * cache_floats);
    }
  }
  std::vector<float> qc(static_cast<size_t>(kHeads * kKr)), att(kHeads * kLat), o(kHeads * kV);
  ops::AttentionArgs args =
      mla_decode_args(qc.data(), kHeads, kKr, kLat, cache.data(), ctx, 0.07f, att.data());
  int64_t l = 0;
  auto cache_of = [&](ops::AttentionArgs& x) {
    if (bf16) {
      x.k = x.v = nullptr;
      x.k16 = x.v16 = cache16.data() + (l % caches) * cache_floats;
    } else {
      x.k = x.v = cache.data() + (l % caches) * cache_floats;
    }
  };
  auto w_uk = [&](size_t h) {
    thread_local kern::Activations a;
    const float* qh = q.data() + h * (kNope + kRope);
    kern::matmul(k_up[static_cast<size_t>(l * kHeads) + h], qh, 1, qc.data() + h * kKr, nullptr,
                 &a);
    std::copy(qh + kNope, qh + kNope + kRope, qc.data() + h * kKr + kLat);
  };
  auto w_uv = [&](size_t h) {
    thread_local kern::Activations a;
    kern::matmul(v_up[static_cast<size_t>(l * kHeads) + h], att.data() + h * kLat, 1,
                 o.data() + h * kV, nullptr, &a);
  };
  const size_t threads = pool().size() + 1;
  auto ranges = [&](auto&& fn) {
    pool().run(threads, [&](size_t p) {
      for (size_t h = p * kHeads / threads; h < (p + 1) * kHeads / threads; ++h) fn(h);
    });
  };
  auto one = [&] {
    pool().run(threads, [&](size_t p) {
      const size_t h0 = p * kHeads / threads, h1 = (p + 1) * kHeads / threads;
      for (size_t h = h0; h < h1; ++h) w_uk(h);
      ops::AttentionArgs range = args;
      cache_of(range);
      range.q = qc.data() + h0 * kKr;
      range.n_heads = static_cast<int64_t>(h1 - h0);
      range.out = att.data() + h0 * kLat;
      kern::attention(range, nullptr);
      for (size_t h = h0; h < h1; ++h) w_uv(h);
    });
    l = (l + 1) % layers;
    benchmark::DoNotOptimize(o.data());
  };
  auto three = [&] {
    ranges(w_uk);
    cache_of(args);
    kern::attention(args, &pool());
    ranges(w_uv);
    l = (l + 1) % layers;
    benchmark::DoNotOptimize(o.data());
  };
  three();
  const std::vector<float> want = o;
  l = 0;
  one();
  if (o != want) state.SkipWithError("one job and three differ");
  const bool model_one = !kern::attention_splits_cache(args, &pool());
  for (auto _ : state) model_one ? one() : three();
  state.SetBytesProcessed(state.iterations() * (kb_bytes + vb_bytes));
  state.counters["us_per_layer"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 1e-6,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["one_vs_three"] = ab_rounds(three, one);
}
BENCHMARK_CAPTURE(BM_MlaDecodeHeads, ctx64, 64, false)->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_MlaDecodeHeads, ctx160, 160, false)->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_MlaDecodeHeads, ctx256, 256, false)->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_MlaDecodeHeads, ctx512, 512, false)->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_MlaDecodeHeads, ctx1024, 1024, false)->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_MlaDecodeHeads, ctx4096, 4096, false)->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_MlaDecodeHeads, ctx1024_bf16, 1024, true)->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_MlaDecodeHeads, ctx4096_bf16, 4096, true)->UseRealTime()->MinTime(0.3);

BENCHMARK_CAPTURE(BM_MatmulChain, q4_k_3072, DType::kQ4_K, 3072)->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_MatmulChain, q4_k_576, DType::kQ4_K, 576)->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_MatmulChain, q4_k_24576, DType::kQ4_K, 24576)->UseRealTime()->MinTime(0.3);

// Prefill attention of 512 tokens on an empty cache, DeepSeek-V2-Lite's absorbed MLA shape (16
// heads on one shared latent KV head: dk 576, dv 512), its expanded (naive) MLA shape (16 heads,
// a KV head each: dk 192, dv 128) and a GQA shape (32 heads, 8 KV heads, 128 / 128):
// items_per_second = the scores' and the value sums' multiply-adds x 2 (FLOP/s, to
// compare with the fp32 peak). avx2: the F32-GEMM scores and scalar value loop.
// n query tokens after pos0 cached ones: prefill (512 on an empty cache) or decode (1 token after
// 4095: the absorbed-MLA decode step at a 4K context, whose one KV group is split over threads).
enum class Cache { kF32, kBf16, kF16, kQ8 };  // ModelOptions::kv_type

// rows x d values as Q8_0 cache rows (ops::q8_quantize), 4-byte words; the first row's values
// at q8_lead_bytes(d) bytes in.
std::vector<int32_t> q8_rows(const float* x, int64_t rows, int64_t d) {
  const int64_t row = ops::q8_row_bytes(d);
  std::vector<int32_t> mem(static_cast<size_t>(rows * row / 4));
  int8_t* base = reinterpret_cast<int8_t*>(mem.data()) + ops::q8_lead_bytes(d);
  for (int64_t r = 0; r < rows; ++r) ops::q8_quantize(x + r * d, d, base + r * row);
  return mem;
}
const int8_t* q8_values(const std::vector<int32_t>& mem, int64_t d) {
  return reinterpret_cast<const int8_t*>(mem.data()) + ops::q8_lead_bytes(d);
}

void BM_Attention(benchmark::State& state, int64_t heads, int64_t kv_heads, int64_t dk, int64_t dv,
                  Isa isa, int64_t n = 512, int64_t pos0 = 0, Cache cache = Cache::kF32) {
  if (isa > best_isa()) {
    state.SkipWithError("ISA not supported here");
    return;
  }
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](int64_t count) {
    std::vector<float> v(static_cast<size_t>(count));
    for (float& x : v) x = normal(rng);
    return v;
  };
  const int64_t ctx = pos0 + n;
  const std::vector<float> q = fill(n * heads * dk), k = fill(ctx * kv_heads * dk),
                           v = fill(ctx * kv_heads * dv);
  std::vector<float> out(static_cast<size_t>(n * heads * dv));
  ops::AttentionArgs a;
  a.q = q.data();
  a.q_stride = heads * dk;
  a.n_tokens = n;
  a.n_heads = heads;
  a.n_kv_heads = kv_heads;
  a.dk = dk;
  a.dv = dv;
  a.k = k.data();
  a.v = v.data();
  a.k_stride = kv_heads * dk;
  a.v_stride = kv_heads * dv;
  a.scale = 0.1f;
  a.pos0 = pos0;
  a.out = out.data();
  const bool half = cache == Cache::kBf16 || cache == Cache::kF16, f16 = cache == Cache::kF16;
  std::vector<uint16_t> kb(half ? k.size() : 0), vb(half ? v.size() : 0);
  std::vector<int32_t> k8, v8;
  if (cache == Cache::kQ8) {  // every (position, KV head) row in Q8_0
    k8 = q8_rows(k.data(), ctx * kv_heads, dk);
    v8 = q8_rows(v.data(), ctx * kv_heads, dv);
    a.k = a.v = nullptr;
    a.k8 = q8_values(k8, dk);
    a.v8 = q8_values(v8, dv);
    a.k_stride = kv_heads * ops::q8_row_bytes(dk);
    a.v_stride = kv_heads * ops::q8_row_bytes(dv);
  }
  if (half) {  // a 16-bit cache
    for (size_t i = 0; i < kb.size(); ++i) kb[i] = f16 ? f32_to_f16(k[i]) : f32_to_bf16(k[i]);
    for (size_t i = 0; i < vb.size(); ++i) vb[i] = f16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
    a.k = a.v = nullptr;
    a.k16 = kb.data();
    a.v16 = vb.data();
    a.f16 = f16;
  }
  for (auto _ : state) {
    kern::attention(a, &pool(), isa);
    benchmark::DoNotOptimize(out.data());
  }
  const int64_t pairs = n * pos0 + n * (n + 1) / 2;  // (query, key) pairs under the causal mask
  state.SetItemsProcessed(state.iterations() * 2 * pairs * heads * (dk + dv));
}
// A long-context absorbed-MLA decode step's attention (kern::attention's split-cache path) on one
// thread, V2-Lite's shape (16 heads over one latent cache of rows of 576 floats: the keys are
// whole rows, the values their first 512): every segment's scores, numerators and value sums
// (detail::decode_segments_avx512), then the heads' folds (detail::decode_fold_avx512). ctx 256:
// the cache (590 KiB) in L2; 4096: 9.4 MiB, in L3. items_per_second = FLOP/s (2 x multiply-adds
// of the scores and value sums), against one core's fp32 peak (`tandem roofline`, "1t"). bf16:
// the cache in BF16 (detail::decode_segments_bf16: vdpbf16ps scores); q8: in Q8_0 (the F32
// kernel on rows dequantized as loaded).
void BM_MlaDecodeSegments(benchmark::State& state, int64_t ctx, Cache type) {
  const bool bf16 = type == Cache::kBf16;
  if (best_isa() < (bf16 ? Isa::kAvx512Bf16 : Isa::kAvx512)) {
    state.SkipWithError("ISA not supported here");
    return;
  }
  constexpr int64_t kHeads = 16, kDk = 576, kDv = 512;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(kHeads * kDk)), cache(static_cast<size_t>(ctx * kDk));
  for (float& x : q) x = normal(rng);
  for (float& x : cache) x = normal(rng);
  const int64_t segs = (ctx + kern::detail::kSegment - 1) / kern::detail::kSegment;
  std::vector<float> partial(static_cast<size_t>(segs * kHeads * kDv)),
      stats(static_cast<size_t>(segs * kHeads * 2)), out(kHeads * kDv);
  ops::AttentionArgs a =
      mla_decode_args(q.data(), kHeads, kDk, kDv, cache.data(), ctx, 0.05f, out.data());
  std::vector<uint16_t> cache16(cache.size());
  for (size_t i = 0; i < cache.size(); ++i) cache16[i] = f32_to_bf16(cache[i]);
  if (bf16) {
    a.k = a.v = nullptr;
    a.k16 = a.v16 = cache16.data();
  }
  const std::vector<int32_t> cache8 =
      type == Cache::kQ8 ? q8_rows(cache.data(), ctx, kDk) : std::vector<int32_t>{};
  if (type == Cache::kQ8) {  // the values: the key rows' first kDv
    a.k = a.v = nullptr;
    a.k8 = a.v8 = q8_values(cache8, kDk);
    a.k_stride = a.v_stride = ops::q8_row_bytes(kDk);
  }
  const auto segments =
      bf16 ? kern::detail::decode_segments_bf16 : kern::detail::decode_segments_avx512;
  for (auto _ : state) {
    segments(a, 0, segs, partial.data(), stats.data());
    kern::detail::decode_fold_avx512(a, partial.data(), stats.data(), 0, kHeads);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * 2 * kHeads * ctx * (kDk + kDv));
}
BENCHMARK_CAPTURE(BM_MlaDecodeSegments, ctx256, 256, Cache::kF32)->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_MlaDecodeSegments, ctx4096, 4096, Cache::kF32)->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_MlaDecodeSegments, ctx256_bf16, 256, Cache::kBf16)
    ->UseRealTime()
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_MlaDecodeSegments, ctx4096_bf16, 4096, Cache::kBf16)
    ->UseRealTime()
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_MlaDecodeSegments, ctx256_q8, 256, Cache::kQ8)->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_MlaDecodeSegments, ctx4096_q8, 4096, Cache::kQ8)
    ->UseRealTime()
    ->MinTime(0.3);

// Expanded MLA's K up-projection for one head (kern::gemm_f32_kn): 512 cached latents (rows of
// 576 floats: latent then rope key) times GGUF k_b in F32 as stored [512, 128], single-threaded:
// items_per_second = multiply-adds x 2 (FLOP/s; the fp32 peak of `tandem roofline` is for all
// threads). scalar: the reference loop.
void BM_GemmF32Kn(benchmark::State& state, Isa isa) {
  if (isa > best_isa()) {
    state.SkipWithError("ISA not supported here");
    return;
  }
  const int64_t m = 512, k = 512, n = 128, lda = 576;
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> a(static_cast<size_t>(m * lda)), b(static_cast<size_t>(k * n));
  for (float& x : a) x = normal(rng);
  for (float& x : b) x = normal(rng);
  std::vector<float> c(static_cast<size_t>(m * n));
  for (auto _ : state) {
    kern::gemm_f32_kn(a.data(), lda, m, b.data(), k, n, c.data(), n, isa);
    benchmark::DoNotOptimize(c.data());
  }
  state.SetItemsProcessed(state.iterations() * 2 * m * k * n);
}
BENCHMARK_CAPTURE(BM_GemmF32Kn, scalar, Isa::kScalar)->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_GemmF32Kn, avx512, Isa::kAvx512)->UseRealTime()->MinTime(0.3);

BENCHMARK_CAPTURE(BM_Attention, mla_avx2, 16, 1, 576, 512, Isa::kAvx2)->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_Attention, mla_avx512, 16, 1, 576, 512, Isa::kAvx512)
    ->UseRealTime()
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_Attention, mla_decode_4k_avx512, 16, 1, 576, 512, Isa::kAvx512, 1, 4095)
    ->UseRealTime()
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_Attention, mla_bf16, 16, 1, 576, 512, Isa::kAvx512Bf16, 512, 0, Cache::kBf16)
    ->UseRealTime()
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_Attention, mla_decode_4k_bf16, 16, 1, 576, 512, Isa::kAvx512Bf16, 1, 4095,
                  Cache::kBf16)
    ->UseRealTime()
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_Attention, mla_decode_4k_f16, 16, 1, 576, 512, Isa::kAvx512, 1, 4095,
                  Cache::kF16)
    ->UseRealTime()
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_Attention, mla_q8, 16, 1, 576, 512, Isa::kAvx512, 512, 0, Cache::kQ8)
    ->UseRealTime()
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_Attention, mla_decode_4k_q8, 16, 1, 576, 512, Isa::kAvx512, 1, 4095,
                  Cache::kQ8)
    ->UseRealTime()
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_Attention, mla_expanded_avx512, 16, 16, 192, 128, Isa::kAvx512)
    ->UseRealTime()
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_Attention, gqa_avx2, 32, 8, 128, 128, Isa::kAvx2)->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_Attention, gqa_avx512, 32, 8, 128, 128, Isa::kAvx512)
    ->UseRealTime()
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_Attention, gqa_bf16, 32, 8, 128, 128, Isa::kAvx512Bf16, 512, 0, Cache::kBf16)
    ->UseRealTime()
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_Attention, gqa_q8, 32, 8, 128, 128, Isa::kAvx512, 512, 0, Cache::kQ8)
    ->UseRealTime()
    ->MinTime(0.3);

// A decode step of Qwen3-30B-A3B's attention at 4K positions (32 heads on 4 KV heads of 128),
// the cache position-major (one layer's: 2 x 8 MiB in F32, L3-resident here).
BENCHMARK_CAPTURE(BM_Attention, gqa_decode_4k_avx512, 32, 4, 128, 128, Isa::kAvx512, 1, 4095)
    ->UseRealTime()
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_Attention, gqa_decode_4k_bf16, 32, 4, 128, 128, Isa::kAvx512Bf16, 1, 4095,
                  Cache::kBf16)
    ->UseRealTime()
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_Attention, gqa_decode_4k_q8, 32, 4, 128, 128, Isa::kAvx512, 1, 4095,
                  Cache::kQ8)
    ->UseRealTime()
    ->MinTime(0.3);

// A decode step's attention over a long GQA cache from DRAM, Qwen3-30B-A3B's shape (32 heads on 4
// KV heads of 128) at 4096 positions, on the pool: layers' caches cycled (>= 128 MiB of them: not
// L3-resident, as a model's 48 layers' are not), head-major as the model keeps them (a KV head's
// positions consecutive). GBps: the cache bytes a step reads (K and V of every position),
// of_dram: against a DRAM probe in alternating rounds (bench/dram_probe.h); vs_position_major:
// head-major's rate over the same caches position-major (a position's KV heads side by side),
// A/B in the same minute.
void BM_GqaDecodeCache(benchmark::State& state, Cache cache) {
  const Isa isa = cache == Cache::kBf16 ? Isa::kAvx512Bf16 : Isa::kAvx512;
  if (isa > best_isa()) {
    state.SkipWithError("ISA not supported here");
    return;
  }
  constexpr int64_t kHeads = 32, kKv = 4, kD = 128, kCtx = 4096;
  std::mt19937 rng(6);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(kHeads * kD), kv(static_cast<size_t>(kCtx * kKv * kD)),
      out(kHeads * kD);
  for (float& x : q) x = normal(rng);
  for (float& x : kv) x = normal(rng);
  // One K or V block as the cache type stores it, in 4-byte words, position-major; every
  // layer's K and V hold the same values (the bytes matter here, not the arithmetic).
  const int64_t row = cache == Cache::kQ8   ? ops::q8_row_bytes(kD)
                      : cache == Cache::kF32 ? 4 * kD
                                             : 2 * kD;
  std::vector<int32_t> block(static_cast<size_t>(kCtx * kKv * row / 4));
  if (cache == Cache::kF32) {
    std::memcpy(block.data(), kv.data(), block.size() * 4);
  } else if (cache == Cache::kBf16) {
    auto* h = reinterpret_cast<uint16_t*>(block.data());
    for (size_t i = 0; i < kv.size(); ++i) h[i] = f32_to_bf16(kv[i]);
  } else {
    block = q8_rows(kv.data(), kCtx * kKv, kD);
  }
  std::vector<int32_t> by_head(block.size());  // the same rows head-major
  const int64_t words = row / 4;
  for (int64_t p = 0; p < kCtx; ++p) {
    for (int64_t g = 0; g < kKv; ++g) {
      std::copy_n(block.data() + (p * kKv + g) * words, words,
                  by_head.data() + (g * kCtx + p) * words);
    }
  }
  const int64_t layer_bytes = 2 * kCtx * kKv * row;  // K and V
  const int64_t layers = std::max<int64_t>(2, (128ll << 20) / layer_bytes);
  std::vector<int32_t> heads_mem, positions_mem;
  for (int64_t c = 0; c < 2 * layers; ++c) {
    heads_mem.insert(heads_mem.end(), by_head.begin(), by_head.end());
    positions_mem.insert(positions_mem.end(), block.begin(), block.end());
  }
  ops::AttentionArgs a;
  a.q = q.data();
  a.q_stride = kHeads * kD;
  a.n_tokens = 1;
  a.n_heads = kHeads;
  a.n_kv_heads = kKv;
  a.dk = a.dv = kD;
  a.pos0 = kCtx - 1;
  a.scale = 0.08f;
  a.out = out.data();
  const int64_t elem = cache == Cache::kQ8 ? 1 : cache == Cache::kF32 ? 4 : 2;
  int64_t l = 0;
  auto step_on = [&](bool head_major) {
    const std::vector<int32_t>& mem = head_major ? heads_mem : positions_mem;
    const char* k = reinterpret_cast<const char*>(mem.data() + 2 * (l % layers) * block.size());
    const char* v = k + block.size() * 4;
    if (cache == Cache::kQ8) {  // (the values of each row after its scales)
      k += ops::q8_lead_bytes(kD);
      v += ops::q8_lead_bytes(kD);
    }
    if (cache == Cache::kF32) {
      a.k = reinterpret_cast<const float*>(k);
      a.v = reinterpret_cast<const float*>(v);
    } else if (cache == Cache::kBf16) {
      a.k16 = reinterpret_cast<const uint16_t*>(k);
      a.v16 = reinterpret_cast<const uint16_t*>(v);
    } else {
      a.k8 = reinterpret_cast<const int8_t*>(k);
      a.v8 = reinterpret_cast<const int8_t*>(v);
    }
    const int64_t row_elems = row / elem;
    a.k_stride = a.v_stride = head_major ? row_elems : kKv * row_elems;
    a.k_head = a.v_head = head_major ? kCtx * row_elems : 0;
    kern::attention(a, &pool(), isa);
    benchmark::DoNotOptimize(out.data());
    ++l;
  };
  auto step = [&] { step_on(true); };
  for (auto _ : state) step();
  gemv_counters(state, layer_bytes, step);
  state.counters["vs_position_major"] = ab_rounds([&] { step_on(false); }, step);
}
BENCHMARK_CAPTURE(BM_GqaDecodeCache, f32, Cache::kF32)->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_GqaDecodeCache, bf16, Cache::kBf16)->UseRealTime()->MinTime(0.3);
BENCHMARK_CAPTURE(BM_GqaDecodeCache, q8, Cache::kQ8)->UseRealTime()->MinTime(0.3);

// Activation quantization of 64 tokens x 2048 values on this thread (a prefill's share per task;
// int8: group 128): bytes_per_second = F32 bytes read.
void BM_QuantizeActivations(benchmark::State& state, kern::AFormat format, Isa isa) {
  if (isa > best_isa()) {
    state.SkipWithError("ISA not supported here");
    return;
  }
  const int64_t tokens = 64, cols = 2048;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(tokens * cols));
  for (float& v : x) v = normal(rng);
  kern::Activations a;
  for (auto _ : state) {
    kern::quantize_activations(format, 128, x.data(), tokens, cols, cols, &a, nullptr, isa);
    benchmark::DoNotOptimize(a.data.data());
  }
  state.SetBytesProcessed(state.iterations() * tokens * cols * 4);
}
BENCHMARK_CAPTURE(BM_QuantizeActivations, q8_k_scalar, kern::AFormat::kQ8_K, Isa::kScalar)
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_QuantizeActivations, q8_k_avx2, kern::AFormat::kQ8_K, Isa::kAvx2)
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_QuantizeActivations, q8_k_avx512, kern::AFormat::kQ8_K, Isa::kAvx512)
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_QuantizeActivations, q8_0_scalar, kern::AFormat::kQ8_0, Isa::kScalar)
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_QuantizeActivations, q8_0_avx2, kern::AFormat::kQ8_0, Isa::kAvx2)
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_QuantizeActivations, q8_0_avx512, kern::AFormat::kQ8_0, Isa::kAvx512)
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_QuantizeActivations, i8_g128_scalar, kern::AFormat::kI8, Isa::kScalar)
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_QuantizeActivations, i8_g128_avx2, kern::AFormat::kI8, Isa::kAvx2)
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_QuantizeActivations, i8_g128_avx512, kern::AFormat::kI8, Isa::kAvx512)
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_QuantizeActivations, bf16_scalar, kern::AFormat::kBF16, Isa::kScalar)
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_QuantizeActivations, bf16_avx2, kern::AFormat::kBF16, Isa::kAvx2)
    ->MinTime(0.3);
BENCHMARK_CAPTURE(BM_QuantizeActivations, bf16_avx512, kern::AFormat::kBF16, Isa::kAvx512)
    ->MinTime(0.3);

// SwiGLU of an expert's 48 tokens x 1408 (V2-Lite's intermediate size) on this thread, in place:
// items_per_second = values. scalar is ops::swiglu, the reference (one e^x each); the glibc
// expf line is the SiLU tandem had before kern::swiglu (x / (1 + expf(-x))), for comparison.
constexpr int64_t kSwigluValues = 48 * 1408;
std::vector<float> swiglu_input(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> v(static_cast<size_t>(kSwigluValues));
  for (float& x : v) x = normal(rng);
  return v;
}
void BM_Swiglu(benchmark::State& state, Isa isa) {
  if (isa > best_isa()) {
    state.SkipWithError("ISA not supported here");
    return;
  }
  const int64_t n = kSwigluValues;
  const std::vector<float> g = swiglu_input(6), u = swiglu_input(7);
  std::vector<float> out(g.size());
  for (auto _ : state) {
    kern::swiglu(g.data(), u.data(), n, out.data(), isa);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
void BM_SwigluGlibcExpf(benchmark::State& state) {
  const int64_t n = kSwigluValues;
  const std::vector<float> g = swiglu_input(6), u = swiglu_input(7);
  std::vector<float> out(g.size());
  for (auto _ : state) {
    for (int64_t i = 0; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK_CAPTURE(BM_Swiglu, scalar, Isa::kScalar)->MinTime(0.3);
BENCHMARK_CAPTURE(BM_Swiglu, avx2, Isa::kAvx2)->MinTime(0.3);
BENCHMARK_CAPTURE(BM_Swiglu, avx512, Isa::kAvx512)->MinTime(0.3);
BENCHMARK(BM_SwigluGlibcExpf)->MinTime(0.3);

}  // namespace
}  // namespace tandem

BENCHMARK_MAIN();
