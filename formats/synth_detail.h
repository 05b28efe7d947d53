// Internals of the synthetic-model layouts shared by their translation units (synth_layout.cpp,
// synth_hybrid.cpp); not an API.
#pragma once

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

// The Qwen3-Next / Qwen3.5-MoE layouts (synth_hybrid.cpp).
std::vector<HfTensorSpec> qwen_hybrid_hf_specs(const ModelConfig& c);
std::vector<GgufTensorSpec> qwen_hybrid_gguf_specs(const ModelConfig& c,
                                                   const std::vector<HfTensorSpec>& hf);

}  // namespace tandem::detail
