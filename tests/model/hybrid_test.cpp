// The hybrid pipeline end to end on golden tiny models: for every policy x cache x prefetch,
// --accel host (the dense part on the host device's forward ops, the routed experts through
// HybridMoeBackend over the same device) gives the same greedy tokens as the CPU alone, with
// experts really fetched, prefetched and run on the device; with the fused CPU operator inside
// it, the CPU alone's logits bit for bit, quantized models included (the device's experts are
// combined in router slot order among the CPU's); Expert Deferral on top of it equals the
// formula, through the CLI too; and the CLI accepts the flags and rejects bad values by name.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "model/model.h"
#include "model/weights.h"
#include "moe/fused_moe.h"
#include "runtime/calibrate.h"
#include "runtime/deferral.h"
#include "runtime/dense_weights.h"
#include "runtime/device.h"
#include "runtime/hybrid_moe.h"
#include "runtime/placement.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

ThreadingContext& threading() {
  static ThreadingContext ctx(ThreadingOptions{2, false, 50});
  return ctx;
}

struct Decode {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // last position of every forward
};

const std::vector<int32_t> kPrompt = {1, 453, 386, 332, 341, 311, 426, 17};

// ops: where the dense part runs (empty: the CPU).
Decode decode(const LoadedModel& lm, MoeBackend* moe, int steps,
              const std::vector<int32_t>& prompt = kPrompt, ForwardOpsFactory ops = {}) {
  ModelOptions mo;
  mo.forward.pool = &threading().pool();
  mo.moe = moe;
  mo.ops = std::move(ops);
  Model model_net(lm, mo);
  if (mo.ops) {
    EXPECT_EQ(model_net.ops().name(), "host");
  }
  SingleSequence model(model_net, 64);
  std::vector<float> last(lm.config.vocab_size);
  model.forward(prompt, last.data(), false);
  Decode d;
  d.logits = last;
  for (int i = 0; i < steps; ++i) {
    const auto next =
        static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
    d.tokens.push_back(next);
    model.forward(std::span<const int32_t>(&next, 1), last.data(), false);
    d.logits.insert(d.logits.end(), last.begin(), last.end());
  }
  return d;
}

// The dense part of lm on dev (uploaded now, before a hybrid backend sizes its expert cache from
// what is left), as ModelOptions::ops.
ForwardOpsFactory dense_on(rt::Device& dev, const LoadedModel& lm) {
  auto w = rt::upload_dense_weights(dev, lm, false);
  rt::Device* d = &dev;
  return [d, w](const LoadedModel&, const ForwardOpsOptions& o) { return d->forward_ops(w, o); };
}

std::unique_ptr<rt::Device> host_device() {
  rt::HostDeviceOptions ho;
  ho.memory_bytes = uint64_t{32} << 20;
  ho.threads = 1;
  ho.link = rt::parse_link("none");
  return rt::make_host_device(ho);
}

rt::HybridOptions hybrid_options(const std::string& policy, const std::string& cache,
                                 const std::string& prefetch, const std::string& residuals) {
  rt::HybridOptions o;
  o.policy = rt::parse_choice<rt::PolicyKind>(policy);
  o.cache = rt::parse_choice<rt::CacheKind>(cache);
  o.prefetch = rt::parse_choice<rt::PrefetchKind>(prefetch);
  o.gpu_experts = 1;
  o.cache_slots = 2;  // small: eviction and fetches really happen
  o.residuals = residuals;
  o.link_gb_per_s = 0;  // uncapped: moving an expert looks cheap, so fetching policies fetch
  o.link_latency_us = 0;
  return o;
}

class Hybrid : public ::testing::TestWithParam<std::string> {};

