// ModelConfig from GGUF metadata as llama.cpp writes and reads it (arches deepseek2, qwen2moe,
// qwen3moe, llama with experts, glm4moe, minimax-m2, gpt-oss). What llama.cpp hard-codes per arch
// rather than storing (routing normalization, q/k norms, gpt-oss's SwiGLU limit) is filled in the
// same way here.
#include <cmath>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/model_config.h"
#include "formats/model_config_detail.h"

namespace tandem {
namespace {

using detail::is_deepseek;

std::string gguf_key_of(ModelArch arch, std::string_view field) {
  const std::string a(gguf_arch_name(arch));
  static const std::pair<std::string_view, std::string_view> kKeys[] = {
      {"vocab_size", ".vocab_size"},
      {"hidden_size", ".embedding_length"},
      {"num_layers", ".block_count"},
      {"num_heads", ".attention.head_count"},
      {"num_kv_heads", ".attention.head_count_kv"},
      {"head_dim", ".attention.key_length"},
      {"v_head_dim", ".attention.value_length"},
      {"rope_dim", ".rope.dimension_count"},
      {"intermediate_size", ".feed_forward_length"},
      {"moe_intermediate_size", ".expert_feed_forward_length"},
      {"shared_expert_intermediate_size", ".expert_shared_feed_forward_length"},
      {"n_shared_experts", ".expert_shared_count"},
      {"n_experts", ".expert_count"},
      {"n_experts_per_tok", ".expert_used_count"},
      {"first_k_dense_replace", ".leading_dense_block_count"},
      {"rms_norm_eps", ".attention.layer_norm_rms_epsilon"},
      {"rope_theta", ".rope.freq_base"},
      {"max_position_embeddings", ".context_length"},
      {"q_lora_rank", ".attention.q_lora_rank"},
      {"kv_lora_rank", ".attention.kv_lora_rank"},
      {"qk_nope_head_dim", ".attention.key_length_mla"},
      {"qk_rope_head_dim", ".rope.dimension_count"},
      {"n_group", ".expert_group_count"},
      {"topk_group", ".expert_group_used_count"},
      {"routed_scaling_factor", ".expert_weights_scale"},
      {"sliding_window", ".attention.sliding_window"},
      {"swa_period", ".attention.sliding_window_pattern"},
      {"rope_scaling.factor", ".rope.scaling.factor"},
      {"rope_scaling.original_max_position_embeddings", ".rope.scaling.original_context_length"},
      {"rope_scaling.beta_fast", ".rope.scaling.yarn_beta_fast"},
      {"rope_scaling.beta_slow", ".rope.scaling.yarn_beta_slow"},
      {"rope_scaling.mscale_all_dim", ".rope.scaling.yarn_log_multiplier"},
  };
  if (is_deepseek(arch) && field == "v_head_dim") return a + ".attention.value_length_mla";
  if (field == "nextn_layers") return a + ".nextn_predict_layers";
  if (field == "full_attention_interval") return a + ".full_attention_interval";
  if (field == "linear_conv_kernel") return a + ".ssm.conv_kernel";
  if (field == "linear_num_key_heads") return a + ".ssm.group_count";
  if (field == "linear_num_value_heads") return a + ".ssm.time_step_rank";
  if (field == "linear_key_head_dim") return a + ".ssm.state_size";
  if (field == "linear_value_head_dim") return a + ".ssm.inner_size";
  if (field == "rope_sections") return a + ".rope.dimension_sections";
  if (field == "index_n_heads") return a + ".attention.indexer.head_count";
  if (field == "index_head_dim") return a + ".attention.indexer.key_length";
  if (field == "index_topk") return a + ".attention.indexer.top_k";
  if (field == "index_shared_layers") return a + ".attention.indexer.types";
  if (field == "num_layers" && (arch == ModelArch::kGlm4Moe || detail::is_qwen_hybrid(arch) ||
                                arch == ModelArch::kDeepseek32 || arch == ModelArch::kGlmDsa)) {
    return a + ".block_count (minus " + a + ".nextn_predict_layers)";
  }
  if (field == "bos_token_id") return "tokenizer.ggml.bos_token_id";
  if (field == "eos_token_id") return "tokenizer.ggml.eos_token_id";
  for (const auto& [f, key] : kKeys) {
    if (f == field) return a + std::string(key);
  }
  return std::string(field);
}

class GgufReader {
 public:
  GgufReader(const GgufFile& f, std::string arch) : f_(f), prefix_(std::move(arch) + ".") {}

