// The simulator's accounting on a tiny hand-made trace whose hits, copies, bytes and latencies
// are computed by hand below (LRU cache, 2 slots per layer, 4 experts, top-2, 2 MoE layers, three
// decode steps), plus --cache-size parsing and a sweep's sanity (more cache, more hits).
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "runtime/cost_model.h"
#include "runtime/sim.h"
#include "runtime/trace.h"
#include "runtime/trace_synth.h"

namespace tandem::rt {
namespace {

// cpu(n) = 10 ms + 1 ms n, accel(n) = 1 ms + 0.1 ms n, transfer 4 ms.
CostModel hand_cost() {
  return CostModel::from_linear(0.010, 0.001, 0.001, 0.0001, 0.004);
}

// Batches (one decode token each): layer 0 / layer 1 experts.
//   b0: {0,1} / {2,3}    b1: {0,2} / {2,3}    b2: {3,1} / {0,2}
// Gate predictions at layer 0 favour expert 2, then 3, then 1 (the last one wrong).
Trace hand_trace() {
  Trace t;
  t.model = "hand";
  t.n_layers = 2;
  t.n_experts = 4;
  t.top_k = 2;
  t.has_gate_pred = true;
  const int ids[3][2][2] = {{{0, 1}, {2, 3}}, {{0, 2}, {2, 3}}, {{3, 1}, {0, 2}}};
  const int favoured[3] = {2, 3, 1};
  for (int b = 0; b < 3; ++b) {
    const int64_t r = t.add_record(b, TracePhase::kDecode, b);
    for (int l = 0; l < 2; ++l) {
      for (int j = 0; j < 2; ++j) {
        t.ids_at(r, l)[j] = ids[b][l][j];
        t.weights_at(r, l)[j] = j == 0 ? 0.6f : 0.4f;
      }
    }
    for (int e = 0; e < 4; ++e) t.gate_pred[(r * 2 + 0) * 4 + e] = e == favoured[b] ? 0.7f : 0.1f;
  }
  return t;
}

TEST(RuntimeSim, FiddlerLruAccountingByHand) {
  SimOptions o;
  o.policy = PolicyKind::kFiddler;  // fetch when 4 + 1.1 ms < 11 ms: every uncached expert of 1 token
  o.cache = CacheKind::kLru;
  o.cache_size = "50%";
  o.expert_bytes = 1000;
  o.warm = false;  // start empty
  const SimResult r = simulate(hand_trace(), hand_cost(), o);
  EXPECT_EQ(r.slots_per_layer, 2);
  const SimPhaseStats& d = r.decode;
  EXPECT_EQ(r.prefill.tokens, 0);
  EXPECT_EQ(d.batches, 3);
  EXPECT_EQ(d.layer_calls, 6);
  EXPECT_EQ(d.activated, 12);
  // b0: nothing cached; b1 l0: 0 cached (1 evicted for 2); b1 l1: 2, 3; b2 l0: none (cache
  // {0,2}); b2 l1: 2 (0 evicts 3).
  EXPECT_EQ(d.hits, 4);
  EXPECT_EQ(d.fetched, 8);
  EXPECT_EQ(d.bytes, 8000u);
  EXPECT_EQ(d.on_accel, 12);
  // Two copies: 4 ms, 5.1 ms (+1.1), then 8 ms -> 9.1 ms. One resident + one copy: 5.1 ms. Two
  // resident: 2.2 ms.  b0: 9.1 + 9.1, b1: 5.1 + 2.2, b2: 9.1 + 5.1.
  EXPECT_NEAR(d.seconds, 0.0397, 1e-9);
  EXPECT_NEAR(d.layer_seconds[0], 0.0091 + 0.0051 + 0.0091, 1e-9);
  EXPECT_NEAR(d.layer_seconds[1], 0.0091 + 0.0022 + 0.0051, 1e-9);
  EXPECT_NEAR(d.cpu_seconds, 0.0, 1e-12);
  EXPECT_NEAR(d.accel_seconds, 12 * 0.0011, 1e-9);
  EXPECT_NEAR(d.link_seconds, 8 * 0.004, 1e-9);
  EXPECT_NEAR(d.hit_rate(), 4.0 / 12, 1e-12);
}

TEST(RuntimeSim, StaticWithGatePrefetchByHand) {
  SimOptions o;
  o.policy = PolicyKind::kStatic;  // resident experts on the accelerator, the rest on the CPU, no fetch
  o.cache = CacheKind::kLru;
  o.cache_size = "2";
  o.prefetch = PrefetchKind::kGate;
  o.prefetch_size = 1;
  o.expert_bytes = 1000;
  o.warm = false;  // start empty
  const SimResult r = simulate(hand_trace(), hand_cost(), o);
  const SimPhaseStats& d = r.decode;
  // Prefetched for layer 1: 2 in b0 (used), 3 in b1 (a free slot; used). In b2 the favoured
  // expert 1 is not copied: both residents (2, 3) were routed in layer 1's latest step and the
  // cache protects them (fetch_capacity 0). b2's layer 1 then finds 2 resident.
  EXPECT_EQ(d.prefetched, 2);
  EXPECT_EQ(d.prefetch_used, 2);
  EXPECT_EQ(d.hits, 4);  // b0: 2, b1: 2 and 3, b2: 2
  EXPECT_EQ(d.fetched, 0);
  EXPECT_EQ(d.bytes, 2000u);
  // Layer 0 always 2 CPU experts (22 ms; the 4 ms prefetch hides under it); layer 1: b0 one
  // CPU expert (11 ms) beside one accelerator expert, b1 two accelerator experts (2.2 ms), b2
  // one CPU expert (11 ms) beside one accelerator expert.
  EXPECT_NEAR(d.layer_seconds[0], 3 * 0.022, 1e-9);
  EXPECT_NEAR(d.layer_seconds[1], 0.011 + 0.0022 + 0.011, 1e-9);
  EXPECT_NEAR(d.seconds, 3 * 0.022 + 0.011 + 0.0022 + 0.011, 1e-9);
  EXPECT_NEAR(d.cpu_seconds, 3 * 0.022 + 2 * 0.011, 1e-9);
  EXPECT_NEAR(d.accel_seconds, 4 * 0.0011, 1e-9);
  EXPECT_NEAR(d.prefetch_accuracy(), 1.0, 1e-12);
  EXPECT_NEAR(d.link_seconds, 2 * 0.004, 1e-9);
}

TEST(RuntimeSim, CacheSizeParsingAndMissingPredictions) {
  EXPECT_EQ(parse_cache_size("25%", 64), 16);
  EXPECT_EQ(parse_cache_size("75%", 6), 5);  // 4.5 rounds to 5
  EXPECT_EQ(parse_cache_size("3", 8), 3);
  EXPECT_THROW(parse_cache_size("9", 8), Error);
  EXPECT_THROW(parse_cache_size("x%", 8), Error);
  EXPECT_THROW(parse_cache_size("120%", 8), Error);
  Trace t = hand_trace();
  SimOptions o;
  o.prefetch = PrefetchKind::kResidual;
  EXPECT_THROW(simulate(t, hand_cost(), o), Error);
}

TEST(RuntimeSim, MoreCacheMoreHitsOnSkewedTraces) {
  SynthTraceOptions so;
  so.n_layers = 3;
  so.n_experts = 32;
  so.top_k = 4;
  so.skew = 1.0;
  so.locality = 0.3;
  so.prefill_tokens = 16;
  so.decode_steps = 200;
  const Trace t = synth_trace(so);
  double last = -1;
  for (const char* size : {"0", "25%", "50%", "75%", "100%"}) {
    SimOptions o;
    o.policy = PolicyKind::kFiddler;
    o.cache = CacheKind::kLru;
    o.cache_size = size;
    o.warm = false;
    const double hit = simulate(t, hand_cost(), o).decode.hit_rate();
    EXPECT_GE(hit, last) << size;
    last = hit;
  }
  EXPECT_GT(last, 0.9);  // everything fits: only cold misses
}

// A warm start fills each layer with its most used experts: static placement at 100% never
// misses, at 25% it hits at least the top quarter's share of the selections.
TEST(RuntimeSim, WarmStartHoldsThePopularExperts) {
  SynthTraceOptions so;
  so.n_layers = 2;
  so.n_experts = 16;
  so.top_k = 2;
  so.skew = 1.2;
  so.decode_steps = 100;
  const Trace t = synth_trace(so);
  SimOptions o;
  o.policy = PolicyKind::kStatic;
  o.cache = CacheKind::kLru;
  o.cache_size = "100%";
  SimResult r = simulate(t, hand_cost(), o);
  EXPECT_EQ(r.decode.hits, r.decode.activated);
  EXPECT_EQ(r.decode.bytes, 0u);
  o.cache_size = "25%";
  r = simulate(t, hand_cost(), o);
  // Static placement = each layer's 4 most used experts over the whole trace (ties: lowest id).
  // A decode batch is one token, so its hit rate = the share of decode selections in that set.
  const auto counts = expert_counts(t);
  int64_t in_top = 0, total = 0;
  for (int l = 0; l < 2; ++l) {
    std::vector<int> order(16);
    for (int e = 0; e < 16; ++e) order[size_t(e)] = e;
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return counts[l][a] > counts[l][b]; });
    for (int64_t rec = 0; rec < t.size(); ++rec) {
      if (t.phase[rec] != uint8_t(TracePhase::kDecode)) continue;
      for (int j = 0; j < 2; ++j, ++total) {
        in_top +=
            std::find(order.begin(), order.begin() + 4, t.ids_at(rec, l)[j]) != order.begin() + 4;
      }
    }
  }
  EXPECT_EQ(r.decode.activated, total);
  EXPECT_EQ(r.decode.hits, in_top);
  EXPECT_GT(double(in_top) / double(total), 0.25);  // skew 1.2: well above a uniform quarter
  EXPECT_EQ(r.decode.fetched, 0);
}

}  // namespace
}  // namespace tandem::rt
