#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace tandem::server {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  ++counts_[i];
  sum_ += v;
  ++count_;
}

double Histogram::quantile_bound(double q) const {
  uint64_t seen = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    seen += counts_[i];
    if (static_cast<double>(seen) >= q * static_cast<double>(count_)) return bounds_[i];
  }
  return INFINITY;
}

void Histogram::render(const std::string& name, const std::string& help, std::string* out) const {
  *out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    *out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  *out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name,
                      sum_, name, count_);
}

Metrics::Metrics()
    : ttft_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      tpot_({0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5}) {}

void Metrics::http_response(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++http_[status];
}

uint64_t Metrics::http_count(int status) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = http_.find(status);
  return it == http_.end() ? 0 : it->second;
}

void Metrics::finished(const std::string& reason, int64_t prompt_tokens, int64_t cached_tokens,
                       int64_t generated_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  ++finished_[reason];
  prompt_tokens_ += static_cast<uint64_t>(prompt_tokens);
  cached_tokens_ += static_cast<uint64_t>(cached_tokens);
  generated_tokens_ += static_cast<uint64_t>(generated_tokens);
}

void Metrics::first_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.observe(seconds);
}

void Metrics::time_per_output_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  tpot_.observe(seconds);
}

void Metrics::set_gauges(const Gauges& g) {
  std::lock_guard<std::mutex> lock(mu_);
  gauges_ = g;
}

Gauges Metrics::gauges() const {
  std::lock_guard<std::mutex> lock(mu_);
  return gauges_;
}

void Metrics::set_accel(const rt::HybridStats& stats) {
  std::lock_guard<std::mutex> lock(mu_);
  accel_ = stats;
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  out +=
      "# HELP tandem_http_responses_total HTTP responses by status code\n"
      "# TYPE tandem_http_responses_total counter\n";
  for (const auto& [status, n] : http_) {
    out += fmt::format("tandem_http_responses_total{{code=\"{}\"}} {}\n", status, n);
  }
  out +=
      "# HELP tandem_completions_total completions by how they ended\n"
      "# TYPE tandem_completions_total counter\n";
  for (const auto& [reason, n] : finished_) {
    out += fmt::format("tandem_completions_total{{finish_reason=\"{}\"}} {}\n", reason, n);
  }
  const auto counter = [&](const char* name, const char* help, uint64_t v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
  };
  const auto gauge = [&](const char* name, const char* help, int64_t v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
  };
  counter("tandem_prompt_tokens_total", "prompt tokens of finished completions", prompt_tokens_);
  counter("tandem_prompt_tokens_cached_total",
          "prompt tokens taken from cached KV blocks instead of prefilled", cached_tokens_);
  counter("tandem_generated_tokens_total", "tokens generated", generated_tokens_);
  gauge("tandem_requests_waiting", "completions queued for admission", gauges_.waiting);
  gauge("tandem_requests_running", "completions prefilling or decoding", gauges_.running);
  gauge("tandem_kv_blocks_used", "KV cache blocks in use (live and cached prefixes)",
        gauges_.kv_blocks_used);
  gauge("tandem_kv_blocks_total", "KV cache blocks in the pool", gauges_.kv_blocks_total);
  gauge("tandem_batch_tokens",
        "tokens a step may take (prompt chunks shrink to meet the TPOT "
        "target)",
        gauges_.batch_tokens);
  ttft_.render("tandem_time_to_first_token_seconds", "time from arrival to the first token", &out);
  tpot_.render("tandem_time_per_output_token_seconds",
               "mean time between a completion's tokens after the first", &out);
  if (accel_) {
    const rt::HybridStats* accel = &*accel_;
    const int64_t pairs = accel->accel_pairs + accel->cpu_pairs;
    out += fmt::format(
        "# HELP tandem_expert_accel_fraction routed token-expert pairs the accelerator ran\n"
        "# TYPE tandem_expert_accel_fraction gauge\ntandem_expert_accel_fraction {}\n",
        pairs > 0 ? static_cast<double>(accel->accel_pairs) / static_cast<double>(pairs) : 0.0);
    counter("tandem_expert_fetches_total", "experts copied to the accelerator on demand",
            static_cast<uint64_t>(accel->fetches));
    counter("tandem_expert_prefetch_hits_total", "prefetched experts the next layer ran",
            static_cast<uint64_t>(accel->prefetch_hits));
  }
  return out;
}

}  // namespace tandem::server
