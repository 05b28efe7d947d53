#include "runtime/sim.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "core/error.h"
#include "runtime/expert_cache.h"
#include "runtime/policy.h"
#include "runtime/prefetch.h"

namespace tandem::rt {

int parse_cache_size(const std::string& text, int n_experts) {
  try {
    size_t used = 0;
    if (!text.empty() && text.back() == '%') {
      const double p = std::stod(text.substr(0, text.size() - 1), &used);
      if (used + 1 != text.size() || !(p >= 0 && p <= 100)) throw std::invalid_argument(text);
      return static_cast<int>(std::lround(p / 100.0 * n_experts));
    }
    const long n = std::stol(text, &used);
    if (used != text.size() || n < 0 || n > n_experts) throw std::invalid_argument(text);
    return static_cast<int>(n);
  } catch (const std::exception&) {
    fail(ErrorKind::kInvalidArgument, "--cache-size '{}': expected N (0..{}) or P% (0..100%)", text,
         n_experts);
  }
}

namespace {

// A prefetcher reads the trace's predictions of the next layer's routing: fails when the trace
// does not carry the ones the chosen prefetcher needs.
void check_prefetch_inputs(const Trace& t, const SimOptions& o) {
  if (o.prefetch == PrefetchKind::kGate && !t.has_gate_pred) {
    fail(ErrorKind::kInvalidArgument,
         "--prefetch gate: the trace has no gate predictions (record it with --scores)");
  }
  if (o.prefetch == PrefetchKind::kResidual && !t.has_residual_pred) {
    fail(ErrorKind::kInvalidArgument,
         "--prefetch residual: the trace has no residual predictions "
         "(record it with --residuals FILE from `tandem calibrate`)");
  }
}

std::unique_ptr<ExpertCache> make_cache(const Trace& t, const SimOptions& o, int slots_per_layer) {
  CacheConfig cc;
  cc.n_layers = t.n_layers;
  cc.n_experts = t.n_experts;
  cc.top_k = t.top_k;
  cc.slots_per_layer = slots_per_layer;
  cc.global_pool = o.global_pool;
  cc.mrs_alpha = o.mrs_alpha;
  cc.dali_w_size = o.dali_w_size;
  cc.dali_u_size = o.dali_u_size;
  return ExpertCache::make(o.cache, cc);
}

// Fills every layer's cache with its most used experts of the trace (ties: the lowest id).
void warm_cache(const Trace& t, int slots_per_layer, ExpertCache& cache) {
  const int L = t.n_layers, E = t.n_experts;
  const auto counts = expert_counts(t);
  for (int l = 0; l < L; ++l) {
    std::vector<int> order(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) order[size_t(e)] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return counts[size_t(l)][size_t(a)] > counts[size_t(l)][size_t(b)];
    });
    for (int i = 0; i < slots_per_layer; ++i) {
      bool admitted = false;
      cache.admit(l, order[size_t(i)], &admitted);
    }
  }
}

std::unique_ptr<Prefetcher> make_prefetcher(const SimOptions& o) {
  if (o.prefetch == PrefetchKind::kNone) return nullptr;
  PrefetchOptions pf;
  pf.max_experts = o.prefetch_size;
  return Prefetcher::make(o.prefetch, pf);
}

// One layer's estimated timeline: busy CPU and accelerator time, and when the link is done.
struct LayerTimes {
  double cpu = 0, accel = 0, accel_busy = 0, link = 0;
};

// Replays the trace's batches through the cache, policy and prefetcher, layer by layer, in the
// runtime's order, and accounts each layer call on its phase's stats.
class Replay {
 public:
  Replay(const Trace& t, const CostModel& cost, const SimOptions& o, ExpertCache& cache,
         AssignmentPolicy& policy, Prefetcher* prefetcher)
      : t_(t),
        cost_(cost),
        o_(o),
        cache_(cache),
        policy_(policy),
        prefetcher_(prefetcher),
        L_(t.n_layers),
        E_(t.n_experts),
        K_(t.top_k),
        transfer_(cost.transfer()),
        eb_(o.expert_bytes),
        cnt_(size_t(E_)),
        before_(size_t(E_)),
        fetched_now_(size_t(E_)),
        prefetched_for_(size_t(L_)) {}

  void run_batch(const TraceBatch& b, SimPhaseStats& st) {
    const int n = int(b.end - b.begin);
    ++st.batches;
    st.tokens += n;
    for (auto& p : prefetched_for_) p.clear();
    for (int l = 0; l < L_; ++l) run_layer(b, l, st);
  }

 private:
  void run_layer(const TraceBatch& b, int l, SimPhaseStats& st);
  LayerRouting gather_routing(const TraceBatch& b, int l);
  void count_residents(int l, SimPhaseStats& st);
  void admit_wanted(int l);
  std::vector<int> plan_loads(const Assignment& a, int l);
  LayerTimes layer_timeline(const Assignment& a, const std::vector<int>& loads,
                            SimPhaseStats& st) const;
  void prefetch_next_layer(const TraceBatch& b, int l, double latency, double& link,
                           SimPhaseStats& st);

