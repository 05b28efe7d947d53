// The hybrid models (Qwen3-Next, Qwen3.5-MoE: Gated DeltaNet layers with a recurrent state per
// sequence, and gated attention layers with paged keys and values) through the sequence memory:
// many sequences in one forward against each computed alone, forks, truncation to a point between
// checkpoints (the state resumes at the checkpoint before it and the tokens after are computed
// again), prefix reuse from a checkpoint, a seeded random schedule of all of it, the state slots
// as a budget, the recurrent and chunked forms of the delta rule on a 4,096-token input, and the
// generator's prefix reuse, preemption and n completions. Every logits row is checked against a
// fresh sequence fed the same tokens, within the golden F32 tolerance (max |d| <= 1e-4 + 1e-3
// max |ref|), greedy tokens identical. The models: the golden tiny ones (tests/data/golden), GGUF
// and HF, the reference MoE backend, the fused operator, and --accel host (the dense part with
// the DeltaNet layers on the host device), with the delta rule's recurrent form (the CPU's) and
// its chunked form.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/generator.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/weights.h"
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

// max |d| / max |ref| over the row.
double relative(const float* got, const float* ref, int64_t n) {
  double md = 0, mr = 0;
  for (int64_t j = 0; j < n; ++j) {
    md = std::max(md, std::fabs(static_cast<double>(got[j]) - ref[j]));
    mr = std::max(mr, std::fabs(static_cast<double>(ref[j])));
  }
  return md / mr;
}

struct Case {
  std::string model;    // under tests/data
  std::string backend;  // "reference" | "fused" | "host" (--accel host)
  int64_t chunk = 0;    // ModelOptions::delta_chunk_tokens (0: the recurrent form throughout)
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.model << " " << c.backend << " chunk " << c.chunk;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string s = info.param.model + "_" + info.param.backend +
                  (info.param.chunk > 0 ? "_chunked" : "");
  for (char& ch : s) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return s;
}

struct Net {
  LoadedModel lm;
  std::unique_ptr<MoeRuntime> runtime;
  std::unique_ptr<Model> model;
  int64_t vocab() const { return lm.config.vocab_size; }
  ~Net() {
    model.reset();
    runtime.reset();
  }
};

std::unique_ptr<Net> open(const Case& c) {
  auto net = std::make_unique<Net>();
  const auto path = test::data_path(c.model);
  net->lm = load_model(path);
  ModelOptions mo;
  mo.forward.pool = &threading().pool();
  mo.forward.delta_chunk_tokens = c.chunk;
  if (c.backend != "reference") {
    BackendOptions bo;
    bo.cpu_experts = "native";
    bo.expert_cache = false;
    bo.accel = c.backend == "host" ? rt::Accel::kHost : rt::Accel::kNone;
    if (c.backend == "host") {
      bo.vram_budget = "256M";
      bo.link = "none";
    }
    net->runtime =
        std::make_unique<MoeRuntime>(net->lm, resolve_backend_options(bo, path), threading());
    net->runtime->apply(&mo);
  }
  net->model = std::make_unique<Model>(net->lm, mo);
  if (c.backend == "host") {
    EXPECT_EQ(net->model->ops().name(), "host");
  }
  return net;
}

KvCache make_cache(Net& net, int64_t positions, int64_t slots, int64_t interval = 0,
                   int64_t max_seq = 0) {
  KvCacheOptions o;
  o.positions = positions;
  o.state_slots = slots;
  o.checkpoint_interval = interval;
  o.max_sequence_positions = max_seq;
  return KvCache(net.model->kv_layout(), net.model->cache_options(o));
}

// A fresh sequence fed `tokens` (in one forward), then `more` (a second): the rows of `more`.
std::vector<float> fresh(Net& net, const std::vector<int32_t>& tokens,
                         const std::vector<int32_t>& more) {
  SingleSequence s(*net.model, static_cast<int64_t>(tokens.size() + more.size()) + 1);
  std::vector<float> rows(std::max<size_t>(tokens.size(), more.size()) *
                          static_cast<size_t>(net.vocab()));
  if (!tokens.empty()) s.forward(tokens, rows.data(), false);
  s.forward(more, rows.data(), true);
  rows.resize(more.size() * static_cast<size_t>(net.vocab()));
  return rows;
}

