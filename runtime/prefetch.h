// Prefetchers: while layer l runs, which experts of layer l + 1 to copy to the accelerator.
// The caller computes the predicted next-layer router scores and passes them in:
//   gate      the next layer's router applied to this layer's hidden state (HybriMoE / many
//   others); residual  the next layer's router applied to hidden + res_vec(l) (DALI eq. 11: the
//   mean
//             residual-stream step of layer l measured by `tandem calibrate`).
// Both then use the same choice rule (HybriMoE §IV-C impact ordering): experts not resident,
// ranked by expected tokens x (cpu(n) - accel(n)) (the time a hit saves), as many as the link moves
// within the estimated current-layer time (at least one when any is predicted).
// The runtime predicts from the model, the simulator from the trace; this object only chooses.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/cost_model.h"
#include "runtime/expert_cache.h"

namespace tandem::rt {

struct PrefetchOptions {
  int max_experts = -1;  // cap per step (-1: only the link-time budget)
  // Link time budget per step in seconds; <= 0: estimated as the current layer's time, which the
  // caller passes with set_layer_seconds() (else the CPU time of top_k experts at 1 token).
  double budget_seconds = 0;
  int top_k = 0;  // experts per token; 0: cache.config().top_k
};

class Prefetcher {  // none, gate (next layer's router on this hidden state), residual (DALI eq. 11)
 public:
  virtual ~Prefetcher() = default;
  static std::unique_ptr<Prefetcher> make(PrefetchKind kind,
                                          const PrefetchOptions& options = {});
  // Given predicted next-layer router scores [n_tokens, n_experts] (n_experts from the cache's
  // config; computed by the caller: runtime from the model, simulator from the trace), the experts
  // of layer `next_layer` to copy now, best first.
  virtual std::vector<int> choose(int next_layer, const float* predicted_scores, int n_tokens,
                                  const ExpertCache& cache, const CostModel& cost) = 0;
  // The current layer's estimated time (e.g. the policy's est_seconds): the link budget.
  void set_layer_seconds(double s) { layer_seconds_ = s; }
  virtual const std::string& name() const = 0;

 protected:
  double layer_seconds_ = 0;
};

}  // namespace tandem::rt
