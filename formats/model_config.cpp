// ModelConfig: names, validation, comparison and parameter counts. The readers are in
// model_config_hf.cpp / model_config_gguf.cpp, presets and writers in model_config_presets.cpp /
// model_config_write.cpp.
#include "formats/model_config.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "formats/model_config_detail.h"

namespace tandem {

namespace {

struct ArchNames {
  ModelArch arch;
  std::string_view name, gguf, hf, model_type;
};
constexpr ArchNames kArchNames[] = {
    {ModelArch::kDeepseek2, "deepseek2", "deepseek2", "DeepseekV2ForCausalLM", "deepseek_v2"},
    {ModelArch::kDeepseek3, "deepseek3", "deepseek2", "DeepseekV3ForCausalLM", "deepseek_v3"},
    {ModelArch::kQwen2Moe, "qwen2moe", "qwen2moe", "Qwen2MoeForCausalLM", "qwen2_moe"},
    {ModelArch::kQwen3Moe, "qwen3moe", "qwen3moe", "Qwen3MoeForCausalLM", "qwen3_moe"},
    {ModelArch::kMixtral, "mixtral", "llama", "MixtralForCausalLM", "mixtral"},
    {ModelArch::kGlm4Moe, "glm4moe", "glm4moe", "Glm4MoeForCausalLM", "glm4_moe"},
    {ModelArch::kMiniMaxM2, "minimax-m2", "minimax-m2", "MiniMaxM2ForCausalLM", "minimax_m2"},
    {ModelArch::kGptOss, "gpt-oss", "gpt-oss", "GptOssForCausalLM", "gpt_oss"},
    {ModelArch::kQwen3Next, "qwen3next", "qwen3next", "Qwen3NextForCausalLM", "qwen3_next"},
    {ModelArch::kQwen35Moe, "qwen35moe", "qwen35moe", "Qwen3_5MoeForConditionalGeneration",
     "qwen3_5_moe"},
    {ModelArch::kDeepseek32, "deepseek32", "deepseek32", "DeepseekV32ForCausalLM", "deepseek_v32"},
    {ModelArch::kGlmDsa, "glm-dsa", "glm-dsa", "GlmMoeDsaForCausalLM", "glm_moe_dsa"},
};

const ArchNames& names_of(ModelArch arch) {
  for (const ArchNames& n : kArchNames) {
    if (n.arch == arch) return n;
  }
  TD_CHECK(false, "arch id {}", static_cast<int>(arch));
  return kArchNames[0];
}

// Range checks in one place: a value that fails names the field's key in the source file.
class Validator {
 public:
  Validator(std::string_view source, detail::KeyNamer namer)
      : source_(source), namer_(std::move(namer)) {}

  void range(std::string_view field, int64_t v, int64_t lo, int64_t hi) const {
    if (v < lo || v > hi) {
      fail(ErrorKind::kFormat, "{}: key '{}': value {} is out of range [{}, {}]", source_,
           namer_(field), v, lo, hi);
    }
  }
  void positive_float(std::string_view field, double v, double hi) const {
    if (!(std::isfinite(v) && v > 0.0 && v <= hi)) {
      fail(ErrorKind::kFormat, "{}: key '{}': value {} must be finite, > 0 and <= {}", source_,
           namer_(field), v, hi);
    }
  }
  [[noreturn]] void inconsistent(std::string_view field, const std::string& why) const {
    fail(ErrorKind::kFormat, "{}: key '{}': {}", source_, namer_(field), why);
  }
  std::string key(std::string_view field) const { return namer_(field); }
  std::string_view source() const { return source_; }

