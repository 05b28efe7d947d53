// Expert caches: LRU / LFU / MRS / DALI / none stepped by hand (expected values in comments).
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "runtime/expert_cache.h"

namespace tandem::rt {
namespace {

struct Step {  // routing of one step, kept alive while the cache reads it
  std::vector<int32_t> ids;
  std::vector<float> weights, scores;
  LayerRouting r;
  Step(int layer, int k, int n_experts, std::vector<int32_t> i, std::vector<float> s = {})
      : ids(std::move(i)), weights(ids.size(), 1.0f), scores(std::move(s)) {
    r.layer = layer;
    r.k = k;
    r.n_tokens = static_cast<int>(ids.size()) / k;
    r.n_experts = n_experts;
    r.ids = ids.data();
    r.weights = weights.data();
    r.scores = scores.empty() ? nullptr : scores.data();
  }
};

CacheConfig config(int layers, int experts, int k, int slots) {
  CacheConfig c;
  c.n_layers = layers;
  c.n_experts = experts;
  c.top_k = k;
  c.slots_per_layer = slots;
  return c;
}

int admit(ExpertCache& c, int layer, int e) {
  bool ok = false;
  const int v = c.admit(layer, e, &ok);
  EXPECT_TRUE(ok) << "admit " << e;
  return v;
}

TEST(RuntimeCache, LruByHand) {
  auto c = ExpertCache::make(CacheKind::kLru, config(1, 6, 1, 2));
  c->on_routing(Step(0, 1, 6, {0}).r);  // tick 1
  EXPECT_EQ(admit(*c, 0, 0), -1);
  EXPECT_EQ(c->slot_of(0, 0), 0);
  c->on_routing(Step(0, 1, 6, {1}).r);  // tick 2
  EXPECT_EQ(admit(*c, 0, 1), -1);
  EXPECT_EQ(c->slot_of(0, 1), 1);
  c->on_routing(Step(0, 1, 6, {0}).r);  // tick 3: hit, 0 is now the most recent
  EXPECT_TRUE(c->resident(0, 0));
  c->on_routing(Step(0, 1, 6, {2}).r);  // tick 4: 1 (tick 2) is least recent
  EXPECT_EQ(admit(*c, 0, 2), 1);
  EXPECT_EQ(c->slot_of(0, 2), 1);
  EXPECT_FALSE(c->resident(0, 1));
  c->on_routing(Step(0, 1, 6, {3, 0}).r);  // tick 5: 0 protected (routed now)
  EXPECT_EQ(admit(*c, 0, 3), 2);
  c->on_routing(Step(0, 1, 6, {4, 5}).r);  // tick 6: 0 and 3 both at tick 5: lowest id
  EXPECT_EQ(c->priority(0, 0), 5);
  EXPECT_EQ(c->priority(0, 3), 5);
  EXPECT_EQ(c->fetch_capacity(0), 2);
  EXPECT_EQ(admit(*c, 0, 4), 0);
  EXPECT_EQ(admit(*c, 0, 5), 3);
  EXPECT_EQ(c->fetch_capacity(0), 0);  // 4 and 5 are this step's
  bool ok = true;
  EXPECT_EQ(c->admit(0, 1, &ok), -1);
  EXPECT_FALSE(ok);
  EXPECT_EQ(c->residents(0), (std::vector<int>{4, 5}));
  ok = false;
  EXPECT_EQ(c->admit(0, 4, &ok), -1);  // already resident: no-op
  EXPECT_TRUE(ok);
}

TEST(RuntimeCache, LfuByHand) {
  auto c = ExpertCache::make(CacheKind::kLfu, config(1, 4, 2, 2));
  c->on_routing(Step(0, 2, 4, {0, 1, 0, 2}).r);  // freq 2 1 1 0
  admit(*c, 0, 0);
  admit(*c, 0, 1);
  c->on_routing(Step(0, 2, 4, {2, 3}).r);  // freq 2 1 2 1
  EXPECT_EQ(c->priority(0, 2), 2);
  EXPECT_EQ(admit(*c, 0, 2), 1);           // 1 has freq 1 < 2
  EXPECT_EQ(admit(*c, 0, 3), 0);           // 2 is protected: 0 goes
  c->on_routing(Step(0, 2, 4, {1, 3}).r);  // freq 2 2 2 2; 3 protected
  EXPECT_EQ(admit(*c, 0, 1), 2);
  EXPECT_EQ(c->residents(0), (std::vector<int>{1, 3}));
}

TEST(RuntimeCache, PinnedNeverEvicted) {
  auto c = ExpertCache::make(CacheKind::kLru, config(1, 4, 1, 2));
  c->pin(0, 3);
  EXPECT_TRUE(c->pinned(0, 3));
  c->on_routing(Step(0, 1, 4, {0}).r);
  EXPECT_EQ(admit(*c, 0, 0), -1);
  c->on_routing(Step(0, 1, 4, {1}).r);
  EXPECT_EQ(admit(*c, 0, 1), 0);  // 3 is older (never used) but pinned
  EXPECT_TRUE(c->resident(0, 3));
  EXPECT_THROW(c->pin(0, 2), Error);  // no free slot left for a second pin
}

TEST(RuntimeCache, MrsEquation3ByHand) {
  CacheConfig cfg = config(1, 4, 1, 2);  // p = 2 * top_k = 2, alpha 0.5
  auto c = ExpertCache::make(CacheKind::kMrs, cfg);
  c->on_routing(Step(0, 1, 4, {0}, {0.5f, 0.3f, 0.2f, 0.0f}).r);
  // top-2 of s: e0 .5, e1 .3 -> S = .5 * [.5 .3 0 0] = [.25 .15 0 0]
  EXPECT_NEAR(c->priority(0, 0), 0.25, 1e-6);
  EXPECT_NEAR(c->priority(0, 1), 0.15, 1e-6);
  EXPECT_NEAR(c->priority(0, 2), 0.0, 1e-6);  // .2 is not in the top 2
  admit(*c, 0, 0);
  c->on_routing(Step(0, 1, 4, {2}, {0.1f, 0.2f, 0.6f, 0.1f}).r);
  // top-2: e2 .6, e1 .2 -> S = [.125 .175 .3 0]
  EXPECT_NEAR(c->priority(0, 0), 0.125, 1e-6);
  EXPECT_NEAR(c->priority(0, 1), 0.175, 1e-6);
  EXPECT_NEAR(c->priority(0, 2), 0.3, 1e-6);
  admit(*c, 0, 2);
  c->on_routing(Step(0, 1, 4, {1, 3}, {0.4f, 0.4f, 0.1f, 0.1f, 0.0f, 0.2f, 0.2f, 0.6f}).r);
  // batch mean s = [.2 .3 .15 .35]; top-2: e3, e1 -> S = [.0625 .2375 .15 .175]
  EXPECT_NEAR(c->priority(0, 0), 0.0625, 1e-6);
  EXPECT_NEAR(c->priority(0, 1), 0.2375, 1e-6);
  EXPECT_NEAR(c->priority(0, 2), 0.15, 1e-6);
  EXPECT_NEAR(c->priority(0, 3), 0.175, 1e-6);
  EXPECT_EQ(admit(*c, 0, 3), 0);  // lowest S among residents 0 (.0625), 2 (.15)
  EXPECT_EQ(admit(*c, 0, 1), 2);  // 3 is protected

  cfg.mrs_alpha = 0.25;  // S = .25 * TopP(s) + .75 * S
  auto d = ExpertCache::make(CacheKind::kMrs, cfg);
  d->on_routing(Step(0, 1, 4, {0}, {0.5f, 0.3f, 0.2f, 0.0f}).r);
  d->on_routing(Step(0, 1, 4, {2}, {0.1f, 0.2f, 0.6f, 0.1f}).r);
  EXPECT_NEAR(d->priority(0, 0), 0.75 * 0.125, 1e-6);
  EXPECT_NEAR(d->priority(0, 1), 0.25 * 0.2 + 0.75 * 0.075, 1e-6);
}

TEST(RuntimeCache, DaliWindowByHand) {
  CacheConfig cfg = config(1, 4, 1, 2);
  cfg.dali_w_size = 2;
  cfg.dali_u_size = 1;
  auto c = ExpertCache::make(CacheKind::kDali, cfg);
  c->on_routing(Step(0, 1, 4, {0, 1}).r);  // window [1 1 0 0]
  EXPECT_TRUE(c->wanted(0).empty());       // not at a window boundary
  admit(*c, 0, 0);
  admit(*c, 0, 1);
  c->on_routing(Step(0, 1, 4, {2, 2}).r);  // window [1 1 2 0]; boundary: 2 beats 0 (1)
  EXPECT_EQ(c->priority(0, 2), 2);
  EXPECT_EQ(c->wanted(0), (std::vector<int>{2}));
  EXPECT_EQ(admit(*c, 0, 2), 0);           // 0 and 1 tie at 1: lowest id
  c->on_routing(Step(0, 1, 4, {3, 1}).r);  // step 1 leaves the window: [0 1 2 1]
  EXPECT_EQ(c->priority(0, 0), 0);
  EXPECT_EQ(c->priority(0, 1), 1);
  EXPECT_EQ(c->priority(0, 3), 1);
  EXPECT_TRUE(c->wanted(0).empty());
  c->on_routing(Step(0, 1, 4, {3, 3}).r);  // [0 1 0 3]; boundary: 3 beats 2 (0)
  EXPECT_EQ(c->priority(0, 2), 0);
  EXPECT_EQ(c->priority(0, 3), 3);
  EXPECT_EQ(c->wanted(0), (std::vector<int>{3}));
  EXPECT_EQ(admit(*c, 0, 3), 2);
}

TEST(RuntimeCache, GlobalPoolEvictsAcrossLayers) {
  CacheConfig cfg = config(2, 4, 1, 1);
  cfg.global_pool = true;
  auto c = ExpertCache::make(CacheKind::kLru, cfg);
  EXPECT_EQ(c->n_slots(), 2);
  c->on_routing(Step(0, 1, 4, {0}).r);
  admit(*c, 0, 0);
  c->on_routing(Step(1, 1, 4, {0}).r);
  admit(*c, 1, 0);  // the pool's second slot, though layer 1 has "1 slot per layer"
  const int slot = c->slot_of(0, 0);
  c->on_routing(Step(1, 1, 4, {1}).r);
  EXPECT_EQ(admit(*c, 1, 1), 0);  // layer 0's expert 0 is the least recent in the pool
  EXPECT_EQ(c->last_evicted_layer(), 0);
  EXPECT_EQ(c->slot_of(1, 1), slot);
  EXPECT_TRUE(c->resident(1, 0));
}

TEST(RuntimeCache, NoneAdmitsNothing) {
  auto c = ExpertCache::make(CacheKind::kNone, config(1, 4, 1, 2));
  c->pin(0, 1);
  c->on_routing(Step(0, 1, 4, {2}).r);
  bool ok = true;
  EXPECT_EQ(c->admit(0, 2, &ok), -1);
  EXPECT_FALSE(ok);
  EXPECT_TRUE(c->resident(0, 1));
  EXPECT_EQ(c->fetch_capacity(0), 0);
}

TEST(RuntimeCache, BadArguments) {
  EXPECT_THROW(parse_choice<CacheKind>("arc"), Error);
  EXPECT_THROW(ExpertCache::make(CacheKind::kLru, config(1, 4, 1, 5)), Error);
  EXPECT_THROW(ExpertCache::make(CacheKind::kLru, config(0, 4, 1, 2)), Error);
  auto c = ExpertCache::make(CacheKind::kLru, config(1, 4, 1, 2));
  bool ok = false;
  EXPECT_THROW(c->admit(0, 4, &ok), Error);
  EXPECT_THROW(c->on_routing(Step(1, 1, 4, {0}).r), Error);
}

}  // namespace
}  // namespace tandem::rt
