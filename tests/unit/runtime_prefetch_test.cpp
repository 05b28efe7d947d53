// Prefetchers: predicted top-k routing, impact ordering (score mass x (cpu - accel)), the link
// budget, caps, residency, and bad names.
#include <gtest/gtest.h>

#include "core/error.h"
#include "runtime/prefetch.h"

namespace tandem::rt {
namespace {

std::unique_ptr<ExpertCache> make_cache(int layers, int experts, int k, int slots) {
  CacheConfig c;
  c.n_layers = layers;
  c.n_experts = experts;
  c.top_k = k;
  c.slots_per_layer = slots;
  return ExpertCache::make(CacheKind::kLru, c);
}

// cpu(n) = 1 + n, accel = 0.1, transfer 1.
const CostModel kCost = CostModel::from_linear(1, 1, 0.1, 0, 1);

// Two tokens, 4 experts, top-2: token 0 -> e0 (.6), e1 (.3); token 1 -> e0 (.5), e2 (.4).
const float kScores[] = {0.6f, 0.3f, 0.1f, 0.0f, 0.5f, 0.1f, 0.4f, 0.0f};

TEST(RuntimePrefetch, ImpactOrderAndLinkBudget) {
  auto cache = make_cache(2, 4, 2, 4);
  cache->pin(1, 0);  // e0 of the next layer is already there
  auto p = Prefetcher::make(PrefetchKind::kGate);
  // impact e1 = .3 * (2 - .1) = .57, e2 = .4 * 1.9 = .76 -> e2 first.
  p->set_layer_seconds(2.0);  // the link moves 2 experts meanwhile
  EXPECT_EQ(p->choose(1, kScores, 2, *cache, kCost), (std::vector<int>{2, 1}));
  p->set_layer_seconds(1.5);  // one
  EXPECT_EQ(p->choose(1, kScores, 2, *cache, kCost), (std::vector<int>{2}));
  p->set_layer_seconds(0.1);  // less than one copy: still the best one
  EXPECT_EQ(p->choose(1, kScores, 2, *cache, kCost), (std::vector<int>{2}));
}

TEST(RuntimePrefetch, ResidualSameRuleAndCaps) {
  auto cache = make_cache(2, 4, 2, 2);
  cache->pin(1, 0);  // one free slot left in layer 1
  PrefetchOptions o;
  o.budget_seconds = 10;
  auto p = Prefetcher::make(PrefetchKind::kResidual, o);
  EXPECT_EQ(p->choose(1, kScores, 2, *cache, kCost), (std::vector<int>{2}));  // slot cap
  auto big = make_cache(2, 4, 2, 4);
  EXPECT_EQ(p->choose(1, kScores, 2, *big, kCost), (std::vector<int>{0, 2, 1}));
  o.max_experts = 1;
  EXPECT_EQ(Prefetcher::make(PrefetchKind::kResidual, o)->choose(1, kScores, 2, *big, kCost),
            (std::vector<int>{0}));
  // An expert that is slower on the accelerator is never worth a copy.
  const CostModel slow_accel = CostModel::from_linear(1, 1, 5, 0, 1);
  EXPECT_TRUE(p->choose(1, kScores, 2, *big, slow_accel).empty());
  EXPECT_TRUE(p->choose(2, kScores, 2, *big, kCost).empty());  // no such layer
}

TEST(RuntimePrefetch, NoneAndUnknown) {
  auto cache = make_cache(2, 4, 2, 4);
  EXPECT_TRUE(Prefetcher::make(PrefetchKind::kNone)->choose(1, kScores, 2, *cache, kCost).empty());
  EXPECT_THROW(parse_choice<PrefetchKind>("oracle"), Error);
}

}  // namespace
}  // namespace tandem::rt
