// The model's parameters as views into the mmap'ed checkpoint (GGUF file or HF safetensors
// directory): one loader for every architecture, mapping both naming schemes to LayerWeights.
// Large matrices stay in their stored dtype (no copies; FP8 with its block scales); only the small
// vectors (norm weights, biases, the DeepSeek-V3 selection bias) are converted to F32.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/memory.h"
#include "core/tensor.h"
#include "formats/model_config.h"
#include "ops/cpu/ref_ops.h"

namespace tandem {

class GgufFile;
class SafetensorsModel;

// Routed experts of one MoE layer, one [rows, cols] view per expert (GGUF's stacked 3-D tensors
// are sliced, HF's per-expert tensors used as they are).
struct ExpertWeights {
  std::vector<ops::Weight> gate, up, down;  // gate/up [ff, hidden], down [hidden, ff]
  // gpt-oss: each expert's biases, [n_experts * ff] (gate, up) and [n_experts * hidden] (down),
  // empty when absent; swiglu_limit: ModelConfig's (0: plain SwiGLU).
  std::vector<float> gate_bias, up_bias, down_bias;
  float swiglu_limit = 0.0f;
  // Expert e's biases and activation as the FFN kernels take them (FfnExtras::any() false for
  // the plain SwiGLU experts of the other architectures).
  ops::FfnExtras extras(int64_t e) const {
    ops::FfnExtras x;
    const int64_t ff = gate.empty() ? 0 : gate[0].rows(), h = down.empty() ? 0 : down[0].rows();
    if (!gate_bias.empty()) x.gate_bias = gate_bias.data() + e * ff;
    if (!up_bias.empty()) x.up_bias = up_bias.data() + e * ff;
    if (!down_bias.empty()) x.down_bias = down_bias.data() + e * h;
    x.limit = swiglu_limit;
    return x;
  }
};

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;

  // MHA / GQA (Qwen, Mixtral).
  ops::Weight wq, wk, wv, wo;
  std::vector<float> bq, bk, bv;      // Qwen2-MoE biases (empty when absent)
  std::vector<float> bo;              // gpt-oss: o_proj's bias (empty when absent)
  std::vector<float> sinks;           // gpt-oss: [num_heads] attention sinks (empty: none)
  std::vector<float> q_norm, k_norm;  // Qwen3-MoE per-head norms (empty when absent)

  // MLA (DeepSeek). wq is used when there is no q-LoRA.
  ops::Weight wq_a, wq_b;
  std::vector<float> q_a_norm;
  ops::Weight wkv_a;  // [kv_lora + rope, hidden]
  std::vector<float> kv_a_norm;
  // Per head: k_up [qk_nope, kv_lora] (or [kv_lora, qk_nope] when k_up_transposed: GGUF
  // attn_k_b) and v_up [v_head, kv_lora].
  std::vector<ops::Weight> k_up, v_up;
  bool k_up_transposed = false;
  // DeepSeek Sparse Attention's lightning indexer (ModelConfig::is_index_layer; empty else):
  // its query from the q LoRA, its key from x through a LayerNorm, each head's weight from x.
  ops::Weight idx_wq_b;     // [index heads * index_head_dim, q_lora]
  ops::Weight idx_wk;       // [index_head_dim, hidden]
  std::vector<float> idx_k_norm, idx_k_norm_bias;
  ops::Weight idx_weights;  // [index heads, hidden]

  // Dense FFN (DeepSeek's leading layers).
  ops::Weight ffn_gate, ffn_up, ffn_down;

