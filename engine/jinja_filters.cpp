// The filters and tests of the Jinja2 engine (`x | name(...)`, `x is name(...)`) that chat
// templates use, with jinja2's arguments and semantics. Filters are found by name in a table, one
// function each, grouped by what they take: JSON, strings, any value, mappings, sequences,
// numbers.
#include <algorithm>
#include <bit>
#include <cmath>
#include <memory>
#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "engine/jinja_interp.h"

namespace tandem::jinja {
namespace {

using K = Value::Kind;

// Python's len(): code points of a string, items of a list or dict; 0 for Undefined.
int64_t length_of(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kString:
      return static_cast<int64_t>(utf8_length(v.s));
    case Value::Kind::kArray:
      return static_cast<int64_t>(v.arr->size());
    case Value::Kind::kObject:
      return static_cast<int64_t>(v.obj->size());
    case Value::Kind::kUndefined:
      return 0;
    default:
      fail(ErrorKind::kInvalidArgument, "object of type '{}' has no len()", v.type_name());
  }
}

// Attribute lookup as filters do it ("a.b" paths, items of dicts first).
Value attr_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t b = 0;
  for (;;) {
    size_t dot = path.find('.', b);
    std::string part = path.substr(b, dot == std::string::npos ? std::string::npos : dot - b);
    const Value* next = cur.find(part);
    if (!next) return Value::undefined(no_attr(cur, part));
    cur = *next;
    if (dot == std::string::npos) return cur;
    b = dot + 1;
  }
}

// A filter's call: the filtered value, the arguments, and the expression (name, line, column).
struct FilterCall {
  Interpreter& in;
  const Expr& e;
  Frames& f;
  Value v;
  std::vector<Value> args;
  KwArgs kw;

  // Positional-or-keyword argument `k` (name `key`), or nullptr.
  const Value* kwarg(size_t k, const char* key) { return arg(args, kw, k, key); }
  [[noreturn]] void error(const std::string& msg) const { in.error(e, msg); }
  Array items() { return in.iterate(v, e.line, e.col); }
};

using Filter = Value (*)(FilterCall& c);

// A list that prints but is not JSON-serializable, as jinja2's generators (map, select).
Value generator(Array items) {
  Value r = Value::array(std::move(items));
  r.is_generator = true;
  return r;
}

// An expression of the value `v`: the input and arguments of a filter or test called by name.
ExprPtr literal(Value v) {
  auto p = std::make_shared<Expr>();
  p->type = Expr::Type::kLiteral;
  p->literal = std::move(v);
  return p;
}

// JSON.

Value tojson(FilterCall& c) {
  const Value* indent = c.kwarg(1, "indent");
  const Value* seps = c.kwarg(2, "separators");
  const Value* sort = c.kwarg(3, "sort_keys");
  const Value* ascii = c.kwarg(0, "ensure_ascii");
  if (ascii && ascii->truthy()) c.error("tojson(ensure_ascii=True) is not supported");
  int ind = indent && indent->kind == K::kInt ? static_cast<int>(indent->i) : -1;
  std::string item_sep = ind >= 0 ? "," : ", ", key_sep = ": ";
  if (seps && seps->is_array() && seps->arr->size() == 2) {
    item_sep = (*seps->arr)[0].s;
    key_sep = (*seps->arr)[1].s;
  }
  try {
    return Value::string(
        to_json(c.v, ind, item_sep, key_sep, sort && sort->truthy(), c.in.limits().string_bytes));
  } catch (const Error& err) {
    if (err.kind() == ErrorKind::kResource) c.in.over_budget(c.e.line, c.e.col, err.what());
    c.error(err.what());
  }
}

// (llama.cpp's templates: DeepSeek-V3.2's arguments as a JSON string)
Value from_json_filter(FilterCall& c) {
  if (c.v.kind != K::kString) {
    c.error(fmt::format("from_json expects a string, got {}", c.v.type_name()));
  }
  const Json j = Json::parse(c.v.s, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) c.error("from_json: not valid JSON");
  try {
    return from_json(j);
  } catch (const Error& err) {
    c.error(err.what());
  }
}

// Strings.

// No autoescaping: Markup is plain text here.
Value safe(FilterCall& c) {
  return c.v;
}
Value string_filter(FilterCall& c) {
  return Value::string(c.in.str(c.v));
}
Value trim(FilterCall& c) {
  return Value::string(strip_chars(c.in.str(c.v), c.kwarg(0, "chars"), true, true));
}
Value upper_filter(FilterCall& c) {
  return Value::string(upper(c.in.str(c.v)));
}
Value lower_filter(FilterCall& c) {
  return Value::string(lower(c.in.str(c.v)));
}
Value title_filter(FilterCall& c) {
  return Value::string(title(c.in.str(c.v)));
}
Value capitalize_filter(FilterCall& c) {
  return Value::string(capitalize(c.in.str(c.v)));
}

