// `tandem serve` under hostile clients (docs/hostile-input.md): each case is what a client did
// to take the server down or exhaust it, and the server must answer it with an error naming the
// problem, bounded in time and memory, and go on serving. Raw sockets where the bytes on the
// wire are the point (framing, pipelining, trickling, HTTP/1.0).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "engine/jinja_value.h"
#include "tests/server/raw_client.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace tandem::test {
namespace {

using Json = jinja::Json;

std::string demo_model() {
  return data_path("demo/tandem-demo-moe-Q4_K_M.gguf").string();
}

std::string post_bytes(const std::string& path, const std::string& body,
                       const std::string& version = "HTTP/1.1", const std::string& extra = "") {
  return "POST " + path + " " + version + "\r\nHost: x\r\nContent-Type: application/json\r\n" +
         extra + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

struct Reply {
  int status = 0;
  Json body;
};

Reply post(httplib::Client& c, const std::string& path, const Json& body,
           const httplib::Headers& headers = {}) {
  Reply r;
  const auto res = c.Post(path.c_str(), headers, body.dump(), "application/json");
  if (!res) return r;
  r.status = res->status;
  r.body = Json::parse(res->body, nullptr, false);
  return r;
}

void expect_serving(const ServerProcess& server) {
  auto c = server.client();
  const Reply ok = post(*c, "/v1/completions", Json({{"prompt", "And"}, {"max_tokens", 2}}));
  EXPECT_EQ(ok.status, 200) << "the server stopped serving";
}

// Every integer field at one past each of its bounds, streamed or not, on both endpoints: a 400
// naming the field (n = 0 was a 200 with an empty body, then the server died).
TEST(Hostile, EveryNumberIsCheckedAtBothBounds) {
  ServerProcess server({"-m", demo_model()});
  auto c = server.client();
  const Json chat = Json::array({Json({{"role", "user"}, {"content", "hi"}})});
  struct Field {
    std::string name;
    Json low, high;
  };
  const std::vector<Field> fields = {{"n", 0, 17},
                                     {"max_tokens", -1, 257},
                                     {"top_k", -1, int64_t{1} << 40},
                                     {"repeat_last_n", -2, uint64_t{1} << 63},
                                     {"temperature", -0.5, 2.5},
                                     {"top_p", -0.1, 1.5}};
  for (const bool is_chat : {false, true}) {
    for (const bool streamed : {false, true}) {
      for (const Field& f : fields) {
        for (const Json& v : {f.low, f.high}) {
          Json body = {{"max_tokens", 2}, {"stream", streamed}};
          if (is_chat) {
            body["messages"] = chat;
          } else {
            body["prompt"] = "And";
          }
          body[f.name] = v;
          const std::string path = is_chat ? "/v1/chat/completions" : "/v1/completions";
          const Reply r = post(*c, path, body);
          EXPECT_EQ(r.status, 400) << path << " " << f.name << " = " << v.dump();
          ASSERT_TRUE(r.body.is_object() && r.body.contains("error")) << f.name;
          EXPECT_EQ(r.body["error"]["param"], f.name);
        }
      }
    }
  }
  const std::vector<std::pair<std::string, Json>> completions_only = {{"logprobs", -1},
                                                                      {"logprobs", 21}};
  for (const auto& [name, v] : completions_only) {
    const Reply r = post(*c, "/v1/completions", Json({{"prompt", "And"}, {name, v}}));
    EXPECT_EQ(r.status, 400) << name << " = " << v.dump();
  }
  const Reply top = post(*c, "/v1/chat/completions",
                         Json({{"messages", chat}, {"logprobs", true}, {"top_logprobs", 21}}));
  EXPECT_EQ(top.status, 400);
  expect_serving(server);
}

// A body is never read past --max-body, whatever its framing: chunked, without a length, a
// Content-Length far beyond the limit (answered before its body is sent), compressed.
TEST(Hostile, BodiesAreReadOnlyUpToTheLimit) {
  ServerProcess server({"-m", demo_model(), "--max-body", "65536"});
  const int64_t rss_before = rss_kib(server.pid());
  {  // 64 MB chunked: refused after the limit, the connection closed.
    RawClient k(server.port());
    ASSERT_TRUE(k.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n"));
    const std::string chunk = "100000\r\n" + std::string(1 << 20, 'a') + "\r\n";
    int sent = 0;
    while (sent < 64 && k.send(chunk)) ++sent;
    const std::string r = k.read_all(10);
    EXPECT_EQ(status_of(r), 413) << r.substr(0, 200);
    EXPECT_NE(r.find("--max-body"), std::string::npos);
    EXPECT_LT(sent, 64) << "the server read a 64 MB body";
  }
  {  // A small chunked body is read.
    RawClient k(server.port());
    const std::string body = R"({"prompt": "And", "max_tokens": 2})";
    char size[16];
    std::snprintf(size, sizeof(size), "%zx", body.size());
    ASSERT_TRUE(k.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n" +
                       std::string(size) + "\r\n" + body + "\r\n0\r\n\r\n"));
    EXPECT_EQ(status_of(k.read_all(30)), 200);
  }
  {  // No length: 411 (it was read until the client closed).
    RawClient k(server.port());
    ASSERT_TRUE(k.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n{\"prompt\": "));
    const std::string r = k.read_all(5);
    EXPECT_EQ(status_of(r), 411) << r;
    EXPECT_TRUE(k.closed());
  }
  {  // A terabyte announced: 413 at once, nothing read.
    RawClient k(server.port());
    const auto t0 = Clock::now();
    ASSERT_TRUE(k.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                       "Content-Length: 1000000000000\r\n\r\n"));
    const std::string r = k.read_all(5);
    EXPECT_EQ(status_of(r), 413) << r;
    EXPECT_LT(seconds_since(t0), 3.0);
  }
  {  // Compressed: refused (600 KB of gzip inflated to 600 MB).
    RawClient k(server.port());
    ASSERT_TRUE(k.send(post_bytes("/v1/completions", std::string(100, '\0'), "HTTP/1.1",
                                  "Content-Encoding: gzip\r\n")));
    const std::string r = k.read_all(5);
    EXPECT_EQ(status_of(r), 415) << r;
    EXPECT_NE(r.find("compressed"), std::string::npos);
  }
  {  // Headers without end: cut at 64 KiB.
    RawClient k(server.port());
    ASSERT_TRUE(k.send("GET /health HTTP/1.1\r\n"));
    const std::string header = "X-Pad: " + std::string(1000, 'p') + "\r\n";
    int sent = 0;
    while (sent < 10000 && k.send(header)) ++sent;
    EXPECT_LT(sent, 10000) << "the server read 10 MB of headers";
    EXPECT_EQ(status_of(k.read_all(5)), 431);
  }
  EXPECT_LT(rss_kib(server.pid()) - rss_before, 32 * 1024) << "KiB grown";
  expect_serving(server);
}

struct Exit {
  int status = -1;  // exit code, or -signal
  double seconds = 0;
  std::string err;
};

// Runs `tandem serve ARGS` to its end (killed after `limit_s`), with an address-space limit when
// `as_limit_bytes` is given.
Exit run_serve(std::vector<std::string> args, double limit_s, rlim_t as_limit_bytes = 0) {
  TempDir tmp("serve-exit");
  const std::string log = (tmp / "stderr").string();
  const auto t0 = Clock::now();
  const pid_t pid = spawn_serve(std::move(args), log, [as_limit_bytes] {
    if (as_limit_bytes != 0) {
      const rlimit r{as_limit_bytes, as_limit_bytes};
      setrlimit(RLIMIT_AS, &r);
    }
  });
  Exit e;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (seconds_since(t0) > limit_s) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      e.status = -999;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  e.seconds = seconds_since(t0);
  if (e.status != -999) e.status = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  e.err = ss.str();
  return e;
}

// A model that cannot be loaded ends the process with the load error (it answered /health 503
// "loading" for ever).
TEST(Hostile, AModelThatDoesNotLoadEndsTheServer) {
  TempDir tmp("bad-model");
  const std::string empty = (tmp / "empty.gguf").string();
  std::ofstream(empty).close();
  for (const std::string& path : {std::string("/nonexistent/model.gguf"), empty,
                                  std::string("/dev/zero")}) {
    for (int round = 0; round < 3; ++round) {  // (it hung on a race: tried a few times)
      const Exit e = run_serve({"-m", path, "--port", "0"}, 30);
      EXPECT_EQ(e.status, 1) << path << ": " << e.err;
      EXPECT_NE(e.err.find(path), std::string::npos) << e.err;
    }
  }
}

// A second server on a port in use fails to bind, naming it (the two shared its requests).
TEST(Hostile, ASecondServerCannotTakeThePort) {
  ServerProcess first({"-m", demo_model()});
  const Exit e = run_serve({"-m", demo_model(), "--port", std::to_string(first.port())}, 30);
  EXPECT_EQ(e.status, 1) << e.err;
  EXPECT_NE(e.err.find(std::to_string(first.port())), std::string::npos) << e.err;
  EXPECT_NE(e.err.find("in use"), std::string::npos) << e.err;
  expect_serving(first);
}

// Clients trickling a byte at a time hold a connection only until --timeout; meanwhile /health
// answers at once; connections beyond the pool and its waiting room are answered 503 at once.
TEST(Hostile, SlowClientsAreCutAtTheTimeout) {
  ServerProcess server({"-m", demo_model(), "--timeout", "3", "--http-threads", "32"});
  // Half trickle their headers, half their body after whole headers.
  std::vector<std::unique_ptr<RawClient>> slow;
  std::vector<size_t> at;
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n";
  const std::string request = head + "\r\n" + std::string(40, ' ');
  for (int i = 0; i < 24; ++i) {
    slow.push_back(std::make_unique<RawClient>(server.port()));
    at.push_back(i % 2 == 0 ? 0 : head.size() + 2);
    if (i % 2 == 1) slow.back()->send(request.substr(0, at.back()));
  }
  const auto t0 = Clock::now();
  bool all_cut = false;
  while (seconds_since(t0) < 15 && !all_cut) {
    all_cut = true;
    for (size_t i = 0; i < slow.size(); ++i) {
      if (!slow[i]->closed() && at[i] < request.size()) slow[i]->send(request.substr(at[i]++, 1));
      slow[i]->read_all(0.001);
      all_cut = all_cut && slow[i]->closed();
    }
    const auto h0 = Clock::now();
    auto c = server.client();
    c->set_read_timeout(5);
    const auto health = c->Get("/health");
    EXPECT_TRUE(health && health->status == 200);
    // (Held behind the slow clients it would wait for their 3 s timeout; 2 s leaves a loaded
    // 2-core machine room.)
    EXPECT_LT(seconds_since(h0), 2.0) << "/health waited behind the slow clients";
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
  }
  EXPECT_TRUE(all_cut) << "slow clients still connected after " << seconds_since(t0) << " s";
  EXPECT_LT(seconds_since(t0), 9.0);  // (--timeout 3, with room for a loaded machine)
  expect_serving(server);

  // 2 threads, 2 waiting: of five connections that each begin a request and never finish it, one
  // is answered 503 at once, not queued until an idle connection's 5 s timeout frees a thread (a
  // 200 after 5 s). Which one depends on when the workers take theirs from the waiting room (on a
  // loaded machine the fourth may find it full); the window stops short of the timeout and leaves
  // a loaded 2-core machine room to schedule the server.
  ServerProcess small({"-m", demo_model(), "--timeout", "5", "--http-threads", "2"});
  std::vector<std::unique_ptr<RawClient>> idle;
  for (int i = 0; i < 5; ++i) {
    idle.push_back(std::make_unique<RawClient>(small.port()));
    idle.back()->send("GET /health HTTP/1.1\r\n");  // a request begun, never finished
  }
  const auto e0 = Clock::now();
  std::vector<std::string> got(idle.size());
  int refused = -1;
  while (refused < 0 && seconds_since(e0) < 4.5) {
    for (size_t i = 0; i < idle.size() && refused < 0; ++i) {
      got[i] += idle[i]->read_all(0.02);
      if (status_of(got[i]) == 503) refused = static_cast<int>(i);
    }
  }
  ASSERT_GE(refused, 0) << "no connection refused within 4.5 s";
  EXPECT_LT(seconds_since(e0), 4.5);
  EXPECT_NE(got[refused].find("--http-threads"), std::string::npos) << got[refused];
  for (size_t i = 0; i < idle.size(); ++i) {
    if (static_cast<int>(i) != refused) EXPECT_EQ(got[i], "") << "connection " << i;
  }
}

// Requests sent back to back on one connection are each answered, in order; an HTTP/1.0 client
// gets bodies it can read (no chunked framing) and the connection closed after.
TEST(Hostile, PipelinedRequestsAndHttp10Clients) {
  ServerProcess server({"-m", demo_model()});
  const std::string body = R"({"prompt": "And God", "max_tokens": 3})";
  {
    RawClient k(server.port());
    ASSERT_TRUE(k.send(post_bytes("/v1/completions", body) + post_bytes("/v1/completions", body) +
                       "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    const std::string r = k.read_all(30);
    EXPECT_EQ(count(r, "HTTP/1.1 200"), 3u) << r;
    EXPECT_EQ(count(r, "\"text_completion\""), 2u) << r;
    EXPECT_NE(r.find("{\"status\":\"ok\"}"), std::string::npos);
    EXPECT_TRUE(k.closed());
  }
  auto c = server.client();
  const Reply want = post(*c, "/v1/completions", Json::parse(body));
  ASSERT_EQ(want.status, 200);
  for (const bool streamed : {false, true}) {
    RawClient k(server.port());
    Json b = Json::parse(body);
    b["stream"] = streamed;
    ASSERT_TRUE(k.send(post_bytes("/v1/completions", b.dump(), "HTTP/1.0")));
    const std::string r = k.read_all(30);
    EXPECT_TRUE(k.closed());
    EXPECT_EQ(status_of(r), 200) << r;
    EXPECT_EQ(r.find("Transfer-Encoding"), std::string::npos) << r;
    const std::string payload = r.substr(r.find("\r\n\r\n") + 4);
    if (streamed) {
      EXPECT_NE(payload.find("data: [DONE]"), std::string::npos) << payload;
    } else {
      const Json j = Json::parse(payload, nullptr, false);
      ASSERT_TRUE(j.is_object()) << payload;
      EXPECT_EQ(j["choices"][0]["text"], want.body["choices"][0]["text"]);
    }
  }
}

// More HTTP threads than the process may start: one line naming the count (it aborted).
TEST(Hostile, ThreadsThatCannotStartAreAOneLineError) {
  const Exit e = run_serve({"-m", demo_model(), "--port", "0", "--http-threads", "60000"}, 60,
                           rlim_t{2} << 30);
  EXPECT_EQ(e.status, 1) << e.err;
  EXPECT_NE(e.err.find("HTTP threads"), std::string::npos) << e.err;
  EXPECT_NE(e.err.find("--http-threads"), std::string::npos) << e.err;
}

// Fields of the wrong type or meaning get a 400 naming them; messages as OpenAI clients send
// them in tool use render; a template's error does not show the server's paths.
TEST(Hostile, RequestsOfTheWrongShapeAreNamed) {
  TempDir tmp("bad-template");
  const std::string raising = (tmp / "raising.jinja").string();
  std::ofstream(raising) << "{{ raise_exception('no such role') }}";
  ServerProcess bad({"-m", demo_model(), "--chat-template", raising});
  {
    auto c = bad.client();
    const Reply r = post(*c, "/v1/chat/completions",
                         Json({{"messages", Json::array({{{"role", "user"}, {"content", "x"}}})}}));
    EXPECT_EQ(r.status, 400);
    const std::string m = r.body["error"]["message"].get<std::string>();
    EXPECT_NE(m.find("no such role"), std::string::npos) << m;
    EXPECT_EQ(m.find(tmp.path().string()), std::string::npos) << m;
    EXPECT_EQ(m.find("/tmp"), std::string::npos) << m;
  }
  ServerProcess server({"-m", demo_model()});
  auto c = server.client();
  for (const char* field : {"add_special", "with_pieces"}) {
    const Reply r = post(*c, "/tokenize", Json({{"content", "x"}, {field, "yes"}}));
    EXPECT_EQ(r.status, 400) << field;
    EXPECT_EQ(r.body["error"]["param"], field);
  }
  const Reply top =
      post(*c, "/v1/chat/completions",
           Json({{"messages", Json::array({{{"role", "user"}, {"content", "x"}}})},
                 {"top_logprobs", 3}}));
  EXPECT_EQ(top.status, 400);
  EXPECT_EQ(top.body["error"]["param"], "top_logprobs");
  // Every token banned: nothing can be sampled.
  const int vocab_size = [&] {  // the smallest id /detokenize refuses
    int lo = 0, hi = 1 << 20;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (post(*c, "/detokenize", Json({{"tokens", {mid}}})).status == 200) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo;
  }();
  Json all = Json::object();
  ASSERT_GT(vocab_size, 100);
  for (int id = 0; id < vocab_size; ++id) all[std::to_string(id)] = -100;
  const Reply banned =
      post(*c, "/v1/completions", Json({{"prompt", "And"}, {"max_tokens", 2}, {"logit_bias", all}}));
  EXPECT_EQ(banned.status, 400);
  EXPECT_EQ(banned.body["error"]["param"], "logit_bias");
  // All but one: that one, every time.
  const Reply said = post(*c, "/tokenize", Json({{"content", " said"}, {"with_pieces", true}}));
  ASSERT_EQ(said.status, 200);
  const int64_t id = said.body["tokens"][0]["id"].get<int64_t>();
  const std::string piece = said.body["tokens"][0]["piece"].get<std::string>();
  all.erase(std::to_string(id));
  const Reply one_left = post(
      *c, "/v1/completions",
      Json({{"prompt", "And"}, {"max_tokens", 2}, {"ignore_eos", true}, {"logit_bias", all}}));
  ASSERT_EQ(one_left.status, 200);
  EXPECT_EQ(one_left.body["choices"][0]["text"], piece + piece);
  expect_serving(server);
}

// An assistant turn with tool calls and "content": null (what OpenAI clients send) renders on
// the templates that take content as a string, as HF renders it with "" content.
TEST(Hostile, ToolCallTurnsWithNullContentRender) {
  for (const char* name : {"Qwen-Qwen3-0.6B", "openai-gpt-oss-120b"}) {
    SCOPED_TRACE(name);
    ServerProcess server({"-m", demo_model(), "--chat-template",
                          data_path(std::string("templates/") + name + ".jinja").string(),
                          "--ctx", "1024"});
    auto c = server.client();
    const Json call = {{"id", "call_0"},
                       {"type", "function"},
                       {"function", {{"name", "f"}, {"arguments", "{\"x\": 1}"}}}};
    Json messages = Json::array({{{"role", "user"}, {"content", "use f"}},
                                 {{"role", "assistant"},
                                  {"content", nullptr},
                                  {"tool_calls", Json::array({call})}},
                                 {{"role", "tool"}, {"tool_call_id", "call_0"}, {"content", "1"}}});
    const Json tools = Json::parse(
        R"([{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object",
            "properties":{"x":{"type":"integer"}}}}}])");
    const Reply r = post(*c, "/v1/chat/completions",
                         Json({{"messages", messages}, {"tools", tools}, {"max_tokens", 2}}));
    EXPECT_EQ(r.status, 200) << r.body.dump();
    messages[1]["content"] = "";
    const Reply same = post(*c, "/v1/chat/completions",
                            Json({{"messages", messages}, {"tools", tools}, {"max_tokens", 2}}));
    ASSERT_EQ(same.status, 200);
    EXPECT_EQ(r.body["usage"]["prompt_tokens"], same.body["usage"]["prompt_tokens"]);
  }
}

