// One Gated DeltaNet layer (Qwen3-Next / Qwen3.5 linear attention) over a forward step's tokens
// on the CPU kernels: what the CPU's ForwardOps::linear_attention runs (and through it the host
// device's). Per token: the input projections, beta = sigmoid(b), the log decay g = a *
// softplus(alpha + dt_bias); per sequence: the causal convolution over its window (SiLU), q and
// k L2-normalized per key head (q / sqrt(dk)), the delta rule per value head (recurrent or
// chunked, ops/cpu/delta_net.h) over its state, with the step's checkpoints copied out where
// they fall; per token and value head: the gated RMSNorm (rms_norm(o) * w * silu(z)); out_proj.
#pragma once

#include <cstdint>
#include <vector>

#include "model/forward_ops.h"
#include "model/kv_cache.h"
#include "model/weights.h"
#include "ops/cpu/kernels.h"

namespace tandem {

class ThreadPool;

// Scratch reused across calls (grown on demand).
struct DeltaNetScratch {
  std::vector<float> proj[4], mixed, conv_in, conv_out, z, g, beta, o, normed;
};

struct DeltaNetLayerArgs {
  const ModelConfig* config = nullptr;
  const LayerWeights::DeltaNet* weights = nullptr;
  int64_t state_layer = 0;  // the layer's index among the recurrent layers (its state)
  const ForwardStep* step = nullptr;
  KvCache* cache = nullptr;
  ThreadPool* pool = nullptr;
  const kern::WeightViews* views = nullptr;
  int64_t chunk_tokens = 0;  // ForwardOpsOptions::delta_chunk_tokens (0: always recurrent)
};

// x [n, hidden] -> out [n, hidden].
void delta_net_layer(const DeltaNetLayerArgs& a, const float* x, float* out,
                     DeltaNetScratch& scratch);

}  // namespace tandem
