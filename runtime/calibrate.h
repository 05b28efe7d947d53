// DALI's residual vectors (its eq. 11): per MoE layer l, the mean over calibration tokens of the
// difference between the next MoE layer's input and this layer's input. Adding r_l to layer l's
// MoE input approximates layer l + 1's input, so the next router applied to it predicts the next
// layer's experts better than the plain gate prediction. Written by `tandem calibrate`, read by
// `tandem trace --residuals` and the runtime's residual prefetcher (JSON, docs/traces.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "model/model.h"

namespace tandem::rt {

struct ResidualVectors {
  std::string model;
  int64_t hidden_size = 0;
  std::vector<int64_t> layers;              // [L] model layer index of each MoE layer
  std::vector<std::vector<float>> vectors;  // [L - 1][hidden]: r_l for l = 0 .. L - 2
  int64_t tokens = 0;                       // calibration tokens

  void save(const std::filesystem::path& path) const;
  // Throws Error(kFormat) naming the file and key at fault (layer indices must ascend).
  static ResidualVectors load(const std::filesystem::path& path);
  static ResidualVectors parse(const std::string& text, const std::string& what);
};

// Accumulates eq. 11 from RoutingEvents (one forward() at a time, MoE layers in order).
class ResidualCalibrator {
 public:
  explicit ResidualCalibrator(const LoadedModel& model);
  void on_routing(const RoutingEvent& event);
  ResidualVectors result() const;

 private:
  std::string model_;
  std::vector<int64_t> layers_;
  int64_t hidden_ = 0;
  std::vector<float> prev_;  // the previous MoE layer's inputs of this batch
  int64_t prev_index_ = -1, prev_tokens_ = 0;
  std::vector<std::vector<double>> sum_;
  std::vector<int64_t> count_;
};

// The model layer index of every MoE layer.
std::vector<int64_t> moe_layer_indices(const LoadedModel& model);

}  // namespace tandem::rt
