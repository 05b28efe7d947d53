// `tandem serve` over loopback with a real HTTP client (cpp-httplib's) and curl: answers equal
// `tandem run`'s, streams equal whole answers, concurrent streams with cancellations each equal
// their solo runs and leave the KV pool free, bad requests get 4xx with a message and the server
// keeps serving, the API key is enforced, tools are rendered as Hugging Face renders them,
// a hybrid model's chat turns resume from its checkpoints.
#include <gtest/gtest.h>

#include <atomic>
#include <algorithm>
#include <cmath>
#include <numeric>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "engine/jinja_value.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace tandem::test {
namespace {

using Json = jinja::Json;

std::string demo_model() {
  return data_path("demo/tandem-demo-moe-Q4_K_M.gguf").string();
}

struct Reply {
  int status = 0;
  Json body;
  std::string text;
};

Reply post(httplib::Client& c, const std::string& path, const std::string& body,
           const httplib::Headers& headers = {}) {
  Reply r;
  const auto res = c.Post(path.c_str(), headers, body, "application/json");
  if (!res) {
    ADD_FAILURE() << "no response for " << path << ": " << httplib::to_string(res.error());
    return r;
  }
  r.status = res->status;
  r.text = res->body;
  r.body = Json::parse(res->body, nullptr, false);
  return r;
}

Reply post(httplib::Client& c, const std::string& path, const Json& body) {
  return post(c, path, body.dump());
}

// The SSE events of a streamed request; `keep_going(chunks so far)` false closes the connection.
std::vector<Json> stream(httplib::Client& c, const std::string& path, Json body,
                         const std::function<bool(size_t)>& keep_going = nullptr,
                         bool* done = nullptr, std::string* error = nullptr) {
  body["stream"] = true;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body.dump();
  std::vector<Json> events;
  std::string buf;
  bool saw_done = false;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buf.append(data, len);
    size_t at;
    while ((at = buf.find("\n\n")) != std::string::npos) {
      std::string ev = buf.substr(0, at);
      buf.erase(0, at + 2);
      if (ev.rfind("data: ", 0) != 0) continue;
      ev.erase(0, 6);
      if (ev == "[DONE]") {
        saw_done = true;
        continue;
      }
      events.push_back(Json::parse(ev));
    }
    return !keep_going || keep_going(events.size());
  };
  const httplib::Result res = c.send(req);
  if (error != nullptr) {
    *error = !res                 ? httplib::to_string(res.error())
             : res->status != 200 ? std::to_string(res->status) + " " + res->body
                                  : "";
  }
  if (done != nullptr) *done = saw_done;
  return events;
}

std::string completion_text(const std::vector<Json>& events) {
  std::string text;
  for (const Json& e : events) {
    if (e.contains("choices") && !e["choices"].empty() && e["choices"][0].contains("text")) {
      text += e["choices"][0]["text"].get<std::string>();
    }
  }
  return text;
}

// Waits until the scheduler has nothing running or waiting (a cancellation is seen at its next
// step).
void wait_idle(httplib::Client& c) {
  for (int i = 0; i < 500; ++i) {
    if (metric(c, "tandem_requests_running") == 0 && metric(c, "tandem_requests_waiting") == 0) {
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "the server did not become idle";
}

TEST(Serve, GreedyCompletionsEqualTandemRun) {
  ServerProcess server({"-m", demo_model(), "--parallel", "2"});
  auto c = server.client();
  const std::string prompt = "And God said";
  const CommandResult run = run_tandem("run -m " + demo_model() + " -p \"" + prompt + "\" -n 24");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(run.out.rfind(prompt, 0), 0u);
  const std::string want = run.out.substr(prompt.size(), run.out.size() - prompt.size() - 1);
  ASSERT_FALSE(want.empty());

  const Json req = {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}};
  const Reply r = post(*c, "/v1/completions", req);
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body["object"], "text_completion");
  EXPECT_EQ(r.body["choices"][0]["text"], want);
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 24);
  // The same streamed: the chunks add up to it, the last says why it ended, then [DONE].
  bool done = false;
  Json sreq = req;
  sreq["stream_options"] = {{"include_usage", true}};
  const std::vector<Json> events = stream(*c, "/v1/completions", sreq, nullptr, &done);
  EXPECT_TRUE(done);
  EXPECT_EQ(completion_text(events), want);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[events.size() - 2]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 24);
  EXPECT_EQ(events.back()["usage"]["prompt_tokens"], r.body["usage"]["prompt_tokens"]);
}

