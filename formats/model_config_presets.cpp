// Named ModelConfigs: the golden test models' shapes ("tiny-<arch>") and released models.
//
// Sources of the released numbers: the models' config.json on Hugging Face. Qwen2-57B-A14B and
// the DeepSeek-V2-Lite / Kimi-K2 headline sizes were cross-checked against copies of those
// config.json files found in public repositories; the remaining values (rope scaling details,
// token ids, context lengths) are written from memory of the released files and should be
// re-checked against them before being relied on for anything but shapes.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "formats/model_config.h"
#include "formats/model_config_detail.h"

namespace tandem {
namespace {

ModelConfig deepseek_base(ModelArch arch) {
  ModelConfig c;
  c.arch = arch;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 10000.0f;
  return c;
}

void set_mla(ModelConfig& c, int64_t q_lora, int64_t kv_lora, int64_t nope, int64_t rope,
             int64_t v) {
  c.q_lora_rank = q_lora;
  c.kv_lora_rank = kv_lora;
  c.qk_nope_head_dim = nope;
  c.qk_rope_head_dim = rope;
  c.v_head_dim = v;
  c.head_dim = nope + rope;
  c.rope_dim = rope;
  c.num_kv_heads = c.num_heads;
}

void set_yarn(ModelConfig& c, float factor, int64_t original, float beta_fast, float beta_slow,
              float mscale, float mscale_all_dim) {
  c.rope_scaling.type = RopeScalingType::kYarn;
  c.rope_scaling.factor = factor;
  c.rope_scaling.original_max_position_embeddings = original;
  c.rope_scaling.beta_fast = beta_fast;
  c.rope_scaling.beta_slow = beta_slow;
  c.rope_scaling.mscale = mscale;
  c.rope_scaling.mscale_all_dim = mscale_all_dim;
}

// tests/data/golden/deepseek2-hf/config.json (DeepSeek-V2-Lite style, scaled down).
ModelConfig tiny_deepseek2() {
  ModelConfig c = deepseek_base(ModelArch::kDeepseek2);
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.num_layers = 3;
  c.num_heads = 2;
  set_mla(c, 0, 128, 64, 32, 64);
  c.intermediate_size = 128;
  c.moe_intermediate_size = 64;
  c.n_experts = 8;
  c.n_experts_per_tok = 2;
  c.n_shared_experts = 2;
  c.shared_expert_intermediate_size = 2 * 64;
  c.first_k_dense_replace = 1;
  c.max_position_embeddings = 4096;
  c.bos_token_id = 497;
  c.eos_token_id = 498;
  return c;
}

// tests/data/golden/deepseek3-hf/config.json (DeepSeek-V3 style, scaled down).
ModelConfig tiny_deepseek3() {
  ModelConfig c = tiny_deepseek2();
  c.arch = ModelArch::kDeepseek3;
  set_mla(c, 128, 128, 64, 32, 64);
  c.n_experts = 16;
  c.n_experts_per_tok = 4;
  c.n_shared_experts = 1;
  c.shared_expert_intermediate_size = 64;
  c.n_group = 4;
  c.topk_group = 2;
  detail::set_noaux_tc_routing(c);
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5f;
  return c;
}

// DeepSeek-V3.2 scaled down: tiny-deepseek3 with the lightning indexer (16 heads of 64, so that
// ReLU's zeros seldom tie; top 16, so that the 7-token golden prompt attends densely and the
// 40-token one sparsely) and one MTP layer.
ModelConfig tiny_deepseek32() {
  ModelConfig c = tiny_deepseek3();
  c.arch = ModelArch::kDeepseek32;
  c.index_n_heads = 16;
  c.index_head_dim = 64;
  c.index_topk = 16;
  c.nextn_layers = 1;
  return c;
}

// GLM-5.2 scaled down: tiny-deepseek32's MLA with GLM's routing (one group), the indexer's RoPE
// on adjacent pairs, and layer 2 sharing layer 1's selection (indexer_types full, full, shared,
// full).
ModelConfig tiny_glm_dsa() {
  ModelConfig c = tiny_deepseek32();
  c.arch = ModelArch::kGlmDsa;
  c.num_layers = 4;
  c.n_experts = 8;
  c.n_experts_per_tok = 2;
  c.n_group = 1;
  c.topk_group = 1;
  c.rms_norm_eps = 1e-5f;
  c.index_rope_interleaved = true;
  c.index_shared_layers = {2};
  return c;
}

ModelConfig tiny_qwen(ModelArch arch) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.intermediate_size = 512;
  c.moe_intermediate_size = 128;
  c.n_experts = 8;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 1000000.0f;
  c.bos_token_id = 497;
  c.eos_token_id = 498;
  if (arch == ModelArch::kQwen2Moe) {
    c.head_dim = 64;
    c.n_experts_per_tok = 4;
    c.shared_expert_intermediate_size = 128;
    c.n_shared_experts = 1;
    c.shared_expert_gate = true;
    c.attention_bias = true;
  } else {
    c.head_dim = 32;
    c.n_experts_per_tok = 2;
    c.norm_topk_prob = true;
    c.qk_norm = true;
  }
  c.v_head_dim = c.head_dim;
  c.rope_dim = c.head_dim;
  return c;
}

ModelConfig tiny_mixtral() {
  ModelConfig c;
  c.arch = ModelArch::kMixtral;
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 1;
  c.head_dim = c.v_head_dim = c.rope_dim = 64;
  c.intermediate_size = c.moe_intermediate_size = 128;
  c.n_experts = 8;
  c.n_experts_per_tok = 2;
  c.norm_topk_prob = true;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 1000000.0f;
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  return c;
}

// deepseek-ai/DeepSeek-V2-Lite.
ModelConfig deepseek_v2_lite() {
  ModelConfig c = deepseek_base(ModelArch::kDeepseek2);
  c.vocab_size = 102400;
  c.hidden_size = 2048;
  c.num_layers = 27;
  c.num_heads = 16;
  set_mla(c, 0, 512, 128, 64, 128);
  c.intermediate_size = 10944;
  c.moe_intermediate_size = 1408;
  c.n_experts = 64;
  c.n_experts_per_tok = 6;
  c.n_shared_experts = 2;
  c.shared_expert_intermediate_size = 2 * 1408;
  c.first_k_dense_replace = 1;
  c.max_position_embeddings = 163840;
  set_yarn(c, 40.0f, 4096, 32.0f, 1.0f, 0.707f, 0.707f);
  c.bos_token_id = 100000;
  c.eos_token_id = 100001;
  return c;
}

// deepseek-ai/DeepSeek-V3 (R1 has the same shapes). The MTP layer is not modelled.
ModelConfig deepseek_v3() {
  ModelConfig c = deepseek_base(ModelArch::kDeepseek3);
  c.vocab_size = 129280;
  c.hidden_size = 7168;
  c.num_layers = 61;
  c.num_heads = 128;
  set_mla(c, 1536, 512, 128, 64, 128);
  c.intermediate_size = 18432;
  c.moe_intermediate_size = 2048;
  c.n_experts = 256;
  c.n_experts_per_tok = 8;
  c.n_shared_experts = 1;
  c.shared_expert_intermediate_size = 2048;
  c.first_k_dense_replace = 3;
  c.n_group = 8;
  c.topk_group = 4;
  detail::set_noaux_tc_routing(c);
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5f;
  c.max_position_embeddings = 163840;
  set_yarn(c, 40.0f, 4096, 32.0f, 1.0f, 1.0f, 1.0f);
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  return c;
}

// deepseek-ai/DeepSeek-V3.2 (-Exp, -Speciale: the same shapes): V3 with the lightning indexer.
// The MTP layer is not modelled.
ModelConfig deepseek_v32() {
  ModelConfig c = deepseek_v3();
  c.arch = ModelArch::kDeepseek32;
  c.index_n_heads = 64;
  c.index_head_dim = 128;
  c.index_topk = 2048;
  return c;
}

// zai-org/GLM-5 (and 5.1; 5.2 adds a 1M context whose layers past the first two share every
// fourth one's indexer). The MTP layer is not modelled.
ModelConfig glm5() {
  ModelConfig c = deepseek_base(ModelArch::kGlmDsa);
  c.vocab_size = 154880;
  c.hidden_size = 6144;
  c.num_layers = 78;
  c.num_heads = 64;
  set_mla(c, 2048, 512, 192, 64, 256);
  c.intermediate_size = 12288;
  c.moe_intermediate_size = 2048;
  c.n_experts = 256;
  c.n_experts_per_tok = 8;
  c.n_shared_experts = 1;
  c.shared_expert_intermediate_size = 2048;
  c.first_k_dense_replace = 3;
  detail::set_noaux_tc_routing(c);
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5f;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 1000000.0f;
  c.max_position_embeddings = 202752;
  c.index_n_heads = 32;
  c.index_head_dim = 128;
  c.index_topk = 2048;
  c.index_rope_interleaved = true;
  c.bos_token_id = -1;
  c.eos_token_id = 154820;
  return c;
}

// moonshotai/Kimi-K2-Instruct (the first release; the 0905 update has 256K context, yarn 64).
ModelConfig kimi_k2() {
  ModelConfig c = deepseek_v3();
  c.vocab_size = 163840;
  c.num_heads = 64;
  set_mla(c, 1536, 512, 128, 64, 128);
  c.n_experts = 384;
  c.first_k_dense_replace = 1;
  c.n_group = 1;
  c.topk_group = 1;
  c.routed_scaling_factor = 2.827f;
  c.rope_theta = 50000.0f;
  c.max_position_embeddings = 131072;
  set_yarn(c, 32.0f, 4096, 1.0f, 1.0f, 1.0f, 1.0f);
  c.bos_token_id = 163584;
  c.eos_token_id = 163585;
  return c;
}

// Qwen/Qwen3-30B-A3B.
ModelConfig qwen3_30b_a3b() {
  ModelConfig c = tiny_qwen(ModelArch::kQwen3Moe);
  c.vocab_size = 151936;
  c.hidden_size = 2048;
  c.num_layers = 48;
  c.num_heads = 32;
  c.num_kv_heads = 4;
  c.head_dim = c.v_head_dim = c.rope_dim = 128;
  c.intermediate_size = 6144;
  c.moe_intermediate_size = 768;
  c.n_experts = 128;
  c.n_experts_per_tok = 8;
  c.max_position_embeddings = 40960;
  c.bos_token_id = 151643;
  c.eos_token_id = 151645;
  return c;
}

// Qwen/Qwen2-57B-A14B.
ModelConfig qwen2_57b_a14b() {
  ModelConfig c = tiny_qwen(ModelArch::kQwen2Moe);
  c.vocab_size = 151936;
  c.hidden_size = 3584;
  c.num_layers = 28;
  c.num_heads = 28;
  c.num_kv_heads = 4;
  c.head_dim = c.v_head_dim = c.rope_dim = 128;
  c.intermediate_size = 18944;
  c.moe_intermediate_size = 2560;
  c.shared_expert_intermediate_size = 20480;
  c.n_experts = 64;
  c.n_experts_per_tok = 8;
  c.max_position_embeddings = 131072;
  c.bos_token_id = 151643;
  c.eos_token_id = 151643;
  return c;
}

// mistralai/Mixtral-8x7B-v0.1.
ModelConfig mixtral_8x7b() {
  ModelConfig c = tiny_mixtral();
  c.vocab_size = 32000;
  c.hidden_size = 4096;
  c.num_layers = 32;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = c.v_head_dim = c.rope_dim = 128;
  c.intermediate_size = c.moe_intermediate_size = 14336;
  c.max_position_embeddings = 32768;
  return c;
}

// A GLM-4.5 scaled down: one leading dense layer, a shared expert, sigmoid routing with scaling,
// q/k/v biases and q/k norms (GLM-4.5; Air has none), half the head rotated, one MTP layer.
ModelConfig tiny_glm4moe() {
  ModelConfig c;
  c.arch = ModelArch::kGlm4Moe;
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = c.v_head_dim = 64;
  c.rope_dim = 32;
  c.intermediate_size = 128;
  c.moe_intermediate_size = 64;
  c.n_experts = 8;
  c.n_experts_per_tok = 2;
  c.n_shared_experts = 1;
  c.shared_expert_intermediate_size = 64;
  c.first_k_dense_replace = 1;
  detail::set_noaux_tc_routing(c);
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5f;
  c.attention_bias = true;
  c.qk_norm = true;
  c.nextn_layers = 1;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 1000000.0f;
  c.bos_token_id = 497;
  c.eos_token_id = 498;
  return c;
}

// zai-org/GLM-4.5-Air.
ModelConfig glm45_air() {
  ModelConfig c = tiny_glm4moe();
  c.vocab_size = 151552;
  c.hidden_size = 4096;
  c.num_layers = 46;
  c.num_heads = 96;
  c.num_kv_heads = 8;
  c.head_dim = c.v_head_dim = 128;
  c.rope_dim = 64;
  c.intermediate_size = 10944;
  c.moe_intermediate_size = 1408;
  c.shared_expert_intermediate_size = 1408;
  c.n_experts = 128;
  c.n_experts_per_tok = 8;
  c.routed_scaling_factor = 1.0f;
  c.qk_norm = false;
  c.max_position_embeddings = 131072;
  c.bos_token_id = -1;
  c.eos_token_id = 151329;
  return c;
}

// zai-org/GLM-4.5 (GLM-4.6 has the same shapes, 200K context).
ModelConfig glm45() {
  ModelConfig c = glm45_air();
  c.hidden_size = 5120;
  c.num_layers = 92;
  c.intermediate_size = 12288;
  c.moe_intermediate_size = 1536;
  c.shared_expert_intermediate_size = 1536;
  c.n_experts = 160;
  c.first_k_dense_replace = 3;
  c.routed_scaling_factor = 2.5f;
  c.qk_norm = true;
  return c;
}

// MiniMax-M2 scaled down: q/k RMSNorm over all heads, half the head rotated, sigmoid routing
// with a selection bias, no shared expert, every layer MoE.
ModelConfig tiny_minimax_m2() {
  ModelConfig c;
  c.arch = ModelArch::kMiniMaxM2;
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = c.v_head_dim = 64;
  c.rope_dim = 32;
  c.intermediate_size = c.moe_intermediate_size = 64;
  c.n_experts = 8;
  c.n_experts_per_tok = 2;
  detail::set_noaux_tc_routing(c);
  c.norm_topk_prob = true;
  c.qk_norm = true;
  c.qk_norm_all_heads = true;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 5000000.0f;
  c.bos_token_id = 497;
  c.eos_token_id = 498;
  return c;
}

// MiniMaxAI/MiniMax-M2 (the MTP modules are not in the released weights).
ModelConfig minimax_m2() {
  ModelConfig c = tiny_minimax_m2();
  c.vocab_size = 200064;
  c.hidden_size = 3072;
  c.num_layers = 62;
  c.num_heads = 48;
  c.num_kv_heads = 8;
  c.head_dim = c.v_head_dim = 128;
  c.rope_dim = 64;
  c.intermediate_size = c.moe_intermediate_size = 1536;
  c.n_experts = 256;
  c.n_experts_per_tok = 8;
  c.max_position_embeddings = 196608;
  c.bos_token_id = -1;
  c.eos_token_id = 200020;
  return c;
}

// gpt-oss scaled down: alternating windowed (8 positions, so the golden prompts reach past it)
// and full attention with sinks, YaRN, biases on attention, router and experts, the clamped
// SwiGLU, softmax over the top-k router logits.
ModelConfig tiny_gpt_oss() {
  ModelConfig c;
  c.arch = ModelArch::kGptOss;
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.num_layers = 4;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = c.v_head_dim = c.rope_dim = 64;
  c.intermediate_size = c.moe_intermediate_size = 64;
  c.n_experts = 8;
  c.n_experts_per_tok = 2;
  c.norm_topk_prob = true;
  c.attention_bias = true;
  c.attn_sinks = true;
  c.swiglu_limit = 7.0f;
  c.sliding_window = 8;
  c.swa_period = 2;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 150000.0f;
  c.rope_scaling.type = RopeScalingType::kYarn;
  c.rope_scaling.factor = 32.0f;
  c.rope_scaling.original_max_position_embeddings = 4096;
  c.max_position_embeddings = 131072;
  c.bos_token_id = 497;
  c.eos_token_id = 498;
  return c;
}

// openai/gpt-oss-20b and gpt-oss-120b.
ModelConfig gpt_oss_20b() {
  ModelConfig c = tiny_gpt_oss();
  c.vocab_size = 201088;
  c.hidden_size = 2880;
  c.num_layers = 24;
  c.num_heads = 64;
  c.num_kv_heads = 8;
  c.intermediate_size = c.moe_intermediate_size = 2880;
  c.n_experts = 32;
  c.n_experts_per_tok = 4;
  c.sliding_window = 128;
  c.bos_token_id = -1;
  c.eos_token_id = 200002;
  return c;
}
ModelConfig gpt_oss_120b() {
  ModelConfig c = gpt_oss_20b();
  c.num_layers = 36;
  c.n_experts = 128;
  return c;
}

// The golden Qwen3-Next / Qwen3.5-MoE shapes: 4 layers (three Gated DeltaNet, then gated
// attention), experts 64 wide (as the DeepSeek goldens: a smaller directory), 2 key heads shared by 4 value heads in the delta rule (its GQA-like grouping),
// a quarter of each 64-value attention head rotated; Qwen3.5's 8 rotary pairs in sections of
// 3 / 3 / 2 (every pair with a position, as Qwen3.5's 11 / 11 / 10 of 32) and an MTP layer.
ModelConfig tiny_qwen_hybrid(ModelArch arch) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.num_layers = 4;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = c.v_head_dim = 64;
  c.rope_dim = 16;
  c.intermediate_size = c.moe_intermediate_size = 64;
  c.shared_expert_intermediate_size = 64;
  c.n_shared_experts = 1;
  c.shared_expert_gate = true;
  c.n_experts = 8;
  c.n_experts_per_tok = 2;
  c.norm_topk_prob = true;
  c.qk_norm = true;
  c.attn_output_gate = true;
  c.full_attention_interval = 4;
  c.linear_conv_kernel = 4;
  c.linear_num_key_heads = 2;
  c.linear_num_value_heads = 4;
  c.linear_key_head_dim = c.linear_value_head_dim = 32;
  c.max_position_embeddings = 8192;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 10000000.0f;
  c.bos_token_id = 497;
  c.eos_token_id = 498;
  if (arch == ModelArch::kQwen35Moe) {
    c.rope_sections = {3, 3, 2, 0};
    c.nextn_layers = 1;
  }
  return c;
}

