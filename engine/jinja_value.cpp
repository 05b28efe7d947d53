#include "engine/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "core/error.h"

namespace tandem::jinja {

Value Value::undefined(std::string name) {
  Value v;
  v.s = std::move(name);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::kBool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::kInt;
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.kind = Kind::kString;
  v.s = std::move(x);
  return v;
}
Value Value::array(Array x) {
  Value v;
  v.kind = Kind::kArray;
  v.arr = std::make_shared<Array>(std::move(x));
  return v;
}
Value Value::object(Object x) {
  Value v;
  v.kind = Kind::kObject;
  v.obj = std::make_shared<Object>(std::move(x));
  return v;
}
Value Value::function(Function f) {
  Value v;
  v.kind = Kind::kCallable;
  v.fn = std::make_shared<Function>(std::move(f));
  return v;
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b;
    case Kind::kInt: return i != 0;
    case Kind::kFloat: return f != 0;
    case Kind::kString: return !s.empty();
    case Kind::kArray: return !arr->empty();
    case Kind::kObject: return !obj->empty();
    case Kind::kCallable: return true;
  }
  return false;
}

double Value::as_double() const {
  if (kind == Kind::kFloat) return f;
  if (kind == Kind::kInt) return static_cast<double>(i);
  if (kind == Kind::kBool) return b ? 1 : 0;
  fail(ErrorKind::kInvalidArgument, "jinja: expected a number, got {}", type_name());
}

const Value* Value::find(const std::string& key) const {
  if (kind != Kind::kObject) return nullptr;
  for (const auto& [k, v] : *obj) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Value::set(const std::string& key, Value v) {
  for (auto& [k, old] : *obj) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  obj->emplace_back(key, std::move(v));
}

const char* Value::type_name() const {
  switch (kind) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kArray: return is_generator ? "generator" : "list";
    case Kind::kObject: return "dict";
    case Kind::kCallable: return "function";
  }
  return "?";
}

namespace {

[[noreturn]] void too_deep() {
  fail(ErrorKind::kResource, "values nested deeper than {} levels", kMaxNesting);
}

void check_size(const std::string& out, uint64_t max_bytes) {
  if (out.size() > max_bytes) {
    fail(ErrorKind::kResource, "a value's text is longer than {} bytes", max_bytes);
  }
}

Value from_json_at(const Json& j, int depth) {
  if (depth > kMaxNesting) {
    fail(ErrorKind::kFormat, "JSON nested deeper than {} levels", kMaxNesting);
  }
  switch (j.type()) {
    case Json::value_t::null: return Value::none();
    case Json::value_t::boolean: return Value::boolean(j.get<bool>());
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return Value::integer(j.get<int64_t>());
    case Json::value_t::number_float: return Value::number(j.get<double>());
    case Json::value_t::string: return Value::string(j.get<std::string>());
    case Json::value_t::array: {
      Array a;
      for (const auto& e : j) a.push_back(from_json_at(e, depth + 1));
      return Value::array(std::move(a));
    }
    case Json::value_t::object: {
      Object o;
      for (auto it = j.begin(); it != j.end(); ++it) {
        o.emplace_back(it.key(), from_json_at(it.value(), depth + 1));
      }
      return Value::object(std::move(o));
    }
    default: return Value::none();
  }
}

}  // namespace

Value from_json(const Json& j) {
  return from_json_at(j, 0);
}

// Python's float repr: the shortest round-trip digits, always with a '.' or exponent.
static std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, res.ptr);
  // to_chars picks fixed or scientific by length; Python uses scientific when exp < -4 or >= 16.
  int exp10 = d == 0 ? 0 : static_cast<int>(std::floor(std::log10(std::fabs(d))));
  if (exp10 < -4 || exp10 >= 16) {
    res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
    s.assign(buf, res.ptr);
    auto e = s.find('e');
    std::string mant = s.substr(0, e), ex = s.substr(e + 1);
    char sign = ex[0] == '-' ? '-' : '+';
    if (ex[0] == '-' || ex[0] == '+') ex = ex.substr(1);
    while (ex.size() > 2 && ex[0] == '0') ex.erase(0, 1);
    if (ex.size() < 2) ex = "0" + ex;
    return mant + "e" + sign + ex;
  }
  res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::fixed);
  s.assign(buf, res.ptr);
  if (s.find('.') == std::string::npos) s += ".0";
  return s;
}

