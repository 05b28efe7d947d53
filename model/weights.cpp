#include "model/weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_set>

#include "core/error.h"
#include "core/input_file.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/topology.h"
#include "formats/gguf.h"
#include "formats/quant.h"
#include "formats/safetensors.h"
#include "ops/cpu/ref_ops.h"

namespace tandem {
namespace {

bool detail_is_hybrid(const ModelConfig& c) {
  return c.arch == ModelArch::kQwen3Next || c.arch == ModelArch::kQwen35Moe;
}

// A compressed-tensors checkpoint's weights, of the kinds tandem reads: 'pack-quantized' 4-bit
// symmetric integers in groups or per channel (Kimi-K2-Thinking's and K2.5's experts), weights
// only; 'float-quantized' FP8 E4M3 per channel, per tensor or in blocks (the FP8-dynamic
// releases: their activations' dynamic FP8 is not taken up, tandem's kernels take BF16 ones).
struct CompressedTensors {
  bool int4 = false;
  int64_t group = 0;  // int4: values per scale along a row (0: one scale per row)
  // fp8: the scale blocks as {rows, cols}, 0 = the whole dimension: channel {1, 0}, tensor
  // {0, 0}, block {r, c}
  int64_t block[2] = {1, 0};
};

CompressedTensors parse_compressed_tensors(const nlohmann::json& q, const std::string& where) {
  const std::string format = q.value("format", "");
  const auto refuse = [&](const std::string& what) {
    fail(ErrorKind::kUnsupported, "{}: quantization_config {}: tandem reads compressed-tensors "
         "'pack-quantized' 4-bit symmetric integer weights (groups or per channel) and "
         "'float-quantized' FP8 weights (per channel, per tensor or in blocks)", where, what);
  };
  if (format != "pack-quantized" && format != "float-quantized") {
    refuse(fmt::format("format '{}'", format));
  }
  if (!q.contains("config_groups") || !q["config_groups"].is_object() ||
      q["config_groups"].empty()) {
    refuse("without config_groups");
  }
  CompressedTensors ct;
  ct.int4 = format == "pack-quantized";
  bool first = true;
  for (const auto& [name, g] : q["config_groups"].items()) {
    const nlohmann::json w = g.is_object() ? g.value("weights", nlohmann::json()) : nlohmann::json();
    if (!w.is_object()) refuse(fmt::format("group '{}' without weights", name));
    const nlohmann::json act =
        g.is_object() ? g.value("input_activations", nlohmann::json()) : nlohmann::json();
    if (!act.is_null() && (ct.int4 || !act.is_object() || !act.value("dynamic", false))) {
      refuse(fmt::format("group '{}' quantizes activations{}", name,
                         ct.int4 ? "" : " with stored scales"));
    }
    const std::string strategy = w.value("strategy", "");
    const int bits = w.value("num_bits", 0);
    const std::string type = w.value("type", "");
    const bool ok =
        w.value("symmetric", false) &&
        (ct.int4 ? bits == 4 && type == "int" && (strategy == "group" || strategy == "channel")
                 : bits == 8 && type == "float" &&
                       (strategy == "channel" || strategy == "tensor" || strategy == "block"));
    if (!ok) {
      refuse(fmt::format("group '{}' ({}-bit {}, symmetric {}, strategy '{}')", name, bits, type,
                         w.value("symmetric", false), strategy));
    }
    CompressedTensors here = ct;
    if (ct.int4) {
      here.group = strategy == "channel" ? 0 : w.value("group_size", int64_t{0});
      if (strategy == "group" && here.group <= 0) {
        refuse(fmt::format("group '{}' without group_size", name));
      }
    } else if (strategy == "tensor") {
      here.block[0] = here.block[1] = 0;
    } else if (strategy == "block") {
      const nlohmann::json bs = w.value("block_structure", nlohmann::json());
      if (!bs.is_array() || bs.size() != 2 || !bs[0].is_number_integer() ||
          !bs[1].is_number_integer() || bs[0].get<int64_t>() <= 0 || bs[1].get<int64_t>() <= 0) {
        refuse(fmt::format("group '{}' without a block_structure of two sizes", name));
      }
      here.block[0] = bs[0].get<int64_t>();
      here.block[1] = bs[1].get<int64_t>();
    }
    if (!first && (here.group != ct.group || here.block[0] != ct.block[0] ||
                   here.block[1] != ct.block[1])) {
      refuse("groups that differ");
    }
    ct = here;
    first = false;
  }
  return ct;
}

// A GPTQ checkpoint's INT4 weights, of the kind tandem reads: 4-bit, symmetric, groups in their
// order (desc_act false), the zero point 8 as GPTQ stores it (checkpoint_format gptq: 7, the old
// off-by-one; gptq_v2: 8).
struct Gptq {
  int64_t group = 0;  // values per scale along a row (0: one per row)
  uint32_t zero_word = 0x77777777u;  // eight stored zero points, as every qzeros word holds them
};

Gptq parse_gptq(const nlohmann::json& q, const std::string& where) {
  const auto refuse = [&](const std::string& what) {
    fail(ErrorKind::kUnsupported, "{}: quantization_config {}: tandem reads GPTQ's 4-bit "
         "symmetric weights with groups in order (bits 4, sym true, desc_act false)", where, what);
  };
  if (q.value("bits", 0) != 4) refuse(fmt::format("bits {}", q.value("bits", 0)));
  if (!q.value("sym", false)) refuse("sym false");
  if (q.value("desc_act", false)) refuse("desc_act true");
  Gptq g;
  const int64_t group = q.value("group_size", int64_t{-1});
  if (group == 0 || group < -1) refuse(fmt::format("group_size {}", group));
  g.group = group == -1 ? 0 : group;
  const std::string format = q.value("checkpoint_format", "gptq");
  if (format == "gptq_v2") {
    g.zero_word = 0x88888888u;
  } else if (format != "gptq") {
    refuse(fmt::format("checkpoint_format '{}'", format));
  }
  return g;
}

// Tensor lookup over either checkpoint kind; tracks the dtypes and bytes used for the summary.
class Source {
 public:
  Source(LoadedModel& m) : m_(m) {}

  const Tensor* find(const std::string& name) {
    Tensor t;
    if (m_.gguf) {
      if (m_.gguf->find_tensor(name) == nullptr) return nullptr;
      t = m_.gguf->tensor(name);
    } else {
      if (m_.safetensors->find_tensor(name) == nullptr) return nullptr;
      t = m_.safetensors->tensor(name);
    }
    used_.insert(name);
    last_ = t;
    return &last_;
  }
  // A tensor the model knows and does not need (the unsplit attn_kv_b beside attn_k_b / v_b).
  void known(const std::string& name) { used_.insert(name); }
  bool used(const std::string& name) const { return used_.count(name) != 0; }

