// `tandem show -m PATH`: what a model file is -- architecture, every ModelConfig field, parameter
// counts (total, routed experts, active per token), tensors per dtype with their bytes, and the
// size on disk -- for a GGUF file or an HF checkpoint directory.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <map>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/model_config.h"
#include "formats/safetensors.h"
#include "formats/synth.h"
#include "tools/command.h"

namespace tandem::tools {
namespace {

namespace fs = std::filesystem;

std::string params(int64_t n) {
  const double x = static_cast<double>(n);
  if (x >= 1e12) return fmt::format("{:.2f} T", x / 1e12);
  if (x >= 1e9) return fmt::format("{:.2f} B", x / 1e9);
  if (x >= 1e6) return fmt::format("{:.2f} M", x / 1e6);
  if (x >= 1e3) return fmt::format("{:.1f} K", x / 1e3);
  return fmt::format("{}", n);
}

struct DTypeTotals {
  int64_t tensors = 0;
  int64_t elements = 0;
  uint64_t bytes = 0;
};

void print_config(const ModelConfig& c) {
  auto row = [](const char* name, const std::string& value) {
    fmt::print("  {:<34}{}\n", name, value);
  };
  auto num = [&](const char* name, int64_t v) { row(name, fmt::format("{}", v)); };
  auto flag = [&](const char* name, bool v) { row(name, v ? "yes" : "no"); };
  num("vocab_size", c.vocab_size);
  num("hidden_size", c.hidden_size);
  num("num_layers", c.num_layers);
  num("num_heads", c.num_heads);
  num("num_kv_heads", c.num_kv_heads);
  num("head_dim", c.head_dim);
  num("v_head_dim", c.v_head_dim);
  num("rope_dim", c.rope_dim);
  num("intermediate_size", c.intermediate_size);
  num("moe_intermediate_size", c.moe_intermediate_size);
  num("n_experts", c.n_experts);
  num("n_experts_per_tok", c.n_experts_per_tok);
  num("shared_expert_intermediate_size", c.shared_expert_intermediate_size);
  if (c.n_shared_experts > 0) num("n_shared_experts", c.n_shared_experts);
  if (c.shared_expert_gate) flag("shared_expert_gate", true);
  row("moe layers", fmt::format("{} of {} (first_k_dense_replace {}, freq {})", c.num_moe_layers(),
                                c.num_layers, c.first_k_dense_replace, c.moe_layer_freq));
  if (c.is_mla()) {
    num("q_lora_rank", c.q_lora_rank);
    num("kv_lora_rank", c.kv_lora_rank);
    num("qk_nope_head_dim", c.qk_nope_head_dim);
    num("qk_rope_head_dim", c.qk_rope_head_dim);
  }
  row("routing",
      fmt::format("{} / {}, groups {} (use {}), norm_topk_prob {}, scale {}",
                  scoring_func_name(c.scoring), topk_method_name(c.topk_method), c.n_group,
                  c.topk_group, c.norm_topk_prob ? "yes" : "no", c.routed_scaling_factor));
  if (c.has_e_score_correction_bias) flag("e_score_correction_bias", true);
  row("rms_norm_eps", fmt::format("{}", c.rms_norm_eps));
  row("rope_theta", fmt::format("{}", c.rope_theta));
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == RopeScalingType::kYarn) {
    row("rope_scaling", fmt::format("yarn factor {} original {} beta {}/{} mscale {}/{}", rs.factor,
                                    rs.original_max_position_embeddings, rs.beta_fast, rs.beta_slow,
                                    rs.mscale, rs.mscale_all_dim));
  } else {
    row("rope_scaling", rs.type == RopeScalingType::kLinear
                            ? fmt::format("linear factor {}", rs.factor)
                            : std::string("none"));
  }
  num("max_position_embeddings", c.max_position_embeddings);
  flag("attention_bias", c.attention_bias);
  flag("qk_norm", c.qk_norm);
  if (c.qk_norm_all_heads) flag("qk_norm_all_heads", true);
  if (c.attn_output_gate) flag("attention output gate", true);
  if (c.rope_sections != std::array<int64_t, 4>{}) {
    row("rope sections", fmt::format("{}", fmt::join(c.rope_sections, ", ")));
  }
  if (c.has_linear_layers()) {
    row("linear attention (Gated DeltaNet)",
        fmt::format("{} of {} layers (full attention every {})", c.num_linear_layers(),
                    c.num_layers, c.full_attention_interval));
    row("linear heads",
        fmt::format("k {} x {}, v {} x {}, conv {}", c.linear_num_key_heads, c.linear_key_head_dim,
                    c.linear_num_value_heads, c.linear_value_head_dim, c.linear_conv_kernel));
    row("recurrent state", fmt::format("{} floats per sequence and linear layer", c.linear_state_floats()));
  }
  if (c.nextn_layers > 0) num("nextn_layers (not run)", c.nextn_layers);
  flag("tie_word_embeddings", c.tie_word_embeddings);
  if (c.sliding_window > 0) num("sliding_window", c.sliding_window);
  if (c.swa_period > 0) {
    row("window layers",
        fmt::format("{} of every {} (from layer 0)", c.swa_period - 1, c.swa_period));
  }
  if (c.attn_sinks) flag("attention sinks", true);
  if (c.swiglu_limit > 0) row("swiglu", fmt::format("clamped at {} (alpha 1.702)", c.swiglu_limit));
  num("bos_token_id", c.bos_token_id);
  num("eos_token_id", c.eos_token_id);
}

void print_summary(const ModelConfig& c, const std::map<std::string, DTypeTotals>& by_dtype,
                   uint64_t file_bytes) {
  fmt::print("architecture  {} ({})\n", arch_name(c.arch), hf_architecture_name(c.arch));
  fmt::print("config\n");
  print_config(c);
  const ParamCount p = count_params(c);
  fmt::print("parameters    total {}, routed experts {} ({:.1f}%), active per token {}\n",
             params(p.total), params(p.routed_experts),
             p.total > 0 ? 100.0 * static_cast<double>(p.routed_experts) / p.total : 0.0,
             params(p.active_per_token));
  int64_t tensors = 0, elements = 0;
  uint64_t bytes = 0;
  for (const auto& [name, t] : by_dtype) {
    tensors += t.tensors;
    elements += t.elements;
    bytes += t.bytes;
  }
  fmt::print("tensors       {} ({} elements, {})\n", tensors, params(elements),
             format_bytes_si(bytes));
  for (const auto& [name, t] : by_dtype) {
    fmt::print("  {:<10}{:>8} tensors  {:>12}  {:>10}\n", name, t.tensors, params(t.elements),
               format_bytes_si(t.bytes));
  }
  fmt::print("file size     {} ({} bytes)\n", format_bytes_si(file_bytes), file_bytes);
}

int64_t numel(int ndim, const std::array<int64_t, 4>& shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

void show_gguf(const fs::path& path) {
  const GgufFile f = GgufFile::open(path);
  const ModelConfig c = config_from_gguf(f);
  std::map<std::string, DTypeTotals> by_dtype;
  for (const GgufTensorInfo& t : f.tensors()) {
    DTypeTotals& d = by_dtype[std::string(dtype_name(t.dtype))];
    ++d.tensors;
    d.elements += numel(t.ndim, t.shape);
    d.bytes += t.nbytes;
  }
  // A split GGUF: every shard's bytes (its first shard's metadata).
  const std::vector<std::filesystem::path> shards = f.shard_paths();
  uint64_t file_bytes = 0;
  for (const std::filesystem::path& p : shards) file_bytes += std::filesystem::file_size(p);
  const std::string split =
      shards.size() > 1 ? fmt::format(", split in {} files", shards.size()) : "";
  fmt::print("model         {} (GGUF v{}, {} metadata keys{})\n", path.string(), f.version(),
             f.metadata().size(), split);
  const std::string name = f.get_string("general.name", "");
  if (!name.empty()) fmt::print("name          {}\n", name);
  fmt::print("file type     {}\n", f.get_int("general.file_type", -1));
  print_summary(c, by_dtype, file_bytes);
}

void show_hf(const fs::path& dir) {
  const ModelConfig c = config_from_hf_json(dir / "config.json");
  const SafetensorsModel m = SafetensorsModel::open(dir);
  std::map<std::string, DTypeTotals> by_dtype;
  for (const SafetensorsTensorInfo& t : m.tensors()) {
    DTypeTotals& d = by_dtype[std::string(dtype_name(t.dtype))];
    ++d.tensors;
    d.elements += numel(t.ndim, t.shape);
    d.bytes += t.nbytes;
  }
  uint64_t bytes = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file()) bytes += entry.file_size();
  }
  fmt::print("model         {} (HF checkpoint, {} safetensors file{})\n", dir.string(),
             m.num_shards(), m.num_shards() == 1 ? "" : "s");
  print_summary(c, by_dtype, bytes);
}

void run_show(const std::string& model) {
  const fs::path path(model);
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(ErrorKind::kIo, "-m {}: no such file or directory", model);
  if (fs::is_directory(path, ec)) {
    show_hf(path);
  } else if (path.filename() == "config.json") {
    show_hf(path.parent_path().empty() ? fs::path(".") : path.parent_path());
  } else {
    show_gguf(path);
  }
}

void add_show(CLI::App& app) {
  auto model = std::make_shared<std::string>();
  app.add_option("-m,--model", *model, "a .gguf file or an HF checkpoint directory")->required();
  app.callback([model] { run_show(*model); });
}

Registrar reg("show", "Summarize a model: architecture, config, parameters, tensors, size",
              add_show);

}  // namespace
}  // namespace tandem::tools
