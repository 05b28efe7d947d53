// Which routed experts are resident in accelerator memory, and which one to evict: LRU, LFU,
// MRS (HybriMoE eq. 3, router-score based) and DALI's workload window (Algorithm 2), or none.
// The same object decides in the runtime (HybridMoeBackend) and in the simulator; it only keeps
// the bookkeeping, the caller copies the weights into slot_of(). Ties break to the lowest id.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/choices.h"

namespace tandem::rt {

struct LayerRouting {  // one MoE layer, one batch
  int layer = 0;       // MoE layer index
  int n_tokens = 0, k = 0, n_experts = 0;
  const int32_t* ids = nullptr;    // [n_tokens, k]
  const float* weights = nullptr;  // [n_tokens, k]
  const float* scores = nullptr;   // [n_tokens, n_experts] router scores, may be null
};

// Tokens routed to each expert of the layer ([n_experts]); ids outside [0, n_experts) are ignored.
std::vector<int> routed_counts(const LayerRouting& r);

struct CacheConfig {
  int n_layers = 1, n_experts = 0, top_k = 1;
  int slots_per_layer = 0;   // resident experts per layer (pinned ones included)
  bool global_pool = false;  // true: one pool of n_layers * slots_per_layer shared by all layers
  double mrs_alpha = 0.5;    // MRS: weight of the current step's scores (eq. 3)
  int mrs_p = 0;             // MRS: scores accumulated for the top p experts; 0: 2 * top_k
  int dali_w_size = 4;       // DALI: steps (on_routing calls of a layer) per workload window
  int dali_u_size = 1;       // DALI: experts swapped in after each window (wanted())
};

class ExpertCache {  // LRU, LFU, MRS (HybriMoE eq. 3), DALI window (Alg. 2), none
 public:
  virtual ~ExpertCache() = default;
  // Error(kInvalidArgument) naming a bad config value.
  static std::unique_ptr<ExpertCache> make(CacheKind kind, const CacheConfig& c);

  virtual bool resident(int layer, int expert) const = 0;
  // --gpu-experts: resident and never evicted (takes a slot; Error(kResource) when none is free).
  virtual void pin(int layer, int expert) = 0;
  // Update recency / frequency / scores with the routing of one step of `r.layer`.
  virtual void on_routing(const LayerRouting& r) = 0;
  // Make `expert` resident; returns the evicted expert (of that layer; with a global pool it may
  // be of another layer: see last_evicted_layer()), or -1 when a free slot was used. *admitted is
  // false when there is no evictable slot (nothing changes then, returns -1). Admitting a resident
  // expert is a no-op (admitted, -1). Callers copy the weights into the freed slot.
  virtual int admit(int layer, int expert, bool* admitted) = 0;
  virtual int slot_of(int layer, int expert) const = 0;  // device slot holding it, -1 if none

  // --- beyond the contract ---
  virtual const std::string& kind() const = 0;
  virtual const CacheConfig& config() const = 0;
  int n_experts() const { return config().n_experts; }
  // Slots: per layer [0, slots_per_layer), global pool [0, n_layers * slots_per_layer).
  virtual int n_slots() const = 0;
  virtual int last_evicted_layer() const = 0;  // layer of the last admit()'s victim, -1 if none
  virtual bool pinned(int layer, int expert) const = 0;
  virtual std::vector<int> residents(int layer) const = 0;  // ascending ids
  // Experts the cache itself wants brought in now, best first (DALI Alg. 2: after each window the
  // u_size highest-workload non-resident experts that beat the lowest resident one). Empty for the
  // other kinds. A caller that honours it admit()s them (the victim is the lowest-workload one).
  virtual std::vector<int> wanted(int layer) const {
    (void)layer;
    return {};
  }
  // The eviction priority of an expert (higher = kept longer); for tests and diagnostics.
  virtual double priority(int layer, int expert) const = 0;
  // How many experts admit() can still bring into `layer` now: free slots plus residents that are
  // neither pinned nor protected. Protected: routed in the layer's latest on_routing() step or
  // admitted since (so a step's fetches never evict what that step runs on the accelerator);
  // with a global pool this holds for the admitting layer and the layer routed last.
  virtual int fetch_capacity(int layer) const = 0;
};

}  // namespace tandem::rt
