#include "runtime/policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "core/error.h"

namespace tandem::rt {

namespace {

// Accelerator side of a step: resident work starts at 0; fetched expert i (copy order) can start
// when its copy completes at (i + 1) * transfer. Earliest-release-first is optimal on one machine.
double accel_finish(double resident_work, const std::vector<double>& fetched_work,
                    double transfer) {
  double t = resident_work;
  for (size_t i = 0; i < fetched_work.size(); ++i) {
    t = std::max(t, double(i + 1) * transfer) + fetched_work[i];
  }
  return t;
}

// How many experts this step may fetch: the cache's capacity, capped by the option.
int fetch_cap(const LayerRouting& r, const ExpertCache& cache, const PolicyOptions& o) {
  int cap = cache.fetch_capacity(r.layer);
  if (o.max_fetch >= 0) cap = std::min(cap, o.max_fetch);
  return std::max(cap, 0);
}

// Fetch order minimizing the makespan for equal copy times: longest accelerator work first.
void sort_fetch(std::vector<int>* fetch, const std::vector<int>& counts, const CostModel& cost) {
  std::stable_sort(fetch->begin(), fetch->end(), [&](int a, int b) {
    const double ta = cost.accel_expert(counts[a]), tb = cost.accel_expert(counts[b]);
    return ta != tb ? ta > tb : a < b;
  });
}

Assignment finish(const std::vector<int>& counts, Assignment a, const CostModel& cost) {
  a.est_seconds = assignment_makespan(counts, a.on_accel, a.fetch, cost);
  return a;
}

class StaticPolicy final : public AssignmentPolicy {
 public:
  explicit StaticPolicy(bool fiddler, PolicyOptions o)
      : fiddler_(fiddler), name_(fiddler ? "fiddler" : "static"), o_(o) {}
  const std::string& name() const override { return name_; }

  Assignment assign(const LayerRouting& r, const ExpertCache& cache,
                    const CostModel& cost) override {
    const std::vector<int> counts = routed_counts(r);
    Assignment a;
    a.on_accel.assign(size_t(r.n_experts), 0);
    std::vector<int> candidates;
    for (int e = 0; e < r.n_experts; ++e) {
      if (counts[e] == 0) continue;
      if (cache.resident(r.layer, e)) {
        a.on_accel[e] = 1;
      } else if (fiddler_ &&
                 cost.transfer() + cost.accel_expert(counts[e]) < cost.cpu_expert(counts[e])) {
        candidates.push_back(e);
      }
    }
    // Fiddler decides each expert on its own; with fewer slots than winners the ones that save
    // the most go first.
    std::stable_sort(candidates.begin(), candidates.end(), [&](int x, int y) {
      auto gain = [&](int e) {
        return cost.cpu_expert(counts[e]) - cost.transfer() - cost.accel_expert(counts[e]);
      };
      return gain(x) > gain(y);
    });
    const int cap = fetch_cap(r, cache, o_);
    if (int(candidates.size()) > cap) candidates.resize(size_t(cap));
    for (int e : candidates) a.on_accel[e] = 1;
    a.fetch = candidates;
    sort_fetch(&a.fetch, counts, cost);
    return finish(counts, std::move(a), cost);
  }

 private:
  bool fiddler_;
  std::string name_;
  PolicyOptions o_;
};

class HybriMoePolicy final : public AssignmentPolicy {
 public:
  explicit HybriMoePolicy(PolicyOptions o) : o_(o) {}
  const std::string& name() const override { return name_; }
  Assignment assign(const LayerRouting& r, const ExpertCache& cache,
                    const CostModel& cost) override {
    const std::vector<int> counts = routed_counts(r);
    std::vector<uint8_t> cached(size_t(r.n_experts), 0);
    for (int e = 0; e < r.n_experts; ++e) cached[e] = cache.resident(r.layer, e);
    return hybrimoe_schedule(counts, cached, cost, fetch_cap(r, cache, o_));
  }

