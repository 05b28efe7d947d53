// Model hyperparameters: one ModelConfig for every supported MoE architecture, read from a
// Hugging Face config.json or from GGUF metadata (llama.cpp arches deepseek2, qwen2moe, qwen3moe,
// llama-with-experts, glm4moe, minimax-m2), or taken from a named preset with the real released
// shapes.
//
// The two sources describe the same model differently (DeepSeek MLA in GGUF is written as MQA
// with head_count_kv = 1 and key_length = kv_lora + rope; routing flags that llama.cpp hard-codes
// per arch are absent from GGUF). ModelConfig holds the HF meaning of every field, so the HF and
// GGUF files of one model give equal configs (config_diff() is empty). Everything that comes
// from a file is validated; a bad value throws Error naming the file and the key.
//
// Not for: tensor names or layouts (model/), tokenizers (engine/), checkpoint quantization.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

class GgufFile;
class GgufWriter;

enum class ModelArch : uint8_t {
  kDeepseek2, kDeepseek3, kQwen2Moe, kQwen3Moe, kMixtral, kGlm4Moe, kMiniMaxM2, kGptOss,
  kQwen3Next, kQwen35Moe, kDeepseek32, kGlmDsa
};

// "deepseek2", "deepseek3", "qwen2moe", "qwen3moe", "mixtral", "glm4moe", "minimax-m2", "gpt-oss",
// "qwen3next", "qwen35moe", "deepseek32", "glm-dsa" (tandem's names, `--arch`).
std::string_view arch_name(ModelArch arch);
std::optional<ModelArch> arch_from_name(std::string_view name);
std::vector<std::string> arch_names();  // every arch's name, in that order
// llama.cpp's `general.architecture`: deepseek2 (both DeepSeek arches), qwen2moe, qwen3moe, llama,
// glm4moe, minimax-m2, gpt-oss, qwen3next, qwen35moe, deepseek32, glm-dsa.
std::string_view gguf_arch_name(ModelArch arch);
// HF `architectures[0]`: DeepseekV2ForCausalLM, ..., MixtralForCausalLM, Glm4MoeForCausalLM,
// MiniMaxM2ForCausalLM, GptOssForCausalLM, Qwen3NextForCausalLM,
// Qwen3_5MoeForConditionalGeneration (the text model of it, or of Qwen3_5MoeForCausalLM),
// DeepseekV32ForCausalLM, GlmMoeDsaForCausalLM.
std::string_view hf_architecture_name(ModelArch arch);

enum class RopeScalingType : uint8_t { kNone, kLinear, kYarn };
enum class ScoringFunc : uint8_t { kSoftmax, kSigmoid };
// DeepSeek router variants (HF `topk_method`); Qwen and Mixtral use kGreedy.
enum class TopkMethod : uint8_t { kGreedy, kGroupLimitedGreedy, kNoauxTc };

std::string_view rope_scaling_name(RopeScalingType type);  // "none", "linear", "yarn"
std::string_view scoring_func_name(ScoringFunc func);      // "softmax", "sigmoid"
std::string_view topk_method_name(
    TopkMethod method);  // "greedy", "group_limited_greedy", "noaux_tc"

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  float factor = 1.0f;
  int64_t original_max_position_embeddings = 0;  // YaRN only
  float beta_fast = 32.0f;                       // YaRN ramp (HF defaults 32 / 1)
  float beta_slow = 1.0f;
  // DeepSeek YaRN: cos/sin are scaled by mscale(factor, mscale) / mscale(factor, mscale_all_dim)
  // and the softmax scale by mscale(factor, mscale_all_dim)^2, mscale(s, m) = 0.1 m ln(s) + 1
  // (1 when m = 0). GGUF stores only mscale_all_dim (as yarn_log_multiplier = 0.1 * it);
  // config_from_gguf() sets mscale = mscale_all_dim, which is what every released model has.
  float mscale = 1.0f;
  float mscale_all_dim = 0.0f;
};

struct ModelConfig {
  ModelArch arch = ModelArch::kDeepseek2;

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  // Key/value heads of the attention as computed: for MLA (DeepSeek) this equals num_heads
  // (every head gets its own K/V after decompression), whatever the file's header says.
  int64_t num_kv_heads = 0;
  // Query/key head size: qk_nope + qk_rope for MLA, else head_dim (default hidden / heads).
  int64_t head_dim = 0;
  // Rotary dims per head: qk_rope for MLA; head_dim, or its first part (partial rotary: GLM-4.5's
  // partial_rotary_factor, MiniMax-M2's rotary_dim), rotated in the NeoX form.
  int64_t rope_dim = 0;