  // A matrix weight; FP8 ones come with their `<name>_scale_inv` blocks (a compressed-tensors
  // checkpoint's: `<name>_scale`); a compressed-tensors checkpoint's INT4 ones are
  // `<name>_packed` / `_scale` / `_shape`.
  ops::Weight get_w(const std::string& name, std::initializer_list<int64_t> shape) {
    if (ct_ && ct_->int4 && find(name) == nullptr && find(name + "_packed") != nullptr) {
      return int4_weight(name, shape);
    }
    if (gptq_ && name.ends_with(".weight") && find(name) == nullptr) {
      const std::string base = name.substr(0, name.size() - std::string_view(".weight").size());
      if (find(base + ".qweight") != nullptr) return gptq_weight(base, shape);
    }
    ops::Weight w(get(name, shape, /*allow_fp8=*/true));
    if (w.t.dtype != DType::kF8E4M3) return w;
    if (ct_ && !ct_->int4) return with_ct_fp8_scales(name, w);
    const std::string sname = name + "_scale_inv";
    const Tensor* s = find(sname);
    const int64_t rows = w.t.rows(), cols = w.t.row_elems();
    const int64_t br = fp8_block_[0], bc = fp8_block_[1];
    const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
    if (s == nullptr || s->dtype != DType::kF32 || s->numel() != sr * sc || s->row_elems() != sc) {
      fail(ErrorKind::kFormat,
           "{}: FP8 tensor '{}' needs an F32 '{}' of shape [{}, {}] ({}x{} "
           "blocks)",
           m_.path.string(), name, sname, sr, sc, br, bc);
    }
    w.scale_inv = s->as<const float>();
    w.scale_cols = sc;
    w.block_rows = br;
    w.block_cols = bc;
    return w;
  }
  std::string path() const { return m_.path.string(); }
  // Memory the LoadedModel keeps, for tensors rearranged at load.
  uint8_t* own(size_t bytes) {
    m_.owned.emplace_back(bytes);
    return m_.owned.back().as<uint8_t>();
  }
  void set_fp8_block(int64_t rows, int64_t cols) {
    fp8_block_[0] = rows;
    fp8_block_[1] = cols;
  }
  void set_compressed_tensors(const CompressedTensors& ct) { ct_ = ct; }
  void set_gptq(const Gptq& g) { gptq_ = g; }

  // GPTQ's INT4 weight (`<base>.qweight` / `.scales` / `.qzeros` / `.g_idx`) as Q4_0 blocks:
  // the same values in 18 bytes per 32 weights (a larger group's scale repeated over its
  // blocks: 9% more than GPTQ's groups of 128 store; formats/quant.h).
  ops::Weight gptq_weight(const std::string& base, std::initializer_list<int64_t> shape) {
    const int64_t cols = *(shape.end() - 1);
    int64_t rows = 1;
    for (auto it = shape.begin(); it + 1 != shape.end(); ++it) rows *= *it;
    const int64_t group = gptq_->group > 0 ? gptq_->group : cols;
    const std::string where = m_.path.string();
    if (cols % kQK != 0 || group % kQK != 0 || cols % group != 0) {
      fail(ErrorKind::kUnsupported, "{}: GPTQ tensor '{}' has {} inputs in groups of {}: tandem "
           "maps GPTQ INT4 onto Q4_0's blocks of 32 (both in 32s)", where, base, cols, group);
    }
    const Tensor qweight = *find(base + ".qweight");
    if (qweight.dtype != DType::kI32 || qweight.numel() != cols / 8 * rows ||
        qweight.row_elems() != rows) {
      fail(ErrorKind::kFormat, "{}: '{}.qweight' must be I32 [{}, {}], is {} {}", where, base,
           cols / 8, rows, dtype_info(qweight.dtype).name, qweight.shape_string());
    }
    const Tensor* sp = find(base + ".scales");
    if (sp == nullptr || sp->dtype != DType::kF16 || sp->numel() != cols / group * rows ||
        sp->row_elems() != rows) {
      fail(ErrorKind::kFormat, "{}: GPTQ tensor '{}' needs an F16 '{}.scales' of shape [{}, {}]",
           where, base, base, cols / group, rows);
    }
    const Tensor scales = *sp;
    if (const Tensor* z = find(base + ".qzeros"); z != nullptr) {
      const bool shaped = z->dtype == DType::kI32 && z->numel() * 8 == cols / group * rows;
      const auto* w = z->as<const uint32_t>();
      if (!shaped || !std::all_of(w, w + z->numel(),
                                  [&](uint32_t x) { return x == gptq_->zero_word; })) {
        fail(ErrorKind::kUnsupported, "{}: '{}.qzeros' holds zero points other than the "
             "symmetric 8: asymmetric GPTQ is not read", where, base);
      }
    }
    if (const Tensor* gi = find(base + ".g_idx"); gi != nullptr) {
      bool in_order = gi->dtype == DType::kI32 && gi->numel() == cols;
      for (int64_t k = 0; in_order && k < cols; ++k) in_order = gi->as<const int32_t>()[k] == k / group;
      if (!in_order) {
        fail(ErrorKind::kUnsupported, "{}: '{}.g_idx' reorders the groups (desc_act): not read",
             where, base);
      }
    }
    const uint64_t stored = static_cast<uint64_t>(qweight.nbytes() + scales.nbytes());
    m_.weight_bytes += stored;
    m_.bytes_by_dtype["int4 (GPTQ)"] += stored;
    auto* q = reinterpret_cast<BlockQ4_0*>(own(static_cast<size_t>(rows * cols / kQK) *
                                              sizeof(BlockQ4_0)));
    gptq_int4_to_q4_0(qweight.as<const int32_t>(), scales.as<const uint16_t>(), rows, cols, group,
                      q);
    return ops::Weight(Tensor::dense(DType::kQ4_0, shape, q));
  }

  // A compressed-tensors FP8 weight's scales (`<name>_scale`, BF16 / F16 / F32, one per row,
  // one, or one per block) as the F32 block scales the FP8 kernels take.
  ops::Weight with_ct_fp8_scales(const std::string& name, ops::Weight w) {
    const int64_t rows = w.t.rows(), cols = w.t.row_elems();
    const int64_t br = ct_->block[0] > 0 ? ct_->block[0] : rows;
    const int64_t bc = ct_->block[1] > 0 ? ct_->block[1] : cols;
    const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
    const std::string sname = name + "_scale";
    const Tensor* s = find(sname);
    if (s == nullptr || s->numel() != sr * sc ||
        (s->dtype != DType::kBF16 && s->dtype != DType::kF16 && s->dtype != DType::kF32)) {
      fail(ErrorKind::kFormat, "{}: FP8 tensor '{}' needs a '{}' of {} scales ({}x{} blocks; "
           "BF16, F16 or F32)", m_.path.string(), name, sname, sr * sc, br, bc);
    }
    const std::vector<float> scales = ops::to_f32(*s);
    auto* f = reinterpret_cast<float*>(own(scales.size() * sizeof(float)));
    std::copy(scales.begin(), scales.end(), f);
    w.scale_inv = f;
    w.scale_cols = sc;
    w.block_rows = br;
    w.block_cols = bc;
    return w;
  }

