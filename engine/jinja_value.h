// Values of the Jinja2 template engine (engine/jinja.h): a small dynamic type with Python's
// semantics (truthiness, str(), ==, ordering), shared mutable containers as Python has, and a
// conversion from/to JSON that keeps key order (templates print tool schemas in insertion order).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::jinja {

using Json = nlohmann::ordered_json;

// JSON text scanned without parsing it (strings and escapes respected): where the first object or
// array closes (the offset past it; 0 when it does not) and the deepest nesting seen until then.
// For what must be bounded or found before a parser (or a copy of its result) recurses.
struct JsonNesting {
  size_t end = 0;
  int max_depth = 0;
};
JsonNesting json_nesting(std::string_view text);

struct Value;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;  // insertion-ordered, like dict
using KwArgs = std::vector<std::pair<std::string, Value>>;
using Function = std::function<Value(std::vector<Value>& args, KwArgs& kwargs)>;

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kArray, kObject, kCallable };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                 // kString; for kUndefined the message shown when it is used
  std::shared_ptr<Array> arr;    // kArray
  std::shared_ptr<Object> obj;   // kObject
  std::shared_ptr<Function> fn;  // kCallable
  bool is_generator = false;     // map/select results: printable, not JSON-serializable (jinja2)
  bool is_tuple = false;         // an array that prints as a Python tuple
  bool is_namespace = false;     // namespace(): the one object whose attributes `set` may assign

  static Value undefined(std::string name = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value array(Array v = {});
  static Value object(Object v = {});
  static Value function(Function f);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_array() const { return kind == Kind::kArray; }
  bool is_object() const { return kind == Kind::kObject; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat; }

  bool truthy() const;
  double as_double() const;
  const Value* find(const std::string& key) const;  // object member or nullptr
  void set(const std::string& key, Value v);        // object member, replaced or appended
  const char* type_name() const;                    // Python's type name, for messages
};

// Bounds of the recursive functions below. A namespace can hold itself and lists nest lists they
// share (thirty doublings make 2^30 leaves out of 30 values): str(), tojson, == and < on such
// values would recurse without end or produce more text than memory holds. They throw
// Error(kResource) past kMaxNesting levels, past max_bytes of text, or (== and <) past
// kMaxCompareNodes values visited.
inline constexpr int kMaxNesting = 512;
inline constexpr uint64_t kMaxCompareNodes = uint64_t{1} << 22;

Value from_json(const Json& j);  // Error(kFormat) past kMaxNesting levels
// json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=...): indent < 0
// means None. Throws for values JSON cannot hold (callables, undefined, generators).
std::string to_json(const Value& v, int indent, const std::string& item_sep,
                    const std::string& key_sep, bool sort_keys, uint64_t max_bytes = UINT64_MAX);
std::string to_str(const Value& v, uint64_t max_bytes = UINT64_MAX);   // Python str()
std::string to_repr(const Value& v, uint64_t max_bytes = UINT64_MAX);  // Python repr()
bool equals(const Value& a, const Value& b);
int compare(const Value& a, const Value& b);  // <0, 0, >0; throws for unorderable types

}  // namespace tandem::jinja
