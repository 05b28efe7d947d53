// Token sampling from one row of logits, in llama.cpp's order: logit biases and the penalties on
// tokens already in the context (repetition, presence, frequency) change the logits; then greedy
// (temperature 0: argmax, lowest id on ties) or top-k -> top-p -> min-p -> temperature -> a draw
// from a seeded generator, so a run with a given seed is reproducible.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace tandem {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy; negative or not finite: refused
  int top_k = 0;             // 0: all
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off; keep tokens with p >= min_p * p_max
  uint64_t seed = 0;
  // Penalties on the last `penalty_last_n` tokens of the context (the prompt's and the generated
  // ones; -1: all of them, 0: off). repeat_penalty (CTRL's, llama.cpp's --repeat-penalty): a
  // present token's positive logit divided by it, a negative one multiplied; presence and
  // frequency (OpenAI's): logit -= presence_penalty for a present token and frequency_penalty
  // per occurrence.
  float repeat_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int penalty_last_n = 64;
  // Added to a token's logit before anything else (-infinity: never sampled).
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// Error(kInvalidArgument) naming the flag for a value outside its range (NaN included);
// n_vocab > 0 also checks the logit biases' token ids.
void check_sampling_params(const SamplingParams& params, int64_t n_vocab = 0);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);  // checks params
  const SamplingParams& params() const { return params_; }
  // context: the tokens before this one, oldest first (only the penalties read it).
  int32_t sample(const float* logits, int64_t n_vocab, std::span<const int32_t> context = {});

 private:
  // logits with the biases and penalties applied (into adjusted_), or logits as they are.
  const float* adjust(const float* logits, int64_t n_vocab, std::span<const int32_t> context);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;  // (logit, then probability; id)
  std::vector<float> adjusted_;
  std::vector<std::pair<int32_t, int32_t>> counts_;  // (token, occurrences) of the context window
};

int32_t argmax_token(const float* logits, int64_t n_vocab);

}  // namespace tandem