  // compressed-tensors' pack-quantized INT4 weight as Q4_0 blocks, which hold the same values
  // (formats/quant.h) in 18 bytes per 32 weights: as stored for groups of 32 (Kimi's).
  ops::Weight int4_weight(const std::string& name, std::initializer_list<int64_t> shape) {
    const int64_t cols = *(shape.end() - 1);
    int64_t rows = 1;
    for (auto it = shape.begin(); it + 1 != shape.end(); ++it) rows *= *it;
    const int64_t group = ct_->group > 0 ? ct_->group : cols;
    if (cols % kQK != 0 || group % kQK != 0 || cols % group != 0) {
      fail(ErrorKind::kUnsupported,
           "{}: INT4 tensor '{}' has {} columns in groups of {}: tandem maps compressed-tensors "
           "INT4 onto Q4_0's blocks of 32 (the columns and the group size in 32s)",
           m_.path.string(), name, cols, group);
    }
    for (const char* part : {"_zero_point", "_g_idx"}) {
      if (find(name + part) != nullptr) {
        fail(ErrorKind::kUnsupported, "{}: INT4 tensor '{}' has '{}{}': only symmetric groups "
             "in column order are read", m_.path.string(), name, name, part);
      }
    }
    const Tensor packed = *find(name + "_packed");
    if (packed.dtype != DType::kI32 || packed.numel() != rows * cols / 8 ||
        packed.row_elems() != cols / 8) {
      fail(ErrorKind::kFormat, "{}: '{}_packed' must be I32 [{}, {}], is {} {}", m_.path.string(),
           name, rows, cols / 8, dtype_info(packed.dtype).name, packed.shape_string());
    }
    const Tensor* sp = find(name + "_scale");
    if (sp == nullptr || sp->dtype != DType::kBF16 || sp->numel() != rows * (cols / group) ||
        sp->row_elems() != cols / group) {
      fail(ErrorKind::kFormat, "{}: INT4 tensor '{}' needs a BF16 '{}_scale' of shape [{}, {}]",
           m_.path.string(), name, name, rows, cols / group);
    }
    const Tensor scale = *sp;
    if (const Tensor* ws = find(name + "_shape"); ws != nullptr) {
      int64_t dims[2] = {-1, -1};
      for (int i = 0; i < 2 && ws->numel() == 2; ++i) {
        if (ws->dtype == DType::kI32) dims[i] = ws->as<const int32_t>()[i];
        if (ws->dtype == DType::kI64) dims[i] = ws->as<const int64_t>()[i];
      }
      if (dims[0] != rows || dims[1] != cols) {
        fail(ErrorKind::kFormat, "{}: '{}_shape' does not say [{}, {}]", m_.path.string(), name,
             rows, cols);
      }
    }
    const uint64_t stored = static_cast<uint64_t>(packed.nbytes() + scale.nbytes());
    m_.weight_bytes += stored;
    m_.bytes_by_dtype["int4 (compressed-tensors)"] += stored;
    auto* q = reinterpret_cast<BlockQ4_0*>(own(static_cast<size_t>(rows * cols / kQK) *
                                              sizeof(BlockQ4_0)));
    float bad = 0;
    if (!int4_groups_to_q4_0(packed.as<const int32_t>(), scale.as<const uint16_t>(), rows, cols,
                             group, q, &bad)) {
      fail(ErrorKind::kUnsupported, "{}: INT4 tensor '{}' has the scale {}, which F16 does not "
           "hold exactly: it cannot be read as Q4_0 without loss", m_.path.string(), name, bad);
    }
    return ops::Weight(Tensor::dense(DType::kQ4_0, shape, q));
  }

  // The tensor, checked to hold `numel` elements per outer slice with rows of `row_elems`.
  Tensor get(const std::string& name, std::initializer_list<int64_t> shape,
             bool allow_fp8 = false) {
    const Tensor* t = find(name);
    if (t == nullptr) {
      fail(ErrorKind::kFormat, "{}: missing tensor '{}' ({} model)", m_.path.string(), name,
           arch_name(m_.config.arch));
    }
    check_dtype(name, *t, allow_fp8);
    m_.weight_bytes += static_cast<uint64_t>(t->nbytes());
    m_.bytes_by_dtype[std::string(dtype_info(t->dtype).name)] += static_cast<uint64_t>(t->nbytes());
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    const int64_t inner = *(shape.end() - 1);
    if (t->numel() != numel || t->row_elems() != inner) {
      fail(ErrorKind::kFormat, "{}: tensor '{}' has shape {}, expected {} elements in rows of {}",
           m_.path.string(), name, t->shape_string(), numel, inner);
    }
    return *t;
  }
  // Only dtypes whose rows dequantize_row turns into the real values: FP8 checkpoints need
  // their weight_scale_inv blocks, which the reference path does not apply yet.
  void check_dtype(const std::string& name, const Tensor& t, bool allow_fp8) {
    const bool fp8 = t.dtype == DType::kF8E4M3 && !allow_fp8;
    const bool is_int = t.dtype == DType::kI8 || t.dtype == DType::kI16 || t.dtype == DType::kI32 ||
                        t.dtype == DType::kI64;
    if (fp8 || is_int) {
      fail(ErrorKind::kUnsupported,
           "{}: tensor '{}' has type {}, which the CPU reference path "
           "does not support{}",
           m_.path.string(), name, dtype_info(t.dtype).name,
           fp8 ? " here (FP8 is read for linear weights with block scales only)" : "");
    }
  }

  // Norm weights and biases, read once at load: a NaN or inf in one would turn every logit
  // into NaN (and the text into the tokens of id 0) without a word.
  std::vector<float> get_f32(const std::string& name, int64_t n) { return get_f32(name, {n}); }
  std::vector<float> get_f32(const std::string& name, std::initializer_list<int64_t> shape) {
    std::vector<float> v = ops::to_f32(get(name, shape));
    for (size_t i = 0; i < v.size(); ++i) {
      if (!std::isfinite(v[i])) {
        fail(ErrorKind::kFormat, "{}: tensor '{}' holds {} at index {}", m_.path.string(), name,
             v[i], i);
      }
    }
    return v;
  }
  std::vector<float> opt_f32(const std::string& name, int64_t n) {
    if (find(name) == nullptr) return {};
    return get_f32(name, n);
  }

