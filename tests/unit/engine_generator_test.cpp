// The generator against the same requests computed by hand (a SingleSequence of their own and a
// Sampler): requests decoded together, chunked prefill, a shared prefix kept between requests,
// n completions of one prompt, a pool too small for everything at once (back-pressure and
// preemption), stop tokens and stop strings, cancellation, errors that leave the others running,
// log-probabilities. The trained demo model (tests/data/demo) gives real text.
#include "engine/generator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/tokenizer.h"
#include "model/model.h"
#include "model/weights.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

struct Demo {
  LoadedModel lm = load_model(test::data_path("demo/tandem-demo-moe-hf"));
  Tokenizer tok = Tokenizer::load(test::data_path("demo/tandem-demo-moe-hf"));
  ThreadingContext threading{ThreadingOptions{2, false, 50}};
  std::unique_ptr<Model> model;
  Demo() {
    ModelOptions mo;
    mo.forward.pool = &threading.pool();
    model = std::make_unique<Model>(lm, mo);
  }
  int64_t nv() const { return lm.config.vocab_size; }
};

Demo& demo() {
  static Demo d;
  return d;
}

// The request alone: its prompt fed in chunks of `chunk` tokens (0: whole), then tokens sampled
// by a Sampler of its own until `max_tokens` or an end token.
std::vector<int32_t> solo(const std::vector<int32_t>& prompt, const SamplingParams& sp,
                          int max_tokens, size_t chunk = 0) {
  Demo& d = demo();
  SingleSequence s(*d.model, 256);
  Sampler sampler(sp);
  std::vector<float> row(static_cast<size_t>(d.nv()));
  if (chunk == 0) chunk = prompt.size();
  for (size_t b = 0; b < prompt.size(); b += chunk) {
    const size_t e = std::min(prompt.size(), b + chunk);
    s.forward(std::span<const int32_t>(prompt.data() + b, e - b), row.data(), false);
  }
  std::vector<int32_t> context = prompt, out;
  for (int i = 0; i < max_tokens; ++i) {
    const int32_t t = sampler.sample(row.data(), d.nv(), context);
    out.push_back(t);
    context.push_back(t);
    if (d.tok.is_end_of_generation(t) || i + 1 == max_tokens) break;
    s.forward(std::span<const int32_t>(&t, 1), row.data(), false);
  }
  return out;
}

std::vector<int32_t> prompt_of(const std::string& text) {
  return demo().tok.encode(text, true);
}

struct Result {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  std::string error;
};

// Steps until every request finished; each request's tokens, text and finish reason.
std::map<RequestId, Result> run_all(Generator& g, int max_steps = 1000) {
  std::map<RequestId, Result> r;
  for (int s = 0; s < max_steps && !g.idle(); ++s) {
    for (const GenerateEvent& ev : g.step()) {
      Result& x = r[ev.id];
      if (ev.token >= 0) x.tokens.push_back(ev.token);
      x.text += ev.text;
      if (ev.finish != FinishReason::kNone) {
        EXPECT_EQ(x.finish, FinishReason::kNone) << "request " << ev.id << " finished twice";
        x.finish = ev.finish;
        x.error = ev.error;
      }
    }
  }
  EXPECT_TRUE(g.idle());
  return r;
}

KvCache make_cache(int64_t positions, int64_t ctx = 256) {
  KvCacheOptions o;
  o.positions = positions;
  o.max_sequence_positions = ctx;
  return KvCache(demo().model->kv_layout(), o);
}

const char* kPrompts[] = {"In the beginning God", "And Moses said unto", "The LORD is my",
                          "And it came to pass, when"};

TEST(Generator, RequestsTogetherEqualEachAlone) {
  Demo& d = demo();
  KvCache cache = make_cache(64 * 8);
  GeneratorOptions go;
  go.max_batch_tokens = 7;  // prompts in chunks of at most 7 tokens beside the others' decoding
  go.reuse_prefix = false;
  Generator g(*d.model, cache, &d.tok, go);
  std::vector<RequestId> ids;
  std::vector<SamplingParams> sps;
  for (int i = 0; i < 4; ++i) {
    GenerateParams p;
    p.max_tokens = 6 + 3 * i;
    if (i % 2 == 1) {  // sampled, seeded
      p.sampling.temperature = 0.9f;
      p.sampling.top_k = 40;
      p.sampling.seed = 100 + i;
    }
    if (i == 0) {  // penalties on the prompt's and the generated tokens
      p.sampling.repeat_penalty = 1.5f;
      p.sampling.frequency_penalty = 1.0f;
      p.sampling.penalty_last_n = -1;
    }
    sps.push_back(p.sampling);
    ids.push_back(g.submit(prompt_of(kPrompts[i]), p));
  }
  const auto r = run_all(g);
  // (The penalties change request 0's tokens.)
  ASSERT_NE(solo(prompt_of(kPrompts[0]), SamplingParams{}, 6),
            solo(prompt_of(kPrompts[0]), sps[0], 6));
  for (int i = 0; i < 4; ++i) {
    const auto& x = r.at(ids[static_cast<size_t>(i)]);
    // (The prompts are shorter than MLA's expansion size: whole or in chunks, every token
    // attends absorbed, and the F32-computed demo model gives the same tokens.)
    const std::vector<int32_t> want =
        solo(prompt_of(kPrompts[i]), sps[static_cast<size_t>(i)], 6 + 3 * i);
    EXPECT_EQ(x.tokens, want) << "request " << i;
    EXPECT_EQ(x.finish, want.size() == static_cast<size_t>(6 + 3 * i) ? FinishReason::kLength
                                                                     : FinishReason::kStop);
    // The text is the tokens decoded after the prompt.
    std::vector<int32_t> all = prompt_of(kPrompts[i]);
    const std::string before = d.tok.decode(all);
    all.insert(all.end(), x.tokens.begin(), x.tokens.end());
    if (x.finish == FinishReason::kLength) {
      EXPECT_EQ(before + x.text, d.tok.decode(all)) << "request " << i;
    }
  }
  EXPECT_EQ(cache.blocks_free(), cache.blocks_total());
}

