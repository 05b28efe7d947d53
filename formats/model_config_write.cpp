// ModelConfig -> HF config.json text and GGUF model keys: what the synthetic-model writer and
// converters put in the files they make, keyed as transformers and convert_hf_to_gguf.py do.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/model_config.h"
#include "formats/model_config_detail.h"

namespace tandem {
namespace {

using OJson = nlohmann::ordered_json;

using detail::is_deepseek;

// The float as its shortest decimal, so that config.json says 1e-06, not 9.99999997e-07.
double pretty(float v) {
  return std::stod(fmt::format("{}", v));
}

// Throws "<target> cannot express <what> for architecture <arch>".
class Refuse {
 public:
  Refuse(const ModelConfig& c, std::string_view target) : c_(c), target_(target) {}
  [[noreturn]] void operator()(const char* what) const {
    fail(ErrorKind::kUnsupported, "{} cannot express {} for architecture {}", target_, what,
         arch_name(c_.arch));
  }

 private:
  const ModelConfig& c_;
  std::string_view target_;
};

// The layer features that follow from the architecture: q/k norms, MTP layers, the indexer,
// biases, gates, linear attention, RoPE sections.
void check_layer_features(const ModelConfig& c, const Refuse& refuse) {
  const bool qwen2 = c.arch == ModelArch::kQwen2Moe, qwen3 = c.arch == ModelArch::kQwen3Moe;
  const bool glm = c.arch == ModelArch::kGlm4Moe, minimax = c.arch == ModelArch::kMiniMaxM2;
  const bool hybrid = detail::is_qwen_hybrid(c.arch);
  if (!glm && c.qk_norm != (qwen3 || minimax || hybrid)) {
    refuse(c.qk_norm ? "q/k norms" : "the absence of q/k norms");
  }
  if (c.qk_norm_all_heads != minimax) refuse("this q/k norm span");
  const bool dsa = c.arch == ModelArch::kDeepseek32 || c.arch == ModelArch::kGlmDsa;
  if (c.nextn_layers != 0 && !glm && !hybrid && !dsa) refuse("multi-token-prediction layers");
  if (c.has_indexer() != dsa) refuse(dsa ? "attention without the indexer" : "a lightning indexer");
  if (c.index_rope_interleaved != (c.arch == ModelArch::kGlmDsa)) refuse("this indexer RoPE");
  if (!c.index_shared_layers.empty() && c.arch != ModelArch::kGlmDsa) {
    refuse("layers sharing an indexer");
  }
  if (qwen2 && !c.attention_bias) refuse("q/k/v without bias");
  if (minimax && c.attention_bias) refuse("attention bias");
  if (c.shared_expert_gate != ((qwen2 || hybrid) && c.shared_expert_intermediate_size > 0)) {
    refuse("this shared-expert gate setting");
  }
  if (c.attn_output_gate != hybrid) {
    refuse(hybrid ? "attention without its gate" : "gated attention");
  }
  if ((c.full_attention_interval > 0) != hybrid) {
    refuse(hybrid ? "no linear-attention layers" : "linear-attention layers");
  }
  const bool sections = c.rope_sections != std::array<int64_t, 4>{};
  if (sections != (c.arch == ModelArch::kQwen35Moe)) {
    refuse(sections ? "multi-section RoPE" : "RoPE without sections");
  }
  if (hybrid && c.rope_scaling.type != RopeScalingType::kNone) refuse("rope scaling");
}

// The routing and expert layout each family fixes: GLM-4.5 / MiniMax-M2 (sigmoid with a
// selection bias), DeepSeek (MLA, noaux_tc with its bias), the rest (softmax greedy, no MLA).
void check_routing(const ModelConfig& c, const Refuse& refuse) {
  const bool glm = c.arch == ModelArch::kGlm4Moe, minimax = c.arch == ModelArch::kMiniMaxM2;
  if (glm || minimax) {
    // Both route with sigmoid scores and a selection bias (noaux_tc); neither has MLA.
    if (c.is_mla() || c.q_lora_rank != 0) refuse("MLA");
    if (c.scoring != ScoringFunc::kSigmoid || c.topk_method != TopkMethod::kNoauxTc ||
        !c.has_e_score_correction_bias) {
      refuse("routing other than sigmoid scores with a selection bias");
    }
    if (c.shared_expert_intermediate_size != c.n_shared_experts * c.moe_intermediate_size) {
      refuse("a shared-expert width that is not n_shared_experts * moe_intermediate_size");
    }
  }
  if (minimax) {
    if (!c.norm_topk_prob) refuse("top-k weights without renormalization");
    if (c.n_shared_experts != 0) refuse("shared experts");
    if (c.n_group != 1 || c.topk_group != 1 || c.routed_scaling_factor != 1.0f) {
      refuse("grouped or scaled routing");
    }
    if (c.first_k_dense_replace != 0) refuse("leading dense layers");
    if (c.moe_intermediate_size != c.intermediate_size) refuse("an expert width != intermediate");
  } else if (glm) {
    if (c.moe_layer_freq != 1 || !c.mlp_only_layers.empty()) refuse("dense layers after MoE");
  } else if (is_deepseek(c.arch)) {
    if (c.shared_expert_intermediate_size != c.n_shared_experts * c.moe_intermediate_size) {
      refuse("a shared-expert width that is not n_shared_experts * moe_intermediate_size");
    }
    if (c.has_e_score_correction_bias != (c.topk_method == TopkMethod::kNoauxTc)) {
      refuse("a selection bias without noaux_tc (or noaux_tc without one)");
    }
    if (!c.is_mla()) refuse("attention without MLA");
  } else {
    if (c.is_mla() || c.q_lora_rank != 0) refuse("MLA");
    if (c.scoring != ScoringFunc::kSoftmax || c.topk_method != TopkMethod::kGreedy ||
        c.n_group != 1 || c.topk_group != 1 || c.routed_scaling_factor != 1.0f) {
      refuse("DeepSeek routing options");
    }
    if (c.first_k_dense_replace != 0) refuse("leading dense layers");
  }
  if (minimax && (c.moe_layer_freq != 1 || !c.mlp_only_layers.empty())) refuse("dense layers");
}

// gpt-oss's sinks, clamped SwiGLU and windowed layers (nobody else has them), and the
// all-MoE layout gpt-oss and Mixtral share.
void check_gpt_oss_mixtral(const ModelConfig& c, const Refuse& refuse, bool gguf) {
  const bool gpt_oss = c.arch == ModelArch::kGptOss;
  if (c.attn_sinks != gpt_oss) refuse(c.attn_sinks ? "attention sinks" : "attention without sinks");
  if ((c.swiglu_limit > 0.0f) != gpt_oss) refuse("this SwiGLU clamp");
  if (c.swa_period != 0 && !gpt_oss) refuse("sliding-window layers");
  if (gpt_oss) {
    if (!c.norm_topk_prob) refuse("top-k weights without the softmax over them");
    if (c.moe_intermediate_size != c.intermediate_size) refuse("an expert width != intermediate");
    if (c.moe_layer_freq != 1 || !c.mlp_only_layers.empty()) refuse("dense layers");
    if (!c.attention_bias) refuse("attention without biases");
    if (c.sliding_window == 0 || c.swa_period < 2) refuse("no windowed layers");
    if (c.head_dim != c.rope_dim || c.head_dim != c.v_head_dim) refuse("partial rotary");
    if (gguf && c.swiglu_limit != 7.0f) refuse("a SwiGLU limit other than llama.cpp's 7");
  }
  if (c.arch == ModelArch::kMixtral) {
    if (!c.norm_topk_prob) refuse("top-k weights without renormalization");
    if (c.moe_intermediate_size != c.intermediate_size) refuse("an expert width != intermediate");
    if (c.moe_layer_freq != 1 || !c.mlp_only_layers.empty()) refuse("dense layers");
  }
}

// What llama.cpp hard-codes per arch (see config_from_gguf()): Qwen's renormalization, an
// all-MoE stack, YaRN's mscale, attention biases.
void check_gguf_fixed(const ModelConfig& c, const Refuse& refuse) {
  const bool qwen2 = c.arch == ModelArch::kQwen2Moe, qwen3 = c.arch == ModelArch::kQwen3Moe;
  if ((qwen2 || qwen3) && c.norm_topk_prob != qwen3) refuse("this norm_topk_prob");
  if (detail::is_qwen_hybrid(c.arch) && !c.norm_topk_prob) {
    refuse("top-k weights without renormalization");
  }
  if (c.moe_layer_freq != 1 || !c.mlp_only_layers.empty())
    refuse("non-MoE layers in the MoE stack");
  if (c.rope_scaling.type == RopeScalingType::kYarn && is_deepseek(c.arch) &&
      c.rope_scaling.mscale != c.rope_scaling.mscale_all_dim) {
    refuse("YaRN mscale != mscale_all_dim");
  }
  if (c.rope_scaling.type == RopeScalingType::kYarn && !is_deepseek(c.arch) &&
      (c.rope_scaling.mscale != 1.0f || c.rope_scaling.mscale_all_dim != 0.0f)) {
    refuse("YaRN mscale outside DeepSeek");
  }
  if (c.attention_bias && is_deepseek(c.arch)) refuse("attention bias");
  if (c.arch == ModelArch::kMixtral && c.attention_bias) refuse("attention bias");
}

// Fields that each format fixes per architecture: a config that contradicts them cannot be
// written faithfully, so refuse rather than write a file that reads back differently.
void check_expressible(const ModelConfig& c, std::string_view target, bool gguf) {
  const Refuse refuse(c, target);
  check_layer_features(c, refuse);
  check_routing(c, refuse);
  check_gpt_oss_mixtral(c, refuse, gguf);
  if (gguf) check_gguf_fixed(c, refuse);
}

OJson token_id(int64_t id) {
  return id < 0 ? OJson(nullptr) : OJson(id);
}

OJson rope_scaling_json(const ModelConfig& c) {
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == RopeScalingType::kNone) return nullptr;
  OJson j = OJson::object();
  if (rs.type == RopeScalingType::kLinear) {
    j["factor"] = pretty(rs.factor);
    j["type"] = "linear";
    return j;
  }
  j["beta_fast"] = pretty(rs.beta_fast);
  j["beta_slow"] = pretty(rs.beta_slow);
  j["factor"] = pretty(rs.factor);
  if (rs.mscale != 1.0f || is_deepseek(c.arch)) j["mscale"] = pretty(rs.mscale);
  if (rs.mscale_all_dim != 0.0f || is_deepseek(c.arch))
    j["mscale_all_dim"] = pretty(rs.mscale_all_dim);
  j["original_max_position_embeddings"] = rs.original_max_position_embeddings;
  j["type"] = "yarn";
  return j;
}

void set_u32(GgufWriter& w, const std::string& key, int64_t v) {
  TD_CHECK(v >= 0 && v <= UINT32_MAX, "{} = {} does not fit uint32", key, v);
  w.set(key, GgufValue::u32(static_cast<uint32_t>(v)));
}

// Qwen3NextConfig's keys (Qwen3-Next-80B-A3B's config.json), or Qwen3.5-MoE's: the text model's
// keys under text_config of a Qwen3_5MoeConfig (vision_config is the caller's to add: tandem
// reads the text model only). `base` holds the keys every architecture writes.
std::string qwen_hybrid_hf_json(const ModelConfig& c, OJson base) {
  const bool q35 = c.arch == ModelArch::kQwen35Moe;
  OJson j = std::move(base);
  j["head_dim"] = c.head_dim;
  j["partial_rotary_factor"] = pretty(static_cast<float>(c.rope_dim) / c.head_dim);
  j["linear_conv_kernel_dim"] = c.linear_conv_kernel;
  j["linear_key_head_dim"] = c.linear_key_head_dim;
  j["linear_value_head_dim"] = c.linear_value_head_dim;
  j["linear_num_key_heads"] = c.linear_num_key_heads;
  j["linear_num_value_heads"] = c.linear_num_value_heads;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
  j["num_experts"] = c.n_experts;
  j["num_experts_per_tok"] = c.n_experts_per_tok;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["decoder_sparse_step"] = c.moe_layer_freq;
  j["mlp_only_layers"] = c.mlp_only_layers;
  j["attention_bias"] = c.attention_bias;
  j["output_router_logits"] = false;
  j["router_aux_loss_coef"] = 0.001;
  OJson types = OJson::array();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    types.push_back(c.is_linear_layer(l) ? "linear_attention" : "full_attention");
  }
  j["layer_types"] = types;
  if (!q35) {
    j["full_attention_interval"] = c.full_attention_interval;
    j["rope_scaling"] = nullptr;
    j["transformers_version"] = "4.57.0";
    return j.dump(2) + "\n";
  }
  // Qwen3_5MoeTextConfig: no intermediate_size (no dense layer), rope_theta and the sections in
  // rope_parameters, the gate flag, the MTP layers.
  j.erase("intermediate_size");
  j.erase("rope_theta");
  j.erase("partial_rotary_factor");
  j.erase("architectures");
  j["model_type"] = "qwen3_5_moe_text";
  j["attn_output_gate"] = true;
  j["mtp_num_hidden_layers"] = c.nextn_layers;
  OJson sections = OJson::array();
  for (int64_t s : c.rope_sections) {
    if (s > 0 || sections.size() < 3) sections.push_back(s);
  }
  while (sections.size() > 3 && sections.back() == 0) sections.erase(sections.size() - 1);
  OJson rope;
  rope["mrope_interleaved"] = true;
  rope["mrope_section"] = sections;
  rope["partial_rotary_factor"] = pretty(static_cast<float>(c.rope_dim) / c.head_dim);
  rope["rope_theta"] = pretty(c.rope_theta);
  rope["rope_type"] = "default";
  j["rope_parameters"] = rope;
  OJson root;
  root["architectures"] = OJson::array({std::string(hf_architecture_name(c.arch))});
  root["model_type"] = detail::hf_model_type(c.arch);
  root["text_config"] = j;
  root["tie_word_embeddings"] = c.tie_word_embeddings;
  root["transformers_version"] = "5.2.0";
  return root.dump(2) + "\n";
}