 private:
  LoadedModel& m_;
  Tensor last_;
  int64_t fp8_block_[2] = {128, 128};
  std::optional<CompressedTensors> ct_;  // a compressed-tensors checkpoint's
  std::optional<Gptq> gptq_;              // a GPTQ checkpoint's
  std::unordered_set<std::string> used_;  // every name found: read, or probed and present
};

// The checkpoint names of one layer's tensors: llama.cpp's GGUF names or Hugging Face's. The
// loading logic (shapes, MLA splits, experts) is written once, in load_layer(), over this table.
struct LayerNames {
  std::string attn_norm, ffn_norm;
  std::string q, k, v, o, q_bias, k_bias, v_bias, q_norm, k_norm;  // MHA/GQA (and q, o for MLA)
  std::string q_a, q_a_norm, q_b, kv_a, kv_a_norm;                 // MLA
  std::string kv_b;        // MLA up-projection, [heads * (nope + v), kv_lora]
  std::string k_b, v_b;    // GGUF's split form of kv_b (empty for HF)
  std::string idx_q_b, idx_k, idx_k_norm, idx_k_norm_bias, idx_weights;  // the indexer
  std::string gate, up, down;  // dense FFN
  std::string router, router_bias;
  std::string o_bias, sinks, router_logit_bias;  // gpt-oss
  std::string gate_exps_bias, up_exps_bias, down_exps_bias;
  // Routed experts: stacked [n_experts, ...] tensors (GGUF), or one tensor per expert named
  // expert_prefix + e + "." + expert_gate/up/down (HF).
  std::string gate_exps, up_exps, down_exps;
  std::string expert_prefix, expert_gate, expert_up, expert_down;
  bool gpt_oss_hf = false;  // HF gpt-oss: experts stacked under expert_prefix (gpt_oss_experts)
  std::string sh_gate, sh_up, sh_down, sh_gate_inp;  // shared expert(s)
  // HF Qwen3.5: the experts stacked, gate and up in one [E, 2 ff, hidden] tensor (transformers
  // 5's layout), down [E, hidden, ff]; tried when the per-expert tensors are absent.
  std::string fused_gate_up, fused_down;
  // Gated DeltaNet (hybrid Qwen): GGUF's attn_qkv / attn_gate / ssm_ba or ssm_beta + ssm_alpha,
  // or legacy ssm_in (q, k, v, z per key head, as HF's in_proj_qkvz) + ssm_ba; HF's in_proj_*.
  std::string lin_qkv, lin_gate, lin_qkvz, lin_ba, lin_beta, lin_alpha;
  std::string lin_conv, lin_dt, lin_a, lin_norm, lin_out;
  bool a_log = false;        // lin_a is A_log (HF): a = -exp(A_log)
  bool zero_centred = false;  // HF hybrid norms: x * (1 + w)
};

LayerNames gguf_names(const ModelConfig& c, int64_t l) {
  const std::string p = fmt::format("blk.{}.", l);
  LayerNames n;
  n.attn_norm = p + "attn_norm.weight";
  // llama.cpp's glm4moe and gpt-oss keep HF's post_attention_layernorm as the FFN's norm.
  n.ffn_norm = p + (c.arch == ModelArch::kGlm4Moe || c.arch == ModelArch::kGptOss
                        ? "post_attention_norm.weight"
                        : "ffn_norm.weight");
  n.q = p + "attn_q.weight";
  n.k = p + "attn_k.weight";
  n.v = p + "attn_v.weight";
  n.o = p + "attn_output.weight";
  n.q_bias = p + "attn_q.bias";
  n.k_bias = p + "attn_k.bias";
  n.v_bias = p + "attn_v.bias";
  n.q_norm = p + "attn_q_norm.weight";
  n.k_norm = p + "attn_k_norm.weight";
  n.q_a = p + "attn_q_a.weight";
  n.q_a_norm = p + "attn_q_a_norm.weight";
  n.q_b = p + "attn_q_b.weight";
  n.kv_a = p + "attn_kv_a_mqa.weight";
  n.kv_a_norm = p + "attn_kv_a_norm.weight";
  n.kv_b = p + "attn_kv_b.weight";
  n.k_b = p + "attn_k_b.weight";
  n.v_b = p + "attn_v_b.weight";
  n.idx_q_b = p + "indexer.attn_q_b.weight";
  n.idx_k = p + "indexer.attn_k.weight";
  n.idx_k_norm = p + "indexer.k_norm.weight";
  n.idx_k_norm_bias = p + "indexer.k_norm.bias";
  n.idx_weights = p + "indexer.proj.weight";
  n.gate = p + "ffn_gate.weight";
  n.up = p + "ffn_up.weight";
  n.down = p + "ffn_down.weight";
  n.router = p + "ffn_gate_inp.weight";
  n.router_bias = p + "exp_probs_b.bias";
  n.o_bias = p + "attn_output.bias";
  n.sinks = p + "attn_sinks.weight";
  n.router_logit_bias = p + "ffn_gate_inp.bias";
  n.gate_exps_bias = p + "ffn_gate_exps.bias";
  n.up_exps_bias = p + "ffn_up_exps.bias";
  n.down_exps_bias = p + "ffn_down_exps.bias";
  n.gate_exps = p + "ffn_gate_exps.weight";
  n.up_exps = p + "ffn_up_exps.weight";
  n.down_exps = p + "ffn_down_exps.weight";
  n.sh_gate = p + "ffn_gate_shexp.weight";
  n.sh_up = p + "ffn_up_shexp.weight";
  n.sh_down = p + "ffn_down_shexp.weight";
  n.sh_gate_inp = p + "ffn_gate_inp_shexp.weight";
  if (detail_is_hybrid(c)) {
    n.ffn_norm = p + "post_attention_norm.weight";
    n.lin_qkv = p + "attn_qkv.weight";
    n.lin_gate = p + "attn_gate.weight";
    n.lin_qkvz = p + "ssm_in.weight";
    n.lin_ba = p + "ssm_ba.weight";
    n.lin_beta = p + "ssm_beta.weight";
    n.lin_alpha = p + "ssm_alpha.weight";
    n.lin_conv = p + "ssm_conv1d.weight";
    n.lin_dt = p + "ssm_dt.bias";
    n.lin_a = p + "ssm_a";
    n.lin_norm = p + "ssm_norm.weight";
    n.lin_out = p + "ssm_out.weight";
  }
  return n;
}

// Qwen3.5's checkpoints nest the text model: model.language_model.layers.N.
std::string hf_model_prefix(const ModelConfig& c) {
  return c.arch == ModelArch::kQwen35Moe ? "model.language_model." : "model.";
}

LayerNames hf_names(const ModelConfig& c, int64_t l) {
  const std::string p = fmt::format("{}layers.{}.", hf_model_prefix(c), l), a = p + "self_attn.";
  // Mixtral and MiniMax-M2 name the block block_sparse_moe and the experts w1 / w3 / w2.
  const bool mixtral = c.arch == ModelArch::kMixtral || c.arch == ModelArch::kMiniMaxM2;
  const std::string m = p + (mixtral ? "block_sparse_moe." : "mlp.");
  const bool plural = c.is_mla() || c.arch == ModelArch::kGlm4Moe;
  const std::string sh = m + (plural ? "shared_experts." : "shared_expert.");
  LayerNames n;
  n.attn_norm = p + "input_layernorm.weight";
  n.ffn_norm = p + "post_attention_layernorm.weight";
  n.q = a + "q_proj.weight";
  n.k = a + "k_proj.weight";
  n.v = a + "v_proj.weight";
  n.o = a + "o_proj.weight";
  n.q_bias = a + "q_proj.bias";
  n.k_bias = a + "k_proj.bias";
  n.v_bias = a + "v_proj.bias";
  n.q_norm = a + "q_norm.weight";
  n.k_norm = a + "k_norm.weight";
  n.q_a = a + "q_a_proj.weight";
  n.q_a_norm = a + "q_a_layernorm.weight";
  n.q_b = a + "q_b_proj.weight";
  n.kv_a = a + "kv_a_proj_with_mqa.weight";
  n.kv_a_norm = a + "kv_a_layernorm.weight";
  n.kv_b = a + "kv_b_proj.weight";
  n.idx_q_b = a + "indexer.wq_b.weight";
  n.idx_k = a + "indexer.wk.weight";
  n.idx_k_norm = a + "indexer.k_norm.weight";
  n.idx_k_norm_bias = a + "indexer.k_norm.bias";
  n.idx_weights = a + "indexer.weights_proj.weight";
  n.gate = p + "mlp.gate_proj.weight";
  n.up = p + "mlp.up_proj.weight";
  n.down = p + "mlp.down_proj.weight";
  n.router = m + "gate.weight";
  n.router_bias = m + (c.arch == ModelArch::kMiniMaxM2 ? "e_score_correction_bias"
                                                      : "gate.e_score_correction_bias");
  n.expert_prefix = m + "experts.";
  n.expert_gate = mixtral ? "w1.weight" : "gate_proj.weight";
  n.expert_up = mixtral ? "w3.weight" : "up_proj.weight";
  n.expert_down = mixtral ? "w2.weight" : "down_proj.weight";
  n.sh_gate = sh + "gate_proj.weight";
  n.sh_up = sh + "up_proj.weight";
  n.sh_down = sh + "down_proj.weight";
  n.sh_gate_inp = m + "shared_expert_gate.weight";
  if (c.arch == ModelArch::kGptOss) {
    n.router = m + "router.weight";
    n.router_logit_bias = m + "router.bias";
    n.o_bias = a + "o_proj.bias";
    n.sinks = a + "sinks";
    n.gpt_oss_hf = true;
  }
  if (detail_is_hybrid(c)) {
    const std::string la = p + "linear_attn.";
    n.lin_qkvz = la + "in_proj_qkvz.weight";
    n.lin_ba = la + "in_proj_ba.weight";
    n.lin_qkv = la + "in_proj_qkv.weight";
    n.lin_gate = la + "in_proj_z.weight";
    n.lin_beta = la + "in_proj_b.weight";
    n.lin_alpha = la + "in_proj_a.weight";
    n.lin_conv = la + "conv1d.weight";
    n.lin_dt = la + "dt_bias";
    n.lin_a = la + "A_log";
    n.lin_norm = la + "norm.weight";
    n.lin_out = la + "out_proj.weight";
    n.a_log = true;
    n.zero_centred = true;
    n.fused_gate_up = m + "experts.gate_up_proj";
    n.fused_down = m + "experts.down_proj";
  }
  return n;
}

// gpt-oss's HF experts (transformers' GptOssExperts), stacked per layer and rearranged here into
// the [out, in] rows of one matrix per expert that the kernels read (LoadedModel::owned):
// - the release's MXFP4: gate_up_proj_blocks [E, 2 ff, hidden / 32, 16] and _scales
//   [E, 2 ff, hidden / 32] (rows of gate and up interleaved: 2 j gate, 2 j + 1 up; a block's
//   value 2 i is byte i's low nibble, 2 i + 1 its high one; the scale an E8M0 exponent),
//   down_proj_blocks [E, hidden, ff / 32, 16] -> ggml's MXFP4 blocks (the same E8M0 byte, value i
//   in qs[i]'s low nibble and value i + 16 in its high one: convert_hf_to_gguf.py's repacking);
// - BF16 / F32 (dequantized checkpoints): gate_up_proj [E, hidden, 2 ff] (x @ W, gate and up in
//   the even / odd columns), down_proj [E, ff, hidden] -> transposed, in their dtype;
// - the biases: gate_up_proj_bias [E, 2 ff] (interleaved), down_proj_bias [E, hidden].
void gpt_oss_experts(Source& s, const ModelConfig& c, const std::string& prefix,
                     ExpertWeights& x) {
  const int64_t ne = c.n_experts, ff = c.moe_intermediate_size, hd = c.hidden_size;
  // One [ne * rows, cols] matrix of `dtype`, its rows filled by fill(row, out) (pure memory work,
  // spread over the cores: a released checkpoint's experts are tens of GB): views per expert.
  auto matrix = [&](DType dtype, int64_t rows, int64_t cols, auto&& fill) {
    const int64_t row_bytes = dtype_bytes(dtype, cols), total = ne * rows;
    uint8_t* data = s.own(static_cast<size_t>(total * row_bytes));
    const int64_t n = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 64);
    std::vector<std::thread> threads;
    for (int64_t i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        for (int64_t r = total * i / n; r < total * (i + 1) / n; ++r) {
          fill(r, data + r * row_bytes);
        }
      });
    }
    for (std::thread& t : threads) t.join();
    return ops::Weight(Tensor::dense(dtype, {total, cols}, data));
  };
  auto split = [&](const ops::Weight& all, std::vector<ops::Weight>& out, int64_t rows) {
    for (int64_t e = 0; e < ne; ++e) out.push_back(all.row_range(e * rows, rows));
  };
  const std::string gu = prefix + "gate_up_proj", dn = prefix + "down_proj";
  if (s.find(gu + "_blocks") != nullptr) {
    if (hd % 32 != 0 || ff % 32 != 0) {
      fail(ErrorKind::kFormat, "{}: MXFP4 experts need hidden ({}) and ff ({}) in 32s", gu, hd,
           ff);
    }
    // Rows of a blocks / scales pair ([E, R, C / 32, 16] and [E, R, C / 32]) as ggml MXFP4 rows.
    auto mxfp4 = [&](const std::string& base, int64_t rows_in, int64_t cols, int64_t stride,
                     int64_t offset) {
      const Tensor b = s.get(base + "_blocks", {ne, rows_in, cols / 32, 16});
      const Tensor sc = s.get(base + "_scales", {ne, rows_in, cols / 32});
      if (b.dtype != DType::kU8 || sc.dtype != DType::kU8) {
        fail(ErrorKind::kFormat, "{}_blocks / _scales: expected U8 tensors", base);
      }
      const uint8_t* blocks = b.as<const uint8_t>();
      const uint8_t* scales = sc.as<const uint8_t>();
      const int64_t out_rows = rows_in / stride;
      return matrix(DType::kMXFP4, out_rows, cols, [&](int64_t r, uint8_t* out) {
        const int64_t e = r / out_rows, src = e * rows_in + (r % out_rows) * stride + offset;
        auto* dst = reinterpret_cast<BlockMXFP4*>(out);
        for (int64_t k = 0; k < cols / 32; ++k) {
          const uint8_t* q = blocks + (src * (cols / 32) + k) * 16;
          auto nib = [q](int i) { return (q[i / 2] >> (4 * (i % 2))) & 0xF; };
          dst[k].e = scales[src * (cols / 32) + k];
          for (int i = 0; i < 16; ++i) {
            dst[k].qs[i] = static_cast<uint8_t>(nib(i) | (nib(i + 16) << 4));
          }
        }
      });
    };
    split(mxfp4(gu, 2 * ff, hd, 2, 0), x.gate, ff);
    split(mxfp4(gu, 2 * ff, hd, 2, 1), x.up, ff);
    split(mxfp4(dn, hd, ff, 1, 0), x.down, hd);
  } else {
    const Tensor g = s.get(gu, {ne, hd, 2 * ff});
    const Tensor d = s.get(dn, {ne, ff, hd});
    if (g.dtype != DType::kBF16 && g.dtype != DType::kF32) {
      fail(ErrorKind::kUnsupported, "{}: experts of type {} (BF16, F32 or MXFP4 blocks)", gu,
           dtype_info(g.dtype).name);
    }
    // Element (i, j) of expert e's [rows, cols] transpose is element (j, i * step + offset) of
    // the stored [e][cols][rows * step] (elements of `size` bytes).
    auto transposed = [&](const Tensor& t, int64_t rows, int64_t cols, int64_t step,
                          int64_t offset) {
      const size_t size = dtype_info(t.dtype).block_bytes;
      const auto* src = static_cast<const uint8_t*>(t.data);
      return matrix(t.dtype, rows, cols, [&](int64_t r, uint8_t* out) {
        const int64_t e = r / rows, i = r % rows;
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t at = (e * cols + j) * rows * step + i * step + offset;
          std::memcpy(out + j * size, src + at * size, size);
        }
      });
    };
    if (d.dtype != g.dtype) fail(ErrorKind::kFormat, "{}: a dtype other than {}'s", dn, gu);
    split(transposed(g, ff, hd, 2, 0), x.gate, ff);
    split(transposed(g, ff, hd, 2, 1), x.up, ff);
    split(transposed(d, hd, ff, 1, 0), x.down, hd);
  }
  const std::vector<float> gub = s.get_f32(gu + "_bias", {ne, 2 * ff});
  for (int64_t i = 0; i < ne * ff; ++i) {
    x.gate_bias.push_back(gub[2 * i]);
    x.up_bias.push_back(gub[2 * i + 1]);
  }
  x.down_bias = s.get_f32(dn + "_bias", {ne, hd});
}

