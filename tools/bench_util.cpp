#include "tools/bench_util.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace tandem::tools {

Stat stat(const std::vector<double>& v) {
  Stat s;
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  if (v.size() > 1) {
    double q = 0;
    for (double x : v) q += (x - s.mean) * (x - s.mean);
    s.stddev = std::sqrt(q / static_cast<double>(v.size() - 1));
  }
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size();
  return m % 2 == 1 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

uint64_t weight_bytes(const ops::Weight& w) {
  return w.t.data == nullptr ? 0 : static_cast<uint64_t>(w.t.rows()) * w.t.row_bytes();
}

uint64_t expert_bytes(const ExpertWeights& x, size_t e) {
  return weight_bytes(x.gate[e]) + weight_bytes(x.up[e]) + weight_bytes(x.down[e]);
}

}  // namespace

double kv_read_bytes(const ModelConfig& c, const KvCache& cache, double positions) {
  const double attended =
      c.has_indexer() ? std::min(positions, static_cast<double>(c.index_topk)) : positions;
  return static_cast<double>(cache.layout().layers) * static_cast<double>(cache.position_bytes()) *
             attended +
         static_cast<double>(cache.layout().index_layers) *
             static_cast<double>(cache.index_position_bytes()) * positions;
}

StepBytes decode_bytes(const LoadedModel& m) {
  StepBytes b;
  b.lm_head = weight_bytes(m.lm_head);
  const int64_t k = m.config.n_experts_per_tok;
  for (const LayerWeights& l : m.layers) {
    for (const ops::Weight* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.wq_a, &l.wq_b, &l.wkv_a}) {
      b.attention += weight_bytes(*w);
    }
    for (const auto& v : {&l.k_up, &l.v_up, &l.delta.in}) {
      for (const ops::Weight& w : *v) b.attention += weight_bytes(w);
    }
    b.attention += weight_bytes(l.delta.out);
    for (const ops::Weight* w : {&l.ffn_gate, &l.ffn_up, &l.ffn_down, &l.router, &l.sh_gate,
                                 &l.sh_up, &l.sh_down}) {
      b.ffn += weight_bytes(*w);
    }
    if (l.moe && !l.experts.gate.empty()) {
      uint64_t all = 0;
      const size_t ne = l.experts.gate.size();
      for (size_t e = 0; e < ne; ++e) all += expert_bytes(l.experts, e);
      b.experts += all / ne * static_cast<uint64_t>(k);
    }
  }
  const ModelConfig& c = m.config;
  b.state = 2 * static_cast<uint64_t>(c.num_linear_layers() * c.linear_state_floats()) * 4;
  return b;
}

ExpertUnionBytes::ExpertUnionBytes(const LoadedModel& m) {
  per_expert_.resize(m.layers.size());
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const ExpertWeights& x = m.layers[l].experts;
    for (size_t e = 0; e < x.gate.size(); ++e) per_expert_[l].push_back(expert_bytes(x, e));
  }
}

void ExpertUnionBytes::on_routing(const RoutingEvent& ev) {
  if (!counting) return;
  const std::vector<uint64_t>& b = per_expert_[static_cast<size_t>(ev.layer)];
  seen_.assign(b.size(), 0);
  for (int64_t i = 0; i < ev.n_tokens * ev.k; ++i) {
    const int32_t e = ev.ids[i];
    if (e >= 0 && static_cast<size_t>(e) < b.size() && !seen_[static_cast<size_t>(e)]) {
      seen_[static_cast<size_t>(e)] = 1;
      bytes += b[static_cast<size_t>(e)];
    }
  }
}

}  // namespace tandem::tools
