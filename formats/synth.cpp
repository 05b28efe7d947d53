// Planning (sizes, resources) and writing of synthetic models; layouts are in synth_layout.cpp.
#include "formats/synth.h"

#include <fmt/format.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "core/fp_convert.h"
#include "core/log.h"
#include "core/progress.h"
#include "formats/gguf.h"
#include "formats/output_file.h"
#include "formats/quant.h"
#include "formats/safetensors.h"
#include "formats/tokenizer_synth.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using OJson = nlohmann::ordered_json;
using HfSpecs = std::shared_ptr<std::vector<HfTensorSpec>>;

constexpr int64_t kFp8Block = 128;  // DeepSeek-V3's weight_block_size [128, 128]
constexpr uint64_t kDefaultShardBytes = 5'000'000'000;
constexpr uint64_t kSmallModelBytes = 64ull << 20;

struct TypeName {
  SynthType type;
  std::string_view name;
  uint32_t ftype;
};
constexpr TypeName kTypes[] = {
    {SynthType::kF32, "f32", 0},        {SynthType::kF16, "f16", 1},
    {SynthType::kBF16, "bf16", 32},     {SynthType::kQ8_0, "q8_0", 7},
    {SynthType::kQ4_K, "q4_k", 15},     {SynthType::kQ6_K, "q6_k", 18},
    {SynthType::kQ4_K_M, "q4_k_m", 15}, {SynthType::kFp8, "fp8", 0},
    {SynthType::kQ5_K, "q5_k", 16},     {SynthType::kQ5_K_M, "q5_k_m", 17},
    {SynthType::kQ4_0, "q4_0", 2},      {SynthType::kQ4_1, "q4_1", 3},
    {SynthType::kQ5_0, "q5_0", 8},      {SynthType::kQ5_1, "q5_1", 9},
    {SynthType::kQ2_K, "q2_k", 10},     {SynthType::kQ3_K, "q3_k", 12},
    {SynthType::kMXFP4_MOE, "mxfp4_moe", 38}, {SynthType::kInt4Ct, "int4-ct", 0},
    {SynthType::kFp8Ct, "fp8-ct", 0},          {SynthType::kGptqInt4, "gptq-int4", 0},
};

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int thread_count(const SynthOptions& o) {
  if (o.threads > 0) return o.threads;
  return std::max(1u, std::thread::hardware_concurrency());
}