TEST(Generator, APrefixIsReusedAndNCompletionsShareThePrompt) {
  Demo& d = demo();
  KvCache cache = make_cache(64 * 8);
  Generator g(*d.model, cache, &d.tok);
  GenerateParams p;
  p.max_tokens = 8;
  const std::vector<int32_t> first = prompt_of("And God said, Let there be light");
  const RequestId a = g.submit(first, p);
  auto r = run_all(g);
  EXPECT_EQ(g.usage(a).cached, 0);
  // The next prompt starts with the first one and its answer: only the new part is prefilled.
  std::vector<int32_t> second = first;
  second.insert(second.end(), r[a].tokens.begin(), r[a].tokens.end() - 1);
  const std::vector<int32_t> more = prompt_of("and there was");
  second.insert(second.end(), more.begin() + 1, more.end());  // (without its BOS)
  const RequestId b = g.submit(second, p);
  r = run_all(g);
  EXPECT_GE(g.usage(b).cached, static_cast<int64_t>(first.size()));
  EXPECT_EQ(r[b].tokens, solo(second, SamplingParams{}, 8));
  // Three completions of one prompt, sampled with seeds 7, 8, 9: the prompt prefilled once.
  GenerateParams s;
  s.max_tokens = 10;
  s.ignore_eos = true;
  s.sampling.temperature = 1.0f;
  s.sampling.seed = 7;
  const std::vector<int32_t> q = prompt_of("Blessed are the");
  g.clear_retained();
  const RequestId c = g.submit(q, s, 3);
  g.step();
  EXPECT_EQ(g.last_batch_tokens(), static_cast<int64_t>(q.size()));
  r = run_all(g);
  std::set<std::vector<int32_t>> distinct;
  for (int i = 0; i < 3; ++i) {
    SamplingParams sp = s.sampling;
    sp.seed = 7 + i;
    const std::vector<int32_t> want = solo(q, sp, 10);
    // (The first token came in the first step, before run_all.)
    const auto& got = r[c + i].tokens;
    ASSERT_EQ(got.size() + 1, want.size()) << i;
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin() + 1)) << i;
    distinct.insert(want);
  }
  EXPECT_EQ(distinct.size(), 3u);  // the seeds reach the samplers
}

TEST(Generator, ASmallPoolMakesRequestsWaitAndNeverMixesThem) {
  Demo& d = demo();
  // 3 blocks of 64 positions: three requests of ~70 positions each cannot all run at once.
  KvCache cache = make_cache(64 * 3, 100);
  GeneratorOptions go;
  go.reuse_prefix = false;
  Generator g(*d.model, cache, &d.tok, go);
  std::vector<RequestId> ids;
  // Prompts of ~58 tokens: 12 more tokens each cross into a second block.
  auto long_prompt = [](int i) {
    std::vector<int32_t> q = prompt_of(kPrompts[i]);
    const std::vector<int32_t> more = prompt_of(" and the earth was without form, and void; and");
    while (q.size() < 58) q.push_back(more[1 + q.size() % (more.size() - 1)]);
    return q;
  };
  for (int i = 0; i < 3; ++i) {
    GenerateParams p;
    p.max_tokens = 12;
    p.ignore_eos = true;
    ids.push_back(g.submit(long_prompt(i), p));
  }
  bool waited = false;  // a request not finished and not running: preempted or not admitted
  int finished = 0;
  std::map<RequestId, std::vector<int32_t>> got;
  while (!g.idle()) {
    for (const GenerateEvent& ev : g.step()) {
      ASSERT_NE(ev.finish, FinishReason::kError) << ev.error;
      if (ev.token >= 0) got[ev.id].push_back(ev.token);
      finished += ev.finish != FinishReason::kNone;
    }
    waited = waited || g.running() < 3 - finished;
  }
  EXPECT_TRUE(waited);  // they could not all hold their blocks at once
  for (int i = 0; i < 3; ++i) {
    SamplingParams greedy;
    EXPECT_EQ(got[ids[static_cast<size_t>(i)]], solo(long_prompt(i), greedy, 12)) << i;
  }
  // A prompt longer than the pool ends with an error; the generator serves the next request.
  KvCache tiny = make_cache(64, 200);
  Generator t(*d.model, tiny, &d.tok);
  GenerateParams p;
  p.max_tokens = 4;
  const std::vector<int32_t> too_long(100, prompt_of("And")[1]);
  const RequestId bad = t.submit(too_long, p);
  const RequestId good = t.submit(prompt_of(kPrompts[0]), p);
  auto r = run_all(t);
  EXPECT_EQ(r[bad].finish, FinishReason::kError);
  EXPECT_NE(r[bad].error.find("KV cache full"), std::string::npos) << r[bad].error;
  EXPECT_EQ(r[good].tokens, solo(prompt_of(kPrompts[0]), SamplingParams{}, 4));
}

