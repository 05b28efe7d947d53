// MoE routers: from one token's router logits to the k selected experts and their weights.
// Softmax top-k with optional renormalization (Mixtral, Qwen), DeepSeek-V2 greedy /
// group_limited_greedy (softmax, best groups by their max score) and DeepSeek-V3 noaux_tc
// (sigmoid, e_score_correction_bias for selection only, groups by the sum of their top-2).
#pragma once

#include <cstdint>
#include <vector>

#include "formats/model_config.h"

namespace tandem {

// logits [n_experts]; bias [n_experts] or nullptr; writes k = n_experts_per_tok ids (by
// descending selection score, lowest id first on ties) and weights. scratch is reused.
void route_token(const ModelConfig& config, const float* logits, const float* bias, int32_t* ids,
                 float* weights, std::vector<float>& scratch);

// The router's per-expert scores of one token (softmax or sigmoid of the logits, before any
// selection bias): what traces record as "full scores" and what HybriMoE's MRS cache reads.
void router_scores(const ModelConfig& config, const float* logits, float* scores);

}  // namespace tandem
