// Synthetic models: random-weight checkpoints of any supported architecture and shape, written
// exactly as the real tools lay them out, for tests, benchmarks and `tandem synth`.
//
// - GGUF: tensor names, shapes, ggml types and metadata keys as llama.cpp's
//   convert_hf_to_gguf.py (+ llama-quantize for the quantized types, including its Q4_K_M mix
//   and its fallbacks for rows that are not a multiple of the block size).
// - HF: config.json, generation_config.json, tokenizer.json, tokenizer_config.json and sharded
//   safetensors in BF16, or FP8-E4M3 with 128x128 `weight_scale_inv` block scales for the linear
//   weights as in DeepSeek-V3's release.
//
// Values are a pure function of (seed, HF tensor name, element index): a counter-based generator
// (splitmix64), so tensors are produced independently, in any order, in parallel, and the GGUF
// and HF files of the same seed hold the same numbers (every value is rounded to BF16, so F32 GGUF
// and BF16 safetensors are bit-identical). GGUF tensors are defined in terms of the HF tensors
// they are converted from (expert stacking, the MLA kv_b split, Mixtral's q/k row permutation), so
// the layout rules are tested against the golden llama.cpp conversions.
//
// Weight scales (why): the input of every projection is RMS-normalized, so linear weights are
// N(0, 1/fan_in) and keep activations near unit variance through any depth; the embedding is
// N(0, 1). The router is N(0, 1/H): logits of std 1 make every expert equally likely for random
// inputs with clear top-k margins, while larger logits would saturate DeepSeek-V3's sigmoid scores
// so that the selection bias alone decided (experts with a negative bias never chosen). That bias
// is U(-0.01, 0.01): big enough to change near-ties, small enough not to dominate. lm_head is
// N(0, 4/H) (logits of std 2: a clear argmax); norm weights 1 + 0.1 N(0, 1), biases 0.1 N(0, 1).
// "N(0, 1)" is a 4-term Irwin-Hall sum (bounded by 3.5 sigma), computed without libm so the bytes
// do not depend on the C library.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "formats/model_config.h"

namespace tandem {

enum class SynthFormat : uint8_t { kGguf, kHf };

// The weight types synth writes. GGUF: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k,
// q4_k, q5_k, q6_k (pure), q4_k_m, q5_k_m, mxfp4_moe (llama-quantize's mixes: MXFP4_MOE is the
// stacked experts in MXFP4, every other matrix Q8_0). HF: bf16, fp8, mxfp4_moe (gpt-oss's release),
// int4-ct (Kimi-K2-Thinking / K2.5's release: the routed experts in compressed-tensors'
// pack-quantized INT4, groups of 32, the rest BF16), fp8-ct (the FP8-dynamic releases:
// compressed-tensors' float-quantized FP8 with one BF16 scale per row for every linear weight),
// gptq-int4 (GPTQ's symmetric INT4, groups of 128, every linear weight: Qwen's GPTQ-Int4 releases).
enum class SynthType : uint8_t {
  kF32, kF16, kBF16, kQ8_0, kQ4_K, kQ6_K, kQ4_K_M, kFp8, kQ5_K, kQ5_K_M, kQ4_0, kQ4_1, kQ5_0,
  kQ5_1, kQ2_K, kQ3_K, kMXFP4_MOE, kInt4Ct, kFp8Ct, kGptqInt4
};
// The GGUF type names, for messages ("f32, f16, ...").
std::string_view synth_gguf_type_list();

std::optional<SynthType> synth_type_from_name(std::string_view name);
std::string_view synth_type_name(SynthType type);
bool synth_type_allowed(SynthType type, SynthFormat format);
// llama.cpp's llama_ftype for general.file_type (pure q4_k is labelled Q4_K_M like
// `llama-quantize --pure`).
uint32_t gguf_file_type(SynthType type);

struct SynthOptions {
  ModelConfig config;
  std::string name = "synth";  // general.name
  SynthFormat format = SynthFormat::kGguf;
  SynthType type = SynthType::kF32;
  uint64_t seed = 0;
  std::filesystem::path vocab_gguf;         // empty: the built-in byte-level BPE vocabulary
  std::filesystem::path output;             // the .gguf file, or the HF checkpoint directory
  uint64_t hf_shard_bytes = 0;              // 0: 5 GB shards; below 64 MiB in all, two shards
  int threads = 0;                          // 0: one per hardware thread
  std::optional<uint64_t> free_disk_bytes;  // instead of statvfs() of the output directory
  std::optional<uint64_t> free_ram_bytes;   // instead of /proc/meminfo MemAvailable
  bool progress = true;
};

struct SynthTensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes;
};

