// The Gated DeltaNet kernels (ops/cpu/delta_net.h) per ISA level, one thread, Qwen3.5's head
// (dk = dv = 128):
//  - BM_DeltaRecurrent: one decode token of one head; bytes_per_second counts the state read and
//    written twice (4 x 64 KiB, L2-resident across iterations), items_per_second the multiply-
//    adds x 2 (3 dk dv per token).
//  - BM_DeltaChunked: a 512-token prefill of one head in chunks of 64 (items: the chunked form's
//    multiply-adds x 2, ~ (3 dk dv + 64 (dk + dv) + 64^2 / 2) per token).
//  - BM_DeltaRecurrentPrefill: the same 512 tokens token by token (what the chunked form saves).
//  - BM_ConvSilu: one decode token of Qwen3.5-35B's 8192 channels.
// Run: build/bench/bench_delta_net_bench [--benchmark_filter=Chunked]
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/cpu_features.h"
#include "ops/cpu/delta_net.h"

namespace tandem {
namespace {

constexpr int64_t kD = 128;

struct Inputs {
  std::vector<float> q, k, v, g, beta, state, out;
  explicit Inputs(int64_t n) {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    q.resize(static_cast<size_t>(n * kD));
    k.resize(q.size());
    v.resize(q.size());
    out.resize(q.size());
    for (auto* x : {&q, &k, &v}) {
      for (float& e : *x) e = normal(rng);
    }
    for (int64_t t = 0; t < n; ++t) {
      ops::l2_normalize(&q[static_cast<size_t>(t * kD)], kD, 1e-6f);
      ops::l2_normalize(&k[static_cast<size_t>(t * kD)], kD, 1e-6f);
      g.push_back(-unit(rng));
      beta.push_back(unit(rng));
    }
    state.assign(static_cast<size_t>(kD * kD), 0.01f);
  }
  ops::DeltaRuleArgs args(int64_t n) {
    ops::DeltaRuleArgs a;
    a.n = n;
    a.dk = a.dv = kD;
    a.q = q.data();
    a.k = k.data();
    a.v = v.data();
    a.q_stride = a.k_stride = a.v_stride = a.out_stride = kD;
    a.g = g.data();
    a.beta = beta.data();
    a.state = state.data();
    a.out = out.data();
    return a;
  }
};

bool skip_level(benchmark::State& st, Isa isa) {
  if (isa <= best_isa()) return false;
  st.SkipWithError("ISA not available");
  return true;
}

void BM_DeltaRecurrent(benchmark::State& st, Isa isa) {
  if (skip_level(st, isa)) return;
  Inputs in(1);
  const ops::DeltaRuleArgs a = in.args(1);
  for (auto _ : st) {
    kern::delta_rule_recurrent(a, isa);
    benchmark::DoNotOptimize(in.out.data());
  }
  st.SetBytesProcessed(st.iterations() * 4 * kD * kD * 4);
  st.SetItemsProcessed(st.iterations() * 2 * 3 * kD * kD);
}
BENCHMARK_CAPTURE(BM_DeltaRecurrent, scalar, Isa::kScalar)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_DeltaRecurrent, avx2, Isa::kAvx2)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_DeltaRecurrent, avx512, Isa::kAvx512)->MinTime(0.2);

void BM_DeltaChunked(benchmark::State& st, Isa isa) {
  if (skip_level(st, isa)) return;
  const int64_t n = 512, c = kern::kDeltaChunk;
  Inputs in(n);
  const ops::DeltaRuleArgs a = in.args(n);
  for (auto _ : st) {
    kern::delta_rule_chunked(a, 0, isa);
    benchmark::DoNotOptimize(in.out.data());
  }
  st.SetItemsProcessed(st.iterations() * 2 * n * (3 * kD * kD + c * 2 * kD + c * c / 2));
}
BENCHMARK_CAPTURE(BM_DeltaChunked, scalar, Isa::kScalar)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_DeltaChunked, avx2, Isa::kAvx2)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_DeltaChunked, avx512, Isa::kAvx512)->MinTime(0.2);

void BM_DeltaRecurrentPrefill(benchmark::State& st) {
  const int64_t n = 512;
  Inputs in(n);
  const ops::DeltaRuleArgs a = in.args(n);
  for (auto _ : st) {
    kern::delta_rule_recurrent(a);
    benchmark::DoNotOptimize(in.out.data());
  }
  st.SetItemsProcessed(st.iterations() * 2 * n * 3 * kD * kD);
}
BENCHMARK(BM_DeltaRecurrentPrefill)->MinTime(0.2);

void BM_ConvSilu(benchmark::State& st, Isa isa) {
  if (skip_level(st, isa)) return;
  const int64_t ch = 8192, K = 4;
  std::vector<float> wt(static_cast<size_t>(K * ch), 0.25f), win(static_cast<size_t>((K - 1) * ch)),
      x(static_cast<size_t>(ch), 1.0f), out(x.size());
  for (auto _ : st) {
    kern::conv_silu(wt.data(), K, ch, win.data(), x.data(), ch, 1, out.data(), ch, isa);
    benchmark::DoNotOptimize(out.data());
  }
  st.SetItemsProcessed(st.iterations() * ch);
}
BENCHMARK_CAPTURE(BM_ConvSilu, scalar, Isa::kScalar)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_ConvSilu, avx2, Isa::kAvx2)->MinTime(0.2);
BENCHMARK_CAPTURE(BM_ConvSilu, avx512, Isa::kAvx512)->MinTime(0.2);

}  // namespace
}  // namespace tandem

BENCHMARK_MAIN();