class HybridSequences : public ::testing::TestWithParam<Case> {};

// N = 1..8 sequences of different prompt lengths, starting at different steps, decoding
// different numbers of tokens, one prompt prefilled in two chunks while others decode: each
// row within the tolerance of the sequence alone, the greedy tokens its own.
TEST_P(HybridSequences, StaggeredSequencesEqualTheirSoloRuns) {
  const std::unique_ptr<Net> net = open(GetParam());
  const int64_t nv = net->vocab();
  ASSERT_TRUE(net->lm.config.has_linear_layers());
  const int64_t lengths[8] = {3, 17, 7, 70, 1, 25, 12, 33};
  const int start[8] = {0, 0, 1, 2, 2, 4, 5, 7};
  const int steps[8] = {6, 9, 4, 8, 10, 5, 7, 3};
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<test::SoloRun> solo;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(random_tokens(rng, lengths[i], nv));
    solo.push_back(test::run_solo(*net->model, prompts.back(), steps[i]));
  }
  double worst = 0;
  for (int n_seq = 1; n_seq <= 8; ++n_seq) {
    KvCache cache = make_cache(*net, 64 * 8, 8);
    // Bit for bit, but where the prompt's DeltaNet runs chunked: chunks of other lengths than the
    // solo run's sum in another order (measured 0.000868 of the tolerance; 0.01 allows ~10x).
    const double bound = GetParam().chunk > 0 ? 0.01 : 0.0;
    worst = std::max(worst, test::check_staggered(*net->model, cache, prompts, solo, start, steps,
                                                  n_seq, 40, bound));
    if (HasFailure()) return;
  }
  std::printf("%s %s: worst %.3g of the F32 tolerance\n", GetParam().model.c_str(),
              GetParam().backend.c_str(), worst);
}

