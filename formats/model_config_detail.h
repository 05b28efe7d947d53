// Internals shared by the ModelConfig translation units (readers, writers); not an API.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "formats/model_config.h"

namespace tandem::detail {

inline constexpr ModelArch kAllArches[] = {ModelArch::kDeepseek2, ModelArch::kDeepseek3,
                                           ModelArch::kQwen2Moe, ModelArch::kQwen3Moe,
                                           ModelArch::kMixtral, ModelArch::kGlm4Moe,
                                           ModelArch::kMiniMaxM2, ModelArch::kGptOss,
                                           ModelArch::kQwen3Next, ModelArch::kQwen35Moe,
                                           ModelArch::kDeepseek32, ModelArch::kGlmDsa};

// Largest magnitude any integer of a config may have when read (real limits are far lower and
// checked by validate_config_keys()): keeps sums and products of two values within int64.
inline constexpr int64_t kMaxConfigInt = int64_t{1} << 31;
inline bool in_config_range(int64_t v) {
  return v >= -kMaxConfigInt && v <= kMaxConfigInt;
}

// The MLA arches: DeepSeek-V2 / V3 / V3.2 and GLM-5 (DeepSeek-shaped).
bool is_deepseek(ModelArch arch);
// Qwen3-Next and Qwen3.5-MoE: Gated DeltaNet + gated attention, zero-centred norms in HF files.
inline bool is_qwen_hybrid(ModelArch arch) {
  return arch == ModelArch::kQwen3Next || arch == ModelArch::kQwen35Moe;
}

// DeepSeek-V3's router (noaux_tc): sigmoid scores, e_score_correction_bias for the choice only.
// GLM-4.5 and MiniMax-M2 route the same way (with one group).
inline void set_noaux_tc_routing(ModelConfig& c) {
  c.scoring = ScoringFunc::kSigmoid;
  c.topk_method = TopkMethod::kNoauxTc;
  c.has_e_score_correction_bias = true;
}
// HF `model_type`: deepseek_v2, deepseek_v3, qwen2_moe, qwen3_moe, mixtral, glm4_moe, minimax_m2,
// gpt_oss.
std::string_view hf_model_type(ModelArch arch);

// Maps a ModelConfig field name to the key that holds it in the source file, so that a
// validation error names what the user has to fix.
using KeyNamer = std::function<std::string(std::string_view field)>;
void validate_config_keys(const ModelConfig& config, std::string_view source,
                          const KeyNamer& key_of);

}  // namespace tandem::detail