  const Trace& t_;
  const CostModel& cost_;
  const SimOptions& o_;
  ExpertCache& cache_;
  AssignmentPolicy& policy_;
  Prefetcher* prefetcher_;
  const int L_, E_, K_;
  const double transfer_;
  const uint64_t eb_;
  // Per layer call: the batch's routing, tokens per expert, residency before the call and the
  // experts copied in during it.
  std::vector<int32_t> ids_;
  std::vector<float> w_, sc_, pred_;
  std::vector<int64_t> cnt_;
  std::vector<uint8_t> before_, fetched_now_;
  std::vector<std::vector<int>> prefetched_for_;  // [layer] prefetched during this batch
  // Link time still busy with earlier prefetches when the next layer starts (carried across
  // batches too: a copy in flight is not cancelled by the end of a step).
  double carry_ = 0;
};

void Replay::run_layer(const TraceBatch& b, int l, SimPhaseStats& st) {
  ++st.layer_calls;
  const LayerRouting r = gather_routing(b, l);
  count_residents(l, st);
  cache_.on_routing(r);
  admit_wanted(l);
  Assignment a = policy_.assign(r, cache_, cost_);
  if (a.on_accel.size() != size_t(E_)) a.on_accel.resize(size_t(E_), 0);
  const std::vector<int> loads = plan_loads(a, l);
  st.fetched += int64_t(loads.size());
  st.bytes += uint64_t(loads.size()) * eb_;
  LayerTimes tm = layer_timeline(a, loads, st);
  const double latency = std::max(tm.cpu, tm.accel);
  if (prefetcher_ && l + 1 < L_ && o_.prefetch_size != 0) {
    prefetch_next_layer(b, l, latency, tm.link, st);
  }
  st.link_seconds += tm.link - carry_;
  carry_ = std::max(0.0, tm.link - latency);
  st.seconds += latency;
  st.layer_seconds[size_t(l)] += latency;
  st.cpu_seconds += tm.cpu;
  st.accel_seconds += tm.accel_busy;
}

// The batch's routing of layer l from the trace, and the tokens routed to each expert (cnt_).
LayerRouting Replay::gather_routing(const TraceBatch& b, int l) {
  const int n = int(b.end - b.begin);
  ids_.resize(size_t(n) * K_);
  w_.resize(size_t(n) * K_);
  std::fill(cnt_.begin(), cnt_.end(), 0);
  for (int i = 0; i < n; ++i) {
    std::copy_n(t_.ids_at(b.begin + i, l), K_, ids_.begin() + i * K_);
    std::copy_n(t_.weights_at(b.begin + i, l), K_, w_.begin() + i * K_);
    for (int j = 0; j < K_; ++j) ++cnt_[size_t(ids_[size_t(i) * K_ + j])];
  }
  if (t_.has_scores) {
    sc_.resize(size_t(n) * E_);
    for (int i = 0; i < n; ++i) {
      std::copy_n(t_.scores_at(b.begin + i, l), E_, sc_.begin() + i * E_);
    }
  }
  LayerRouting r;
  r.layer = l;
  r.n_tokens = n;
  r.k = K_;
  r.n_experts = E_;
  r.ids = ids_.data();
  r.weights = w_.data();
  r.scores = t_.has_scores ? sc_.data() : nullptr;
  return r;
}

// Notes which experts are resident before the layer runs (before_), and counts activations, hits
// and the prefetched experts that are now used.
void Replay::count_residents(int l, SimPhaseStats& st) {
  for (int e = 0; e < E_; ++e) {
    before_[size_t(e)] = cache_.resident(l, e) ? 1 : 0;
    if (cnt_[size_t(e)] == 0) continue;
    ++st.activated;
    st.hits += before_[size_t(e)];
  }
  for (int e : prefetched_for_[size_t(l)]) st.prefetch_used += cnt_[size_t(e)] > 0;
}

// DALI's window update (Alg. 2): the cache asks for experts; the runtime copies them in.
void Replay::admit_wanted(int l) {
  for (int e : cache_.wanted(l)) {
    bool admitted = false;
    if (e >= 0 && e < E_ && !cache_.resident(l, e)) cache_.admit(l, e, &admitted);
  }
}