TEST_P(Hybrid, EveryPolicyCachePrefetchMatchesCpu) {
  const LoadedModel lm = load_model(test::data_path("golden/" + GetParam() + ".gguf"));
  const int steps = 6;
  CpuMoeBackend plain(&threading().pool());
  const Decode base = decode(lm, &plain, steps);
  // DALI residual vectors for --prefetch residual, calibrated on the prompt.
  test::TempDir dir;
  const auto residuals = dir / "residuals.json";
  {
    rt::ResidualCalibrator cal(lm);
    ModelOptions mo;
    mo.on_routing = [&](const RoutingEvent& e) { cal.on_routing(e); };
    Model m_net(lm, mo);
    SingleSequence m(m_net, 64);
    std::vector<float> logits(lm.config.vocab_size);
    m.forward(kPrompt, logits.data(), false);
    cal.result().save(residuals);
  }
  const rt::Placement placement = rt::resolve_placement(lm, {}, true, "native");
  const char* policies[] = {"static", "fiddler", "hybrimoe", "dali", "optimal"};
  const char* caches[] = {"lru", "lfu", "mrs", "dali", "none"};
  const char* prefetches[] = {"none", "gate", "residual"};
  for (const char* policy : policies) {
    rt::HybridStats sum;
    for (const char* cache : caches) {
      for (const char* prefetch : prefetches) {
        SCOPED_TRACE(
            fmt::format("{} policy {} cache {} prefetch {}", GetParam(), policy, cache, prefetch));
        auto dev = host_device();
        ForwardOpsFactory dense = dense_on(*dev, lm);
        CpuMoeBackend cpu(&threading().pool());
        rt::HybridMoeBackend h(lm, &cpu, dev.get(), placement,
                               hybrid_options(policy, cache, prefetch, residuals.string()));
        const Decode got = decode(lm, &h, steps, kPrompt, dense);
        EXPECT_EQ(got.tokens, base.tokens);
        EXPECT_LE(test::max_rel_diff(got.logits, base.logits), 1e-5);
        const rt::HybridStats& s = h.stats();
        EXPECT_EQ(s.accel_pairs + s.cpu_pairs, (int64_t(kPrompt.size()) + steps) *
                                                   lm.config.n_experts_per_tok *
                                                   int64_t(s.layers / (steps + 1)));
        if (std::string(prefetch) != "none" && std::string(cache) != "none") {
          EXPECT_GT(s.prefetches, 0);
        }
        sum.accel_pairs += s.accel_pairs;
        sum.fetches += s.fetches;
        sum.prefetches += s.prefetches;
        sum.shared_on_accel += s.shared_on_accel;
      }
    }
    std::printf("%s %-8s: %lld pairs on the device, %lld fetches, %lld prefetches\n",
                GetParam().c_str(), policy, (long long)sum.accel_pairs, (long long)sum.fetches,
                (long long)sum.prefetches);
    EXPECT_GT(sum.accel_pairs, 0) << policy;
    if (std::string(policy) != "static") {
      EXPECT_GT(sum.fetches, 0) << policy;
    }
    if (!lm.layers.back().sh_gate.empty()) {
      EXPECT_GT(sum.shared_on_accel, 0);
    }
  }
}

// Expert Deferral computed directly (see runtime_deferral_test.cpp): the previous MoE layer's
// deferred slots on its remembered input, added to this layer's immediate ones.
class FormulaBackend : public MoeBackend {
 public:
  explicit FormulaBackend(int n_defer) : n_defer_(n_defer) {}
  void submit(const MoeRequest& r) override {
    const int64_t h = r.hidden_size;
    std::vector<float> out(r.n_tokens * h, 0.0f);
    const bool split = n_defer_ > 0 && r.single_token && r.moe_index < r.n_moe_layers - 1;
    std::vector<Sel> next_def;
    for (int64_t t = 0; t < r.n_tokens; ++t) {
      std::vector<int64_t> order(r.k);
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
        if (is_def[j])
          next_def.push_back(s);
        else
          add(*r.experts, s, r.hidden, h, out.data());
      }
    }
    if (r.moe_index > 0)
      for (const Sel& s : def_) add(*prev_, s, prev_hidden_.data(), h, out.data());
    def_ = next_def;
    prev_ = r.experts;
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
  static void add(const ExpertWeights& ex, const Sel& s, const float* hidden, int64_t h,
                  float* out) {
    std::vector<float> g, u, d(h);
    ops::swiglu_ffn(ex.gate[s.id], ex.up[s.id], ex.down[s.id], hidden + s.token * h, 1, d.data(),
                    nullptr, &g, &u, ex.extras(s.id));  // (gpt-oss: its biases and clamp)
    for (int64_t i = 0; i < h; ++i) out[s.token * h + i] += s.w * d[i];
  }
  int n_defer_;
  std::vector<Sel> def_;
  const ExpertWeights* prev_ = nullptr;
  std::vector<float> prev_hidden_;
};