// The keys every architecture's config.json has, in the order transformers writes them.
OJson hf_common_json(const ModelConfig& c) {
  OJson j;
  j["architectures"] = OJson::array({std::string(hf_architecture_name(c.arch))});
  j["model_type"] = detail::hf_model_type(c.arch);
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = pretty(c.rms_norm_eps);
  j["rope_theta"] = pretty(c.rope_theta);
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["torch_dtype"] = "bfloat16";
  j["bos_token_id"] = token_id(c.bos_token_id);
  j["eos_token_id"] = token_id(c.eos_token_id);
  j["num_key_value_heads"] = c.num_kv_heads;
  j["intermediate_size"] = c.intermediate_size;
  return j;
}

// DeepseekV2/V3/V32Config's and GlmMoeDsaConfig's keys: experts, MLA, the router, and the
// indexer with its MTP layers.
void add_deepseek_hf_keys(const ModelConfig& c, OJson& j) {
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["n_routed_experts"] = c.n_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["num_experts_per_tok"] = c.n_experts_per_tok;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["moe_layer_freq"] = c.moe_layer_freq;
  j["q_lora_rank"] = c.q_lora_rank > 0 ? OJson(c.q_lora_rank) : OJson(nullptr);
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
  j["topk_method"] = topk_method_name(c.topk_method);
  j["scoring_func"] = scoring_func_name(c.scoring);
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["routed_scaling_factor"] = pretty(c.routed_scaling_factor);
  j["aux_loss_alpha"] = 0.001;
  j["seq_aux"] = true;
  j["ep_size"] = 1;
  j["pretraining_tp"] = 1;
  j["attention_bias"] = c.attention_bias;
  j["rope_scaling"] = rope_scaling_json(c);
  if (c.arch == ModelArch::kDeepseek3) j["num_nextn_predict_layers"] = 0;
  if (c.has_indexer()) {
    j["num_nextn_predict_layers"] = c.nextn_layers;
    j["index_n_heads"] = c.index_n_heads;
    j["index_head_dim"] = c.index_head_dim;
    j["index_topk"] = c.index_topk;
  }
  if (c.arch == ModelArch::kGlmDsa) {
    OJson types = OJson::array();
    for (int64_t l = 0; l < c.num_layers; ++l) {
      types.push_back(c.is_index_layer(l) ? "full" : "shared");
    }
    j["indexer_types"] = types;
  }
}

