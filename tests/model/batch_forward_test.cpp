// Many sequences in one forward (Model::forward over a KvCache) against each sequence computed
// alone (a SingleSequence of its own): every golden model (GGUF and HF) and the demo model, with
// the reference MoE backend and the fused CPU operator, sequences of different lengths added and
// finished at different steps, prompt chunks beside decode tokens, forks and prefix matches,
// truncate-then-continue, a full pool, and a seeded random schedule. Each logits row must equal
// the sequence's own run bit for bit (the kernels' contract: a row's arithmetic does not depend
// on the other rows of its batch; every case measured exactly 0 of the golden F32 tolerance, and a
// drift below that tolerance would hide a batch-only bug), and each greedy token be identical. The hybrid cases run the batch
// with the dense part on the host device and the experts through the hybrid backend (--accel
// host), against each sequence run alone with --accel none.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/weights.h"
#include "runtime/dense_weights.h"
#include "runtime/device.h"
#include "runtime/moe_runtime.h"
#include "tests/sequences_check.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

ThreadingContext& threading() {
  static ThreadingContext ctx(ThreadingOptions{2, false, 50});
  return ctx;
}

using test::argmax;
using test::random_tokens;
using test::tolerance_units;

struct Case {
  std::string model;    // under tests/data
  std::string backend;  // "reference" (CpuMoeBackend) | "fused" (MoeRuntime, --cpu-experts)
  std::string experts;  // the fused backend's --cpu-experts
  MlaMode mla = MlaMode::kAuto;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.model << " " << c.backend << " " << c.experts;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string s = info.param.model + "_" + info.param.backend + "_" + info.param.experts +
                  (info.param.mla == MlaMode::kNaive ? "_naive" : "");
  for (char& ch : s) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return s;
}

// A loaded model with its MoE backend; `ref` (the hybrid case): the same model on the CPU alone
// (--accel none, the same --cpu-experts), which the sequences run alone are computed on.
struct Net {
  LoadedModel lm;
  std::unique_ptr<MoeRuntime> runtime;
  std::unique_ptr<Model> model;
  std::unique_ptr<Net> ref;
  std::unique_ptr<rt::Device> device;  // the "device" case's, holding the dense part
  int64_t vocab() const { return lm.config.vocab_size; }
  ~Net() {
    model.reset();  // (its ops use the device)
    runtime.reset();
  }
  Net& reference() { return ref ? *ref : *this; }
};

std::unique_ptr<Net> open(const Case& c) {
  auto net = std::make_unique<Net>();
  const auto path = test::data_path(c.model);
  net->lm = load_model(path);
  ModelOptions mo;
  mo.forward.pool = &threading().pool();
  mo.forward.mla = c.mla;
  if (c.backend == "hybrid") {
    // --accel host: the dense part on the host device, the routed experts through the hybrid
    // backend (an expert cache of 2 slots per layer, 1 pinned, prefetch), compared with the CPU.
    BackendOptions bo;
    bo.cpu_experts = c.experts;
    bo.expert_cache = false;
    bo.accel = rt::Accel::kHost;
    bo.vram_budget = "256M";
    bo.link = "none";
    bo.policy = rt::PolicyKind::kHybriMoe;
    bo.prefetch = rt::PrefetchKind::kGate;
    bo.gpu_experts = 1;
    bo.cache_slots = 2;
    net->runtime =
        std::make_unique<MoeRuntime>(net->lm, resolve_backend_options(bo, path), threading());
    net->runtime->apply(&mo);
    net->model = std::make_unique<Model>(net->lm, mo);
    EXPECT_EQ(net->model->ops().name(), "host");
    net->ref = open(Case{c.model, "fused", c.experts, c.mla});  // --accel none
    return net;
  }
  if (c.backend == "fused" || c.backend == "device") {
    BackendOptions bo;
    bo.cpu_experts = c.experts;
    bo.expert_cache = false;
    bo.accel = rt::Accel::kNone;
    net->runtime =
        std::make_unique<MoeRuntime>(net->lm, resolve_backend_options(bo, path), threading());
    net->runtime->apply(&mo);
  }
  if (c.backend == "device") {
    // The dense part alone on the host device (its shared experts too), the routed experts on
    // the CPU operator: the forward ops' seam by itself, whatever the weights' format.
    rt::HostDeviceOptions ho;
    ho.memory_bytes = uint64_t{256} << 20;
    ho.link = rt::parse_link("none");
    net->device = rt::make_host_device(ho);
    rt::Device* dev = net->device.get();
    auto w = rt::upload_dense_weights(*dev, net->lm, true);
    mo.ops = [dev, w](const LoadedModel&, const ForwardOpsOptions& o) {
      return dev->forward_ops(w, o);
    };
    net->model = std::make_unique<Model>(net->lm, mo);
    EXPECT_EQ(net->model->ops().name(), "host");
    net->ref = open(Case{c.model, "fused", c.experts, c.mla});
    return net;
  }
  net->model = std::make_unique<Model>(net->lm, mo);
  return net;
}

