// ModelConfig from a Hugging Face config.json: the keys of transformers' configuration classes
// (DeepseekV2/V3Config, Qwen2Moe/Qwen3MoeConfig, MixtralConfig, Glm4MoeConfig, MiniMaxM2Config,
// GptOssConfig) with their defaults.
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_file.h"
#include "formats/model_config.h"
#include "formats/model_config_detail.h"

namespace tandem {
namespace {

using Json = nlohmann::json;
using detail::is_deepseek;

std::string hf_key_of(ModelArch arch, std::string_view field) {
  if (field == "num_layers") return "num_hidden_layers";
  if (field == "num_heads") return "num_attention_heads";
  if (field == "num_kv_heads") return "num_key_value_heads";
  const bool glm = arch == ModelArch::kGlm4Moe, minimax = arch == ModelArch::kMiniMaxM2;
  const bool gpt_oss = arch == ModelArch::kGptOss;
  if (field == "swa_period") return "layer_types";
  if (field == "full_attention_interval") return "full_attention_interval (or layer_types)";
  if (field == "linear_conv_kernel") return "linear_conv_kernel_dim";
  if (field == "rope_sections") return "rope_parameters.mrope_section";
  if (field == "rope_dim") {
    if (glm || detail::is_qwen_hybrid(arch)) return "partial_rotary_factor";
    if (minimax) return "rotary_dim";
    return is_deepseek(arch) ? "qk_rope_head_dim" : "head_dim";
  }
  if (field == "n_experts") {
    if (is_deepseek(arch) || glm) return "n_routed_experts";
    return arch == ModelArch::kMixtral || minimax || gpt_oss ? "num_local_experts"
                                                             : "num_experts";
  }
  if (field == "n_experts_per_tok") return "num_experts_per_tok";
  if (field == "moe_intermediate_size" && (arch == ModelArch::kMixtral || minimax || gpt_oss)) {
    return "intermediate_size";
  }
  if (field == "shared_expert_intermediate_size" && glm) return "n_shared_experts";
  if (field == "nextn_layers") return "num_nextn_predict_layers";
  if (field == "index_shared_layers") return "indexer_types";
  if (field == "moe_layer_freq" && !is_deepseek(arch)) return "decoder_sparse_step";
  if (field == "scoring") return "scoring_func";
  if (field == "head_dim" && is_deepseek(arch)) return "qk_nope_head_dim";
  if (field == "shared_expert_intermediate_size" && is_deepseek(arch)) return "n_shared_experts";
  if (field.starts_with("rope_scaling.")) return std::string(field);
  return std::string(field);
}

std::string json_type(const Json& j) {
  return j.type_name();
}

// Typed access to one JSON object with errors naming the file and the key.
class JsonReader {
 public:
  JsonReader(const Json& obj, std::string_view source, std::string prefix = "")
      : obj_(obj), source_(source), prefix_(std::move(prefix)) {}

