// The Qwen3-Next and Qwen3.5-MoE checkpoints as their releases lay them out (HF) and as
// convert_hf_to_gguf.py converts them (llama.cpp's qwen3next / qwen35moe GGUF): the Gated DeltaNet
// layers' tensors, the gated attention's doubled q_proj, the zero-centred norms, the MTP layer.
#include <fmt/format.h>

#include <functional>

#include "formats/model_config_detail.h"
#include "formats/synth_detail.h"

namespace tandem::detail {

namespace {

// Qwen3.5's checkpoints nest the text model under model.language_model; Qwen3-Next's do not.
std::string hf_prefix(const ModelConfig& c) {
  return c.arch == ModelArch::kQwen35Moe ? "model.language_model." : "model.";
}

// One decoder layer's attention-or-DeltaNet and MoE tensors under prefix p (a layer's, or the MTP
// block's "mtp.layers.0.", which is a full-attention layer).
void hf_layer(HfBuilder& b, const ModelConfig& c, const std::string& p, bool linear) {
  const int64_t h = c.hidden_size;
  b.add(p + "input_layernorm.weight", {h}, WeightRole::kNormDelta);
  b.add(p + "post_attention_layernorm.weight", {h}, WeightRole::kNormDelta);
  if (linear) {
    const std::string a = p + "linear_attn.";
    const int64_t nv = c.linear_num_value_heads, vdim = nv * c.linear_value_head_dim;
    const int64_t ch = c.linear_conv_channels();
    if (c.arch == ModelArch::kQwen3Next) {
      b.add(a + "in_proj_qkvz.weight", {ch + vdim, h}, WeightRole::kLinear, h);
      b.add(a + "in_proj_ba.weight", {2 * nv, h}, WeightRole::kLinear, h);
    } else {
      b.add(a + "in_proj_qkv.weight", {ch, h}, WeightRole::kLinear, h);
      b.add(a + "in_proj_z.weight", {vdim, h}, WeightRole::kLinear, h);
      b.add(a + "in_proj_b.weight", {nv, h}, WeightRole::kLinear, h);
      b.add(a + "in_proj_a.weight", {nv, h}, WeightRole::kLinear, h);
    }
    b.add(a + "conv1d.weight", {ch, 1, c.linear_conv_kernel}, WeightRole::kConv,
          c.linear_conv_kernel);
    b.add(a + "dt_bias", {nv}, WeightRole::kBias);
    b.add(a + "A_log", {nv}, WeightRole::kDecayLog);
    b.add(a + "norm.weight", {c.linear_value_head_dim}, WeightRole::kNorm);
    b.add(a + "out_proj.weight", {h, vdim}, WeightRole::kLinear, vdim);
  } else {
    const std::string a = p + "self_attn.";
    const int64_t q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
    b.add(a + "q_proj.weight", {2 * q, h}, WeightRole::kLinear, h);
    b.add(a + "k_proj.weight", {kv, h}, WeightRole::kLinear, h);
    b.add(a + "v_proj.weight", {kv, h}, WeightRole::kLinear, h);
    b.add(a + "o_proj.weight", {h, q}, WeightRole::kLinear, q);
    b.add(a + "q_norm.weight", {c.head_dim}, WeightRole::kNormDelta);
    b.add(a + "k_norm.weight", {c.head_dim}, WeightRole::kNormDelta);
  }
  const std::string m = p + "mlp.";
  const int64_t f = c.moe_intermediate_size, sf = c.shared_expert_intermediate_size;
  b.add(m + "gate.weight", {c.n_experts, h}, WeightRole::kRouter, h);
  for (int64_t e = 0; e < c.n_experts; ++e) {
    const std::string x = fmt::format("{}experts.{}.", m, e);
    b.add(x + "gate_proj.weight", {f, h}, WeightRole::kLinear, h);
    b.add(x + "up_proj.weight", {f, h}, WeightRole::kLinear, h);
    b.add(x + "down_proj.weight", {h, f}, WeightRole::kLinear, f);
  }
  if (sf > 0) {
    b.add(m + "shared_expert.gate_proj.weight", {sf, h}, WeightRole::kLinear, h);
    b.add(m + "shared_expert.up_proj.weight", {sf, h}, WeightRole::kLinear, h);
    b.add(m + "shared_expert.down_proj.weight", {h, sf}, WeightRole::kLinear, sf);
    b.add(m + "shared_expert_gate.weight", {1, h}, WeightRole::kRouter, h);
  }
}

// Qwen3.5's value heads in llama.cpp's order (_LinearAttentionVReorderBase): HF groups them by
// key head (value head g r + j belongs to key head g), the GGUF tiles them (position j nk + g
// holds HF's head g r + j), so that ggml's broadcast maps a value head to key head (head % nk).
int64_t hf_value_head(const ModelConfig& c, int64_t gguf_head) {
  const int64_t nk = c.linear_num_key_heads;
  const int64_t r = c.linear_num_value_heads / nk;
  return (gguf_head % nk) * r + gguf_head / nk;
}

// The HF row of row `row` of Qwen3.5's value heads (`width` rows each) in the GGUF's head order.
int64_t q35_value_row(const ModelConfig& c, int64_t row, int64_t width) {
  return hf_value_head(c, row / width) * width + row % width;
}

// A tensor whose row r is HF row src(r) of an HF tensor with `cols` values per row.
void gguf_rows(GgufBuilder& b, std::string name, const std::string& hf_name,
               std::vector<int64_t> shape, std::function<int64_t(int64_t)> src) {
  const size_t i = b.index(hf_name);
  const int64_t cols = shape.back();
  b.add({std::move(name), std::move(shape), b.index.spec(i).role, [i, cols, src](int64_t r) {
           return HfRowRef{i, src(r) * cols, 1};
         }});
}

// Element-wise gathers (Qwen3.5's reordered value heads inside a row).
void gguf_gather(GgufBuilder& b, std::string name, const std::string& hf_name,
                 std::vector<int64_t> shape, std::function<int64_t(int64_t, int64_t)> element) {
  const size_t i = b.index(hf_name);
  GgufTensorSpec t{std::move(name), std::move(shape), b.index.spec(i).role, [i](int64_t) {
                     return HfRowRef{i, 0, 1};
                   }};
  t.element = std::move(element);
  b.add(std::move(t));
}

// Qwen3-Next's DeltaNet from the HF prefix a: in_proj_qkvz holds per key head [q (hk), k (hk),
// v (r hv), z (r hv)]; the GGUF splits it into attn_qkv [all q | all k | all v] and attn_gate
// [all z]; in_proj_ba stays whole.
void gguf_next_delta_net(GgufBuilder& b, const ModelConfig& c, const std::string& g,
                         const std::string& a) {
  const int64_t h = c.hidden_size, nk = c.linear_num_key_heads, nv = c.linear_num_value_heads;
  const int64_t hk = c.linear_key_head_dim, hv = c.linear_value_head_dim, r = nv / nk;
  const int64_t qk = nk * hk, vdim = nv * hv, ch = c.linear_conv_channels();
  const int64_t G = 2 * hk + 2 * r * hv;
  gguf_rows(b, g + "attn_qkv.weight", a + "in_proj_qkvz.weight", {ch, h}, [=](int64_t i) {
    if (i < qk) return (i / hk) * G + i % hk;
    if (i < 2 * qk) return ((i - qk) / hk) * G + hk + (i - qk) % hk;
    const int64_t j = i - 2 * qk;
    return (j / (r * hv)) * G + 2 * hk + j % (r * hv);
  });
  gguf_rows(b, g + "attn_gate.weight", a + "in_proj_qkvz.weight", {vdim, h},
            [=](int64_t i) { return (i / (r * hv)) * G + 2 * hk + r * hv + i % (r * hv); });
  gguf_rows(b, g + "ssm_conv1d.weight", a + "conv1d.weight", {ch, c.linear_conv_kernel},
            [](int64_t i) { return i; });
  b.direct(g + "ssm_dt.bias", a + "dt_bias");
  b.direct(g + "ssm_a", a + "A_log");
  b.specs.back().neg_exp = true;
  b.direct(g + "ssm_ba.weight", a + "in_proj_ba.weight");
  b.direct(g + "ssm_norm.weight", a + "norm.weight");
  b.direct(g + "ssm_out.weight", a + "out_proj.weight");
}

// Qwen3.5's DeltaNet from the HF prefix a: separate in_proj_qkv / z / b / a, every value-head
// dimension (v rows, z rows, conv channels, dt, A, beta, alpha, out_proj's inputs) in the GGUF's
// head order.
void gguf_q35_delta_net(GgufBuilder& b, const ModelConfig& c, const std::string& g,
                        const std::string& a) {
  const int64_t h = c.hidden_size, nv = c.linear_num_value_heads, hv = c.linear_value_head_dim;
  const int64_t qk = c.linear_num_key_heads * c.linear_key_head_dim, vdim = nv * hv;
  const int64_t ch = c.linear_conv_channels();
  // q and k rows in place, then the value heads reordered.
  const auto qkv_row = [&c, qk, hv](int64_t i) {
    return i < 2 * qk ? i : 2 * qk + q35_value_row(c, i - 2 * qk, hv);
  };
  const auto head = [&c](int64_t i) { return q35_value_row(c, i, 1); };
  const auto head_element = [head](int64_t, int64_t i) { return head(i); };
  gguf_rows(b, g + "attn_qkv.weight", a + "in_proj_qkv.weight", {ch, h}, qkv_row);
  gguf_rows(b, g + "attn_gate.weight", a + "in_proj_z.weight", {vdim, h},
            [&c, hv](int64_t i) { return q35_value_row(c, i, hv); });
  gguf_rows(b, g + "ssm_conv1d.weight", a + "conv1d.weight", {ch, c.linear_conv_kernel}, qkv_row);
  gguf_gather(b, g + "ssm_dt.bias", a + "dt_bias", {nv}, head_element);
  gguf_gather(b, g + "ssm_a", a + "A_log", {nv}, head_element);
  b.specs.back().neg_exp = true;
  gguf_rows(b, g + "ssm_beta.weight", a + "in_proj_b.weight", {nv, h}, head);
  gguf_rows(b, g + "ssm_alpha.weight", a + "in_proj_a.weight", {nv, h}, head);
  b.direct(g + "ssm_norm.weight", a + "norm.weight");
  // out_proj's input columns are value-head values: reordered within each row.
  gguf_gather(
      b, g + "ssm_out.weight", a + "out_proj.weight", {h, vdim},
      [&c, vdim, hv](int64_t row, int64_t i) { return row * vdim + q35_value_row(c, i, hv); });
}

// The gated attention from the HF prefix a (its q / k norms zero-centred).
void gguf_gated_attention(GgufBuilder& b, const std::string& g, const std::string& a) {
  b.direct(g + "attn_q.weight", a + "q_proj.weight");
  b.direct(g + "attn_k.weight", a + "k_proj.weight");
  b.direct(g + "attn_v.weight", a + "v_proj.weight");
  b.direct(g + "attn_output.weight", a + "o_proj.weight");
  b.direct(g + "attn_q_norm.weight", a + "q_norm.weight", 1.0f);
  b.direct(g + "attn_k_norm.weight", a + "k_norm.weight", 1.0f);
}

// The router, the stacked experts and the gated shared expert from the HF prefix m.
void gguf_hybrid_moe(GgufBuilder& b, const ModelConfig& c, const std::string& g,
                     const std::string& m) {
  b.direct(g + "ffn_gate_inp.weight", m + "gate.weight");
  b.stacked(g + "ffn_gate_exps.weight", c.n_experts, m + "experts.", ".gate_proj.weight");
  b.stacked(g + "ffn_down_exps.weight", c.n_experts, m + "experts.", ".down_proj.weight");
  b.stacked(g + "ffn_up_exps.weight", c.n_experts, m + "experts.", ".up_proj.weight");
  if (c.shared_expert_intermediate_size > 0) {
    b.direct(g + "ffn_gate_inp_shexp.weight", m + "shared_expert_gate.weight", 0.0f,
             std::vector<int64_t>{c.hidden_size});
    b.direct(g + "ffn_gate_shexp.weight", m + "shared_expert.gate_proj.weight");
    b.direct(g + "ffn_down_shexp.weight", m + "shared_expert.down_proj.weight");
    b.direct(g + "ffn_up_shexp.weight", m + "shared_expert.up_proj.weight");
  }
}

// GGUF layer l from the HF decoder layer under prefix p (DeltaNet when linear, else attention).
void gguf_hybrid_layer(GgufBuilder& b, const ModelConfig& c, int64_t l, const std::string& p,
                       bool linear) {
  const std::string g = fmt::format("blk.{}.", l);
  b.direct(g + "attn_norm.weight", p + "input_layernorm.weight", 1.0f);
  if (!linear) {
    gguf_gated_attention(b, g, p + "self_attn.");
  } else if (c.arch == ModelArch::kQwen35Moe) {
    gguf_q35_delta_net(b, c, g, p + "linear_attn.");
  } else {
    gguf_next_delta_net(b, c, g, p + "linear_attn.");
  }
  b.direct(g + "post_attention_norm.weight", p + "post_attention_layernorm.weight", 1.0f);
  gguf_hybrid_moe(b, c, g, p + "mlp.");
}

}  // namespace

std::vector<HfTensorSpec> qwen_hybrid_hf_specs(const ModelConfig& c) {
  const int64_t h = c.hidden_size, v = c.vocab_size;
  const std::string P = hf_prefix(c);
  HfBuilder b;
  b.add(P + "embed_tokens.weight", {v, h}, WeightRole::kEmbedding, h);
  b.add(P + "norm.weight", {h}, WeightRole::kNormDelta);
  if (!c.tie_word_embeddings) b.add("lm_head.weight", {v, h}, WeightRole::kOutput, h);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    hf_layer(b, c, fmt::format("{}layers.{}.", P, l), c.is_linear_layer(l));
  }
  for (int64_t i = 0; i < c.nextn_layers; ++i) {
    // The release's MTP block: fc over [embedding norm, hidden norm], a full-attention MoE
    // layer, its final norm.
    b.add("mtp.fc.weight", {h, 2 * h}, WeightRole::kLinear, 2 * h);
    b.add("mtp.pre_fc_norm_embedding.weight", {h}, WeightRole::kNormDelta);
    b.add("mtp.pre_fc_norm_hidden.weight", {h}, WeightRole::kNormDelta);
    b.add("mtp.norm.weight", {h}, WeightRole::kNormDelta);
    hf_layer(b, c, fmt::format("mtp.layers.{}.", i), false);
  }
  return std::move(b.specs);
}

