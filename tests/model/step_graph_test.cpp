// Decode steps as graphs on the host device (Model's graph per batch size, the forward ops'
// stage / capture / replay, the MoE layers' host functions as the graph's host nodes): the same
// logits, bit for bit, as the same steps run op by op, over GQA with q / k norms (qwen3moe
// Q4_K_M), MLA (deepseek3 Q4_K_M), sinks and sliding windows (gpt-oss), biases and the shared
// expert gate (qwen2moe) and the demo model; an error inside a replayed step surfaces from
// forward() with the cache as it was, and the model keeps working.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "moe/fused_moe.h"
#include "runtime/dense_weights.h"
#include "runtime/device.h"
#include "tests/step_graph_check.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

ThreadingContext& threading() {
  static ThreadingContext ctx(ThreadingOptions{2, false, 50});
  return ctx;
}

std::unique_ptr<rt::Device> host_device() {
  rt::HostDeviceOptions ho;
  ho.memory_bytes = uint64_t{256} << 20;
  ho.threads = 1;
  ho.link = rt::parse_link("none");
  return rt::make_host_device(ho);
}

// The dense part of lm on dev and every routed expert on `moe` (the MoE layers in the device's
// stream order), with or without graphs.
std::unique_ptr<Model> device_model(const LoadedModel& lm, rt::Device* dev,
                                    std::shared_ptr<const rt::DenseWeights> w, MoeBackend* moe,
                                    bool graphs) {
  ModelOptions mo;
  mo.pool = &threading().pool();
  mo.moe = moe;
  mo.graphs = graphs;
  mo.ops = [dev, w](const LoadedModel&, const ForwardOpsOptions& o) {
    return dev->forward_ops(w, o);
  };
  auto m = std::make_unique<Model>(lm, mo);
  EXPECT_EQ(m->ops().name(), "host");
  return m;
}

class StepGraphs : public ::testing::TestWithParam<std::string> {};

TEST_P(StepGraphs, ReplaysEqualTheStepsRunOpByOp) {
  const LoadedModel lm = load_model(test::data_path(GetParam()));
  auto dev = host_device();
  auto w = rt::upload_dense_weights(*dev, lm, true);  // the shared experts too
  FusedMoeBackend moe_a(&threading().pool()), moe_b(&threading().pool());
  ASSERT_TRUE(moe_a.runs_in_host_callbacks());
  const auto graphed = device_model(lm, dev.get(), w, &moe_a, true);
  const auto eager = device_model(lm, dev.get(), w, &moe_b, false);
  KvCacheOptions o;
  o.positions = 64 * 16;
  o.max_sequence_positions = 192;
  test::check_step_graphs(*graphed, *eager, o);
}

INSTANTIATE_TEST_SUITE_P(Models, StepGraphs,
                         ::testing::Values("golden/qwen3moe-q4_k_m.gguf",
                                           "golden/deepseek3-q4_k_m.gguf", "golden/gpt-oss.gguf",
                                           "golden/qwen2moe.gguf",
                                           "demo/tandem-demo-moe-Q4_K_M.gguf"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string s = info.param;
                           for (char& c : s) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return s;
                         });

// The fused operator, failing its submit while `fail` is set (inside a replayed step: a host
// function of the graph).
class FailingMoe final : public MoeBackend {
 public:
  explicit FailingMoe(ThreadPool* pool) : inner_(pool) {}
  void submit(const MoeRequest& r) override {
    if (fail) throw Error(ErrorKind::kInternal, "the experts failed");
    inner_.submit(r);
  }
  void wait() override {
    if (!fail) inner_.wait();
  }
  bool adds_slot_rows() const override { return inner_.adds_slot_rows(); }
  bool runs_in_host_callbacks() const override { return true; }
  bool fail = false;

 private:
  FusedMoeBackend inner_;
};

TEST(StepGraphs, AnErrorInAReplayedStepLeavesTheCacheAsItWas) {
  const LoadedModel lm = load_model(test::data_path("golden/qwen3moe-q4_k_m.gguf"));
  auto dev = host_device();
  auto w = rt::upload_dense_weights(*dev, lm, true);
  FailingMoe moe(&threading().pool());
  FusedMoeBackend plain(&threading().pool());
  const auto graphed = device_model(lm, dev.get(), w, &moe, true);
  const auto eager = device_model(lm, dev.get(), w, &plain, false);
  KvCacheOptions o;
  o.positions = 256;
  KvCache a(graphed->kv_layout(), graphed->cache_options(o));
  KvCache b(eager->kv_layout(), eager->cache_options(o));
  const std::vector<int32_t> prompt = {1, 453, 386, 332, 341};
  const SeqId sa = a.create(), sb = b.create();
  const int64_t nv = lm.config.vocab_size;
  std::vector<float> ra(static_cast<size_t>(nv)), rb(ra.size());
  const SeqTokens pa{sa, prompt}, pb{sb, prompt};
  graphed->forward(std::span<const SeqTokens>(&pa, 1), a, ra.data());
  eager->forward(std::span<const SeqTokens>(&pb, 1), b, rb.data());
  auto step = [&](Model& m, KvCache& c, SeqId s, int32_t t, float* row) {
    const SeqTokens e{s, std::span<const int32_t>(&t, 1)};
    return m.forward(std::span<const SeqTokens>(&e, 1), c, row);
  };
  for (int32_t t : {7, 8, 9}) {  // op by op, captured, replayed
    step(*graphed, a, sa, t, ra.data());
    step(*eager, b, sb, t, rb.data());
  }
  ASSERT_EQ(graphed->graph_stats().replayed, 2);
  moe.fail = true;
  try {
    step(*graphed, a, sa, 10, ra.data());
    FAIL() << "the experts' error did not surface";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the experts failed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.length(sa), 8);
  moe.fail = false;
  step(*graphed, a, sa, 10, ra.data());
  step(*eager, b, sb, 10, rb.data());
  EXPECT_EQ(ra, rb);
  EXPECT_EQ(graphed->graph_stats().replayed, 3);
}

}  // namespace
}  // namespace tandem
