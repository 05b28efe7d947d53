#include "runtime/calibrate.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tandem::rt {

std::vector<int64_t> moe_layer_indices(const LoadedModel& model) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < model.layers.size(); ++i) {
    if (model.layers[i].moe) out.push_back(static_cast<int64_t>(i));
  }
  return out;
}

ResidualCalibrator::ResidualCalibrator(const LoadedModel& model)
    : model_(model.path.filename().string()),
      layers_(moe_layer_indices(model)),
      hidden_(model.config.hidden_size) {
  const size_t n = layers_.empty() ? 0 : layers_.size() - 1;
  sum_.assign(n, std::vector<double>(static_cast<size_t>(hidden_), 0.0));
  count_.assign(n, 0);
}

void ResidualCalibrator::on_routing(const RoutingEvent& e) {
  TD_CHECK(e.hidden_size == hidden_, "hidden size {} != {}", e.hidden_size, hidden_);
  const int64_t l = e.moe_index;
  // Consecutive MoE layers of the same batch: accumulate x_{l} - x_{l-1} into r_{l-1}.
  if (l > 0 && prev_index_ == l - 1 && prev_tokens_ == e.n_tokens) {
    auto& s = sum_[static_cast<size_t>(l - 1)];
    for (int64_t t = 0; t < e.n_tokens; ++t) {
      const float* x = e.hidden + t * hidden_;
      const float* p = prev_.data() + t * hidden_;
      for (int64_t h = 0; h < hidden_; ++h) s[h] += double(x[h]) - double(p[h]);
    }
    count_[static_cast<size_t>(l - 1)] += e.n_tokens;
  }
  prev_.assign(e.hidden, e.hidden + e.n_tokens * hidden_);
  prev_index_ = l;
  prev_tokens_ = e.n_tokens;
}

ResidualVectors ResidualCalibrator::result() const {
  ResidualVectors r;
  r.model = model_;
  r.hidden_size = hidden_;
  r.layers = layers_;
  r.tokens = count_.empty() ? 0 : count_[0];
  for (size_t l = 0; l < sum_.size(); ++l) {
    std::vector<float> v(static_cast<size_t>(hidden_), 0.f);
    if (count_[l] > 0) {
      for (int64_t h = 0; h < hidden_; ++h) v[h] = float(sum_[l][h] / double(count_[l]));
    }
    r.vectors.push_back(std::move(v));
  }
  return r;
}

void ResidualVectors::save(const std::filesystem::path& path) const {
  nlohmann::json j;
  j["format"] = "tandem-residuals";
  j["version"] = 1;
  j["model"] = model;
  j["hidden_size"] = hidden_size;
  j["moe_layers"] = layers;
  j["tokens"] = tokens;
  j["vectors"] = vectors;
  std::ofstream out(path);
  if (!out) fail(ErrorKind::kIo, "{}: cannot create", path.string());
  out << j.dump() << "\n";
  if (!out) fail(ErrorKind::kIo, "{}: write failed", path.string());
}

ResidualVectors ResidualVectors::load(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) fail(ErrorKind::kIo, "{}: cannot open residual vectors", path.string());
  ResidualVectors r;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    if (j.value("format", "") != "tandem-residuals") {
      fail(ErrorKind::kFormat, "{}: key 'format' is not \"tandem-residuals\"", path.string());
    }
    r.model = j.value("model", "");
    r.hidden_size = j.at("hidden_size").get<int64_t>();
    r.layers = j.at("moe_layers").get<std::vector<int64_t>>();
    r.tokens = j.value("tokens", int64_t(0));
    r.vectors = j.at("vectors").get<std::vector<std::vector<float>>>();
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kFormat, "{}: {}", path.string(), e.what());
  }
  if (r.hidden_size < 1 || r.layers.empty() || r.vectors.size() + 1 != r.layers.size()) {
    fail(ErrorKind::kFormat, "{}: key 'vectors' must hold one vector per MoE layer but the last",
         path.string());
  }
  for (size_t l = 0; l < r.vectors.size(); ++l) {
    if (int64_t(r.vectors[l].size()) != r.hidden_size) {
      fail(ErrorKind::kFormat, "{}: vectors[{}] has {} values, hidden_size is {}", path.string(), l,
           r.vectors[l].size(), r.hidden_size);
    }
  }
  return r;
}

}  // namespace tandem::rt