TEST(Serve, ChatThroughCurlEqualsRunChat) {
  ServerProcess server({"-m", demo_model()});
  const std::string q = "In the beginning";
  const CommandResult run = run_tandem("run -m " + demo_model() + " --chat -p \"" + q + "\" -n 20");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::string want = run.out.substr(0, run.out.size() - 1);
  TempDir tmp("curl");
  const Json req = {{"model", "tandem-demo-moe-Q4_K_M.gguf"},
                    {"messages", {{{"role", "user"}, {"content", q}}}},
                    {"max_tokens", 20},
                    {"temperature", 0}};
  std::ofstream(tmp / "req.json") << req.dump();
  const std::string cmd = "curl -sS -w '\\n%{http_code}' -H 'Content-Type: application/json' " +
                          server.url() + "/v1/chat/completions -d @" + (tmp / "req.json").string() +
                          " > " + (tmp / "out").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream f(tmp / "out");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string out = ss.str();
  const size_t nl = out.rfind('\n');
  ASSERT_NE(nl, std::string::npos) << out;
  EXPECT_EQ(out.substr(nl + 1), "200");
  const Json body = Json::parse(out.substr(0, nl));
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], want);
  // Streamed with curl -N: the deltas add up to the same answer.
  Json sreq = req;
  sreq["stream"] = true;
  std::ofstream(tmp / "sreq.json") << sreq.dump();
  const std::string scmd = "curl -sS -N -H 'Content-Type: application/json' " + server.url() +
                           "/v1/chat/completions -d @" + (tmp / "sreq.json").string() + " > " +
                           (tmp / "sout").string();
  ASSERT_EQ(std::system(scmd.c_str()), 0);
  std::ifstream sf(tmp / "sout");
  std::string line, content;
  bool done = false;
  while (std::getline(sf, line)) {
    if (line.rfind("data: ", 0) != 0) continue;
    if (line == "data: [DONE]") {
      done = true;
      continue;
    }
    const Json ev = Json::parse(line.substr(6));
    EXPECT_EQ(ev["object"], "chat.completion.chunk");
    const Json& d = ev["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(content, want);
}

// 64 clients stream at once through 8 sequences, a quarter of them hang up early: every answer
// that completes equals the same request run alone; the KV pool is all free at the end.
TEST(Serve, SixtyFourConcurrentStreamsWithCancellations) {
  ServerProcess server({"-m", demo_model(), "--parallel", "8", "--queue", "64", "--prefix-cache",
                        "0", "--batch-tokens", "64"});
  auto c = server.client();
  const std::vector<std::string> openings = {
      "And God said",    "In the beginning",    "The LORD is my shepherd",
      "Blessed are the", "And it came to pass", "Then Jesus"};
  std::vector<Json> reqs;
  std::vector<std::string> solo;
  for (int i = 0; i < 64; ++i) {
    Json r = {{"prompt", openings[static_cast<size_t>(i) % openings.size()]},
              {"max_tokens", 8 + i % 17},
              {"seed", 1000 + i},
              {"temperature", i % 2 == 0 ? 0.0 : 0.9},
              {"top_k", 40}};
    reqs.push_back(r);
  }
  // Solo: one at a time.
  for (const Json& r : reqs) {
    const Reply rep = post(*c, "/v1/completions", r);
    ASSERT_EQ(rep.status, 200) << rep.text;
    solo.push_back(rep.body["choices"][0]["text"].get<std::string>());
  }
  std::vector<std::string> got(64), errors(64);
  // (chars, not vector<bool>: 64 threads write their own element; bits would share words)
  std::vector<char> finished(64, 0), cancelled(64, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < 64; ++i) {
    threads.emplace_back([&, i] {
      auto cli = server.client();
      const bool cancel = i % 4 == 3;
      cancelled[static_cast<size_t>(i)] = cancel;
      bool done = false;
      const auto events = stream(
          *cli, "/v1/completions", reqs[static_cast<size_t>(i)],
          [&](size_t n) { return !cancel || n < 3; }, &done, &errors[static_cast<size_t>(i)]);
      finished[static_cast<size_t>(i)] = done;
      got[static_cast<size_t>(i)] = completion_text(events);
    });
  }
  for (auto& t : threads) t.join();
  int completed = 0;
  for (size_t i = 0; i < 64; ++i) {
    if (cancelled[i]) continue;
    EXPECT_TRUE(finished[i]) << i << ": " << errors[i];
    EXPECT_EQ(got[i], solo[i]) << "request " << i;
    completed += finished[i] != 0;
  }
  EXPECT_EQ(completed, 48);
  wait_idle(*c);
  EXPECT_EQ(metric(*c, "tandem_kv_blocks_used"), 0);
  EXPECT_GE(metric(*c, "tandem_completions_total{finish_reason=\"cancelled\"}"), 1);
  // And it still answers.
  EXPECT_EQ(post(*c, "/v1/completions", reqs[0]).body["choices"][0]["text"], solo[0]);
}

TEST(Serve, BadRequestsGetFourHundredsAndTheServerGoesOn) {
  ServerProcess server({"-m", demo_model(), "--max-body", "65536"});
  auto c = server.client();
  std::string deep(200, '[');
  deep += std::string(200, ']');
  std::vector<int> long_prompt(300, 5);
  struct Case {
    std::string path, body;
    int status;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", "{not json", 400, "not valid JSON"},
      {"/v1/completions", "[1, 2]", 400, "must be a JSON object"},
      {"/v1/completions", R"({"max_tokens": 4})", 400, "'prompt' is required"},
      {"/v1/completions", R"({"prompt": "a", "temperature": "hot"})", 400, "'temperature'"},
      {"/v1/completions", R"({"prompt": "a", "temperature": 9})", 400, "'temperature'"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": -1})", 400, "'max_tokens'"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 1.5})", 400, "'max_tokens'"},
      {"/v1/completions", R"({"prompt": "a", "n": 1000})", 400, "'n'"},
      {"/v1/completions", R"({"prompt": "a", "model": "gpt-4"})", 404, "does not exist"},
      {"/v1/completions", Json({{"prompt", long_prompt}}).dump(), 400,
       "300 tokens, more than the context size 256"},
      {"/v1/completions", R"({"prompt": [1, 99999]})", 400, "not a token id"},
      {"/v1/completions", R"({"prompt": "a", "logit_bias": {"x": 1}})", 400, "logit_bias"},
      {"/v1/completions", R"({"prompt": "a", "stop": [1]})", 400, "'stop'"},
      {"/v1/completions", R"({"prompt": "a", "seed": "x"})", 400, "'seed'"},
      {"/v1/completions", "{\"prompt\": " + deep + "}", 400, "nests deeper"},
      {"/v1/completions", "{\"prompt\": \"" + std::string(70000, 'a') + "\"}", 413, "--max-body"},
      {"/v1/chat/completions", R"({"messages": "hi"})", 400, "'messages'"},
      {"/v1/chat/completions", R"({"messages": []})", 400, "'messages'"},
      {"/v1/chat/completions", R"({"messages": [{"role": "wizard", "content": "x"}]})", 400,
       "unknown role"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", 400,
       "not supported"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "tools": 3})",
       400, "'tools'"},
      {"/tokenize", R"({"content": 5})", 400, "'content'"},
      {"/detokenize", R"({"tokens": [-1]})", 400, "not a token id"},
      {"/v1/nothing", "{}", 404, "no route"},
  };
  for (const Case& k : cases) {
    const Reply r = post(*c, k.path, k.body);
    EXPECT_EQ(r.status, k.status) << k.path << " " << k.body.substr(0, 80) << " -> " << r.text;
    ASSERT_TRUE(r.body.contains("error")) << r.text;
    EXPECT_NE(r.body["error"]["message"].get<std::string>().find(k.says), std::string::npos)
        << r.body["error"]["message"];
    EXPECT_TRUE(r.body["error"]["type"].is_string());
    // Still serving.
    const Reply ok = post(*c, "/v1/completions", Json({{"prompt", "And"}, {"max_tokens", 2}}));
    ASSERT_EQ(ok.status, 200) << "after " << k.body.substr(0, 80) << ": " << ok.text;
  }
}

