#include "runtime/cost_model.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "core/input_file.h"
#include "formats/output_file.h"

namespace tandem::rt {

namespace {

// Validation shared by load() and from_tables(): `where` names the file / key for messages.
void check_table(const std::vector<CostPoint>& t, const std::string& where) {
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i].tokens <= 0)
      fail(ErrorKind::kFormat, "{}: point {}: tokens {} must be > 0", where, i, t[i].tokens);
    if (!std::isfinite(t[i].seconds) || t[i].seconds < 0) {
      fail(ErrorKind::kFormat, "{}: point {}: seconds {} must be finite and >= 0", where, i,
           t[i].seconds);
    }
    if (i > 0 && t[i].tokens <= t[i - 1].tokens) {
      fail(ErrorKind::kFormat, "{}: point {}: tokens {} not increasing", where, i, t[i].tokens);
    }
  }
}

std::vector<CostPoint> read_table(const nlohmann::json& j, const char* key,
                                  const std::string& file) {
  const std::string where = file + ": '" + key + "'";
  std::vector<CostPoint> out;
  if (!j.contains(key)) fail(ErrorKind::kFormat, "{}: missing", where);
  const auto& a = j.at(key);
  if (!a.is_array()) fail(ErrorKind::kFormat, "{}: not an array", where);
  for (size_t i = 0; i < a.size(); ++i) {
    const auto& p = a[i];
    if (!p.is_array() || p.size() != 2 || !p[0].is_number_integer() || !p[1].is_number()) {
      fail(ErrorKind::kFormat, "{}: point {} is not [tokens, seconds]", where, i);
    }
    out.push_back({p[0].get<int64_t>(), p[1].get<double>()});
  }
  check_table(out, where);
  return out;
}

double read_number(const nlohmann::json& j, const char* key, const std::string& file, double dflt,
                   bool required) {
  if (!j.contains(key)) {
    if (required) fail(ErrorKind::kFormat, "{}: '{}' missing", file, key);
    return dflt;
  }
  if (!j.at(key).is_number()) fail(ErrorKind::kFormat, "{}: '{}' is not a number", file, key);
  const double v = j.at(key).get<double>();
  if (!std::isfinite(v) || v < 0)
    fail(ErrorKind::kFormat, "{}: '{}' = {} must be >= 0", file, key, v);
  return v;
}

}  // namespace

double cost_table_eval(const std::vector<CostPoint>& t, int64_t tokens) {
  if (tokens <= 0 || t.empty()) return 0;
  if (tokens <= t.front().tokens) return t.front().seconds;
  for (size_t i = 1; i < t.size(); ++i) {
    if (tokens <= t[i].tokens) {
      const double f = double(tokens - t[i - 1].tokens) / double(t[i].tokens - t[i - 1].tokens);
      return t[i - 1].seconds + f * (t[i].seconds - t[i - 1].seconds);
    }
  }
  if (t.size() == 1) return t.front().seconds * double(tokens) / double(t.front().tokens);
  const CostPoint& a = t[t.size() - 2];
  const CostPoint& b = t.back();
  const double slope = std::max(0.0, (b.seconds - a.seconds) / double(b.tokens - a.tokens));
  return b.seconds + slope * double(tokens - b.tokens);
}

double CostModel::cpu_expert(int64_t tokens) const {
  return cost_table_eval(cpu_table, tokens);
}

double CostModel::accel_expert(int64_t tokens) const {
  if (accel_table.empty()) return cpu_expert(tokens) * accel_fallback_ratio;
  return cost_table_eval(accel_table, tokens);
}

CostModel CostModel::from_linear(double cpu_fixed, double cpu_per_token, double accel_fixed,
                                 double accel_per_token, double transfer) {
  // Two points reproduce a line exactly for every n >= 1 (the last slope is continued).
  return from_tables({{1, cpu_fixed + cpu_per_token}, {2, cpu_fixed + 2 * cpu_per_token}},
                     {{1, accel_fixed + accel_per_token}, {2, accel_fixed + 2 * accel_per_token}},
                     transfer);
}

CostModel CostModel::from_tables(std::vector<CostPoint> cpu, std::vector<CostPoint> accel,
                                 double transfer) {
  check_table(cpu, "cost model: cpu table");
  check_table(accel, "cost model: accel table");
  if (!std::isfinite(transfer) || transfer < 0) {
    fail(ErrorKind::kInvalidArgument, "cost model: transfer seconds {} must be >= 0", transfer);
  }
  CostModel m;
  m.cpu_table = std::move(cpu);
  m.accel_table = std::move(accel);
  m.transfer_seconds = transfer;
  return m;
}

CostModel CostModel::load(const std::filesystem::path& p) {
  const std::string file = p.string();
  const std::string text = read_input_file(p, kMaxConfigFileBytes);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kFormat, "{}: not valid JSON: {}", file, e.what());
  }
  if (!j.is_object()) fail(ErrorKind::kFormat, "{}: not a JSON object", file);
  if (!j.contains("format") || j["format"] != "tandem-cost-model") {
    fail(ErrorKind::kFormat, "{}: 'format' is not \"tandem-cost-model\"", file);
  }
  if (!j.contains("version") || j["version"] != 1) {
    fail(ErrorKind::kFormat, "{}: 'version' is not 1", file);
  }
  CostModel m;
  m.cpu_table = read_table(j, "cpu_expert", file);
  if (m.cpu_table.empty()) fail(ErrorKind::kFormat, "{}: 'cpu_expert' is empty", file);
  if (j.contains("accel_expert")) m.accel_table = read_table(j, "accel_expert", file);
  m.transfer_seconds = read_number(j, "transfer_seconds", file, 0, true);
  m.cpu_layer_overhead = read_number(j, "cpu_layer_overhead", file, 0, false);
  m.accel_layer_overhead = read_number(j, "accel_layer_overhead", file, 0, false);
  m.accel_fallback_ratio =
      read_number(j, "accel_fallback_ratio", file, m.accel_fallback_ratio, false);
  const double expert_bytes = read_number(j, "expert_bytes", file, 0, false);
  if (expert_bytes > 0x1p50) {  // 1 PiB; larger would not convert to uint64 defined
    fail(ErrorKind::kFormat, "{}: 'expert_bytes' = {} is not a size", file, expert_bytes);
  }
  m.expert_bytes = static_cast<uint64_t>(expert_bytes);
  return m;
}

void CostModel::save(const std::filesystem::path& p) const {
  nlohmann::json j;
  j["format"] = "tandem-cost-model";
  j["version"] = 1;
  auto table = [](const std::vector<CostPoint>& t) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& x : t) a.push_back({x.tokens, x.seconds});
    return a;
  };
  j["cpu_expert"] = table(cpu_table);
  j["accel_expert"] = table(accel_table);
  j["transfer_seconds"] = transfer_seconds;
  j["cpu_layer_overhead"] = cpu_layer_overhead;
  j["accel_layer_overhead"] = accel_layer_overhead;
  j["accel_fallback_ratio"] = accel_fallback_ratio;
  j["expert_bytes"] = expert_bytes;
  write_output_file(p, j.dump(1) + "\n");
}

}  // namespace tandem::rt