  int64_t intermediate_size = 0;      // dense FFN width (DeepSeek's leading dense layers)
  int64_t moe_intermediate_size = 0;  // one routed expert's FFN width
  // Width of the shared-expert FFN (0 = none): Qwen2-MoE `shared_expert_intermediate_size`,
  // DeepSeek n_shared_experts * moe_intermediate_size (the shared experts are one wide FFN).
  int64_t shared_expert_intermediate_size = 0;
  int64_t n_shared_experts = 0;     // DeepSeek count; 1 for Qwen2-MoE when it has a shared expert
  bool shared_expert_gate = false;  // Qwen2-MoE: shared expert output * sigmoid(x . w_gate)
  int64_t n_experts = 0;
  int64_t n_experts_per_tok = 0;
  // Which layers are MoE (is_moe_layer()): DeepSeek: layer >= first_k_dense_replace and
  // layer % moe_layer_freq == 0; GLM-4.5: layer >= first_k_dense_replace; Qwen: layer not in
  // mlp_only_layers and (layer + 1) % moe_layer_freq == 0 (HF decoder_sparse_step); Mixtral and
  // MiniMax-M2: all.
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  std::vector<int64_t> mlp_only_layers;

  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 0;

  // MLA (DeepSeek); zero for the other arches.
  int64_t q_lora_rank = 0;  // 0 = no query LoRA (V2-Lite): q_proj is a plain linear
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;  // value head size (== head_dim for non-MLA arches)

  // Routing.
  ScoringFunc scoring = ScoringFunc::kSoftmax;
  TopkMethod topk_method = TopkMethod::kGreedy;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = false;  // renormalize the k selected weights to sum 1
  float routed_scaling_factor = 1.0f;
  bool has_e_score_correction_bias = false;  // DeepSeek-V3 noaux_tc selection bias

  bool attention_bias = false;  // q/k/v projection biases (Qwen2-MoE, GLM-4.5)
  bool qk_norm = false;         // RMSNorm of q and k (Qwen3-MoE, GLM-4.5 optionally, MiniMax-M2)
  // The q / k norms span all heads (MiniMax-M2: one RMSNorm over the num_heads * head_dim query,
  // one over the num_kv_heads * head_dim key) rather than each head's head_dim.
  bool qk_norm_all_heads = false;
  // Multi-token-prediction layers stored after the last layer (GLM-4.5 / DeepSeek-V3
  // `num_nextn_predict_layers`; GGUF block_count counts them): loaded with the checkpoint, not run.
  int64_t nextn_layers = 0;
  bool tie_word_embeddings = false;
  int64_t bos_token_id = -1;  // -1 = none
  int64_t eos_token_id = -1;
  // Sliding-window attention: a query sees the last sliding_window positions (itself included)
  // in the layers where is_swa_layer(): layer % swa_period < swa_period - 1 (llama.cpp's
  // sliding_window_pattern; gpt-oss: 2, the even layers). swa_period 0: no layer (Mixtral's and
  // Qwen2-MoE's configs may name a window that llama.cpp and tandem do not apply).
  int64_t sliding_window = 0;
  int64_t swa_period = 0;
  // gpt-oss: a learned sink logit per head in every attention softmax (ops::AttentionArgs::sinks).
  bool attn_sinks = false;
  // gpt-oss's clamped SwiGLU in the experts, when > 0: g = min(gate, limit), u = clamp(up, -limit,
  // limit), out = g * sigmoid(1.702 g) * (u + 1) (ops::FfnExtras); 0: silu(gate) * up.
  float swiglu_limit = 0.0f;

  // Hybrid models (Qwen3-Next, Qwen3.5): Gated DeltaNet layers (linear attention with a
  // recurrent state per sequence) in every layer but each full_attention_interval-th one
  // (is_linear_layer(): (layer + 1) % interval != 0); 0: every layer is full attention.
  int64_t full_attention_interval = 0;
  int64_t linear_conv_kernel = 0;  // the causal convolution's width (d_conv)
  int64_t linear_num_key_heads = 0, linear_num_value_heads = 0;
  // Head sizes of the delta rule's keys and values (the state per value head is
  // [value_head_dim x key_head_dim]); llama.cpp and tandem need them equal.
  int64_t linear_key_head_dim = 0, linear_value_head_dim = 0;
  // Gated attention (Qwen3-Next, Qwen3.5): q_proj gives each head its query and an output gate,
  // [query | gate] per head; the attention output is multiplied by sigmoid(gate) before o_proj.
  bool attn_output_gate = false;
  // Qwen3.5's interleaved multi-section RoPE (HF rope_parameters.mrope_section with
  // mrope_interleaved, llama.cpp's rope.dimension_sections): which position (temporal, height,
  // width, extra) each rotary pair takes (ops::mrope_section_of); text tokens give the first three
  // the token's position and the extra one 0. All zero: plain RoPE.
  std::array<int64_t, 4> rope_sections{};

  // DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): a lightning indexer scores every earlier
  // position for each query (index_n_heads heads of index_head_dim, ReLU, weighted per head)
  // and MLA attends to the index_topk best only. 0: dense attention.
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  // GLM-5.2: the layers whose indexer is "shared" (HF indexer_types; llama.cpp's
  // attention.indexer.types) reuse the selection of the last layer before them with a full one
  // and have no indexer weights or keys; empty: every layer has its own.
  std::vector<int64_t> index_shared_layers;
  // The indexer's RoPE pairs: DeepSeek-V3.2's rotate the halves (NeoX), GLM-5's adjacent values
  // (llama.cpp's rope types of the two).
  bool index_rope_interleaved = false;