// What a sequence went through: chunks fed in turn, truncations between them (truncate >= 0:
// keep that many positions). A chunk's size decides how MLA attends (a quantized model's numbers
// follow it), so a sequence computed alone is compared after the same steps.
struct Step {
  std::vector<int32_t> tokens;
  int64_t truncate = -1;
};
using History = std::vector<Step>;

// A fresh sequence through `history`; every row's logits of its last chunk.
std::vector<float> replay(Net& net, const History& history) {
  int64_t total = 0;
  for (const Step& st : history) total += static_cast<int64_t>(st.tokens.size());
  SingleSequence s(*net.model, std::max<int64_t>(total, 1));
  std::vector<float> rows;
  for (const Step& st : history) {
    if (st.truncate >= 0) {
      s.truncate(st.truncate);
      continue;
    }
    rows.resize(st.tokens.size() * static_cast<size_t>(net.vocab()));
    s.forward(st.tokens, rows.data(), true);
  }
  return rows;
}

class BatchForward : public ::testing::TestWithParam<Case> {};

// N = 1..8 sequences of different prompt lengths, starting at different steps, decoding
// different numbers of tokens (finished sequences released, their blocks reused), one long
// prompt prefilled in two chunks while others decode.
TEST_P(BatchForward, StaggeredSequencesEqualTheirSoloRuns) {
  const std::unique_ptr<Net> net = open(GetParam());
  const int64_t nv = net->vocab();
  const int64_t lengths[8] = {3, 17, 7, 40, 1, 25, 12, 33};
  const int start[8] = {0, 0, 1, 2, 2, 4, 5, 7};
  const int steps[8] = {6, 9, 4, 8, 10, 5, 7, 3};
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<test::SoloRun> solo;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(random_tokens(rng, lengths[i], nv));
    solo.push_back(
        test::run_solo(*net->reference().model, prompts.back(), steps[i], i == 3 ? 25 : 0));
  }
  double worst = 0;
  for (int n_seq = 1; n_seq <= 8; ++n_seq) {
    KvCacheOptions o;
    o.positions = 64 * 8;  // a block each at most: released sequences' blocks are reused
    KvCache cache(net->model->kv_layout(), net->model->cache_options(o));
    worst = std::max(worst, test::check_staggered(*net->model, cache, prompts, solo, start, steps,
                                                  n_seq, 25, 0.0));
    if (HasFailure()) return;
  }
  std::printf("%s: worst %.3g of the F32 tolerance\n", GetParam().model.c_str(), worst);
}

// A fork continues from its parent's positions; a new prompt matched against the live
// sequences continues from the longest shared prefix (across a block boundary and inside a
// block): each gives the logits of its tokens computed from scratch.
TEST_P(BatchForward, ForksAndPrefixMatchesEqualRecomputation) {
  const std::unique_ptr<Net> net = open(GetParam());
  const int64_t nv = net->vocab();
  std::mt19937 rng(11);
  KvCacheOptions o;
  o.positions = 64 * 8;
  KvCache cache(net->model->kv_layout(), net->model->cache_options(o));
  const std::vector<int32_t> p = random_tokens(rng, 90, nv);
  const SeqId a = cache.create();
  std::vector<float> row(static_cast<size_t>(2 * nv));
  const SeqTokens first{a, p};
  net->model->forward(std::span<const SeqTokens>(&first, 1), cache, row.data());
  // Fork, then both decode a different token in one batch (the shared partial block copied).
  const SeqId b = cache.fork(a);
  const int32_t x = 5, y = 9;
  const SeqTokens both[2] = {{a, std::span<const int32_t>(&x, 1)},
                             {b, std::span<const int32_t>(&y, 1)}};
  ASSERT_EQ(net->model->forward(both, cache, row.data()), 2);
  for (int k = 0; k < 2; ++k) {
    const std::vector<float> ref = replay(net->reference(), {{p}, {{k == 0 ? x : y}}});
    EXPECT_EQ(tolerance_units(row.data() + k * nv, ref.data(), nv), 0.0) << "fork " << k;
  }
  // Prompts sharing 70 (past the first block) and 30 (inside it) tokens with a.
  for (const int64_t shared : {int64_t{70}, int64_t{30}}) {
    std::vector<int32_t> q(p.begin(), p.begin() + shared);
    const std::vector<int32_t> tail = random_tokens(rng, 6, nv);
    q.insert(q.end(), tail.begin(), tail.end());
    const KvCache::PrefixMatch m = cache.longest_prefix(q);
    ASSERT_GE(m.length, shared);
    const SeqId c = cache.fork(m.seq);
    const SeqTokens rest{c, std::span<const int32_t>(q.data() + m.length, q.size() - m.length),
                         m.length, LogitRows::kAll};
    std::vector<float> got(static_cast<size_t>(rest.tokens.size() * nv));
    net->model->forward(std::span<const SeqTokens>(&rest, 1), cache, got.data());
    // The shared rows were computed in a's first chunk (p).
    const std::vector<float> ref =
        replay(net->reference(),
               {{p}, {{}, m.length}, {std::vector<int32_t>(q.begin() + m.length, q.end())}});
    for (size_t r = 0; r < rest.tokens.size(); ++r) {
      EXPECT_EQ(tolerance_units(got.data() + r * nv, ref.data() + r * nv, nv), 0.0)
          << "shared " << shared << " row " << r;
    }
    cache.release(c);
  }
}