// Qwen/Qwen3-Next-80B-A3B-Instruct (Qwen3-Coder-Next has the same shapes).
ModelConfig qwen3_next_80b_a3b() {
  ModelConfig c = tiny_qwen_hybrid(ModelArch::kQwen3Next);
  c.vocab_size = 151936;
  c.hidden_size = 2048;
  c.num_layers = 48;
  c.num_heads = 16;
  c.num_kv_heads = 2;
  c.head_dim = c.v_head_dim = 256;
  c.rope_dim = 64;
  c.intermediate_size = 5120;
  c.moe_intermediate_size = 512;
  c.shared_expert_intermediate_size = 512;
  c.n_experts = 512;
  c.n_experts_per_tok = 10;
  c.linear_num_key_heads = 16;
  c.linear_num_value_heads = 32;
  c.linear_key_head_dim = c.linear_value_head_dim = 128;
  c.max_position_embeddings = 262144;
  c.bos_token_id = 151643;
  c.eos_token_id = 151645;
  return c;
}

// Qwen/Qwen3.5-35B-A3B (Qwen3.6-35B-A3B has the same shapes), Qwen3.5-122B-A10B and
// Qwen3.5-397B-A17B: the text model.
ModelConfig qwen35_35b_a3b() {
  ModelConfig c = tiny_qwen_hybrid(ModelArch::kQwen35Moe);
  c.vocab_size = 248320;
  c.hidden_size = 2048;
  c.num_layers = 40;
  c.num_heads = 16;
  c.num_kv_heads = 2;
  c.head_dim = c.v_head_dim = 256;
  c.rope_dim = 64;
  c.rope_sections = {11, 11, 10, 0};
  c.intermediate_size = c.moe_intermediate_size = 512;
  c.shared_expert_intermediate_size = 512;
  c.n_experts = 256;
  c.n_experts_per_tok = 8;
  c.linear_num_key_heads = 16;
  c.linear_num_value_heads = 32;
  c.linear_key_head_dim = c.linear_value_head_dim = 128;
  c.max_position_embeddings = 262144;
  c.bos_token_id = -1;
  c.eos_token_id = 248044;
  return c;
}
ModelConfig qwen35_122b_a10b() {
  ModelConfig c = qwen35_35b_a3b();
  c.hidden_size = 3072;
  c.num_layers = 48;
  c.num_heads = 32;
  c.intermediate_size = c.moe_intermediate_size = 1024;
  c.shared_expert_intermediate_size = 1024;
  c.linear_num_value_heads = 64;
  return c;
}
ModelConfig qwen35_397b_a17b() {
  ModelConfig c = qwen35_35b_a3b();
  c.hidden_size = 4096;
  c.num_layers = 60;
  c.num_heads = 32;
  c.intermediate_size = c.moe_intermediate_size = 1024;
  c.shared_expert_intermediate_size = 1024;
  c.n_experts = 512;
  c.n_experts_per_tok = 10;
  c.linear_num_value_heads = 64;
  return c;
}

