// MoE routers on hand-made logits: softmax top-k with and without renormalization, DeepSeek-V2
// group-limited greedy, DeepSeek-V3 noaux_tc (bias for selection only, group top-2 sums,
// renormalization, routed_scaling_factor).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/router.h"

namespace tandem {
namespace {

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> w;
};

Routed route(const ModelConfig& c, const std::vector<float>& logits, const float* bias = nullptr) {
  Routed r{std::vector<int32_t>(c.n_experts_per_tok), std::vector<float>(c.n_experts_per_tok)};
  std::vector<float> scratch;
  route_token(c, logits.data(), bias, r.ids.data(), r.w.data(), scratch);
  return r;
}

TEST(Router, SoftmaxTopK) {
  ModelConfig c;
  c.n_experts = 4;
  c.n_experts_per_tok = 2;
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, 2.0f};  // tie 1/3: lowest id first
  const double z = 1 + 2 * std::exp(2.0) + std::exp(1.0);
  Routed r = route(c, logits);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3}));
  EXPECT_NEAR(r.w[0], std::exp(2.0) / z, 1e-6);
  c.norm_topk_prob = true;
  r = route(c, logits);
  EXPECT_NEAR(r.w[0], 0.5, 1e-6);
  EXPECT_NEAR(r.w[1], 0.5, 1e-6);
}

TEST(Router, GroupLimitedGreedy) {
  ModelConfig c;
  c.n_experts = 6;
  c.n_experts_per_tok = 2;
  c.n_group = 3;
  c.topk_group = 1;
  c.topk_method = TopkMethod::kGroupLimitedGreedy;
  c.routed_scaling_factor = 2.0f;
  // Groups {0,1} {2,3} {4,5}: max scores 3, 2.5, 2.9 -> only group 0; its two experts win.
  const std::vector<float> logits = {3.0f, -1.0f, 2.5f, 2.4f, 2.9f, 2.8f};
  Routed r = route(c, logits);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  double z = 0;
  for (float l : logits) z += std::exp(l);
  EXPECT_NEAR(r.w[1], 2.0 * std::exp(-1.0) / z, 1e-6);
}

TEST(Router, NoauxTc) {
  ModelConfig c;
  c.n_experts = 8;
  c.n_experts_per_tok = 2;
  c.n_group = 4;
  c.topk_group = 2;
  c.topk_method = TopkMethod::kNoauxTc;
  c.scoring = ScoringFunc::kSigmoid;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5f;
  auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
  // Expert 6 has the single highest score, but group 3 = {6, 7} sums lower than groups 0 and 1
  // once the bias pulls 7 down; the bias also lifts expert 2 above expert 0 for selection.
  const std::vector<float> logits = {1.0f, 0.9f, 0.8f, 0.85f, -2.0f, -2.0f, 3.0f, -3.0f};
  const std::vector<float> bias = {0.0f, 0.0f, 0.3f, 0.0f, 0.0f, 0.0f, 0.0f, -0.5f};
  Routed r = route(c, logits, bias.data());
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 0}));
  const double s2 = sig(0.8), s0 = sig(1.0);  // weights from the unbiased scores
  EXPECT_NEAR(r.w[0], 2.5 * s2 / (s2 + s0), 1e-6);
  EXPECT_NEAR(r.w[1], 2.5 * s0 / (s2 + s0), 1e-6);
}

}  // namespace
}  // namespace tandem