// Glm4MoeConfig's keys, in the order of GLM-4.5-Air's config.json.
void add_glm4moe_hf_keys(const ModelConfig& c, OJson& j) {
  j["head_dim"] = c.head_dim;
  j["partial_rotary_factor"] = pretty(static_cast<float>(c.rope_dim) / c.head_dim);
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["n_routed_experts"] = c.n_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["num_experts_per_tok"] = c.n_experts_per_tok;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["routed_scaling_factor"] = pretty(c.routed_scaling_factor);
  j["attention_bias"] = c.attention_bias;
  j["use_qk_norm"] = c.qk_norm;
  j["num_nextn_predict_layers"] = c.nextn_layers;
  j["rope_scaling"] = rope_scaling_json(c);
}

// MiniMaxM2Config's keys.
void add_minimax_m2_hf_keys(const ModelConfig& c, OJson& j) {
  j["head_dim"] = c.head_dim;
  j["rotary_dim"] = c.rope_dim;
  j["partial_rotary_factor"] = pretty(static_cast<float>(c.rope_dim) / c.head_dim);
  j["num_local_experts"] = c.n_experts;
  j["num_experts_per_tok"] = c.n_experts_per_tok;
  j["scoring_func"] = "sigmoid";
  j["use_routing_bias"] = true;
  j["use_qk_norm"] = c.qk_norm;
  j["qk_norm_type"] = "per_layer";
  j["shared_intermediate_size"] = 0;
  j["output_router_logits"] = false;
  j["router_aux_loss_coef"] = 0.001;
  j["router_jitter_noise"] = 0.0;
  j["rope_scaling"] = rope_scaling_json(c);
}