// A Gated DeltaNet layer's tensors (LayerWeights::DeltaNet): the projections as stored and where
// each value of theirs lands, the convolution transposed, dt_bias, a = -exp(A_log), the gated
// norm, out_proj.
void load_delta_net(Source& s, const ModelConfig& c, const LayerNames& n, bool from_gguf,
                    LayerWeights::DeltaNet& d) {
  const int64_t hd = c.hidden_size, nk = c.linear_num_key_heads, nv = c.linear_num_value_heads;
  const int64_t hk = c.linear_key_head_dim, hv = c.linear_value_head_dim, r = nv / nk;
  const int64_t qk = nk * hk, vdim = nv * hv, ch = c.linear_conv_channels();
  const int64_t K = c.linear_conv_kernel;
  d.conv_src.resize(static_cast<size_t>(ch));
  d.z_src.resize(static_cast<size_t>(vdim));
  d.beta_src.resize(static_cast<size_t>(nv));
  d.alpha_src.resize(static_cast<size_t>(nv));
  // beta / alpha from a [2 nv] projection at `at` laid out per key head: [beta (r), alpha (r)].
  auto grouped_ba = [&](int64_t at) {
    for (int64_t h = 0; h < nv; ++h) {
      const int64_t g = h / r, j = h % r;
      d.beta_src[h] = static_cast<int32_t>(at + g * 2 * r + j);
      d.alpha_src[h] = static_cast<int32_t>(at + g * 2 * r + r + j);
    }
  };
  const bool qkvz = s.find(n.lin_qkvz) != nullptr;
  if (qkvz) {
    // Per key head g: [q (hk), k (hk), v (r hv), z (r hv)] (HF Qwen3-Next, legacy GGUF ssm_in).
    const int64_t G = 2 * hk + 2 * r * hv;
    d.in.push_back(s.get_w(n.lin_qkvz, {ch + vdim, hd}));
    for (int64_t i = 0; i < ch; ++i) {
      int64_t src;
      if (i < qk) {
        src = (i / hk) * G + i % hk;
      } else if (i < 2 * qk) {
        src = ((i - qk) / hk) * G + hk + (i - qk) % hk;
      } else {
        const int64_t j = i - 2 * qk;
        src = (j / (r * hv)) * G + 2 * hk + j % (r * hv);
      }
      d.conv_src[static_cast<size_t>(i)] = static_cast<int32_t>(src);
    }
    for (int64_t i = 0; i < vdim; ++i) {
      d.z_src[static_cast<size_t>(i)] =
          static_cast<int32_t>((i / (r * hv)) * G + 2 * hk + r * hv + i % (r * hv));
    }
  } else {
    d.in.push_back(s.get_w(n.lin_qkv, {ch, hd}));
    d.in.push_back(s.get_w(n.lin_gate, {vdim, hd}));
    for (int64_t i = 0; i < ch; ++i) d.conv_src[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    for (int64_t i = 0; i < vdim; ++i) {
      d.z_src[static_cast<size_t>(i)] = static_cast<int32_t>(ch + i);
    }
  }
  const int64_t at = ch + vdim;
  if (s.find(n.lin_ba) != nullptr) {
    d.in.push_back(s.get_w(n.lin_ba, {2 * nv, hd}));
    grouped_ba(at);
  } else {
    d.in.push_back(s.get_w(n.lin_beta, {nv, hd}));
    d.in.push_back(s.get_w(n.lin_alpha, {nv, hd}));
    for (int64_t h = 0; h < nv; ++h) {
      d.beta_src[static_cast<size_t>(h)] = static_cast<int32_t>(at + h);
      d.alpha_src[static_cast<size_t>(h)] = static_cast<int32_t>(at + nv + h);
    }
  }
  d.in_rows = at + 2 * nv;
  const std::vector<float> conv =
      from_gguf ? s.get_f32(n.lin_conv, {ch, K}) : s.get_f32(n.lin_conv, {ch, 1, K});
  d.conv_t.resize(static_cast<size_t>(K * ch));
  for (int64_t i = 0; i < ch; ++i) {
    for (int64_t j = 0; j < K; ++j) d.conv_t[j * ch + i] = conv[i * K + j];
  }
  d.dt_bias = s.get_f32(n.lin_dt, nv);
  d.a = s.get_f32(n.lin_a, nv);
  if (n.a_log) {
    // As convert_hf_to_gguf.py computes ssm_a: -exp(A_log) (here in double, rounded once).
    for (float& v : d.a) v = static_cast<float>(-std::exp(static_cast<double>(v)));
  }
  d.norm = s.get_f32(n.lin_norm, hv);
  d.out = s.get_w(n.lin_out, {hd, vdim});
  // llama.cpp's qwen35moe files hold the value heads tiled (convert_hf_to_gguf.py reorders them).
  d.tiled = from_gguf && c.arch == ModelArch::kQwen35Moe;
}

// A norm's weights: HF's Qwen3-Next / Qwen3.5 norms are zero-centred (x * (1 + w)); GGUF files
// hold 1 + w.
std::vector<float> load_norm(Source& s, const LayerNames& n, const std::string& name,
                             int64_t count) {
  std::vector<float> v = s.get_f32(name, count);
  if (n.zero_centred) {
    for (float& x : v) x += 1.0f;
  }
  return v;
}

// Multi-head latent attention (DeepSeek-V3, Kimi-K2): q (low-rank or not), the compressed kv and
// its per-head up projections, o, and on index layers the sparse-attention indexer.
void load_mla(Source& s, const ModelConfig& c, int64_t l, const LayerNames& n, LayerWeights& w) {
  const int64_t hd = c.hidden_size;
  const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  if (c.q_lora_rank > 0) {
    w.wq_a = s.get_w(n.q_a, {c.q_lora_rank, hd});
    w.q_a_norm = s.get_f32(n.q_a_norm, c.q_lora_rank);
    w.wq_b = s.get_w(n.q_b, {c.num_heads * qk, c.q_lora_rank});
  } else {
    w.wq = s.get_w(n.q, {c.num_heads * qk, hd});
  }
  w.wkv_a = s.get_w(n.kv_a, {c.kv_lora_rank + c.qk_rope_head_dim, hd});
  w.kv_a_norm = s.get_f32(n.kv_a_norm, c.kv_lora_rank);
  if (!n.k_b.empty() && s.find(n.k_b) != nullptr) {
    // GGUF's split form: attn_k_b is W_UK transposed per head, attn_v_b is W_UV. A file may
    // keep the unsplit attn_kv_b beside them.
    s.known(n.kv_b);
    const ops::Weight kb = s.get_w(n.k_b, {c.num_heads, c.kv_lora_rank, c.qk_nope_head_dim});
    const ops::Weight vb = s.get_w(n.v_b, {c.num_heads, c.v_head_dim, c.kv_lora_rank});
    w.k_up_transposed = true;
    for (int64_t h = 0; h < c.num_heads; ++h) {
      w.k_up.push_back(kb.row_range(h * c.kv_lora_rank, c.kv_lora_rank));
      w.v_up.push_back(vb.row_range(h * c.v_head_dim, c.v_head_dim));
    }
  } else {
    const int64_t per = c.qk_nope_head_dim + c.v_head_dim;
    const ops::Weight kvb = s.get_w(n.kv_b, {c.num_heads * per, c.kv_lora_rank});
    for (int64_t h = 0; h < c.num_heads; ++h) {
      w.k_up.push_back(kvb.row_range(h * per, c.qk_nope_head_dim));
      w.v_up.push_back(kvb.row_range(h * per + c.qk_nope_head_dim, c.v_head_dim));
    }
  }
  w.wo = s.get_w(n.o, {hd, c.num_heads * c.v_head_dim});
  if (c.is_index_layer(l)) {
    const int64_t d = c.index_head_dim;
    w.idx_wq_b = s.get_w(n.idx_q_b, {c.index_n_heads * d, c.q_lora_rank});
    w.idx_wk = s.get_w(n.idx_k, {d, hd});
    w.idx_k_norm = s.get_f32(n.idx_k_norm, d);
    w.idx_k_norm_bias = s.get_f32(n.idx_k_norm_bias, d);
    w.idx_weights = s.get_w(n.idx_weights, {c.index_n_heads, hd});
  }
}

// Grouped-query attention: q, k, v, o, and the biases, sinks and q / k norms of the
// architectures that have them.
void load_attention(Source& s, const ModelConfig& c, const LayerNames& n, LayerWeights& w) {
  const int64_t hd = c.hidden_size, d = c.head_dim;
  // (With the output gate, q_proj gives each head its query and its gate: twice the rows.)
  w.wq = s.get_w(n.q, {(c.attn_output_gate ? 2 : 1) * c.num_heads * d, hd});
  w.wk = s.get_w(n.k, {c.num_kv_heads * d, hd});
  w.wv = s.get_w(n.v, {c.num_kv_heads * d, hd});
  w.wo = s.get_w(n.o, {hd, c.num_heads * d});
  if (c.attention_bias) {
    w.bq = s.get_f32(n.q_bias, c.num_heads * d);
    w.bk = s.get_f32(n.k_bias, c.num_kv_heads * d);
    w.bv = s.get_f32(n.v_bias, c.num_kv_heads * d);
  }
  if (c.arch == ModelArch::kGptOss) w.bo = s.get_f32(n.o_bias, hd);
  if (c.attn_sinks) w.sinks = s.get_f32(n.sinks, c.num_heads);
  if (c.qk_norm) {
    // Per head (head_dim weights), or over all heads at once (MiniMax-M2).
    w.q_norm = load_norm(s, n, n.q_norm, c.qk_norm_all_heads ? c.num_heads * d : d);
    w.k_norm = load_norm(s, n, n.k_norm, c.qk_norm_all_heads ? c.num_kv_heads * d : d);
  }
}

// The routed experts, one matrix view each, from whichever form the file stores them in:
// gpt-oss's HF tensors, GGUF's stacked ones, HF's fused gate_up, or one tensor per expert.
void load_routed_experts(Source& s, const ModelConfig& c, const LayerNames& n, ExpertWeights& x) {
  const int64_t hd = c.hidden_size, ne = c.n_experts, ff = c.moe_intermediate_size;
  if (n.gpt_oss_hf) {
    gpt_oss_experts(s, c, n.expert_prefix, x);
  } else if (!n.gate_exps.empty()) {
    if (c.arch == ModelArch::kGptOss) {
      x.gate_bias = s.get_f32(n.gate_exps_bias, {ne, ff});
      x.up_bias = s.get_f32(n.up_exps_bias, {ne, ff});
      x.down_bias = s.get_f32(n.down_exps_bias, {ne, hd});
    }
    const ops::Weight g = s.get_w(n.gate_exps, {ne, ff, hd});
    const ops::Weight u = s.get_w(n.up_exps, {ne, ff, hd});
    const ops::Weight dn = s.get_w(n.down_exps, {ne, hd, ff});
    for (int64_t e = 0; e < ne; ++e) {
      x.gate.push_back(g.row_range(e * ff, ff));
      x.up.push_back(u.row_range(e * ff, ff));
      x.down.push_back(dn.row_range(e * hd, hd));
    }
  } else if (!n.fused_gate_up.empty() && s.find(n.fused_gate_up) != nullptr) {
    // Stacked experts: gate and up as the two halves of each expert's 2 ff rows.
    const ops::Weight gu = s.get_w(n.fused_gate_up, {ne, 2 * ff, hd});
    const ops::Weight dn = s.get_w(n.fused_down, {ne, hd, ff});
    if (gu.t.dtype == DType::kF8E4M3 || dn.t.dtype == DType::kF8E4M3) {
      fail(ErrorKind::kUnsupported, "{}: stacked FP8 experts ('{}') are not supported", s.path(),
           n.fused_gate_up);
    }
    for (int64_t e = 0; e < ne; ++e) {
      x.gate.push_back(gu.row_range(e * 2 * ff, ff));
      x.up.push_back(gu.row_range(e * 2 * ff + ff, ff));
      x.down.push_back(dn.row_range(e * hd, hd));
    }
  } else {
    for (int64_t e = 0; e < ne; ++e) {
      const std::string prefix = fmt::format("{}{}.", n.expert_prefix, e);
      x.gate.push_back(s.get_w(prefix + n.expert_gate, {ff, hd}));
      x.up.push_back(s.get_w(prefix + n.expert_up, {ff, hd}));
      x.down.push_back(s.get_w(prefix + n.expert_down, {hd, ff}));
    }
  }
}

// An MoE layer's FFN: the router and its biases, the routed experts, the shared expert.
void load_moe(Source& s, const ModelConfig& c, const LayerNames& n, LayerWeights& w) {
  const int64_t hd = c.hidden_size, ne = c.n_experts;
  w.router = s.get_w(n.router, {ne, hd});
  if (c.has_e_score_correction_bias) w.router_bias = s.get_f32(n.router_bias, ne);
  if (c.arch == ModelArch::kGptOss) w.router_logit_bias = s.get_f32(n.router_logit_bias, ne);
  w.experts.swiglu_limit = c.swiglu_limit;
  load_routed_experts(s, c, n, w.experts);
  if (c.shared_expert_intermediate_size > 0) {
    const int64_t sf = c.shared_expert_intermediate_size;
    w.sh_gate = s.get_w(n.sh_gate, {sf, hd});
    w.sh_up = s.get_w(n.sh_up, {sf, hd});
    w.sh_down = s.get_w(n.sh_down, {hd, sf});
    if (c.shared_expert_gate) w.sh_gate_inp = s.get_f32(n.sh_gate_inp, hd);
  }
}

// One decoder layer's tensors: its norms, its attention (Gated DeltaNet, MLA or grouped-query,
// by architecture and layer), its FFN (dense or MoE).
void load_layer(Source& s, const ModelConfig& c, int64_t l, const LayerNames& n, LayerWeights& w,
                bool from_gguf) {
  const int64_t hd = c.hidden_size;
  w.attn_norm = load_norm(s, n, n.attn_norm, hd);
  w.ffn_norm = load_norm(s, n, n.ffn_norm, hd);
  if (c.is_linear_layer(l)) {
    load_delta_net(s, c, n, from_gguf, w.delta);
  } else if (c.is_mla()) {
    load_mla(s, c, l, n, w);
  } else {
    load_attention(s, c, n, w);
  }
  w.moe = c.is_moe_layer(l);
  if (!w.moe) {
    const int64_t ff = c.intermediate_size;
    w.ffn_gate = s.get_w(n.gate, {ff, hd});
    w.ffn_up = s.get_w(n.up, {ff, hd});
    w.ffn_down = s.get_w(n.down, {hd, ff});
    return;
  }
  load_moe(s, c, n, w);
}

}  // namespace