 private:
  std::string_view source_;
  detail::KeyNamer namer_;
};

constexpr int64_t kMaxVocab = int64_t{1} << 23;
constexpr int64_t kMaxHidden = int64_t{1} << 16;
constexpr int64_t kMaxLayers = 1000;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxHeadDim = 4096;
constexpr int64_t kMaxFfn = int64_t{1} << 20;
constexpr int64_t kMaxExperts = int64_t{1} << 14;
constexpr int64_t kMaxPositions = int64_t{1} << 28;
constexpr double kMaxParams = 1e14;  // 100T parameters: anything above is a broken file

// DeepSeek Sparse Attention's indexer: MLA with a q LoRA, its sizes, the shared layers.
void validate_indexer(const ModelConfig& c, const Validator& v) {
  if (!c.is_mla() || c.q_lora_rank == 0) {
    v.inconsistent("index_topk", "the lightning indexer needs MLA with a q LoRA");
  }
  v.range("index_n_heads", c.index_n_heads, 1, kMaxHeads);
  // (The Hadamard rotation spans the head: a power of two, at least 64 as llama.cpp's.)
  v.range("index_head_dim", c.index_head_dim, std::max<int64_t>(64, c.rope_dim), kMaxHeadDim);
  if ((c.index_head_dim & (c.index_head_dim - 1)) != 0) {
    v.inconsistent("index_head_dim",
                   fmt::format("{} is not a power of two (64, 128, ...)", c.index_head_dim));
  }
  v.range("index_topk", c.index_topk, 1, kMaxPositions);
  int64_t prev = 0;
  for (int64_t layer : c.index_shared_layers) {
    v.range("index_shared_layers", layer, 1, c.num_layers - 1);
    if (layer <= prev && prev != 0) {
      v.inconsistent("index_shared_layers", "layers must be ascending");
    }
    prev = layer;
  }
}

// The model's outer sizes: vocabulary, hidden size, layers, heads, positions, norm and RoPE base.
void validate_sizes(const ModelConfig& c, const Validator& v) {
  v.range("vocab_size", c.vocab_size, 1, kMaxVocab);
  v.range("hidden_size", c.hidden_size, 1, kMaxHidden);
  v.range("num_layers", c.num_layers, 1, kMaxLayers);
  v.range("num_heads", c.num_heads, 1, kMaxHeads);
  v.range("num_kv_heads", c.num_kv_heads, 1, c.num_heads);
  if (c.num_heads % c.num_kv_heads != 0) {
    v.inconsistent("num_kv_heads", fmt::format("{} key/value heads do not divide {} heads",
                                               c.num_kv_heads, c.num_heads));
  }
  v.range("max_position_embeddings", c.max_position_embeddings, 1, kMaxPositions);
  v.positive_float("rms_norm_eps", c.rms_norm_eps, 1.0);
  v.positive_float("rope_theta", c.rope_theta, 1e12);
}

// The attention's head sizes (MLA's ranks and split heads, or plain head sizes), the rotated
// share, and the indexer.
void validate_attention(const ModelConfig& c, const Validator& v) {
  if (c.is_mla()) {
    v.range("kv_lora_rank", c.kv_lora_rank, 1, kMaxHidden);
    v.range("q_lora_rank", c.q_lora_rank, 0, kMaxHidden);
    v.range("qk_nope_head_dim", c.qk_nope_head_dim, 1, kMaxHeadDim);
    v.range("qk_rope_head_dim", c.qk_rope_head_dim, 2, kMaxHeadDim);
    v.range("v_head_dim", c.v_head_dim, 1, kMaxHeadDim);
    if (c.head_dim != c.qk_nope_head_dim + c.qk_rope_head_dim || c.rope_dim != c.qk_rope_head_dim) {
      v.inconsistent("qk_nope_head_dim", "head sizes are inconsistent");
    }
  } else {
    if (detail::is_deepseek(c.arch)) v.range("kv_lora_rank", c.kv_lora_rank, 1, kMaxHidden);
    v.range("head_dim", c.head_dim, 1, kMaxHeadDim);
    v.range("v_head_dim", c.v_head_dim, 1, kMaxHeadDim);
  }
  v.range("rope_dim", c.rope_dim, 2, c.head_dim);
  if (c.rope_dim % 2 != 0) v.inconsistent("rope_dim", fmt::format("{} is odd", c.rope_dim));
  if (c.has_indexer() || c.index_n_heads != 0 || c.index_head_dim != 0) validate_indexer(c, v);
}

// The FFN and experts' widths, expert counts, which layers are MoE, the router's groups and
// scaling.
void validate_moe(const ModelConfig& c, const Validator& v) {
  v.range("intermediate_size", c.intermediate_size, 1, kMaxFfn);
  v.range("moe_intermediate_size", c.moe_intermediate_size, 1, kMaxFfn);
  v.range("shared_expert_intermediate_size", c.shared_expert_intermediate_size, 0, kMaxFfn);
  v.range("n_shared_experts", c.n_shared_experts, 0, 256);
  v.range("n_experts", c.n_experts, 1, kMaxExperts);
  if (c.n_experts_per_tok > c.n_experts) {
    v.inconsistent("n_experts_per_tok",
                   fmt::format("{} experts per token but only {} experts ({})", c.n_experts_per_tok,
                               c.n_experts, v.key("n_experts")));
  }
  v.range("n_experts_per_tok", c.n_experts_per_tok, 1, c.n_experts);
  v.range("first_k_dense_replace", c.first_k_dense_replace, 0, c.num_layers);
  v.range("moe_layer_freq", c.moe_layer_freq, 1, c.num_layers);
  for (int64_t layer : c.mlp_only_layers) v.range("mlp_only_layers", layer, 0, c.num_layers - 1);

  v.range("n_group", c.n_group, 1, c.n_experts);
  if (c.n_experts % c.n_group != 0) {
    v.inconsistent("n_group",
                   fmt::format("{} groups do not divide {} experts", c.n_group, c.n_experts));
  }
  v.range("topk_group", c.topk_group, 1, c.n_group);
  if (c.n_experts_per_tok > c.topk_group * (c.n_experts / c.n_group)) {
    v.inconsistent("topk_group",
                   fmt::format("{} groups of {} experts cannot hold {} experts per "
                               "token",
                               c.topk_group, c.n_experts / c.n_group, c.n_experts_per_tok));
  }
  v.positive_float("routed_scaling_factor", c.routed_scaling_factor, 1e4);
}

// Token ids, the sliding window, the SwiGLU clamp, MTP layers, q/k norm span, the output gate.
void validate_extras(const ModelConfig& c, const Validator& v) {
  if (c.bos_token_id != -1) v.range("bos_token_id", c.bos_token_id, 0, c.vocab_size - 1);
  if (c.eos_token_id != -1) v.range("eos_token_id", c.eos_token_id, 0, c.vocab_size - 1);
  v.range("sliding_window", c.sliding_window, 0, kMaxPositions);
  v.range("swa_period", c.swa_period, 0, 64);
  if (!(std::isfinite(c.swiglu_limit) && c.swiglu_limit >= 0.0f && c.swiglu_limit <= 1e6f)) {
    v.inconsistent("swiglu_limit", fmt::format("{} is not in [0, 1e6]", c.swiglu_limit));
  }
  v.range("nextn_layers", c.nextn_layers, 0, 64);
  if (c.qk_norm_all_heads && !c.qk_norm) {
    v.inconsistent("qk_norm", "norms over all heads without q/k norms");
  }
  if (c.attn_output_gate && c.is_mla()) v.inconsistent("attn_output_gate", "a gate with MLA");
}

// The Gated DeltaNet's layer pattern and sizes (the delta rule needs key and value heads of one
// size).
void validate_linear_attention(const ModelConfig& c, const Validator& v) {
  v.range("full_attention_interval", c.full_attention_interval, 0, kMaxLayers);
  if (c.full_attention_interval <= 1) return;
  v.range("linear_conv_kernel", c.linear_conv_kernel, 2, 64);
  v.range("linear_num_key_heads", c.linear_num_key_heads, 1, kMaxHeads);
  v.range("linear_num_value_heads", c.linear_num_value_heads, 1, kMaxHeads);
  v.range("linear_key_head_dim", c.linear_key_head_dim, 1, 1024);
  v.range("linear_value_head_dim", c.linear_value_head_dim, 1, 1024);
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0) {
    v.inconsistent("linear_num_value_heads",
                   fmt::format("{} value heads are not a multiple of {} key heads",
                               c.linear_num_value_heads, c.linear_num_key_heads));
  }
  if (c.linear_key_head_dim != c.linear_value_head_dim) {
    fail(ErrorKind::kUnsupported,
         "{}: key '{}': key heads of {} and value heads of {} values: the delta rule needs "
         "them equal (as llama.cpp)",
         v.source(), v.key("linear_value_head_dim"), c.linear_key_head_dim,
         c.linear_value_head_dim);
  }
}

// The multi-section RoPE's sections and the scaling's parameters.
void validate_rope(const ModelConfig& c, const Validator& v) {
  int64_t sections = 0;
  for (int64_t s : c.rope_sections) {
    v.range("rope_sections", s, 0, c.head_dim);
    sections += s;
  }
  if (sections > c.head_dim) {
    v.inconsistent("rope_sections",
                   fmt::format("sections of {} pairs in all, more than the head's {} values",
                               sections, c.head_dim));
  }
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type != RopeScalingType::kNone) v.positive_float("rope_scaling.factor", rs.factor, 1e6);
  if (rs.type == RopeScalingType::kYarn) {
    v.range("rope_scaling.original_max_position_embeddings", rs.original_max_position_embeddings, 1,
            kMaxPositions);
    v.positive_float("rope_scaling.beta_fast", rs.beta_fast, 1e4);
    v.positive_float("rope_scaling.beta_slow", rs.beta_slow, 1e4);
    if (!(std::isfinite(rs.mscale) && std::isfinite(rs.mscale_all_dim))) {
      v.inconsistent("rope_scaling.mscale", "must be finite");
    }
  }
}

