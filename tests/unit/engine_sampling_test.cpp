// Sampler: greedy argmax with lowest-id ties, top-k / top-p / min-p truncation, and draws that
// follow the softmax at the given temperature (checked by frequency), reproducible by seed.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "engine/sampling.h"

namespace tandem {
namespace {

SamplingParams params(float temp, int top_k, float top_p, float min_p, uint64_t seed) {
  SamplingParams p;
  p.temperature = temp;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.seed = seed;
  return p;
}

TEST(Sampling, GreedyLowestIdOnTies) {
  Sampler s(SamplingParams{});
  const float logits[] = {0.5f, 2.0f, 2.0f, -1.0f};
  EXPECT_EQ(s.sample(logits, 4), 1);
}

TEST(Sampling, FrequenciesFollowTemperedSoftmax) {
  // p = softmax(logits / T): logits ln(1), ln(3) at T = 1 -> 0.25 / 0.75; at T = 0.5 -> 0.1 / 0.9.
  const float logits[] = {0.0f, std::log(3.0f), -30.0f};
  for (const auto& [temp, p1] : {std::pair{1.0f, 0.75}, std::pair{0.5f, 0.9}}) {
    Sampler s(params(temp, 0, 1.0f, 0.0f, 42));
    int ones = 0;
    const int n = 20000;
    for (int i = 0; i < n; ++i) ones += s.sample(logits, 3) == 1;
    EXPECT_NEAR(ones / double(n), p1, 0.015) << temp;
  }
}

TEST(Sampling, Truncations) {
  const float logits[] = {1.0f, 3.0f, 2.9f, 0.0f};
  // top-k 1 -> always the best.
  Sampler k1(params(2.0f, 1, 1.0f, 0.0f, 1));
  // top-p small -> only the most likely token.
  Sampler p(params(2.0f, 0, 0.1f, 0.0f, 2));
  // min-p 0.9 -> tokens within 90% of the best probability: ids 1 and 2 (e^-0.05 = 0.95).
  Sampler m(params(1.0f, 0, 1.0f, 0.9f, 3));
  bool saw2 = false;
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(k1.sample(logits, 4), 1);
    EXPECT_EQ(p.sample(logits, 4), 1);
    const int32_t t = m.sample(logits, 4);
    EXPECT_TRUE(t == 1 || t == 2) << t;
    saw2 = saw2 || t == 2;
  }
  EXPECT_TRUE(saw2);
}

TEST(Sampling, SeededAndValidated) {
  std::vector<float> logits(64);
  for (int i = 0; i < 64; ++i) logits[i] = std::sin(i * 1.7f);
  Sampler a(params(1.0f, 0, 1.0f, 0.0f, 9)), b(params(1.0f, 0, 1.0f, 0.0f, 9));
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits.data(), 64), b.sample(logits.data(), 64));
  EXPECT_THROW(Sampler(params(1.0f, 0, 0.0f, 0.0f, 0)), Error);
  EXPECT_THROW(Sampler(params(1.0f, -1, 1.0f, 0.0f, 0)), Error);
  // NaN and out-of-range values name their flag.
  for (const auto& [bad, flag] : std::vector<std::pair<SamplingParams, std::string>>{
           {params(NAN, 0, 1.0f, 0.0f, 0), "--temp"},
           {params(-1.0f, 0, 1.0f, 0.0f, 0), "--temp"},
           {params(INFINITY, 0, 1.0f, 0.0f, 0), "--temp"},
           {params(1.0f, 0, NAN, 0.0f, 0), "--top-p"},
           {params(1.0f, 0, 1.0f, NAN, 0), "--min-p"}}) {
    try {
      Sampler x(bad);
      ADD_FAILURE() << flag << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
    }
  }
  SamplingParams pen;
  pen.repeat_penalty = 0.0f;
  EXPECT_THROW(Sampler{pen}, Error);
  pen.repeat_penalty = 1.0f;
  pen.presence_penalty = 3.0f;
  EXPECT_THROW(Sampler{pen}, Error);
  pen.presence_penalty = 0.0f;
  pen.logit_bias = {{5, NAN}};
  EXPECT_THROW(Sampler{pen}, Error);
  pen.logit_bias = {{70, 1.0f}};
  EXPECT_THROW(check_sampling_params(pen, 64), Error);  // outside the vocabulary
}

// Biases and penalties change the logits before the choice, by their formulas: a bias added; a
// token of the last n context tokens divided (positive) or multiplied (negative) by the repeat
// penalty, then lowered by presence + frequency x its count.
TEST(Sampling, BiasesAndPenaltiesFollowTheirFormulas) {
  const float logits[4] = {2.0f, 1.9f, -0.5f, 1.0f};
  SamplingParams p;  // greedy: the choice shows the adjusted maximum
  EXPECT_EQ(Sampler(p).sample(logits, 4), 0);
  p.logit_bias = {{0, -INFINITY}};
  EXPECT_EQ(Sampler(p).sample(logits, 4), 1);  // banned
  p.logit_bias = {{3, 1.5f}};
  EXPECT_EQ(Sampler(p).sample(logits, 4), 3);  // 2.5 > 2.0
  p.logit_bias.clear();
  // Token 0 seen twice, token 1 once: repeat 2 -> 1.0, 0.95; presence 0.1 and frequency 0.3
  // -> 1.0 - 0.1 - 0.6 = 0.3 and 0.95 - 0.1 - 0.3 = 0.55: token 3 (1.0) wins.
  p.repeat_penalty = 2.0f;
  p.presence_penalty = 0.1f;
  p.frequency_penalty = 0.3f;
  p.penalty_last_n = -1;
  const std::vector<int32_t> context = {0, 1, 0};
  EXPECT_EQ(Sampler(p).sample(logits, 4, context), 3);
  // The repeat penalty alone: 1.0, 0.95, -0.5, 1.0, a tie that the lowest id wins.
  p.presence_penalty = p.frequency_penalty = 0.0f;
  EXPECT_EQ(Sampler(p).sample(logits, 4, context), 0);
  // A window of the last token only (token 0): token 1 keeps its 1.9.
  p.penalty_last_n = 1;
  EXPECT_EQ(Sampler(p).sample(logits, 4, context), 1);
  // A negative logit is multiplied: token 2 in the context goes from -0.5 to -1.0 (not -0.25).
  const float neg[2] = {-0.5f, -0.7f};
  SamplingParams q;
  q.repeat_penalty = 2.0f;
  EXPECT_EQ(Sampler(q).sample(neg, 2, std::vector<int32_t>{0}), 1);
}

// A NaN or +inf logit (corrupt weights) is reported, not turned into token 0 by argmax or into a
// broken sort by the sampling path. -inf (a masked token) is a logit like any.
TEST(Sampling, NonFiniteLogitsAreReported) {
  std::vector<float> logits = {0.5f, 2.0f, -INFINITY, 1.0f};
  EXPECT_EQ(argmax_token(logits.data(), 4), 1);
  Sampler greedy(SamplingParams{});
  Sampler drawn(params(1.0f, 0, 1.0f, 0.0f, 3));
  EXPECT_NE(drawn.sample(logits.data(), 4), 2);
  for (const float bad : {std::nanf(""), INFINITY}) {
    logits[3] = bad;
    for (Sampler* s : {&greedy, &drawn}) {
      try {
        s->sample(logits.data(), 4);
        ADD_FAILURE() << "no error for " << bad;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("non-finite logit"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("token 3"), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace tandem
