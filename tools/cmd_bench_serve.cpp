// `tandem bench-serve`: a load generator for any OpenAI-compatible server (tandem serve,
// llama-server, ...): N concurrent clients stream /v1/completions requests of random token-id
// prompts (lengths drawn from a range) with ignore_eos, so every server reads the same prompts and
// writes the same number of tokens; it reports time to first token and time per output token
// (p50 / p90 / p99), aggregate output tokens/s and errors, per client count.
#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "engine/jinja_value.h"
#include "tools/command.h"
#include "tools/options.h"

namespace tandem::tools {
namespace {

using Json = jinja::Json;
using Clock = std::chrono::steady_clock;

struct BenchServeArgs {
  std::string url = "http://127.0.0.1:8080";
  std::string api_key;
  std::string model;
  std::vector<int> clients{1, 4, 16};
  int requests = 0;  // per client count; 0: 2 per client (at least 4)
  int prompt_tokens = 256, prompt_spread = 0;
  int max_tokens = 128, max_spread = 0;
  int vocab = 32000;
  int token_min = 100;
  uint64_t seed = 1;
  bool json = false;
};

struct Result {
  bool ok = false;
  std::string error;
  double ttft = 0, tpot = 0;  // seconds
  int64_t tokens = 0;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double at = p * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(at);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (at - static_cast<double>(lo));
}

// One streamed completion: the SSE events' times and the token count (usage when the server
// reports it, else one per chunk with text).
Result one_request(httplib::Client& cli, const BenchServeArgs& a, const std::string& path,
                   const std::vector<int>& prompt, int max_tokens) {
  Json body = {{"prompt", prompt}, {"max_tokens", max_tokens},
               {"stream", true},   {"ignore_eos", true},
               {"temperature", 0}, {"stream_options", {{"include_usage", true}}}};
  if (!a.model.empty()) body["model"] = a.model;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = {{"Content-Type", "application/json"}};
  if (!a.api_key.empty()) req.headers.insert({"Authorization", "Bearer " + a.api_key});
  req.body = body.dump();
  Result r;
  std::string buf, raw;
  const auto t0 = Clock::now();
  Clock::time_point first, last;
  int64_t chunks = 0, usage = -1;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    const auto now = Clock::now();
    buf.append(data, len);
    if (raw.size() < 4096) raw.append(data, std::min<size_t>(len, 4096));
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      if (line.rfind("data: ", 0) != 0) continue;
      line.erase(0, 6);
      if (line == "[DONE]") continue;
      const Json ev = Json::parse(line, nullptr, false);
      if (ev.is_discarded()) continue;
      if (ev.contains("error")) {
        r.error = ev["error"].dump();
        continue;
      }
      if (ev.contains("usage") && ev["usage"].is_object() &&
          ev["usage"].contains("completion_tokens")) {
        usage = ev["usage"]["completion_tokens"].get<int64_t>();
      }
      if (ev.contains("choices") && ev["choices"].is_array() && !ev["choices"].empty()) {
        const Json& c = ev["choices"][0];
        const bool text =
            (c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty());
        if (text) {
          if (chunks++ == 0) first = now;
          last = now;
        }
      }
    }
    return true;
  };
  const httplib::Result res = cli.send(req);
  if (!res) {
    r.error = fmt::format("HTTP error: {}", httplib::to_string(res.error()));
    return r;
  }
  if (res->status != 200) {
    r.error = fmt::format("HTTP {}: {}", res->status, raw.substr(0, 200));
    return r;
  }
  if (!r.error.empty()) return r;
  r.tokens = usage >= 0 ? usage : chunks;
  if (chunks == 0) {
    r.error = "no tokens streamed";
    return r;
  }
  r.ttft = std::chrono::duration<double>(first - t0).count();
  if (r.tokens > 1) {
    r.tpot =
        std::chrono::duration<double>(last - first).count() / static_cast<double>(r.tokens - 1);
  }
  r.ok = true;
  return r;
}

// Where the requests go: "http://host:port[/prefix]" split into the origin the clients connect
// to and the completions path under the prefix.
struct Endpoint {
  std::string origin, path;
};

Endpoint endpoint_of(const std::string& url) {
  const size_t scheme = url.find("://");
  const size_t slash = url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  Endpoint ep;
  ep.origin = slash == std::string::npos ? url : url.substr(0, slash);
  std::string prefix = slash == std::string::npos ? "" : url.substr(slash);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  ep.path = prefix + "/v1/completions";
  return ep;
}

