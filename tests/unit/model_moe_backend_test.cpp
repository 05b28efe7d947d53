// CpuMoeBackend against a direct per-token formula: out[t] = sum_k w[t,k] * down(silu(gate x) *
// up x) of expert ids[t,k]; an expert mask splits the work so that two complementary masks add
// up to the full result (how a hybrid caller divides experts between backends).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "model/moe_backend.h"

namespace tandem {
namespace {

TEST(MoeBackend, MatchesFormulaAndMasksSplitWork) {
  const int64_t ne = 4, h = 32, ff = 16, t = 3, k = 2;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  std::vector<std::vector<float>> gate(ne, std::vector<float>(ff * h)),
      up(ne, std::vector<float>(ff * h)), down(ne, std::vector<float>(h * ff));
  ExpertWeights ew;
  for (int64_t e = 0; e < ne; ++e) {
    for (auto* v : {&gate[e], &up[e], &down[e]}) {
      for (float& x : *v) x = nd(rng);
    }
    ew.gate.push_back(Tensor::dense(DType::kF32, {ff, h}, gate[e].data()));
    ew.up.push_back(Tensor::dense(DType::kF32, {ff, h}, up[e].data()));
    ew.down.push_back(Tensor::dense(DType::kF32, {h, ff}, down[e].data()));
  }
  std::vector<float> x(t * h);
  for (float& v : x) v = nd(rng);
  const std::vector<int32_t> ids = {0, 2, 2, 3, 1, 0};
  const std::vector<float> w = {0.7f, 0.3f, 0.5f, 0.5f, 0.9f, 0.1f};

  std::vector<double> expect(t * h, 0.0);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      const int e = ids[i * k + j];
      std::vector<double> act(ff);
      for (int64_t f = 0; f < ff; ++f) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < h; ++c) {
          g += gate[e][f * h + c] * x[i * h + c];
          u += up[e][f * h + c] * x[i * h + c];
        }
        act[f] = g / (1 + std::exp(-g)) * u;
      }
      for (int64_t c = 0; c < h; ++c) {
        double d = 0;
        for (int64_t f = 0; f < ff; ++f) d += down[e][c * ff + f] * act[f];
        expect[i * h + c] += w[i * k + j] * d;
      }
    }
  }

  CpuMoeBackend backend(nullptr);
  MoeRequest r;
  r.experts = &ew;
  r.hidden = x.data();
  r.n_tokens = t;
  r.hidden_size = h;
  r.ids = ids.data();
  r.weights = w.data();
  r.k = k;
  std::vector<float> full(t * h), a(t * h), b(t * h);
  r.out = full.data();
  backend.submit(r);
  backend.wait();
  const uint8_t mask_a[] = {1, 0, 1, 0}, mask_b[] = {0, 1, 0, 1};
  r.run_here = mask_a;
  r.out = a.data();
  backend.submit(r);
  backend.wait();
  r.run_here = mask_b;
  r.out = b.data();
  backend.submit(r);
  backend.wait();
  for (int64_t i = 0; i < t * h; ++i) {
    EXPECT_NEAR(full[i], expect[i], 1e-5) << i;
    EXPECT_NEAR(a[i] + b[i], full[i], 1e-6) << i;
  }
  // Token 2 only uses experts 1 and 0: mask_b keeps just expert 1's share (weight 0.9).
  EXPECT_NE(a[2 * h], 0.0f);
  EXPECT_NE(b[2 * h], 0.0f);
}

}  // namespace
}  // namespace tandem