// Runs fn(begin, end) over [0, rows) split across threads; small jobs stay on this thread.
template <typename F>
void parallel_rows(int64_t rows, int64_t work_per_row, int threads, F&& fn) {
  const int64_t total = rows * work_per_row;
  const int n = static_cast<int>(std::min<int64_t>({threads, rows, total / (1 << 16) + 1}));
  if (n <= 1) {
    fn(int64_t{0}, rows);
    return;
  }
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(n);
  for (int t = 0; t < n; ++t) {
    pool.emplace_back([&, t] {
      try {
        fn(rows * t / n, rows * (t + 1) / n);
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// HF tensors stored as FP8 in DeepSeek-V3's release: the decoder's linear weights.
bool is_fp8_weight(const HfTensorSpec& t) {
  return t.role == WeightRole::kLinear && t.shape.size() == 2;
}

// gpt-oss's release (--format hf --type mxfp4_moe): the stacked experts as MXFP4 *_blocks /
// *_scales, every other tensor BF16.
bool is_mxfp4_experts(const HfTensorSpec& t, SynthType type) {
  return type == SynthType::kMXFP4_MOE && t.role == WeightRole::kLinear && t.shape.size() == 3;
}
// The blocks' and scales' shapes of such a tensor: the logical [E, in, out] (x @ W) stored as
// [E, out, in / 32, 16] bytes and [E, out, in / 32] E8M0 exponents.
std::vector<int64_t> mxfp4_blocks_shape(const HfTensorSpec& t) {
  return {t.shape[0], t.shape[2], t.shape[1] / 32, 16};
}
std::vector<int64_t> mxfp4_scales_shape(const HfTensorSpec& t) {
  return {t.shape[0], t.shape[2], t.shape[1] / 32};
}

// Kimi-K2-Thinking's release (--format hf --type int4-ct): each routed expert's matrices as
// compressed-tensors INT4 (<name>_packed / _scale / _shape), every other tensor BF16.
constexpr int64_t kInt4Group = 32;
bool is_int4_ct_weight(const HfTensorSpec& t, SynthType type) {
  return type == SynthType::kInt4Ct && t.role == WeightRole::kLinear && t.shape.size() == 2 &&
         t.name.find(".experts.") != std::string::npos;
}
std::vector<int64_t> int4_packed_shape(const HfTensorSpec& t) {
  return {t.shape[0], t.shape[1] / 8};
}
std::vector<int64_t> int4_scale_shape(const HfTensorSpec& t) {
  return {t.shape[0], t.shape[1] / kInt4Group};
}

// A GPTQ release (--type gptq-int4): every decoder linear weight as <base>.qweight / .scales /
// .qzeros / .g_idx, groups of 128 along the input.
constexpr int64_t kGptqGroup = 128;
bool is_gptq_weight(const HfTensorSpec& t, SynthType type) {
  return type == SynthType::kGptqInt4 && is_fp8_weight(t);
}
std::string gptq_base(const HfTensorSpec& t) {
  return t.name.substr(0, t.name.size() - std::string_view(".weight").size());
}

DType hf_dtype(const HfTensorSpec& t, SynthType type) {
  if (type == SynthType::kFp8Ct && is_fp8_weight(t)) return DType::kF8E4M3;
  if (type == SynthType::kFp8) {
    if (is_fp8_weight(t)) return DType::kF8E4M3;
    if (t.role == WeightRole::kScoreBias) return DType::kF32;  // as released
  }
  return DType::kBF16;
}

std::vector<int64_t> fp8_scale_shape(const std::vector<int64_t>& shape) {
  return {(shape[0] + kFp8Block - 1) / kFp8Block, (shape[1] + kFp8Block - 1) / kFp8Block};
}

std::string scale_name(const std::string& weight) {
  return weight.substr(0, weight.size() - std::string_view("weight").size()) + "weight_scale_inv";
}

// Applies --vocab / the built-in vocabulary's needs to the config.
ModelConfig effective_config(const SynthOptions& o, std::unique_ptr<GgufFile>* vocab_file) {
  ModelConfig c = o.config;
  if (!o.vocab_gguf.empty()) {
    *vocab_file = std::make_unique<GgufFile>(GgufFile::open(o.vocab_gguf));
    const GgufValue* tokens = (*vocab_file)->find("tokenizer.ggml.tokens");
    if (!tokens || tokens->type() != GgufType::kArray) {
      fail(ErrorKind::kFormat, "{}: --vocab file has no 'tokenizer.ggml.tokens' array",
           o.vocab_gguf.string());
    }
    c.vocab_size = static_cast<int64_t>(tokens->size());
    c.bos_token_id = (*vocab_file)->get_int("tokenizer.ggml.bos_token_id", -1);
    c.eos_token_id = (*vocab_file)->get_int("tokenizer.ggml.eos_token_id", -1);
  } else if (c.bos_token_id < 0 || c.eos_token_id < 0 || c.bos_token_id == c.eos_token_id) {
    c.bos_token_id = c.vocab_size - 2;  // the built-in vocabulary needs both control tokens
    c.eos_token_id = c.vocab_size - 1;
  }
  validate_config(c, "synth");
  return c;
}

// Collects the plan's tensors with their bytes, the largest one, the widest row and the files'
// metadata.
struct PlanBuilder {
  void add(std::string name, DType dtype, std::vector<int64_t> shape) {
    const uint64_t bytes = static_cast<uint64_t>(dtype_bytes(dtype, numel(shape)));
    metadata += name.size() + 64 + 8 * shape.size();  // header entry + alignment padding
    if (bytes > largest) {
      largest = bytes;
      plan.largest_tensor = name;
    }
    plan.tensor_bytes += bytes;
    plan.tensors.push_back({std::move(name), dtype, std::move(shape), bytes});
  }
  SynthPlan& plan;
  uint64_t largest = 0, metadata = 0;
  int64_t widest_row = 0;
};

// HF tensor t as the checkpoint stores it for o.type: MXFP4 blocks and scales, GPTQ's four
// parts, INT4's three, or the tensor itself (FP8: with its scales). Refuses shapes the type
// cannot store.
void plan_hf_tensor(const SynthOptions& o, const ModelConfig& c, const HfTensorSpec& t,
                    PlanBuilder& p) {
  p.widest_row = std::max(p.widest_row, t.shape.back());
  if (is_mxfp4_experts(t, o.type)) {
    if (c.arch != ModelArch::kGptOss || t.shape[1] % 32 != 0) {
      fail(ErrorKind::kInvalidArgument,
           "--format hf --type mxfp4_moe: gpt-oss's experts only (input widths in 32s)");
    }
    p.widest_row = std::max(p.widest_row, t.shape[1]);
    p.add(t.name + "_blocks", DType::kU8, mxfp4_blocks_shape(t));
    p.add(t.name + "_scales", DType::kU8, mxfp4_scales_shape(t));
    return;
  }
  if (is_gptq_weight(t, o.type)) {
    const int64_t out = t.shape[0], in = t.shape[1];
    if (in % kGptqGroup != 0 || out % 8 != 0) {
      fail(ErrorKind::kInvalidArgument,
           "--format hf --type gptq-int4: linear weights with "
           "inputs in {}s and outputs in 8s ('{}' is [{}, {}])",
           kGptqGroup, t.name, out, in);
    }
    const std::string b = gptq_base(t);
    p.add(b + ".qweight", DType::kI32, {in / 8, out});
    p.add(b + ".scales", DType::kF16, {in / kGptqGroup, out});
    p.add(b + ".qzeros", DType::kI32, {in / kGptqGroup, out / 8});
    p.add(b + ".g_idx", DType::kI32, {in});
    return;
  }
  if (is_int4_ct_weight(t, o.type)) {
    if (t.shape[1] % kInt4Group != 0) {
      fail(ErrorKind::kInvalidArgument,
           "--format hf --type int4-ct: expert input widths in "
           "{}s ('{}' has {})",
           kInt4Group, t.name, t.shape[1]);
    }
    p.add(t.name + "_packed", DType::kI32, int4_packed_shape(t));
    p.add(t.name + "_scale", DType::kBF16, int4_scale_shape(t));
    p.add(t.name + "_shape", DType::kI32, {2});
    return;
  }
  const DType dtype = hf_dtype(t, o.type);
  p.add(t.name, dtype, t.shape);
  if (dtype == DType::kF8E4M3 && o.type == SynthType::kFp8Ct) {
    p.add(t.name + "_scale", DType::kBF16, {t.shape[0], 1});
  } else if (dtype == DType::kF8E4M3) {
    p.add(scale_name(t.name), DType::kF32, fp8_scale_shape(t.shape));
  }
}

// Every tensor of the HF checkpoint; int4-ct needs per-expert matrices to store.
void plan_hf_tensors(const SynthOptions& o, const ModelConfig& c,
                     const std::vector<HfTensorSpec>& hf, PlanBuilder& p) {
  for (const HfTensorSpec& t : hf) plan_hf_tensor(o, c, t, p);
  if (o.type == SynthType::kInt4Ct &&
      std::none_of(hf.begin(), hf.end(),
                   [&](const HfTensorSpec& t) { return is_int4_ct_weight(t, o.type); })) {
    fail(ErrorKind::kInvalidArgument,
         "--format hf --type int4-ct: {} has no per-expert "
         "matrices to store as INT4",
         arch_name(c.arch));
  }
}

SynthPlan make_plan(const SynthOptions& o, const ModelConfig& c) {
  SynthPlan plan;
  plan.config = c;
  const std::vector<HfTensorSpec> hf = hf_tensor_specs(c);
  const int threads = thread_count(o);
  PlanBuilder p{plan};
  if (o.format == SynthFormat::kGguf) {
    for (const GgufTensorSpec& t : gguf_tensor_specs(c, hf)) {
      p.widest_row = std::max(p.widest_row, t.shape.back());
      p.add(t.name, gguf_tensor_dtype(c, o.type, t.name, t.shape), t.shape);
    }
  } else {
    plan_hf_tensors(o, c, hf, p);
  }
  // Vocabulary (GGUF arrays or tokenizer.json): tokens, merges and their framing.
  p.metadata += static_cast<uint64_t>(c.vocab_size) * 48 + (1u << 20);
  plan.file_bytes = plan.tensor_bytes + p.metadata;
  // The writers hold one whole tensor; each thread a few rows of F32 (FP8: a 128-row strip).
  const uint64_t per_thread = static_cast<uint64_t>(p.widest_row) * sizeof(float) *
                              (o.type == SynthType::kFp8 ? 2 * kFp8Block : 4);
  plan.ram_bytes = p.largest + per_thread * threads + (64u << 20);
  return plan;
}

uint64_t available_ram() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t value = 0;
  std::string unit;
  while (in >> key >> value >> unit) {
    if (key == "MemAvailable:") return value * 1024;
  }
  return UINT64_MAX;  // unknown: do not refuse
}

// Fills GGUF tensor `t` (type dtype) row by row from the HF value generator.
void fill_gguf(const SynthOptions& o, const std::vector<HfTensorSpec>& hf, const GgufTensorSpec& t,
               DType dtype, uint8_t* dst) {
  const int64_t cols = t.shape.back();
  const int64_t rows = numel(t.shape) / cols;
  const int64_t row_bytes = dtype_bytes(dtype, cols);
  parallel_rows(rows, cols, thread_count(o), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(cols);
    for (int64_t r = begin; r < end; ++r) {
      const HfRowRef ref = t.row(r);
      if (t.element) {
        for (int64_t i = 0; i < cols; ++i) {
          synth_values(o.seed, hf[ref.hf_index], t.element(r, i), 1, 1, &buf[i]);
        }
      } else {
        synth_values(o.seed, hf[ref.hf_index], ref.start, ref.stride, cols, buf.data());
      }
      for (float& v : buf) {
        v += t.offset;
        if (t.neg_exp) v = static_cast<float>(-std::exp(static_cast<double>(v)));
      }
      if (dtype == DType::kF32) {
        std::memcpy(dst + r * row_bytes, buf.data(), row_bytes);
      } else {
        quantize_row(dtype, buf.data(), dst + r * row_bytes, cols);
      }
    }
  });
}

void fill_hf(const SynthOptions& o, const HfTensorSpec& t, DType dtype, uint8_t* dst) {
  const int64_t cols = t.shape.back();
  const int64_t rows = numel(t.shape) / cols;
  const int64_t row_bytes = dtype_bytes(dtype, cols);
  parallel_rows(rows, cols, thread_count(o), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(cols);
    for (int64_t r = begin; r < end; ++r) {
      synth_values(o.seed, t, r * cols, 1, cols, buf.data());
      if (dtype == DType::kF32) {
        std::memcpy(dst + r * row_bytes, buf.data(), row_bytes);
      } else {
        quantize_row(dtype, buf.data(), dst + r * row_bytes, cols);
      }
    }
  });
}

// FP8 weight (want_scales = false) or its scale_inv tensor, in 128-row strips: both are computed
// from the same values, so each fill regenerates them instead of keeping the tensor around.
void fill_fp8(const SynthOptions& o, const HfTensorSpec& t, bool want_scales, uint8_t* dst) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  const int64_t strips = (rows + kFp8Block - 1) / kFp8Block;
  const int64_t scale_cols = (cols + kFp8Block - 1) / kFp8Block;
  parallel_rows(strips, kFp8Block * cols, thread_count(o), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(kFp8Block * cols), scales(scale_cols);
    std::vector<uint8_t> w(want_scales ? kFp8Block * cols : 0);
    for (int64_t s = begin; s < end; ++s) {
      const int64_t r0 = s * kFp8Block, n = std::min(kFp8Block, rows - r0);
      synth_values(o.seed, t, r0 * cols, 1, n * cols, buf.data());
      uint8_t* wdst = want_scales ? w.data() : dst + r0 * cols;
      float* sdst = want_scales ? reinterpret_cast<float*>(dst) + s * scale_cols : scales.data();
      quantize_fp8_blocks(buf.data(), n, cols, kFp8Block, kFp8Block, wdst, sdst);
    }
  });
}

