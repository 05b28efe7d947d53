// The assignment policies' decision time for one MoE layer step (runtime/policy.h): 64 experts,
// 16-24 of them active, half resident; the balanced cost model (accelerator 3x faster, a copy
// about one CPU expert) is the branch and bound's hard case. A policy decides once per layer and
// step, so its time adds to every decode step; the unit test (runtime_policy_test) checks only
// that `optimal` is optimal, the time is reported here.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "runtime/expert_cache.h"
#include "runtime/policy.h"

namespace tandem::rt {
namespace {

struct Step {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  LayerRouting r;
  std::unique_ptr<ExpertCache> cache;
};

// `active` experts with 1..40 tokens each (k = 1), about half of all 64 experts resident.
Step make_step(int active, std::mt19937& rng) {
  const int E = 64;
  Step s;
  std::vector<int> perm(E);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int i = 0; i < active; ++i) {
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int t = 0; t < n; ++t) s.ids.push_back(perm[i]);
  }
  s.weights.assign(s.ids.size(), 1.0f);
  s.r.layer = 0;
  s.r.k = 1;
  s.r.n_tokens = static_cast<int>(s.ids.size());
  s.r.n_experts = E;
  s.r.ids = s.ids.data();
  s.r.weights = s.weights.data();
  CacheConfig c;
  c.n_experts = E;
  c.slots_per_layer = E;
  s.cache = ExpertCache::make(CacheKind::kLru, c);
  for (int e = 0; e < E; ++e)
    if (rng() % 2) s.cache->pin(0, e);
  return s;
}

// Arg: active experts. 16 different steps cycled, so one lucky instance does not decide.
void policy_bench(benchmark::State& state, PolicyKind kind) {
  std::mt19937 rng(99);
  std::vector<Step> steps;
  for (int i = 0; i < 16; ++i) steps.push_back(make_step(static_cast<int>(state.range(0)), rng));
  const CostModel cost = CostModel::from_linear(1e-3, 1e-4, 3e-4, 3e-5, 1e-3);
  const auto policy = AssignmentPolicy::make(kind);
  size_t i = 0;
  for (auto _ : state) {
    const Step& s = steps[i++ % steps.size()];
    benchmark::DoNotOptimize(policy->assign(s.r, *s.cache, cost));
  }
}

void BM_PolicyOptimal(benchmark::State& state) { policy_bench(state, PolicyKind::kOptimal); }
BENCHMARK(BM_PolicyOptimal)->Arg(16)->Arg(20)->Arg(24)->Unit(benchmark::kMicrosecond);
void BM_PolicyDali(benchmark::State& state) { policy_bench(state, PolicyKind::kDali); }
BENCHMARK(BM_PolicyDali)->Arg(16)->Arg(24)->Unit(benchmark::kMicrosecond);
void BM_PolicyHybriMoe(benchmark::State& state) { policy_bench(state, PolicyKind::kHybriMoe); }
BENCHMARK(BM_PolicyHybriMoe)->Arg(16)->Arg(24)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tandem::rt

BENCHMARK_MAIN();