// GptOssConfig's keys, in the order of gpt-oss-20b's config.json.
void add_gpt_oss_hf_keys(const ModelConfig& c, OJson& j) {
  j["attention_bias"] = c.attention_bias;
  j["experts_per_token"] = c.n_experts_per_tok;
  j["head_dim"] = c.head_dim;
  j["initial_context_length"] = c.rope_scaling.type == RopeScalingType::kYarn
                                    ? c.rope_scaling.original_max_position_embeddings
                                    : c.max_position_embeddings;
  OJson types = OJson::array();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    types.push_back(c.is_swa_layer(l) ? "sliding_attention" : "full_attention");
  }
  j["layer_types"] = types;
  j["num_experts_per_tok"] = c.n_experts_per_tok;
  j["num_local_experts"] = c.n_experts;
  j["output_router_logits"] = false;
  j["rope_scaling"] = rope_scaling_json(c);
  j["router_aux_loss_coef"] = 0.9;
  j["sliding_window"] = c.sliding_window;
  j["swiglu_limit"] = pretty(c.swiglu_limit);
}

// MixtralConfig's keys.
void add_mixtral_hf_keys(const ModelConfig& c, OJson& j) {
  if (c.head_dim * c.num_heads != c.hidden_size) j["head_dim"] = c.head_dim;
  j["num_local_experts"] = c.n_experts;
  j["num_experts_per_tok"] = c.n_experts_per_tok;
  j["sliding_window"] = c.sliding_window > 0 ? OJson(c.sliding_window) : OJson(nullptr);
  j["output_router_logits"] = false;
  j["router_aux_loss_coef"] = 0.02;
  j["router_jitter_noise"] = 0.0;
  if (c.rope_scaling.type != RopeScalingType::kNone) j["rope_scaling"] = rope_scaling_json(c);
}

