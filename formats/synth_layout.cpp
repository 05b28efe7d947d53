// The tensor layouts of the supported architectures in both formats, the HF -> GGUF row mapping,
// llama-quantize's per-tensor type choice, and the value generator.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/fp_convert.h"
#include "formats/model_config_detail.h"
#include "formats/synth.h"
#include "formats/synth_detail.h"

namespace tandem {

namespace detail {

void GgufBuilder::direct(std::string name, const std::string& hf_name, float offset,
                         std::optional<std::vector<int64_t>> shape) {
  const size_t i = index(hf_name);
  const int64_t cols = index.spec(i).shape.back();
  GgufTensorSpec t{std::move(name), shape ? *shape : index.spec(i).shape, index.spec(i).role,
                   [i, cols](int64_t r) {
                     return HfRowRef{i, r * cols, 1};
                   }};
  t.offset = offset;
  specs.push_back(std::move(t));
}

void GgufBuilder::stacked(std::string name, int64_t n_experts, const std::string& prefix,
                          const std::string& suffix) {
  std::vector<size_t> ids;
  for (int64_t e = 0; e < n_experts; ++e) {
    ids.push_back(index(fmt::format("{}{}{}", prefix, e, suffix)));
  }
  const std::vector<int64_t>& s = index.spec(ids[0]).shape;
  const int64_t rows = s[0], cols = s[1];
  specs.push_back(
      {std::move(name), {n_experts, rows, cols}, WeightRole::kLinear, [ids, rows, cols](int64_t r) {
         return HfRowRef{ids[r / rows], (r % rows) * cols, 1};
       }});
}

}  // namespace detail

namespace {

using detail::GgufBuilder;
using detail::HfBuilder;
using detail::is_deepseek;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// ---- HF layout (transformers' names and shapes) ----

// The gate / up / down projections of an FFN of `width` under prefix q.
void hf_ffn(HfBuilder& b, int64_t h, const std::string& q, int64_t width, const char* gate,
            const char* up, const char* down) {
  b.add(q + gate + ".weight", {width, h}, WeightRole::kLinear, h);
  b.add(q + up + ".weight", {width, h}, WeightRole::kLinear, h);
  b.add(q + down + ".weight", {h, width}, WeightRole::kLinear, width);
}

// A multi-token-prediction layer's input projection and norms (before its decoder layer).
void hf_mtp_inputs(HfBuilder& b, int64_t h, const std::string& p) {
  b.add(p + "eh_proj.weight", {h, 2 * h}, WeightRole::kLinear, 2 * h);
  b.add(p + "enorm.weight", {h}, WeightRole::kNorm);
  b.add(p + "hnorm.weight", {h}, WeightRole::kNorm);
  b.add(p + "shared_head.norm.weight", {h}, WeightRole::kNorm);
}

// MLA under prefix a: q (through the q LoRA, or direct), the compressed KV and its norm, kv_b,
// the output.
void hf_mla_attention(HfBuilder& b, const ModelConfig& c, const std::string& a) {
  const int64_t h = c.hidden_size, q_out = c.num_heads * c.head_dim;
  if (c.q_lora_rank > 0) {
    b.add(a + "q_a_proj.weight", {c.q_lora_rank, h}, WeightRole::kLinear, h);
    b.add(a + "q_a_layernorm.weight", {c.q_lora_rank}, WeightRole::kNorm);
    b.add(a + "q_b_proj.weight", {q_out, c.q_lora_rank}, WeightRole::kLinear, c.q_lora_rank);
  } else {
    b.add(a + "q_proj.weight", {q_out, h}, WeightRole::kLinear, h);
  }
  b.add(a + "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, h},
        WeightRole::kLinear, h);
  b.add(a + "kv_a_layernorm.weight", {c.kv_lora_rank}, WeightRole::kNorm);
  b.add(a + "kv_b_proj.weight", {c.num_heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank},
        WeightRole::kLinear, c.kv_lora_rank);
  b.add(a + "o_proj.weight", {h, c.num_heads * c.v_head_dim}, WeightRole::kLinear,
        c.num_heads * c.v_head_dim);
}

// DeepSeek Sparse Attention's lightning indexer under prefix x.
void hf_indexer(HfBuilder& b, const ModelConfig& c, const std::string& x) {
  const int64_t h = c.hidden_size, d = c.index_head_dim;
  b.add(x + "wq_b.weight", {c.index_n_heads * d, c.q_lora_rank}, WeightRole::kLinear,
        c.q_lora_rank);
  b.add(x + "wk.weight", {d, h}, WeightRole::kLinear, h);
  b.add(x + "k_norm.weight", {d}, WeightRole::kNorm);
  b.add(x + "k_norm.bias", {d}, WeightRole::kBias);
  b.add(x + "weights_proj.weight", {c.index_n_heads, h}, WeightRole::kLinear, h);
}

// Grouped-query attention under prefix a: q / k / v / o, their biases, gpt-oss's output bias and
// sinks, the q/k norms.
void hf_attention(HfBuilder& b, const ModelConfig& c, const std::string& a) {
  const int64_t h = c.hidden_size;
  const int64_t q_out = c.num_heads * c.head_dim, kv_out = c.num_kv_heads * c.head_dim;
  const int64_t v_out = c.num_kv_heads * c.v_head_dim;
  b.add(a + "q_proj.weight", {q_out, h}, WeightRole::kLinear, h);
  b.add(a + "k_proj.weight", {kv_out, h}, WeightRole::kLinear, h);
  b.add(a + "v_proj.weight", {v_out, h}, WeightRole::kLinear, h);
  b.add(a + "o_proj.weight", {h, c.num_heads * c.v_head_dim}, WeightRole::kLinear,
        c.num_heads * c.v_head_dim);
  if (c.attention_bias) {
    b.add(a + "q_proj.bias", {q_out}, WeightRole::kBias);
    b.add(a + "k_proj.bias", {kv_out}, WeightRole::kBias);
    b.add(a + "v_proj.bias", {v_out}, WeightRole::kBias);
  }
  if (c.arch == ModelArch::kGptOss) {
    b.add(a + "o_proj.bias", {h}, WeightRole::kBias);
    b.add(a + "sinks", {c.num_heads}, WeightRole::kSink);
  }
  if (c.qk_norm) {
    b.add(a + "q_norm.weight", {c.qk_norm_all_heads ? q_out : c.head_dim}, WeightRole::kNorm);
    b.add(a + "k_norm.weight", {c.qk_norm_all_heads ? kv_out : c.head_dim}, WeightRole::kNorm);
  }
}

// gpt-oss's router and experts under prefix m, stacked as transformers' GptOssExperts holds them
// (the BF16 checkpoints): gate_up_proj [E, hidden, 2 ff] with gate and up interleaved along the
// last dimension, down_proj [E, ff, hidden]; x @ W, so each is the transpose of an [out, in]
// weight.
void hf_gpt_oss_experts(HfBuilder& b, const ModelConfig& c, const std::string& m) {
  const int64_t h = c.hidden_size, f = c.moe_intermediate_size;
  b.add(m + "router.weight", {c.n_experts, h}, WeightRole::kRouter, h);
  b.add(m + "router.bias", {c.n_experts}, WeightRole::kBias);
  b.add(m + "experts.gate_up_proj", {c.n_experts, h, 2 * f}, WeightRole::kLinear, h);
  b.add(m + "experts.gate_up_proj_bias", {c.n_experts, 2 * f}, WeightRole::kBias);
  b.add(m + "experts.down_proj", {c.n_experts, f, h}, WeightRole::kLinear, f);
  b.add(m + "experts.down_proj_bias", {c.n_experts, h}, WeightRole::kBias);
}

// Mixtral's and MiniMax-M2's block_sparse_moe under prefix m: the router, the selection bias,
// the experts' w1 / w3 / w2.
void hf_block_sparse_moe(HfBuilder& b, const ModelConfig& c, const std::string& m) {
  const int64_t h = c.hidden_size;
  b.add(m + "gate.weight", {c.n_experts, h}, WeightRole::kRouter, h);
  if (c.has_e_score_correction_bias) {
    b.add(m + "e_score_correction_bias", {c.n_experts}, WeightRole::kScoreBias);
  }
  for (int64_t e = 0; e < c.n_experts; ++e) {
    hf_ffn(b, h, fmt::format("{}experts.{}.", m, e), c.moe_intermediate_size, "w1", "w3", "w2");
  }
}

// The mlp of DeepSeek, Qwen and GLM-4.5 under prefix m: the router, the selection bias, the
// experts, the shared expert(s) (Qwen2-MoE's gated).
void hf_moe(HfBuilder& b, const ModelConfig& c, const std::string& m) {
  const int64_t h = c.hidden_size;
  b.add(m + "gate.weight", {c.n_experts, h}, WeightRole::kRouter, h);
  if (c.has_e_score_correction_bias) {
    b.add(m + "gate.e_score_correction_bias", {c.n_experts}, WeightRole::kScoreBias);
  }
  for (int64_t e = 0; e < c.n_experts; ++e) {
    hf_ffn(b, h, fmt::format("{}experts.{}.", m, e), c.moe_intermediate_size, "gate_proj",
           "up_proj", "down_proj");
  }
  if (c.shared_expert_intermediate_size <= 0) return;
  if (is_deepseek(c.arch) || c.arch == ModelArch::kGlm4Moe) {
    hf_ffn(b, h, m + "shared_experts.", c.shared_expert_intermediate_size, "gate_proj", "up_proj",
           "down_proj");
  } else {
    b.add(m + "shared_expert_gate.weight", {1, h}, WeightRole::kRouter, h);
    hf_ffn(b, h, m + "shared_expert.", c.shared_expert_intermediate_size, "gate_proj", "up_proj",
           "down_proj");
  }
}

// Decoder layer l: a multi-token-prediction layer (l >= num_layers: GLM-4.5, DeepSeek-V3.2,
// GLM-5) is a MoE decoder layer plus its input projections.
void hf_decoder_layer(HfBuilder& b, const ModelConfig& c, int64_t l) {
  const int64_t h = c.hidden_size;
  const std::string p = fmt::format("model.layers.{}.", l), a = p + "self_attn.";
  const bool mtp = l >= c.num_layers;
  if (mtp) hf_mtp_inputs(b, h, p);
  b.add(p + "input_layernorm.weight", {h}, WeightRole::kNorm);
  b.add(p + "post_attention_layernorm.weight", {h}, WeightRole::kNorm);
  if (c.is_mla()) {
    hf_mla_attention(b, c, a);
    // (The MTP layer has an indexer too.)
    if (c.is_index_layer(l) || (mtp && c.has_indexer())) hf_indexer(b, c, a + "indexer.");
  } else {
    hf_attention(b, c, a);
  }
  if (!mtp && !c.is_moe_layer(l)) {
    hf_ffn(b, h, p + "mlp.", c.intermediate_size, "gate_proj", "up_proj", "down_proj");
  } else if (c.arch == ModelArch::kGptOss) {
    hf_gpt_oss_experts(b, c, p + "mlp.");
  } else if (c.arch == ModelArch::kMixtral || c.arch == ModelArch::kMiniMaxM2) {
    hf_block_sparse_moe(b, c, p + "block_sparse_moe.");
  } else {
    hf_moe(b, c, p + "mlp.");
  }
}

// ---- GGUF layout (convert_hf_to_gguf.py's names, each row mapped to its HF source) ----

// A multi-token-prediction layer's input projection and norms.
void gguf_mtp_inputs(GgufBuilder& b, const std::string& g, const std::string& p) {
  b.direct(g + "nextn.eh_proj.weight", p + "eh_proj.weight");
  b.direct(g + "nextn.enorm.weight", p + "enorm.weight");
  b.direct(g + "nextn.hnorm.weight", p + "hnorm.weight");
  b.direct(g + "nextn.shared_head_norm.weight", p + "shared_head.norm.weight");
}

// MLA's kv_b [heads * (nope + v), kv_lora] split per head into K rows then V rows; K is stored
// transposed: attn_k_b [heads, kv_lora, nope], attn_v_b [heads, v, kv_lora].
void gguf_kv_b_split(GgufBuilder& b, const ModelConfig& c, const std::string& g,
                     const std::string& a) {
  const size_t kv = b.index(a + "kv_b_proj.weight");
  const int64_t lora = c.kv_lora_rank, nope = c.qk_nope_head_dim, vd = c.v_head_dim;
  b.add({g + "attn_k_b.weight",
         {c.num_heads, lora, nope},
         WeightRole::kLinear,
         [kv, lora, nope, vd](int64_t r) {
           const int64_t head = r / lora, col = r % lora;
           return HfRowRef{kv, head * (nope + vd) * lora + col, lora};
         }});
  b.add({g + "attn_v_b.weight",
         {c.num_heads, vd, lora},
         WeightRole::kLinear,
         [kv, lora, nope, vd](int64_t r) {
           const int64_t head = r / vd, d = r % vd;
           return HfRowRef{kv, (head * (nope + vd) + nope + d) * lora, 1};
         }});
}

// MLA from the HF prefix a: q (LoRA or direct), the compressed KV and its norm, kv_b split, the
// output.
void gguf_mla_attention(GgufBuilder& b, const ModelConfig& c, const std::string& g,
                        const std::string& a) {
  if (c.q_lora_rank > 0) {
    b.direct(g + "attn_q_a.weight", a + "q_a_proj.weight");
    b.direct(g + "attn_q_a_norm.weight", a + "q_a_layernorm.weight");
    b.direct(g + "attn_q_b.weight", a + "q_b_proj.weight");
  } else {
    b.direct(g + "attn_q.weight", a + "q_proj.weight");
  }
  b.direct(g + "attn_kv_a_mqa.weight", a + "kv_a_proj_with_mqa.weight");
  b.direct(g + "attn_kv_a_norm.weight", a + "kv_a_layernorm.weight");
  gguf_kv_b_split(b, c, g, a);
  b.direct(g + "attn_output.weight", a + "o_proj.weight");
}

// The lightning indexer from the HF prefix x.
void gguf_indexer(GgufBuilder& b, const std::string& g, const std::string& x) {
  b.direct(g + "indexer.attn_q_b.weight", x + "wq_b.weight");
  b.direct(g + "indexer.attn_k.weight", x + "wk.weight");
  b.direct(g + "indexer.k_norm.weight", x + "k_norm.weight");
  b.direct(g + "indexer.k_norm.bias", x + "k_norm.bias");
  b.direct(g + "indexer.proj.weight", x + "weights_proj.weight");
}

// llama.cpp's rope layout for Mixtral q/k: per head, rows (j, i) become (i, j).
void gguf_permuted(GgufBuilder& b, std::string name, const std::string& hf_name, int64_t heads) {
  const size_t i = b.index(hf_name);
  const int64_t cols = b.index.spec(i).shape.back();
  const int64_t hd = b.index.spec(i).shape[0] / heads;
  b.add({std::move(name), b.index.spec(i).shape, WeightRole::kLinear, [i, cols, hd](int64_t r) {
           const int64_t head = r / hd, w = r % hd;
           const int64_t src = head * hd + (w % 2) * (hd / 2) + w / 2;
           return HfRowRef{i, src * cols, 1};
         }});
}

// Grouped-query attention from the HF prefix a (Mixtral's q / k permuted for llama.cpp's rope).
void gguf_attention(GgufBuilder& b, const ModelConfig& c, const std::string& g,
                    const std::string& a) {
  if (c.arch == ModelArch::kMixtral) {
    gguf_permuted(b, g + "attn_q.weight", a + "q_proj.weight", c.num_heads);
    gguf_permuted(b, g + "attn_k.weight", a + "k_proj.weight", c.num_kv_heads);
  } else {
    b.direct(g + "attn_q.weight", a + "q_proj.weight");
    b.direct(g + "attn_k.weight", a + "k_proj.weight");
  }
  b.direct(g + "attn_v.weight", a + "v_proj.weight");
  if (c.attention_bias) {
    b.direct(g + "attn_q.bias", a + "q_proj.bias");
    b.direct(g + "attn_k.bias", a + "k_proj.bias");
    b.direct(g + "attn_v.bias", a + "v_proj.bias");
  }
  b.direct(g + "attn_output.weight", a + "o_proj.weight");
  if (c.arch == ModelArch::kGptOss) {
    b.direct(g + "attn_output.bias", a + "o_proj.bias");
    b.direct(g + "attn_sinks.weight", a + "sinks");
  }
  if (c.qk_norm) {
    b.direct(g + "attn_q_norm.weight", a + "q_norm.weight");
    b.direct(g + "attn_k_norm.weight", a + "k_norm.weight");
  }
}

// convert_hf_to_gguf.py's GptOssModel: gate / up from the interleaved columns (even / odd), each
// matrix transposed to [E, out, in]; the biases split the same way.
void gguf_gpt_oss_experts(GgufBuilder& b, const ModelConfig& c, const std::string& g,
                          const std::string& m) {
  const int64_t e = c.n_experts, f = c.moe_intermediate_size, h = c.hidden_size;
  b.direct(g + "ffn_gate_inp.weight", m + "router.weight");
  b.direct(g + "ffn_gate_inp.bias", m + "router.bias");
  const size_t gu = b.index(m + "experts.gate_up_proj");
  const size_t gub = b.index(m + "experts.gate_up_proj_bias");
  const size_t dn = b.index(m + "experts.down_proj");
  for (const int odd : {0, 1}) {
    const std::string which = odd ? "ffn_up_exps" : "ffn_gate_exps";
    // Row (expert x, j) of [E, f, h]: column 2 j + odd of gate_up_proj[x] (stride 2 f).
    b.add({g + which + ".weight", {e, f, h}, WeightRole::kLinear, [gu, f, h, odd](int64_t r) {
             return HfRowRef{gu, (r / f) * h * 2 * f + 2 * (r % f) + odd, 2 * f};
           }});
    b.add({g + which + ".bias", {e, f}, WeightRole::kBias, [gub, f, odd](int64_t r) {
             return HfRowRef{gub, r * 2 * f + odd, 2};
           }});
  }
  // Row (expert x, i) of [E, h, f]: column i of down_proj[x] [f, h] (stride h).
  b.add({g + "ffn_down_exps.weight", {e, h, f}, WeightRole::kLinear, [dn, f, h](int64_t r) {
           return HfRowRef{dn, (r / h) * f * h + r % h, h};
         }});
  b.direct(g + "ffn_down_exps.bias", m + "experts.down_proj_bias");
}

// Mixtral's and MiniMax-M2's block_sparse_moe: the router, the selection bias, the experts.
void gguf_block_sparse_moe(GgufBuilder& b, const ModelConfig& c, const std::string& g,
                           const std::string& m) {
  b.direct(g + "ffn_gate_inp.weight", m + "gate.weight");
  if (c.has_e_score_correction_bias) {
    b.direct(g + "exp_probs_b.bias", m + "e_score_correction_bias");
  }
  b.stacked(g + "ffn_gate_exps.weight", c.n_experts, m + "experts.", ".w1.weight");
  b.stacked(g + "ffn_down_exps.weight", c.n_experts, m + "experts.", ".w2.weight");
  b.stacked(g + "ffn_up_exps.weight", c.n_experts, m + "experts.", ".w3.weight");
}

// The mlp of DeepSeek, Qwen and GLM-4.5: the router, the selection bias, the experts, the
// shared expert(s) (Qwen2-MoE's gate a vector).
void gguf_moe(GgufBuilder& b, const ModelConfig& c, const std::string& g, const std::string& m) {
  b.direct(g + "ffn_gate_inp.weight", m + "gate.weight");
  if (c.has_e_score_correction_bias) {
    b.direct(g + "exp_probs_b.bias", m + "gate.e_score_correction_bias");
  }
  b.stacked(g + "ffn_gate_exps.weight", c.n_experts, m + "experts.", ".gate_proj.weight");
  b.stacked(g + "ffn_down_exps.weight", c.n_experts, m + "experts.", ".down_proj.weight");
  b.stacked(g + "ffn_up_exps.weight", c.n_experts, m + "experts.", ".up_proj.weight");
  if (c.shared_expert_intermediate_size <= 0) return;
  const bool plural = is_deepseek(c.arch) || c.arch == ModelArch::kGlm4Moe;
  const std::string s = m + (plural ? "shared_experts." : "shared_expert.");
  if (!plural) {
    b.direct(g + "ffn_gate_inp_shexp.weight", m + "shared_expert_gate.weight", 0.0f,
             std::vector<int64_t>{c.hidden_size});
  }
  b.direct(g + "ffn_gate_shexp.weight", s + "gate_proj.weight");
  b.direct(g + "ffn_down_shexp.weight", s + "down_proj.weight");
  b.direct(g + "ffn_up_shexp.weight", s + "up_proj.weight");
}

// Decoder layer l (an MTP layer past num_layers) as blk.l.*.
void gguf_decoder_layer(GgufBuilder& b, const ModelConfig& c, int64_t l) {
  const std::string p = fmt::format("model.layers.{}.", l), a = p + "self_attn.";
  const std::string g = fmt::format("blk.{}.", l);
  const bool mtp = l >= c.num_layers;
  if (mtp) gguf_mtp_inputs(b, g, p);
  b.direct(g + "attn_norm.weight", p + "input_layernorm.weight");
  if (c.is_mla()) {
    gguf_mla_attention(b, c, g, a);
    if (c.is_index_layer(l) || (mtp && c.has_indexer())) gguf_indexer(b, g, a + "indexer.");
  } else {
    gguf_attention(b, c, g, a);
  }
  // GLM-4.5's and gpt-oss's FFN norm keeps HF's name in llama.cpp (gguf-py maps it to
  // ATTN_POST_NORM).
  const bool post_norm = c.arch == ModelArch::kGlm4Moe || c.arch == ModelArch::kGptOss;
  b.direct(g + (post_norm ? "post_attention_norm.weight" : "ffn_norm.weight"),
           p + "post_attention_layernorm.weight");
  if (!mtp && !c.is_moe_layer(l)) {
    b.direct(g + "ffn_gate.weight", p + "mlp.gate_proj.weight");
    b.direct(g + "ffn_down.weight", p + "mlp.down_proj.weight");
    b.direct(g + "ffn_up.weight", p + "mlp.up_proj.weight");
  } else if (c.arch == ModelArch::kGptOss) {
    gguf_gpt_oss_experts(b, c, g, p + "mlp.");
  } else if (c.arch == ModelArch::kMixtral || c.arch == ModelArch::kMiniMaxM2) {
    gguf_block_sparse_moe(b, c, g, p + "block_sparse_moe.");
  } else {
    gguf_moe(b, c, g, p + "mlp.");
  }
}

}  // namespace

std::vector<HfTensorSpec> hf_tensor_specs(const ModelConfig& c) {
  if (detail::is_qwen_hybrid(c.arch)) return detail::qwen_hybrid_hf_specs(c);
  const int64_t h = c.hidden_size, v = c.vocab_size;
  HfBuilder b;
  b.add("model.embed_tokens.weight", {v, h}, WeightRole::kEmbedding, h);
  b.add("model.norm.weight", {h}, WeightRole::kNorm);
  if (!c.tie_word_embeddings) b.add("lm_head.weight", {v, h}, WeightRole::kOutput, h);
  for (int64_t l = 0; l < c.num_layers + c.nextn_layers; ++l) hf_decoder_layer(b, c, l);
  return std::move(b.specs);
}

std::vector<GgufTensorSpec> gguf_tensor_specs(const ModelConfig& c,
                                              const std::vector<HfTensorSpec>& hf) {
  if (detail::is_qwen_hybrid(c.arch)) return detail::qwen_hybrid_gguf_specs(c, hf);
  GgufBuilder b(hf);
  b.direct("token_embd.weight", "model.embed_tokens.weight");
  b.direct("output_norm.weight", "model.norm.weight");
  if (!c.tie_word_embeddings) b.direct("output.weight", "lm_head.weight");
  for (int64_t l = 0; l < c.num_layers + c.nextn_layers; ++l) gguf_decoder_layer(b, c, l);
  return std::move(b.specs);
}

DType gguf_tensor_dtype(const ModelConfig& c, SynthType type, const std::string& name,
                        const std::vector<int64_t>& shape) {
  const bool quantizable = shape.size() >= 2 && name.ends_with("weight") &&
                           name.find("_norm.weight") == std::string::npos &&
                           name.find("ffn_gate_inp.weight") == std::string::npos &&
                           name.find("ssm_conv1d") == std::string::npos;
  if (!quantizable || type == SynthType::kF32) return DType::kF32;
  if (type == SynthType::kF16) return DType::kF16;
  if (type == SynthType::kBF16) return DType::kBF16;
  if (type == SynthType::kMXFP4_MOE) {
    // llama-quantize's MXFP4_MOE: the stacked experts (3-D) MXFP4, every other matrix Q8_0
    // (lm_head too); a row that is not whole 32-blocks F16 (tensor_type_fallback).
    const DType t = shape.size() == 3 ? DType::kMXFP4 : DType::kQ8_0;
    return shape.back() % 32 == 0 ? t : DType::kF16;
  }
  const bool five = type == SynthType::kQ5_K || type == SynthType::kQ5_K_M;
  DType t = type == SynthType::kQ8_0   ? DType::kQ8_0
            : type == SynthType::kQ6_K ? DType::kQ6_K
            : type == SynthType::kQ4_0 ? DType::kQ4_0
            : type == SynthType::kQ4_1 ? DType::kQ4_1
            : type == SynthType::kQ5_0 ? DType::kQ5_0
            : type == SynthType::kQ5_1 ? DType::kQ5_1
            : type == SynthType::kQ2_K ? DType::kQ2_K
            : type == SynthType::kQ3_K ? DType::kQ3_K
            : five                     ? DType::kQ5_K
                                       : DType::kQ4_K;
  const int64_t ncols = shape.back();
  if (type == SynthType::kQ4_K_M || type == SynthType::kQ5_K_M) {
    // llama-quantize's llama_tensor_get_type_impl() for LLAMA_FTYPE_MOSTLY_Q4_K_M / Q5_K_M, MoE
    // models (the same rules; Q5_K_M's base type is Q5_K).
    int layer = -1;
    std::sscanf(name.c_str(), "blk.%d.", &layer);
    // (llama-quantize counts the MTP layers of the hybrid Qwen models: n_layer_all.)
    const int n = static_cast<int>(c.num_layers +
                                   (detail::is_qwen_hybrid(c.arch) ? c.nextn_layers : 0));
    auto more_bits = [n](int i) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; };
    const bool eight = c.n_experts == 8;
    if (name == "output.weight" || (c.tie_word_embeddings && name == "token_embd.weight")) {
      t = ncols % 256 != 0 ? DType::kQ8_0 : DType::kQ6_K;
    } else if (name.find("attn_v.weight") != std::string::npos ||
               name.find("attn_qkv.weight") != std::string::npos) {
      // (attn_qkv is attn_v-like; one of the two per layer, so the counter is the layer.)
      if (more_bits(layer)) t = DType::kQ6_K;
      if (eight) t = DType::kQ8_0;
    } else if (name.find("attn_k.weight") != std::string::npos) {
      if (eight) t = DType::kQ8_0;
    } else if (name.find("ffn_down") != std::string::npos) {
      if (more_bits(layer)) t = DType::kQ6_K;
    } else if (name.find("attn_output.weight") != std::string::npos) {
      if (eight) t = DType::kQ5_K;
    }
  }
  // tensor_type_fallback(): rows that are not whole super-blocks.
  const auto block = [](DType d) { return dtype_info(d).block_elems; };
  if (ncols % block(t) != 0) {
    t = t == DType::kQ2_K || t == DType::kQ3_K ? DType::kQ4_0
        : t == DType::kQ4_K ? DType::kQ5_0
        : t == DType::kQ5_K ? DType::kQ5_1
        : t == DType::kQ6_K ? DType::kQ8_0
                            : DType::kF16;
    if (ncols % block(t) != 0) t = DType::kF16;
  }
  return t;
}

