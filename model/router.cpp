#include "model/router.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "ops/cpu/ref_ops.h"

namespace tandem {

void router_scores(const ModelConfig& c, const float* logits, float* scores) {
  const int64_t ne = c.n_experts;
  std::copy(logits, logits + ne, scores);
  if (c.scoring == ScoringFunc::kSigmoid) {
    for (int64_t e = 0; e < ne; ++e) scores[e] = 1.0f / (1.0f + std::exp(-scores[e]));
  } else {
    ops::softmax(scores, ne);
  }
}

void route_token(const ModelConfig& c, const float* logits, const float* bias, int32_t* ids,
                 float* weights, std::vector<float>& scratch) {
  const int64_t ne = c.n_experts;
  const int64_t k = c.n_experts_per_tok;
  scratch.resize(static_cast<size_t>(2 * ne));
  float* scores = scratch.data();
  float* choice = scratch.data() + ne;
  router_scores(c, logits, scores);
  for (int64_t e = 0; e < ne; ++e) choice[e] = scores[e] + (bias != nullptr ? bias[e] : 0.0f);

  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (c.n_group > 1 && c.topk_method != TopkMethod::kGreedy) {
    const int64_t per = ne / c.n_group;
    TD_CHECK(c.n_group <= 256 && ne % c.n_group == 0, "bad expert groups {} / {}", c.n_group, ne);
    float group_score[256];
    for (int64_t g = 0; g < c.n_group; ++g) {
      const float* s = choice + g * per;
      if (c.topk_method == TopkMethod::kNoauxTc) {
        float a = kNegInf, b = kNegInf;  // the two largest
        for (int64_t i = 0; i < per; ++i) {
          if (s[i] > a) {
            b = a;
            a = s[i];
          } else if (s[i] > b) {
            b = s[i];
          }
        }
        group_score[g] = per > 1 ? a + b : a;
      } else {
        group_score[g] = *std::max_element(s, s + per);
      }
    }
    bool keep[256] = {};
    for (int64_t sel = 0; sel < c.topk_group; ++sel) {
      int64_t best = -1;
      for (int64_t g = 0; g < c.n_group; ++g) {
        if (!keep[g] && (best < 0 || group_score[g] > group_score[best])) best = g;
      }
      keep[best] = true;
    }
    for (int64_t e = 0; e < ne; ++e) {
      if (!keep[e / per]) choice[e] = kNegInf;
    }
  }
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < ne; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || ids[i] == e;
      if (!taken && (best < 0 || choice[e] > choice[best])) best = e;
    }
    ids[j] = static_cast<int32_t>(best);
    weights[j] = scores[best];
  }
  if (c.norm_topk_prob && k > 1) {
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += weights[j];
    for (int64_t j = 0; j < k; ++j) weights[j] /= sum;
  }
  for (int64_t j = 0; j < k; ++j) weights[j] *= c.routed_scaling_factor;
}

}  // namespace tandem