// Qwen2MoeConfig's / Qwen3MoeConfig's keys.
void add_qwen_moe_hf_keys(const ModelConfig& c, OJson& j) {
  const bool qwen3 = c.arch == ModelArch::kQwen3Moe;
  if (qwen3) j["head_dim"] = c.head_dim;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  if (!qwen3) j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
  j["num_experts"] = c.n_experts;
  j["num_experts_per_tok"] = c.n_experts_per_tok;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["decoder_sparse_step"] = c.moe_layer_freq;
  j["mlp_only_layers"] = c.mlp_only_layers;
  if (qwen3) j["attention_bias"] = c.attention_bias;
  j["use_sliding_window"] = c.sliding_window > 0;
  j["sliding_window"] = c.sliding_window > 0 ? OJson(c.sliding_window) : OJson(nullptr);
  j["max_window_layers"] = c.num_layers;
  j["output_router_logits"] = false;
  j["router_aux_loss_coef"] = 0.001;
  j["rope_scaling"] = rope_scaling_json(c);
}

// Sets `<arch>.<key>` values in a GGUF writer.
class ArchKeys {
 public:
  ArchKeys(GgufWriter& w, std::string_view arch) : w_(w), arch_(arch) {}
  std::string key(const char* k) const { return arch_ + "." + k; }
  void u32(const char* k, int64_t v) const { set_u32(w_, key(k), v); }
  void set(const char* k, GgufValue v) const { w_.set(key(k), std::move(v)); }