void synth_values(uint64_t seed, const HfTensorSpec& spec, int64_t start, int64_t stride, int64_t n,
                  float* out) {
  const uint64_t key = splitmix64(seed ^ fnv1a64(spec.name));
  const double fan = static_cast<double>(std::max<int64_t>(spec.fan_in, 1));
  float scale = 1.0f, offset = 0.0f;
  switch (spec.role) {
    case WeightRole::kEmbedding:
      scale = 1.0f;
      break;
    case WeightRole::kOutput:
      scale = static_cast<float>(2.0 / std::sqrt(fan));
      break;
    case WeightRole::kRouter:
    case WeightRole::kLinear:
      scale = static_cast<float>(1.0 / std::sqrt(fan));
      break;
    case WeightRole::kNorm:
      scale = 0.1f, offset = 1.0f;
      break;
    case WeightRole::kBias:
      scale = 0.1f;
      break;
    case WeightRole::kScoreBias:
      scale = 0.01f;
      break;
    case WeightRole::kSink:
      scale = 1.0f;
      break;
    case WeightRole::kNormDelta:
      scale = 0.1f, offset = 1.0f;
      break;
    case WeightRole::kConv:
      scale = static_cast<float>(1.0 / std::sqrt(fan));
      break;
    case WeightRole::kDecayLog:
      scale = 1.5f, offset = -2.0f;
      break;
  }
  const bool uniform = spec.role == WeightRole::kScoreBias;
  for (int64_t k = 0; k < n; ++k) {
    const uint64_t z = splitmix64(key + static_cast<uint64_t>(start + k * stride));
    float x;
    if (uniform) {  // U(-1, 1)
      x = static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0);
    } else {
      // Irwin-Hall: four U(0,1) from the 16-bit lanes, centred and scaled to unit variance.
      // Pure arithmetic (no libm), so the bytes do not depend on the C library.
      float s = 0.0f;
      for (int lane = 0; lane < 4; ++lane) {
        s += (static_cast<float>((z >> (16 * lane)) & 0xFFFF) + 0.5f) * (1.0f / 65536.0f);
      }
      x = (s - 2.0f) * 1.7320508f;
    }
    out[k] = bf16_to_f32(f32_to_bf16(offset + scale * x));
    // (A BF16 value in [0.5, 2) minus 1 is a BF16 value: the GGUF's + 1 gives it back exactly.)
    if (spec.role == WeightRole::kNormDelta) out[k] -= 1.0f;
  }
}

}  // namespace tandem
