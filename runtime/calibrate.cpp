#include "runtime/calibrate.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_file.h"
#include "formats/output_file.h"

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
  write_output_file(path, j.dump() + "\n");
}

ResidualVectors ResidualVectors::load(const std::filesystem::path& path) {
  return parse(read_input_file(path, kMaxConfigFileBytes), path.string());
}

ResidualVectors ResidualVectors::parse(const std::string& text, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kFormat, "{}: not valid JSON: {}", what, e.what());
  }
  if (!j.is_object()) fail(ErrorKind::kFormat, "{}: not a JSON object", what);
  auto get = [&](const char* key) -> const nlohmann::json* {
    const auto it = j.find(key);
    return it == j.end() ? nullptr : &*it;
  };
  const nlohmann::json* format = get("format");
  if (!format || !format->is_string() || *format != "tandem-residuals") {
    fail(ErrorKind::kFormat, "{}: key 'format' is not \"tandem-residuals\"", what);
  }
  ResidualVectors r;
  if (const nlohmann::json* m = get("model"); m && m->is_string()) r.model = m->get<std::string>();
  const nlohmann::json* hidden = get("hidden_size");
  if (!hidden || !hidden->is_number_integer() || hidden->get<int64_t>() < 1 ||
      hidden->get<int64_t>() > (int64_t{1} << 20)) {
    fail(ErrorKind::kFormat, "{}: key 'hidden_size' must be an integer in 1..{}", what,
         int64_t{1} << 20);
  }
  r.hidden_size = hidden->get<int64_t>();
  const nlohmann::json* layers = get("moe_layers");
  if (!layers || !layers->is_array() || layers->empty() || layers->size() > 4096) {
    fail(ErrorKind::kFormat, "{}: key 'moe_layers' must be a list of 1 to 4096 layer indices",
         what);
  }
  for (size_t i = 0; i < layers->size(); ++i) {
    const nlohmann::json& l = (*layers)[i];
    // Model layer indices, ascending: each MoE layer once.
    if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= 65536 ||
        (i > 0 && l.get<int64_t>() <= r.layers.back())) {
      fail(ErrorKind::kFormat,
           "{}: key 'moe_layers[{}]': expected a layer index in 0..65535 above the previous one",
           what, i);
    }
    r.layers.push_back(l.get<int64_t>());
  }
  if (const nlohmann::json* tokens = get("tokens")) {
    if (!tokens->is_number_integer() || tokens->get<int64_t>() < 0) {
      fail(ErrorKind::kFormat, "{}: key 'tokens' must be an integer >= 0", what);
    }
    r.tokens = tokens->get<int64_t>();
  }
  const nlohmann::json* vectors = get("vectors");
  if (!vectors || !vectors->is_array() || vectors->size() + 1 != r.layers.size()) {
    fail(ErrorKind::kFormat, "{}: key 'vectors' must hold one vector per MoE layer but the last ({})",
         what, r.layers.size() - 1);
  }
  for (size_t l = 0; l < vectors->size(); ++l) {
    const nlohmann::json& v = (*vectors)[l];
    if (!v.is_array() || int64_t(v.size()) != r.hidden_size) {
      fail(ErrorKind::kFormat, "{}: key 'vectors[{}]' must be a list of hidden_size ({}) numbers",
           what, l, r.hidden_size);
    }
    std::vector<float> row;
    row.reserve(v.size());
    for (size_t h = 0; h < v.size(); ++h) {
      if (!v[h].is_number() || !std::isfinite(v[h].get<double>())) {
        fail(ErrorKind::kFormat, "{}: key 'vectors[{}][{}]' is not a finite number", what, l, h);
      }
      row.push_back(v[h].get<float>());
    }
    r.vectors.push_back(std::move(row));
  }
  return r;
}

}  // namespace tandem::rt