// A sequence truncated and continued gives the logits of a fresh run of the kept tokens and the
// new ones; a full pool is an error that leaves every sequence as it was.
TEST_P(BatchForward, TruncateThenContinueEqualsAFreshRunAndAFullPoolIsAnError) {
  const std::unique_ptr<Net> net = open(GetParam());
  const int64_t nv = net->vocab();
  std::mt19937 rng(13);
  KvCacheOptions o;
  o.positions = 128;
  KvCache cache(net->model->kv_layout(), net->model->cache_options(o));
  const SeqId a = cache.create();
  const std::vector<int32_t> p = random_tokens(rng, 30, nv);
  std::vector<float> row(static_cast<size_t>(8 * nv));
  const SeqTokens e1{a, p};
  net->model->forward(std::span<const SeqTokens>(&e1, 1), cache, row.data());
  for (int i = 0; i < 5; ++i) {
    const int32_t t = 3 + i;
    const SeqTokens e{a, std::span<const int32_t>(&t, 1)};
    net->model->forward(std::span<const SeqTokens>(&e, 1), cache, row.data());
  }
  cache.truncate(a, 12);
  const std::vector<int32_t> more = random_tokens(rng, 8, nv);
  const SeqTokens e2{a, more, -1, LogitRows::kAll};
  ASSERT_EQ(net->model->forward(std::span<const SeqTokens>(&e2, 1), cache, row.data()), 8);
  const std::vector<float> ref = replay(net->reference(), {{p}, {{}, 12}, {more}});
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(tolerance_units(row.data() + r * nv, ref.data() + r * nv, nv), 0.0) << r;
  }
  // 20 positions used of 128 (two blocks of 64): b's 100 tokens need a second block while a
  // holds one: the pool is full.
  const SeqId b = cache.create();
  const std::vector<int32_t> big = random_tokens(rng, 100, nv);
  const SeqTokens both[2] = {{a, std::span<const int32_t>(more.data(), 1)}, {b, big}};
  try {
    net->model->forward(both, cache, row.data());
    FAIL() << "a full pool gave no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kResource) << e.what();
    EXPECT_NE(std::string(e.what()).find("KV cache full"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cache.length(a), 20);
  EXPECT_EQ(cache.length(b), 0);
  // Once a is gone, b fits, and its logits are its own.
  cache.release(a);
  const SeqTokens eb{b, big};
  net->model->forward(std::span<const SeqTokens>(&eb, 1), cache, row.data());
  const std::vector<float> ref_b = replay(net->reference(), {{big}});
  EXPECT_EQ(tolerance_units(row.data(), ref_b.data() + 99 * nv, nv), 0.0);
}

// A seeded random schedule: sequences added, forked, truncated and released between steps;
// each step feeds 1-4 tokens of a random subset of the live sequences in one batch, and every
// row is checked against the sequence's whole history recomputed alone.
TEST_P(BatchForward, RandomScheduleEqualsSoloRuns) {
  const std::unique_ptr<Net> net = open(GetParam());
  const int64_t nv = net->vocab();
  std::mt19937 rng(17);
  KvCacheOptions o;
  o.positions = 64 * 12;
  o.max_sequence_positions = 120;
  KvCache cache(net->model->kv_layout(), net->model->cache_options(o));
  struct Live {
    SeqId id;
    History history;
    int64_t length;
  };
  std::vector<Live> live;
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  int checked = 0;
  for (int step = 0; step < 24; ++step) {
    // Between steps: add, fork, truncate or release.
    const int op = static_cast<int>(pick(4));
    if (live.empty() || op == 0) {
      live.push_back({cache.create(), {}, 0});
    } else if (op == 1 && live.size() < 6) {
      const Live src = live[pick(live.size())];
      live.push_back({cache.fork(src.id), src.history, src.length});
    } else if (op == 2) {
      Live& s = live[pick(live.size())];
      const int64_t keep = static_cast<int64_t>(pick(static_cast<size_t>(s.length) + 1));
      cache.truncate(s.id, keep);
      s.history.push_back({{}, keep});
      s.length = keep;
    } else if (live.size() > 1) {
      const size_t i = pick(live.size());
      cache.release(live[i].id);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    // This step: 1-4 tokens (now and then a 33-40 token chunk: expanded MLA beside absorbed)
    // of about two thirds of the live sequences.
    std::vector<SeqTokens> batch;
    std::vector<std::vector<int32_t>> fed;
    std::vector<size_t> who;
    for (size_t i = 0; i < live.size(); ++i) {
      if (pick(3) == 0) continue;
      const int64_t room = 120 - live[i].length;
      const int64_t want = pick(6) == 0 ? 33 + static_cast<int64_t>(pick(8)) : 1 + pick(4);
      if (room <= 0) continue;
      fed.push_back(random_tokens(rng, std::min(room, want), nv));
      who.push_back(i);
    }
    if (who.empty()) continue;
    for (size_t j = 0; j < who.size(); ++j) {
      batch.push_back({live[who[j]].id, fed[j], -1, LogitRows::kAll});
    }
    size_t rows = 0;
    for (const auto& f : fed) rows += f.size();
    std::vector<float> logits(rows * static_cast<size_t>(nv));
    ASSERT_EQ(net->model->forward(batch, cache, logits.data()), static_cast<int64_t>(rows));
    size_t r = 0;
    for (size_t j = 0; j < who.size(); ++j) {
      Live& s = live[who[j]];
      s.history.push_back({fed[j]});
      s.length += static_cast<int64_t>(fed[j].size());
      ASSERT_EQ(cache.length(s.id), s.length);
      const std::vector<float> ref = replay(net->reference(), s.history);
      for (size_t t = 0; t < fed[j].size(); ++t, ++r) {
        ASSERT_EQ(tolerance_units(logits.data() + r * nv, ref.data() + t * nv, nv), 0.0)
            << "step " << step << " sequence " << who[j] << " row " << t;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 40);
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (const std::string m : {"qwen2moe", "qwen3moe", "mixtral", "deepseek2", "deepseek3",
                              "deepseek32", "glm-dsa"}) {
    v.push_back({"golden/" + m + ".gguf", "reference", "", MlaMode::kAuto});
    v.push_back({"golden/" + m + "-hf", "fused", "native", MlaMode::kAuto});
  }
  v.push_back({"golden/deepseek2.gguf", "fused", "native", MlaMode::kNaive});
  v.push_back({"golden/glm-dsa.gguf", "fused", "native", MlaMode::kNaive});
  v.push_back({"golden/deepseek32-q4_k_m.gguf", "fused", "repack", MlaMode::kAuto});
  v.push_back({"golden/qwen3moe-q4_k_m.gguf", "fused", "repack", MlaMode::kAuto});
  v.push_back({"demo/tandem-demo-moe-hf", "fused", "native", MlaMode::kAuto});
  v.push_back({"demo/tandem-demo-moe-Q4_K_M.gguf", "fused", "repack", MlaMode::kAuto});
  v.push_back({"demo/tandem-demo-moe-Q4_K_M.gguf", "fused", "int8", MlaMode::kAuto});
  v.push_back({"demo/tandem-demo-moe-Q4_K_M.gguf", "fused", "native", MlaMode::kNaive});
  // The dense part on the host device (--accel host), the experts through the hybrid backend.
  for (const std::string m : {"qwen2moe", "qwen3moe", "mixtral", "deepseek2", "deepseek3",
                              "gpt-oss", "glm4moe", "minimax-m2", "deepseek32", "glm-dsa"}) {
    v.push_back({"golden/" + m + ".gguf", "hybrid", "native", MlaMode::kAuto});
  }
  v.push_back({"golden/deepseek32-q4_k_m.gguf", "device", "repack", MlaMode::kAuto});
  v.push_back({"golden/deepseek2.gguf", "hybrid", "native", MlaMode::kNaive});
  v.push_back({"golden/qwen3moe-q4_k_m.gguf", "hybrid", "native", MlaMode::kAuto});
  v.push_back({"demo/tandem-demo-moe-hf", "hybrid", "native", MlaMode::kAuto});
  v.push_back({"demo/tandem-demo-moe-Q4_K_M.gguf", "hybrid", "native", MlaMode::kAuto});
  // The dense part on the host device, the experts on the CPU operator (no hybrid backend).
  v.push_back({"golden/qwen3moe-q4_k_m.gguf", "device", "repack", MlaMode::kAuto});
  v.push_back({"demo/tandem-demo-moe-Q4_K_M.gguf", "device", "repack", MlaMode::kAuto});
  v.push_back({"demo/tandem-demo-moe-Q4_K_M.gguf", "device", "native", MlaMode::kNaive});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Models, BatchForward, ::testing::ValuesIn(cases()), case_name);

}  // namespace
}  // namespace tandem