TEST(Serve, ApiKeyIsRequiredButNotForHealth) {
  ServerProcess server({"-m", demo_model(), "--api-key", "sesame"});
  auto c = server.client();
  EXPECT_EQ(c->Get("/health")->status, 200);
  EXPECT_EQ(c->Get("/v1/models")->status, 401);
  EXPECT_EQ(c->Get("/v1/models", {{"Authorization", "Bearer wrong"}})->status, 401);
  EXPECT_EQ(c->Get("/metrics")->status, 401);
  const Json req = {{"prompt", "And"}, {"max_tokens", 2}};
  EXPECT_EQ(post(*c, "/v1/completions", req).status, 401);
  EXPECT_EQ(post(*c, "/v1/completions", req.dump(), {{"Authorization", "Bearer sesame"}}).status,
            200);
  const auto models = c->Get("/v1/models", {{"Authorization", "Bearer sesame"}});
  ASSERT_EQ(models->status, 200);
  const Json m = Json::parse(models->body);
  EXPECT_EQ(m["data"][0]["id"], "tandem-demo-moe-Q4_K_M.gguf");
  EXPECT_EQ(m["data"][0]["context_length"], 256);
}

// The conversation with tool calls, sent as an OpenAI client sends it (arguments as JSON text),
// renders into exactly the prompt Hugging Face's apply_chat_template writes for it.
TEST(Serve, ToolsRenderAsHuggingFaceRendersThem) {
  const std::string tmpl = data_path("templates/Qwen-Qwen3-0.6B.jinja").string();
  // (The golden prompt is ~950 of the demo's tokens: a context past the 256 it was trained for.)
  ServerProcess server({"-m", demo_model(), "--chat-template", tmpl, "--ctx", "1024"});
  auto c = server.client();
  std::ifstream cf(data_path("templates/conversations.json"));
  const Json conv = Json::parse(cf)["tools"];
  Json messages = conv["messages"];
  for (Json& m : messages) {
    if (!m.contains("tool_calls")) continue;
    for (Json& call : m["tool_calls"]) {
      call["function"]["arguments"] = call["function"]["arguments"].dump();
    }
  }
  std::ifstream ef(data_path("templates/expected/Qwen-Qwen3-0.6B.tools.txt"));
  std::stringstream es;
  es << ef.rdbuf();
  // The rendered prompt itself, character for character.
  const Reply text = post(*c, "/apply-template",
                          Json({{"messages", messages}, {"tools", conv["tools"]}}));
  ASSERT_EQ(text.status, 200) << text.text;
  EXPECT_EQ(text.body["prompt"].get<std::string>(), es.str());
  const Reply tok = post(*c, "/tokenize", Json({{"content", es.str()}, {"add_special", true}}));
  ASSERT_EQ(tok.status, 200);
  const size_t want = tok.body["tokens"].size();
  ASSERT_LT(want, 1024u);
  const Reply r = post(*c, "/v1/chat/completions",
                       Json({{"messages", messages},
                             {"tools", conv["tools"]},
                             {"max_tokens", 1},
                             {"temperature", 0}}));
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], want);
  // tool_choice none: the tools are not offered (a shorter prompt).
  const Reply none = post(*c, "/v1/chat/completions",
                          Json({{"messages", messages},
                                {"tools", conv["tools"]},
                                {"tool_choice", "none"},
                                {"max_tokens", 1}}));
  ASSERT_EQ(none.status, 200) << none.text;
  EXPECT_LT(none.body["usage"]["prompt_tokens"].get<int64_t>(), static_cast<int64_t>(want));
}

