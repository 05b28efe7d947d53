// Token sampling from one row of logits: greedy (temperature <= 0: argmax, lowest id on ties)
// or top-k -> top-p -> min-p -> temperature -> a draw from a seeded generator, so a run with a
// given seed is reproducible.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace tandem {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy; negative or not finite: refused
  int top_k = 0;             // 0: all
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off; keep tokens with p >= min_p * p_max
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(const float* logits, int64_t n_vocab);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;  // (logit, then probability; id)
};

int32_t argmax_token(const float* logits, int64_t n_vocab);

}  // namespace tandem