 private:
  std::string name_ = "hybrimoe";
  PolicyOptions o_;
};

// DALI Algorithm 1: experts by |t_gpu - t_cpu| descending; each goes to the accelerator when
// T_gpu + t_gpu <= T_cpu + t_cpu. t_gpu includes the copy for a non-resident expert (eq. 6).
class DaliPolicy final : public AssignmentPolicy {
 public:
  explicit DaliPolicy(PolicyOptions o) : o_(o) {}
  const std::string& name() const override { return name_; }
  Assignment assign(const LayerRouting& r, const ExpertCache& cache,
                    const CostModel& cost) override {
    const std::vector<int> counts = routed_counts(r);
    const int E = r.n_experts;
    std::vector<double> tg(size_t(E), 0.0), tc(size_t(E), 0.0);
    std::vector<int> order;
    for (int e = 0; e < E; ++e) {
      if (counts[e] == 0) continue;  // lines 9-10: not activated
      tc[e] = cost.cpu_expert(counts[e]);
      tg[e] = cost.accel_expert(counts[e]) + (cache.resident(r.layer, e) ? 0.0 : cost.transfer());
      order.push_back(e);
    }
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return std::abs(tg[a] - tc[a]) > std::abs(tg[b] - tc[b]);
    });
    int cap = fetch_cap(r, cache, o_);
    double T_gpu = 0, T_cpu = 0;
    Assignment a;
    a.on_accel.assign(size_t(E), 0);
    for (int e : order) {
      const bool resident = cache.resident(r.layer, e);
      if (T_gpu + tg[e] <= T_cpu + tc[e] && (resident || cap > 0)) {
        a.on_accel[e] = 1;
        T_gpu += tg[e];
        if (!resident) {
          a.fetch.push_back(e);
          --cap;
        }
      } else {
        T_cpu += tc[e];
      }
    }
    sort_fetch(&a.fetch, counts, cost);
    return finish(counts, std::move(a), cost);
  }

 private:
  std::string name_ = "dali";
  PolicyOptions o_;
};

// Exact minimum of assignment_makespan over CPU / accelerator (+ copy) per active expert, by
// depth-first branch and bound. Bounds: each side's partial time (monotone as experts are added)
// and (CPU work + accelerator work + sum over the rest of min(cpu, accel)) / 2.
class OptimalPolicy final : public AssignmentPolicy {
 public:
  explicit OptimalPolicy(PolicyOptions o) : o_(o) {}
  const std::string& name() const override { return name_; }

  Assignment assign(const LayerRouting& r, const ExpertCache& cache,
                    const CostModel& cost) override {
    counts_ = routed_counts(r);
    const int E = r.n_experts;
    cost_ = &cost;
    items_.clear();
    for (int e = 0; e < E; ++e) {
      if (counts_[e] == 0) continue;
      Item it;
      it.e = e;
      it.resident = cache.resident(r.layer, e);
      it.c = cost.cpu_expert(counts_[e]);
      it.g = cost.accel_expert(counts_[e]);
      items_.push_back(it);
    }
    std::stable_sort(items_.begin(), items_.end(), [&](const Item& a, const Item& b) {
      const double da = std::max(a.c, a.g), db = std::max(b.c, b.g);
      if (da != db) return da > db;
      if (a.resident != b.resident) return a.resident;
      return counts_[a.e] > counts_[b.e];
    });
    same_as_prev_.assign(items_.size(), 0);
    for (size_t i = 1; i < items_.size(); ++i) {
      same_as_prev_[i] = items_[i].resident == items_[i - 1].resident &&
                         counts_[items_[i].e] == counts_[items_[i - 1].e];
    }
    rest_min_.assign(items_.size() + 1, 0.0);
    for (size_t i = items_.size(); i-- > 0;) {
      rest_min_[i] = rest_min_[i + 1] + std::min(items_[i].c, items_[i].g);
    }
    cap_ = fetch_cap(r, cache, o_);
    // Start from the better of the heuristics: a tight first bound prunes most of the tree.
    Assignment best = DaliPolicy(o_).assign(r, cache, cost);
    Assignment h = HybriMoePolicy(o_).assign(r, cache, cost);
    h.est_seconds = assignment_makespan(counts_, h.on_accel, h.fetch, cost);
    if (h.est_seconds < best.est_seconds) best = h;
    best_ = best.est_seconds;
    best_side_.assign(items_.size(), 0);
    for (size_t i = 0; i < items_.size(); ++i) best_side_[i] = best.on_accel[items_[i].e];
    side_.assign(items_.size(), 0);
    nodes_ = 0;
    fetched_.clear();
    improved_ = false;
    search(0, 0.0, 0.0);
    if (!improved_) return best;
    Assignment a;
    a.on_accel.assign(size_t(E), 0);
    for (size_t i = 0; i < items_.size(); ++i) {
      if (!best_side_[i]) continue;
      a.on_accel[items_[i].e] = 1;
      if (!items_[i].resident) a.fetch.push_back(items_[i].e);
    }
    sort_fetch(&a.fetch, counts_, cost);
    return finish(counts_, std::move(a), cost);
  }

 private:
  struct Item {
    int e = 0;
    bool resident = false;
    double c = 0, g = 0;
  };

  double accel_time(double resident_work) const {
    std::vector<double> w = fetched_;
    std::sort(w.begin(), w.end(), std::greater<double>());
    const double t = accel_finish(resident_work, w, cost_->transfer());
    return t > 0 || !w.empty() ? t + cost_->accel_layer_overhead : 0.0;
  }

