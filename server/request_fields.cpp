#include "server/request_fields.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace tandem::server {

Json parse_json_body(const std::string& body) {
  // Deeper nesting than any request needs is refused before parsing (copies and dumps of JSON
  // values recurse).
  if (jinja::json_nesting(body).max_depth > kMaxJsonDepth) {
    throw ApiError(400, "invalid_request_error",
                   fmt::format("the request body nests deeper than {} levels", kMaxJsonDepth));
  }
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    throw ApiError(400, "invalid_request_error", "the request body is not valid JSON");
  }
  return j;
}

void boolean(const Json& body, const char* key, bool* out) {
  if (!body.contains(key) || body[key].is_null()) return;
  if (!body[key].is_boolean()) {
    bad_request(key, fmt::format("'{}' must be a boolean, not {}", key, type_name(body[key])));
  }
  *out = body[key].get<bool>();
}

std::vector<int32_t> token_ids(const Json& v, const ModelInfo& m, const char* field) {
  if (!v.is_array()) bad_request(field, fmt::format("'{}' must be an array of token ids", field));
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (const Json& x : v) {
    int64_t id = -1;
    if (x.is_number_integer() && !(x.is_number_unsigned() && x.get<uint64_t>() > INT32_MAX)) {
      id = x.get<int64_t>();
    }
    if (id < 0 || id >= m.vocab_size) {
      bad_request(field, fmt::format("'{}': {} is not a token id in [0, {})", field, x.dump(),
                                     m.vocab_size));
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

const char* type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    default:
      return "a number";
  }
}

void number(const Json& body, const char* key, double lo, double hi, float* out) {
  if (!body.contains(key) || body[key].is_null()) return;
  const Json& v = body[key];
  if (!v.is_number())
    bad_request(key, fmt::format("'{}' must be a number, not {}", key, type_name(v)));
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) {
    bad_request(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, v.dump()));
  }
  *out = static_cast<float>(d);
}

std::optional<int64_t> integer(const Json& body, const char* key, int64_t lo, int64_t hi) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  const Json& v = body[key];
  if (!v.is_number_integer()) {
    bad_request(key, fmt::format("'{}' must be an integer, not {}", key,
                                 v.is_number() ? v.dump() : type_name(v)));
  }
  // (JSON's non-negative integers parse as unsigned: one past int64's range is out of range.)
  const bool fits = !v.is_number_unsigned() ||
                    v.get<uint64_t>() <= static_cast<uint64_t>(std::max<int64_t>(hi, 0));
  const int64_t x = fits ? v.get<int64_t>() : hi;
  if (!fits || x < lo || x > hi) {
    bad_request(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, v.dump()));
  }
  return x;
}

void check_object(const Json& body) {
  if (!body.is_object()) {
    throw ApiError(400, "invalid_request_error",
                   fmt::format("the request body must be a JSON object, not {}", type_name(body)));
  }
}

void check_model(const Json& body, const ModelInfo& m) {
  if (!body.contains("model") || body["model"].is_null()) return;
  if (!body["model"].is_string()) {
    bad_request("model", fmt::format("'model' must be a string, not {}", type_name(body["model"])));
  }
  const std::string name = body["model"].get<std::string>();
  if (name != m.name) {
    throw ApiError(
        404, "invalid_request_error",
        fmt::format("the model '{}' does not exist; this server serves '{}'", name, m.name),
        "model");
  }
}

}  // namespace tandem::server