// The parameter count the sizes describe, bounded by kMaxParams.
void validate_param_count(const ModelConfig& c, std::string_view source) {
  double params = 0;
  {
    // Same formula as count_params(), in double so that absurd shapes cannot overflow.
    const double h = static_cast<double>(c.hidden_size);
    const double ffn_layers = static_cast<double>(c.num_moe_layers());
    params =
        static_cast<double>(c.vocab_size) * h * 2 +
        ffn_layers * c.n_experts * 3.0 * h * c.moe_intermediate_size +
        c.num_layers * 3.0 * h * std::max(c.intermediate_size, c.shared_expert_intermediate_size) +
        c.num_layers * 4.0 * h * c.num_heads * std::max(c.head_dim, c.v_head_dim);
  }
  if (params > kMaxParams) {
    fail(ErrorKind::kFormat,
         "{}: the sizes describe a model of {:.3g} parameters, more than the "
         "{:.0g} tandem accepts",
         source, params, kMaxParams);
  }
}

void validate_impl(const ModelConfig& c, std::string_view source, const detail::KeyNamer& namer) {
  Validator v(source, namer);
  validate_sizes(c, v);
  validate_attention(c, v);
  validate_moe(c, v);
  validate_extras(c, v);
  validate_linear_attention(c, v);
  validate_rope(c, v);
  validate_param_count(c, source);
}

