#include "runtime/expert_cache.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace tandem::rt {

std::vector<int> routed_counts(const LayerRouting& r) {
  std::vector<int> c(static_cast<size_t>(std::max(r.n_experts, 0)), 0);
  if (r.ids == nullptr) return c;
  for (int64_t i = 0; i < int64_t(r.n_tokens) * r.k; ++i) {
    const int e = r.ids[i];
    if (e >= 0 && e < r.n_experts) ++c[size_t(e)];
  }
  return c;
}

namespace {

using Kind = CacheKind;

// One implementation for every kind: the kinds differ only in how on_routing() updates the
// per-expert priority and (DALI) in wanted(). Eviction takes the evictable resident with the
// lowest priority, ties to the lowest (layer, expert).
class SlotCache final : public ExpertCache {
 public:
  SlotCache(Kind kind, std::string name, const CacheConfig& c)
      : kind_(kind), name_(std::move(name)), c_(c) {
    const size_t L = size_t(c.n_layers), E = size_t(c.n_experts);
    slot_.assign(L, std::vector<int>(E, -1));
    pinned_.assign(L, std::vector<uint8_t>(E, 0));
    protected_.assign(L, std::vector<uint8_t>(E, 0));
    prio_.assign(L, std::vector<double>(E, 0.0));
    steps_.assign(L, 0);
    const int per = c.slots_per_layer;
    if (c.global_pool) {
      free_.resize(1);
      for (int s = c.n_layers * per - 1; s >= 0; --s) free_[0].push_back(s);
    } else {
      free_.resize(L);
      for (auto& f : free_)
        for (int s = per - 1; s >= 0; --s) f.push_back(s);
    }
    if (kind_ == Kind::kDali) {
      ring_.assign(L, std::vector<std::vector<int>>(size_t(c.dali_w_size), std::vector<int>(E, 0)));
      wanted_.assign(L, {});
    }
    if (kind_ == Kind::kMrs) mrs_p_ = c.mrs_p > 0 ? c.mrs_p : 2 * c.top_k;
  }

  bool resident(int l, int e) const override { return valid(l, e) && slot_[l][e] >= 0; }
  int slot_of(int l, int e) const override { return valid(l, e) ? slot_[l][e] : -1; }
  const std::string& kind() const override { return name_; }
  const CacheConfig& config() const override { return c_; }
  int n_slots() const override {
    return c_.global_pool ? c_.n_layers * c_.slots_per_layer : c_.slots_per_layer;
  }
  int last_evicted_layer() const override { return last_evicted_layer_; }
  bool pinned(int l, int e) const override { return valid(l, e) && pinned_[l][e]; }
  double priority(int l, int e) const override { return valid(l, e) ? prio_[l][e] : 0.0; }
  std::vector<int> wanted(int l) const override {
    if (kind_ != Kind::kDali || l < 0 || l >= c_.n_layers) return {};
    return wanted_[size_t(l)];
  }

  std::vector<int> residents(int l) const override {
    std::vector<int> out;
    if (l < 0 || l >= c_.n_layers) return out;
    for (int e = 0; e < c_.n_experts; ++e)
      if (slot_[l][e] >= 0) out.push_back(e);
    return out;
  }

  void pin(int l, int e) override {
    check(l, e, "pin");
    if (slot_[l][e] < 0) {
      auto& f = free_list(l);
      if (f.empty()) {
        fail(ErrorKind::kResource,
             "expert cache: no free slot to pin expert {} of MoE layer {} "
             "({} slots{})",
             e, l, n_slots(), c_.global_pool ? " in the global pool" : " per layer");
      }
      slot_[l][e] = f.back();
      f.pop_back();
    }
    pinned_[l][e] = 1;
  }

  void on_routing(const LayerRouting& r) override {
    const int l = r.layer;
    if (l < 0 || l >= c_.n_layers) {
      fail(ErrorKind::kInvalidArgument, "expert cache: routing for MoE layer {} of {}", l,
           c_.n_layers);
    }
    if (r.n_experts != c_.n_experts) {
      fail(ErrorKind::kInvalidArgument, "expert cache: routing has {} experts, the cache {}",
           r.n_experts, c_.n_experts);
    }
    const std::vector<int> cnt = routed_counts(r);
    ++tick_;
    ++steps_[l];
    last_routed_ = l;
    auto& prio = prio_[l];
    for (int e = 0; e < c_.n_experts; ++e) protected_[l][e] = cnt[e] > 0;
    switch (kind_) {
      case Kind::kNone:
        break;
      case Kind::kLru:
        for (int e = 0; e < c_.n_experts; ++e)
          if (cnt[e] > 0) prio[e] = double(tick_);
        break;
      case Kind::kLfu:
        for (int e = 0; e < c_.n_experts; ++e) prio[e] += cnt[e];
        break;
      case Kind::kMrs:
        update_mrs(r, cnt);
        break;
      case Kind::kDali:
        update_dali(l, cnt);
        break;
    }
  }