uint64_t model_file_bytes(const std::filesystem::path& path) {
  std::error_code ec;
  uint64_t bytes = 0;
  if (std::filesystem::is_directory(path, ec)) {
    for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
      if (e.path().extension() == ".safetensors") bytes += e.file_size(ec);
    }
    return ec ? 0 : bytes;
  }
  bytes = std::filesystem::file_size(path, ec);
  return ec ? 0 : bytes;
}

void release_model_pages(const LoadedModel& model) {
  if (model.gguf) model.gguf->release_pages();
  if (model.safetensors) model.safetensors->release_pages();
}

namespace {

// The layer a tensor name belongs to ("blk.12.", "model.layers.12."), -1 for none.
int64_t layer_of(const std::string& name) {
  for (const char* prefix : {"blk.", "model.layers.", "model.language_model.layers."}) {
    if (!name.starts_with(prefix)) continue;
    const char* digits = name.c_str() + std::strlen(prefix);
    char* end = nullptr;
    const long long l = std::strtoll(digits, &end, 10);
    if (end != digits && *end == '.') return l;
  }
  return -1;
}

// Every tensor of the checkpoint must be one the model its config describes reads: a config
// declaring fewer layers, experts or no shared experts than the file holds would otherwise run
// a truncated model without a word. Known extras are let through: rotary tables some
// checkpoints store, and the multi-token-prediction layers after the last one.
void check_all_tensors_used(const LoadedModel& m, const Source& s, int64_t mtp_layers) {
  std::vector<std::string> unused;
  auto consider = [&](const std::string& name) {
    // (Qwen3.5 / Qwen3-Next: the MTP block under mtp.*, the vision tower under model.visual.)
    if (s.used(name) || name.ends_with("rotary_emb.inv_freq") || name == "rope_freqs.weight" ||
        name.ends_with(".attn_rot_embd") || name.starts_with("mtp.") ||
        name.starts_with("model.visual.")) {
      return;
    }
    const int64_t l = layer_of(name);
    if (l >= m.config.num_layers && l < m.config.num_layers + mtp_layers) return;
    unused.push_back(name);
  };
  if (m.gguf) {
    for (const GgufTensorInfo& t : m.gguf->tensors()) consider(t.name);
  } else {
    for (const SafetensorsTensorInfo& t : m.safetensors->tensors()) consider(t.name);
  }
  if (unused.empty()) return;
  std::string names;
  for (size_t i = 0; i < unused.size() && i < 4; ++i) {
    names += fmt::format("{}'{}'", i ? ", " : "", unused[i]);
  }
  fail(ErrorKind::kFormat,
       "{}: {} tensor(s) that the {} model of its config ({} layers, {} experts, {} shared) does "
       "not read: {}{}; the config and the weights disagree",
       m.path.string(), unused.size(), arch_name(m.config.arch), m.config.num_layers,
       m.config.n_experts, m.config.n_shared_experts, names, unused.size() > 4 ? ", ..." : "");
}

}  // namespace