// The MXFP4 blocks (want_scales false) or scales of gpt-oss's stacked experts: row (e, r) of the
// stored [E, out, in] holds logical [e][0 .. in)[r], quantized by ggml's MXFP4 quantizer, its
// nibbles in the release's order (value 2 i in byte i's low nibble, 2 i + 1 in its high one).
void fill_mxfp4_experts(const SynthOptions& o, const HfTensorSpec& t, bool want_scales,
                        uint8_t* dst) {
  const int64_t in = t.shape[1], out = t.shape[2], rows = t.shape[0] * out, nb = in / 32;
  parallel_rows(rows, in, thread_count(o), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(in);
    std::vector<BlockMXFP4> q(nb);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t e = r / out, j = r % out;
      synth_values(o.seed, t, e * in * out + j, out, in, buf.data());
      quantize_row(DType::kMXFP4, buf.data(), q.data(), in);
      for (int64_t b = 0; b < nb; ++b) {
        if (want_scales) {
          dst[r * nb + b] = q[b].e;
          continue;
        }
        auto nib = [&](int k) { return k < 16 ? q[b].qs[k] & 0xF : q[b].qs[k - 16] >> 4; };
        uint8_t* block = dst + (r * nb + b) * 16;
        for (int i = 0; i < 16; ++i) {
          block[i] = static_cast<uint8_t>(nib(2 * i) | (nib(2 * i + 1) << 4));
        }
      }
    }
  });
}