// Collects "name: a vs b" lines for the fields two configs disagree on.
class ConfigDiff {
 public:
  void i(const char* name, int64_t x, int64_t y) {
    if (x != y) out.push_back(fmt::format("{}: {} vs {}", name, x, y));
  }
  // Floats within a relative 1e-6 of each other count as the same.
  void f(const char* name, float x, float y) {
    const bool same = x == y || std::fabs(x - y) <= 1e-6f * std::max(std::fabs(x), std::fabs(y));
    if (!same) out.push_back(fmt::format("{}: {} vs {}", name, x, y));
  }
  void s(const char* name, std::string_view x, std::string_view y) {
    if (x != y) out.push_back(fmt::format("{}: {} vs {}", name, x, y));
  }
  std::vector<std::string> out;
};

// The architecture, the model's sizes and the experts' layout.
void diff_sizes(const ModelConfig& a, const ModelConfig& b, ConfigDiff& d) {
  d.s("arch", arch_name(a.arch), arch_name(b.arch));
  d.i("vocab_size", a.vocab_size, b.vocab_size);
  d.i("hidden_size", a.hidden_size, b.hidden_size);
  d.i("num_layers", a.num_layers, b.num_layers);
  d.i("num_heads", a.num_heads, b.num_heads);
  d.i("num_kv_heads", a.num_kv_heads, b.num_kv_heads);
  d.i("head_dim", a.head_dim, b.head_dim);
  d.i("rope_dim", a.rope_dim, b.rope_dim);
  d.i("intermediate_size", a.intermediate_size, b.intermediate_size);
  d.i("moe_intermediate_size", a.moe_intermediate_size, b.moe_intermediate_size);
  d.i("shared_expert_intermediate_size", a.shared_expert_intermediate_size,
      b.shared_expert_intermediate_size);
  d.i("n_shared_experts", a.n_shared_experts, b.n_shared_experts);
  d.i("shared_expert_gate", a.shared_expert_gate, b.shared_expert_gate);
  d.i("n_experts", a.n_experts, b.n_experts);
  d.i("n_experts_per_tok", a.n_experts_per_tok, b.n_experts_per_tok);
  d.i("first_k_dense_replace", a.first_k_dense_replace, b.first_k_dense_replace);
  d.i("moe_layer_freq", a.moe_layer_freq, b.moe_layer_freq);
  if (a.mlp_only_layers != b.mlp_only_layers) d.out.push_back("mlp_only_layers");
}

