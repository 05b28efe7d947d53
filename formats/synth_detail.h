// Internals of the synthetic-model layouts shared by their translation units (synth_layout.cpp,
// synth_hybrid.cpp); not an API.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/synth.h"

namespace tandem::detail {

class HfBuilder {
 public:
  void add(std::string name, std::vector<int64_t> shape, WeightRole role, int64_t fan_in = 0) {
    specs.push_back({std::move(name), std::move(shape), role, fan_in});
  }
  std::vector<HfTensorSpec> specs;
};

// Locates HF tensors by name while the GGUF list is built.
class HfIndex {
 public:
  explicit HfIndex(const std::vector<HfTensorSpec>& hf) : hf_(hf) {}
  size_t operator()(const std::string& name) const {
    for (size_t i = hint_; i < hf_.size(); ++i) {
      if (hf_[i].name == name) return hint_ = i;
    }
    for (size_t i = 0; i < hint_; ++i) {
      if (hf_[i].name == name) return hint_ = i;
    }
    TD_CHECK(false, "no HF tensor '{}' for the GGUF layout", name);
    return 0;
  }
  const HfTensorSpec& spec(size_t i) const { return hf_[i]; }

 private:
  const std::vector<HfTensorSpec>& hf_;
  mutable size_t hint_ = 0;
};

// Builds the GGUF tensor list, each tensor's rows mapped onto the HF tensors it converts.
class GgufBuilder {
 public:
  explicit GgufBuilder(const std::vector<HfTensorSpec>& hf) : index(hf) {}
  // A GGUF tensor whose rows are the HF tensor's rows (possibly with another rank); + offset (a
  // zero-centred norm's 1).
  void direct(std::string name, const std::string& hf_name, float offset = 0.0f,
              std::optional<std::vector<int64_t>> shape = std::nullopt);
  // Per-expert [rows, cols] HF tensors <prefix><expert><suffix> stacked into
  // [n_experts, rows, cols].
  void stacked(std::string name, int64_t n_experts, const std::string& prefix,
               const std::string& suffix);
  void add(GgufTensorSpec t) { specs.push_back(std::move(t)); }

  HfIndex index;
  std::vector<GgufTensorSpec> specs;
};

// The Qwen3-Next / Qwen3.5-MoE layouts (synth_hybrid.cpp).
std::vector<HfTensorSpec> qwen_hybrid_hf_specs(const ModelConfig& c);
std::vector<GgufTensorSpec> qwen_hybrid_gguf_specs(const ModelConfig& c,
                                                   const std::vector<HfTensorSpec>& hf);

}  // namespace tandem::detail