  std::string key(std::string_view k) const { return prefix_ + std::string(k); }
  const GgufValue* find(std::string_view k) const { return f_.find(key(k)); }

  // An integer that may be stored per layer (an array): every layer must agree.
  int64_t uniform_int(const GgufValue& v, const std::string& k) const {
    if (v.type() != GgufType::kArray) return as_int(v, k);
    if (v.size() == 0) fail(ErrorKind::kFormat, "{}: key '{}': empty array", f_.path(), k);
    const int64_t first = as_int(v.at(0), k);
    for (size_t i = 1; i < v.size(); ++i) {
      if (as_int(v.at(i), k) != first) {
        fail(ErrorKind::kUnsupported,
             "{}: key '{}': per-layer values differ (layer {}: {} vs "
             "{}); tandem needs one value for all layers",
             f_.path(), k, i, as_int(v.at(i), k), first);
      }
    }
    return first;
  }
  // One integer (an array or a bool is refused, naming the key).
  int64_t req_int(std::string_view k) const {
    const std::string full = key(k);
    const GgufValue* v = f_.find(full);
    if (!v) fail(ErrorKind::kFormat, "{}: required key '{}' is missing", f_.path(), full);
    return as_int(*v, full);
  }
  int64_t opt_int(std::string_view k, int64_t fallback) const {
    const std::string full = key(k);
    const GgufValue* v = f_.find(full);
    return v ? as_int(*v, full) : fallback;
  }
  // The keys llama.cpp reads with get_key_or_arr (head counts, feed_forward_length): one value,
  // or one per layer.
  int64_t req_int_or_layers(std::string_view k) const {
    const std::string full = key(k);
    const GgufValue* v = f_.find(full);
    if (!v) fail(ErrorKind::kFormat, "{}: required key '{}' is missing", f_.path(), full);
    return uniform_int(*v, full);
  }
  int64_t opt_int_or_layers(std::string_view k, int64_t fallback) const {
    const std::string full = key(k);
    const GgufValue* v = f_.find(full);
    return v ? uniform_int(*v, full) : fallback;
  }
  double opt_float(std::string_view k, double fallback) const {
    const std::string full = key(k);
    const GgufValue* v = f_.find(full);
    if (!v) return fallback;
    try {
      return v->as_float();
    } catch (const Error&) {
      fail(ErrorKind::kFormat, "{}: key '{}': expected a number, got {}", f_.path(), full,
           gguf_type_name(v->type()));
    }
  }
  double req_float(std::string_view k) const {
    if (!find(k)) fail(ErrorKind::kFormat, "{}: required key '{}' is missing", f_.path(), key(k));
    return opt_float(k, 0.0);
  }
  bool opt_bool(std::string_view k, bool fallback) const {
    const std::string full = key(k);
    const GgufValue* v = f_.find(full);
    if (!v) return fallback;
    try {
      return v->as_bool();
    } catch (const Error&) {
      fail(ErrorKind::kFormat, "{}: key '{}': expected a bool, got {}", f_.path(), full,
           gguf_type_name(v->type()));
    }
  }
  std::string opt_string(std::string_view k, const std::string& fallback) const {
    const std::string full = key(k);
    const GgufValue* v = f_.find(full);
    if (!v) return fallback;
    if (v->type() != GgufType::kString) {
      fail(ErrorKind::kFormat, "{}: key '{}': expected a string, got {}", f_.path(), full,
           gguf_type_name(v->type()));
    }
    return v->as_string();
  }
  int64_t as_int(const GgufValue& v, const std::string& k) const {
    if (!v.is_integer()) {
      fail(ErrorKind::kFormat, "{}: key '{}': expected an integer, got {}", f_.path(), k,
           gguf_type_name(v.type()));
    }
    // Far above any real size; refusing it keeps the arithmetic on these values overflow-free.
    const bool is_signed = v.type() == GgufType::kInt8 || v.type() == GgufType::kInt16 ||
                           v.type() == GgufType::kInt32 || v.type() == GgufType::kInt64;
    const bool in_range = is_signed ? detail::in_config_range(v.as_int())
                                    : v.as_uint() <= static_cast<uint64_t>(detail::kMaxConfigInt);
    if (!in_range) {
      fail(ErrorKind::kFormat, "{}: key '{}': value {} is out of range", f_.path(), k,
           is_signed ? std::to_string(v.as_int()) : std::to_string(v.as_uint()));
    }
    return v.as_int();
  }