// The norm epsilon, RoPE base and scaling, the context length.
void diff_rope(const ModelConfig& a, const ModelConfig& b, ConfigDiff& d) {
  d.f("rms_norm_eps", a.rms_norm_eps, b.rms_norm_eps);
  d.f("rope_theta", a.rope_theta, b.rope_theta);
  d.s("rope_scaling.type", rope_scaling_name(a.rope_scaling.type),
      rope_scaling_name(b.rope_scaling.type));
  if (a.rope_scaling.type != RopeScalingType::kNone) {
    d.f("rope_scaling.factor", a.rope_scaling.factor, b.rope_scaling.factor);
  }
  if (a.rope_scaling.type == RopeScalingType::kYarn) {
    d.i("rope_scaling.original_max_position_embeddings",
        a.rope_scaling.original_max_position_embeddings,
        b.rope_scaling.original_max_position_embeddings);
    d.f("rope_scaling.beta_fast", a.rope_scaling.beta_fast, b.rope_scaling.beta_fast);
    d.f("rope_scaling.beta_slow", a.rope_scaling.beta_slow, b.rope_scaling.beta_slow);
    d.f("rope_scaling.mscale", a.rope_scaling.mscale, b.rope_scaling.mscale);
    d.f("rope_scaling.mscale_all_dim", a.rope_scaling.mscale_all_dim,
        b.rope_scaling.mscale_all_dim);
  }
  d.i("max_position_embeddings", a.max_position_embeddings, b.max_position_embeddings);
}

// MLA's sizes and the router.
void diff_mla_routing(const ModelConfig& a, const ModelConfig& b, ConfigDiff& d) {
  d.i("q_lora_rank", a.q_lora_rank, b.q_lora_rank);
  d.i("kv_lora_rank", a.kv_lora_rank, b.kv_lora_rank);
  d.i("qk_nope_head_dim", a.qk_nope_head_dim, b.qk_nope_head_dim);
  d.i("qk_rope_head_dim", a.qk_rope_head_dim, b.qk_rope_head_dim);
  d.i("v_head_dim", a.v_head_dim, b.v_head_dim);
  d.s("scoring", scoring_func_name(a.scoring), scoring_func_name(b.scoring));
  d.s("topk_method", topk_method_name(a.topk_method), topk_method_name(b.topk_method));
  d.i("n_group", a.n_group, b.n_group);
  d.i("topk_group", a.topk_group, b.topk_group);
  d.i("norm_topk_prob", a.norm_topk_prob, b.norm_topk_prob);
  d.f("routed_scaling_factor", a.routed_scaling_factor, b.routed_scaling_factor);
  d.i("has_e_score_correction_bias", a.has_e_score_correction_bias, b.has_e_score_correction_bias);
}

// The per-architecture layer features: biases, norms, MTP, tokens, window, sinks, linear
// attention, the indexer, RoPE sections.
void diff_layer_features(const ModelConfig& a, const ModelConfig& b, ConfigDiff& d) {
  d.i("attention_bias", a.attention_bias, b.attention_bias);
  d.i("qk_norm", a.qk_norm, b.qk_norm);
  d.i("qk_norm_all_heads", a.qk_norm_all_heads, b.qk_norm_all_heads);
  d.i("nextn_layers", a.nextn_layers, b.nextn_layers);
  d.i("tie_word_embeddings", a.tie_word_embeddings, b.tie_word_embeddings);
  d.i("bos_token_id", a.bos_token_id, b.bos_token_id);
  d.i("eos_token_id", a.eos_token_id, b.eos_token_id);
  d.i("sliding_window", a.sliding_window, b.sliding_window);
  d.i("swa_period", a.swa_period, b.swa_period);
  d.i("attn_sinks", a.attn_sinks, b.attn_sinks);
  d.f("swiglu_limit", a.swiglu_limit, b.swiglu_limit);
  d.i("full_attention_interval", a.full_attention_interval, b.full_attention_interval);
  d.i("linear_conv_kernel", a.linear_conv_kernel, b.linear_conv_kernel);
  d.i("linear_num_key_heads", a.linear_num_key_heads, b.linear_num_key_heads);
  d.i("linear_num_value_heads", a.linear_num_value_heads, b.linear_num_value_heads);
  d.i("linear_key_head_dim", a.linear_key_head_dim, b.linear_key_head_dim);
  d.i("linear_value_head_dim", a.linear_value_head_dim, b.linear_value_head_dim);
  d.i("attn_output_gate", a.attn_output_gate, b.attn_output_gate);
  d.i("index_n_heads", a.index_n_heads, b.index_n_heads);
  d.i("index_head_dim", a.index_head_dim, b.index_head_dim);
  d.i("index_topk", a.index_topk, b.index_topk);
  if (a.index_shared_layers != b.index_shared_layers) d.out.push_back("index_shared_layers");
  d.i("index_rope_interleaved", a.index_rope_interleaved, b.index_rope_interleaved);
  if (a.rope_sections != b.rope_sections) {
    d.out.push_back(fmt::format("rope_sections: [{}, {}, {}, {}] vs [{}, {}, {}, {}]",
                                a.rope_sections[0], a.rope_sections[1], a.rope_sections[2],
                                a.rope_sections[3], b.rope_sections[0], b.rope_sections[1],
                                b.rope_sections[2], b.rope_sections[3]));
  }
}
}  // namespace

