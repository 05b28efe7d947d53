// `tandem trace`, `tandem calibrate` (and `tandem sim` in runtime_sim_test / below) end to end on
// the golden tiny model: the recorded routing must equal what the library's routing observer sees
// in a direct run, the residual vectors must equal eq. 11 recomputed here from the MoE inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/tokenizer.h"
#include "model/model.h"
#include "model/weights.h"
#include "runtime/calibrate.h"
#include "runtime/cost_model.h"
#include "runtime/moe_runtime.h"
#include "runtime/sim.h"
#include "runtime/trace.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

std::string text_file(const test::TempDir& dir) {
  std::string text;
  const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "then", "ran", "off"};
  for (int i = 0; i < 40; ++i) text += std::string(words[(i * 7 + i / 3) % 10]) + " ";
  std::ofstream(dir / "t.txt") << text;
  return (dir / "t.txt").string();
}

TEST(CliTrace, RecordsWhatTheModelRoutes) {
  test::TempDir dir("trace");
  const std::string model = test::data_path("golden/deepseek2.gguf").string();
  const std::string text = text_file(dir);
  // Residual vectors first; then a trace with them.
  test::CommandResult r = test::run_tandem("calibrate -m " + model + " -f " + text +
                                           " --ctx 16 -o " + (dir / "res.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = test::run_tandem("trace -m " + model + " -f " + text + " --ctx 16 --decode 3 --scores -o " +
                       (dir / "t.trace").string() + " --residuals " + (dir / "res.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const rt::Trace t = rt::read_trace(dir / "t.trace");
  ASSERT_TRUE(t.has_scores && t.has_gate_pred && t.has_residual_pred);

  // The same run through the library: chunks of 13 prompt tokens, 3 greedy steps each.
  const LoadedModel lm = load_model(model);
  std::ifstream in(text);
  const std::string s((std::istreambuf_iterator<char>(in)), {});
  const std::vector<TokenId> tokens = Tokenizer::from_gguf_file(model).encode(s, true);
  std::vector<int32_t> ids;
  std::vector<std::vector<float>> inputs(t.n_layers);  // per MoE layer: the MoE inputs
  std::vector<double> diff;                            // eq. 11 sums, [L-1][H]
  const int64_t H = lm.config.hidden_size;
  // The experts run as the CLI runs them (MoeRuntime, default options and threads), so near-tie
  // routings see the same arithmetic.
  ThreadingContext threading(ThreadingOptions{0, true, 50});
  MoeRuntime moe(lm, BackendOptions{}, threading);
  ModelOptions mo;
  mo.forward.pool = &threading.pool();
  mo.moe = moe.backend();
  mo.on_routing = [&](const RoutingEvent& e) {
    inputs[e.moe_index].insert(inputs[e.moe_index].end(), e.hidden, e.hidden + e.n_tokens * H);
    for (int64_t i = 0; i < e.n_tokens * e.k; ++i) ids.push_back(e.ids[i]);
  };
  Model m_net(lm, mo);
  SingleSequence m(m_net, 16);
  std::vector<float> logits(static_cast<size_t>(lm.config.vocab_size));
  int64_t n_records = 0;
  for (size_t b = 0; b < tokens.size(); b += 13) {
    std::vector<int32_t> chunk(tokens.begin() + long(b),
                               tokens.begin() + long(std::min(tokens.size(), b + 13)));
    m.reset();
    m.forward(chunk, logits.data(), false);
    n_records += int64_t(chunk.size());
    for (int d = 0; d < 3; ++d) {
      const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      m.forward(std::span<const int32_t>(&next, 1), logits.data(), false);
      ++n_records;
    }
  }
  ASSERT_EQ(t.size(), n_records);
  // The observer saw layer-major batches; the trace is record-major: compare per batch.
  size_t at = 0;
  for (const auto& b : rt::trace_batches(t)) {
    for (int l = 0; l < t.n_layers; ++l) {
      for (int64_t rec = b.begin; rec < b.end; ++rec) {
        for (int j = 0; j < t.top_k; ++j) ASSERT_EQ(t.ids_at(rec, l)[j], ids[at++]) << rec;
      }
    }
    for (int64_t rec = b.begin; rec < b.end; ++rec) {
      EXPECT_EQ(t.phase[rec], b.end - b.begin == 1 ? 1 : 0);
      double sum = 0;
      for (int e = 0; e < t.n_experts; ++e) sum += t.scores_at(rec, 1)[e];
      EXPECT_NEAR(sum, 1.0, 1e-4);  // softmax router
      EXPECT_FLOAT_EQ(t.weights_at(rec, 1)[0], t.scores_at(rec, 1)[t.ids_at(rec, 1)[0]]);
    }
  }
  // Calibrate ran prefill-only chunks of 16: eq. 11 from the inputs of a prefill-only run.
  const rt::ResidualVectors res = rt::ResidualVectors::load(dir / "res.json");
  ASSERT_EQ(int(res.vectors.size()), t.n_layers - 1);
  std::vector<std::vector<float>> in2(t.n_layers);
  mo.on_routing = [&](const RoutingEvent& e) {
    in2[e.moe_index].insert(in2[e.moe_index].end(), e.hidden, e.hidden + e.n_tokens * H);
  };
  Model m2_net(lm, mo);
  SingleSequence m2(m2_net, 16);
  for (size_t b = 0; b < tokens.size(); b += 16) {
    std::vector<int32_t> chunk(tokens.begin() + long(b),
                               tokens.begin() + long(std::min(tokens.size(), b + 16)));
    m2.reset();
    m2.forward(chunk, logits.data(), false);
  }
  const int64_t n = int64_t(in2[0].size()) / H;
  EXPECT_EQ(res.tokens, n);
  for (int l = 0; l + 1 < t.n_layers; ++l) {
    for (int64_t h = 0; h < H; h += 7) {
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += in2[l + 1][i * H + h] - in2[l][i * H + h];
      EXPECT_NEAR(res.vectors[l][h], s / n, 1e-4 * (1 + std::fabs(s / n)));
    }
  }
}

TEST(CliTrace, ZeroResidualsPredictLikeTheGate) {
  test::TempDir dir("trace");
  const std::string model = test::data_path("golden/deepseek2.gguf").string();
  const std::string text = text_file(dir);
  test::CommandResult r = test::run_tandem("calibrate -m " + model + " -f " + text + " -o " +
                                           (dir / "res.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  rt::ResidualVectors res = rt::ResidualVectors::load(dir / "res.json");
  for (auto& v : res.vectors) std::fill(v.begin(), v.end(), 0.f);
  res.save(dir / "zero.json");
  r = test::run_tandem("trace -m " + model + " -f " + text + " --chunks 1 --ctx 12 -o " +
                       (dir / "t.trace").string() + " --residuals " + (dir / "zero.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const rt::Trace t = rt::read_trace(dir / "t.trace");
  ASSERT_EQ(t.size(), 12);
  EXPECT_EQ(t.gate_pred, t.residual_pred);
  // The last MoE layer predicts nothing; the others predict a distribution.
  const int64_t E = t.n_experts, L = t.n_layers;
  double sum = 0;
  for (int e = 0; e < E; ++e) {
    sum += t.gate_pred[(3 * L + 0) * E + e];
    EXPECT_EQ(t.gate_pred[(3 * L + L - 1) * E + e], 0.f);
  }
  EXPECT_NEAR(sum, 1.0, 1e-4);
}

TEST(CliTrace, SyntheticImportAndErrors) {
  test::TempDir dir("trace");
  test::CommandResult r = test::run_tandem(
      "trace --synthetic --layers 3 --experts 8 --top-k 2 --prompts 2 --prefill-tokens 5 "
      "--decode-steps 4 --f16 -o " +
      (dir / "s.trace").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("18 records (10 prefill, 8 decode) in 10 batches"), std::string::npos)
      << r.out;
  const rt::Trace t = rt::read_trace(dir / "s.trace");
  EXPECT_EQ(t.n_layers, 3);
  EXPECT_EQ(t.n_experts, 8);
  r = test::run_tandem("trace --import " + test::data_path("demo/traces/decode.json").string() +
                       " -o " + (dir / "d.trace").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(rt::read_trace(dir / "d.trace").size(), 4145);
  r = test::run_tandem("trace --synthetic --top-k 100 -o " + (dir / "x.trace").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("top-k"), std::string::npos) << r.err;
  r = test::run_tandem("trace -o " + (dir / "x.trace").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("-m MODEL"), std::string::npos) << r.err;
  r = test::run_tandem("calibrate -m " + test::data_path("golden/deepseek2.gguf").string() +
                       " -f " + (dir / "missing.txt").string() + " -o " +
                       (dir / "r.json").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("missing.txt"), std::string::npos) << r.err;
}

// `tandem sim` on a synthetic trace: --json equals the library's simulate() with the same
// options and cost model; --sweep lists every combination; bad input names the file / flag.
TEST(CliSim, JsonSweepAndErrors) {
  test::TempDir dir("sim");
  test::CommandResult r = test::run_tandem(
      "trace --synthetic --layers 3 --experts 16 --top-k 2 --skew 1 --prefill-tokens 8 "
      "--decode-steps 40 -o " +
      (dir / "s.trace").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const rt::CostModel cost = rt::CostModel::from_linear(1e-4, 5e-5, 1e-5, 1e-6, 2e-4);
  rt::CostModel c2 = cost;
  c2.expert_bytes = 5000;
  c2.save(dir / "p.json");
  const std::string base =
      "sim --trace " + (dir / "s.trace").string() + " --profile " + (dir / "p.json").string();
  r = test::run_tandem(base +
                       " --policy dali --cache dali --prefetch residual --cache-size 25% --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  rt::SimOptions o;
  o.policy = rt::PolicyKind::kDali;
  o.cache = rt::CacheKind::kDali;
  o.prefetch = rt::PrefetchKind::kResidual;
  o.cache_size = "25%";
  o.expert_bytes = 5000;
  const rt::SimResult lib =
      rt::simulate(rt::read_trace(dir / "s.trace"), rt::CostModel::load(dir / "p.json"), o);
  const auto& d = j.at("results").at(0).at("decode");
  EXPECT_EQ(d.at("hits").get<int64_t>(), lib.decode.hits);
  EXPECT_EQ(d.at("bytes").get<uint64_t>(), lib.decode.bytes);
  EXPECT_EQ(d.at("bytes").get<uint64_t>() % 5000, 0u);
  EXPECT_DOUBLE_EQ(d.at("seconds").get<double>(), lib.decode.seconds);
  EXPECT_EQ(j.at("results").at(0).at("slots_per_layer").get<int>(), 4);
  r = test::run_tandem(base +
                       " --sweep --sweep-policies static,fiddler --sweep-caches lru,mrs "
                       "--sweep-sizes 25%,75% --sweep-prefetch none,gate --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("results").size(), 16u);
  r = test::run_tandem(base + " --cache-size 200%");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--cache-size '200%'"), std::string::npos) << r.err;
  r = test::run_tandem("sim --trace " + (dir / "s.trace").string() + " --profile " +
                       (dir / "none.json").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("none.json"), std::string::npos) << r.err;
}

// `tandem profile`: the expert's bytes from its tensors, the transfer from the link formula
// (bytes / GB/s + latency), CPU times positive per requested token count.
TEST(CliProfile, WritesCostTables) {
  test::TempDir dir("profile");
  const std::string model = test::data_path("golden/deepseek2.gguf").string();
  const test::CommandResult r = test::run_tandem("profile -m " + model +
                                                 " --tokens 1,4,16 --repeats 1 "
                                                 "--link 10,5 -o " +
                                                 (dir / "p.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(dir / "p.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("format"), "tandem-cost-model");
  const LoadedModel lm = load_model(model);
  const LayerWeights* moe = nullptr;
  for (const auto& l : lm.layers) {
    if (l.moe && !moe) moe = &l;
  }
  ASSERT_NE(moe, nullptr);
  uint64_t bytes = 0;
  for (const ops::Weight* w : {&moe->experts.gate[0], &moe->experts.up[0], &moe->experts.down[0]}) {
    bytes += uint64_t(w->t.row_bytes()) * uint64_t(w->rows());
  }
  EXPECT_EQ(j.at("expert_bytes").get<uint64_t>(), bytes);
  EXPECT_NEAR(j.at("transfer_seconds").get<double>(), double(bytes) / 10e9 + 5e-6, 1e-12);
  const auto cpu = j.at("cpu_expert");
  ASSERT_EQ(cpu.size(), 3u);
  EXPECT_EQ(cpu[2][0].get<int>(), 16);
  for (const auto& p : cpu) EXPECT_GT(p[1].get<double>(), 0.0);
  EXPECT_TRUE(j.at("accel_expert").empty());  // --accel none: no accelerator measured
  const test::CommandResult bad =
      test::run_tandem("profile -m " + model + " --link fast -o " + (dir / "q.json").string());
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--link 'fast'"), std::string::npos) << bad.err;
}

// `tandem profile --accel host`: the expert's FFN timed on the emulated device for every token
// count, and the transfer measured through its capped link: at least bytes / bandwidth + latency
// (a lower bound; the emulation may only be slower); then the decode timeline.
TEST(CliProfile, MeasuresTheHostDevice) {
  test::TempDir dir("profile_host");
  const std::string model = test::data_path("golden/deepseek2.gguf").string();
  const test::CommandResult r = test::run_tandem("profile -m " + model +
                                                 " --tokens 1,8 --repeats 1 --accel host "
                                                 "--link 1,50 -o " +
                                                 (dir / "p.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(dir / "p.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  const auto accel = j.at("accel_expert");
  ASSERT_EQ(accel.size(), 2u);
  EXPECT_EQ(accel[1][0].get<int>(), 8);
  for (const auto& p : accel) EXPECT_GT(p[1].get<double>(), 0.0);
  EXPECT_FALSE(j.at("accel").get<std::string>().empty());
  const double bytes = j.at("expert_bytes").get<double>();
  EXPECT_GE(j.at("transfer_seconds").get<double>(), 0.9 * (bytes / 1e9 + 50e-6));
  // Then a short decode through the runtime and where its time went (the default 32 tokens).
  EXPECT_NE(r.out.find("decode timeline (32 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("accelerator busy"), std::string::npos) << r.out;
}

// `tandem profile --trace`: the trace's per-layer expert counts go into the cost model, and
// `--gpu-experts` then pins the most used experts of each layer (the run's summary names the
// experts the cache holds pinned: those, not the 0..N-1 it pins without counts), without the
// "no expert counts" warning.
TEST(CliProfile, ExpertCountsFromATrace) {
  test::TempDir dir("profile_trace");
  const std::string model = test::data_path("golden/deepseek2.gguf").string();
  const std::string text = text_file(dir);
  test::CommandResult r = test::run_tandem("trace -m " + model + " -f " + text +
                                           " --ctx 16 -o " + (dir / "t.trace").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = test::run_tandem("profile -m " + model + " --tokens 1 --repeats 1 --trace " +
                       (dir / "t.trace").string() + " -o " + (dir / "p.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(dir / "p.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("expert_counts").get<std::vector<std::vector<int64_t>>>(),
            rt::expert_counts(rt::read_trace(dir / "t.trace")));
  r = test::run_tandem("run -m " + model + " --tokens 1,2,3 -n 2 --accel host --gpu-experts 2 "
                       "--profile " + (dir / "p.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("no expert counts"), std::string::npos) << r.err;
  // The 2 most used experts of each MoE layer (ties: the lower id), named by model layer.
  const std::vector<std::vector<int64_t>> counts =
      rt::expert_counts(rt::read_trace(dir / "t.trace"));
  const LoadedModel lm = load_model(model);
  std::string want = "(2 pinned: ";
  bool only_default = true;  // the counts must pick other experts than 0 and 1 somewhere
  size_t moe = 0;
  for (size_t l = 0; l < lm.layers.size(); ++l) {
    if (!lm.layers[l].moe) continue;
    ASSERT_LT(moe, counts.size());
    std::vector<int> order(counts[moe].size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return counts[moe][a] > counts[moe][b]; });
    const int lo = std::min(order[0], order[1]), hi = std::max(order[0], order[1]);
    only_default = only_default && lo == 0 && hi == 1;
    want += (moe ? ", layers." : "layers.") + std::to_string(l) + ": " + std::to_string(lo) +
            " " + std::to_string(hi);
    ++moe;
  }
  want += ")";
  EXPECT_FALSE(only_default);
  EXPECT_NE(r.err.find(want), std::string::npos) << want << "\n" << r.err;
  // Without the counts: experts 0 and 1 of each layer, with the warning.
  r = test::run_tandem("run -m " + model + " --tokens 1,2,3 -n 2 --accel host --gpu-experts 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("no expert counts"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(2 pinned: layers.1: 0 1, layers.2: 0 1)"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tandem
