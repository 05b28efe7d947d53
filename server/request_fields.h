// The checks every API route makes of a request's fields (OpenAI's chat and text completions,
// Responses, Anthropic's Messages): one helper per kind, so that a bound is checked the same way
// everywhere. Absent or null leaves `out` as it is; a wrong type or a value out of range is a 400
// naming the field and what it must be.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/openai.h"

namespace tandem::server {

// "null", "a boolean", "a string", "an array", "an object", "a number".
const char* type_name(const Json& v);
void boolean(const Json& body, const char* key, bool* out);
// A finite number in [lo, hi].
void number(const Json& body, const char* key, double lo, double hi, float* out);
// An integer in [lo, hi] (JSON's integers up to uint64's range are read without wrapping).
std::optional<int64_t> integer(const Json& body, const char* key, int64_t lo, int64_t hi);
template <typename T>
void integer(const Json& body, const char* key, int64_t lo, int64_t hi, T* out) {
  if (const std::optional<int64_t> v = integer(body, key, lo, hi)) *out = static_cast<T>(*v);
}
// An array of token ids of the model's vocabulary, or a 400 naming `field` and the bad id.
std::vector<int32_t> token_ids(const Json& v, const ModelInfo& model, const char* field);
// The body is a JSON object.
void check_object(const Json& body);
// "model", when given, is this server's (404 when not).
void check_model(const Json& body, const ModelInfo& model);

}  // namespace tandem::server