 private:
  GgufWriter& w_;
  std::string arch_;
};

// The keys every architecture has, in convert_hf_to_gguf.py's order.
void write_gguf_common(const ModelConfig& c, const ArchKeys& k) {
  k.u32("context_length", c.max_position_embeddings);
  k.u32("embedding_length", c.hidden_size);
  k.u32("block_count", c.num_layers + c.nextn_layers);
  // (Qwen3.5's MoE configs have no intermediate_size, and convert_hf_to_gguf.py no such key.)
  if (c.arch != ModelArch::kQwen35Moe) k.u32("feed_forward_length", c.intermediate_size);
  k.u32("attention.head_count", c.num_heads);
  k.set("rope.freq_base", GgufValue::f32(c.rope_theta));
  k.set("attention.layer_norm_rms_epsilon", GgufValue::f32(c.rms_norm_eps));
  k.u32("expert_count", c.n_experts);
  k.u32("expert_used_count", c.n_experts_per_tok);
  k.u32("vocab_size", c.vocab_size);
}

// The K/V head count and the head sizes of a non-MLA architecture.
void write_gguf_heads(const ModelConfig& c, const ArchKeys& k) {
  k.u32("attention.head_count_kv", c.num_kv_heads);
  k.u32("attention.key_length", c.head_dim);
  k.u32("attention.value_length", c.v_head_dim);
}

// deepseek2 / deepseek32 / glm-dsa: MLA is written as MQA over the compressed KV (llama.cpp's
// absorbed form), see tests/data/golden/README.md "Layout notes"; the router, the indexer.
void write_gguf_deepseek(const ModelConfig& c, const ArchKeys& k) {
  k.u32("expert_group_count", c.n_group);
  k.u32("expert_group_used_count", c.topk_group);
  k.u32("leading_dense_block_count", c.first_k_dense_replace);
  k.u32("attention.q_lora_rank", c.q_lora_rank);
  k.u32("attention.kv_lora_rank", c.kv_lora_rank);
  k.u32("attention.head_count_kv", 1);
  k.u32("attention.key_length", c.kv_lora_rank + c.qk_rope_head_dim);
  k.u32("attention.value_length", c.kv_lora_rank);
  k.u32("attention.key_length_mla", c.qk_nope_head_dim + c.qk_rope_head_dim);
  k.u32("attention.value_length_mla", c.v_head_dim);
  k.u32("expert_feed_forward_length", c.moe_intermediate_size);
  k.u32("expert_shared_count", c.n_shared_experts);
  k.set("expert_weights_scale", GgufValue::f32(c.routed_scaling_factor));
  if (c.norm_topk_prob) k.set("expert_weights_norm", GgufValue::boolean(true));
  k.u32("expert_gating_func", c.scoring == ScoringFunc::kSigmoid ? 2 : 1);
  k.u32("rope.dimension_count", c.qk_rope_head_dim);
  if (c.has_indexer()) {
    // As convert_hf_to_gguf.py's DeepseekV32Model / GlmMoeDsaModel.
    k.u32("nextn_predict_layers", c.nextn_layers);
    k.u32("attention.indexer.head_count", c.index_n_heads);
    k.u32("attention.indexer.key_length", c.index_head_dim);
    k.u32("attention.indexer.top_k", c.index_topk);
  }
  if (c.arch == ModelArch::kGlmDsa) {
    std::vector<GgufValue> types;
    for (int64_t l = 0; l < c.num_layers; ++l) {
      types.push_back(GgufValue::boolean(c.is_index_layer(l)));
    }
    k.set("attention.indexer.types", GgufValue::array(GgufType::kBool, types));
  }
}