static void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

static void dump(std::string& out, const Value& v, int indent, int depth, const std::string& item_sep,
                 const std::string& key_sep, bool sort_keys, uint64_t max_bytes) {
  if (depth > kMaxNesting) too_deep();
  check_size(out, max_bytes);
  auto newline = [&](int d) {
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.kind) {
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.b ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.i); return;
    case Value::Kind::kFloat:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity")
                                                        : float_repr(v.f);
      return;
    case Value::Kind::kString: json_string(out, v.s); return;
    case Value::Kind::kArray: {
      if (v.is_generator) fail(ErrorKind::kInvalidArgument, "Object of type generator is not JSON serializable");
      if (v.arr->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.arr->size(); ++k) {
        if (k) out += item_sep;
        if (indent >= 0) newline(depth + 1);
        dump(out, (*v.arr)[k], indent, depth + 1, item_sep, key_sep, sort_keys, max_bytes);
      }
      if (indent >= 0) newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::kObject: {
      if (v.obj->empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : *v.obj) items.push_back(&kv);
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += item_sep;
        if (indent >= 0) newline(depth + 1);
        json_string(out, items[k]->first);
        out += key_sep;
        dump(out, items[k]->second, indent, depth + 1, item_sep, key_sep, sort_keys, max_bytes);
      }
      if (indent >= 0) newline(depth);
      out += '}';
      return;
    }
    default:
      fail(ErrorKind::kInvalidArgument, "Object of type {} is not JSON serializable", v.type_name());
  }
}

std::string to_json(const Value& v, int indent, const std::string& item_sep,
                    const std::string& key_sep, bool sort_keys, uint64_t max_bytes) {
  std::string out;
  dump(out, v, indent, 0, item_sep, key_sep, sort_keys, max_bytes);
  check_size(out, max_bytes);
  return out;
}

static std::string str_repr(const std::string& s) {
  // Python prefers single quotes unless the string holds a ' and no ".
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == q) out += std::string("\\") + static_cast<char>(q);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  out += q;
  return out;
}

static void repr_into(std::string& out, const Value& v, int depth, uint64_t max_bytes);

// Python str() appended to out.
static void str_into(std::string& out, const Value& v, int depth, uint64_t max_bytes) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return;
    case Value::Kind::kNone: out += "None"; return;
    case Value::Kind::kBool: out += v.b ? "True" : "False"; return;
    case Value::Kind::kInt: out += std::to_string(v.i); return;
    case Value::Kind::kFloat: out += float_repr(v.f); return;
    case Value::Kind::kString: out += v.s; return;
    case Value::Kind::kCallable: out += "<function>"; return;
    default: repr_into(out, v, depth, max_bytes);
  }
}

static void repr_into(std::string& out, const Value& v, int depth, uint64_t max_bytes) {
  if (depth > kMaxNesting) too_deep();
  check_size(out, max_bytes);
  switch (v.kind) {
    case Value::Kind::kString: out += str_repr(v.s); return;
    case Value::Kind::kArray: {
      if (v.is_generator) {
        out += "<generator object at 0x0>";
        return;
      }
      out += v.is_tuple ? "(" : "[";
      for (size_t k = 0; k < v.arr->size(); ++k) {
        if (k) out += ", ";
        repr_into(out, (*v.arr)[k], depth + 1, max_bytes);
      }
      out += v.is_tuple ? (v.arr->size() == 1 ? ",)" : ")") : "]";
      return;
    }
    case Value::Kind::kObject: {
      out += "{";
      bool first = true;
      for (const auto& [k, e] : *v.obj) {
        if (!first) out += ", ";
        first = false;
        out += str_repr(k) + ": ";
        repr_into(out, e, depth + 1, max_bytes);
      }
      out += "}";
      return;
    }
    default: str_into(out, v, depth, max_bytes);
  }
}