  int admit(int l, int e, bool* admitted) override {
    check(l, e, "admit");
    last_evicted_layer_ = -1;
    if (slot_[l][e] >= 0) {
      *admitted = true;
      return -1;
    }
    *admitted = false;
    if (kind_ == Kind::kNone) return -1;
    int victim_layer = -1, victim = -1;
    auto& f = free_list(l);
    int slot = -1;
    if (!f.empty()) {
      slot = f.back();
      f.pop_back();
    } else {
      if (!find_victim(l, &victim_layer, &victim)) return -1;
      slot = slot_[victim_layer][victim];
      slot_[victim_layer][victim] = -1;
      protected_[victim_layer][victim] = 0;
      last_evicted_layer_ = victim_layer;
    }
    slot_[l][e] = slot;
    protected_[l][e] = 1;
    if (kind_ == Kind::kLru) prio_[l][e] = double(tick_);  // a fetch counts as a use
    *admitted = true;
    return victim;
  }

  int fetch_capacity(int l) const override {
    if (kind_ == Kind::kNone || l < 0 || l >= c_.n_layers) return 0;
    int n = static_cast<int>(free_list(l).size());
    const int l0 = c_.global_pool ? 0 : l, l1 = c_.global_pool ? c_.n_layers : l + 1;
    for (int ll = l0; ll < l1; ++ll)
      for (int e = 0; e < c_.n_experts; ++e)
        n += slot_[ll][e] >= 0 && !pinned_[ll][e] && !is_protected(ll, e, l);
    return n;
  }

 private:
  bool valid(int l, int e) const { return l >= 0 && l < c_.n_layers && e >= 0 && e < c_.n_experts; }
  void check(int l, int e, const char* what) const {
    if (!valid(l, e)) {
      fail(ErrorKind::kInvalidArgument,
           "expert cache: {} expert {} of MoE layer {}: out of range "
           "({} layers x {} experts)",
           what, e, l, c_.n_layers, c_.n_experts);
    }
  }
  // Protection holds for the layer being admitted into and the layer routed last (the one
  // running now); with a global pool, older layers' step experts are fair game.
  bool is_protected(int ll, int e, int admitting) const {
    return protected_[ll][e] && (ll == admitting || ll == last_routed_);
  }
  std::vector<int>& free_list(int l) { return free_[c_.global_pool ? 0 : size_t(l)]; }
  const std::vector<int>& free_list(int l) const { return free_[c_.global_pool ? 0 : size_t(l)]; }

  bool find_victim(int l, int* vl, int* ve) const {
    const int l0 = c_.global_pool ? 0 : l, l1 = c_.global_pool ? c_.n_layers : l + 1;
    double best = std::numeric_limits<double>::infinity();
    bool found = false;
    for (int ll = l0; ll < l1; ++ll) {
      for (int e = 0; e < c_.n_experts; ++e) {
        if (slot_[ll][e] < 0 || pinned_[ll][e] || is_protected(ll, e, l)) continue;
        if (!found || prio_[ll][e] < best) {  // strict: ties keep the lowest (layer, id)
          best = prio_[ll][e];
          *vl = ll;
          *ve = e;
          found = true;
        }
      }
    }
    return found;
  }

  // HybriMoE eq. 3: S = alpha * TopP(s) + (1 - alpha) * S, s = this step's router scores (mean
  // over the batch's tokens; without scores, the top-k weights), only the p largest kept.
  void update_mrs(const LayerRouting& r, const std::vector<int>& cnt) {
    const int E = c_.n_experts;
    std::vector<double> s(size_t(E), 0.0);
    const int n = std::max(r.n_tokens, 1);
    if (r.scores != nullptr) {
      for (int t = 0; t < r.n_tokens; ++t)
        for (int e = 0; e < E; ++e) s[e] += r.scores[int64_t(t) * E + e];
    } else if (r.weights != nullptr) {
      for (int64_t i = 0; i < int64_t(r.n_tokens) * r.k; ++i)
        if (r.ids[i] >= 0 && r.ids[i] < E) s[r.ids[i]] += r.weights[i];
    } else {
      for (int e = 0; e < E; ++e) s[e] = cnt[e];
    }
    for (auto& v : s) v /= n;
    std::vector<int> order(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return s[a] > s[b]; });
    std::vector<double> top(size_t(E), 0.0);
    for (int i = 0; i < std::min(mrs_p_, E); ++i) top[order[i]] = s[order[i]];
    const double a = c_.mrs_alpha;
    auto& S = prio_[r.layer];
    for (int e = 0; e < E; ++e) S[e] = a * top[e] + (1 - a) * S[e];
  }