struct Preset {
  const char* name;
  ModelConfig (*make)();
};
const Preset kPresets[] = {
    {"tiny-deepseek2", tiny_deepseek2},
    {"tiny-deepseek3", tiny_deepseek3},
    {"tiny-qwen2moe", [] { return tiny_qwen(ModelArch::kQwen2Moe); }},
    {"tiny-qwen3moe", [] { return tiny_qwen(ModelArch::kQwen3Moe); }},
    {"tiny-mixtral", tiny_mixtral},
    {"tiny-glm4moe", tiny_glm4moe},
    {"tiny-minimax-m2", tiny_minimax_m2},
    {"tiny-gpt-oss", tiny_gpt_oss},
    {"tiny-qwen3next", [] { return tiny_qwen_hybrid(ModelArch::kQwen3Next); }},
    {"tiny-qwen35moe", [] { return tiny_qwen_hybrid(ModelArch::kQwen35Moe); }},
    {"tiny-deepseek32", tiny_deepseek32},
    {"tiny-glm-dsa", tiny_glm_dsa},
    {"deepseek-v2-lite", deepseek_v2_lite},
    {"deepseek-v3", deepseek_v3},
    {"kimi-k2", kimi_k2},
    {"deepseek-v3.2", deepseek_v32},
    {"glm-5", glm5},
    {"qwen3-30b-a3b", qwen3_30b_a3b},
    {"qwen2-57b-a14b", qwen2_57b_a14b},
    {"mixtral-8x7b", mixtral_8x7b},
    {"glm-4.5-air", glm45_air},
    {"glm-4.5", glm45},
    {"minimax-m2", minimax_m2},
    {"gpt-oss-20b", gpt_oss_20b},
    {"gpt-oss-120b", gpt_oss_120b},
    {"qwen3-next-80b-a3b", qwen3_next_80b_a3b},
    {"qwen3.5-35b-a3b", qwen35_35b_a3b},
    {"qwen3.5-122b-a10b", qwen35_122b_a10b},
    {"qwen3.5-397b-a17b", qwen35_397b_a17b},
};

}  // namespace

ModelConfig config_preset(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) {
      ModelConfig c = p.make();
      validate_config(c, fmt::format("preset '{}'", name));
      return c;
    }
  }
  fail(ErrorKind::kInvalidArgument, "unknown model preset '{}' (known: {})", name,
       fmt::join(config_preset_names(), ", "));
}

std::vector<std::string> config_preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

}  // namespace tandem
