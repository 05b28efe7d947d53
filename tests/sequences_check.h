// What the many-sequences tests (tests/model/batch_forward_test.cpp for every architecture,
// tests/model/hybrid_sequences_test.cpp for the hybrid ones) compare a batch against: logits rows
// in units of the golden F32 tolerance (max |d| <= 1e-4 + 1e-3 max |ref|, tests/data/golden/
// README.md), greedy tokens, each sequence computed alone, and the staggered schedule both run.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "model/kv_cache.h"
#include "model/model.h"

namespace tandem::test {

inline int32_t argmax(const float* x, int64_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

// Max |d| over the row in units of the golden F32 tolerance (<= 1 passes).
inline double tolerance_units(const float* got, const float* ref, int64_t n) {
  double md = 0, mr = 0;
  for (int64_t j = 0; j < n; ++j) {
    md = std::max(md, std::fabs(static_cast<double>(got[j]) - ref[j]));
    mr = std::max(mr, std::fabs(static_cast<double>(ref[j])));
  }
  return md / (1e-4 + 1e-3 * mr);
}

// n token ids drawn uniformly from [0, vocab).
inline std::vector<int32_t> random_tokens(std::mt19937& rng, int64_t n, int64_t vocab) {
  std::uniform_int_distribution<int32_t> u(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& t : v) t = u(rng);
  return v;
}

// A sequence computed alone: the logits row after its prompt, then after each of `steps` greedy
// tokens, and those tokens.
struct SoloRun {
  std::vector<std::vector<float>> rows;
  std::vector<int32_t> greedy;
};

// `prompt` alone on `model` (its first `first_chunk` tokens in a forward of their own when > 0),
// then `steps` greedy tokens.
inline SoloRun run_solo(Model& model, const std::vector<int32_t>& prompt, int steps,
                        size_t first_chunk = 0) {
  const int64_t nv = model.config().vocab_size;
  SingleSequence s(model, static_cast<int64_t>(prompt.size()) + steps + 1);
  SoloRun r;
  std::vector<float> row(static_cast<size_t>(nv));
  if (first_chunk > 0) {
    s.forward(std::span<const int32_t>(prompt.data(), first_chunk), row.data(), false);
  }
  s.forward(std::span<const int32_t>(prompt.data() + first_chunk, prompt.size() - first_chunk),
            row.data(), false);
  for (int i = 0;; ++i) {
    r.rows.push_back(row);
    r.greedy.push_back(argmax(row.data(), nv));
    if (i == steps) break;
    s.forward(std::span<const int32_t>(&r.greedy.back(), 1), row.data(), false);
  }
  return r;
}

// The staggered schedule over 20 steps: sequence i < n_seq (of at most 8) starts at step
// start[i] with its whole prompt, then decodes steps[i] greedy tokens and is released; sequence 3
// instead prefills its first `first_chunk` tokens (no logits) one step earlier, beside the others'
// decode tokens. Every row must be within `max_units` of the tolerance (0: bit for bit) of
// solo[i]'s and give its greedy token; at the end every block (and state slot) is free again.
// Returns the worst row's tolerance units.
inline double check_staggered(Model& model, KvCache& cache,
                              const std::vector<std::vector<int32_t>>& prompts,
                              const std::vector<SoloRun>& solo, const int* start, const int* steps,
                              int n_seq, size_t first_chunk, double max_units) {
  const int64_t nv = model.config().vocab_size;
  double worst = 0;
  std::vector<SeqId> id(8, -1);
  std::vector<int> done(8, -1);  // logits rows compared so far; -1: not started
  std::vector<int32_t> next(8, 0);
  for (int step = 0; step < 20; ++step) {
    std::vector<SeqTokens> batch;
    std::vector<int> who;
    for (int i = 0; i < n_seq; ++i) {
      const auto& p = prompts[static_cast<size_t>(i)];
      if (i == 3 && step == start[i]) {  // the first chunk of a prompt: no logits
        id[i] = cache.create();
        batch.push_back(
            {id[i], std::span<const int32_t>(p.data(), first_chunk), -1, LogitRows::kNone});
        continue;
      }
      if (step == start[i] + (i == 3 ? 1 : 0)) {
        if (id[i] < 0) id[i] = cache.create();
        const size_t from = i == 3 ? first_chunk : 0;
        batch.push_back({id[i], std::span<const int32_t>(p.data() + from, p.size() - from)});
        who.push_back(i);
        done[i] = 0;
      } else if (done[i] > 0 && done[i] <= steps[i]) {
        batch.push_back({id[i], std::span<const int32_t>(&next[i], 1)});
        who.push_back(i);
      }
    }
    if (batch.empty()) continue;
    std::vector<float> logits(who.size() * static_cast<size_t>(nv));
    EXPECT_EQ(model.forward(batch, cache, logits.data()), static_cast<int64_t>(who.size()));
    for (size_t j = 0; j < who.size(); ++j) {
      const int i = who[j];
      const float* row = logits.data() + j * static_cast<size_t>(nv);
      const auto& want = solo[static_cast<size_t>(i)].rows[static_cast<size_t>(done[i])];
      const double u = tolerance_units(row, want.data(), nv);
      worst = std::max(worst, u);
      EXPECT_LE(u, max_units) << "N " << n_seq << " sequence " << i << " row " << done[i];
      next[i] = argmax(row, nv);
      EXPECT_EQ(next[i], solo[static_cast<size_t>(i)].greedy[static_cast<size_t>(done[i])])
          << "N " << n_seq << " sequence " << i << " row " << done[i];
      if (::testing::Test::HasFailure()) return worst;
      if (++done[i] > steps[i]) cache.release(id[i]);
    }
  }
  for (int i = 0; i < n_seq; ++i) EXPECT_GT(done[i], steps[i]) << "sequence " << i;
  EXPECT_EQ(cache.blocks_free(), cache.blocks_total());
  if (cache.has_state()) {
    EXPECT_EQ(cache.state_slots_free(), cache.state_slots());
  }
  return worst;
}

}  // namespace tandem::test
