// Decode steps as graphs on the host device (Model's graph per batch size, the forward ops'
// stage / capture / replay, the MoE layers' host functions as the graph's host nodes): the same
// logits, bit for bit, as the same steps run op by op, over GQA with q / k norms (qwen3moe
// Q4_K_M), MLA (deepseek3 Q4_K_M), sparse MLA (deepseek32 Q4_K_M: decode steps past index_topk
// select their positions inside the replayed attention), sinks and sliding windows (gpt-oss),
// biases and the shared expert gate (qwen2moe) and the demo model; an error inside a replayed step surfaces from
// forward() with the cache as it was, and the model keeps working; a step whose capture fails runs
// op by op.
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
  mo.forward.pool = &threading().pool();
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
                                           "golden/deepseek3-q4_k_m.gguf",
                                           "golden/deepseek32-q4_k_m.gguf", "golden/gpt-oss.gguf",
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

// A device's forward ops whose attention refuses to be captured (as CUDA's does for a shape its
// split kernels cannot run): everything else passes through.
class UncapturableOps final : public ForwardOps {
 public:
  explicit UncapturableOps(std::unique_ptr<ForwardOps> inner) : in_(std::move(inner)) {}
  std::string name() const override { return in_->name(); }
  float* buffer(int slot, int64_t count) override { return in_->buffer(slot, count); }
  KvCacheOptions cache_options(KvCacheOptions o) const override { return in_->cache_options(o); }
  void check_cache(const KvCache& c) const override { in_->check_cache(c); }
  void begin_step(const ForwardStep& step, KvCache& cache) override {
    step_tokens_ = step.n_tokens();
    in_->begin_step(step, cache);
  }
  void embed(float* x) override { in_->embed(x); }
  void norm(Norm w, int64_t l, const float* x, int64_t n, float* out) override {
    in_->norm(w, l, x, n, out);
  }
  void add(float* out, const float* a, int64_t count) override { in_->add(out, a, count); }
  void fill_zero(float* out, int64_t count) override { in_->fill_zero(out, count); }
  void attention(int64_t layer, const float* x, float* out) override {
    if (capturing_ && step_tokens_ == 3) {
      ++failed_captures;
      throw Error(ErrorKind::kUnsupported, "not capturable");
    }
    in_->attention(layer, x, out);
  }
  void dense_ffn(int64_t l, const float* x, int64_t n, float* out) override {
    in_->dense_ffn(l, x, n, out);
  }
  void shared_ffn(int64_t l, const float* x, int64_t n, float* out) override {
    in_->shared_ffn(l, x, n, out);
  }
  void router(int64_t l, const float* x, int64_t n, float* out) override {
    in_->router(l, x, n, out);
  }
  const float* host_view(const float* x, int64_t count, std::vector<float>* staging) override {
    return in_->host_view(x, count, staging);
  }
  void add_from_host(float* out, const float* host, int64_t count) override {
    in_->add_from_host(out, host, count);
  }
  bool stream_ordered() const override { return in_->stream_ordered(); }
  float* host_buffer(HostSlot slot, int64_t count) override { return in_->host_buffer(slot, count); }
  void copy_to_host(const float* x, int64_t count, float* host) override {
    in_->copy_to_host(x, count, host);
  }
  void host_work(std::function<void()> fn) override { in_->host_work(std::move(fn)); }
  void lm_head(const std::vector<int64_t>& rows, const float* x, float* logits) override {
    in_->lm_head(rows, x, logits);
  }
  void finish() override { in_->finish(); }
  ForwardOpsProfile profile() const override { return in_->profile(); }
  bool graphs() const override { return in_->graphs(); }
  void stage(const ForwardStep& step, KvCache& cache) override {
    step_tokens_ = step.n_tokens();
    in_->stage(step, cache);
  }
  uint64_t memory_epoch() const override { return in_->memory_epoch(); }
  void begin_capture() override {
    in_->begin_capture();
    capturing_ = true;
  }
  int end_capture() override {
    capturing_ = false;
    return in_->end_capture();
  }
  void launch_graph(int g) override { in_->launch_graph(g); }
  void drop_graph(int g) override { in_->drop_graph(g); }
  void lm_head_to_host(const std::vector<int64_t>& rows, const float* x, float* host) override {
    in_->lm_head_to_host(rows, x, host);
  }
  int failed_captures = 0;

 private:
  std::unique_ptr<ForwardOps> in_;
  bool capturing_ = false;
  int64_t step_tokens_ = 0;
};

UncapturableOps& ops_of(const Model& m) {
  return const_cast<UncapturableOps&>(dynamic_cast<const UncapturableOps&>(m.ops()));
}

// A step whose capture fails runs op by op, that batch size stays so (with a warning), the
// others are captured; every row as the steps run op by op.
TEST(StepGraphs, AFailedCaptureLeavesItsBatchSizeOpByOp) {
  const LoadedModel lm = load_model(test::data_path("golden/qwen3moe-q4_k_m.gguf"));
  auto dev = host_device();
  auto w = rt::upload_dense_weights(*dev, lm, true);
  rt::Device* d = dev.get();
  FusedMoeBackend moe_a(&threading().pool()), moe_b(&threading().pool());
  ModelOptions mo;
  mo.forward.pool = &threading().pool();
  mo.moe = &moe_a;
  mo.ops = [d, w](const LoadedModel&, const ForwardOpsOptions& o) {
    return std::make_unique<UncapturableOps>(d->forward_ops(w, o));
  };
  Model graphed(lm, mo);
  const auto eager = device_model(lm, d, w, &moe_b, false);
  KvCacheOptions o;
  o.positions = 64 * 16;
  KvCache a(graphed.kv_layout(), graphed.cache_options(o));
  KvCache b(eager->kv_layout(), eager->cache_options(o));
  const std::vector<float> got = test::run_step_schedule(graphed, a, 5, 30);
  const std::vector<float> want = test::run_step_schedule(*eager, b, 5, 30);
  EXPECT_EQ(got, want);
  EXPECT_EQ(ops_of(graphed).failed_captures, 1);  // (size 3's second step; never again)
  EXPECT_GE(graphed.graph_stats().captured, 7);   // (every other size)
  EXPECT_GT(graphed.graph_stats().replayed, 10);
}

}  // namespace
}  // namespace tandem