  bool has(const char* key) const {
    auto it = obj_.find(key);
    return it != obj_.end() && !it->is_null();
  }
  const Json* get(const char* key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  int64_t req_int(const char* key) const {
    const Json* j = get(key);
    if (!j) fail(ErrorKind::kFormat, "{}: required key '{}{}' is missing", source_, prefix_, key);
    return to_int(*j, key);
  }
  int64_t opt_int(const char* key, int64_t fallback) const {
    const Json* j = get(key);
    return j ? to_int(*j, key) : fallback;
  }
  double opt_float(const char* key, double fallback) const {
    const Json* j = get(key);
    if (!j) return fallback;
    if (!j->is_number()) bad_type(key, "a number", *j);
    return j->get<double>();
  }
  double req_float(const char* key) const {
    if (!get(key))
      fail(ErrorKind::kFormat, "{}: required key '{}{}' is missing", source_, prefix_, key);
    return opt_float(key, 0.0);
  }
  bool opt_bool(const char* key, bool fallback) const {
    const Json* j = get(key);
    if (!j) return fallback;
    if (!j->is_boolean()) bad_type(key, "true or false", *j);
    return j->get<bool>();
  }
  std::string opt_string(const char* key, std::string fallback) const {
    const Json* j = get(key);
    if (!j) return fallback;
    if (!j->is_string()) bad_type(key, "a string", *j);
    return j->get<std::string>();
  }
  // An id that may also be a list of ids (eos_token_id in several releases): the first one.
  int64_t opt_token_id(const char* key) const {
    const Json* j = get(key);
    if (!j) return -1;
    if (j->is_array()) {
      if (j->empty()) return -1;
      return to_int(j->at(0), key);
    }
    return to_int(*j, key);
  }
  std::vector<int64_t> opt_int_list(const char* key) const {
    std::vector<int64_t> out;
    const Json* j = get(key);
    if (!j) return out;
    if (!j->is_array()) bad_type(key, "a list of integers", *j);
    if (j->size() > 1000) bad_type(key, "a list of at most 1000 integers", *j);
    for (const Json& e : *j) out.push_back(to_int(e, key));
    return out;
  }
  [[noreturn]] void bad_type(const char* key, const char* expected, const Json& j) const {
    fail(ErrorKind::kFormat, "{}: key '{}{}': expected {}, got {}", source_, prefix_, key, expected,
         json_type(j));
  }

 private:
  // Every integer of a config is far below 2^31 (validate_config_keys() checks the real ranges);
  // refusing larger ones here keeps the arithmetic on them (products of two) free of overflow.
  int64_t to_int(const Json& j, const char* key) const {
    double d = 0;
    if (j.is_number_integer()) {
      if (j.is_number_unsigned() ? j.get<uint64_t>() <= static_cast<uint64_t>(detail::kMaxConfigInt)
                                 : detail::in_config_range(j.get<int64_t>())) {
        return j.get<int64_t>();
      }
      d = j.get<double>();
    } else if (j.is_number_float()) {  // "1.0" style integers in hand-edited configs
      d = j.get<double>();
      if (d == std::floor(d) && std::fabs(d) <= detail::kMaxConfigInt)
        return static_cast<int64_t>(d);
      if (d != std::floor(d)) bad_type(key, "an integer", j);
    } else {
      bad_type(key, "an integer", j);
    }
    fail(ErrorKind::kFormat, "{}: key '{}{}': value {} is out of range", source_, prefix_, key,
         j.dump());
  }

  const Json& obj_;
  std::string_view source_;
  std::string prefix_;
};

std::optional<ModelArch> arch_from_hf(const Json& root, std::string* what) {
  if (auto it = root.find("architectures");
      it != root.end() && it->is_array() && !it->empty() && it->at(0).is_string()) {
    const std::string a = it->at(0).get<std::string>();
    *what = a;
    for (ModelArch arch : detail::kAllArches) {
      if (hf_architecture_name(arch) == a) return arch;
    }
    if (a == "Qwen3_5MoeForCausalLM") return ModelArch::kQwen35Moe;
  }
  if (auto it = root.find("model_type"); it != root.end() && it->is_string()) {
    const std::string t = it->get<std::string>();
    if (what->empty()) *what = t;
    if (t == "kimi_k2") return ModelArch::kDeepseek3;
    if (t == "qwen3_5_moe_text") return ModelArch::kQwen35Moe;
    for (ModelArch arch : detail::kAllArches) {
      if (detail::hf_model_type(arch) == t) return arch;
    }
  }
  return std::nullopt;
}

// DeepSeek Sparse Attention's indexer (DeepseekV32Config, GlmMoeDsaConfig): index_n_heads,
// index_head_dim, index_topk, and GLM-5.2's indexer_types ("full" / "shared" per layer).
void read_hf_indexer(const JsonReader& r, ModelConfig& c) {
  c.index_n_heads = r.req_int("index_n_heads");
  c.index_head_dim = r.req_int("index_head_dim");
  c.index_topk = r.req_int("index_topk");
  c.index_rope_interleaved = c.arch == ModelArch::kGlmDsa;
  const Json* types = r.get("indexer_types");
  if (types == nullptr) return;
  if (!types->is_array() || types->size() > 1000) {
    r.bad_type("indexer_types", "a list of \"full\" / \"shared\"", *types);
  }
  for (size_t l = 0; l < types->size(); ++l) {
    const Json& t = types->at(l);
    if (!t.is_string() || (t != "full" && t != "shared")) {
      r.bad_type("indexer_types", "a list of \"full\" / \"shared\"", *types);
    }
    if (t == "shared") c.index_shared_layers.push_back(static_cast<int64_t>(l));
  }
}

// The share of a head that is rotated (GLM-4.5, MiniMax-M2), checked to (0, 1] before it scales
// head_dim.
double partial_rotary_factor(const JsonReader& r, double fallback, std::string_view source) {
  const double partial = r.opt_float("partial_rotary_factor", fallback);
  if (!(partial > 0.0 && partial <= 1.0)) {
    fail(ErrorKind::kFormat, "{}: key 'partial_rotary_factor': {} is not in (0, 1]", source,
         partial);
  }
  return partial;
}

// Which layers are linear attention: layer_types ("linear_attention" / "full_attention" per
// layer) or full_attention_interval (default 4); tandem supports the repeating pattern of
// interval - 1 linear layers then a full one, which every release has.
void read_hf_layer_types(const JsonReader& r, std::string_view source, ModelConfig& c) {
  c.full_attention_interval = r.opt_int("full_attention_interval", 4);
  const Json* types = r.get("layer_types");
  if (types == nullptr) return;
  if (!types->is_array()) r.bad_type("layer_types", "a list", *types);
  std::vector<bool> linear;
  for (const Json& t : *types) {
    const std::string v = t.is_string() ? t.get<std::string>() : "";
    if (v != "linear_attention" && v != "full_attention") {
      fail(ErrorKind::kFormat,
           "{}: key 'layer_types': entries are 'linear_attention' or 'full_attention'", source);
    }
    linear.push_back(v == "linear_attention");
  }
  if (static_cast<int64_t>(linear.size()) != c.num_layers) {
    fail(ErrorKind::kFormat, "{}: key 'layer_types': {} entries for {} layers", source,
         linear.size(), c.num_layers);
  }
  int64_t interval = 0;
  for (size_t l = 0; l < linear.size() && interval == 0; ++l) {
    if (!linear[l]) interval = static_cast<int64_t>(l) + 1;
  }
  c.full_attention_interval = interval == 0 ? c.num_layers + 1 : interval;
  for (size_t l = 0; l < linear.size(); ++l) {
    if (linear[l] != c.is_linear_layer(static_cast<int64_t>(l))) {
      fail(ErrorKind::kUnsupported,
           "{}: key 'layer_types': layer {} breaks the repeating pattern of {} linear-attention "
           "layers then one full (the pattern tandem supports)",
           source, l, c.full_attention_interval - 1);
    }
  }
}

// Qwen3.5's multi-section RoPE from rope_parameters (rp, null when absent): mrope_section, in
// the interleaved form only.
void read_hf_mrope_sections(const Json* rp, std::string_view source, ModelConfig& c) {
  // transformers' default mrope_section (and convert_hf_to_gguf.py's) when a file has none.
  std::vector<int64_t> sections = {11, 11, 10};
  if (rp != nullptr) {
    const JsonReader p(*rp, source, "rope_parameters.");
    if (p.has("mrope_section")) sections = p.opt_int_list("mrope_section");
    if (!p.opt_bool("mrope_interleaved", true)) {
      fail(ErrorKind::kUnsupported,
           "{}: key 'rope_parameters.mrope_interleaved': only the interleaved form is "
           "supported (as released)",
           source);
    }
  }
  if (sections.empty() || sections.size() > 4) {
    fail(ErrorKind::kFormat, "{}: key 'rope_parameters.mrope_section': 1 to 4 sections", source);
  }
  for (size_t i = 0; i < sections.size(); ++i) c.rope_sections[i] = sections[i];
}

// The hybrid models' gated attention: head_dim, the partial rotary factor (top level or in
// rope_parameters / rope_scaling) and, for Qwen3.5, the multi-section RoPE.
void read_hf_hybrid_attention(const JsonReader& r, std::string_view source, ModelConfig& c) {
  c.head_dim = r.opt_int("head_dim", 256);
  c.v_head_dim = c.head_dim;
  const Json* rp = r.get("rope_parameters");
  if (rp == nullptr) rp = r.get("rope_scaling");
  if (rp != nullptr && !rp->is_object()) r.bad_type("rope_parameters", "an object", *rp);
  double partial = partial_rotary_factor(r, 0.25, source);
  if (rp != nullptr && rp->contains("partial_rotary_factor")) {
    partial = partial_rotary_factor(JsonReader(*rp, source, "rope_parameters."), partial, source);
  }
  c.rope_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * partial);
  if (c.arch == ModelArch::kQwen35Moe) read_hf_mrope_sections(rp, source, c);
}

// Qwen3NextConfig / Qwen3_5MoeTextConfig: the Gated DeltaNet sizes, the layer pattern, the gated
// attention with partial rotary (Qwen3.5: interleaved multi-section), the gated shared expert.
void read_hf_qwen_hybrid(const JsonReader& r, std::string_view source, ModelConfig& c) {
  read_hf_hybrid_attention(r, source, c);
  c.moe_intermediate_size = r.req_int("moe_intermediate_size");
  if (c.intermediate_size == 0) c.intermediate_size = c.moe_intermediate_size;
  c.shared_expert_intermediate_size = r.opt_int("shared_expert_intermediate_size", 0);
  c.n_shared_experts = c.shared_expert_intermediate_size > 0 ? 1 : 0;
  c.shared_expert_gate = c.n_shared_experts > 0;
  c.n_experts = r.req_int("num_experts");
  c.norm_topk_prob = r.opt_bool("norm_topk_prob", true);
  c.moe_layer_freq = r.opt_int("decoder_sparse_step", 1);
  c.mlp_only_layers = r.opt_int_list("mlp_only_layers");
  c.attention_bias = r.opt_bool("attention_bias", false);
  c.qk_norm = true;
  c.attn_output_gate = r.opt_bool("attn_output_gate", true);
  if (!c.attn_output_gate) {
    fail(ErrorKind::kUnsupported, "{}: key 'attn_output_gate': attention without its output "
         "gate is not supported", source);
  }
  c.linear_conv_kernel = r.opt_int("linear_conv_kernel_dim", 4);
  c.linear_key_head_dim = r.opt_int("linear_key_head_dim", 128);
  c.linear_value_head_dim = r.opt_int("linear_value_head_dim", 128);
  c.linear_num_key_heads = r.opt_int("linear_num_key_heads", 16);
  c.linear_num_value_heads = r.opt_int("linear_num_value_heads", 32);
  c.nextn_layers = r.opt_int("mtp_num_hidden_layers", 0);
  read_hf_layer_types(r, source, c);
}

// rope_scaling (or rope_parameters): the RoPE base it may carry, linear or YaRN scaling.
void read_hf_rope_scaling(const JsonReader& r, std::string_view source, ModelConfig& c) {
  const Json* rs = r.get("rope_scaling");
  if (!rs) rs = r.get("rope_parameters");  // transformers >= 4.56 spelling
  if (!rs) return;
  if (!rs->is_object()) r.bad_type("rope_scaling", "an object or null", *rs);
  JsonReader s(*rs, source, "rope_scaling.");
  if (s.has("rope_theta")) c.rope_theta = static_cast<float>(s.opt_float("rope_theta", 0));
  std::string type = s.opt_string("type", "");
  if (type.empty()) type = s.opt_string("rope_type", "default");
  if (type == "default" || type == "none") return;
  if (type == "linear") {
    c.rope_scaling.type = RopeScalingType::kLinear;
    c.rope_scaling.factor = static_cast<float>(s.req_float("factor"));
    return;
  }
  if (type == "yarn") {
    RopeScaling& y = c.rope_scaling;
    y.type = RopeScalingType::kYarn;
    y.factor = static_cast<float>(s.req_float("factor"));
    y.original_max_position_embeddings =
        s.opt_int("original_max_position_embeddings", c.max_position_embeddings);
    y.beta_fast = static_cast<float>(s.opt_float("beta_fast", 32.0));
    y.beta_slow = static_cast<float>(s.opt_float("beta_slow", 1.0));
    y.mscale = static_cast<float>(s.opt_float("mscale", 1.0));
    y.mscale_all_dim = static_cast<float>(s.opt_float("mscale_all_dim", 0.0));
    return;
  }
  fail(ErrorKind::kUnsupported,
       "{}: key 'rope_scaling.type': rope scaling '{}' is not supported "
       "(supported: linear, yarn)",
       source, type);
}

// The object that holds the language model's keys: multimodal wrappers (e.g. Kimi-K2.5) nest it
// under text_config.
const Json& hf_text_root(const Json& root) {
  if (auto it = root.find("text_config");
      it != root.end() && it->is_object() && !root.contains("hidden_size")) {
    return *it;
  }
  return root;
}

// The architecture named by `root` (or by the wrapper around it), or an error listing those
// tandem supports.
ModelArch hf_arch(const Json& root, const Json& wrapper, std::string_view source) {
  std::string what;
  std::optional<ModelArch> arch = arch_from_hf(root, &what);
  if (!arch && &root != &wrapper) arch = arch_from_hf(wrapper, &what);
  if (!arch) {
    fail(ErrorKind::kUnsupported,
         "{}: architecture '{}' is not supported (supported: "
         "DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, Qwen2MoeForCausalLM, "
         "Qwen3MoeForCausalLM, MixtralForCausalLM, Glm4MoeForCausalLM, MiniMaxM2ForCausalLM, "
         "GptOssForCausalLM, Qwen3NextForCausalLM, Qwen3_5MoeForConditionalGeneration, "
         "DeepseekV32ForCausalLM, GlmMoeDsaForCausalLM)",
         source, what.empty() ? "(none)" : what);
  }
  return *arch;
}

// The keys every architecture has: the activation, the model's sizes, norms, RoPE base, tokens.
void read_hf_common(const JsonReader& r, std::string_view source, ModelConfig& c) {
  const std::string act = r.opt_string("hidden_act", "silu");
  if (act != "silu") {
    fail(ErrorKind::kUnsupported, "{}: key 'hidden_act': activation '{}' is not supported (silu)",
         source, act);
  }
  c.vocab_size = r.req_int("vocab_size");
  c.hidden_size = r.req_int("hidden_size");
  c.num_layers = r.req_int("num_hidden_layers");
  c.num_heads = r.req_int("num_attention_heads");
  c.num_kv_heads = r.opt_int("num_key_value_heads", c.num_heads);
  c.max_position_embeddings = r.opt_int("max_position_embeddings", 4096);
  c.rms_norm_eps = static_cast<float>(r.opt_float("rms_norm_eps", 1e-6));
  c.rope_theta = static_cast<float>(r.opt_float("rope_theta", 10000.0));
  c.tie_word_embeddings = r.opt_bool("tie_word_embeddings", false);
  c.bos_token_id = r.opt_token_id("bos_token_id");
  c.eos_token_id = r.opt_token_id("eos_token_id");
  // MiniMax-M2 has no dense FFN: its intermediate_size is the experts' width. Qwen3.5's MoE
  // configs have none (every layer is MoE).
  c.intermediate_size = c.arch == ModelArch::kQwen35Moe ? r.opt_int("intermediate_size", 0)
                                                        : r.req_int("intermediate_size");
  c.n_experts_per_tok = r.req_int("num_experts_per_tok");
  // Guard the divisions below; the full range check follows in validate_config_keys().
  if (c.num_heads <= 0) {
    fail(ErrorKind::kFormat, "{}: key 'num_attention_heads': value {} must be > 0", source,
         c.num_heads);
  }
}

// Qwen2-MoE and Mixtral derive head_dim from hidden_size, which the heads must divide.
void check_heads_divide_hidden(std::string_view source, const ModelConfig& c) {
  if (c.hidden_size % c.num_heads != 0) {
    fail(ErrorKind::kFormat,
         "{}: key 'num_attention_heads': {} heads do not divide "
         "hidden_size {}",
         source, c.num_heads, c.hidden_size);
  }
}

// DeepSeek's MLA: the LoRA ranks and the split head sizes (every head its own decompressed K/V).
void read_hf_mla(const JsonReader& r, ModelConfig& c) {
  c.q_lora_rank = r.opt_int("q_lora_rank", 0);
  c.kv_lora_rank = r.req_int("kv_lora_rank");
  c.qk_nope_head_dim = r.req_int("qk_nope_head_dim");
  c.qk_rope_head_dim = r.req_int("qk_rope_head_dim");
  c.v_head_dim = r.req_int("v_head_dim");
  c.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
  c.rope_dim = c.qk_rope_head_dim;
  c.num_kv_heads = c.num_heads;  // MLA: every head has its own decompressed K/V
}

// DeepSeek's router: groups, topk_method, scoring_func, renormalization and scaling, with the
// defaults of the HF configuration classes (V2: softmax greedy, V3 and later: noaux_tc).
void read_hf_deepseek_routing(const JsonReader& r, std::string_view source, bool v3,
                              ModelConfig& c) {
  c.n_group = r.opt_int("n_group", 1);
  c.topk_group = r.opt_int("topk_group", 1);
  const std::string method = r.opt_string("topk_method", v3 ? "noaux_tc" : "greedy");
  if (method == "greedy" || method == "gready") {  // "gready": DeepseekV2Config's default
    c.topk_method = TopkMethod::kGreedy;
  } else if (method == "group_limited_greedy") {
    c.topk_method = TopkMethod::kGroupLimitedGreedy;
  } else if (method == "noaux_tc") {
    c.topk_method = TopkMethod::kNoauxTc;
  } else {
    fail(ErrorKind::kUnsupported,
         "{}: key 'topk_method': '{}' is not supported (greedy, "
         "group_limited_greedy, noaux_tc)",
         source, method);
  }
  const std::string scoring = r.opt_string("scoring_func", v3 ? "sigmoid" : "softmax");
  if (scoring == "softmax") {
    c.scoring = ScoringFunc::kSoftmax;
  } else if (scoring == "sigmoid") {
    c.scoring = ScoringFunc::kSigmoid;
  } else {
    fail(ErrorKind::kUnsupported,
         "{}: key 'scoring_func': '{}' is not supported (softmax, "
         "sigmoid)",
         source, scoring);
  }
  c.norm_topk_prob = r.opt_bool("norm_topk_prob", v3);
  c.routed_scaling_factor =
      static_cast<float>(r.opt_float("routed_scaling_factor", v3 ? 2.5 : 1.0));
  c.has_e_score_correction_bias = c.topk_method == TopkMethod::kNoauxTc;
}

// DeepseekV2/V3/V32Config, GlmMoeDsaConfig: the indexer and MTP layers (V3.2, GLM-5), the
// experts, MLA and the router.
void read_hf_deepseek(const JsonReader& r, std::string_view source, ModelConfig& c) {
  // DeepSeek-V3's routing defaults (noaux_tc, sigmoid, 2.5) are V3.2's and GLM-5's too.
  const bool v3 = c.arch != ModelArch::kDeepseek2;
  if (c.arch == ModelArch::kDeepseek32 || c.arch == ModelArch::kGlmDsa) {
    read_hf_indexer(r, c);
    c.nextn_layers = r.opt_int("num_nextn_predict_layers", 0);
  }
  c.moe_intermediate_size = r.req_int("moe_intermediate_size");
  c.n_experts = r.req_int("n_routed_experts");
  c.n_shared_experts = r.opt_int("n_shared_experts", 0);
  c.shared_expert_intermediate_size = c.n_shared_experts * c.moe_intermediate_size;
  c.first_k_dense_replace = r.opt_int("first_k_dense_replace", 0);
  c.moe_layer_freq = r.opt_int("moe_layer_freq", 1);
  read_hf_mla(r, c);
  read_hf_deepseek_routing(r, source, v3, c);
  c.attention_bias = r.opt_bool("attention_bias", false);
}

// Qwen2MoeConfig / Qwen3MoeConfig: head sizes, experts (Qwen2: a gated shared expert), the
// sparse-layer pattern, biases and q/k norms, the optional sliding window.
void read_hf_qwen_moe(const JsonReader& r, std::string_view source, ModelConfig& c) {
  const bool qwen3 = c.arch == ModelArch::kQwen3Moe;
  c.moe_intermediate_size = r.req_int("moe_intermediate_size");
  c.n_experts = r.req_int("num_experts");
  c.head_dim =
      qwen3 ? r.opt_int("head_dim", c.hidden_size / c.num_heads) : c.hidden_size / c.num_heads;
  if (!qwen3) check_heads_divide_hidden(source, c);
  c.v_head_dim = c.head_dim;
  c.rope_dim = c.head_dim;
  if (!qwen3) {
    c.shared_expert_intermediate_size = r.opt_int("shared_expert_intermediate_size", 0);
    c.n_shared_experts = c.shared_expert_intermediate_size > 0 ? 1 : 0;
    c.shared_expert_gate = c.n_shared_experts > 0;
  }
  c.norm_topk_prob = r.opt_bool("norm_topk_prob", false);
  c.moe_layer_freq = r.opt_int("decoder_sparse_step", 1);
  c.mlp_only_layers = r.opt_int_list("mlp_only_layers");
  c.attention_bias = qwen3 ? r.opt_bool("attention_bias", false) : true;  // Qwen2: always
  c.qk_norm = qwen3;
  if (r.opt_bool("use_sliding_window", false)) c.sliding_window = r.opt_int("sliding_window", 0);
}

// Glm4MoeConfig: partial rotary, DeepSeek-V3-style experts and router (noaux_tc), q/k norms and
// the MTP layers.
void read_hf_glm4moe(const JsonReader& r, std::string_view source, ModelConfig& c) {
  c.head_dim = r.opt_int("head_dim", c.hidden_size / c.num_heads);
  c.v_head_dim = c.head_dim;
  const double partial = partial_rotary_factor(r, 0.5, source);
  // As convert_hf_to_gguf.py writes rope.dimension_count: int(head_dim * factor).
  c.rope_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * partial);
  c.moe_intermediate_size = r.req_int("moe_intermediate_size");
  c.n_experts = r.req_int("n_routed_experts");
  c.n_shared_experts = r.opt_int("n_shared_experts", 1);
  c.shared_expert_intermediate_size = c.n_shared_experts * c.moe_intermediate_size;
  c.first_k_dense_replace = r.opt_int("first_k_dense_replace", 1);
  c.n_group = r.opt_int("n_group", 1);
  c.topk_group = r.opt_int("topk_group", 1);
  detail::set_noaux_tc_routing(c);  // Glm4MoeTopkRouter
  c.norm_topk_prob = r.opt_bool("norm_topk_prob", true);
  c.routed_scaling_factor = static_cast<float>(r.opt_float("routed_scaling_factor", 1.0));
  c.attention_bias = r.opt_bool("attention_bias", false);
  c.qk_norm = r.opt_bool("use_qk_norm", false);
  c.nextn_layers = r.opt_int("num_nextn_predict_layers", 0);
}

// MiniMaxM2Config: the experts' width is intermediate_size, rotary_dim (or the partial factor),
// sigmoid routing with a bias (the only form released), q/k norms over all heads.
void read_hf_minimax_m2(const JsonReader& r, std::string_view source, ModelConfig& c) {
  c.moe_intermediate_size = c.intermediate_size;
  c.n_experts = r.req_int("num_local_experts");
  c.head_dim = r.opt_int("head_dim", c.hidden_size / c.num_heads);
  c.v_head_dim = c.head_dim;
  const double partial = partial_rotary_factor(r, 1.0, source);
  c.rope_dim = r.has("rotary_dim")
                   ? r.req_int("rotary_dim")
                   : static_cast<int64_t>(static_cast<double>(c.head_dim) * partial);
  const std::string scoring = r.opt_string("scoring_func", "sigmoid");
  if (scoring != "sigmoid" || !r.opt_bool("use_routing_bias", true)) {
    fail(ErrorKind::kUnsupported,
         "{}: keys 'scoring_func' / 'use_routing_bias': only sigmoid scores with a routing "
         "bias are supported (as released)",
         source);
  }
  detail::set_noaux_tc_routing(c);
  c.norm_topk_prob = true;  // MiniMaxM2SparseMoeBlock always renormalizes the top-k
  c.qk_norm = r.opt_bool("use_qk_norm", true);
  c.qk_norm_all_heads = c.qk_norm;  // qk_norm_type "per_layer": over all heads
  const std::string norm_type = r.opt_string("qk_norm_type", "per_layer");
  if (c.qk_norm && norm_type != "per_layer") {
    fail(ErrorKind::kUnsupported, "{}: key 'qk_norm_type': '{}' is not supported (per_layer)",
         source, norm_type);
  }
}

// MixtralConfig: the experts' width is intermediate_size, full rotary, an optional window.
void read_hf_mixtral(const JsonReader& r, std::string_view source, ModelConfig& c) {
  c.moe_intermediate_size = c.intermediate_size;  // Mixtral names the expert width so
  c.n_experts = r.req_int("num_local_experts");
  c.head_dim = r.opt_int("head_dim", c.hidden_size / c.num_heads);
  if (!r.has("head_dim")) check_heads_divide_hidden(source, c);
  c.v_head_dim = c.head_dim;
  c.rope_dim = c.head_dim;
  c.norm_topk_prob = true;  // MixtralSparseMoeBlock always renormalizes the top-k
  c.sliding_window = r.opt_int("sliding_window", 0);
}

// layer_types: "sliding_attention" / "full_attention" per layer, a repeating pattern of
// windowed layers then one full (gpt-oss: alternating, the first windowed).
void read_hf_sliding_layer_types(const JsonReader& r, std::string_view source, ModelConfig& c) {
  c.swa_period = 2;
  const Json* types = r.get("layer_types");
  if (types == nullptr) return;
  if (!types->is_array()) r.bad_type("layer_types", "a list", *types);
  std::vector<bool> swa;
  for (const Json& t : *types) {
    const bool sliding = t.is_string() && t.get<std::string>() == "sliding_attention";
    if (!sliding && !(t.is_string() && t.get<std::string>() == "full_attention")) {
      fail(ErrorKind::kFormat,
           "{}: key 'layer_types': entries are 'sliding_attention' or 'full_attention'", source);
    }
    swa.push_back(sliding);
  }
  if (static_cast<int64_t>(swa.size()) != c.num_layers) {
    fail(ErrorKind::kFormat, "{}: key 'layer_types': {} entries for {} layers", source, swa.size(),
         c.num_layers);
  }
  int64_t period = 0;  // 0: no windowed layer
  for (size_t l = 0; l < swa.size() && period == 0; ++l) {
    if (!swa[l]) period = static_cast<int64_t>(l) + 1;
  }
  if (period == 0) period = c.num_layers + 1;  // every layer windowed
  c.swa_period = period == 1 ? 0 : period;
  for (size_t l = 0; l < swa.size(); ++l) {
    if (swa[l] != c.is_swa_layer(static_cast<int64_t>(l))) {
      fail(ErrorKind::kUnsupported,
           "{}: key 'layer_types': layer {} breaks the repeating pattern of {} windowed "
           "layers then one full (the pattern llama.cpp and tandem support)",
           source, l, period - 1);
    }
  }
}

// GptOssConfig: the experts' width is intermediate_size, biases, sinks, the clamped SwiGLU and
// the windowed layers.
void read_hf_gpt_oss(const JsonReader& r, std::string_view source, ModelConfig& c) {
  c.moe_intermediate_size = c.intermediate_size;  // the experts' width (no dense FFN)
  c.n_experts = r.req_int("num_local_experts");
  c.head_dim = r.opt_int("head_dim", c.hidden_size / c.num_heads);
  c.v_head_dim = c.rope_dim = c.head_dim;
  c.norm_topk_prob = true;  // GptOssTopKRouter: softmax over the top-k logits
  c.attention_bias = r.opt_bool("attention_bias", true);
  c.attn_sinks = true;
  c.swiglu_limit = static_cast<float>(r.opt_float("swiglu_limit", 7.0));
  c.sliding_window = r.opt_int("sliding_window", 128);
  read_hf_sliding_layer_types(r, source, c);
}

// The keys of c.arch's configuration class.
void read_hf_arch_fields(const JsonReader& r, std::string_view source, ModelConfig& c) {
  switch (c.arch) {
    case ModelArch::kDeepseek2:
    case ModelArch::kDeepseek3:
    case ModelArch::kDeepseek32:
    case ModelArch::kGlmDsa:
      read_hf_deepseek(r, source, c);
      break;
    case ModelArch::kQwen2Moe:
    case ModelArch::kQwen3Moe:
      read_hf_qwen_moe(r, source, c);
      break;
    case ModelArch::kQwen3Next:
    case ModelArch::kQwen35Moe:
      read_hf_qwen_hybrid(r, source, c);
      break;
    case ModelArch::kGlm4Moe:
      read_hf_glm4moe(r, source, c);
      break;
    case ModelArch::kMiniMaxM2:
      read_hf_minimax_m2(r, source, c);
      break;
    case ModelArch::kMixtral:
      read_hf_mixtral(r, source, c);
      break;
    case ModelArch::kGptOss:
      read_hf_gpt_oss(r, source, c);
      break;
  }
}

ModelConfig parse_hf(const Json& root_in, std::string_view source) {
  if (!root_in.is_object()) {
    fail(ErrorKind::kFormat, "{}: expected a JSON object, got {}", source, json_type(root_in));
  }
  const Json& root = hf_text_root(root_in);
  ModelConfig c;
  c.arch = hf_arch(root, root_in, source);
  const JsonReader r(root, source);
  read_hf_common(r, source, c);
  read_hf_arch_fields(r, source, c);
  read_hf_rope_scaling(r, source, c);
  detail::validate_config_keys(c, source, [&](std::string_view f) { return hf_key_of(c.arch, f); });
  return c;
}
}  // namespace

ModelConfig config_from_hf_json_text(std::string_view json_text, std::string_view source) {
  Json root;
  try {
    root = Json::parse(json_text.begin(), json_text.end());
  } catch (const Json::exception& e) {
    fail(ErrorKind::kFormat, "{}: invalid JSON: {}", source, e.what());
  }
  try {
    return parse_hf(root, source);
  } catch (const Json::exception& e) {  // a type surprise nlohmann reports itself
    fail(ErrorKind::kFormat, "{}: {}", source, e.what());
  }
}

ModelConfig config_from_hf_json(const std::filesystem::path& config_json) {
  std::filesystem::path path = config_json;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) path /= "config.json";
  return config_from_hf_json_text(read_input_file(path, kMaxConfigFileBytes), path.string());
}
}  // namespace tandem