  void search(size_t i, double cpu, double resident_work) {
    ++nodes_;
    const double cpu_t = cpu > 0 ? cpu + cost_->cpu_layer_overhead : 0.0;
    const double acc_t = (resident_work > 0 || !fetched_.empty()) ? accel_time(resident_work) : 0.0;
    double fetched_work = 0;
    for (double w : fetched_) fetched_work += w;
    const double lb =
        std::max({cpu_t, acc_t, (cpu + resident_work + fetched_work + rest_min_[i]) / 2});
    if (lb >= best_ * (1 - 1e-12)) return;
    if (i == items_.size()) {
      best_ = std::max(cpu_t, acc_t);
      best_side_ = side_;
      improved_ = true;
      return;
    }
    if (o_.max_nodes > 0 && nodes_ > o_.max_nodes) return;
    const Item& it = items_[i];
    // Identical experts are interchangeable: among a run of them, the accelerator ones come first.
    const bool accel_ok =
        (it.resident || int(fetched_.size()) < cap_) && !(same_as_prev_[i] && side_[i - 1] == 0);
    auto go_accel = [&] {
      side_[i] = 1;
      if (it.resident) {
        search(i + 1, cpu, resident_work + it.g);
      } else {
        fetched_.push_back(it.g);
        search(i + 1, cpu, resident_work);
        fetched_.pop_back();
      }
      side_[i] = 0;
    };
    const double g_eff = it.g + (it.resident ? 0.0 : cost_->transfer());
    if (accel_ok && g_eff < it.c) {
      go_accel();
      search(i + 1, cpu + it.c, resident_work);
    } else {
      search(i + 1, cpu + it.c, resident_work);
      if (accel_ok) go_accel();
    }
  }

  std::string name_ = "optimal";
  PolicyOptions o_;
  const CostModel* cost_ = nullptr;
  std::vector<int> counts_;
  std::vector<Item> items_;
  std::vector<double> rest_min_, fetched_;
  std::vector<uint8_t> side_, best_side_, same_as_prev_;
  double best_ = 0;
  int cap_ = 0;
  int64_t nodes_ = 0;
  bool improved_ = false;
};

}  // namespace

double assignment_makespan(const std::vector<int>& counts, const std::vector<uint8_t>& on_accel,
                           const std::vector<int>& fetch, const CostModel& cost) {
  std::vector<uint8_t> is_fetched(counts.size(), 0);
  std::vector<double> fetched_work;
  for (int e : fetch) {
    if (e < 0 || size_t(e) >= counts.size() || is_fetched[e]) continue;
    is_fetched[e] = 1;
    fetched_work.push_back(cost.accel_expert(counts[e]));
  }
  double cpu = 0, resident = 0;
  bool any_cpu = false, any_accel = !fetched_work.empty();
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] <= 0 || is_fetched[e]) continue;
    if (e < on_accel.size() && on_accel[e]) {
      resident += cost.accel_expert(counts[e]);
      any_accel = true;
    } else {
      cpu += cost.cpu_expert(counts[e]);
      any_cpu = true;
    }
  }
  const double cpu_t = any_cpu ? cpu + cost.cpu_layer_overhead : 0.0;
  const double acc_t =
      any_accel ? accel_finish(resident, fetched_work, cost.transfer()) + cost.accel_layer_overhead
                : 0.0;
  return std::max(cpu_t, acc_t);
}