// A fork gets a copy of the state: parent and fork decode different tokens in one batch, each as
// its own history computed fresh. A sequence with checkpoints every 32 positions: truncated to
// 70 it resumes at 64 (truncate() says so), to 20 at 0; continued, it gives a fresh run's
// logits. A prompt sharing 70 tokens with it resumes from its checkpoint at 64, one sharing 20
// from nothing.
TEST_P(HybridSequences, ForksTruncationAndPrefixesGoThroughCheckpoints) {
  const std::unique_ptr<Net> net = open(GetParam());
  const int64_t nv = net->vocab();
  std::mt19937 rng(11);
  KvCache cache = make_cache(*net, 64 * 8, 12, 32);
  const std::vector<int32_t> p = random_tokens(rng, 100, nv);
  const SeqId a = cache.create();
  std::vector<float> row(static_cast<size_t>(2 * nv));
  const SeqTokens first{a, p};
  net->model->forward(std::span<const SeqTokens>(&first, 1), cache, row.data());
  EXPECT_EQ(cache.checkpoints(a), (std::vector<int64_t>{32, 64, 96}));
  const SeqId b = cache.fork(a);
  EXPECT_EQ(cache.checkpoints(b), cache.checkpoints(a));  // (shared, not copied)
  const int32_t x = 5, y = 9;
  const SeqTokens both[2] = {{a, std::span<const int32_t>(&x, 1)},
                             {b, std::span<const int32_t>(&y, 1)}};
  ASSERT_EQ(net->model->forward(both, cache, row.data()), 2);
  for (int k = 0; k < 2; ++k) {
    const std::vector<float> ref = fresh(*net, p, {k == 0 ? x : y});
    EXPECT_LE(tolerance_units(row.data() + k * nv, ref.data(), nv), 1.0) << "fork " << k;
  }
  // Truncation between checkpoints.
  EXPECT_EQ(cache.truncate(b, 70), 64);
  EXPECT_EQ(cache.length(b), 64);
  EXPECT_EQ(cache.checkpoints(b), (std::vector<int64_t>{32, 64}));
  const std::vector<int32_t> more = random_tokens(rng, 9, nv);
  std::vector<int32_t> cont(p.begin() + 64, p.begin() + 70);
  cont.insert(cont.end(), more.begin(), more.end());
  std::vector<float> got(cont.size() * static_cast<size_t>(nv));
  const SeqTokens eb{b, cont, -1, LogitRows::kAll};
  ASSERT_EQ(net->model->forward(std::span<const SeqTokens>(&eb, 1), cache, got.data()),
            static_cast<int64_t>(cont.size()));
  {
    const std::vector<float> ref = fresh(*net, std::vector<int32_t>(p.begin(), p.begin() + 64), cont);
    for (size_t r = 0; r < cont.size(); ++r) {
      EXPECT_LE(tolerance_units(got.data() + r * nv, ref.data() + r * nv, nv), 1.0) << r;
    }
  }
  EXPECT_EQ(cache.truncate(b, 20), 0);
  EXPECT_TRUE(cache.checkpoints(b).empty());
  // A prompt sharing 70 tokens with a: from a's checkpoint at 64.
  std::vector<int32_t> q(p.begin(), p.begin() + 70);
  const std::vector<int32_t> tail = random_tokens(rng, 6, nv);
  q.insert(q.end(), tail.begin(), tail.end());
  const KvCache::PrefixMatch m = cache.longest_prefix(q);
  EXPECT_EQ(m.seq, a);
  EXPECT_EQ(m.length, 64);
  const SeqId c = cache.fork(m.seq);
  ASSERT_EQ(cache.truncate(c, m.length), 64);
  const SeqTokens ec{c, std::span<const int32_t>(q.data() + 64, q.size() - 64), -1,
                     LogitRows::kAll};
  got.resize((q.size() - 64) * static_cast<size_t>(nv));
  net->model->forward(std::span<const SeqTokens>(&ec, 1), cache, got.data());
  const std::vector<float> ref =
      fresh(*net, std::vector<int32_t>(p.begin(), p.begin() + 64),
            std::vector<int32_t>(q.begin() + 64, q.end()));
  for (size_t r = 0; r < q.size() - 64; ++r) {
    EXPECT_LE(tolerance_units(got.data() + r * nv, ref.data() + r * nv, nv), 1.0) << r;
  }
  // Sharing 20: below the first checkpoint, nothing to resume from.
  std::vector<int32_t> s20(p.begin(), p.begin() + 20);
  s20.push_back(7);
  EXPECT_EQ(cache.longest_prefix(s20).length, 0);
  // A write that rewinds a recurrent state in place is refused, naming what to do.
  const SeqTokens rewind{a, std::span<const int32_t>(&x, 1), 50};
  try {
    net->model->forward(std::span<const SeqTokens>(&rewind, 1), cache, row.data());
    FAIL() << "a rewinding write was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("truncate it first"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cache.length(a), 101);
}

// The end-of-prompt checkpoint sits one token before the prompt's end: the same prompt again
// resumes there and computes its last token's logits; a checkpoint that finds no free slot takes
// the least recently used one, and a live sequence's slot is never taken.
TEST_P(HybridSequences, PromptEndCheckpointsAndTheSlotBudget) {
  const std::unique_ptr<Net> net = open(GetParam());
  const int64_t nv = net->vocab();
  std::mt19937 rng(19);
  KvCache cache = make_cache(*net, 64 * 6, 3);
  const std::vector<int32_t> p = random_tokens(rng, 40, nv);
  const SeqId a = cache.create();
  std::vector<float> row(static_cast<size_t>(nv));
  const SeqTokens e{a, p, -1, LogitRows::kLast, true};
  net->model->forward(std::span<const SeqTokens>(&e, 1), cache, row.data());
  EXPECT_EQ(cache.checkpoints(a), (std::vector<int64_t>{39}));
  EXPECT_EQ(cache.longest_prefix(p).length, 40);  // (all of a: its live state)
  const SeqId b = cache.fork(a);
  ASSERT_EQ(cache.truncate(b, 39), 39);
  std::vector<float> again(static_cast<size_t>(nv));
  const SeqTokens last{b, std::span<const int32_t>(p.data() + 39, 1)};
  net->model->forward(std::span<const SeqTokens>(&last, 1), cache, again.data());
  EXPECT_LE(tolerance_units(again.data(), row.data(), nv), 1.0);
  // Slots: a, b live, their shared checkpoint: 3 of 3. A third sequence takes the checkpoint's.
  EXPECT_EQ(cache.state_slots_free(), 0);
  EXPECT_EQ(cache.state_slots_available(), 1);
  const SeqId c = cache.create();
  EXPECT_TRUE(cache.checkpoints(a).empty());
  EXPECT_TRUE(cache.checkpoints(b).empty());
  EXPECT_EQ(cache.state_slots_available(), 0);
  try {
    cache.create();
    FAIL() << "a fourth live sequence got a slot";
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::kResource) << err.what();
  }
  // A checkpoint with no slot left is skipped; the forward is right all the same.
  const SeqTokens ec{c, p, -1, LogitRows::kLast, true};
  net->model->forward(std::span<const SeqTokens>(&ec, 1), cache, again.data());
  EXPECT_TRUE(cache.checkpoints(c).empty());
  EXPECT_LE(tolerance_units(again.data(), row.data(), nv), 1.0);
  cache.release(a);
  cache.release(b);
  cache.release(c);
  EXPECT_EQ(cache.state_slots_free(), 3);
}