LoadedModel load_model(const std::filesystem::path& path, LoadMode mode) {
  LoadedModel m;
  m.path = path;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    fail(ErrorKind::kIo, "{}: no such file or directory", path.string());
  }
  const bool dir = std::filesystem::is_directory(path);
  if (!dir && path.extension() == ".gguf") {
    m.gguf = std::make_shared<GgufFile>(GgufFile::open(path, mode));
    m.config = config_from_gguf(*m.gguf);
    m.from_gguf = true;
  } else if (dir) {
    m.config = config_from_hf_json(path / "config.json");
    m.safetensors = std::make_shared<SafetensorsModel>(SafetensorsModel::open(path, mode));
  } else {
    fail(ErrorKind::kInvalidArgument, "{}: not a .gguf file or an HF checkpoint directory",
         path.string());
  }
  const ModelConfig& c = m.config;
  Source s(m);
  // DeepSeek-V3's multi-token-prediction layers follow the last layer; they are not run.
  int64_t mtp_layers = 0;
  if (m.from_gguf) {
    const std::string key =
        fmt::format("{}.nextn_predict_layers", m.gguf->get_string("general.architecture", ""));
    mtp_layers = std::clamp<int64_t>(m.gguf->get_int(key, 0), 0, 64);
  }
  if (!m.from_gguf) {
    // FP8 checkpoints name their block shape in config.json (DeepSeek-V3: [128, 128]).
    const nlohmann::json j =
        nlohmann::json::parse(read_input_file(path / "config.json", kMaxConfigFileBytes), nullptr,
                              /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("quantization_config") &&
        j["quantization_config"].contains("weight_block_size")) {
      const auto& b = j["quantization_config"]["weight_block_size"];
      if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() ||
          !b[1].is_number_integer() || b[0].get<int64_t>() <= 0 || b[1].get<int64_t>() <= 0) {
        fail(ErrorKind::kFormat,
             "{}: quantization_config.weight_block_size must be two positive "
             "integers",
             (path / "config.json").string());
      }
      s.set_fp8_block(b[0].get<int64_t>(), b[1].get<int64_t>());
    }
    if (j.is_object() && j.contains("quantization_config") &&
        j["quantization_config"].is_object()) {
      const nlohmann::json& q = j["quantization_config"];
      const std::string where = (path / "config.json").string();
      try {
        const std::string method = q.value("quant_method", "");
        if (method == "compressed-tensors") {
          s.set_compressed_tensors(parse_compressed_tensors(q, where));
        } else if (method == "gptq") {
          s.set_gptq(parse_gptq(q, where));
        } else if (method != "fp8" && method != "mxfp4") {
          fail(ErrorKind::kUnsupported, "{}: quantization_config.quant_method '{}': tandem reads "
               "fp8 (block scales), mxfp4 (gpt-oss), compressed-tensors (INT4, FP8) and gptq "
               "(INT4) checkpoints", where, method);
        }
      } catch (const nlohmann::json::exception& e) {  // (a field of the wrong type)
        fail(ErrorKind::kFormat, "{}: quantization_config: {}", where, e.what());
      }
    }
    if (j.is_object() && j.contains("num_nextn_predict_layers") &&
        j["num_nextn_predict_layers"].is_number_integer()) {
      mtp_layers = std::clamp<int64_t>(j["num_nextn_predict_layers"].get<int64_t>(), 0, 64);
    }
  }
  m.layers.resize(static_cast<size_t>(c.num_layers));
  if (m.from_gguf) {
    m.embed = s.get("token_embd.weight", {c.vocab_size, c.hidden_size});
    m.out_norm = s.get_f32("output_norm.weight", c.hidden_size);
    const bool has_out = s.find("output.weight") != nullptr;
    m.lm_head =
        has_out ? s.get_w("output.weight", {c.vocab_size, c.hidden_size}) : ops::Weight(m.embed);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      load_layer(s, c, l, gguf_names(c, l), m.layers[l], true);
    }
  } else {
    const std::string p = hf_model_prefix(c);
    m.embed = s.get(p + "embed_tokens.weight", {c.vocab_size, c.hidden_size});
    m.out_norm = s.get_f32(p + "norm.weight", c.hidden_size);
    if (detail_is_hybrid(c)) {
      for (float& x : m.out_norm) x += 1.0f;  // (zero-centred)
    }
    const bool has_out = s.find("lm_head.weight") != nullptr;
    m.lm_head =
        has_out ? s.get_w("lm_head.weight", {c.vocab_size, c.hidden_size}) : ops::Weight(m.embed);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      load_layer(s, c, l, hf_names(c, l), m.layers[l], false);
    }
  }
  check_all_tensors_used(m, s, mtp_layers);
  return m;
}