// As convert_hf_to_gguf.py's Qwen3MoeModel / Glm4MoeModel / MiniMaxM2Model write them.
void write_gguf_qwen3_glm_minimax(const ModelConfig& c, const ArchKeys& k) {
  write_gguf_heads(c, k);
  k.u32("rope.dimension_count", c.rope_dim);
  k.u32("expert_feed_forward_length", c.moe_intermediate_size);
  if (c.arch == ModelArch::kQwen3Moe) return;
  k.u32("expert_gating_func", 2);
  if (c.arch != ModelArch::kGlm4Moe) return;
  k.u32("expert_group_count", c.n_group);
  k.u32("expert_group_used_count", c.topk_group);
  k.u32("expert_shared_count", c.n_shared_experts);
  k.u32("leading_dense_block_count", c.first_k_dense_replace);
  k.set("expert_weights_scale", GgufValue::f32(c.routed_scaling_factor));
  k.set("expert_weights_norm", GgufValue::boolean(c.norm_topk_prob));
  k.u32("nextn_predict_layers", c.nextn_layers);
}

// As convert_hf_to_gguf.py's Qwen3NextModel / Qwen3_5MoeTextModel: the base keys with the head
// sizes, the experts' widths, the delta rule's sizes under Mamba's ssm.* names.
void write_gguf_qwen_hybrid(const ModelConfig& c, const ArchKeys& k) {
  write_gguf_heads(c, k);
  k.u32("expert_feed_forward_length", c.moe_intermediate_size);
  k.u32("expert_shared_feed_forward_length", c.shared_expert_intermediate_size);
  k.u32("ssm.conv_kernel", c.linear_conv_kernel);
  k.u32("ssm.state_size", c.linear_key_head_dim);
  k.u32("ssm.group_count", c.linear_num_key_heads);
  k.u32("ssm.time_step_rank", c.linear_num_value_heads);
  k.u32("ssm.inner_size", c.linear_value_head_dim * c.linear_num_value_heads);
  k.u32("full_attention_interval", c.full_attention_interval);
  k.u32("rope.dimension_count", c.rope_dim);
  if (c.arch == ModelArch::kQwen35Moe) {
    std::vector<GgufValue> sections;
    for (int64_t s : c.rope_sections) sections.push_back(GgufValue::i32(static_cast<int32_t>(s)));
    k.set("rope.dimension_sections", GgufValue::array(GgufType::kInt32, sections));
  }
  if (c.nextn_layers > 0) k.u32("nextn_predict_layers", c.nextn_layers);
}