std::string_view arch_name(ModelArch arch) {
  return names_of(arch).name;
}
std::string_view gguf_arch_name(ModelArch arch) {
  return names_of(arch).gguf;
}
std::string_view hf_architecture_name(ModelArch arch) {
  return names_of(arch).hf;
}

std::vector<std::string> arch_names() {
  std::vector<std::string> out;
  for (const ArchNames& n : kArchNames) out.emplace_back(n.name);
  return out;
}

std::optional<ModelArch> arch_from_name(std::string_view name) {
  for (const ArchNames& n : kArchNames) {
    if (n.name == name) return n.arch;
  }
  return std::nullopt;
}

std::string_view rope_scaling_name(RopeScalingType type) {
  switch (type) {
    case RopeScalingType::kNone:
      return "none";
    case RopeScalingType::kLinear:
      return "linear";
    case RopeScalingType::kYarn:
      return "yarn";
  }
  return "?";
}
std::string_view scoring_func_name(ScoringFunc func) {
  return func == ScoringFunc::kSoftmax ? "softmax" : "sigmoid";
}
std::string_view topk_method_name(TopkMethod method) {
  switch (method) {
    case TopkMethod::kGreedy:
      return "greedy";
    case TopkMethod::kGroupLimitedGreedy:
      return "group_limited_greedy";
    case TopkMethod::kNoauxTc:
      return "noaux_tc";
  }
  return "?";
}

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (layer < 0 || layer >= num_layers || n_experts == 0) return false;
  switch (arch) {
    case ModelArch::kDeepseek2:
    case ModelArch::kDeepseek3:
    case ModelArch::kDeepseek32:
    case ModelArch::kGlmDsa:
      return layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
    case ModelArch::kGlm4Moe:
      return layer >= first_k_dense_replace;
    case ModelArch::kQwen2Moe:
    case ModelArch::kQwen3Moe:
    case ModelArch::kQwen3Next:
    case ModelArch::kQwen35Moe:
      for (int64_t l : mlp_only_layers) {
        if (l == layer) return false;
      }
      return (layer + 1) % moe_layer_freq == 0;
    case ModelArch::kMixtral:
    case ModelArch::kMiniMaxM2:
    case ModelArch::kGptOss:
      return true;
  }
  return false;
}

bool ModelConfig::is_index_layer(int64_t layer) const {
  if (!has_indexer() || layer < 0 || layer >= num_layers) return false;
  return !std::binary_search(index_shared_layers.begin(), index_shared_layers.end(), layer);
}

int64_t ModelConfig::index_layer(int64_t layer) const {
  // Layers before `layer` (itself included) that have an indexer, minus one; a shared layer's
  // is the last full one before it (layer 0 always has one: validate_config).
  const auto shared_upto = std::upper_bound(index_shared_layers.begin(),
                                            index_shared_layers.end(), layer);
  return layer - static_cast<int64_t>(shared_upto - index_shared_layers.begin());
}

int64_t ModelConfig::num_index_layers() const {
  return has_indexer() ? num_layers - static_cast<int64_t>(index_shared_layers.size()) : 0;
}

int64_t ModelConfig::num_moe_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < num_layers; ++l) n += is_moe_layer(l) ? 1 : 0;
  return n;
}

