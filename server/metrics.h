// What `GET /metrics` reports, in Prometheus' text format: requests by outcome, tokens, the queue
// and the KV pool, time to first token and time per output token as histograms, and with an
// accelerator the share of routed-expert work it ran. The scheduler thread writes; HTTP threads
// render. One mutex: every update is a few additions.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/hybrid_moe.h"

namespace tandem::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // `name`_bucket{le=...} (cumulative), `name`_sum, `name`_count.
  void render(const std::string& name, const std::string& help, std::string* out) const;
  uint64_t count() const { return count_; }
  // The smallest bucket bound below which a fraction q of the observations fall (tests).
  double quantile_bound(double q) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, the last one +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct Gauges {
  int64_t waiting = 0, running = 0;
  int64_t kv_blocks_used = 0, kv_blocks_total = 0;
  int64_t batch_tokens = 0;  // the prompt-chunk budget of a step (it shrinks to meet a TPOT target)
};

class Metrics {
 public:
  Metrics();
  void http_response(int status);
  // A completion's end: "stop" | "length" | "cancelled" | "error" ...
  void finished(const std::string& reason, int64_t prompt_tokens, int64_t cached_tokens,
                int64_t generated_tokens);
  void first_token(double seconds);
  void time_per_output_token(double seconds);
  void set_gauges(const Gauges& g);
  Gauges gauges() const;
  // The accelerator's counters, copied after each step by the thread that runs the forward.
  void set_accel(const rt::HybridStats& stats);
  std::string render() const;
  uint64_t http_count(int status) const;

 private:
  mutable std::mutex mu_;
  std::map<int, uint64_t> http_;
  std::map<std::string, uint64_t> finished_;
  uint64_t prompt_tokens_ = 0, cached_tokens_ = 0, generated_tokens_ = 0;
  Histogram ttft_, tpot_;
  Gauges gauges_;
  std::optional<rt::HybridStats> accel_;
};

}  // namespace tandem::server