// HybriMoE §IV-B. Three timelines (GPU, PCIe, CPU); each step the one free earliest acts (ties
// in that order): the GPU runs the highest-load expert of its queue (cached + arrived copies),
// waiting for a copy when its queue is empty; the link copies the highest-load expert of the CPU
// queue when that finishes it sooner than leaving it to the CPU; the CPU runs the lowest-load
// uncached expert, and when none is left takes the lowest-load cached one if it would finish it
// before the GPU gets through its queue.
Assignment hybrimoe_schedule(const std::vector<int>& counts, const std::vector<uint8_t>& cached,
                             const CostModel& cost, int max_fetch,
                             std::vector<std::string>* order_out) {
  const int E = static_cast<int>(counts.size());
  auto load_desc = [&](int a, int b) {
    return counts[a] != counts[b] ? counts[a] > counts[b] : a < b;
  };
  std::vector<int> gpu_q, cpu_q;  // gpu_q: descending load; cpu_q: descending too (back = lowest)
  for (int e = 0; e < E; ++e) {
    if (counts[e] <= 0) continue;
    (cached[e] ? gpu_q : cpu_q).push_back(e);
  }
  std::sort(gpu_q.begin(), gpu_q.end(), load_desc);
  std::sort(cpu_q.begin(), cpu_q.end(), load_desc);
  std::vector<std::pair<double, int>> inflight;  // (arrival, expert) in copy order
  Assignment a;
  a.on_accel.assign(size_t(E), 0);
  double t_cpu = 0, t_gpu = 0, t_pcie = 0;
  bool cpu_used = false, gpu_used = false;
  const double kInf = std::numeric_limits<double>::infinity();
  auto sum = [&](const std::vector<int>& q, bool accel) {
    double s = 0;
    for (int e : q) s += accel ? cost.accel_expert(counts[e]) : cost.cpu_expert(counts[e]);
    return s;
  };
  auto emit = [&](const char* who, int e) {
    if (order_out != nullptr) order_out->push_back(fmt::format("{}:{}", who, e));
  };
  while (!gpu_q.empty() || !cpu_q.empty() || !inflight.empty()) {
    // When the GPU would be through everything it has or will receive.
    double gpu_end = t_gpu + sum(gpu_q, true);
    for (const auto& [arr, e] : inflight)
      gpu_end = std::max(gpu_end, arr) + cost.accel_expert(counts[e]);
    const double cpu_end = t_cpu + sum(cpu_q, false);

    double when_gpu = kInf, when_pcie = kInf, when_cpu = kInf;
    if (!gpu_q.empty())
      when_gpu = t_gpu;
    else if (!inflight.empty())
      when_gpu = std::max(t_gpu, inflight.front().first);
    if (!cpu_q.empty() && int(a.fetch.size()) < max_fetch) {
      const int e = cpu_q.front();
      const double arrival = t_pcie + cost.transfer();
      if (std::max(arrival, gpu_end) + cost.accel_expert(counts[e]) < cpu_end) when_pcie = t_pcie;
    }
    int steal = -1;
    if (!cpu_q.empty()) {
      when_cpu = t_cpu;
    } else if (!gpu_q.empty()) {
      // Lowest-load cached expert (the back of the queue; skip arrived copies).
      for (size_t i = gpu_q.size(); i-- > 0;) {
        if (cached[gpu_q[i]]) {
          steal = gpu_q[i];
          break;
        }
      }
      if (steal >= 0 &&
          t_cpu + cost.cpu_expert(counts[steal]) < gpu_end - cost.accel_expert(counts[steal])) {
        when_cpu = t_cpu;
      }
    }
    if (when_gpu <= when_pcie && when_gpu <= when_cpu && when_gpu < kInf) {
      t_gpu = when_gpu;
      while (!inflight.empty() && inflight.front().first <= t_gpu) {
        gpu_q.insert(
            std::lower_bound(gpu_q.begin(), gpu_q.end(), inflight.front().second, load_desc),
            inflight.front().second);
        inflight.erase(inflight.begin());
      }
      const int e = gpu_q.front();
      gpu_q.erase(gpu_q.begin());
      emit("gpu", e);
      t_gpu += cost.accel_expert(counts[e]);
      a.on_accel[e] = 1;
      gpu_used = true;
    } else if (when_pcie <= when_cpu && when_pcie < kInf) {
      const int e = cpu_q.front();
      cpu_q.erase(cpu_q.begin());
      emit("pcie", e);
      t_pcie += cost.transfer();
      inflight.emplace_back(t_pcie, e);
      a.fetch.push_back(e);
    } else if (when_cpu < kInf) {
      int e;
      if (!cpu_q.empty()) {
        e = cpu_q.back();
        cpu_q.pop_back();
      } else {
        e = steal;
        gpu_q.erase(std::find(gpu_q.begin(), gpu_q.end(), e));
      }
      emit("cpu", e);
      t_cpu += cost.cpu_expert(counts[e]);
      cpu_used = true;
    } else {
      break;  // unreachable: the GPU can always act while its queue or a copy is pending
    }
  }
  const double cpu_t = cpu_used ? t_cpu + cost.cpu_layer_overhead : 0.0;
  const double gpu_t = gpu_used ? t_gpu + cost.accel_layer_overhead : 0.0;
  a.est_seconds = std::max(cpu_t, gpu_t);
  return a;
}

std::unique_ptr<AssignmentPolicy> AssignmentPolicy::make(PolicyKind kind,
                                                         const PolicyOptions& options) {
  switch (kind) {
    case PolicyKind::kStatic:
      return std::make_unique<StaticPolicy>(false, options);
    case PolicyKind::kFiddler:
      return std::make_unique<StaticPolicy>(true, options);
    case PolicyKind::kHybriMoe:
      return std::make_unique<HybriMoePolicy>(options);
    case PolicyKind::kDali:
      return std::make_unique<DaliPolicy>(options);
    case PolicyKind::kOptimal:
      return std::make_unique<OptimalPolicy>(options);
  }
  fail(ErrorKind::kInvalidArgument, "assignment policy {}: not a policy", static_cast<int>(kind));
}

}  // namespace tandem::rt