// The API key as sent: a percent-encoded header is not the key (it matched once decoded), and a
// key with '%' in it works.
TEST(Hostile, TheApiKeyIsComparedAsSent) {
  ServerProcess server({"-m", demo_model(), "--api-key", "k%41y"});
  const auto get = [&](const std::string& auth) {
    RawClient k(server.port());
    k.send("GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: " + auth +
           "\r\n\r\n");
    return status_of(k.read_all(5));
  };
  EXPECT_EQ(get("Bearer k%41y"), 200);
  EXPECT_EQ(get("Bearer kAy"), 401);
  EXPECT_EQ(get("Bearer k%2541y"), 401);
  EXPECT_EQ(get("Bearer k%41y "), 200);  // (trailing spaces are not part of a header's value)
  EXPECT_EQ(get("bearer k%41y"), 401);
}

// gpt-oss chat, streamed and not, greedy: the same text (the stream kept the trailing spaces the
// whole answer trimmed: an answer cut by a stop string ends in one).
TEST(Hostile, StreamedChatEqualsTheWholeAnswer) {
  ServerProcess server({"-m", demo_model(), "--chat-template",
                        data_path("templates/openai-gpt-oss-120b.jinja").string(), "--ctx", "1024",
                        "--parallel", "4"});
  auto c = server.client();
  const std::vector<std::string> words = {"And God said", "In the beginning", "light ", "waters",
                                          "the earth was", " day and night ", "Let there be"};
  const std::vector<std::string> stops = {"", "the", "and", "God"};
  for (int i = 0; i < 16; ++i) {
    Json body = {
        {"messages", Json::array({{{"role", "user"}, {"content", words[i % words.size()]}}})},
        {"max_tokens", 40 + 23 * i},
        {"temperature", 0}};
    if (!stops[i % 4].empty()) body["stop"] = Json::array({stops[i % 4]});
    const Reply whole = post(*c, "/v1/chat/completions", body);
    ASSERT_EQ(whole.status, 200);
    Json sb = body;
    sb["stream"] = true;
    const auto res = c->Post("/v1/chat/completions", sb.dump(), "application/json");
    ASSERT_TRUE(res && res->status == 200);
    std::string content, reasoning;
    std::istringstream in(res->body);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("data: {", 0) != 0) continue;
      const Json ev = Json::parse(line.substr(6));
      if (ev["choices"].empty()) continue;
      const Json& d = ev["choices"][0]["delta"];
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    }
    const Json& m = whole.body["choices"][0]["message"];
    EXPECT_EQ(content, m["content"].is_string() ? m["content"].get<std::string>() : "") << i;
    EXPECT_EQ(reasoning, m.value("reasoning_content", std::string())) << i;
  }
}