TEST(Serve, SamplingLogprobsNAndPrefixCache) {
  ServerProcess server({"-m", demo_model(), "--parallel", "4"});
  auto c = server.client();
  // n = 2: completion i is the seeded draw of seed + i.
  const Reply two = post(*c, "/v1/completions",
                         Json({{"prompt", "Blessed are"},
                               {"max_tokens", 12},
                               {"temperature", 1.0},
                               {"seed", 7},
                               {"n", 2}}));
  ASSERT_EQ(two.status, 200) << two.text;
  ASSERT_EQ(two.body["choices"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const Reply one = post(*c, "/v1/completions",
                           Json({{"prompt", "Blessed are"},
                                 {"max_tokens", 12},
                                 {"temperature", 1.0},
                                 {"seed", 7 + i}}));
    EXPECT_EQ(two.body["choices"][i]["text"], one.body["choices"][0]["text"]) << i;
    EXPECT_EQ(two.body["choices"][i]["index"], i);
  }
  // Greedy with logprobs: each chosen token is the most likely one; probabilities <= 1.
  const Reply lp = post(*c, "/v1/chat/completions",
                        Json({{"messages", {{{"role", "user"}, {"content", "And God"}}}},
                              {"max_tokens", 6},
                              {"temperature", 0},
                              {"logprobs", true},
                              {"top_logprobs", 3}}));
  ASSERT_EQ(lp.status, 200) << lp.text;
  const Json& content = lp.body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 6u);
  for (const Json& t : content) {
    ASSERT_EQ(t["top_logprobs"].size(), 3u);
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    EXPECT_EQ(t["token"], t["top_logprobs"][0]["token"]);
    EXPECT_GE(t["top_logprobs"][0]["logprob"].get<double>(),
              t["top_logprobs"][1]["logprob"].get<double>());
  }
  // A chat's next turn continues from the KV blocks of the last one.
  Json turn = {{"messages", {{{"role", "user"}, {"content", "In the beginning God created"}}}},
               {"max_tokens", 8},
               {"temperature", 0}};
  const Reply t1 = post(*c, "/v1/chat/completions", turn);
  ASSERT_EQ(t1.status, 200);
  turn["messages"].push_back(t1.body["choices"][0]["message"]);
  turn["messages"].push_back({{"role", "user"}, {"content", "and the earth"}});
  const Reply t2 = post(*c, "/v1/chat/completions", turn);
  ASSERT_EQ(t2.status, 200);
  EXPECT_GT(t2.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(),
            t1.body["usage"]["prompt_tokens"].get<int64_t>() / 2);
  EXPECT_GT(metric(*c, "tandem_prompt_tokens_cached_total"), 0);
  // Stop strings end the text before them.
  const Reply base =
      post(*c, "/v1/completions", Json({{"prompt", "And God said"}, {"max_tokens", 16}}));
  const std::string text = base.body["choices"][0]["text"];
  ASSERT_GT(text.size(), 6u);
  const std::string stop = text.substr(4, 3);
  const Reply stopped =
      post(*c, "/v1/completions",
           Json({{"prompt", "And God said"}, {"max_tokens", 16}, {"stop", stop}}));
  EXPECT_EQ(stopped.body["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(stopped.body["choices"][0]["finish_reason"], "stop");
  // tokenize / detokenize
  const Reply ids = post(*c, "/tokenize", Json({{"content", "And God said"}}));
  const Reply back = post(*c, "/detokenize", Json({{"tokens", ids.body["tokens"]}}));
  EXPECT_EQ(back.body["content"], "And God said");
}

// Logprobs are the model's: each greedy token's logprob and its top 3 equal log_softmax of the
// logits `tandem run --logits-out` writes at that position (the prompt plus the tokens before it
// prefilled), within the prefill-versus-decode arithmetic difference (measured 5e-7; bound 1e-5).
// A server that reported probabilities, unnormalized logits, the next position's values or the
// top list in another order fails.
TEST(Serve, LogprobsAreLogSoftmaxOfTheModelsLogits) {
  ServerProcess server({"-m", demo_model()});
  auto c = server.client();
  const Reply ids = post(*c, "/tokenize", Json({{"content", "And God said"}}));
  ASSERT_EQ(ids.status, 200) << ids.text;
  std::vector<int64_t> prompt = ids.body["tokens"].get<std::vector<int64_t>>();
  const int n = 6;
  const Reply r = post(*c, "/v1/completions",
                       Json({{"prompt", prompt}, {"max_tokens", n}, {"temperature", 0},
                             {"logprobs", 3}, {"ignore_eos", true}}));
  ASSERT_EQ(r.status, 200) << r.text;
  const Json& lp = r.body["choices"][0]["logprobs"];
  ASSERT_EQ(lp["token_logprobs"].size(), static_cast<size_t>(n)) << r.text;
  // The same greedy tokens by `tandem run`, then the logits of every position they follow.
  std::string list;
  for (int64_t t : prompt) list += (list.empty() ? "" : ",") + std::to_string(t);
  const auto gen = run_tandem("run -m " + demo_model() + " --tokens " + list + " -n " +
                              std::to_string(n) + " --temp 0 --ignore-eos --output ids");
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  std::vector<int64_t> answer;
  std::istringstream in(gen.out);
  for (int64_t t; in >> t;) answer.push_back(t);
  ASSERT_EQ(answer.size(), static_cast<size_t>(n)) << gen.out;
  for (int i = 0; i + 1 < n; ++i) list += "," + std::to_string(answer[i]);
  TempDir tmp("logprobs");
  const std::string logits_path = (tmp / "logits.f32").string();
  const auto pre = run_tandem("run -m " + demo_model() + " --tokens " + list +
                              " -n 1 --temp 0 --logits-out " + logits_path);
  ASSERT_EQ(pre.exit_code, 0) << pre.err;
  std::ifstream f(logits_path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), {});
  std::vector<float> all(bytes.size() / 4);
  std::memcpy(all.data(), bytes.data(), all.size() * 4);
  const size_t positions = prompt.size() + n - 1;
  ASSERT_EQ(all.size() % positions, 0u);
  const size_t vocab = all.size() / positions;
  double worst = 0;
  for (int i = 0; i < n; ++i) {
    const float* row = all.data() + (prompt.size() - 1 + i) * vocab;
    double mx = row[0];
    for (size_t v = 0; v < vocab; ++v) mx = std::max(mx, double(row[v]));
    double sum = 0;
    for (size_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - mx);
    const auto logprob = [&](size_t v) { return double(row[v]) - mx - std::log(sum); };
    std::vector<size_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 3, order.end(),
                      [&](size_t a, size_t b) { return row[a] > row[b]; });
    ASSERT_EQ(order[0], static_cast<size_t>(answer[i])) << "greedy token " << i;
    const double got = lp["token_logprobs"][i].get<double>();
    worst = std::max(worst, std::abs(got - logprob(answer[i])));
    EXPECT_NEAR(got, logprob(answer[i]), 1e-5) << "token " << i;
    const Json& top = lp["top_logprobs"][i];
    ASSERT_EQ(top.size(), 3u);
    std::vector<double> want_top, got_top;
    for (int k = 0; k < 3; ++k) want_top.push_back(logprob(order[k]));
    for (const auto& [piece, value] : top.items()) got_top.push_back(value.get<double>());
    std::sort(got_top.rbegin(), got_top.rend());
    for (int k = 0; k < 3; ++k) EXPECT_NEAR(got_top[k], want_top[k], 1e-5) << i << " top " << k;
  }
  std::printf("logprobs: largest difference from log_softmax of run's logits %.3g\n", worst);
}