// An FP8 matrix with one BF16 scale per row (compressed-tensors' channel strategy): the weight
// (want_scales false) or its scales, each row quantized against its own amax.
void fill_fp8_rows(const SynthOptions& o, const HfTensorSpec& t, bool want_scales, uint8_t* dst) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  parallel_rows(rows, cols, thread_count(o), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(cols);
    std::vector<uint8_t> w(cols);
    for (int64_t r = begin; r < end; ++r) {
      synth_values(o.seed, t, r * cols, 1, cols, buf.data());
      float scale = 0;
      quantize_fp8_blocks(buf.data(), 1, cols, 1, cols, want_scales ? w.data() : dst + r * cols,
                          &scale);
      if (want_scales) {
        const uint16_t b = f32_to_bf16(scale);
        std::memcpy(dst + r * 2, &b, 2);
      }
    }
  });
}

// A GPTQ weight's qweight (part 0), scales (1), qzeros (2) or g_idx (3): the whole matrix is
// quantized (qweight and scales are stored transposed).
void fill_gptq(const SynthOptions& o, const HfTensorSpec& t, int part, uint8_t* dst) {
  const int64_t out = t.shape[0], in = t.shape[1];
  if (part == 2) {  // the symmetric zero point 8, stored as 7 (GPTQ's checkpoint_format gptq)
    std::fill_n(reinterpret_cast<uint32_t*>(dst), in / kGptqGroup * out / 8, 0x77777777u);
    return;
  }
  if (part == 3) {
    for (int64_t k = 0; k < in; ++k) reinterpret_cast<int32_t*>(dst)[k] = k / kGptqGroup;
    return;
  }
  std::vector<float> w(out * in);
  synth_values(o.seed, t, 0, 1, out * in, w.data());
  std::vector<int32_t> qweight(in / 8 * out);
  std::vector<uint16_t> scales(in / kGptqGroup * out);
  quantize_gptq_int4(w.data(), out, in, kGptqGroup, qweight.data(), scales.data());
  if (part == 0) {
    std::memcpy(dst, qweight.data(), qweight.size() * 4);
  } else {
    std::memcpy(dst, scales.data(), scales.size() * 2);
  }
}

