// `tandem serve` soaked by 64 clients for five minutes (TANDEM_SOAK_SECONDS to change it), each
// mixing good requests with hostile ones: streams hung up early, senders trickling a byte at a
// time, bodies past --max-body, malformed requests. Every good request is greedy and its answer
// must equal its solo run (taken on the idle server first); every hostile one must get its
// refusal. Afterwards /health answers within a second, the KV pool is empty, and the resident
// memory is within 10% of its value after the warm-up (no per-request leak).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/jinja_value.h"
#include "tests/server/raw_client.h"
#include "tests/server/server_process.h"

namespace tandem::test {
namespace {

using Json = jinja::Json;

const std::vector<std::string> kPrompts = {"And God said",      "In the beginning",
                                           "And the earth was", "Let there be light",
                                           "And the evening",   "The waters"};

Json good_request(size_t prompt, int max_tokens) {
  return {{"prompt", kPrompts[prompt]}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

// The text of a completion, streamed or not ("" and *ok false when it failed).
std::string complete(httplib::Client& c, Json body, bool stream, bool* ok) {
  body["stream"] = stream;
  const auto res = c.Post("/v1/completions", body.dump(), "application/json");
  *ok = res && res->status == 200;
  if (!*ok) return "";
  if (!stream) {
    const Json j = Json::parse(res->body, nullptr, false);
    *ok = j.is_object() && j.contains("choices");
    return *ok ? j["choices"][0]["text"].get<std::string>() : "";
  }
  std::string text;
  std::istringstream in(res->body);
  std::string line;
  bool done = false;
  while (std::getline(in, line)) {
    if (line == "data: [DONE]") done = true;
    if (line.rfind("data: {", 0) != 0) continue;
    const Json ev = Json::parse(line.substr(6), nullptr, false);
    if (!ev.is_object() || ev.contains("error")) *ok = false;
    if (ev.is_object() && ev.contains("choices") && !ev["choices"].empty()) {
      text += ev["choices"][0]["text"].get<std::string>();
    }
  }
  *ok = *ok && done;
  return text;
}

struct Tally {
  std::atomic<int> good{0}, good_failed{0}, good_differed{0}, aborted{0}, slow_cut{0},
      slow_not_cut{0}, oversized_refused{0}, oversized_accepted{0}, bad_refused{0},
      bad_accepted{0};
  std::mutex mu;
  std::string first_problem;
  void problem(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (first_problem.empty()) first_problem = what;
  }
};

// One client's loop until `until`: a random mix of good and hostile requests.
void client(const ServerProcess& server, int seed, Clock::time_point until,
            const std::vector<std::vector<std::string>>& solo, Tally* t) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  auto c = server.client();
  c->set_read_timeout(60);
  while (Clock::now() < until) {
    const int kind = static_cast<int>(rng() % 20);
    if (kind < 10) {  // good: greedy, its solo answer
      const size_t p = rng() % kPrompts.size();
      const size_t m = rng() % solo[p].size();
      bool ok = false;
      const std::string text = complete(*c, good_request(p, 4 + 6 * static_cast<int>(m)),
                                        rng() % 2 == 0, &ok);
      ++t->good;
      if (!ok) {
        ++t->good_failed;
        t->problem("a good request failed");
      } else if (text != solo[p][m]) {
        ++t->good_differed;
        t->problem("'" + text + "' instead of its solo '" + solo[p][m] + "'");
      }
    } else if (kind < 13) {  // a stream hung up after a few chunks
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.headers = {{"Content-Type", "application/json"}};
      Json body = good_request(rng() % kPrompts.size(), 40);
      body["stream"] = true;
      req.body = body.dump();
      size_t got = 0;
      const size_t stop_at = 50 + rng() % 400;
      req.content_receiver = [&](const char*, size_t n, uint64_t, uint64_t) {
        got += n;
        return got < stop_at;
      };
      c->send(req);
      ++t->aborted;
    } else if (kind < 15) {  // a sender trickling its headers: cut at --timeout
      RawClient k(server.port());
      const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n";
      const auto t0 = Clock::now();
      for (size_t i = 0; i < head.size() && !k.closed() && seconds_since(t0) < 8; ++i) {
        k.send(head.substr(i, 1));
        k.read_all(0.25);
      }
      if (k.closed() || !k.read_all(2).empty() || k.closed()) {
        ++t->slow_cut;
      } else {
        ++t->slow_not_cut;
        t->problem("a slow sender was not cut");
      }
    } else if (kind < 17) {  // chunked past --max-body
      RawClient k(server.port());
      k.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
      const std::string chunk = "10000\r\n" + std::string(0x10000, 'a') + "\r\n";
      for (int i = 0; i < 16 && k.send(chunk); ++i) {
      }
      if (status_of(k.read_all(10)) == 413) {
        ++t->oversized_refused;
      } else {
        ++t->oversized_accepted;
        t->problem("an oversized body was not refused with 413");
      }
    } else {  // malformed
      static const std::vector<std::string> bad = {
          "{not json", R"({"prompt": "x", "n": 0})", R"({"prompt": "x", "max_tokens": -1})",
          R"({"prompt": [1, 99999999]})", R"({"prompt": "x", "temperature": "hot"})"};
      const auto res = c->Post("/v1/completions", bad[rng() % bad.size()], "application/json");
      if (res && res->status == 400) {
        ++t->bad_refused;
      } else {
        ++t->bad_accepted;
        t->problem("a malformed request was not refused with 400");
      }
    }
  }
}

TEST(ServeSoak, SixtyFourHostileClientsForFiveMinutes) {
  const char* env = std::getenv("TANDEM_SOAK_SECONDS");
  const double seconds = env != nullptr ? std::atof(env) : 300.0;
  ServerProcess server({"-m", data_path("demo/tandem-demo-moe-Q4_K_M.gguf").string(),
                        "--parallel", "8", "--prefix-cache", "0", "--timeout", "3", "--max-body",
                        "65536", "--http-threads", "160"});
  // The solo answers, on the idle server.
  std::vector<std::vector<std::string>> solo(kPrompts.size());
  {
    auto c = server.client();
    for (size_t p = 0; p < kPrompts.size(); ++p) {
      for (int m = 0; m < 4; ++m) {
        bool ok = false;
        solo[p].push_back(complete(*c, good_request(p, 4 + 6 * m), false, &ok));
        ASSERT_TRUE(ok);
      }
    }
  }
  Tally tally;
  const auto run = [&](double s) {
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(s));
    std::vector<std::thread> threads;
    for (int i = 0; i < 64; ++i) {
      threads.emplace_back([&, i] { client(server, i + 1000 * static_cast<int>(s), until, solo,
                                           &tally); });
    }
    for (auto& th : threads) th.join();
  };
  run(std::max(10.0, seconds * 0.1));  // warm-up: pools, caches, thread stacks
  const int64_t warm = rss_kib(server.pid());
  run(seconds);
  const int64_t after = rss_kib(server.pid());

  auto c = server.client();
  const auto h0 = Clock::now();
  const auto health = c->Get("/health");
  EXPECT_TRUE(health && health->status == 200);
  EXPECT_LT(seconds_since(h0), 1.0);
  for (int i = 0; i < 500 && (metric(*c, "tandem_requests_running") != 0 ||
                              metric(*c, "tandem_requests_waiting") != 0);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(metric(*c, "tandem_kv_blocks_used"), 0);
  EXPECT_LT(std::abs(after - warm), warm / 10)
      << "RSS " << warm << " KiB after warm-up, " << after << " KiB at the end";
  std::printf("good %d (failed %d, differed %d), aborted %d, slow cut %d / not %d, oversized "
              "refused %d / accepted %d, malformed refused %d / accepted %d; RSS %ld -> %ld KiB\n",
              tally.good.load(), tally.good_failed.load(), tally.good_differed.load(),
              tally.aborted.load(), tally.slow_cut.load(), tally.slow_not_cut.load(),
              tally.oversized_refused.load(), tally.oversized_accepted.load(),
              tally.bad_refused.load(), tally.bad_accepted.load(), static_cast<long>(warm),
              static_cast<long>(after));
  EXPECT_GT(tally.good.load(), 100);
  EXPECT_EQ(tally.good_failed.load(), 0) << tally.first_problem;
  EXPECT_EQ(tally.good_differed.load(), 0) << tally.first_problem;
  EXPECT_EQ(tally.slow_not_cut.load(), 0);
  EXPECT_GT(tally.slow_cut.load(), 0);
  EXPECT_EQ(tally.oversized_accepted.load(), 0);
  EXPECT_GT(tally.oversized_refused.load(), 0);
  EXPECT_EQ(tally.bad_accepted.load(), 0);
  EXPECT_GT(tally.aborted.load(), 0);
}

}  // namespace
}  // namespace tandem::test