// The keys of c.arch.
void write_gguf_arch_keys(const ModelConfig& c, const ArchKeys& k) {
  switch (c.arch) {
    case ModelArch::kDeepseek2:
    case ModelArch::kDeepseek3:
    case ModelArch::kDeepseek32:
    case ModelArch::kGlmDsa:
      write_gguf_deepseek(c, k);
      break;
    case ModelArch::kQwen2Moe:
      k.u32("attention.head_count_kv", c.num_kv_heads);
      k.u32("rope.dimension_count", c.rope_dim);
      k.u32("expert_feed_forward_length", c.moe_intermediate_size);
      if (c.shared_expert_intermediate_size > 0) {
        k.u32("expert_shared_feed_forward_length", c.shared_expert_intermediate_size);
      }
      break;
    case ModelArch::kQwen3Moe:
    case ModelArch::kGlm4Moe:
    case ModelArch::kMiniMaxM2:
      write_gguf_qwen3_glm_minimax(c, k);
      break;
    case ModelArch::kGptOss:
      // As convert_hf_to_gguf.py's GptOssModel: the base keys, the window, the experts' width.
      write_gguf_heads(c, k);
      k.u32("expert_feed_forward_length", c.moe_intermediate_size);
      if (c.swa_period != 2) k.u32("attention.sliding_window_pattern", c.swa_period);
      break;
    case ModelArch::kQwen3Next:
    case ModelArch::kQwen35Moe:
      write_gguf_qwen_hybrid(c, k);
      break;
    case ModelArch::kMixtral:
      k.u32("attention.head_count_kv", c.num_kv_heads);
      if (c.head_dim * c.num_heads != c.hidden_size) {
        k.u32("attention.key_length", c.head_dim);
        k.u32("attention.value_length", c.v_head_dim);
      }
      k.u32("rope.dimension_count", c.rope_dim);
      break;
  }
}

// rope.scaling.* (YaRN's mscale_all_dim as deepseek2's yarn_log_multiplier), then the window.
void write_gguf_rope_scaling_and_window(const ModelConfig& c, const ArchKeys& k) {
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type != RopeScalingType::kNone) {
    k.set("rope.scaling.type", GgufValue::string(std::string(rope_scaling_name(rs.type))));
    k.set("rope.scaling.factor", GgufValue::f32(rs.factor));
  }
  if (rs.type == RopeScalingType::kYarn) {
    k.u32("rope.scaling.original_context_length", rs.original_max_position_embeddings);
    k.set("rope.scaling.yarn_beta_fast", GgufValue::f32(rs.beta_fast));
    k.set("rope.scaling.yarn_beta_slow", GgufValue::f32(rs.beta_slow));
    if (is_deepseek(c.arch) && rs.mscale_all_dim != 0.0f) {
      k.set("rope.scaling.yarn_log_multiplier", GgufValue::f32(0.1f * rs.mscale_all_dim));
    }
  }
  if (c.sliding_window > 0) k.u32("attention.sliding_window", c.sliding_window);
}

}  // namespace

std::string config_to_hf_json(const ModelConfig& c) {
  validate_config(c, "config_to_hf_json");
  check_expressible(c, "an HF config.json", false);
  OJson j = hf_common_json(c);
  if (is_deepseek(c.arch)) {
    add_deepseek_hf_keys(c, j);
  } else if (c.arch == ModelArch::kGlm4Moe) {
    add_glm4moe_hf_keys(c, j);
  } else if (c.arch == ModelArch::kMiniMaxM2) {
    add_minimax_m2_hf_keys(c, j);
  } else if (c.arch == ModelArch::kGptOss) {
    add_gpt_oss_hf_keys(c, j);
  } else if (detail::is_qwen_hybrid(c.arch)) {
    return qwen_hybrid_hf_json(c, std::move(j));
  } else if (c.arch == ModelArch::kMixtral) {
    add_mixtral_hf_keys(c, j);
  } else {
    add_qwen_moe_hf_keys(c, j);
  }
  j["transformers_version"] = "4.46.0";
  return j.dump(2) + "\n";
}

void write_gguf_config(const ModelConfig& c, GgufWriter& w) {
  validate_config(c, "write_gguf_config");
  check_expressible(c, "GGUF (llama.cpp)", true);
  const std::string a(gguf_arch_name(c.arch));
  w.set("general.architecture", GgufValue::string(a));
  const ArchKeys k(w, a);
  write_gguf_common(c, k);
  write_gguf_arch_keys(c, k);
  write_gguf_rope_scaling_and_window(c, k);
}

}  // namespace tandem