std::vector<GgufTensorSpec> qwen_hybrid_gguf_specs(const ModelConfig& c,
                                                   const std::vector<HfTensorSpec>& hf) {
  GgufBuilder b(hf);
  const std::string P = hf_prefix(c);
  b.direct("token_embd.weight", P + "embed_tokens.weight");
  b.direct("output_norm.weight", P + "norm.weight", 1.0f);
  if (!c.tie_word_embeddings) b.direct("output.weight", "lm_head.weight");
  for (int64_t l = 0; l < c.num_layers; ++l) {
    gguf_hybrid_layer(b, c, l, fmt::format("{}layers.{}.", P, l), c.is_linear_layer(l));
  }
  for (int64_t i = 0; i < c.nextn_layers; ++i) {
    // _QwenMtpMixin: mtp.layers.i -> layer num_layers + i; fc / the pre-fc norms / norm ->
    // nextn.eh_proj / enorm / hnorm / shared_head_norm (zero-centred: + 1 like every norm).
    const int64_t l = c.num_layers + i;
    const std::string g = fmt::format("blk.{}.", l);
    b.direct(g + "nextn.eh_proj.weight", "mtp.fc.weight");
    b.direct(g + "nextn.enorm.weight", "mtp.pre_fc_norm_embedding.weight", 1.0f);
    b.direct(g + "nextn.hnorm.weight", "mtp.pre_fc_norm_hidden.weight", 1.0f);
    b.direct(g + "nextn.shared_head_norm.weight", "mtp.norm.weight", 1.0f);
    gguf_hybrid_layer(b, c, l, fmt::format("mtp.layers.{}.", i), false);
  }
  return std::move(b.specs);
}

}  // namespace tandem::detail