Value replace_filter(FilterCall& c) {
  if (c.args.size() < 2) c.error("replace needs two arguments");
  return Value::string(replace(c.in.str(c.v), c.in.str(c.args[0]), c.in.str(c.args[1]),
                               c.args.size() > 2 ? c.args[2].i : -1, c.in.limits().string_bytes));
}

Value wordcount(FilterCall& c) {
  const std::string s = c.in.str(c.v);
  c.in.charge(c.e.line, c.e.col, s.size() * sizeof(Value));  // split() makes a string per word
  return Value::integer(static_cast<int64_t>(split(s, nullptr, -1, false).size()));
}

// Every line but the first (unless `first`) and blank ones indented by `width` spaces.
Value indent(FilterCall& c) {
  const Value* width = c.kwarg(0, "width");
  const Value* first = c.kwarg(1, "first");
  const int64_t w = width ? width->i : 4;  // " " * w: nothing when negative, as in Python
  c.in.check_string(c.e.line, c.e.col, w > 0 ? uint64_t(w) : 0);
  std::string pad(w > 0 ? static_cast<size_t>(w) : 0, ' ');
  std::string s = c.in.str(c.v), r = first && first->truthy() ? pad : "";
  for (size_t k = 0; k < s.size(); ++k) {
    r += s[k];
    if (s[k] == '\n' && k + 1 < s.size() && s[k + 1] != '\n') {
      r += pad;
      c.in.check_string(c.e.line, c.e.col, r.size());
    }
  }
  return Value::string(std::move(r));
}

// Any value.

Value length(FilterCall& c) {
  return Value::integer(length_of(c.v));
}

Value default_filter(FilterCall& c) {
  const Value* def = c.kwarg(0, "default_value");
  const Value* boolean = c.kwarg(1, "boolean");
  bool use = c.v.is_undefined() || (boolean && boolean->truthy() && !c.v.truthy());
  return use ? (def ? *def : Value::string("")) : c.v;
}

// Mappings.

Value items(FilterCall& c) {
  if (c.v.is_undefined()) return Value::array();
  if (!c.v.is_object()) c.error("Can only get item pairs from a mapping.");
  return c.in.method(c.e, c.v, "items").fn->operator()(c.args, c.kw);
}

// The (key, value) pairs by key, case-insensitively.
Value dictsort(FilterCall& c) {
  if (c.v.is_undefined()) return Value::array();
  if (!c.v.is_object()) c.error("You can only sort by either \"key\" or \"value\" of a mapping.");
  Array items = *c.in.method(c.e, c.v, "items").fn->operator()(c.args, c.kw).arr;
  c.in.tick(c.e, items.size() * (1 + std::bit_width(items.size())));
  std::stable_sort(items.begin(), items.end(), [](const Value& a, const Value& b) {
    return lower((*a.arr)[0].s) < lower((*b.arr)[0].s);
  });
  return Value::array(std::move(items));
}

// Sequences.

Value list(FilterCall& c) {
  return Value::array(c.items());
}

Value first_or_last(FilterCall& c) {
  const std::string& n = c.e.name;
  Array items = c.items();
  if (items.empty()) return Value::undefined(fmt::format("No {} item, sequence was empty.", n));
  return n == "first" ? items.front() : items.back();
}

Value join(FilterCall& c) {
  const Value* sep = c.kwarg(0, "d");
  const Value* attribute = c.kwarg(1, "attribute");
  std::string r;
  Array items = c.items();
  c.in.tick(c.e, items.size());
  const std::string separator = sep ? c.in.str(*sep) : std::string();
  for (size_t k = 0; k < items.size(); ++k) {
    if (k) r += separator;
    r += c.in.str(attribute ? attr_path(items[k], c.in.str(*attribute)) : items[k]);
    c.in.check_string(c.e.line, c.e.col, r.size());
  }
  return Value::string(std::move(r));
}

// select / reject's verdict on `x`: its truth, or the test named by argument t0 (its arguments
// after it), called as `x is name(...)` is.
bool passes(FilterCall& c, const Value& x, size_t t0) {
  if (c.args.size() <= t0) return x.truthy();
  Expr test;
  test.type = Expr::Type::kTest;
  test.line = c.e.line;
  test.col = c.e.col;
  test.name = to_str(c.args[t0]);
  test.kids.push_back(literal(x));
  for (size_t k = t0 + 1; k < c.args.size(); ++k) test.kids.push_back(literal(c.args[k]));
  return c.in.call_test(test, c.f);
}