  // Gated DeltaNet (a linear-attention layer of Qwen3-Next / Qwen3.5: ModelConfig::
  // is_linear_layer). Its input projections as the checkpoint stores them, one product each
  // (GGUF: attn_qkv, attn_gate, then ssm_ba or ssm_beta / ssm_alpha; HF Qwen3-Next: in_proj_qkvz
  // with every key head's q, k, v and z together, in_proj_ba; HF Qwen3.5: in_proj_qkv, _z, _b,
  // _a); *_src say where in their outputs, concatenated in this order, each value is: the
  // convolution's channels (all q, all k, all v), the output gate z per value, beta's and the
  // decay's input per value head.
  struct DeltaNet {
    std::vector<ops::Weight> in;
    int64_t in_rows = 0;  // the concatenation's width
    std::vector<int32_t> conv_src, z_src, beta_src, alpha_src;
    std::vector<float> conv_t;   // [d_conv][channels]: the convolution's taps, transposed
    std::vector<float> dt_bias;  // [value heads]
    std::vector<float> a;        // [value heads]: -exp(A_log) (llama.cpp's ssm_a)
    std::vector<float> norm;     // [value head dim]: the gated RMSNorm's weight
    ops::Weight out;             // [hidden, value heads * value head dim]
    // Value head h reads key head h % key heads (llama.cpp's qwen35moe files, whose value
    // heads are tiled), else h / (value heads / key heads) (the grouped order of the HF files and
    // of qwen3next GGUF files).
    bool tiled = false;
    int64_t key_head(int64_t h, int64_t nk, int64_t nv) const {
      return tiled ? h % nk : h / (nv / nk);
    }
  };
  DeltaNet delta;

  // MoE.
  bool moe = false;
  ops::Weight router;              // [n_experts, hidden]
  std::vector<float> router_bias;  // e_score_correction_bias (empty when absent)
  std::vector<float> router_logit_bias;  // gpt-oss: added to the router's logits (or empty)
  ExpertWeights experts;
  ops::Weight sh_gate, sh_up, sh_down;  // shared expert(s) as one FFN (absent: data == nullptr)
  std::vector<float> sh_gate_inp;       // Qwen2-MoE sigmoid gate [hidden]
};

struct LoadedModel {
  std::filesystem::path path;
  ModelConfig config;
  bool from_gguf = false;
  Tensor embed;         // [vocab, hidden]
  ops::Weight lm_head;  // [vocab, hidden] (the embedding when tied)
  std::vector<float> out_norm;
  std::vector<LayerWeights> layers;
  uint64_t weight_bytes = 0;                       // sum of the tensors used
  std::map<std::string, uint64_t> bytes_by_dtype;  // dtype name -> bytes of the tensors used

  std::shared_ptr<GgufFile> gguf;
  std::shared_ptr<SafetensorsModel> safetensors;
  // Tensors rearranged at load, which the views above may point into: gpt-oss's HF experts
  // (stacked, transposed, MXFP4 in its own block layout) as [out, in] rows the kernels read.
  std::vector<AlignedBuffer> owned;
};

// A .gguf file or an HF directory (config.json + safetensors). Throws Error naming the file and
// the tensor that is missing or has an unexpected shape.
// mode: map the files (page cache) or copy them into huge-page memory when they fit (LoadMode).
LoadedModel load_model(const std::filesystem::path& path, LoadMode mode = LoadMode::kMap);

// Bytes of a model's files: a .gguf file's size, or the sum of an HF directory's *.safetensors
// (0 when they cannot be read: load_model then names the problem).
uint64_t model_file_bytes(const std::filesystem::path& path);

// Reads the model's tensor data into the page cache before the first token (with a progress bar
// on a terminal), so prefill does not stall on disk reads page by page. Skipped, with a log line,
// when the tensors do not fit in the memory available now: pages then load on demand; and when
// the files were copied into memory at load (nothing to page in). Returns the bytes paged in.
uint64_t page_in_model(const LoadedModel& model);

// Drops the mapped model files' pages from this process's resident set (MappedFile::
// release_pages): after `--cpu-experts repack` copied what decode reads, so the resident set is
// the copy, not the copy plus the file. Copied files: nothing.
void release_model_pages(const LoadedModel& model);

// One line: architecture, source, layers, parameters, bytes by dtype (mmap'ed, not copied).
std::string model_summary(const LoadedModel& model);

}  // namespace tandem
