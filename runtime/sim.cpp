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

SimResult simulate(const Trace& t, const CostModel& cost, const SimOptions& o) {
  t.validate("trace");
  const int L = t.n_layers, E = t.n_experts, K = t.top_k;
  const bool pf_gate = o.prefetch == PrefetchKind::kGate, pf_res = o.prefetch == PrefetchKind::kResidual;
  if (pf_gate && !t.has_gate_pred) {
    fail(ErrorKind::kInvalidArgument,
         "--prefetch gate: the trace has no gate predictions (record it with --scores)");
  }
  if (pf_res && !t.has_residual_pred) {
    fail(ErrorKind::kInvalidArgument,
         "--prefetch residual: the trace has no residual predictions "
         "(record it with --residuals FILE from `tandem calibrate`)");
  }
  SimResult res;
  res.options = o;
  res.slots_per_layer = parse_cache_size(o.cache_size, E);
  CacheConfig cc;
  cc.n_layers = L;
  cc.n_experts = E;
  cc.top_k = K;
  cc.slots_per_layer = res.slots_per_layer;
  cc.global_pool = o.global_pool;
  cc.mrs_alpha = o.mrs_alpha;
  cc.dali_w_size = o.dali_w_size;
  cc.dali_u_size = o.dali_u_size;
  std::unique_ptr<ExpertCache> cache = ExpertCache::make(o.cache, cc);
  if (o.warm && res.slots_per_layer > 0) {
    const auto counts = expert_counts(t);
    for (int l = 0; l < L; ++l) {
      std::vector<int> order(static_cast<size_t>(E));
      for (int e = 0; e < E; ++e) order[size_t(e)] = e;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return counts[size_t(l)][size_t(a)] > counts[size_t(l)][size_t(b)];
      });
      for (int i = 0; i < res.slots_per_layer; ++i) {
        bool admitted = false;
        cache->admit(l, order[size_t(i)], &admitted);
      }
    }
  }
  // As the runtime does: a policy never fetches more experts than there are slots to put them in.
  PolicyOptions po;
  po.max_fetch = res.slots_per_layer * (o.global_pool ? L : 1);
  std::unique_ptr<AssignmentPolicy> policy = AssignmentPolicy::make(o.policy, po);
  std::unique_ptr<Prefetcher> prefetcher;
  if (o.prefetch != PrefetchKind::kNone) {
    PrefetchOptions pf;
    pf.max_experts = o.prefetch_size;
    prefetcher = Prefetcher::make(o.prefetch, pf);
  }
  const double transfer = cost.transfer();
  const uint64_t eb = o.expert_bytes;
  for (SimPhaseStats* s : {&res.prefill, &res.decode}) s->layer_seconds.assign(size_t(L), 0.0);

  std::vector<int32_t> ids;
  std::vector<float> w, sc, pred;
  std::vector<int64_t> cnt(static_cast<size_t>(E));
  std::vector<uint8_t> before(static_cast<size_t>(E)), fetched_now(static_cast<size_t>(E));
  std::vector<std::vector<int>> prefetched_for(static_cast<size_t>(L));
  // Link time still busy with earlier prefetches when the next layer starts (carried across
  // batches too: a copy in flight is not cancelled by the end of a step).
  double carry = 0;
  for (const TraceBatch& b : trace_batches(t)) {
    SimPhaseStats& st = b.phase == TracePhase::kDecode ? res.decode : res.prefill;
    const int n = int(b.end - b.begin);
    ++st.batches;
    st.tokens += n;
    for (auto& p : prefetched_for) p.clear();
    for (int l = 0; l < L; ++l) {
      ++st.layer_calls;
      ids.resize(size_t(n) * K);
      w.resize(size_t(n) * K);
      std::fill(cnt.begin(), cnt.end(), 0);
      for (int i = 0; i < n; ++i) {
        std::copy_n(t.ids_at(b.begin + i, l), K, ids.begin() + i * K);
        std::copy_n(t.weights_at(b.begin + i, l), K, w.begin() + i * K);
        for (int j = 0; j < K; ++j) ++cnt[size_t(ids[size_t(i) * K + j])];
      }
      if (t.has_scores) {
        sc.resize(size_t(n) * E);
        for (int i = 0; i < n; ++i) std::copy_n(t.scores_at(b.begin + i, l), E, sc.begin() + i * E);
      }
      LayerRouting r;
      r.layer = l;
      r.n_tokens = n;
      r.k = K;
      r.n_experts = E;
      r.ids = ids.data();
      r.weights = w.data();
      r.scores = t.has_scores ? sc.data() : nullptr;

      for (int e = 0; e < E; ++e) {
        before[size_t(e)] = cache->resident(l, e) ? 1 : 0;
        if (cnt[size_t(e)] == 0) continue;
        ++st.activated;
        st.hits += before[size_t(e)];
      }
      for (int e : prefetched_for[size_t(l)]) st.prefetch_used += cnt[size_t(e)] > 0;
      cache->on_routing(r);
      // DALI's window update (Alg. 2): the cache asks for experts; the runtime copies them in.
      for (int e : cache->wanted(l)) {
        bool admitted = false;
        if (e >= 0 && e < E && !cache->resident(l, e)) cache->admit(l, e, &admitted);
      }
      Assignment a = policy->assign(r, *cache, cost);
      if (a.on_accel.size() != size_t(E)) a.on_accel.resize(size_t(E), 0);
      // Copies in the order the runtime issues them: the policy's fetch list, then any expert
      // the cache loaded by itself (a window update) or that runs on the accelerator without
      // being resident or fetched.
      std::vector<int> loads;
      std::fill(fetched_now.begin(), fetched_now.end(), 0);
      for (int e : a.fetch) {
        if (e < 0 || e >= E || fetched_now[size_t(e)]) continue;
        bool admitted = false;
        if (!cache->resident(l, e)) cache->admit(l, e, &admitted);
        fetched_now[size_t(e)] = 1;
        loads.push_back(e);
      }
      for (int e = 0; e < E; ++e) {
        const bool became = !before[size_t(e)] && cache->resident(l, e);
        const bool unplanned = a.on_accel[size_t(e)] && cnt[size_t(e)] && !before[size_t(e)];
        if ((became || unplanned) && !fetched_now[size_t(e)]) {
          fetched_now[size_t(e)] = 1;
          loads.push_back(e);
        }
      }
      st.fetched += int64_t(loads.size());
      st.bytes += uint64_t(loads.size()) * eb;
      // Timeline: CPU experts run from t = 0; the accelerator runs its resident experts, then
      // each copied expert once its weights arrived; the link starts when the previous layer's
      // prefetches are done.
      double cpu = 0, accel = 0, accel_busy = 0, link = carry;
      for (int e = 0; e < E; ++e) {
        if (!cnt[size_t(e)]) continue;
        if (a.on_accel[size_t(e)]) {
          ++st.on_accel;
          if (!fetched_now[size_t(e)]) {
            const double s = cost.accel_expert(cnt[size_t(e)]);
            accel += s;
            accel_busy += s;
          }
        } else {
          cpu += cost.cpu_expert(cnt[size_t(e)]);
        }
      }
      for (int e : loads) {
        link += transfer;
        if (a.on_accel[size_t(e)] && cnt[size_t(e)]) {
          const double s = cost.accel_expert(cnt[size_t(e)]);
          accel = std::max(accel, link) + s;
          accel_busy += s;
        }
      }
      if (cpu > 0) cpu += cost.cpu_layer_overhead;
      if (accel > 0) accel += cost.accel_layer_overhead;
      const double latency = std::max(cpu, accel);
      // Prefetch the next layer's experts on the link while this layer computes.
      if (prefetcher && l + 1 < L && o.prefetch_size != 0) {
        const std::vector<float>& src = pf_gate ? t.gate_pred : t.residual_pred;
        pred.resize(size_t(n) * E);
        for (int i = 0; i < n; ++i) {
          std::copy_n(src.data() + ((b.begin + i) * L + l) * E, E, pred.begin() + i * E);
        }
        prefetcher->set_layer_seconds(latency);
        const std::vector<int> choice = prefetcher->choose(l + 1, pred.data(), n, *cache, cost);
        int taken = 0;
        for (int e : choice) {
          if (o.prefetch_size >= 0 && taken == o.prefetch_size) break;
          if (e < 0 || e >= E || cache->resident(l + 1, e)) continue;
          bool admitted = false;
          cache->admit(l + 1, e, &admitted);
          if (!admitted) continue;
          ++taken;
          ++st.prefetched;
          st.bytes += eb;
          link += transfer;
          prefetched_for[size_t(l + 1)].push_back(e);
        }
      }
      st.link_seconds += link - carry;
      carry = std::max(0.0, link - latency);
      st.seconds += latency;
      st.layer_seconds[size_t(l)] += latency;
      st.cpu_seconds += cpu;
      st.accel_seconds += accel_busy;
    }
  }
  return res;
}

}  // namespace tandem::rt