// Copies in the order the runtime issues them: the policy's fetch list, then any expert the cache
// loaded by itself (a window update) or that runs on the accelerator without being resident or
// fetched. Marks them in fetched_now_.
std::vector<int> Replay::plan_loads(const Assignment& a, int l) {
  std::vector<int> loads;
  std::fill(fetched_now_.begin(), fetched_now_.end(), 0);
  for (int e : a.fetch) {
    if (e < 0 || e >= E_ || fetched_now_[size_t(e)]) continue;
    bool admitted = false;
    if (!cache_.resident(l, e)) cache_.admit(l, e, &admitted);
    fetched_now_[size_t(e)] = 1;
    loads.push_back(e);
  }
  for (int e = 0; e < E_; ++e) {
    const bool became = !before_[size_t(e)] && cache_.resident(l, e);
    const bool unplanned = a.on_accel[size_t(e)] && cnt_[size_t(e)] && !before_[size_t(e)];
    if ((became || unplanned) && !fetched_now_[size_t(e)]) {
      fetched_now_[size_t(e)] = 1;
      loads.push_back(e);
    }
  }
  return loads;
}

// Timeline: CPU experts run from t = 0; the accelerator runs its resident experts, then each
// copied expert once its weights arrived; the link starts when the previous layer's prefetches
// are done.
LayerTimes Replay::layer_timeline(const Assignment& a, const std::vector<int>& loads,
                                  SimPhaseStats& st) const {
  LayerTimes tm;
  tm.link = carry_;
  for (int e = 0; e < E_; ++e) {
    if (!cnt_[size_t(e)]) continue;
    if (a.on_accel[size_t(e)]) {
      ++st.on_accel;
      if (!fetched_now_[size_t(e)]) {
        const double s = cost_.accel_expert(cnt_[size_t(e)]);
        tm.accel += s;
        tm.accel_busy += s;
      }
    } else {
      tm.cpu += cost_.cpu_expert(cnt_[size_t(e)]);
    }
  }
  for (int e : loads) {
    tm.link += transfer_;
    if (a.on_accel[size_t(e)] && cnt_[size_t(e)]) {
      const double s = cost_.accel_expert(cnt_[size_t(e)]);
      tm.accel = std::max(tm.accel, tm.link) + s;
      tm.accel_busy += s;
    }
  }
  if (tm.cpu > 0) tm.cpu += cost_.cpu_layer_overhead;
  if (tm.accel > 0) tm.accel += cost_.accel_layer_overhead;
  return tm;
}

// Prefetches the next layer's experts on the link while this layer computes.
void Replay::prefetch_next_layer(const TraceBatch& b, int l, double latency, double& link,
                                 SimPhaseStats& st) {
  const int n = int(b.end - b.begin);
  const bool pf_gate = o_.prefetch == PrefetchKind::kGate;
  const std::vector<float>& src = pf_gate ? t_.gate_pred : t_.residual_pred;
  pred_.resize(size_t(n) * E_);
  for (int i = 0; i < n; ++i) {
    std::copy_n(src.data() + ((b.begin + i) * L_ + l) * E_, E_, pred_.begin() + i * E_);
  }
  prefetcher_->set_layer_seconds(latency);
  const std::vector<int> choice = prefetcher_->choose(l + 1, pred_.data(), n, cache_, cost_);
  int taken = 0;
  for (int e : choice) {
    if (o_.prefetch_size >= 0 && taken == o_.prefetch_size) break;
    if (e < 0 || e >= E_ || cache_.resident(l + 1, e)) continue;
    bool admitted = false;
    cache_.admit(l + 1, e, &admitted);
    if (!admitted) continue;
    ++taken;
    ++st.prefetched;
    st.bytes += eb_;
    link += transfer_;
    prefetched_for_[size_t(l + 1)].push_back(e);
  }
}

}  // namespace

SimResult simulate(const Trace& t, const CostModel& cost, const SimOptions& o) {
  t.validate("trace");
  check_prefetch_inputs(t, o);
  SimResult res;
  res.options = o;
  res.slots_per_layer = parse_cache_size(o.cache_size, t.n_experts);
  std::unique_ptr<ExpertCache> cache = make_cache(t, o, res.slots_per_layer);
  if (o.warm && res.slots_per_layer > 0) warm_cache(t, res.slots_per_layer, *cache);
  // As the runtime does: a policy never fetches more experts than there are slots to put them in.
  PolicyOptions po;
  po.max_fetch = res.slots_per_layer * (o.global_pool ? t.n_layers : 1);
  std::unique_ptr<AssignmentPolicy> policy = AssignmentPolicy::make(o.policy, po);
  std::unique_ptr<Prefetcher> prefetcher = make_prefetcher(o);
  Replay replay(t, cost, o, *cache, *policy, prefetcher.get());
  for (SimPhaseStats* s : {&res.prefill, &res.decode}) {
    s->layer_seconds.assign(size_t(t.n_layers), 0.0);
  }
  for (const TraceBatch& b : trace_batches(t)) {
    replay.run_batch(b, b.phase == TracePhase::kDecode ? res.decode : res.prefill);
  }
  return res;
}

}  // namespace tandem::rt
