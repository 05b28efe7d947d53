// Synthetic routing traces with controllable statistics, for tests and for simulating when no
// model is at hand. Each layer has its own random popularity order; a slot's expert comes from
// (in this order of tries) the previous token's choice at the same layer (temporal locality), the
// related expert of this token's choice at the previous layer (inter-layer correlation: a fixed
// random permutation per layer), or a Zipf(skew) draw over the layer's popularity order.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/trace.h"

namespace tandem::rt {

struct SynthTraceOptions {
  std::string model = "synthetic";
  int n_layers = 4, n_experts = 64, top_k = 6;
  double skew = 0;         // Zipf exponent s of expert popularity: 0 = uniform
  double locality = 0;     // per slot: probability of reusing the previous token's expert
  double correlation = 0;  // per slot: probability of the expert related to the previous layer's
  int prefill_batches = 1, prefill_tokens = 64;  // prompts and tokens per prompt
  int decode_steps = 64;                         // decode steps after each prompt
  bool scores = true;       // record full scores (the routed experts hold most of the mass)
  bool predictions = true;  // record gate / residual predicted next-layer scores
  double gate_noise = 2.0, residual_noise = 1.0;  // log-normal sigma of the predictions (0 = exact)
  uint64_t seed = 1;
};

// Throws Error(kInvalidArgument) naming the option out of range.
Trace synth_trace(const SynthTraceOptions& options);

// The related expert at layer l + 1 of expert e at layer l (what `correlation` follows).
int synth_related_expert(const SynthTraceOptions& options, int layer, int expert);

}  // namespace tandem::rt
