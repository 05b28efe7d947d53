// Decode steps replayed from graphs against the same steps run op by op, on any device's forward
// ops (the host device's in tests/model/step_graph_test.cpp, the CUDA device's in
// tests/gpu/cuda_device_test.cpp): two Models over the same weights, one with
// ModelOptions::graphs, run one schedule -- sequences prefilled, then greedy decode steps of 1 to
// 8 sequences in a changing order, sequences released and new prompts prefilled between them (which
// grows the ops' buffers: the graphs captured before are stale), then the same on a second cache
// -- and every logits row must be equal bit for bit, the graphed model having replayed most
// decode steps.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "model/kv_cache.h"
#include "model/model.h"

namespace tandem::test {

// Every logits row the schedule produces on `model` (seed: the prompts and the batch orders).
inline std::vector<float> run_step_schedule(Model& model, KvCache& cache, uint32_t seed,
                                            int steps) {
  const int64_t nv = model.config().vocab_size;
  std::mt19937 rng(seed);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  struct Live {
    SeqId id;
    int32_t next;
  };
  std::vector<Live> live;
  std::vector<float> rows, row(static_cast<size_t>(nv));
  auto argmax = [&](const float* x) {
    return static_cast<int32_t>(std::max_element(x, x + nv) - x);
  };
  auto start = [&] {
    std::vector<int32_t> prompt(static_cast<size_t>(pick(3, 40)));
    for (int32_t& t : prompt) t = static_cast<int32_t>(pick(0, nv - 1));
    const SeqId id = cache.create();
    const SeqTokens e{id, prompt};
    model.forward(std::span<const SeqTokens>(&e, 1), cache, row.data());
    rows.insert(rows.end(), row.begin(), row.end());
    live.push_back({id, argmax(row.data())});
  };
  for (int i = 0; i < 8; ++i) start();
  const int sizes[] = {1, 1, 1, 2, 2, 3, 8, 8, 5, 1, 8, 4, 4, 6, 7, 2, 8, 1};
  for (int step = 0; step < steps; ++step) {
    if (step % 6 == 5) {  // one sequence done, a new prompt prefilled
      const size_t i = static_cast<size_t>(pick(0, static_cast<int64_t>(live.size()) - 1));
      cache.release(live[i].id);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      start();
    }
    const int b = sizes[step % (sizeof(sizes) / sizeof(sizes[0]))];
    std::shuffle(live.begin(), live.end(), rng);
    std::vector<SeqTokens> batch;
    for (int i = 0; i < b; ++i) {
      batch.push_back({live[static_cast<size_t>(i)].id,
                       std::span<const int32_t>(&live[static_cast<size_t>(i)].next, 1)});
    }
    std::vector<float> out(static_cast<size_t>(b * nv));
    EXPECT_EQ(model.forward(batch, cache, out.data()), b);
    rows.insert(rows.end(), out.begin(), out.end());
    for (int i = 0; i < b; ++i) live[static_cast<size_t>(i)].next = argmax(out.data() + i * nv);
  }
  for (const Live& l : live) cache.release(l.id);
  return rows;
}

// graphed (ModelOptions::graphs) and eager (not) over the same weights and device.
inline void check_step_graphs(Model& graphed, Model& eager, const KvCacheOptions& cache_options) {
  constexpr int kSteps = 30;
  int64_t replayed = 0;
  // The second round repeats the schedule on caches of their own, made with the first round's
  // before it starts: the device's memory does not move between the rounds (the same buffers
  // suffice), so only the change of cache can drop the graphs; the first caches stay alive at
  // other addresses, so a graph kept across the change computes on them, and is caught (the host
  // device binds the cache into a graph as CUDA binds pointers).
  std::vector<std::unique_ptr<KvCache>> caches;
  for (int i = 0; i < 2; ++i) {
    caches.push_back(
        std::make_unique<KvCache>(graphed.kv_layout(), graphed.cache_options(cache_options)));
    caches.push_back(
        std::make_unique<KvCache>(eager.kv_layout(), eager.cache_options(cache_options)));
  }
  for (uint32_t round = 0; round < 2; ++round) {
    KvCache& a = *caches[2 * round];
    KvCache& b = *caches[2 * round + 1];
    const std::vector<float> got = run_step_schedule(graphed, a, 31, kSteps);
    const std::vector<float> want = run_step_schedule(eager, b, 31, kSteps);
    ASSERT_EQ(got.size(), want.size());
    int64_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], 4) != 0;
    EXPECT_EQ(differ, 0) << "round " << round << ": logits differing from the op-by-op run";
    // Each batch size's first step runs op by op, and a prefill every 6 steps grows buffers.
    EXPECT_GE(graphed.graph_stats().replayed - replayed, kSteps / 3) << "round " << round;
    replayed = graphed.graph_stats().replayed;
  }
  EXPECT_GE(graphed.graph_stats().captured, 8);
  EXPECT_EQ(eager.graph_stats().replayed, 0);
  EXPECT_EQ(eager.graph_stats().captured, 0);
}

}  // namespace tandem::test
