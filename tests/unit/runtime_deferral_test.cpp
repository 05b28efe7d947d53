// Expert Deferral: the slot split by hand, the wrapper's bookkeeping on a recording backend, and
// on golden tiny models the whole decode against a direct synchronous computation of
// O_k = I_k + S_k(I_k) + R_{k-1}^def(I_{k-1}) + R_k^imm(I_k); --defer 0 equals no wrapper bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "model/model.h"
#include "model/weights.h"
#include "ops/cpu/ref_ops.h"
#include "runtime/deferral.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

TEST(Deferral, SplitPicksLowestWeightsKeepsOrder) {
  const int32_t ids[4] = {7, 3, 5, 1};
  const float w[4] = {0.4f, 0.1f, 0.3f, 0.2f};
  int32_t ii[4], di[4];
  float iw[4], dw[4];
  rt::split_deferred(ids, w, 4, 2, ii, iw, di, dw);
  EXPECT_EQ(ii[0], 7);
  EXPECT_EQ(ii[1], 5);
  EXPECT_EQ(di[0], 3);  // router slot order kept among the deferred ones
  EXPECT_EQ(di[1], 1);
  EXPECT_FLOAT_EQ(dw[0], 0.1f);
  EXPECT_FLOAT_EQ(dw[1], 0.2f);
}

TEST(Deferral, SplitTiesDeferLaterSlotAndClamps) {
  const int32_t ids[3] = {2, 4, 6};
  const float w[3] = {0.5f, 0.25f, 0.25f};
  int32_t ii[3], di[3];
  float iw[3], dw[3];
  rt::split_deferred(ids, w, 3, 1, ii, iw, di, dw);
  EXPECT_EQ(di[0], 6);
  EXPECT_EQ(ii[0], 2);
  EXPECT_EQ(ii[1], 4);
  rt::split_deferred(ids, w, 3, 9, ii, iw, di, dw);  // clamped to k - 1 = 2
  EXPECT_EQ(ii[0], 2);
  EXPECT_EQ(di[0], 4);
  EXPECT_EQ(di[1], 6);
}

// Records requests; out[t][0] = sum of weights * (id + 1), so sums are checkable by hand.
class RecordingBackend : public MoeBackend {
 public:
  void submit(const MoeRequest& r) override {
    ks.push_back(r.k);
    moe.push_back(r.moe_index);
    std::fill(r.out, r.out + r.n_tokens * r.hidden_size, 0.0f);
    for (int64_t t = 0; t < r.n_tokens; ++t)
      for (int64_t j = 0; j < r.k; ++j)
        r.out[t * r.hidden_size] += r.weights[t * r.k + j] * (r.ids[t * r.k + j] + 1) *
                                    r.hidden[t * r.hidden_size];
  }
  void wait() override {}
  std::vector<int64_t> ks, moe;
};

TEST(Deferral, WrapperAddsPreviousLayersDeferredPart) {
  RecordingBackend imm, def;
  rt::DeferringMoeBackend b(&imm, &def, 1);
  const int32_t ids[2] = {0, 1};
  const float w[2] = {0.75f, 0.25f};
  float hidden[2] = {1.0f, 0.0f}, out[2];
  MoeRequest r;
  r.n_moe_layers = 3;
  r.single_token = true;
  r.hidden = hidden;
  r.n_tokens = 1;
  r.hidden_size = 2;
  r.ids = ids;
  r.weights = w;
  r.k = 2;
  r.out = out;
  float expect_prev_def = 0;
  for (int64_t layer = 0; layer < 3; ++layer) {
    r.moe_index = layer;
    hidden[0] = static_cast<float>(layer + 1);
    b.submit(r);
    hidden[0] = -100.0f;  // the model reuses its buffer: the deferred part must have copied it
    b.wait();
    const float x = static_cast<float>(layer + 1);
    const float imm_part = layer < 2 ? 0.75f * 1 * x : 0.75f * x + 0.25f * 2 * x;
    EXPECT_FLOAT_EQ(out[0], imm_part + expect_prev_def) << "layer " << layer;
    expect_prev_def = layer < 2 ? 0.25f * 2 * x : 0.0f;
  }
  EXPECT_EQ(imm.ks, (std::vector<int64_t>{1, 1, 2}));  // last MoE layer: all experts
  EXPECT_EQ(def.ks, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(b.stats().deferred_requests, 2);
  // Prefill is never split.
  r.single_token = false;
  r.moe_index = 0;
  b.submit(r);
  b.wait();
  EXPECT_EQ(imm.ks.back(), 2);
  EXPECT_EQ(def.ks.size(), 2u);
}

ThreadPool& pool() {
  static ThreadingContext ctx(ThreadingOptions{2, false, 50});
  return ctx.pool();
}

// Expert Deferral computed directly: one token at a time, every expert through ops::matmul,
// remembering the previous MoE layer's input and deferred slots.
class FormulaBackend : public MoeBackend {
 public:
  explicit FormulaBackend(int n_defer) : n_defer_(n_defer) {}
  void submit(const MoeRequest& r) override {
    const int64_t h = r.hidden_size;
    std::vector<float> out(r.n_tokens * h, 0.0f);
    const bool split = n_defer_ > 0 && r.single_token && r.moe_index < r.n_moe_layers - 1;
    std::vector<Sel> next_def;
    for (int64_t t = 0; t < r.n_tokens; ++t) {
      std::vector<int64_t> order(r.k);  // slots by weight ascending, later slot first on ties
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        const float wa = r.weights[t * r.k + a], wb = r.weights[t * r.k + b];
        return wa != wb ? wa < wb : a > b;
      });
      const int64_t nd = split ? std::min<int64_t>(n_defer_, r.k - 1) : 0;
      std::vector<bool> is_def(r.k, false);
      for (int64_t i = 0; i < nd; ++i) is_def[order[i]] = true;
      for (int64_t j = 0; j < r.k; ++j) {
        const Sel s{r.ids[t * r.k + j], r.weights[t * r.k + j], t};
        if (is_def[j]) {
          next_def.push_back(s);
        } else {
          add_expert(*r.experts, s, r.hidden, h, out.data());
        }
      }
    }
    if (r.moe_index > 0) {
      for (const Sel& s : def_) add_expert(*prev_experts_, s, prev_hidden_.data(), h, out.data());
    }
    def_ = next_def;
    prev_experts_ = r.experts;
    prev_hidden_.assign(r.hidden, r.hidden + r.n_tokens * h);
    std::copy(out.begin(), out.end(), r.out);
  }
  void wait() override {}

 private:
  struct Sel {
    int32_t id;
    float w;
    int64_t token;
  };
  static void add_expert(const ExpertWeights& ex, const Sel& s, const float* hidden, int64_t h,
                         float* out) {
    const int64_t ff = ex.gate[s.id].rows();
    std::vector<float> g(ff), u(ff), d(h);
    const float* x = hidden + s.token * h;
    ops::matmul(ex.gate[s.id], x, 1, g.data(), nullptr);
    ops::matmul(ex.up[s.id], x, 1, u.data(), nullptr);
    ops::swiglu(g.data(), u.data(), ff, g.data());
    ops::matmul(ex.down[s.id], g.data(), 1, d.data(), nullptr);
    for (int64_t i = 0; i < h; ++i) out[s.token * h + i] += s.w * d[i];
  }
  int n_defer_;
  std::vector<Sel> def_;
  const ExpertWeights* prev_experts_ = nullptr;
  std::vector<float> prev_hidden_;
};