TEST_P(Hybrid, DeferralOverHybridMatchesFormula) {
  const LoadedModel lm = load_model(test::data_path("golden/" + GetParam() + ".gguf"));
  const rt::Placement placement = rt::resolve_placement(lm, {}, true, "native");
  for (int n_defer = 1; n_defer < lm.config.n_experts_per_tok; ++n_defer) {
    FormulaBackend f(n_defer);
    const Decode want = decode(lm, &f, 6);
    auto dev = host_device();
    ForwardOpsFactory dense = dense_on(*dev, lm);
    CpuMoeBackend cpu(&threading().pool()), cpu_def(&threading().pool());
    rt::HybridMoeBackend h(lm, &cpu, dev.get(), placement,
                           hybrid_options("hybrimoe", "lru", "gate", ""));
    rt::DeferringMoeBackend d(&h, &cpu_def, n_defer);
    const Decode got = decode(lm, &d, 6, kPrompt, dense);
    EXPECT_EQ(got.tokens, want.tokens) << "defer " << n_defer;
    EXPECT_LE(test::max_rel_diff(got.logits, want.logits), 1e-4) << "defer " << n_defer;
    EXPECT_GT(h.stats().accel_pairs, 0);
  }
}

// The fused operator inside the hybrid backend adds the device's expert rows at their router slots
// among its own (MoeRequest::slot_rows), and the host device computes an expert with the same
// kernels: every policy then gives the logits of the fused operator alone bit for bit, on
// quantized models too, where a sum in another order would drift past the F32 tolerance over the
// layers (the demo model's Q4_K_M did).
TEST(HybridExact, FusedOperatorInsideGivesTheCpuAlonesBits) {
  for (const std::string m :
       {"golden/qwen3moe-q4_k_m.gguf", "golden/deepseek3-q4_k_m.gguf", "golden/qwen2moe.gguf",
        "golden/gpt-oss.gguf", "demo/tandem-demo-moe-Q4_K_M.gguf"}) {
    const LoadedModel lm = load_model(test::data_path(m));
    const int steps = 6;
    FusedMoeOptions alone_options;
    alone_options.shared_experts = true;  // as --accel none runs it
    FusedMoeBackend alone(&threading().pool(), alone_options);
    const Decode base = decode(lm, &alone, steps);
    const rt::Placement placement = rt::resolve_placement(lm, {}, true, "native");
    int64_t device_pairs = 0;
    for (const char* policy : {"static", "fiddler", "hybrimoe", "dali", "optimal"}) {
      SCOPED_TRACE(fmt::format("{} policy {}", m, policy));
      auto dev = host_device();
      ForwardOpsFactory dense = dense_on(*dev, lm);
      FusedMoeBackend cpu(&threading().pool());
      rt::HybridMoeBackend h(lm, &cpu, dev.get(), placement,
                             hybrid_options(policy, "lru", "gate", ""));
      const Decode got = decode(lm, &h, steps, kPrompt, dense);
      EXPECT_EQ(got.tokens, base.tokens);
      ASSERT_EQ(got.logits.size(), base.logits.size());
      int64_t differ = 0;
      for (size_t i = 0; i < got.logits.size(); ++i) differ += got.logits[i] != base.logits[i];
      EXPECT_EQ(differ, 0) << "max rel diff " << test::max_rel_diff(got.logits, base.logits);
      device_pairs += h.stats().accel_pairs;
    }
    EXPECT_GT(device_pairs, 0) << m;
  }
}