// What synth_model() will write and what it needs.
struct SynthPlan {
  ModelConfig config;  // with the vocabulary's size and BOS/EOS ids
  std::vector<SynthTensorInfo> tensors;
  uint64_t tensor_bytes = 0;
  uint64_t file_bytes = 0;  // estimated size of everything written (all files)
  uint64_t ram_bytes = 0;   // peak working memory
  std::string largest_tensor;
};

// Validates the options (Error(kInvalidArgument) naming the option) and plans the files.
SynthPlan plan_synth(const SynthOptions& options);
// Throws Error(kResource) ("needs 9.4 GB of disk, 3.1 GB free at /x") when the disk or the
// memory does not suffice. synth_model() calls it before writing anything.
void check_synth_resources(const SynthOptions& options, const SynthPlan& plan);
// Writes the model; returns what it wrote.
SynthPlan synth_model(const SynthOptions& options);

// ---- layout building blocks (also the HF -> GGUF conversion rules) ----

// kSink: gpt-oss's attention sinks, N(0, 1) so that some heads' sinks outweigh their scores.
// kNormDelta: a zero-centred norm weight (Qwen3-Next / Qwen3.5 store w - 1 and compute x * (1 + w)):
// a kNorm value minus 1, exactly (the GGUF tensor adds the 1 back, as convert_hf_to_gguf.py does).
// kConv: the Gated DeltaNet's causal convolution, N(0, 1 / width). kDecayLog: its A_log,
// -2 + 1.5 N(0, 1), decay rates from a few tokens to thousands.
enum class WeightRole : uint8_t {
  kEmbedding, kOutput, kLinear, kRouter, kNorm, kBias, kScoreBias, kSink, kNormDelta, kConv,
  kDecayLog
};

struct HfTensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  WeightRole role;
  int64_t fan_in;  // input features of a linear / router weight (sets its scale)
};
// Every tensor of the HF checkpoint, in the order transformers saves them.
std::vector<HfTensorSpec> hf_tensor_specs(const ModelConfig& config);

// Where the values of one GGUF row live in an HF tensor: elements start, start + stride, ...
struct HfRowRef {
  size_t hf_index;  // into the hf_tensor_specs() vector
  int64_t start;
  int64_t stride;
};
struct GgufTensorSpec {
  GgufTensorSpec(std::string n, std::vector<int64_t> s, WeightRole r,
                 std::function<HfRowRef(int64_t row)> f)
      : name(std::move(n)), shape(std::move(s)), role(r), row(std::move(f)) {}
  std::string name;
  std::vector<int64_t> shape;  // row-major (GGUF ne reversed)
  WeightRole role;
  std::function<HfRowRef(int64_t row)> row;  // row in [0, numel / shape.back())
  // Set where a GGUF row is no strided run of one HF tensor (Qwen3.5's value heads reordered
  // within out_proj's rows and in 1-D tensors): element i of the row comes from element
  // element(row, i) of the row's HF tensor (row().start and stride unused).
  std::function<int64_t(int64_t row, int64_t i)> element;
  // The conversion's arithmetic on each value: + offset (a zero-centred norm's 1), then -exp()
  // when neg_exp (A_log -> llama.cpp's ssm_a).
  float offset = 0.0f;
  bool neg_exp = false;
};
// Every tensor of the GGUF file, in convert_hf_to_gguf.py's order, each row mapped to its HF
// source.
std::vector<GgufTensorSpec> gguf_tensor_specs(const ModelConfig& config,
                                              const std::vector<HfTensorSpec>& hf);

// The type llama-quantize (or convert_hf_to_gguf.py for f32/f16/bf16) gives one tensor.
DType gguf_tensor_dtype(const ModelConfig& config, SynthType type, const std::string& name,
                        const std::vector<int64_t>& shape);

// Values start, start + stride, ... (n of them) of HF tensor `spec` for `seed`.
void synth_values(uint64_t seed, const HfTensorSpec& spec, int64_t start, int64_t stride, int64_t n,
                  float* out);

// "9.4 GB" (decimal units, as disk vendors and df -H count).
std::string format_bytes_si(uint64_t bytes);

}  // namespace tandem