struct Decode {
  std::vector<float> logits;  // every decode step's logits
  std::vector<int32_t> tokens;
};

Decode decode(const LoadedModel& lm, MoeBackend* moe, int steps) {
  ModelOptions mo;
  mo.forward.pool = &pool();
  mo.moe = moe;
  Model model_net(lm, mo);
  SingleSequence model(model_net, 64);
  const int64_t nv = lm.config.vocab_size;
  std::vector<int32_t> prompt = {1, 453, 386, 332, 341};
  std::vector<float> last(nv);
  model.forward(prompt, last.data(), false);
  Decode d;
  for (int i = 0; i < steps; ++i) {
    const int32_t next = static_cast<int32_t>(std::max_element(last.begin(), last.end()) -
                                              last.begin());
    d.tokens.push_back(next);
    model.forward(std::span<const int32_t>(&next, 1), last.data(), false);
    d.logits.insert(d.logits.end(), last.begin(), last.end());
  }
  return d;
}

class DeferralModel : public ::testing::TestWithParam<std::string> {};

TEST_P(DeferralModel, MatchesFormulaAndDeferZeroIsExact) {
  const LoadedModel lm = load_model(test::data_path("golden/" + GetParam() + ".gguf"));
  const int steps = 6;
  CpuMoeBackend plain(&pool());
  const Decode base = decode(lm, &plain, steps);
  {  // --defer 0: the wrapper is a pass-through, bit for bit
    CpuMoeBackend a(&pool()), b(&pool());
    rt::DeferringMoeBackend w(&a, &b, 0);
    const Decode d = decode(lm, &w, steps);
    EXPECT_EQ(d.tokens, base.tokens);
    ASSERT_EQ(d.logits.size(), base.logits.size());
    EXPECT_EQ(0, std::memcmp(d.logits.data(), base.logits.data(), d.logits.size() * 4));
  }
  const int64_t k = lm.config.n_experts_per_tok;
  for (int n_defer = 1; n_defer < k + 1; ++n_defer) {  // k: clamped to k - 1
    FormulaBackend f(n_defer);
    const Decode want = decode(lm, &f, steps);
    CpuMoeBackend a(&pool()), b(&pool());
    rt::DeferringMoeBackend w(&a, &b, n_defer);
    const Decode got = decode(lm, &w, steps);
    EXPECT_EQ(got.tokens, want.tokens) << "defer " << n_defer;
    double worst = 0, max_ref = 0, moved = 0;
    for (size_t i = 0; i < want.logits.size(); ++i) {
      worst = std::max(worst, double(std::fabs(got.logits[i] - want.logits[i])));
      max_ref = std::max(max_ref, double(std::fabs(want.logits[i])));
      moved = std::max(moved, double(std::fabs(want.logits[i] - base.logits[i])));
    }
    EXPECT_LE(worst, 1e-4 * max_ref + 1e-5) << GetParam() << " defer " << n_defer;
    EXPECT_GT(moved, 1e-3 * max_ref) << "deferral should change the logits";
    EXPECT_EQ(w.stats().deferred_requests, steps);  // 2 MoE layers: only the first defers
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, DeferralModel,
                         ::testing::Values("mixtral", "qwen2moe", "deepseek3"));

}  // namespace
}  // namespace tandem
