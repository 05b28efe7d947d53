#include "runtime/prefetch.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tandem::rt {

namespace {

class NoPrefetch final : public Prefetcher {
 public:
  std::vector<int> choose(int, const float*, int, const ExpertCache&, const CostModel&) override {
    return {};
  }
  const std::string& name() const override { return name_; }

 private:
  std::string name_ = "none";
};

// gate and residual differ only in where the caller's predicted scores come from.
class ImpactPrefetch final : public Prefetcher {
 public:
  ImpactPrefetch(std::string name, PrefetchOptions o) : name_(std::move(name)), o_(o) {}
  const std::string& name() const override { return name_; }

  std::vector<int> choose(int next_layer, const float* scores, int n_tokens,
                          const ExpertCache& cache, const CostModel& cost) override {
    const int E = cache.n_experts();
    const int k = std::min(o_.top_k > 0 ? o_.top_k : cache.config().top_k, E);
    if (scores == nullptr || n_tokens <= 0 || next_layer < 0 ||
        next_layer >= cache.config().n_layers) {
      return {};
    }
    // Predicted routing: each token's top-k experts (ties to the lowest id) and score mass.
    std::vector<int> count(size_t(E), 0);
    std::vector<double> mass(size_t(E), 0.0);
    std::vector<int> idx(static_cast<size_t>(E));
    for (int t = 0; t < n_tokens; ++t) {
      const float* s = scores + int64_t(t) * E;
      for (int e = 0; e < E; ++e) idx[e] = e;
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                        [&](int a, int b) { return s[a] != s[b] ? s[a] > s[b] : a < b; });
      for (int j = 0; j < k; ++j) {
        ++count[idx[j]];
        mass[idx[j]] += std::isfinite(s[idx[j]]) ? std::max(0.0f, s[idx[j]]) : 0.0;
      }
    }
    // Impact (HybriMoE §IV-C): what a hit saves, cpu(n) - accel(n), weighted by the confidence
    // of the prediction (the predicted score mass).
    std::vector<int> cand;
    std::vector<double> impact(size_t(E), 0.0);
    for (int e = 0; e < E; ++e) {
      if (count[e] == 0 || cache.resident(next_layer, e)) continue;
      impact[e] = mass[e] * (cost.cpu_expert(count[e]) - cost.accel_expert(count[e]));
      if (impact[e] > 0) cand.push_back(e);
    }
    std::stable_sort(cand.begin(), cand.end(), [&](int a, int b) { return impact[a] > impact[b]; });
    // As many as the link moves while the current layer runs (at least one).
    double budget = o_.budget_seconds > 0 ? o_.budget_seconds : layer_seconds_;
    if (budget <= 0) budget = cost.cpu_expert(1) * k;
    size_t n = cand.size();
    if (cost.transfer() > 0) {
      n = std::min(n, std::max<size_t>(1, static_cast<size_t>(budget / cost.transfer())));
    }
    if (o_.max_experts >= 0) n = std::min(n, size_t(o_.max_experts));
    n = std::min(n, static_cast<size_t>(std::max(cache.fetch_capacity(next_layer), 0)));
    cand.resize(n);
    return cand;
  }

 private:
  std::string name_;
  PrefetchOptions o_;
};

}  // namespace

std::unique_ptr<Prefetcher> Prefetcher::make(PrefetchKind kind, const PrefetchOptions& o) {
  if (kind == PrefetchKind::kNone) return std::make_unique<NoPrefetch>();
  return std::make_unique<ImpactPrefetch>(std::string(choice_name(kind)), o);
}

}  // namespace tandem::rt