std::string model_summary(const LoadedModel& m) {
  const ParamCount pc = count_params(m.config);
  std::string types;
  for (const auto& [name, bytes] : m.bytes_by_dtype) {
    types += fmt::format("{}{} {:.1f} MiB", types.empty() ? "" : ", ", name, bytes / 1048576.0);
  }
  return fmt::format(
      "{} ({}), {} layers, {:.2f} M parameters ({:.2f} M active per token), weights {:.1f} MiB "
      "({})",
      arch_name(m.config.arch), m.from_gguf ? "GGUF" : "HF safetensors", m.config.num_layers,
      pc.total / 1e6, pc.active_per_token / 1e6, m.weight_bytes / 1048576.0, types);
}

uint64_t page_in_model(const LoadedModel& model) {
  if ((model.gguf && model.gguf->in_memory()) ||
      (model.safetensors && model.safetensors->in_memory())) {
    return 0;
  }
  std::vector<std::pair<const uint8_t*, uint64_t>> ranges;
  if (model.gguf) {
    for (const GgufTensorInfo& t : model.gguf->tensors()) {
      ranges.emplace_back(model.gguf->tensor_data(t), t.nbytes);
    }
  } else if (model.safetensors) {
    for (const SafetensorsTensorInfo& t : model.safetensors->tensors()) {
      ranges.emplace_back(t.data, t.nbytes);
    }
  }
  uint64_t total = 0;
  for (const auto& r : ranges) total += r.second;
  const uint64_t available = meminfo_bytes("MemAvailable");
  if (available > 0 && total > available / 10 * 9) {
    log_info("{}: {} of tensors, {} of memory available: pages load on demand",
             model.path.string(), format_binary_bytes(total), format_binary_bytes(available));
    return 0;
  }
  constexpr uint64_t kPage = 4096, kChunk = 64ull << 20;
  Progress progress("loading", total);
  volatile uint8_t sink = 0;
  for (const auto& [data, bytes] : ranges) {
    for (uint64_t chunk = 0; chunk < bytes; chunk += kChunk) {
      const uint64_t end = std::min(bytes, chunk + kChunk);
      // One read per page faults it in; the mapping is read-only, so nothing is written.
      for (uint64_t off = chunk; off < end; off += kPage) sink = sink + data[off];
      progress.add(end - chunk);
    }
  }
  progress.finish();
  return total;
}

}  // namespace tandem