// A hybrid model (Qwen3.5-MoE: DeltaNet layers whose recurrent state cannot be cut at any
// position) over three chat turns: each turn resumes from the sequence memory of the last one
// (its prompt's end checkpoint or the state it finished with), so cached_tokens covers the earlier
// turns, and its answer is the one a server that never saw them gives.
TEST(Serve, HybridChatTurnsResumeFromTheirCheckpoints) {
  const std::string model = data_path("golden/qwen35moe.gguf").string();
  const std::string tmpl = data_path("templates/Qwen-Qwen2.5-7B-Instruct.jinja").string();
  ServerProcess server({"-m", model, "--chat-template", tmpl, "--ctx", "1024", "--checkpoints",
                        "2"});
  auto c = server.client();
  Json req = {{"messages", Json::array()}, {"max_tokens", 12}, {"temperature", 0}};
  const char* turns[] = {"In the beginning God created the heaven and the earth.",
                         "And the earth was without form, and void.",
                         "And God said, Let there be light: and there was light."};
  int64_t last_prompt = 0;
  Reply reply;
  for (int t = 0; t < 3; ++t) {
    req["messages"].push_back({{"role", "user"}, {"content", turns[t]}});
    reply = post(*c, "/v1/chat/completions", req);
    ASSERT_EQ(reply.status, 200) << reply.text;
    const Json& usage = reply.body["usage"];
    const int64_t cached = usage["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
    if (t > 0) {
      // At least the last prompt but its final token (the checkpoint one before its end).
      EXPECT_GE(cached, last_prompt - 1) << "turn " << t;
    }
    EXPECT_LT(cached, usage["prompt_tokens"].get<int64_t>()) << "turn " << t;
    last_prompt = usage["prompt_tokens"].get<int64_t>();
    if (t < 2) req["messages"].push_back(reply.body["choices"][0]["message"]);
  }
  ServerProcess fresh({"-m", model, "--chat-template", tmpl, "--ctx", "1024"});
  auto fc = fresh.client();
  const Reply alone = post(*fc, "/v1/chat/completions", req);
  ASSERT_EQ(alone.status, 200) << alone.text;
  EXPECT_EQ(alone.body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(alone.body["usage"]["prompt_tokens"], reply.body["usage"]["prompt_tokens"]);
  EXPECT_EQ(alone.body["choices"][0]["message"]["content"],
            reply.body["choices"][0]["message"]["content"]);
}

TEST(Serve, FullQueueIsTooManyRequestsAndAHangUpCancels) {
  ServerProcess server({"-m", demo_model(), "--parallel", "1", "--queue", "0"});
  auto c = server.client();
  std::atomic<bool> started{false}, release{false};
  std::thread holder([&] {
    auto cli = server.client();
    stream(*cli, "/v1/completions",
           Json({{"prompt", "And"}, {"max_tokens", 200}, {"ignore_eos", true}}), [&](size_t n) {
             if (n >= 2) started = true;
             return !release.load();
           });
  });
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto res =
      c->Post("/v1/completions", R"({"prompt": "And", "max_tokens": 2})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 429) << res->body;
  EXPECT_EQ(res->get_header_value("Retry-After"), "1");
  EXPECT_NE(res->body.find("queue is full"), std::string::npos);
  release = true;  // the holder hangs up: its completion is cancelled
  holder.join();
  wait_idle(*c);
  EXPECT_EQ(metric(*c, "tandem_completions_total{finish_reason=\"cancelled\"}"), 1);
  // Cancelled means stopped: the generation ended well before its 200 tokens and left the batch.
  EXPECT_LT(metric(*c, "tandem_generated_tokens_total"), 150);
  EXPECT_EQ(metric(*c, "tandem_requests_running"), 0);
  EXPECT_EQ(post(*c, "/v1/completions", Json({{"prompt", "And"}, {"max_tokens", 2}})).status, 200);
}

}  // namespace
}  // namespace tandem::test