  // DALI Alg. 2 with a sliding window: priority = tokens routed to the expert over the layer's
  // last w_size steps; at every w_size-th step, wanted() = up to u_size non-resident experts with
  // the highest window workload that beat the lowest evictable resident.
  void update_dali(int l, const std::vector<int>& cnt) {
    const int W = c_.dali_w_size, E = c_.n_experts;
    auto& ring = ring_[l];
    auto& slot_counts = ring[size_t((steps_[l] - 1) % W)];
    auto& prio = prio_[l];
    for (int e = 0; e < E; ++e) {
      prio[e] += cnt[e] - slot_counts[e];
      slot_counts[e] = cnt[e];
    }
    wanted_[l].clear();
    if (steps_[l] % W != 0) return;
    std::vector<int> out, in;
    for (int e = 0; e < E; ++e) {
      if (slot_[l][e] < 0) {
        if (prio[e] > 0) in.push_back(e);
      } else if (!pinned_[l][e]) {
        out.push_back(e);
      }
    }
    std::stable_sort(in.begin(), in.end(), [&](int a, int b) { return prio[a] > prio[b]; });
    std::stable_sort(out.begin(), out.end(), [&](int a, int b) { return prio[a] < prio[b]; });
    int free_slots = static_cast<int>(free_list(l).size());
    size_t v = 0;
    for (int e : in) {
      if (int(wanted_[l].size()) == c_.dali_u_size) break;
      if (free_slots > 0) {
        --free_slots;
      } else if (v < out.size() && prio[e] > prio[out[v]]) {
        ++v;
      } else {
        break;
      }
      wanted_[l].push_back(e);
    }
  }

  Kind kind_;
  std::string name_;
  CacheConfig c_;
  std::vector<std::vector<int>> slot_;  // [layer][expert] -> slot or -1
  std::vector<std::vector<uint8_t>> pinned_, protected_;
  std::vector<std::vector<double>> prio_;            // eviction priority
  std::vector<std::vector<int>> free_;               // free slots: [layer] or [0] for the pool
  std::vector<int64_t> steps_;                       // on_routing calls per layer
  std::vector<std::vector<std::vector<int>>> ring_;  // DALI: [layer][w_size][expert] counts
  std::vector<std::vector<int>> wanted_;
  int64_t tick_ = 0;
  int mrs_p_ = 0;
  int last_evicted_layer_ = -1;
  int last_routed_ = -1;
};

}  // namespace

std::unique_ptr<ExpertCache> ExpertCache::make(CacheKind k, const CacheConfig& c) {
  if (c.n_layers <= 0 || c.n_experts <= 0 || c.top_k <= 0 || c.top_k > c.n_experts) {
    fail(ErrorKind::kInvalidArgument, "expert cache: bad shape: {} layers, {} experts, top-k {}",
         c.n_layers, c.n_experts, c.top_k);
  }
  if (c.slots_per_layer < 0 || c.slots_per_layer > c.n_experts) {
    fail(ErrorKind::kInvalidArgument, "expert cache: {} slots per layer (0..{})", c.slots_per_layer,
         c.n_experts);
  }
  if (!(c.mrs_alpha >= 0 && c.mrs_alpha <= 1)) {
    fail(ErrorKind::kInvalidArgument, "expert cache: mrs alpha {} not in [0, 1]", c.mrs_alpha);
  }
  if (c.mrs_p < 0) fail(ErrorKind::kInvalidArgument, "expert cache: mrs p {} < 0", c.mrs_p);
  // w_size sizes a [layers][w_size][experts] table: bounded.
  if (k == Kind::kDali && (c.dali_w_size <= 0 || c.dali_w_size > 4096 || c.dali_u_size < 0)) {
    fail(ErrorKind::kInvalidArgument,
         "expert cache: dali w_size {} must be in 1..4096, u_size {} >= 0", c.dali_w_size,
         c.dali_u_size);
  }
  return std::make_unique<SlotCache>(k, std::string(choice_name(k)), c);
}

}  // namespace tandem::rt