// A seeded random schedule: sequences added, forked, truncated (resuming at a checkpoint) and
// released between steps; each step feeds 1-4 tokens (now and then 33-80) of a random subset of
// the live sequences in one batch, some of them asking for a checkpoint at their end; every row
// is checked against the sequence's tokens fed to a fresh one. (The fresh run feeds them in one
// piece, so the delta rule's form and chunks differ from the schedule's: float rounding, which a
// Q4_K_M model's 8-bit activations turn into steps of up to ~1%; there the bound is the golden
// README's quantized one, max |d| <= 0.05 max |ref|.)
TEST_P(HybridSequences, RandomScheduleEqualsFreshRuns) {
  const std::unique_ptr<Net> net = open(GetParam());
  const int64_t nv = net->vocab();
  const bool quantized = GetParam().model.find("q4_k_m") != std::string::npos;
  std::mt19937 rng(17);
  KvCache cache = make_cache(*net, 64 * 16, 20, 16, 160);
  struct Live {
    SeqId id;
    std::vector<int32_t> tokens;
  };
  std::vector<Live> live;
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  int checked = 0, resumed_early = 0;
  for (int step = 0; step < 30; ++step) {
    const int op = static_cast<int>(pick(4));
    if (live.empty() || op == 0) {
      if (live.size() < 8) live.push_back({cache.create(), {}});
    } else if (op == 1 && live.size() < 8) {
      const Live src = live[pick(live.size())];
      live.push_back({cache.fork(src.id), src.tokens});
    } else if (op == 2) {
      Live& s = live[pick(live.size())];
      const int64_t want = static_cast<int64_t>(pick(s.tokens.size() + 1));
      const int64_t kept = cache.truncate(s.id, want);
      ASSERT_LE(kept, want);
      resumed_early += kept < want;
      s.tokens.resize(static_cast<size_t>(kept));
    } else if (live.size() > 1) {
      const size_t i = pick(live.size());
      cache.release(live[i].id);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    std::vector<SeqTokens> batch;
    std::vector<std::vector<int32_t>> fed;
    std::vector<size_t> who;
    for (size_t i = 0; i < live.size(); ++i) {
      if (pick(3) == 0) continue;
      const int64_t room = 160 - static_cast<int64_t>(live[i].tokens.size());
      const int64_t want = pick(6) == 0 ? 33 + static_cast<int64_t>(pick(48)) : 1 + pick(4);
      if (room <= 0) continue;
      fed.push_back(random_tokens(rng, std::min(room, want), nv));
      who.push_back(i);
    }
    if (who.empty()) continue;
    for (size_t j = 0; j < who.size(); ++j) {
      batch.push_back({live[who[j]].id, fed[j], -1, LogitRows::kAll, pick(2) == 0});
    }
    size_t rows = 0;
    for (const auto& f : fed) rows += f.size();
    std::vector<float> logits(rows * static_cast<size_t>(nv));
    ASSERT_EQ(net->model->forward(batch, cache, logits.data()), static_cast<int64_t>(rows));
    size_t r = 0;
    for (size_t j = 0; j < who.size(); ++j) {
      Live& s = live[who[j]];
      const std::vector<float> ref = fresh(*net, s.tokens, fed[j]);
      s.tokens.insert(s.tokens.end(), fed[j].begin(), fed[j].end());
      ASSERT_EQ(cache.length(s.id), static_cast<int64_t>(s.tokens.size()));
      for (size_t t = 0; t < fed[j].size(); ++t, ++r) {
        const float* got = logits.data() + r * nv;
        const float* want = ref.data() + t * nv;
        if (quantized) {
          ASSERT_LE(relative(got, want, nv), 0.05)
              << "step " << step << " sequence " << who[j] << " row " << t;
        } else {
          ASSERT_LE(tolerance_units(got, want, nv), 1.0)
              << "step " << step << " sequence " << who[j] << " row " << t;
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
  EXPECT_GT(resumed_early, 0);  // (some truncation fell between checkpoints)
}

// A prompt's 4,096 tokens through the chunked form (64 chunks) and through the recurrence token
// by token: the same logits within the F32 tolerance at every position.
TEST_P(HybridSequences, RecurrentAndChunkedFormsAgreeOn4096Tokens) {
  if (GetParam().backend != "reference" || GetParam().chunk > 0) return;  // (once per model)
  const std::unique_ptr<Net> chunked = open({GetParam().model, "reference", 16});
  const std::unique_ptr<Net> recurrent = open({GetParam().model, "reference", 0});
  const int64_t nv = chunked->vocab(), n = 4096;
  std::mt19937 rng(23);
  const std::vector<int32_t> p = random_tokens(rng, n, nv);
  std::vector<float> a(static_cast<size_t>(n * nv)), b(a.size());
  SingleSequence sa(*chunked->model, n + 1), sb(*recurrent->model, n + 1);
  sa.forward(p, a.data(), true);
  sb.forward(p, b.data(), true);
  double worst = 0;
  for (int64_t r = 0; r < n; ++r) {
    worst = std::max(worst, tolerance_units(a.data() + r * nv, b.data() + r * nv, nv));
  }
  std::printf("%s: chunked vs recurrent over %ld tokens, worst %.3g of the F32 tolerance\n",
              GetParam().model.c_str(), static_cast<long>(n), worst);
  EXPECT_LE(worst, 1.0);
  EXPECT_GT(worst, 0.0);  // (two different computations)
}

std::vector<Case> cases() {
  return {
      {"golden/qwen3next.gguf", "reference"},   {"golden/qwen35moe.gguf", "reference"},
      {"golden/qwen3next-hf", "fused"},         {"golden/qwen35moe-hf", "fused"},
      {"golden/qwen35moe-q4_k_m.gguf", "fused"}, {"golden/qwen3next.gguf", "host"},
      {"golden/qwen35moe.gguf", "host"},
      // The chunked form for parts of 16+ tokens: checkpoints inside a chunk, pieces at chunk
      // boundaries (delta_net_layer.cpp).
      {"golden/qwen3next.gguf", "reference", 16}, {"golden/qwen35moe-q4_k_m.gguf", "fused", 16},
  };
}

INSTANTIATE_TEST_SUITE_P(Models, HybridSequences, ::testing::ValuesIn(cases()), case_name);

// ---- The generator over a hybrid model ----

struct Gen {
  std::unique_ptr<Net> net = open({"golden/qwen35moe.gguf", "reference"});
};
Gen& gen_model() {
  static Gen g;
  return g;
}

// Greedy continuation of `prompt` alone: n tokens.
std::vector<int32_t> solo_greedy(const std::vector<int32_t>& prompt, int n) {
  return test::run_solo(*gen_model().net->model, prompt, n - 1).greedy;
}

GenerateParams greedy(int n) {
  GenerateParams p;
  p.sampling.temperature = 0;
  p.max_tokens = n;
  p.ignore_eos = true;
  return p;
}

std::vector<int32_t> run_to_end(Generator& g, RequestId id) {
  std::vector<int32_t> out;
  while (!g.idle()) {
    for (const GenerateEvent& ev : g.step()) {
      EXPECT_NE(ev.finish, FinishReason::kError) << ev.error;
      if (ev.id == id && ev.token >= 0) out.push_back(ev.token);
    }
  }
  return out;
}

// A chat's turns: the second prompt extends the first turn's whole sequence (its live state
// continues: every earlier token cached), the third parts from the second's answer (it resumes
// from the second prompt's end checkpoint, one token before it); each answer as the prompt's
// alone.
TEST(HybridGenerator, TurnsResumeFromTheStateOrTheirPromptsCheckpoint) {
  Net& net = *gen_model().net;
  KvCacheOptions o;
  o.positions = 64 * 8;
  o.state_slots = 8;
  o.checkpoint_interval = 0;
  KvCache cache(net.model->kv_layout(), net.model->cache_options(o));
  Generator g(*net.model, cache, nullptr);
  std::mt19937 rng(29);
  const std::vector<int32_t> p1 = random_tokens(rng, 50, net.vocab());
  const RequestId r1 = g.submit(p1, greedy(10));
  const std::vector<int32_t> a1 = run_to_end(g, r1);
  EXPECT_EQ(a1, solo_greedy(p1, 10));
  std::vector<int32_t> p2 = p1;
  p2.insert(p2.end(), a1.begin(), a1.end());
  const std::vector<int32_t> turn = random_tokens(rng, 20, net.vocab());
  p2.insert(p2.end(), turn.begin(), turn.end());
  const RequestId r2 = g.submit(p2, greedy(8));
  std::vector<int32_t> a2;
  int64_t cached2 = -1;
  while (!g.idle()) {
    for (const GenerateEvent& ev : g.step()) {
      ASSERT_NE(ev.finish, FinishReason::kError) << ev.error;
      if (ev.id == r2 && ev.token >= 0) a2.push_back(ev.token);
      if (ev.id == r2 && cached2 < 0) cached2 = g.usage(r2).cached;
    }
  }
  EXPECT_EQ(cached2, 59);  // p1 and a1 but its last token (never fed)
  EXPECT_EQ(a2, solo_greedy(p2, 8));
  // The third prompt keeps p2 but answers differently: from p2's checkpoint at its length - 1.
  std::vector<int32_t> p3 = p2;
  const std::vector<int32_t> turn3 = random_tokens(rng, 12, net.vocab());
  p3.insert(p3.end(), turn3.begin(), turn3.end());
  const RequestId r3 = g.submit(p3, greedy(6));
  std::vector<int32_t> a3;
  int64_t cached3 = -1;
  while (!g.idle()) {
    for (const GenerateEvent& ev : g.step()) {
      ASSERT_NE(ev.finish, FinishReason::kError) << ev.error;
      if (ev.id == r3 && ev.token >= 0) a3.push_back(ev.token);
      if (ev.id == r3 && cached3 < 0) cached3 = g.usage(r3).cached;
    }
  }
  EXPECT_EQ(cached3, static_cast<int64_t>(p2.size()) - 1);
  EXPECT_EQ(a3, solo_greedy(p3, 6));
}

// A pool too small for all requests at once: they wait or are preempted (their state slot and
// blocks given back, their tokens computed again later), and n completions fork the prompt's
// state: every answer as its prompt's alone.
TEST(HybridGenerator, PreemptionAndCompletionsKeepEachAnswerItsOwn) {
  Net& net = *gen_model().net;
  KvCacheOptions o;
  o.positions = 64 * 3;
  o.state_slots = 6;
  KvCache cache(net.model->kv_layout(), net.model->cache_options(o));
  GeneratorOptions go;
  go.max_batch_tokens = 48;
  Generator g(*net.model, cache, nullptr, go);
  std::mt19937 rng(31);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<RequestId> ids;
  for (int i = 0; i < 5; ++i) {
    prompts.push_back(random_tokens(rng, 30 + 15 * i, net.vocab()));
    ids.push_back(g.submit(prompts.back(), greedy(12)));
  }
  std::map<RequestId, std::vector<int32_t>> out;
  while (!g.idle()) {
    for (const GenerateEvent& ev : g.step()) {
      ASSERT_NE(ev.finish, FinishReason::kError) << ev.error;
      if (ev.token >= 0) out[ev.id].push_back(ev.token);
    }
  }
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out[ids[i]], solo_greedy(prompts[i], 12)) << i;
  // Three completions of one prompt (greedy: the same answer each, from forked states).
  const std::vector<int32_t> p = random_tokens(rng, 40, net.vocab());
  const RequestId first = g.submit(p, greedy(7), 3);
  out.clear();
  while (!g.idle()) {
    for (const GenerateEvent& ev : g.step()) {
      ASSERT_NE(ev.finish, FinishReason::kError) << ev.error;
      if (ev.token >= 0) out[ev.id].push_back(ev.token);
    }
  }
  const std::vector<int32_t> want = solo_greedy(p, 7);
  for (RequestId id = first; id < first + 3; ++id) EXPECT_EQ(out[id], want) << id;
}

}  // namespace
}  // namespace tandem