 private:
  const GgufFile& f_;
  std::string prefix_;
};

bool has_tensor_suffix(const GgufFile& f, std::string_view suffix) {
  for (const GgufTensorInfo& t : f.tensors()) {
    if (t.name.ends_with(suffix)) return true;
  }
  return false;
}

// The head sizes of the non-MLA arches (key_length absent: hidden / heads; rope over the head).
void read_gguf_head_dims(const GgufReader& r, ModelConfig& c) {
  c.head_dim = r.opt_int("attention.key_length", c.hidden_size / c.num_heads);
  c.v_head_dim = r.opt_int("attention.value_length", c.head_dim);
  c.rope_dim = r.opt_int("rope.dimension_count", c.head_dim);
}

// The MTP layers, which llama.cpp counts in block_count after the last decoder layer:
// n_layer = block_count - nextn_predict_layers.
void read_gguf_nextn_layers(const GgufReader& r, const GgufFile& f, ModelConfig& c) {
  c.nextn_layers = r.opt_int("nextn_predict_layers", 0);
  if (c.nextn_layers < 0 || c.nextn_layers >= c.num_layers) {
    fail(ErrorKind::kFormat, "{}: key '{}': {} is not below {} ({})", f.path(),
         r.key("nextn_predict_layers"), c.nextn_layers, r.key("block_count"), c.num_layers);
  }
  c.num_layers -= c.nextn_layers;
}

// The Gated DeltaNet's sizes from the ssm.* keys (Mamba's names: state_size the key head,
// group_count the key heads, time_step_rank the value heads, inner_size all value heads together).
void read_gguf_linear_attention(const GgufReader& r, const GgufFile& f, ModelConfig& c) {
  c.linear_conv_kernel = r.req_int("ssm.conv_kernel");
  c.linear_key_head_dim = r.req_int("ssm.state_size");
  c.linear_num_key_heads = r.req_int("ssm.group_count");
  c.linear_num_value_heads = r.req_int("ssm.time_step_rank");
  const int64_t inner = r.req_int("ssm.inner_size");
  if (c.linear_num_value_heads <= 0 || inner % c.linear_num_value_heads != 0) {
    fail(ErrorKind::kFormat, "{}: key '{}': {} is not a multiple of {} ({})", f.path(),
         r.key("ssm.inner_size"), inner, r.key("ssm.time_step_rank"), c.linear_num_value_heads);
  }
  c.linear_value_head_dim = inner / c.linear_num_value_heads;
}

// Which layers are linear attention: full_attention_interval (default 4), or one flag per layer
// in attention.recurrent_layers (the MTP layers' false), which must be the interval's pattern.
void read_gguf_recurrent_layers(const GgufReader& r, const GgufFile& f, ModelConfig& c) {
  c.full_attention_interval = r.opt_int("full_attention_interval", 4);
  const GgufValue* v = r.find("attention.recurrent_layers");
  if (v == nullptr) return;
  const std::string k = r.key("attention.recurrent_layers");
  if (v->type() != GgufType::kArray || v->size() < static_cast<size_t>(c.num_layers)) {
    fail(ErrorKind::kFormat, "{}: key '{}': expected an array of {} flags", f.path(), k,
         c.num_layers);
  }
  int64_t interval = 0;
  for (int64_t l = 0; l < c.num_layers && interval == 0; ++l) {
    if (!v->at(static_cast<size_t>(l)).as_bool()) interval = l + 1;
  }
  c.full_attention_interval = interval == 0 ? c.num_layers + 1 : interval;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (v->at(static_cast<size_t>(l)).as_bool() != c.is_linear_layer(l)) {
      fail(ErrorKind::kUnsupported,
           "{}: key '{}': layer {} breaks the pattern of {} linear-attention layers then one "
           "full (the pattern tandem supports)",
           f.path(), k, l, c.full_attention_interval - 1);
    }
  }
}

// Qwen3.5's multi-section RoPE: rope.dimension_sections, up to 4 integers.
void read_gguf_rope_sections(const GgufReader& r, const GgufFile& f, ModelConfig& c) {
  const GgufValue* v = r.find("rope.dimension_sections");
  if (v == nullptr || v->type() != GgufType::kArray || v->size() > 4 || v->size() == 0) {
    fail(ErrorKind::kFormat, "{}: key '{}': expected an array of up to 4 integers", f.path(),
         r.key("rope.dimension_sections"));
  }
  for (size_t i = 0; i < v->size(); ++i) {
    c.rope_sections[i] = r.as_int(v->at(i), r.key("rope.dimension_sections"));
  }
}

// Qwen3-Next / Qwen3.5-MoE as llama.cpp's loaders read them: the delta rule's sizes, the layer
// pattern, the MTP layers after the last one, and what the graphs hard-code: renormalized top-k,
// q / k norms, the output gate, the shared expert's sigmoid gate.
void read_qwen_hybrid(const GgufReader& r, const GgufFile& f, ModelConfig& c) {
  read_gguf_head_dims(r, c);
  c.moe_intermediate_size = r.req_int("expert_feed_forward_length");
  if (c.intermediate_size == 0) c.intermediate_size = c.moe_intermediate_size;
  c.shared_expert_intermediate_size = r.opt_int("expert_shared_feed_forward_length", 0);
  c.n_shared_experts = c.shared_expert_intermediate_size > 0 ? 1 : 0;
  c.shared_expert_gate = c.n_shared_experts > 0;
  c.norm_topk_prob = true;
  c.qk_norm = true;
  c.attn_output_gate = true;
  read_gguf_linear_attention(r, f, c);
  read_gguf_nextn_layers(r, f, c);
  read_gguf_recurrent_layers(r, f, c);
  if (c.arch == ModelArch::kQwen35Moe) read_gguf_rope_sections(r, f, c);
}

// DeepSeek-V3.2 / GLM-5 as llama.cpp's deepseek32 and glm-dsa loaders read them: the MTP
// layers after the last one, the indexer's sizes, and glm-dsa's indexer types (one flag per
// layer, true = full; absent: every layer full, or GLM-5.2's pattern for a 1M-token context:
// layers 0 and 1, then every fourth from 2).
void read_gguf_indexer(const GgufReader& r, const GgufFile& f, ModelConfig& c) {
  read_gguf_nextn_layers(r, f, c);
  c.index_n_heads = r.req_int("attention.indexer.head_count");
  c.index_head_dim = r.req_int("attention.indexer.key_length");
  c.index_topk = r.req_int("attention.indexer.top_k");
  if (c.arch != ModelArch::kGlmDsa) return;
  c.index_rope_interleaved = true;
  const GgufValue* v = r.find("attention.indexer.types");
  if (v == nullptr) {
    if (c.max_position_embeddings >= 1048576) {
      for (int64_t l = 2; l < c.num_layers; ++l) {
        if ((l - 2) % 4 != 0) c.index_shared_layers.push_back(l);
      }
    }
    return;
  }
  const std::string k = r.key("attention.indexer.types");
  if (v->type() != GgufType::kArray || v->size() < static_cast<size_t>(c.num_layers)) {
    fail(ErrorKind::kFormat, "{}: key '{}': expected an array of {} flags", f.path(), k,
         c.num_layers);
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const GgufValue& e = v->at(static_cast<size_t>(l));
    if (e.type() != GgufType::kBool && !e.is_integer()) {
      fail(ErrorKind::kFormat, "{}: key '{}': expected flags (bool), got {}", f.path(), k,
           gguf_type_name(e.type()));
    }
    if (!e.as_bool()) c.index_shared_layers.push_back(l);
  }
}

// rope.scaling.* (or the pre-2024 rope.scale_linear): linear or YaRN scaling.
void read_gguf_rope_scaling(const GgufReader& r, const GgufFile& f, ModelConfig& c) {
  RopeScaling& rs = c.rope_scaling;
  std::string type = r.opt_string("rope.scaling.type", "none");
  if (type == "none" && r.find("rope.scale_linear")) {  // pre-2024 spelling of linear scaling
    type = "linear";
    rs.factor = static_cast<float>(r.opt_float("rope.scale_linear", 1.0));
  }
  if (type == "none") return;
  if (type == "linear") {
    rs.type = RopeScalingType::kLinear;
    if (r.find("rope.scaling.factor"))
      rs.factor = static_cast<float>(r.req_float("rope.scaling.factor"));
    return;
  }
  if (type != "yarn") {
    fail(ErrorKind::kUnsupported,
         "{}: key '{}': rope scaling '{}' is not supported (linear, "
         "yarn)",
         f.path(), r.key("rope.scaling.type"), printable(type));
  }
  rs.type = RopeScalingType::kYarn;
  rs.factor = static_cast<float>(r.req_float("rope.scaling.factor"));
  rs.original_max_position_embeddings =
      r.opt_int("rope.scaling.original_context_length", c.max_position_embeddings);
  rs.beta_fast = static_cast<float>(r.opt_float("rope.scaling.yarn_beta_fast", 32.0));
  rs.beta_slow = static_cast<float>(r.opt_float("rope.scaling.yarn_beta_slow", 1.0));
  if (is_deepseek(c.arch) && r.find("rope.scaling.yarn_log_multiplier")) {
    // convert_hf_to_gguf.py writes 0.1 * mscale_all_dim for deepseek2.
    rs.mscale_all_dim =
        static_cast<float>(r.opt_float("rope.scaling.yarn_log_multiplier", 0.0) / 0.1);
    rs.mscale = rs.mscale_all_dim;
  }
}

// general.architecture, which must be a string.
std::string gguf_architecture(const GgufFile& f) {
  const GgufValue* arch_value = f.find("general.architecture");
  if (!arch_value)
    fail(ErrorKind::kFormat, "{}: required key 'general.architecture' is missing", f.path());
  if (arch_value->type() != GgufType::kString) {
    fail(ErrorKind::kFormat, "{}: key 'general.architecture': expected a string", f.path());
  }
  return arch_value->as_string();
}

// The ModelArch of llama.cpp's arch name: deepseek2 is V3 when it routes like V3, llama is
// Mixtral when it has experts.
ModelArch arch_from_gguf(const GgufReader& r, const GgufFile& f, const std::string& arch) {
  if (arch == "deepseek2") {
    // V3-style routing (sigmoid scores, selection bias) marks DeepSeek-V3 / R1 / Kimi-K2.
    const bool sigmoid = r.opt_int("expert_gating_func", 1) == 2;
    return sigmoid || has_tensor_suffix(f, "exp_probs_b.bias") ? ModelArch::kDeepseek3
                                                               : ModelArch::kDeepseek2;
  }
  if (arch == "llama") {
    if (r.opt_int("expert_count", 0) <= 1) {
      fail(ErrorKind::kUnsupported,
           "{}: architecture 'llama' without experts (a dense model) is "
           "not supported; tandem runs MoE models",
           f.path());
    }
    return ModelArch::kMixtral;
  }
  static constexpr std::pair<std::string_view, ModelArch> kNames[] = {
      {"qwen2moe", ModelArch::kQwen2Moe},   {"qwen3moe", ModelArch::kQwen3Moe},
      {"glm4moe", ModelArch::kGlm4Moe},     {"minimax-m2", ModelArch::kMiniMaxM2},
      {"gpt-oss", ModelArch::kGptOss},      {"qwen3next", ModelArch::kQwen3Next},
      {"qwen35moe", ModelArch::kQwen35Moe}, {"deepseek32", ModelArch::kDeepseek32},
      {"glm-dsa", ModelArch::kGlmDsa},
  };
  for (const auto& [name, a] : kNames) {
    if (arch == name) return a;
  }
  fail(ErrorKind::kUnsupported,
       "{}: key 'general.architecture': '{}' is not supported (deepseek2, qwen2moe, qwen3moe, "
       "llama with experts, glm4moe, minimax-m2, gpt-oss, qwen3next, qwen35moe, deepseek32, "
       "glm-dsa)",
       f.path(), printable(arch));
}

// The keys every architecture has: the model's sizes, norms, RoPE base, experts, window, and
// what the tensors tell (tied output, attention biases), the tokenizer's BOS / EOS.
void read_gguf_common(const GgufReader& r, const GgufFile& f, ModelConfig& c) {
  if (const GgufValue* v = r.find("vocab_size")) {
    c.vocab_size = r.as_int(*v, r.key("vocab_size"));
  } else if (f.find("tokenizer.ggml.tokens")) {
    c.vocab_size = static_cast<int64_t>(f.get_array_size("tokenizer.ggml.tokens"));
  } else {
    fail(ErrorKind::kFormat, "{}: neither '{}' nor 'tokenizer.ggml.tokens' is present", f.path(),
         r.key("vocab_size"));
  }
  c.hidden_size = r.req_int("embedding_length");
  c.num_layers = r.req_int("block_count");
  c.num_heads = r.req_int_or_layers("attention.head_count");
  c.num_kv_heads = r.opt_int_or_layers("attention.head_count_kv", c.num_heads);
  c.max_position_embeddings = r.req_int("context_length");
  c.rms_norm_eps = static_cast<float>(r.req_float("attention.layer_norm_rms_epsilon"));
  c.rope_theta = static_cast<float>(r.opt_float("rope.freq_base", 10000.0));
  // (Qwen3.5's MoE files have none: no layer is dense.)
  c.intermediate_size = detail::is_qwen_hybrid(c.arch)
                            ? r.opt_int_or_layers("feed_forward_length", 0)
                            : r.req_int_or_layers("feed_forward_length");
  c.n_experts = r.req_int("expert_count");
  c.n_experts_per_tok = r.req_int("expert_used_count");
  c.sliding_window = r.opt_int("attention.sliding_window", 0);
  c.tie_word_embeddings = f.find_tensor("output.weight") == nullptr;
  c.attention_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  {
    const GgufReader tok(f, "tokenizer.ggml");
    c.bos_token_id = tok.opt_int("bos_token_id", -1);
    c.eos_token_id = tok.opt_int("eos_token_id", -1);
  }
  if (c.num_heads <= 0) {
    fail(ErrorKind::kFormat, "{}: key '{}': value {} must be > 0", f.path(),
         r.key("attention.head_count"), c.num_heads);
  }
}

// MLA's sizes: the LoRA ranks and the split head sizes (key_length_mla / value_length_mla, or
// in older files the MHA lengths of an unsplit attn_kv_b).
void read_gguf_mla(const GgufReader& r, ModelConfig& c) {
  c.q_lora_rank = r.opt_int("attention.q_lora_rank", 0);
  c.kv_lora_rank = r.req_int("attention.kv_lora_rank");
  c.qk_rope_head_dim = r.req_int("rope.dimension_count");
  if (r.find("attention.key_length_mla")) {
    c.qk_nope_head_dim = r.req_int("attention.key_length_mla") - c.qk_rope_head_dim;
    c.v_head_dim = r.req_int("attention.value_length_mla");
  } else {  // older files: MHA lengths, unsplit attn_kv_b
    c.qk_nope_head_dim = r.req_int("attention.key_length") - c.qk_rope_head_dim;
    c.v_head_dim = r.req_int("attention.value_length");
  }
  c.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
  c.rope_dim = c.qk_rope_head_dim;
  c.num_kv_heads = c.num_heads;
}

// deepseek2's experts and router: the gating function, groups, and the top-k method that GGUF
// does not store (the selection bias tensor means noaux_tc).
void read_gguf_deepseek_moe(const GgufReader& r, const GgufFile& f, ModelConfig& c) {
  c.moe_intermediate_size = r.req_int("expert_feed_forward_length");
  c.n_shared_experts = r.opt_int("expert_shared_count", 0);
  c.shared_expert_intermediate_size = c.n_shared_experts * c.moe_intermediate_size;
  c.routed_scaling_factor = static_cast<float>(r.opt_float("expert_weights_scale", 1.0));
  c.norm_topk_prob = r.opt_bool("expert_weights_norm", false);
  // (llama.cpp's glm-dsa defaults to sigmoid, deepseek2 to softmax.)
  const int64_t gating = r.opt_int("expert_gating_func", c.arch == ModelArch::kGlmDsa ? 2 : 1);
  if (gating != 1 && gating != 2) {
    fail(ErrorKind::kUnsupported,
         "{}: key '{}': gating function {} is not supported (1 = "
         "softmax, 2 = sigmoid)",
         f.path(), r.key("expert_gating_func"), gating);
  }
  c.scoring = gating == 2 ? ScoringFunc::kSigmoid : ScoringFunc::kSoftmax;
  c.n_group = r.opt_int("expert_group_count", 1);
  c.topk_group = r.opt_int("expert_group_used_count", 1);
  c.has_e_score_correction_bias = has_tensor_suffix(f, "exp_probs_b.bias");
  // GGUF has no topk_method: the selection bias means noaux_tc, groups mean V2's
  // group-limited greedy (with one group both reduce to plain greedy).
  c.topk_method = c.has_e_score_correction_bias ? TopkMethod::kNoauxTc
                  : c.n_group > 1               ? TopkMethod::kGroupLimitedGreedy
                                                : TopkMethod::kGreedy;
}

// deepseek2 / deepseek32 / glm-dsa: the indexer (V3.2, GLM-5), MLA, the experts and router.
void read_gguf_deepseek(const GgufReader& r, const GgufFile& f, ModelConfig& c) {
  if (c.arch == ModelArch::kDeepseek32 || c.arch == ModelArch::kGlmDsa) {
    read_gguf_indexer(r, f, c);
  }
  c.first_k_dense_replace = r.opt_int("leading_dense_block_count", 0);
  read_gguf_mla(r, c);
  read_gguf_deepseek_moe(r, f, c);
}

// qwen2moe / qwen3moe: llama.cpp hard-codes the routing per arch: Qwen2-MoE keeps raw top-k
// softmax weights (and has a gated shared expert), Qwen3 renormalizes them and has q/k norms.
void read_gguf_qwen_moe(const GgufReader& r, ModelConfig& c) {
  const bool qwen3 = c.arch == ModelArch::kQwen3Moe;
  read_gguf_head_dims(r, c);
  c.moe_intermediate_size = r.req_int("expert_feed_forward_length");
  if (!qwen3) {
    c.shared_expert_intermediate_size = r.opt_int("expert_shared_feed_forward_length", 0);
    c.n_shared_experts = c.shared_expert_intermediate_size > 0 ? 1 : 0;
    c.shared_expert_gate = c.n_shared_experts > 0;
  }
  c.norm_topk_prob = qwen3;
  c.qk_norm = qwen3;
}

// glm4moe / minimax-m2: sigmoid scores with the selection bias (exp_probs_b), as llama.cpp runs
// both arches; GLM-4.5's MTP layers, leading dense layers, shared experts and groups.
void read_gguf_glm_minimax(const GgufReader& r, const GgufFile& f, const std::string& arch,
                           ModelConfig& c) {
  read_gguf_head_dims(r, c);
  c.moe_intermediate_size = r.req_int("expert_feed_forward_length");
  const int64_t gating = r.opt_int("expert_gating_func", 2);
  if (gating != 2) {
    fail(ErrorKind::kUnsupported,
         "{}: key '{}': gating function {} is not supported for {} (2 = sigmoid)", f.path(),
         r.key("expert_gating_func"), gating, arch);
  }
  detail::set_noaux_tc_routing(c);
  c.qk_norm = f.find_tensor("blk.0.attn_q_norm.weight") != nullptr;
  if (c.arch != ModelArch::kGlm4Moe) {
    c.norm_topk_prob = true;  // llama.cpp's minimax-m2 graph always renormalizes
    // llama.cpp's minimax-m2 norms span all heads (attn_q_norm: num_heads * head_dim).
    c.qk_norm_all_heads = c.qk_norm;
    return;
  }
  read_gguf_nextn_layers(r, f, c);
  c.first_k_dense_replace = r.opt_int("leading_dense_block_count", 0);
  c.n_shared_experts = r.opt_int("expert_shared_count", 0);
  c.shared_expert_intermediate_size = c.n_shared_experts * c.moe_intermediate_size;
  c.n_group = r.opt_int("expert_group_count", 1);
  c.topk_group = r.opt_int("expert_group_used_count", 1);
  // llama.cpp leaves the weights unscaled when the key is absent (or 0).
  const double scale = r.opt_float("expert_weights_scale", 0.0);
  c.routed_scaling_factor = scale == 0.0 ? 1.0f : static_cast<float>(scale);
  c.norm_topk_prob = r.opt_bool("expert_weights_norm", false);
}

// As llama.cpp's openai-moe loader: a window on the layers of the pattern (default every other,
// the even ones), sinks, the router's softmax over its top k (= softmax, top k, renormalized),
// the clamped SwiGLU with llama.cpp's constants.
void read_gguf_gpt_oss(const GgufReader& r, const GgufFile& f, ModelConfig& c) {
  read_gguf_head_dims(r, c);
  c.moe_intermediate_size = r.req_int("expert_feed_forward_length");
  c.sliding_window = r.req_int("attention.sliding_window");
  c.swa_period = r.opt_int("attention.sliding_window_pattern", 2);
  if (c.swa_period < 1) {
    fail(ErrorKind::kUnsupported, "{}: key '{}': {} is not supported (a period >= 1)", f.path(),
         r.key("attention.sliding_window_pattern"), c.swa_period);
  }
  c.norm_topk_prob = true;
  c.attn_sinks = true;
  c.swiglu_limit = 7.0f;
  if (r.opt_float("rope.freq_base_swa", c.rope_theta) != c.rope_theta) {
    fail(ErrorKind::kUnsupported,
         "{}: key '{}': a RoPE base of its own for the window layers "
         "is not supported",
         f.path(), r.key("rope.freq_base_swa"));
  }
}

// The keys (and what llama.cpp hard-codes) of c.arch.
void read_gguf_arch_fields(const GgufReader& r, const GgufFile& f, const std::string& arch,
                           ModelConfig& c) {
  switch (c.arch) {
    case ModelArch::kDeepseek2:
    case ModelArch::kDeepseek3:
    case ModelArch::kDeepseek32:
    case ModelArch::kGlmDsa:
      read_gguf_deepseek(r, f, c);
      break;
    case ModelArch::kQwen2Moe:
    case ModelArch::kQwen3Moe:
      read_gguf_qwen_moe(r, c);
      break;
    case ModelArch::kGlm4Moe:
    case ModelArch::kMiniMaxM2:
      read_gguf_glm_minimax(r, f, arch, c);
      break;
    case ModelArch::kQwen3Next:
    case ModelArch::kQwen35Moe:
      read_qwen_hybrid(r, f, c);
      break;
    case ModelArch::kMixtral:
      read_gguf_head_dims(r, c);
      c.moe_intermediate_size = r.opt_int("expert_feed_forward_length", c.intermediate_size);
      c.norm_topk_prob = true;
      break;
    case ModelArch::kGptOss:
      read_gguf_gpt_oss(r, f, c);
      break;
  }
}
}  // namespace

ModelConfig config_from_gguf(const GgufFile& f) {
  const std::string arch = gguf_architecture(f);
  const GgufReader r(f, arch);
  ModelConfig c;
  c.arch = arch_from_gguf(r, f, arch);
  read_gguf_common(r, f, c);
  read_gguf_arch_fields(r, f, arch, c);
  read_gguf_rope_scaling(r, f, c);
  detail::validate_config_keys(c, f.path(),
                               [&](std::string_view field) { return gguf_key_of(c.arch, field); });
  return c;
}
}  // namespace tandem
