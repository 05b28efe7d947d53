// Sampler: greedy argmax with lowest-id ties, top-k / top-p / min-p truncation, and draws that
// follow the softmax at the given temperature (checked by frequency), reproducible by seed.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "engine/sampling.h"

namespace tandem {
namespace {

TEST(Sampling, GreedyLowestIdOnTies) {
  Sampler s(SamplingParams{});
  const float logits[] = {0.5f, 2.0f, 2.0f, -1.0f};
  EXPECT_EQ(s.sample(logits, 4), 1);
}

TEST(Sampling, FrequenciesFollowTemperedSoftmax) {
  // p = softmax(logits / T): logits ln(1), ln(3) at T = 1 -> 0.25 / 0.75; at T = 0.5 -> 0.1 / 0.9.
  const float logits[] = {0.0f, std::log(3.0f), -30.0f};
  for (const auto& [temp, p1] : {std::pair{1.0f, 0.75}, std::pair{0.5f, 0.9}}) {
    Sampler s(SamplingParams{temp, 0, 1.0f, 0.0f, 42});
    int ones = 0;
    const int n = 20000;
    for (int i = 0; i < n; ++i) ones += s.sample(logits, 3) == 1;
    EXPECT_NEAR(ones / double(n), p1, 0.015) << temp;
  }
}

TEST(Sampling, Truncations) {
  const float logits[] = {1.0f, 3.0f, 2.9f, 0.0f};
  // top-k 1 -> always the best.
  Sampler k1(SamplingParams{2.0f, 1, 1.0f, 0.0f, 1});
  // top-p small -> only the most likely token.
  Sampler p(SamplingParams{2.0f, 0, 0.1f, 0.0f, 2});
  // min-p 0.9 -> tokens within 90% of the best probability: ids 1 and 2 (e^-0.05 = 0.95).
  Sampler m(SamplingParams{1.0f, 0, 1.0f, 0.9f, 3});
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
  Sampler a(SamplingParams{1.0f, 0, 1.0f, 0.0f, 9}), b(SamplingParams{1.0f, 0, 1.0f, 0.0f, 9});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits.data(), 64), b.sample(logits.data(), 64));
  EXPECT_THROW(Sampler(SamplingParams{1.0f, 0, 0.0f, 0.0f, 0}), Error);
  EXPECT_THROW(Sampler(SamplingParams{1.0f, -1, 1.0f, 0.0f, 0}), Error);
  // NaN passed every range check written as `x < lo || x > hi` (issue 56).
  const float nan = std::nanf("");
  EXPECT_THROW(Sampler(SamplingParams{nan, 0, 1.0f, 0.0f, 0}), Error);
  EXPECT_THROW(Sampler(SamplingParams{-1.0f, 0, 1.0f, 0.0f, 0}), Error);
  EXPECT_THROW(Sampler(SamplingParams{INFINITY, 0, 1.0f, 0.0f, 0}), Error);
  EXPECT_THROW(Sampler(SamplingParams{1.0f, 0, nan, 0.0f, 0}), Error);
  EXPECT_THROW(Sampler(SamplingParams{1.0f, 0, 1.0f, nan, 0}), Error);
}

// A NaN logit (corrupt weights) made argmax answer token 0 and the text "!!!", and broke the
// sort of the sampling path; it is reported instead. -inf (a masked token) is a logit like any.
TEST(Sampling, NonFiniteLogitsAreReported) {
  std::vector<float> logits = {0.5f, 2.0f, -INFINITY, 1.0f};
  EXPECT_EQ(argmax_token(logits.data(), 4), 1);
  Sampler greedy(SamplingParams{});
  Sampler drawn(SamplingParams{1.0f, 0, 1.0f, 0.0f, 3});
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