// An INT4 expert matrix's packed words (part 0), BF16 scales (1) or shape (2), row by row.
void fill_int4_ct(const SynthOptions& o, const HfTensorSpec& t, int part, uint8_t* dst) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  if (part == 2) {
    const int32_t shape[2] = {static_cast<int32_t>(rows), static_cast<int32_t>(cols)};
    std::memcpy(dst, shape, sizeof(shape));
    return;
  }
  parallel_rows(rows, cols, thread_count(o), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(cols);
    std::vector<int32_t> packed(cols / 8);
    std::vector<uint16_t> scales(cols / kInt4Group);
    for (int64_t r = begin; r < end; ++r) {
      synth_values(o.seed, t, r * cols, 1, cols, buf.data());
      quantize_int4_groups(buf.data(), 1, cols, kInt4Group, packed.data(), scales.data());
      if (part == 0) {
        std::memcpy(dst + r * cols / 2, packed.data(), cols / 2);
      } else {
        std::memcpy(dst + r * scales.size() * 2, scales.data(), scales.size() * 2);
      }
    }
  });
}

void write_text(const fs::path& path, const std::string& text) {
  write_output_file(path, text);
}

void write_gguf(const SynthOptions& o, const SynthPlan& plan, const GgufFile* vocab_file,
                Progress* progress) {
  const ModelConfig& c = plan.config;
  GgufWriter w(o.output);
  w.set("general.architecture", GgufValue::string(std::string(gguf_arch_name(c.arch))));
  w.set("general.name", GgufValue::string(o.name));
  if (vocab_file) {
    copy_gguf_tokenizer_keys(*vocab_file, w);
  } else {
    write_gguf_vocab(build_synth_vocab(c.vocab_size, c.bos_token_id, c.eos_token_id), w);
  }
  write_gguf_config(c, w);
  const bool quantized =
      o.type != SynthType::kF32 && o.type != SynthType::kF16 && o.type != SynthType::kBF16;
  if (quantized) w.set("general.quantization_version", GgufValue::u32(2));
  w.set("general.file_type", GgufValue::u32(gguf_file_type(o.type)));

  auto hf = std::make_shared<std::vector<HfTensorSpec>>(hf_tensor_specs(c));
  auto specs = std::make_shared<std::vector<GgufTensorSpec>>(gguf_tensor_specs(c, *hf));
  for (size_t i = 0; i < specs->size(); ++i) {
    const SynthTensorInfo& info = plan.tensors[i];
    w.add_tensor(info.name, info.dtype, info.shape, [&o, hf, specs, i, info, progress](void* dst) {
      log_debug("synth: {} {} {}", info.name, dtype_name(info.dtype), format_bytes_si(info.nbytes));
      fill_gguf(o, *hf, (*specs)[i], info.dtype, static_cast<uint8_t*>(dst));
      if (progress) progress->add(info.nbytes);
    });
  }
  w.write();
}

// The checkpoint directory, made if absent, without the shards of an earlier run (a reader would
// mix them into this checkpoint).
void prepare_hf_dir(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(ErrorKind::kIo, "{}: cannot create directory: {}", dir.string(), ec.message());
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string n = entry.path().filename().string();
    if (n == "model.safetensors" || n == "model.safetensors.index.json" ||
        (n.starts_with("model-") && n.ends_with(".safetensors"))) {
      fs::remove(entry.path(), ec);
    }
  }
}

// compressed-tensors' float-quantized FP8, as the FP8-dynamic releases say it.
OJson fp8_ct_quantization_config() {
  return {{"config_groups",
           {{"group_0",
             {{"input_activations",
               {{"dynamic", true},
                {"num_bits", 8},
                {"strategy", "token"},
                {"symmetric", true},
                {"type", "float"}}},
              {"output_activations", nullptr},
              {"targets", {"Linear"}},
              {"weights",
               {{"dynamic", false},
                {"num_bits", 8},
                {"observer", "minmax"},
                {"strategy", "channel"},
                {"symmetric", true},
                {"type", "float"}}}}}}},
          {"format", "float-quantized"},
          {"ignore", {"lm_head", "re:.*mlp.gate$"}},
          {"quant_method", "compressed-tensors"},
          {"quantization_status", "compressed"}};
}

// compressed-tensors' pack-quantized INT4 experts, as Kimi-K2-Thinking's release says it.
OJson int4_ct_quantization_config() {
  return {
      {"config_groups",
       {{"group_0",
         {{"input_activations", nullptr},
          {"output_activations", nullptr},
          {"targets", {"Linear"}},
          {"weights",
           {{"actorder", nullptr},
            {"block_structure", nullptr},
            {"dynamic", false},
            {"group_size", kInt4Group},
            {"num_bits", 4},
            {"observer", "minmax"},
            {"observer_kwargs", OJson::object()},
            {"strategy", "group"},
            {"symmetric", true},
            {"type", "int"}}}}}}},
      {"format", "pack-quantized"},
      {"ignore",
       {"lm_head", "re:.*self_attn.*", "re:.*shared_expert.*", "re:.*mlp\\.(gate|up|down)_proj.*"}},
      {"kv_cache_scheme", nullptr},
      {"quant_method", "compressed-tensors"},
      {"quantization_status", "compressed"}};
}