// Requests with 2 MB prompts, each on a connection of its own (a thread's arena each): the
// memory they took is handed back (RSS grew by hundreds of MiB when glibc kept it in its
// per-thread arenas).
TEST(Hostile, LargeBodiesDoNotPileUpInMemory) {
  ServerProcess server({"-m", demo_model()});
  std::string words;
  for (int i = 0; i < (1 << 20); ++i) words += "a ";
  const std::string request =
      post_bytes("/v1/completions", Json({{"prompt", words}, {"max_tokens", 1}}).dump(),
                 "HTTP/1.1", "Connection: close\r\n");
  const auto round = [&](int requests) {
    std::vector<std::thread> threads;
    for (int t = 0; t < 16; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < requests / 16; ++i) {
          RawClient k(server.port());
          k.send(request);
          EXPECT_EQ(status_of(k.read_all(60)), 400);  // (longer than the context)
        }
      });
    }
    for (auto& t : threads) t.join();
  };
  round(32);
  const int64_t warm = rss_kib(server.pid());
  round(64);
  const int64_t after = rss_kib(server.pid());
  std::printf("RSS %ld KiB after the warm-up, %ld KiB after 64 more requests\n",
              static_cast<long>(warm), static_cast<long>(after));
  EXPECT_LT(after - warm, 32 * 1024) << "RSS " << warm << " KiB after warm-up, " << after
                                     << " KiB after 64 more requests of 2 MB";
  expect_serving(server);
}

}  // namespace
}  // namespace tandem::test