// One client count's requests: a prompt of token ids and its max_tokens each.
using Work = std::vector<std::pair<std::vector<int>, int>>;

// The requests, drawn before the clock starts.
Work draw_work(const BenchServeArgs& a, int n_req, std::mt19937_64& rng) {
  Work work(static_cast<size_t>(n_req));
  std::uniform_int_distribution<int> tok(a.token_min, a.vocab - 1);
  for (auto& [prompt, max] : work) {
    std::uniform_int_distribution<int> pl(std::max(1, a.prompt_tokens - a.prompt_spread),
                                          a.prompt_tokens + a.prompt_spread);
    std::uniform_int_distribution<int> ml(std::max(1, a.max_tokens - a.max_spread),
                                          a.max_tokens + a.max_spread);
    prompt.resize(static_cast<size_t>(pl(rng)));
    for (int& t : prompt) t = tok(rng);
    max = ml(rng);
  }
  return work;
}

// One short request first (connections, first-call costs).
void warm_up(const BenchServeArgs& a, const Endpoint& ep) {
  httplib::Client cli(ep.origin);
  cli.set_read_timeout(600);
  one_request(cli, a, ep.path, {a.token_min, a.token_min + 1}, 2);
}

// `clients` threads, each on its own connection, take the requests in order until none is
// left; returns their results in request order and the wall seconds in *wall.
std::vector<Result> run_clients(const BenchServeArgs& a, const Endpoint& ep, const Work& work,
                                int clients, double* wall) {
  const int n_req = static_cast<int>(work.size());
  std::atomic<int> next{0};
  std::vector<Result> results(work.size());
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      httplib::Client cli(ep.origin);
      cli.set_read_timeout(3600);
      cli.set_write_timeout(600);
      for (int i; (i = next.fetch_add(1)) < n_req;) {
        const auto& [prompt, max] = work[static_cast<size_t>(i)];
        results[static_cast<size_t>(i)] = one_request(cli, a, ep.path, prompt, max);
      }
    });
  }
  for (auto& t : threads) t.join();
  *wall = std::chrono::duration<double>(Clock::now() - t0).count();
  return results;
}

// One client count's figures: TTFT and TPOT (ms) of the requests that succeeded, their output
// tokens, and the failed ones.
struct Level {
  int clients = 0, requests = 0;
  double wall = 0;
  std::vector<double> ttft, tpot;
  int64_t tokens = 0;
  int errors = 0;
  std::string first_error;
};

Level summarize(int clients, double wall, const std::vector<Result>& results) {
  Level lv;
  lv.clients = clients;
  lv.requests = static_cast<int>(results.size());
  lv.wall = wall;
  for (const Result& r : results) {
    if (!r.ok) {
      if (lv.errors++ == 0) lv.first_error = r.error;
      continue;
    }
    lv.ttft.push_back(r.ttft * 1e3);
    if (r.tpot > 0) lv.tpot.push_back(r.tpot * 1e3);
    lv.tokens += r.tokens;
  }
  return lv;
}

Json level_json(const Level& lv) {
  const double tps = static_cast<double>(lv.tokens) / lv.wall;
  Json row = {{"clients", lv.clients},
              {"requests", lv.requests},
              {"errors", lv.errors},
              {"seconds", lv.wall},
              {"output_tokens", lv.tokens},
              {"output_tokens_per_s", tps},
              {"ttft_ms",
               {{"p50", percentile(lv.ttft, 0.5)},
                {"p90", percentile(lv.ttft, 0.9)},
                {"p99", percentile(lv.ttft, 0.99)}}},
              {"tpot_ms",
               {{"p50", percentile(lv.tpot, 0.5)},
                {"p90", percentile(lv.tpot, 0.9)},
                {"p99", percentile(lv.tpot, 0.99)}}}};
  if (!lv.first_error.empty()) row["first_error"] = lv.first_error;
  return row;
}

void print_table_header() {
  std::printf(
      "| clients | requests | errors | seconds | output tok/s | TTFT p50 / p90 / p99 ms "
      "| TPOT p50 / p90 / p99 ms |\n|---|---|---|---|---|---|---|\n");
}

