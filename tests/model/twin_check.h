// What the tests of quantized checkpoints share (model_fp8_test, model_int4_test): synth a
// checkpoint in a format, write its twin (every quantized tensor dequantized by the test's own
// formula, the rest copied), and compare the two models' logits over a fixed prompt.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "formats/synth.h"
#include "model/model.h"
#include "model/weights.h"

namespace tandem::test {

// A tiny preset's HF checkpoint of `type` (seed 11) in dir / name.
inline std::filesystem::path synth_checkpoint(const std::filesystem::path& dir, const char* preset,
                                              SynthType type, const std::string& name) {
  SynthOptions o;
  o.config = config_preset(preset);
  o.format = SynthFormat::kHf;
  o.seed = 11;
  o.progress = false;
  o.threads = 1;
  o.type = type;
  o.output = dir / name;
  synth_model(o);
  return o.output;
}

// A tensor of a checkpoint written again as it is.
inline void copy_tensor(SafetensorsWriter& w, const SafetensorsTensorInfo& t) {
  std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.ndim);
  const uint8_t* data = t.data;
  const uint64_t n = t.nbytes;
  w.add_tensor(t.name, t.dtype, shape, [data, n](void* dst) { std::memcpy(dst, data, n); });
}

// The prompt every twin test runs: 24 tokens spread over the vocabulary.
inline std::vector<int32_t> twin_prompt(int64_t vocab) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 24; ++i) tokens.push_back((i * 37 + 5) % static_cast<int32_t>(vocab));
  return tokens;
}

// Every position's logits of the prompt through a fresh model (moe: nullptr for the reference
// backend).
inline std::vector<float> prompt_logits(const LoadedModel& lm, const std::vector<int32_t>& tokens,
                                        MoeBackend* moe = nullptr) {
  ModelOptions mo;
  mo.moe = moe;
  Model model_net(lm, mo);
  SingleSequence model(model_net, 64);
  std::vector<float> logits(tokens.size() * lm.config.vocab_size);
  model.forward(tokens, logits.data(), true);
  return logits;
}

// a against b per position: the largest max|a - b| / max|b|, and the positions whose argmax agree.
struct LogitsDiff {
  double worst = 0;
  int agree = 0;
};
inline LogitsDiff compare_logits(const std::vector<float>& a, const std::vector<float>& b,
                                 int64_t vocab) {
  LogitsDiff d;
  const size_t positions = a.size() / static_cast<size_t>(vocab);
  for (size_t t = 0; t < positions; ++t) {
    const float* x = &a[t * vocab];
    const float* y = &b[t * vocab];
    double md = 0, mr = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      md = std::max(md, std::fabs(double(x[j]) - y[j]));
      mr = std::max(mr, std::fabs(double(y[j])));
    }
    d.worst = std::max(d.worst, md / mr);
    d.agree += std::max_element(x, x + vocab) - x == std::max_element(y, y + vocab) - y;
  }
  return d;
}

}  // namespace tandem::test