// The dense part and the shared experts on the host device, every routed expert on the fused
// operator (--gpu-experts 0 --cache-slots 0: no hybrid backend): the model runs each MoE layer in
// the device's stream order (routing, submit and wait as host functions, the host never waiting
// inside a forward) and gets the CPU alone's logits bit for bit (with Expert Deferral, within
// F32 rounding).
TEST(OrderedMoe, DeviceOpsAndTheCpuOperatorGiveTheCpuAlonesBits) {
  for (const std::string m :
       {"golden/qwen3moe-q4_k_m.gguf", "golden/deepseek3-q4_k_m.gguf", "golden/qwen2moe.gguf",
        "golden/gpt-oss.gguf", "demo/tandem-demo-moe-Q4_K_M.gguf"}) {
    const LoadedModel lm = load_model(test::data_path(m));
    for (int n_defer : {0, 1}) {
      SCOPED_TRACE(fmt::format("{} defer {}", m, n_defer));
      FusedMoeOptions alone_options;
      alone_options.shared_experts = true;  // as --accel none runs it
      FusedMoeBackend alone(&threading().pool(), alone_options), alone_def(&threading().pool());
      rt::DeferringMoeBackend alone_d(&alone, &alone_def, n_defer);
      const Decode base = decode(lm, &alone_d, 6);

      auto dev = host_device();
      auto w = rt::upload_dense_weights(*dev, lm, true);  // the shared experts too
      rt::Device* d = dev.get();
      ForwardOpsFactory dense = [d, w](const LoadedModel&, const ForwardOpsOptions& o) {
        return d->forward_ops(w, o);
      };
      FusedMoeBackend cpu(&threading().pool()), cpu_def(&threading().pool());
      rt::DeferringMoeBackend deferring(&cpu, &cpu_def, n_defer);
      ASSERT_TRUE(deferring.runs_in_host_callbacks());
      const Decode got = decode(lm, &deferring, 6, kPrompt, dense);
      EXPECT_EQ(got.tokens, base.tokens);
      ASSERT_EQ(got.logits.size(), base.logits.size());
      if (n_defer == 0) {
        int64_t differ = 0;
        for (size_t i = 0; i < got.logits.size(); ++i) differ += got.logits[i] != base.logits[i];
        EXPECT_EQ(differ, 0) << "max rel diff " << test::max_rel_diff(got.logits, base.logits);
      } else {
        // With deferral the shared experts join the sum in another place: (shared + immediate)
        // + deferred on the CPU alone, shared + (immediate + deferred) here.
        EXPECT_LE(test::max_rel_diff(got.logits, base.logits), 1e-5);
      }
      if (n_defer > 0 && lm.config.n_experts_per_tok > 1) {
        EXPECT_GT(deferring.stats().deferred_requests, 0);
      }
    }
  }
}

// --cpu-experts native: the experts' host memory is registered with the device for the copies
// (whole pages, touching ranges merged), the tokens unchanged.
TEST(HybridPinnedExperts, RegistersEveryExpertsBytes) {
  const LoadedModel lm = load_model(test::data_path("golden/deepseek3-q4_k_m.gguf"));
  CpuMoeBackend plain(&threading().pool());
  const Decode base = decode(lm, &plain, 4);
  const rt::Placement placement = rt::resolve_placement(lm, {}, true, "native");
  auto dev = host_device();
  CpuMoeBackend cpu(&threading().pool());
  rt::HybridOptions o = hybrid_options("hybrimoe", "lru", "gate", "");
  o.pin_experts = true;
  rt::HybridMoeBackend h(lm, &cpu, dev.get(), placement, o);
  int64_t expert_bytes = 0, tensors = 0;
  for (const LayerWeights& lw : lm.layers) {
    if (!lw.moe) continue;
    for (size_t e = 0; e < lw.experts.gate.size(); ++e) {
      for (const ops::Weight* w : {&lw.experts.gate[e], &lw.experts.up[e], &lw.experts.down[e]}) {
        expert_bytes += w->t.nbytes();
        ++tensors;
      }
    }
  }
  const int64_t page = sysconf(_SC_PAGESIZE);
  EXPECT_GE(h.stats().pinned_host_bytes, expert_bytes);
  EXPECT_LE(h.stats().pinned_host_bytes, expert_bytes + 2 * page * tensors);
  EXPECT_EQ(h.stats().pinned_host_bytes % page, 0);
  EXPECT_NE(h.summary().find("pinned for copies"), std::string::npos) << h.summary();
  const Decode got = decode(lm, &h, 4);
  EXPECT_EQ(got.tokens, base.tokens);
  EXPECT_GT(h.stats().accel_pairs, 0);
}

