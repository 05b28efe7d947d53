// `tandem sim`: replay a routing trace through the runtime's cache / policy / prefetch objects
// with a cost model from `tandem profile`; one configuration, or --sweep over all of them.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/cost_model.h"
#include "runtime/sim.h"
#include "runtime/trace.h"
#include "tools/command.h"
#include "tools/options.h"

namespace tandem::tools {
namespace {

struct SimArgs {
  std::string trace, profile;
  rt::SimOptions o;
  bool json = false, sweep = false;
  std::vector<rt::PolicyKind> policies = {rt::PolicyKind::kStatic, rt::PolicyKind::kFiddler,
                                          rt::PolicyKind::kHybriMoe, rt::PolicyKind::kDali,
                                          rt::PolicyKind::kOptimal};
  std::vector<rt::CacheKind> caches = {rt::CacheKind::kLru, rt::CacheKind::kLfu,
                                       rt::CacheKind::kMrs, rt::CacheKind::kDali};
  std::vector<std::string> sizes = {"25%", "50%", "75%"};
  std::vector<rt::PrefetchKind> prefetchers;  // empty: none + what the trace supports
};

nlohmann::json phase_json(const rt::SimPhaseStats& s) {
  nlohmann::json j;
  j["batches"] = s.batches;
  j["tokens"] = s.tokens;
  j["activated"] = s.activated;
  j["hits"] = s.hits;
  j["hit_rate"] = s.hit_rate();
  j["on_accel"] = s.on_accel;
  j["fetched"] = s.fetched;
  j["prefetched"] = s.prefetched;
  j["prefetch_used"] = s.prefetch_used;
  j["prefetch_accuracy"] = s.prefetch_accuracy();
  j["bytes"] = s.bytes;
  j["seconds"] = s.seconds;
  j["seconds_per_token"] = s.tokens ? s.seconds / double(s.tokens) : 0.0;
  j["cpu_busy"] = s.seconds > 0 ? s.cpu_seconds / s.seconds : 0.0;
  j["accel_busy"] = s.seconds > 0 ? s.accel_seconds / s.seconds : 0.0;
  j["link_busy"] = s.seconds > 0 ? s.link_seconds / s.seconds : 0.0;
  j["layer_seconds"] = s.layer_seconds;
  return j;
}

nlohmann::json result_json(const rt::SimResult& r) {
  nlohmann::json j;
  j["policy"] = rt::choice_name(r.options.policy);
  j["cache"] = rt::choice_name(r.options.cache);
  j["prefetch"] = rt::choice_name(r.options.prefetch);
  j["cache_size"] = r.options.cache_size;
  j["slots_per_layer"] = r.slots_per_layer;
  j["prefill"] = phase_json(r.prefill);
  j["decode"] = phase_json(r.decode);
  return j;
}

void print_header() {
  std::printf("%-9s %-5s %-8s %5s | %-7s %6s %6s %6s %9s %10s %6s %6s %6s\n", "policy", "cache",
              "prefetch", "size", "phase", "tokens", "hit%", "pfacc%", "MB moved", "ms/token",
              "cpu%", "acc%", "link%");
}

void print_row(const rt::SimResult& r) {
  for (const auto* ph : {&r.prefill, &r.decode}) {
    if (ph->tokens == 0) continue;
    const double secs = ph->seconds > 0 ? ph->seconds : 1;
    std::printf("%-9s %-5s %-8s %5s | %-7s %6ld %6.1f %6s %9.1f %10.4f %6.1f %6.1f %6.1f\n",
                std::string(rt::choice_name(r.options.policy)).c_str(),
                std::string(rt::choice_name(r.options.cache)).c_str(),
                std::string(rt::choice_name(r.options.prefetch)).c_str(),
                r.options.cache_size.c_str(), ph == &r.prefill ? "prefill" : "decode",
                long(ph->tokens), 100 * ph->hit_rate(),
                ph->prefetched ? fmt::format("{:.1f}", 100 * ph->prefetch_accuracy()).c_str() : "-",
                double(ph->bytes) / 1e6, 1e3 * ph->seconds / double(ph->tokens),
                100 * ph->cpu_seconds / secs, 100 * ph->accel_seconds / secs,
                100 * ph->link_seconds / secs);
  }
}

void run_sim(const SimArgs& a) {
  const rt::Trace t = rt::read_trace(a.trace);
  const rt::CostModel cost = rt::CostModel::load(a.profile);
  rt::SimOptions base = a.o;
  if (base.expert_bytes == 0) base.expert_bytes = cost.expert_bytes;
  std::vector<rt::SimResult> results;
  if (!a.sweep) {
    results.push_back(rt::simulate(t, cost, base));
  } else {
    std::vector<rt::PrefetchKind> pfs = a.prefetchers;
    if (pfs.empty()) {
      pfs.push_back(rt::PrefetchKind::kNone);
      if (t.has_gate_pred) pfs.push_back(rt::PrefetchKind::kGate);
      if (t.has_residual_pred) pfs.push_back(rt::PrefetchKind::kResidual);
    }
    for (const auto& size : a.sizes) {
      for (const auto& policy : a.policies) {
        for (const auto& cache : a.caches) {
          for (const auto& pf : pfs) {
            rt::SimOptions o = base;
            o.policy = policy;
            o.cache = cache;
            o.prefetch = pf;
            o.cache_size = size;
            results.push_back(rt::simulate(t, cost, o));
          }
        }
      }
    }
  }
  if (a.json) {
    nlohmann::json j;
    j["trace"] = a.trace;
    j["profile"] = a.profile;
    j["model"] = t.model;
    j["n_layers"] = t.n_layers;
    j["n_experts"] = t.n_experts;
    j["top_k"] = t.top_k;
    j["expert_bytes"] = base.expert_bytes;
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& r : results) arr.push_back(result_json(r));
    j["results"] = arr;
    std::printf("%s\n", j.dump(1).c_str());
    return;
  }
  std::printf(
      "trace %s: %ld records, %d MoE layers, %d experts, top-%d; expert %.2f MB, transfer "
      "%.3f ms\n",
      a.trace.c_str(), long(t.size()), t.n_layers, t.n_experts, t.top_k,
      double(base.expert_bytes) / 1e6, 1e3 * cost.transfer());
  print_header();
  for (const auto& r : results) print_row(r);
}

void add_sim(CLI::App& app) {
  auto a = std::make_shared<SimArgs>();
  app.add_option("--trace", a->trace, "trace from `tandem trace` (or a demo NAME.json)")
      ->required();
  app.add_option("--profile", a->profile, "cost model from `tandem profile`")->required();
  add_choice_option(app, &a->o.policy, "CPU/accelerator assignment");
  add_choice_option(app, &a->o.cache, "expert cache");
  add_choice_option(app, &a->o.prefetch, "expert prefetching");
  app.add_option("--cache-size", a->o.cache_size, "expert cache slots per layer: N or P%")
      ->capture_default_str();
  app.add_option("--prefetch-size", a->o.prefetch_size,
                 "experts prefetched per layer (default: what the link moves in the layer's "
                 "time)")
      ->check(number_in(0));
  app.add_flag("!--no-warm", a->o.warm,
               "start with empty caches (default: each layer's most used "
               "experts of the trace, as --gpu-experts would place them)");
  app.add_flag("--global-pool", a->o.global_pool, "one slot pool shared by all layers");
  app.add_option("--expert-bytes", a->o.expert_bytes,
                 "bytes per expert copy (default: the profile's)");
  app.add_option("--mrs-alpha", a->o.mrs_alpha, "MRS cache: alpha (HybriMoE eq. 3)")
      ->check(number_in(0, 1))
      ->capture_default_str();
  app.add_option("--dali-w", a->o.dali_w_size, "DALI cache: window w_size")
      ->check(number_in(1, 4096))
      ->capture_default_str();
  app.add_option("--dali-u", a->o.dali_u_size, "DALI cache: experts updated u_size")
      ->check(number_in(0))
      ->capture_default_str();
  app.add_flag("--json", a->json, "print JSON instead of a table");
  app.add_flag("--sweep", a->sweep, "all policies x caches x {25,50,75}% x prefetchers");
  add_choice_list_option(app, "--sweep-policies", &a->policies, "--sweep: the policies");
  add_choice_list_option(app, "--sweep-caches", &a->caches, "--sweep: the caches");
  app.add_option("--sweep-sizes", a->sizes, "--sweep: the cache sizes")->delimiter(',');
  add_choice_list_option(app, "--sweep-prefetch", &a->prefetchers, "--sweep: the prefetchers");
  app.callback([a] { run_sim(*a); });
}

Registrar reg("sim", "Replay a routing trace through the expert cache / policy / prefetch objects",
              add_sim);

}  // namespace
}  // namespace tandem::tools