// config.json's quantization_config for `type`; null for BF16 (no such key).
OJson quantization_config(SynthType type) {
  switch (type) {
    case SynthType::kFp8:
      return {{"activation_scheme", "dynamic"},
              {"fmt", "e4m3"},
              {"quant_method", "fp8"},
              {"weight_block_size", {kFp8Block, kFp8Block}}};
    case SynthType::kGptqInt4:  // as Qwen's GPTQ-Int4 releases say it
      return {{"bits", 4},
              {"checkpoint_format", "gptq"},
              {"damp_percent", 0.01},
              {"desc_act", false},
              {"group_size", kGptqGroup},
              {"model_name_or_path", nullptr},
              {"model_file_base_name", nullptr},
              {"quant_method", "gptq"},
              {"static_groups", false},
              {"sym", true},
              {"true_sequential", true}};
    case SynthType::kFp8Ct:
      return fp8_ct_quantization_config();
    case SynthType::kInt4Ct:
      return int4_ct_quantization_config();
    case SynthType::kMXFP4_MOE:  // as gpt-oss's release says it
      return {{"modules_to_not_convert",
               {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                "lm_head"}},
              {"quant_method", "mxfp4"}};
    default:
      return nullptr;
  }
}

// config.json (with the quantization's description), generation_config.json, tokenizer.json
// and tokenizer_config.json.
void write_hf_json_files(const SynthOptions& o, const ModelConfig& c, const SynthVocab& vocab) {
  OJson config = OJson::parse(config_to_hf_json(c));
  if (OJson q = quantization_config(o.type); !q.is_null()) {
    config["quantization_config"] = std::move(q);
  }
  write_text(o.output / "config.json", config.dump(2) + "\n");
  auto id_or_null = [](int64_t id) { return id < 0 ? OJson(nullptr) : OJson(id); };
  OJson gen = {{"_from_model_config", true},
               {"bos_token_id", id_or_null(c.bos_token_id)},
               {"eos_token_id", id_or_null(c.eos_token_id)},
               {"do_sample", false},
               {"transformers_version", "4.46.0"}};
  write_text(o.output / "generation_config.json", gen.dump(2) + "\n");
  write_text(o.output / "tokenizer.json", tokenizer_json(vocab));
  write_text(o.output / "tokenizer_config.json",
             tokenizer_config_json(vocab, c.max_position_embeddings));
}

// The shard size limit: --shard-bytes, or 5 GB; small checkpoints still come in two shards
// (+ index), the layout real ones have: with a limit of half + the largest tensor, the greedy
// split makes exactly two.
uint64_t hf_shard_bytes(const SynthOptions& o, const SynthPlan& plan) {
  if (o.hf_shard_bytes != 0) return o.hf_shard_bytes;
  uint64_t largest = 0;
  for (const SynthTensorInfo& t : plan.tensors) largest = std::max(largest, t.nbytes);
  return plan.tensor_bytes < kSmallModelBytes ? plan.tensor_bytes / 2 + largest
                                              : kDefaultShardBytes;
}

// gpt-oss's stacked experts (*hf)[i] as MXFP4 *_blocks and *_scales.
void add_mxfp4_experts(SafetensorsWriter& w, const SynthOptions& o, const HfSpecs& hf, size_t i,
                       Progress* progress) {
  const HfTensorSpec& t = (*hf)[i];
  for (const bool scales : {false, true}) {
    const std::vector<int64_t> shape = scales ? mxfp4_scales_shape(t) : mxfp4_blocks_shape(t);
    const uint64_t bytes = static_cast<uint64_t>(numel(shape));
    w.add_tensor(t.name + (scales ? "_scales" : "_blocks"), DType::kU8, shape,
                 [&o, hf, i, scales, bytes, progress](void* dst) {
                   fill_mxfp4_experts(o, (*hf)[i], scales, static_cast<uint8_t*>(dst));
                   if (progress) progress->add(bytes);
                 });
  }
}

// Linear weight (*hf)[i] as GPTQ's .qweight / .scales / .qzeros / .g_idx.
void add_gptq_weight(SafetensorsWriter& w, const SynthOptions& o, const HfSpecs& hf, size_t i,
                     Progress* progress) {
  const HfTensorSpec& t = (*hf)[i];
  const int64_t out = t.shape[0], in = t.shape[1];
  const std::pair<const char*, DType> parts[] = {{".qweight", DType::kI32},
                                                 {".scales", DType::kF16},
                                                 {".qzeros", DType::kI32},
                                                 {".g_idx", DType::kI32}};
  const std::vector<int64_t> shapes[] = {
      {in / 8, out}, {in / kGptqGroup, out}, {in / kGptqGroup, out / 8}, {in}};
  for (int part = 0; part < 4; ++part) {
    const uint64_t bytes = dtype_bytes(parts[part].second, numel(shapes[part]));
    w.add_tensor(gptq_base(t) + parts[part].first, parts[part].second, shapes[part],
                 [&o, hf, i, part, bytes, progress](void* dst) {
                   fill_gptq(o, (*hf)[i], part, static_cast<uint8_t*>(dst));
                   if (progress) progress->add(bytes);
                 });
  }
}