// One slot pool shared by all MoE layers: layers evict each other's experts; tokens unchanged.
TEST(HybridGlobalPool, MatchesCpu) {
  const LoadedModel lm = load_model(test::data_path("golden/deepseek3.gguf"));
  const int steps = 6;
  CpuMoeBackend plain(&threading().pool());
  const Decode base = decode(lm, &plain, steps);
  const rt::Placement placement = rt::resolve_placement(lm, {}, true, "native");
  for (const char* policy : {"static", "fiddler", "hybrimoe", "dali"}) {
    for (const char* cache : {"lru", "mrs", "dali"}) {
      SCOPED_TRACE(fmt::format("policy {} cache {} global pool", policy, cache));
      auto dev = host_device();
      CpuMoeBackend cpu(&threading().pool());
      rt::HybridOptions o = hybrid_options(policy, cache, "gate", "");
      o.global_pool = true;
      rt::HybridMoeBackend h(lm, &cpu, dev.get(), placement, o);
      const Decode got = decode(lm, &h, steps);
      EXPECT_EQ(got.tokens, base.tokens);
      EXPECT_LE(test::max_rel_diff(got.logits, base.logits), 1e-5);
      EXPECT_GT(h.stats().accel_pairs, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, Hybrid,
                         ::testing::Values("qwen2moe", "deepseek3", "mixtral", "gpt-oss"));

TEST(HybridCli, RunWithEveryHybridFlag) {
  const std::string model = test::data_path("golden/qwen2moe.gguf").string();
  const std::string base = "run --model " + model + " --tokens 1,453,386,332 -n 6 --temp 0 ";
  const auto cpu = test::run_tandem(base + "--accel none");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  const auto r = test::run_tandem(base +
                                  "--accel host --vram-budget 64M --policy hybrimoe "
                                  "--cache mrs --cache-slots 3 --prefetch gate --gpu-experts 1 "
                                  "--link none --show-placement");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, cpu.out);
  EXPECT_NE(r.err.find("policy hybrimoe"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("layers.1.experts"), std::string::npos) << r.err;
}

// --gpu-experts 0 --cache-slots 0: no hybrid backend, the same tokens as the CPU alone, and the
// decode timeline has both sides (the CPU experts' spans from the model's host functions).
TEST(HybridCli, NoDeviceExpertsRunWithoutTheHybridBackend) {
  const std::string model = test::data_path("golden/deepseek3.gguf").string();
  const std::string base = "run --model " + model + " --tokens 1,453,386,332 -n 6 --temp 0 ";
  const auto cpu = test::run_tandem(base + "--accel none");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  const std::string flags = " --accel host --vram-budget 64M --gpu-experts 0 --cache-slots 0";
  const auto r = test::run_tandem(base + flags);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, cpu.out);
  EXPECT_NE(r.err.find("every routed expert on the CPU operator"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("decode steps replayed as graphs"), std::string::npos) << r.err;
  const auto eager = test::run_tandem(base + flags + " --no-graphs");
  ASSERT_EQ(eager.exit_code, 0) << eager.err;
  EXPECT_EQ(eager.out, cpu.out);
  EXPECT_NE(eager.err.find("decode steps op by op (--no-graphs)"), std::string::npos) << eager.err;
  const auto b = test::run_tandem("bench -m " + model + " -p 8 -n 6 -r 1 --json" + flags);
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const nlohmann::json j = nlohmann::json::parse(b.out);
  const nlohmann::json& tl = j["tests"][1]["timeline"];
  EXPECT_GT(tl["device_busy"].get<double>(), 0.0) << tl.dump();
  EXPECT_GT(tl["cpu_experts_busy"].get<double>(), 0.0) << tl.dump();
  EXPECT_GE(tl["steps_from_graphs"].get<double>(), 0.5)
      << tl.dump();  // (the first of a size: op by op)
  EXPECT_GT(tl["h2d_bytes_per_token"].get<double>(), 0.0) << tl.dump();
  EXPECT_NE(j["backend"].get<std::string>().find("every routed expert on the CPU operator"),
            std::string::npos)
      << j["backend"];
}

// --defer 2 through the CLI generates what the library computes with Expert Deferral (the formula
// backend above, 2 of qwen2moe's 4 experts per token deferred), which is not the plain greedy
// continuation: the flag reaches the model, with the formula's arithmetic.
TEST(HybridCli, DeferralEqualsTheLibrarys) {
  const std::string path = test::data_path("golden/qwen2moe.gguf").string();
  const LoadedModel lm = load_model(path);
  const int steps = 16;
  // A prompt whose greedy continuation deferral changes (from the 4th token on).
  const std::vector<int32_t> tokens = {497, 11, 300, 42, 7, 250, 100, 3};
  FormulaBackend formula(2);
  const Decode want = decode(lm, &formula, steps, tokens);
  CpuMoeBackend plain(&threading().pool());
  const Decode greedy = decode(lm, &plain, steps, tokens);
  ASSERT_NE(want.tokens, greedy.tokens);  // else this prompt could not tell
  const std::string prompt = fmt::format("{}", fmt::join(tokens, ","));
  const std::string ids = fmt::format("{}", fmt::join(want.tokens, " "));
  const std::string base = "run --model " + path + " --tokens " + prompt + " -n " +
                           std::to_string(steps) + " --temp 0 --ignore-eos ";
  const auto d = test::run_tandem(base + "--accel host --vram-budget 64M --defer 2 --link none");
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_NE(d.err.find("Expert Deferral: 2 of 4 experts per token"), std::string::npos) << d.err;
  EXPECT_EQ(d.out, ids + "\n");
  // The same over the CPU backend alone.
  const auto c = test::run_tandem(base + "--accel none --defer 2");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(c.out, ids + "\n");
}

// The dense part goes where the placement says: on the accelerator by default, on the CPU by a
// rule (the same tokens either way, the summary says which); split between the two, an error
// naming both modules and their rules.
TEST(HybridCli, RulesPlaceTheDensePart) {
  const std::string model = test::data_path("golden/qwen2moe.gguf").string();
  const std::string base = "run --model " + model + " --tokens 1,453,386,332 -n 6 --temp 0 ";
  test::TempDir dir;
  const auto dense_cpu = dir / "dense-cpu.yaml", split = dir / "split.yaml";
  {
    std::ofstream(dense_cpu)
        << "- {match: {name: 'embed|lm_head|layers\\.\\d+\\.(attention|ffn)'}, "
           "device: cpu}\n";
    std::ofstream(split) << "- match: {module: attention, name: 'layers\\.1\\..*'}\n"
                            "  device: cpu\n";
  }
  const auto cpu = test::run_tandem(base + "--accel none");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  const auto on_accel = test::run_tandem(base + "--accel host --vram-budget 64M --show-placement");
  ASSERT_EQ(on_accel.exit_code, 0) << on_accel.err;
  EXPECT_EQ(on_accel.out, cpu.out);
  EXPECT_NE(on_accel.err.find("layers.1.attention         attention accel"), std::string::npos)
      << on_accel.err;
  const auto on_cpu = test::run_tandem(base +
                                       "--accel host --vram-budget 64M --show-placement "
                                       "--rules " +
                                       dense_cpu.string());
  ASSERT_EQ(on_cpu.exit_code, 0) << on_cpu.err;
  EXPECT_EQ(on_cpu.out, cpu.out);
  EXPECT_NE(on_cpu.err.find("layers.1.attention         attention cpu"), std::string::npos)
      << on_cpu.err;
  EXPECT_NE(on_cpu.err.find("layers.1.router            router    cpu"), std::string::npos)
      << on_cpu.err;
  const auto bad = test::run_tandem(base + "--accel host --rules " + split.string());
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("layers.1.attention on the cpu"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("runs in one place"), std::string::npos) << bad.err;
}

TEST(HybridCli, BadValuesNameTheFlag) {
  const std::string model = test::data_path("golden/mixtral.gguf").string();
  const std::string base = "run --model " + model + " --tokens 1,453 -n 2 ";
  const std::pair<const char*, const char*> cases[] = {
      {"--accel tpu", "--accel"},
      {"--policy fifo", "--policy"},
      {"--cache arc", "--cache"},
      {"--prefetch all", "--prefetch"},
      {"--defer -1", "--defer"},
      {"--vram-budget 12Q", "--vram-budget"},
      {"--accel cuda", "--accel host"},
      {"--accel host --link warp9", "warp9"},
      {"--cache-slots -5", "--cache-slots"},
      {"--accel host --prefetch residual", "--residuals"},
      {"--accel host --vram-budget 8M --gpu-experts 8", "--gpu-experts"},
      {"--accel host --vram-budget 1M", "the dense part"},
      {"--accel host --vram-budget 1M ", "--vram-budget"},
      {"--rules /nonexistent.yaml", "/nonexistent.yaml"},
  };
  for (const auto& [flags, needle] : cases) {
    const auto r = test::run_tandem(base + flags);
    EXPECT_NE(r.exit_code, 0) << flags;
    EXPECT_NE(r.err.find(needle), std::string::npos) << flags << ": " << r.err;
  }
}

}  // namespace
}  // namespace tandem
