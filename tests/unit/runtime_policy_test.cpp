// Assignment policies against hand-computed cases (static, fiddler, DALI Algorithm 1), the
// HybriMoE Fig. 5 scenario, and the branch and bound against brute force.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "core/error.h"
#include "runtime/policy.h"

namespace tandem::rt {
namespace {

// One step with the given tokens per expert (k = 1, tokens in expert order) and residents.
struct Case {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  LayerRouting r;
  std::unique_ptr<ExpertCache> cache;
  Case(const std::vector<int>& counts, const std::vector<int>& resident) {
    const int E = static_cast<int>(counts.size());
    for (int e = 0; e < E; ++e)
      for (int i = 0; i < counts[e]; ++i) ids.push_back(e);
    weights.assign(ids.size(), 1.0f);
    r.layer = 0;
    r.k = 1;
    r.n_tokens = static_cast<int>(ids.size());
    r.n_experts = E;
    r.ids = ids.data();
    r.weights = weights.data();
    CacheConfig c;
    c.n_layers = 1;
    c.n_experts = E;
    c.top_k = 1;
    c.slots_per_layer = E;
    cache = ExpertCache::make(CacheKind::kLru, c);
    for (int e : resident) cache->pin(0, e);
  }
};

std::vector<int> accel_set(const Assignment& a) {
  std::vector<int> out;
  for (size_t e = 0; e < a.on_accel.size(); ++e)
    if (a.on_accel[e]) out.push_back(static_cast<int>(e));
  return out;
}

// cpu(n) = n, accel(n) = 0.5, transfer 2 (units).
const CostModel kUnits = CostModel::from_linear(0, 1, 0.5, 0, 2);

TEST(RuntimePolicy, StaticRunsOnlyResidents) {
  Case c({4, 3, 1, 2}, {0, 3});
  const Assignment a = AssignmentPolicy::make(PolicyKind::kStatic)->assign(c.r, *c.cache, kUnits);
  EXPECT_EQ(accel_set(a), (std::vector<int>{0, 3}));
  EXPECT_TRUE(a.fetch.empty());
  EXPECT_DOUBLE_EQ(a.est_seconds, 4.0);  // CPU: 3 + 1; accelerator 0.5 + 0.5
}

TEST(RuntimePolicy, FiddlerFetchesWhenCopyPlusAccelBeatsCpu) {
  Case c({4, 3, 1, 2}, {0, 3});
  const Assignment a = AssignmentPolicy::make(PolicyKind::kFiddler)->assign(c.r, *c.cache, kUnits);
  // e1: 2 + 0.5 < 3 -> fetched; e2: 2 + 0.5 > 1 -> CPU.
  EXPECT_EQ(accel_set(a), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(a.fetch, (std::vector<int>{1}));
  EXPECT_DOUBLE_EQ(a.est_seconds, 2.5);  // accelerator: residents 1.0, e1 copied by 2, + 0.5
}

TEST(RuntimePolicy, DaliAlgorithm1ByHand) {
  Case c({4, 3, 1, 2}, {0, 3});
  // t_gpu = [.5, 2.5, 2.5, .5] (copy 2 for non-residents), t_cpu = [4, 3, 1, 2];
  // |diff| = [3.5, .5, 1.5, 1.5] -> order e0, e2, e3, e1.
  // e0: 0 + .5 <= 0 + 4 -> GPU (Tg .5); e2: .5 + 2.5 > 0 + 1 -> CPU (Tc 1);
  // e3: .5 + .5 <= 1 + 2 -> GPU (Tg 1); e1: 1 + 2.5 <= 1 + 3 -> GPU, fetched (Tg 3.5).
  const Assignment a = AssignmentPolicy::make(PolicyKind::kDali)->assign(c.r, *c.cache, kUnits);
  EXPECT_EQ(accel_set(a), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(a.fetch, (std::vector<int>{1}));
  EXPECT_DOUBLE_EQ(a.est_seconds, 2.5);  // the copy overlaps resident work: max(1, 2) + .5
  // With no slot to fetch into, e1 falls back to the CPU: CPU 1 + 3.
  PolicyOptions o;
  o.max_fetch = 0;
  const Assignment b = AssignmentPolicy::make(PolicyKind::kDali, o)->assign(c.r, *c.cache, kUnits);
  EXPECT_EQ(accel_set(b), (std::vector<int>{0, 3}));
  EXPECT_DOUBLE_EQ(b.est_seconds, 4.0);
}

// HybriMoE Fig. 5, rebuilt from the text's parameters (the figure's own loads are not in the
// text): GPU time constant (1), CPU time = load, transfer 3. Experts A..E = 0..4 with loads
// 4 3 6 2 1, A B D E cached, C not. Expected timeline: t=0 GPU runs A, the link copies C
// (arrives 3 + 1 = 5 < 6 on the CPU), the CPU, with no uncached work, takes the lowest cached E
// (done at 1, before the GPU's queue ends); GPU B at 1, D at 2 (stealing D would end at 3, not
// before the GPU's 3), C at 3..4. Makespan 4 (all-cached-on-GPU + C on CPU: 6).
TEST(RuntimePolicy, HybriMoeFigure5) {
  const CostModel units = CostModel::from_linear(0, 1, 1, 0, 3);
  std::vector<std::string> events;
  const Assignment a = hybrimoe_schedule({4, 3, 6, 2, 1}, {1, 1, 0, 1, 1}, units, 10, &events);
  EXPECT_EQ(events,
            (std::vector<std::string>{"gpu:0", "pcie:2", "cpu:4", "gpu:1", "gpu:3", "gpu:2"}));
  EXPECT_EQ(accel_set(a), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(a.fetch, (std::vector<int>{2}));
  EXPECT_DOUBLE_EQ(a.est_seconds, 4.0);
  // The policy object gives the same through the cache, and the optimum is also 4.
  Case c({4, 3, 6, 2, 1}, {0, 1, 3, 4});
  const Assignment p = AssignmentPolicy::make(PolicyKind::kHybriMoe)->assign(c.r, *c.cache, units);
  EXPECT_EQ(accel_set(p), accel_set(a));
  EXPECT_DOUBLE_EQ(p.est_seconds, 4.0);
  EXPECT_DOUBLE_EQ(AssignmentPolicy::make(PolicyKind::kOptimal)->assign(c.r, *c.cache, units).est_seconds,
                   4.0);
}

// Independent brute force: every CPU/accelerator split, every copy order of the fetched experts.
double brute_force(const std::vector<int>& counts, const std::vector<uint8_t>& resident,
                   const CostModel& cost, int max_fetch) {
  std::vector<int> active;
  for (size_t e = 0; e < counts.size(); ++e)
    if (counts[e] > 0) active.push_back(static_cast<int>(e));
  double best = 1e300;
  for (uint32_t mask = 0; mask < (1u << active.size()); ++mask) {
    double cpu = 0, res = 0;
    bool any_cpu = false, any_acc = false;
    std::vector<double> fetched;
    for (size_t i = 0; i < active.size(); ++i) {
      const int e = active[i];
      if (mask >> i & 1) {
        any_acc = true;
        if (resident[e])
          res += cost.accel_expert(counts[e]);
        else
          fetched.push_back(cost.accel_expert(counts[e]));
      } else {
        any_cpu = true;
        cpu += cost.cpu_expert(counts[e]);
      }
    }
    if (max_fetch >= 0 && int(fetched.size()) > max_fetch) continue;
    std::sort(fetched.begin(), fetched.end());
    double acc_best = 1e300;
    do {
      double t = res;  // residents first, then copies in this order
      for (size_t j = 0; j < fetched.size(); ++j)
        t = std::max(t, (j + 1) * cost.transfer()) + fetched[j];
      acc_best = std::min(acc_best, t);
    } while (std::next_permutation(fetched.begin(), fetched.end()));
    const double m = std::max(any_cpu ? cpu + cost.cpu_layer_overhead : 0.0,
                              any_acc ? acc_best + cost.accel_layer_overhead : 0.0);
    best = std::min(best, m);
  }
  return best;
}

CostModel random_cost(std::mt19937& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<CostPoint> cpu, acc;
  double c = 0.2 + u(rng), a = 0.02 + 0.2 * u(rng);
  for (int64_t n : {1, 2, 4, 8, 16}) {
    cpu.push_back({n, c});
    acc.push_back({n, a});
    c += 0.5 * u(rng) * n;
    a += 0.05 * u(rng) * n;
  }
  CostModel m = CostModel::from_tables(cpu, acc, 0.1 + 1.5 * u(rng));
  m.cpu_layer_overhead = 0.05 * u(rng);
  m.accel_layer_overhead = 0.05 * u(rng);
  return m;
}

TEST(RuntimePolicy, OptimalEqualsBruteForce) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    const CostModel cost = random_cost(rng);
    const int E = 12;
    std::vector<int> counts(E, 0), resident;
    std::vector<uint8_t> res(E, 0);
    const int active = 1 + int(rng() % 10);
    int non_resident = 0;
    for (int i = 0; i < active; ++i) {
      const int e = int(rng() % E);
      counts[e] += 1 + int(rng() % 12);
    }
    for (int e = 0; e < E; ++e) {
      const bool r = counts[e] == 0 ? rng() % 2 : (non_resident >= 5 || rng() % 2);
      if (r) {
        res[e] = 1;
        resident.push_back(e);
      } else if (counts[e] > 0) {
        ++non_resident;
      }
    }
    PolicyOptions o;
    o.max_fetch = trial % 3 == 0 ? int(rng() % 3) : -1;
    Case c(counts, resident);
    const Assignment a = AssignmentPolicy::make(PolicyKind::kOptimal, o)->assign(c.r, *c.cache, cost);
    const double want = brute_force(counts, res, cost, o.max_fetch);
    ASSERT_NEAR(a.est_seconds, want, 1e-9 * want) << "trial " << trial;
    // The reported estimate is the makespan of the returned assignment.
    ASSERT_NEAR(assignment_makespan(counts, a.on_accel, a.fetch, cost), a.est_seconds, 1e-12);
    for (int e : a.fetch) ASSERT_FALSE(res[e]);
    if (o.max_fetch >= 0) {
      ASSERT_LE(int(a.fetch.size()), o.max_fetch);
    }
    // No heuristic beats the optimum.
    for (PolicyKind kind :
         {PolicyKind::kStatic, PolicyKind::kFiddler, PolicyKind::kHybriMoe, PolicyKind::kDali}) {
      const Assignment h = AssignmentPolicy::make(kind, o)->assign(c.r, *c.cache, cost);
      ASSERT_GE(assignment_makespan(counts, h.on_accel, h.fetch, cost), want * (1 - 1e-9))
          << choice_name(kind);
    }
  }
}

// 16-24 active experts of 64 (the branch and bound's large cases): still no worse than DALI's
// greedy. How long it takes is measured by bench/policy_bench.cpp (BM_PolicyOptimal), not here.
TEST(RuntimePolicy, OptimalBeatsDaliFor24ActiveExperts) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 40; ++trial) {
    // Half the trials balanced (accelerator 3x faster, a copy ~ one CPU expert): the hard case.
    const CostModel cost =
        trial % 2 ? random_cost(rng) : CostModel::from_linear(1e-3, 1e-4, 3e-4, 3e-5, 1e-3);
    const int E = 64;
    std::vector<int> counts(E, 0), resident;
    std::vector<int> perm(E);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    const int active = 16 + trial % 9;
    for (int i = 0; i < active; ++i) counts[perm[i]] = 1 + int(rng() % 40);
    for (int e = 0; e < E; ++e)
      if (rng() % 2) resident.push_back(e);
    Case c(counts, resident);
    const Assignment a = AssignmentPolicy::make(PolicyKind::kOptimal)->assign(c.r, *c.cache, cost);
    const Assignment d = AssignmentPolicy::make(PolicyKind::kDali)->assign(c.r, *c.cache, cost);
    EXPECT_LE(a.est_seconds, d.est_seconds * (1 + 1e-12));
  }
}

TEST(RuntimePolicy, UnknownPolicy) {
  EXPECT_THROW(parse_choice<PolicyKind>("random"), Error);
}

}  // namespace
}  // namespace tandem::rt