std::string to_repr(const Value& v, uint64_t max_bytes) {
  std::string out;
  repr_into(out, v, 0, max_bytes);
  check_size(out, max_bytes);
  return out;
}

std::string to_str(const Value& v, uint64_t max_bytes) {
  if (v.kind == Value::Kind::kString) {  // the common case: no copy through an append
    check_size(v.s, max_bytes);
    return v.s;
  }
  std::string out;
  str_into(out, v, 0, max_bytes);
  check_size(out, max_bytes);
  return out;
}

namespace {

// The recursion of == and < with its bounds (kMaxNesting, kMaxCompareNodes).
struct Comparison {
  uint64_t nodes = 0;

  void enter(int depth) {
    if (depth > kMaxNesting) too_deep();
    if (++nodes > kMaxCompareNodes) {
      fail(ErrorKind::kResource, "comparing values of more than {} items", kMaxCompareNodes);
    }
  }

  bool equals(const Value& a, const Value& b, int depth) {
    using K = Value::Kind;
    enter(depth);
    bool an = a.kind == K::kInt || a.kind == K::kFloat || a.kind == K::kBool;
    bool bn = b.kind == K::kInt || b.kind == K::kFloat || b.kind == K::kBool;
    if (an && bn) return a.as_double() == b.as_double();
    if (a.kind != b.kind) return false;
    switch (a.kind) {
      case K::kUndefined:
      case K::kNone: return true;
      case K::kString: return a.s == b.s;
      case K::kArray:
        if (a.arr == b.arr) return true;  // the same list, as Python's identity shortcut
        if (a.arr->size() != b.arr->size()) return false;
        for (size_t k = 0; k < a.arr->size(); ++k) {
          if (!equals((*a.arr)[k], (*b.arr)[k], depth + 1)) return false;
        }
        return true;
      case K::kObject:
        if (a.obj == b.obj) return true;
        if (a.obj->size() != b.obj->size()) return false;
        for (const auto& [k, e] : *a.obj) {
          const Value* o = b.find(k);
          if (!o || !equals(e, *o, depth + 1)) return false;
        }
        return true;
      default: return a.fn == b.fn;
    }
  }

  int compare(const Value& a, const Value& b, int depth) {
    enter(depth);
    if (a.is_number() || a.kind == Value::Kind::kBool) {
      if (b.is_number() || b.kind == Value::Kind::kBool) {
        double x = a.as_double(), y = b.as_double();
        return x < y ? -1 : x > y ? 1 : 0;
      }
    } else if (a.is_string() && b.is_string()) {
      return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
    } else if (a.is_array() && b.is_array()) {
      for (size_t k = 0; k < a.arr->size() && k < b.arr->size(); ++k) {
        int c = compare((*a.arr)[k], (*b.arr)[k], depth + 1);
        if (c) return c;
      }
      return a.arr->size() < b.arr->size() ? -1 : a.arr->size() > b.arr->size() ? 1 : 0;
    }
    fail(ErrorKind::kInvalidArgument, "'<' not supported between instances of '{}' and '{}'",
         a.type_name(), b.type_name());
  }
};

}  // namespace

bool equals(const Value& a, const Value& b) {
  return Comparison().equals(a, b, 0);
}

JsonNesting json_nesting(std::string_view s) {
  JsonNesting n;
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      n.max_depth = std::max(n.max_depth, ++depth);
    } else if ((c == '}' || c == ']') && depth > 0 && --depth == 0) {
      n.end = i + 1;
      return n;
    }
  }
  return n;
}

int compare(const Value& a, const Value& b) {
  return Comparison().compare(a, b, 0);
}

}  // namespace tandem::jinja