// Expert matrix (*hf)[i] as compressed-tensors' INT4 _packed / _scale / _shape.
void add_int4_ct_weight(SafetensorsWriter& w, const SynthOptions& o, const HfSpecs& hf, size_t i,
                        Progress* progress) {
  const HfTensorSpec& t = (*hf)[i];
  const std::pair<const char*, DType> parts[] = {
      {"_packed", DType::kI32}, {"_scale", DType::kBF16}, {"_shape", DType::kI32}};
  for (int part = 0; part < 3; ++part) {
    const std::vector<int64_t> shape = part == 0   ? int4_packed_shape(t)
                                       : part == 1 ? int4_scale_shape(t)
                                                   : std::vector<int64_t>{2};
    const uint64_t bytes = dtype_bytes(parts[part].second, numel(shape));
    w.add_tensor(t.name + parts[part].first, parts[part].second, shape,
                 [&o, hf, i, part, bytes, progress](void* dst) {
                   fill_int4_ct(o, (*hf)[i], part, static_cast<uint8_t*>(dst));
                   if (progress) progress->add(bytes);
                 });
  }
}

// Tensor (*hf)[i] in its hf_dtype(): BF16 / F32, or FP8 followed by its scales (one BF16 per
// row for fp8-ct, 128x128 blocks' F32 weight_scale_inv for fp8).
void add_plain_tensor(SafetensorsWriter& w, const SynthOptions& o, const HfSpecs& hf, size_t i,
                      Progress* progress) {
  const HfTensorSpec& t = (*hf)[i];
  const DType dtype = hf_dtype(t, o.type);
  const uint64_t bytes = dtype_bytes(dtype, numel(t.shape));
  const bool fp8_rows = dtype == DType::kF8E4M3 && o.type == SynthType::kFp8Ct;
  w.add_tensor(t.name, dtype, t.shape, [&o, hf, i, dtype, fp8_rows, bytes, progress](void* dst) {
    if (fp8_rows) {
      fill_fp8_rows(o, (*hf)[i], false, static_cast<uint8_t*>(dst));
    } else if (dtype == DType::kF8E4M3) {
      fill_fp8(o, (*hf)[i], false, static_cast<uint8_t*>(dst));
    } else {
      fill_hf(o, (*hf)[i], dtype, static_cast<uint8_t*>(dst));
    }
    if (progress) progress->add(bytes);
  });
  if (fp8_rows) {
    const std::vector<int64_t> shape = {t.shape[0], 1};
    w.add_tensor(t.name + "_scale", DType::kBF16, shape, [&o, hf, i, progress, shape](void* dst) {
      fill_fp8_rows(o, (*hf)[i], true, static_cast<uint8_t*>(dst));
      if (progress) progress->add(2 * shape[0]);
    });
  } else if (dtype == DType::kF8E4M3) {
    const std::vector<int64_t> shape = fp8_scale_shape(t.shape);
    const uint64_t scale_bytes = sizeof(float) * numel(shape);
    w.add_tensor(scale_name(t.name), DType::kF32, shape,
                 [&o, hf, i, scale_bytes, progress](void* dst) {
                   fill_fp8(o, (*hf)[i], true, static_cast<uint8_t*>(dst));
                   if (progress) progress->add(scale_bytes);
                 });
  }
}

void write_hf(const SynthOptions& o, const SynthPlan& plan, const GgufFile* vocab_file,
              Progress* progress) {
  const ModelConfig& c = plan.config;
  // Before anything is written: a vocabulary that cannot be expressed must leave no files.
  const SynthVocab vocab = vocab_file
                               ? vocab_from_gguf(*vocab_file)
                               : build_synth_vocab(c.vocab_size, c.bos_token_id, c.eos_token_id);
  prepare_hf_dir(o.output);
  write_hf_json_files(o, c, vocab);
  SafetensorsWriter w(o.output, hf_shard_bytes(o, plan));
  w.set_metadata("format", "pt");
  auto hf = std::make_shared<std::vector<HfTensorSpec>>(hf_tensor_specs(c));
  for (size_t i = 0; i < hf->size(); ++i) {
    const HfTensorSpec& t = (*hf)[i];
    if (is_mxfp4_experts(t, o.type)) {
      add_mxfp4_experts(w, o, hf, i, progress);
    } else if (is_gptq_weight(t, o.type)) {
      add_gptq_weight(w, o, hf, i, progress);
    } else if (is_int4_ct_weight(t, o.type)) {
      add_int4_ct_weight(w, o, hf, i, progress);
    } else {
      add_plain_tensor(w, o, hf, i, progress);
    }
  }
  w.write();
}

}  // namespace