std::vector<std::string> config_diff(const ModelConfig& a, const ModelConfig& b) {
  ConfigDiff d;
  diff_sizes(a, b, d);
  diff_rope(a, b, d);
  diff_mla_routing(a, b, d);
  diff_layer_features(a, b, d);
  return std::move(d.out);
}

namespace detail {

bool is_deepseek(ModelArch arch) {
  return arch == ModelArch::kDeepseek2 || arch == ModelArch::kDeepseek3 ||
         arch == ModelArch::kDeepseek32 || arch == ModelArch::kGlmDsa;
}

std::string_view hf_model_type(ModelArch arch) {
  return names_of(arch).model_type;
}

void validate_config_keys(const ModelConfig& config, std::string_view source,
                          const KeyNamer& key_of) {
  validate_impl(config, source, key_of);
}

}  // namespace detail

void validate_config(const ModelConfig& config, std::string_view source) {
  validate_impl(config, source, [](std::string_view f) { return std::string(f); });
}

ParamCount count_params(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  int64_t attn = 2 * h;  // the layer's two RMSNorms
  if (c.is_mla()) {
    const int64_t q_out = c.num_heads * c.head_dim;
    attn +=
        c.q_lora_rank > 0 ? h * c.q_lora_rank + c.q_lora_rank + c.q_lora_rank * q_out : h * q_out;
    attn += h * (c.kv_lora_rank + c.qk_rope_head_dim) + c.kv_lora_rank;
    attn += c.kv_lora_rank * c.num_heads * (c.qk_nope_head_dim + c.v_head_dim);
    attn += c.num_heads * c.v_head_dim * h;
  } else {
    attn += h * c.num_heads * c.head_dim + 2 * h * c.num_kv_heads * c.head_dim +
            c.num_heads * c.v_head_dim * h;
    if (c.attention_bias) attn += (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
    if (c.qk_norm) {
      attn += c.qk_norm_all_heads ? (c.num_heads + c.num_kv_heads) * c.head_dim : 2 * c.head_dim;
    }
  }
  // gpt-oss: o_proj's bias, the sinks; the router's and the experts' biases below.
  const bool gpt_oss = c.arch == ModelArch::kGptOss;
  if (gpt_oss) attn += h;
  if (c.attn_sinks) attn += c.num_heads;
  if (c.attn_output_gate) attn += h * c.num_heads * c.head_dim;  // the gate's half of q_proj
  // A Gated DeltaNet layer instead of attention: q / k / v and the output gate z, beta and the
  // decay's input (one per value head), the convolution, dt_bias and A_log, the gated norm, out.
  const int64_t vdim = c.linear_num_value_heads * c.linear_value_head_dim;
  const int64_t linear = 2 * h + h * c.linear_conv_channels() + h * vdim +
                         2 * h * c.linear_num_value_heads +
                         c.linear_conv_channels() * c.linear_conv_kernel +
                         2 * c.linear_num_value_heads + c.linear_value_head_dim + vdim * h;
  // The lightning indexer: its q from the q LoRA, its key from x with a LayerNorm (weight and
  // bias), the heads' weights from x.
  const int64_t indexer = c.q_lora_rank * c.index_n_heads * c.index_head_dim +
                          h * c.index_head_dim + 2 * c.index_head_dim + h * c.index_n_heads;
  ParamCount p;
  p.embedding = c.vocab_size * h * (c.tie_word_embeddings ? 1 : 2);
  int64_t dense = p.embedding + h;  // + final norm
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    dense += c.is_linear_layer(layer) ? linear : attn;
    if (c.is_index_layer(layer)) dense += indexer;
    if (!c.is_moe_layer(layer)) {
      dense += 3 * h * c.intermediate_size;
      continue;
    }
    dense += c.n_experts * h;  // router
    if (c.has_e_score_correction_bias || gpt_oss) dense += c.n_experts;
    dense += 3 * h * c.shared_expert_intermediate_size;
    if (c.shared_expert_gate) dense += h;
    p.routed_experts += c.n_experts * 3 * h * c.moe_intermediate_size;
    if (gpt_oss) p.routed_experts += c.n_experts * (2 * c.moe_intermediate_size + h);
  }
  p.total = dense + p.routed_experts;
  p.active_per_token = dense + p.routed_experts / c.n_experts * c.n_experts_per_tok;
  return p;
}

}  // namespace tandem