// select / reject (by the items' truth or a test), selectattr / rejectattr (by an attribute's).
Value select(FilterCall& c) {
  const std::string& n = c.e.name;
  bool by_attr = n == "selectattr" || n == "rejectattr";
  bool keep_if = n == "selectattr" || n == "select";
  size_t t0 = by_attr ? 1 : 0;
  if (by_attr && c.args.empty()) c.error(fmt::format("{} needs an attribute name", n));
  Array out;
  for (const auto& item : c.items()) {
    c.in.tick(c.e);
    Value x = by_attr ? attr_path(item, to_str(c.args[0])) : item;
    if (passes(c, x, t0) == keep_if) out.push_back(item);
  }
  return generator(std::move(out));
}

// `item | name(args after the first)`, the filter named by map's first argument.
Value apply_filter(FilterCall& c, const Value& item) {
  if (c.args.empty()) c.error("map needs a filter name or attribute=");
  Expr call;
  call.type = Expr::Type::kFilter;
  call.line = c.e.line;
  call.col = c.e.col;
  call.name = to_str(c.args[0]);
  call.kids.push_back(literal(item));
  for (size_t k = 1; k < c.args.size(); ++k) call.kids.push_back(literal(c.args[k]));
  return c.in.call_filter(call, c.f);
}

// map(attribute=..., default=...) or map("filter", args...).
Value map(FilterCall& c) {
  const Value* attribute = c.kwarg(99, "attribute");
  const Value* def = c.kwarg(99, "default");
  Array out;
  for (const auto& item : c.items()) {
    c.in.tick(c.e);
    if (attribute) {
      Value x = attr_path(item, to_str(*attribute));
      out.push_back(x.is_undefined() && def ? *def : x);
    } else {
      out.push_back(apply_filter(c, item));
    }
  }
  return generator(std::move(out));
}

Value unique(FilterCall& c) {
  Array out;
  for (const auto& item : c.items()) {
    c.in.tick(c.e, out.size() + 1);  // quadratic: every item against those kept
    bool seen = false;
    for (const auto& o : out) seen = seen || equals(o, item);
    if (!seen) out.push_back(item);
  }
  return Value::array(std::move(out));
}

// A string's code points reversed; a sequence's items as a generator.
Value reverse(FilterCall& c) {
  if (c.v.is_string()) {
    auto chars = c.in.chars_of(c.e, c.v.s);
    std::string r;
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) r += *it;
    return Value::string(r);
  }
  Array items = c.items();
  std::reverse(items.begin(), items.end());
  return generator(std::move(items));
}

// sort(reverse, case_sensitive, attribute): stable, by Python's ordering.
Value sort(FilterCall& c) {
  const Value* rev = c.kwarg(0, "reverse");
  const Value* attribute = c.kwarg(2, "attribute");
  Array items = c.items();
  c.in.tick(c.e, items.size() * (1 + std::bit_width(items.size())));  // n log n comparisons
  auto key = [&](const Value& x) { return attribute ? attr_path(x, to_str(*attribute)) : x; };
  std::stable_sort(items.begin(), items.end(),
                   [&](const Value& a, const Value& b) { return compare(key(a), key(b)) < 0; });
  if (rev && rev->truthy()) std::reverse(items.begin(), items.end());
  return Value::array(std::move(items));
}

// Numbers.

// int(value, default=0): a whole string's integer, a float truncated.
Value int_filter(FilterCall& c) {
  const Value& v = c.v;
  if (v.kind == K::kInt) return v;
  if (v.kind == K::kFloat) return Value::integer(static_cast<int64_t>(v.f));
  if (v.kind == K::kBool) return Value::integer(v.b);
  try {
    size_t used = 0;
    std::string s = strip_chars(to_str(v), nullptr, true, true);
    int64_t x = std::stoll(s, &used);
    if (used == s.size()) return Value::integer(x);
  } catch (const std::exception&) {
  }
  const Value* def = c.kwarg(0, "default");
  return def ? *def : Value::integer(0);
}

// float(value, default=0.0).
Value float_filter(FilterCall& c) {
  const Value& v = c.v;
  if (v.is_number() || v.kind == K::kBool) return Value::number(v.as_double());
  try {
    return Value::number(std::stod(to_str(v)));
  } catch (const std::exception&) {
    const Value* def = c.kwarg(0, "default");
    return def ? *def : Value::number(0);
  }
}