  bool is_mla() const { return kv_lora_rank > 0; }
  bool is_moe_layer(int64_t layer) const;
  bool is_linear_layer(int64_t layer) const {
    return full_attention_interval > 0 && layer >= 0 && layer < num_layers &&
           (layer + 1) % full_attention_interval != 0;
  }
  bool has_linear_layers() const { return full_attention_interval > 1; }
  // Floats of one DeltaNet layer's recurrent state per sequence: the convolution's last
  // (linear_conv_kernel - 1) inputs of every channel, then the delta rule's matrix per value head.
  int64_t linear_conv_channels() const {
    return 2 * linear_num_key_heads * linear_key_head_dim +
           linear_num_value_heads * linear_value_head_dim;
  }
  // A layer's index among the attention layers (its KV cache layer) or among the linear ones
  // (its recurrent state); every layer is an attention layer when there are no linear ones.
  int64_t kv_layer(int64_t layer) const {
    return has_linear_layers() ? layer / full_attention_interval : layer;
  }
  int64_t state_layer(int64_t layer) const {
    return has_linear_layers() ? layer - layer / full_attention_interval : 0;
  }
  int64_t num_attention_layers() const { return num_layers - num_linear_layers(); }
  int64_t num_linear_layers() const {
    return has_linear_layers() ? num_layers - num_layers / full_attention_interval : 0;
  }
  int64_t linear_state_floats() const {
    return (linear_conv_kernel - 1) * linear_conv_channels() +
           linear_num_value_heads * linear_value_head_dim * linear_key_head_dim;
  }
  bool is_swa_layer(int64_t layer) const {
    return sliding_window > 0 && swa_period > 0 && layer % swa_period < swa_period - 1;
  }
  int64_t num_moe_layers() const;
  int64_t q_head_dim() const { return head_dim; }
  bool has_indexer() const { return index_topk > 0; }
  // The layer computes its own selection (an indexer of its own): every layer of a sparse model
  // but GLM-5.2's shared ones.
  bool is_index_layer(int64_t layer) const;
  // A layer's index among the index layers (where its indexer keys are kept); for a shared
  // layer, the index layer whose selection it reuses (the last one before it).
  int64_t index_layer(int64_t layer) const;
  int64_t num_index_layers() const;
};

// Names of the fields that differ between a and b ("hidden_size: 2048 vs 1024"), empty when the
// two describe the same model. Floats compare to float32 rounding (relative 1e-6), since GGUF
// stores some of them derived (yarn_log_multiplier = 0.1 * mscale_all_dim).
std::vector<std::string> config_diff(const ModelConfig& a, const ModelConfig& b);

// Throws Error(kFormat) naming `source` when a field is out of range or inconsistent (the
// parsers call it; presets and hand-made configs can too).
void validate_config(const ModelConfig& config, std::string_view source);

// Reads an HF config.json (or a directory holding one). Errors name the file and the key:
// missing required keys, wrong JSON types, absurd sizes -> kFormat; an architecture or feature
// tandem does not implement -> kUnsupported naming it.
ModelConfig config_from_hf_json(const std::filesystem::path& config_json);
// Same, from JSON text; `source` names it in errors (fuzzing, tests).
ModelConfig config_from_hf_json_text(std::string_view json_text, std::string_view source);

// Reads the model hyperparameters of a GGUF file (arch from `general.architecture`).
ModelConfig config_from_gguf(const GgufFile& file);

// "tiny-<arch>" for every arch (the golden test models' shapes) and the released shapes
// "deepseek-v2-lite", "deepseek-v3", "kimi-k2", "deepseek-v3.2", "glm-5", "qwen3-30b-a3b",
// "qwen2-57b-a14b", "mixtral-8x7b", "glm-4.5-air", "glm-4.5", "minimax-m2", "gpt-oss-20b",
// "gpt-oss-120b", the Qwen3-Next / Qwen3.5 ones. Throws
// Error(kInvalidArgument) listing the names for an unknown one.
ModelConfig config_preset(std::string_view name);
std::vector<std::string> config_preset_names();

// The inverse of the readers: HF config.json text, and the GGUF model keys (`<arch>.*`, plus
// general.architecture) as llama.cpp's convert_hf_to_gguf.py writes them. The tokenizer keys,
// general.name and general.file_type are the caller's.
std::string config_to_hf_json(const ModelConfig& config);
void write_gguf_config(const ModelConfig& config, GgufWriter& writer);

// Parameter counts from the shapes: total, the routed experts' share, and what one token
// touches (everything but the routed experts, plus n_experts_per_tok experts per MoE layer).
struct ParamCount {
  int64_t total = 0;
  int64_t routed_experts = 0;
  int64_t active_per_token = 0;
  int64_t embedding = 0;  // token embedding + untied lm_head
};
ParamCount count_params(const ModelConfig& config);

}  // namespace tandem
