// Expert Deferral's accuracy cost on the trained demo model (KJV text, teacher-forced, one token
// per forward so deferral applies): deferring the N lowest-weight experts must cost less
// perplexity than dropping them (Expert Skipping), as KTransformers §6.3 / Fig. 13 reports.
// Slow label: ~7 passes over 282 tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "core/thread_pool.h"
#include "model/model.h"
#include "runtime/deferral.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

// `tandem tokenize -m tests/data/demo/tandem-demo-moe-Q4_K_M.gguf --ids-only` of Genesis 1:1-8
// and Psalm 23:1-3 (KJV).
const std::vector<int32_t> kIds = {
    1, 1016, 261, 1936, 1292, 394, 282, 570, 285, 261, 764, 270, 261, 639, 2009, 300, 261, 639,
    375, 991, 321, 2000, 2001, 270, 475, 1991, 317, 2014, 270, 1699, 375, 430, 261, 955, 271, 261,
    599, 520, 2009, 300, 261, 1703, 271, 394, 986, 612, 430, 261, 955, 271, 261, 1188, 2009, 300,
    394, 390, 2001, 945, 386, 299, 1064, 2013, 270, 386, 375, 1064, 2009, 300, 394, 850, 261, 1064,
    2001, 303, 358, 375, 691, 2013, 270, 394, 1435, 317, 285, 261, 1064, 405, 261, 1699, 2009, 300,
    394, 801, 261, 1064, 499, 347, 2001, 270, 261, 1699, 312, 801, 500, 447, 2009, 300, 261, 550,
    294, 270, 261, 1342, 431, 261, 828, 437, 2009, 300, 394, 390, 2001, 945, 386, 299, 262, 277,
    343, 2000, 349, 363, 291, 261, 1019, 271, 261, 1188, 2001, 270, 590, 358, 1435, 597, 261, 1188,
    405, 261, 1188, 2009, 300, 394, 546, 261, 277, 343, 2000, 349, 363, 2001, 270, 1435, 317, 285,
    261, 1188, 387, 431, 765, 261, 277, 343, 2000, 349, 363, 405, 261, 1188, 387, 431, 1379, 261,
    277, 343, 2000, 349, 363, 2013, 270, 358, 375, 531, 2009, 300, 394, 801, 261, 277, 343, 2000,
    349, 363, 417, 295, 393, 2009, 300, 261, 550, 294, 270, 261, 1342, 431, 261, 1670, 437, 2009,
    453, 341, 344, 381, 506, 492, 269, 1996, 2014, 298, 315, 350, 268, 477, 2009, 605, 1886, 373,
    293, 1710, 591, 291, 309, 272, 280, 292, 621, 1657, 2013, 312, 305, 909, 404, 373, 1868, 261,
    425, 551, 1188, 2009, 605, 1536, 274, 1507, 381, 855, 2013, 312, 305, 909, 404, 373, 291, 261,
    292, 629, 1993, 271, 1167, 321, 327, 643, 2032, 1993, 1745, 2009, 13,
};

// Expert Skipping: computes only the immediate experts, the deferred ones are dropped.
class SkippingBackend : public MoeBackend {
 public:
  SkippingBackend(MoeBackend* inner, int n) : inner_(inner), n_(n) {}
  void submit(const MoeRequest& r) override {
    MoeRequest q = r;
    if (r.single_token && r.moe_index < r.n_moe_layers - 1) {
      const int64_t ki = r.k - n_;
      ii_.resize(r.n_tokens * ki);
      iw_.resize(ii_.size());
      di_.resize(r.n_tokens * n_);
      dw_.resize(di_.size());
      for (int64_t t = 0; t < r.n_tokens; ++t) {
        rt::split_deferred(r.ids + t * r.k, r.weights + t * r.k, r.k, n_, ii_.data() + t * ki,
                           iw_.data() + t * ki, di_.data() + t * n_, dw_.data() + t * n_);
      }
      q.ids = ii_.data();
      q.weights = iw_.data();
      q.k = ki;
    }
    inner_->submit(q);
  }
  void wait() override { inner_->wait(); }

 private:
  MoeBackend* inner_;
  int n_;
  std::vector<int32_t> ii_, di_;
  std::vector<float> iw_, dw_;
};

double perplexity(const LoadedModel& lm, MoeBackend* moe, ThreadPool* pool) {
  ModelOptions mo;
  mo.forward.pool = pool;
  mo.moe = moe;
  Model m_net(lm, mo);
  SingleSequence m(m_net, 512);
  std::vector<float> logits(lm.config.vocab_size);
  double nll = 0;
  for (size_t i = 0; i + 1 < kIds.size(); ++i) {
    m.forward(std::span<const int32_t>(&kIds[i], 1), logits.data(), false);
    double mx = -1e30, sum = 0;
    for (float v : logits) mx = std::max(mx, double(v));
    for (float v : logits) sum += std::exp(v - mx);
    nll += mx + std::log(sum) - logits[kIds[i + 1]];
  }
  return std::exp(nll / double(kIds.size() - 1));
}

TEST(DeferralQuality, DeferringCostsLessThanSkipping) {
  const LoadedModel lm = load_model(test::data_path("demo/tandem-demo-moe-Q4_K_M.gguf"));
  ThreadingContext ctx(ThreadingOptions{2, false, 50});
  CpuMoeBackend a(&ctx.pool()), b(&ctx.pool());
  const double base = perplexity(lm, &a, &ctx.pool());
  for (int n = 1; n < lm.config.n_experts_per_tok; ++n) {
    rt::DeferringMoeBackend defer(&a, &b, n);
    SkippingBackend skip(&a, n);
    const double pd = perplexity(lm, &defer, &ctx.pool());
    const double ps = perplexity(lm, &skip, &ctx.pool());
    std::printf("top-%lld, %d affected: perplexity %.3f plain, %.3f deferred, %.3f skipped\n",
                (long long)lm.config.n_experts_per_tok, n, base, pd, ps);
    EXPECT_LT(pd, ps) << n;
    EXPECT_NE(pd, base) << n;  // deferral does change the computation
  }
}

}  // namespace
}  // namespace tandem