Value abs_filter(FilterCall& c) {
  if (c.v.kind == K::kInt) return Value::integer(c.v.i < 0 ? -c.v.i : c.v.i);
  return Value::number(std::fabs(c.v.as_double()));
}

Value round_filter(FilterCall& c) {
  const Value* prec = c.kwarg(0, "precision");
  double scale = std::pow(10.0, prec ? static_cast<double>(prec->i) : 0.0);
  return Value::number(std::nearbyint(c.v.as_double() * scale) / scale);  // half to even
}

const std::unordered_map<std::string_view, Filter>& filters() {
  static const std::unordered_map<std::string_view, Filter> table = {
      {"tojson", tojson},
      {"from_json", from_json_filter},
      {"safe", safe},
      {"string", string_filter},
      {"trim", trim},
      {"upper", upper_filter},
      {"lower", lower_filter},
      {"title", title_filter},
      {"capitalize", capitalize_filter},
      {"replace", replace_filter},
      {"wordcount", wordcount},
      {"indent", indent},
      {"length", length},
      {"count", length},
      {"default", default_filter},
      {"d", default_filter},
      {"items", items},
      {"dictsort", dictsort},
      {"list", list},
      {"first", first_or_last},
      {"last", first_or_last},
      {"join", join},
      {"select", select},
      {"reject", select},
      {"selectattr", select},
      {"rejectattr", select},
      {"map", map},
      {"unique", unique},
      {"reverse", reverse},
      {"sort", sort},
      {"int", int_filter},
      {"float", float_filter},
      {"abs", abs_filter},
      {"round", round_filter},
  };
  return table;
}

}  // namespace

Value Interpreter::call_filter(const Expr& e, Frames& f) {
  FilterCall c{*this, e, f, eval(*e.kids[0], f), {}, {}};
  eval_args(e, 1, f, c.args, c.kw);
  const auto& table = filters();
  const auto it = table.find(e.name);
  if (it == table.end()) error(e, fmt::format("No filter named '{}'.", e.name));
  return it->second(c);
}

bool Interpreter::call_test(const Expr& e, Frames& f) {
  Value v = eval(*e.kids[0], f);
  std::vector<Value> args;
  KwArgs kw;
  eval_args(e, 1, f, args, kw);
  const std::string& t = e.name;
  auto need = [&](size_t n) {
    if (args.size() < n) error(e, fmt::format("test '{}' needs an argument", t));
  };
  using K = Value::Kind;
  if (t == "defined") return !v.is_undefined();
  if (t == "undefined") return v.is_undefined();
  if (t == "none") return v.is_none();
  if (t == "string") return v.is_string();
  if (t == "mapping") return v.is_object();
  if (t == "sequence") return v.is_array() || v.is_string() || v.is_object();
  if (t == "iterable") return v.is_array() || v.is_string() || v.is_object();
  if (t == "number") return v.is_number() || v.kind == K::kBool;
  if (t == "integer") return v.kind == K::kInt;
  if (t == "float") return v.kind == K::kFloat;
  if (t == "boolean") return v.kind == K::kBool;
  if (t == "true") return v.kind == K::kBool && v.b;
  if (t == "false") return v.kind == K::kBool && !v.b;
  if (t == "callable") return v.kind == K::kCallable;
  if (t == "lower") return v.is_string() && lower(v.s) == v.s;
  if (t == "upper") return v.is_string() && upper(v.s) == v.s;
  if (t == "odd" || t == "even") {
    if (v.kind != K::kInt) error(e, "odd/even test needs an integer");
    return (v.i % 2 != 0) == (t == "odd");
  }
  if (t == "divisibleby") {
    need(1);
    return args[0].i != 0 && v.i % args[0].i == 0;
  }
  if (t == "equalto" || t == "eq" || t == "==" || t == "sameas") {
    need(1);
    return equals(v, args[0]) && (t != "sameas" || v.kind == args[0].kind);
  }
  if (t == "ne" || t == "!=") {
    need(1);
    return !equals(v, args[0]);
  }
  if (t == "gt" || t == "lt" || t == "ge" || t == "le") {
    need(1);
    int c = compare(v, args[0]);
    return t == "gt" ? c > 0 : t == "lt" ? c < 0 : t == "ge" ? c >= 0 : c <= 0;
  }
  if (t == "in") {
    need(1);
    if (args[0].is_string()) return v.is_string() && args[0].s.find(v.s) != std::string::npos;
    if (args[0].is_object()) return v.is_string() && args[0].find(v.s);
    for (const auto& x : iterate(args[0], e.line, e.col)) {
      if (equals(v, x)) return true;
    }
    return false;
  }
  error(e, fmt::format("No test named '{}'.", t));
}

}  // namespace tandem::jinja
