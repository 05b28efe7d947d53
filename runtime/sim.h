// `tandem sim`: replays a routing trace through the runtime's own expert cache, assignment
// policy and prefetcher objects (runtime/expert_cache.h, policy.h, prefetch.h) with a cost model
// (runtime/cost_model.h), batch by batch and MoE layer by MoE layer, exactly in the order the
// hybrid runtime calls them, and accounts what the runtime would do: cache hits, fetched and
// prefetched experts, bytes over the link, and an estimated per-layer timeline (CPU experts,
// accelerator experts after their weights arrive, prefetches overlapping the layer).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/choices.h"
#include "runtime/cost_model.h"
#include "runtime/trace.h"

namespace tandem::rt {

struct SimOptions {
  PolicyKind policy = PolicyKind::kStatic;
  CacheKind cache = CacheKind::kLru;
  PrefetchKind prefetch = PrefetchKind::kNone;
  std::string cache_size = "25%";  // slots per layer: N or P% of the experts
  int prefetch_size = -1;          // cap on experts prefetched per layer (-1: what the link
                                   // moves within the layer's time, the prefetcher's rule)
  bool global_pool = false;        // one pool of slots_per_layer x layers
  uint64_t expert_bytes = 0;       // bytes one expert moves (0: the cost model's, if any)
  // Start with every layer's cache filled with its most used experts of the trace (as
  // --gpu-experts places popular experts at load time; not counted as copies). false: empty.
  bool warm = true;
  double mrs_alpha = 0.5;
  int dali_w_size = 4, dali_u_size = 1;
};

// Slots per layer from "N" or "P%" of n_experts; Error(kInvalidArgument) naming --cache-size.
int parse_cache_size(const std::string& text, int n_experts);

struct SimPhaseStats {
  int64_t batches = 0, tokens = 0, layer_calls = 0;
  int64_t activated = 0;  // (layer, batch, expert) triples with at least one token
  int64_t hits = 0;       // ... of them resident before the layer ran
  int64_t on_accel = 0;   // ... run on the accelerator
  int64_t fetched = 0;    // on-demand copies (policy's fetch list)
  int64_t prefetched = 0, prefetch_used = 0;  // prefetched experts, and those then activated
  uint64_t bytes = 0;                         // host -> accelerator bytes (fetch + prefetch)
  double seconds = 0;                         // estimated MoE time, sum over layer calls
  double cpu_seconds = 0, accel_seconds = 0, link_seconds = 0;  // busy time
  std::vector<double> layer_seconds;  // [L] per MoE layer, summed over batches

  double hit_rate() const { return activated ? double(hits) / double(activated) : 0; }
  double prefetch_accuracy() const {
    return prefetched ? double(prefetch_used) / double(prefetched) : 0;
  }
};

struct SimResult {
  SimOptions options;
  int slots_per_layer = 0;
  SimPhaseStats prefill, decode;
};

SimResult simulate(const Trace& trace, const CostModel& cost, const SimOptions& options);

}  // namespace tandem::rt