TEST(Generator, StopsAndCancels) {
  Demo& d = demo();
  KvCache cache = make_cache(64 * 8);
  Generator g(*d.model, cache, &d.tok);
  const std::vector<int32_t> q = prompt_of(kPrompts[3]);
  GenerateParams p;
  p.max_tokens = 24;
  p.ignore_eos = true;
  const RequestId full_id = g.submit(q, p);
  auto r = run_all(g);
  const Result full = r[full_id];
  ASSERT_EQ(full.tokens.size(), 24u);
  // A stop token: the output ends before it.
  GenerateParams st = p;
  st.stop_tokens = {full.tokens[5]};
  const RequestId a = g.submit(q, st);
  r = run_all(g);
  const auto first5 = std::find(full.tokens.begin(), full.tokens.end(), full.tokens[5]);
  const size_t at = static_cast<size_t>(first5 - full.tokens.begin());
  EXPECT_EQ(r[a].finish, FinishReason::kStop);
  EXPECT_EQ(r[a].tokens.size(), at + 1);  // (the stop token is reported, not written as text)
  // A stop string across a token boundary (from two characters before the end of token 10's
  // text to three after): the text ends right before it.
  std::vector<int32_t> upto = q;
  upto.insert(upto.end(), full.tokens.begin(), full.tokens.begin() + 11);
  const size_t boundary = d.tok.decode(upto).size() - d.tok.decode(q).size();
  const std::string stop = full.text.substr(boundary - 2, 5);
  GenerateParams ss = p;
  ss.stop = {"never appears", stop};
  const RequestId b = g.submit(q, ss);
  r = run_all(g);
  EXPECT_EQ(r[b].finish, FinishReason::kStop);
  EXPECT_EQ(r[b].text, full.text.substr(0, full.text.find(stop)));
  // Cancelled after three steps: its text so far stays, it ends, the other request goes on.
  const RequestId c = g.submit(q, p);
  const RequestId e = g.submit(prompt_of(kPrompts[0]), p);
  std::string text_c;
  for (int i = 0; i < 3; ++i) {
    for (const GenerateEvent& ev : g.step()) text_c += ev.id == c ? ev.text : "";
  }
  g.cancel(c);
  r = run_all(g);
  EXPECT_EQ(r[c].finish, FinishReason::kCancelled);
  EXPECT_EQ(full.text.compare(0, text_c.size(), text_c), 0);
  EXPECT_EQ(r[e].finish, FinishReason::kLength);
  // Bad requests are errors at submit: nothing is queued.
  EXPECT_THROW(g.submit({}, p), Error);
  EXPECT_THROW(g.submit({static_cast<int32_t>(d.nv())}, p), Error);
  EXPECT_THROW(g.submit(std::vector<int32_t>(300, 5), p), Error);  // past the context size
  GenerateParams nan = p;
  nan.sampling.temperature = NAN;
  EXPECT_THROW(g.submit(q, nan), Error);
  EXPECT_TRUE(g.idle());
}

TEST(Generator, LogprobsAreTheModelsDistribution) {
  Demo& d = demo();
  KvCache cache = make_cache(64 * 2);
  Generator g(*d.model, cache, &d.tok);
  GenerateParams p;
  p.max_tokens = 1;
  p.top_logprobs = 3;
  const std::vector<int32_t> q = prompt_of(kPrompts[2]);
  g.submit(q, p);
  const std::vector<GenerateEvent> ev = g.step();
  ASSERT_EQ(ev.size(), 1u);
  SingleSequence s(*d.model, 64);
  std::vector<float> row(static_cast<size_t>(d.nv()));
  s.forward(q, row.data(), false);
  double z = 0;
  for (float x : row) z += std::exp(static_cast<double>(x));
  std::vector<int32_t> order(row.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  EXPECT_EQ(ev[0].token, order[0]);
  EXPECT_NEAR(ev[0].logprob, row[order[0]] - std::log(z), 1e-4);
  ASSERT_EQ(ev[0].top_logprobs.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(ev[0].top_logprobs[i].token, order[i]);
    EXPECT_NEAR(ev[0].top_logprobs[i].logprob, row[order[i]] - std::log(z), 1e-4);
  }
}

}  // namespace
}  // namespace tandem