void print_table_row(const Level& lv) {
  const double tps = static_cast<double>(lv.tokens) / lv.wall;
  std::printf("| %d | %d | %d | %.1f | %.2f | %.0f / %.0f / %.0f | %.1f / %.1f / %.1f |\n",
              lv.clients, lv.requests, lv.errors, lv.wall, tps, percentile(lv.ttft, 0.5),
              percentile(lv.ttft, 0.9), percentile(lv.ttft, 0.99), percentile(lv.tpot, 0.5),
              percentile(lv.tpot, 0.9), percentile(lv.tpot, 0.99));
  if (!lv.first_error.empty()) std::printf("  first error: %s\n", lv.first_error.c_str());
  std::fflush(stdout);
}

// Checks the arguments before any request: the token range and the URL.
void check_args(const BenchServeArgs& a, const Endpoint& ep) {
  if (a.token_min >= a.vocab) {
    fail(ErrorKind::kInvalidArgument, "--token-min {} must be below --vocab {}", a.token_min,
         a.vocab);
  }
  httplib::Client probe(ep.origin);
  if (!probe.is_valid()) fail(ErrorKind::kInvalidArgument, "--url: '{}' is not a URL", a.url);
}

void bench_serve(const BenchServeArgs& a) {
  const Endpoint ep = endpoint_of(a.url);
  check_args(a, ep);
  std::mt19937_64 rng(a.seed);
  Json report = Json::array();
  if (!a.json) print_table_header();
  int64_t total_errors = 0, total_requests = 0;
  std::string any_error;
  for (int clients : a.clients) {
    const int n_req = a.requests > 0 ? a.requests : std::max(4, 2 * clients);
    const Work work = draw_work(a, n_req, rng);
    warm_up(a, ep);
    double wall = 0;
    const std::vector<Result> results = run_clients(a, ep, work, clients, &wall);
    const Level lv = summarize(clients, wall, results);
    Json row = level_json(lv);
    if (!a.json) print_table_row(lv);
    report.push_back(std::move(row));
    total_errors += lv.errors;
    total_requests += n_req;
    if (any_error.empty()) any_error = lv.first_error;
  }
  if (a.json) {
    Json out = {{"url", a.url},
                {"prompt_tokens", a.prompt_tokens},
                {"max_tokens", a.max_tokens},
                {"levels", report}};
    std::printf("%s\n", out.dump(2).c_str());
  }
  // Figures with failed requests in them are not the server's speed.
  if (total_errors > 0) {
    fail(ErrorKind::kIo, "{} of {} requests failed (the first: {})", total_errors, total_requests,
         any_error);
  }
}

void add_bench_serve(CLI::App& app) {
  auto args = std::make_shared<BenchServeArgs>();
  app.add_option("--url", args->url, "the server's base URL")->capture_default_str();
  app.add_option("--api-key", args->api_key, "sent as 'Authorization: Bearer KEY'");
  app.add_option("--model", args->model, "the request's model field (default: none)");
  app.add_option("--clients", args->clients, "concurrent clients (a list: 1,4,16)")
      ->delimiter(',')
      ->check(number_in(1, 4096));
  app.add_option("--requests", args->requests,
                 "requests per client count (default: twice the clients, at least 4)")
      ->check(number_in(0, 1 << 20));
  app.add_option("--prompt-tokens", args->prompt_tokens, "prompt length in tokens")
      ->check(number_in(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--prompt-spread", args->prompt_spread,
                 "prompt lengths uniform in [tokens - spread, tokens + spread]")
      ->check(number_in(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--max-tokens", args->max_tokens, "tokens each answer has (ignore_eos)")
      ->check(number_in(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--max-spread", args->max_spread,
                 "answer lengths uniform in [max - spread, max + spread]")
      ->check(number_in(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--vocab", args->vocab, "prompt token ids are drawn below this")
      ->check(number_in(2, 1 << 30))
      ->capture_default_str();
  app.add_option("--token-min", args->token_min, "... and at or above this")
      ->check(number_in(0, 1 << 30))
      ->capture_default_str();
  app.add_option("--seed", args->seed, "seed of the prompts and lengths")->capture_default_str();
  app.add_flag("--json", args->json, "print JSON instead of the table");
  app.callback([args] { bench_serve(*args); });
}

Registrar reg("bench-serve",
              "Load an OpenAI-compatible server with concurrent streaming clients: TTFT, TPOT, "
              "tokens/s",
              add_bench_serve);

}  // namespace
}  // namespace tandem::tools