std::optional<SynthType> synth_type_from_name(std::string_view name) {
  for (const TypeName& t : kTypes) {
    if (t.name == name) return t.type;
  }
  return std::nullopt;
}

std::string_view synth_type_name(SynthType type) {
  for (const TypeName& t : kTypes) {
    if (t.type == type) return t.name;
  }
  return "?";
}

std::string_view synth_gguf_type_list() {
  static const std::string list = [] {
    std::string s;
    for (const TypeName& t : kTypes) {
      if (!synth_type_allowed(t.type, SynthFormat::kGguf)) continue;
      if (!s.empty()) s += ", ";
      s += t.name;
    }
    return s;
  }();
  return list;
}

bool synth_type_allowed(SynthType type, SynthFormat format) {
  if (format == SynthFormat::kHf) {
    return type == SynthType::kBF16 || type == SynthType::kFp8 || type == SynthType::kMXFP4_MOE ||
           type == SynthType::kInt4Ct || type == SynthType::kFp8Ct || type == SynthType::kGptqInt4;
  }
  return type != SynthType::kFp8 && type != SynthType::kInt4Ct && type != SynthType::kFp8Ct &&
         type != SynthType::kGptqInt4;
}

uint32_t gguf_file_type(SynthType type) {
  for (const TypeName& t : kTypes) {
    if (t.type == type) return t.ftype;
  }
  return 0;
}

std::string format_bytes_si(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1e12) return fmt::format("{:.1f} TB", b / 1e12);
  if (b >= 1e9) return fmt::format("{:.1f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.1f} MB", b / 1e6);
  if (b >= 1e3) return fmt::format("{:.1f} kB", b / 1e3);
  return fmt::format("{} B", bytes);
}

SynthPlan plan_synth(const SynthOptions& o) {
  if (!synth_type_allowed(o.type, o.format)) {
    fail(ErrorKind::kInvalidArgument,
         "--type {} is not available for --format {} (gguf: {}; hf: bf16, fp8)",
         synth_type_name(o.type), o.format == SynthFormat::kGguf ? "gguf" : "hf",
         synth_gguf_type_list());
  }
  if (o.output.empty()) fail(ErrorKind::kInvalidArgument, "an output path (-o) is required");
  std::unique_ptr<GgufFile> vocab_file;
  return make_plan(o, effective_config(o, &vocab_file));
}

void check_synth_resources(const SynthOptions& o, const SynthPlan& plan) {
  fs::path dir = o.format == SynthFormat::kHf ? o.output : o.output.parent_path();
  if (dir.empty()) dir = ".";
  // The nearest existing ancestor: where the files will land once directories are made.
  std::error_code ec;
  while (!fs::exists(dir, ec) && dir.has_parent_path() && dir != dir.parent_path()) {
    dir = dir.parent_path();
  }
  uint64_t free_disk = UINT64_MAX;
  if (o.free_disk_bytes) {
    free_disk = *o.free_disk_bytes;
  } else if (struct statvfs st; statvfs(dir.c_str(), &st) == 0) {
    free_disk = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  }
  if (plan.file_bytes > free_disk) {
    fail(ErrorKind::kResource, "needs {} of disk, {} free at {}", format_bytes_si(plan.file_bytes),
         format_bytes_si(free_disk), dir.string());
  }
  const uint64_t free_ram = o.free_ram_bytes ? *o.free_ram_bytes : available_ram();
  if (plan.ram_bytes > free_ram) {
    fail(ErrorKind::kResource, "needs {} of RAM (tensor '{}' is built whole), {} available",
         format_bytes_si(plan.ram_bytes), plan.largest_tensor, format_bytes_si(free_ram));
  }
}

SynthPlan synth_model(const SynthOptions& o) {
  if (!synth_type_allowed(o.type, o.format) || o.output.empty()) plan_synth(o);  // throws
  std::unique_ptr<GgufFile> vocab_file;
  const ModelConfig c = effective_config(o, &vocab_file);
  const SynthPlan plan = make_plan(o, c);
  check_synth_resources(o, plan);
  if (o.format == SynthFormat::kGguf) {
    std::error_code ec;
    if (fs::is_directory(o.output, ec)) {
      fail(ErrorKind::kInvalidArgument, "-o {}: is a directory; a GGUF model is one file",
           o.output.string());
    }
    (void)resolve_output_path(o.output);  // a device or FIFO: refused before any work
    if (o.output.has_parent_path()) fs::create_directories(o.output.parent_path(), ec);
  }
  log_info("synth: {} {} {} -> {} ({} tensors, {})", arch_name(c.arch), o.name,
           synth_type_name(o.type), o.output.string(), plan.tensors.size(),
           format_bytes_si(plan.file_bytes));
  std::unique_ptr<Progress> progress;
  if (o.progress) progress = std::make_unique<Progress>("synth", plan.tensor_bytes);
  if (o.format == SynthFormat::kGguf) {
    write_gguf(o, plan, vocab_file.get(), progress.get());
  } else {
    write_hf(o, plan, vocab_file.get(), progress.get());
  }
  if (progress) progress->finish();
  return plan;
}

}  // namespace tandem
