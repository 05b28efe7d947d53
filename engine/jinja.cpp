// Interpreter of the Jinja2 engine: evaluates the AST of jinja_parse.cpp over jinja::Value with
// jinja2's semantics (Undefined prints empty, loop scopes, namespace(), macros): statements,
// expressions and operators here; the filters and tests in jinja_filters.cpp, the Python methods
// of strings and dicts in jinja_methods.cpp.
#include "engine/jinja.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "engine/jinja_ast.h"
#include "engine/jinja_interp.h"

namespace tandem::jinja {

// jinja2's hint for a missing attribute or item, shown when the Undefined is used.
std::string no_attr(const Value& obj, const std::string& name) {
  return fmt::format("'{}' has no attribute '{}'",
                     obj.is_none() ? "None" : fmt::format("{} object", obj.type_name()), name);
}

// Positional-or-keyword argument `k` (name `key`) of a call, or nullptr.
const Value* arg(std::vector<Value>& args, KwArgs& kwargs, size_t k, const char* key) {
  if (k < args.size()) return &args[k];
  for (auto& [name, v] : kwargs) {
    if (name == key) return &v;
  }
  return nullptr;
}

// Statements.

Flow Interpreter::exec(const std::vector<StmtPtr>& body, Frames& f, std::string& out) {
  for (const auto& s : body) {
    Flow flow = exec(*s, f, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Flow Interpreter::exec(const Stmt& s, Frames& f, std::string& out) {
  try {
    return exec_stmt(s, f, out);
  } catch (const Error& e) {
    // A bound hit inside a value function (str(), tojson, ==) knows no template line: name
    // the statement's.
    if (e.kind() != ErrorKind::kResource || std::string_view(e.what()).starts_with(name_ + ":")) {
      throw;
    }
    over_budget(s.line, s.col, e.what());
  }
}

Flow Interpreter::exec_stmt(const Stmt& s, Frames& f, std::string& out) {
  switch (s.type) {
    case Stmt::Type::kBody: return exec(s.body, f, out);
    case Stmt::Type::kText: emit(out, s.text, s.line, s.col); return Flow::kNormal;
    case Stmt::Type::kOutput: {
      const Value v = eval(*s.expr, f);
      if (v.is_string()) {
        emit(out, v.s, s.line, s.col);
      } else {
        const std::string text = str(v);
        charge(s.line, s.col, text.size());
        emit(out, text, s.line, s.col);
      }
      return Flow::kNormal;
    }
    case Stmt::Type::kIf:
      for (size_t k = 0; k < s.conds.size(); ++k) {
        if (!s.conds[k] || eval(*s.conds[k], f).truthy()) return exec(s.branches[k], f, out);
      }
      return Flow::kNormal;
    case Stmt::Type::kFor: return exec_for(s, f, out);
    case Stmt::Type::kSet: assign(s, eval(*s.expr, f), f); return Flow::kNormal;
    case Stmt::Type::kSetBlock: {
      std::string captured;
      exec(s.body, f, captured);
      charge(s.line, s.col, captured.size());
      assign(s, Value::string(std::move(captured)), f);
      return Flow::kNormal;
    }
    case Stmt::Type::kMacro: define_macro(s, f); return Flow::kNormal;
    case Stmt::Type::kBreak: return Flow::kBreak;
    case Stmt::Type::kContinue: return Flow::kContinue;
  }
  return Flow::kNormal;
}

void Interpreter::assign(const Stmt& s, Value v, Frames& f) {
  if (s.attr_target) {
    Value ns = lookup(f, s.targets[0]);
    if (!ns.is_namespace) error(s.line, s.col, "can't assign attribute on non-namespace object");
    ns.set(s.targets[1], std::move(v));
    return;
  }
  if (s.targets.size() == 1) {
    (*f.back())[s.targets[0]] = std::move(v);
    return;
  }
  unpack(s.targets, v, *f.back(), s.line, s.col);
}

void Interpreter::unpack(const std::vector<std::string>& names, const Value& v, Frame& frame,
                         int line, int col) {
  if (!v.is_array() || v.arr->size() != names.size()) {
    error(line, col, fmt::format("cannot unpack {} into {} names", v.type_name(), names.size()));
  }
  for (size_t k = 0; k < names.size(); ++k) frame[names[k]] = (*v.arr)[k];
}

Array Interpreter::iterate(const Value& v, int line, int col) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kArray: {
      uint64_t bytes = v.arr->size() * sizeof(Value);
      for (const Value& x : *v.arr) bytes += x.s.size();
      charge(line, col, bytes);
      return *v.arr;
    }
    case Value::Kind::kObject: {
      charge(line, col, v.obj->size() * sizeof(Value));
      Array keys;
      for (const auto& kv : *v.obj) keys.push_back(Value::string(kv.first));
      return keys;
    }
    case Value::Kind::kString: {
      const uint64_t n = utf8_length(v.s);
      check_list(line, col, n);
      charge(line, col, n * sizeof(Value) + v.s.size());
      Array chars;
      for (auto& c : utf8_chars(v.s)) chars.push_back(Value::string(c));
      return chars;
    }
    default: error(line, col, fmt::format("'{}' object is not iterable", v.type_name()));
  }
}

Flow Interpreter::exec_for(const Stmt& s, Frames& f, std::string& out) {
  Array items = iterate(eval(*s.expr, f), s.line, s.col);
  Frames inner = f;
  inner.push_back(std::make_shared<Frame>());
  Frame& frame = *inner.back();
  if (!s.conds.empty()) {  // {% for x in xs if cond %}: filtered before loop.* is computed
    Array kept;
    for (const auto& item : items) {
      tick(s.line, s.col);
      bind(s, item, frame);
      if (eval(*s.conds[0], inner).truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  const size_t n = items.size();
  // One `loop` object for the whole loop, updated in place as jinja2's LoopContext is (a fresh
  // object per iteration cost most of an iteration's time).
  auto index = std::make_shared<size_t>(0);
  Value loop = Value::object({
      {"index", Value::integer(0)},
      {"index0", Value::integer(0)},
      {"revindex", Value::integer(0)},
      {"revindex0", Value::integer(0)},
      {"first", Value::boolean(false)},
      {"last", Value::boolean(false)},
      {"length", Value::integer(static_cast<int64_t>(n))},
      {"previtem", Value()},
      {"nextitem", Value()},
      {"cycle", Value::function([index](std::vector<Value>& args, KwArgs&) {
         if (args.empty()) fail(ErrorKind::kInvalidArgument, "no items for cycling given");
         return args[*index % args.size()];
       })},
  });
  Object& fields = *loop.obj;
  frame["loop"] = loop;
  for (size_t k = 0; k < n; ++k) {
    tick(s.line, s.col);
    bind(s, items[k], frame);
    *index = k;
    fields[0].second.i = static_cast<int64_t>(k + 1);
    fields[1].second.i = static_cast<int64_t>(k);
    fields[2].second.i = static_cast<int64_t>(n - k);
    fields[3].second.i = static_cast<int64_t>(n - k - 1);
    fields[4].second.b = k == 0;
    fields[5].second.b = k + 1 == n;
    fields[7].second = k > 0 ? items[k - 1] : Value::undefined("there is no previous item");
    fields[8].second = k + 1 < n ? items[k + 1] : Value::undefined("there is no next item");
    Flow flow = exec(s.body, inner, out);
    if (flow == Flow::kBreak) break;
  }
  if (n == 0) exec(s.else_body, inner, out);
  return Flow::kNormal;
}

void Interpreter::bind(const Stmt& s, const Value& item, Frame& frame) {
  if (s.targets.size() == 1) {
    frame[s.targets[0]] = item;
  } else {
    unpack(s.targets, item, frame, s.line, s.col);
  }
}

void Interpreter::define_macro(const Stmt& s, Frames& f) {
  // Macros see the template's globals and top-level variables, not the caller's locals.
  // Held weakly: the macro is stored in one of these frames, and a strong reference would
  // make a cycle that outlives render().
  std::vector<std::weak_ptr<Frame>> closure(f.begin(), f.begin() + std::min<size_t>(2, f.size()));
  const Stmt* def = &s;
  (*f.back())[s.name] = Value::function([this, def, closure](std::vector<Value>& args,
                                                              KwArgs& kwargs) {
    Frames mf;
    for (const auto& w : closure) {
      mf.push_back(w.lock());
      TD_CHECK(mf.back() != nullptr, "macro '{}' called after its template finished", def->name);
    }
    mf.push_back(std::make_shared<Frame>());
    Frame& frame = *mf.back();
    if (args.size() > def->params.size()) {
      error(def->line, def->col, fmt::format("macro '{}' takes not more than {} argument(s)",
                                             def->name, def->params.size()));
    }
    for (size_t k = 0; k < def->params.size(); ++k) {
      const std::string& pname = def->params[k].first;  // (no structured binding: clang 14
      const ExprPtr& pdef = def->params[k].second;       // lambdas may not capture one)
      if (k < args.size()) {
        frame[pname] = args[k];
        continue;
      }
      auto kw =
          std::find_if(kwargs.begin(), kwargs.end(), [&](auto& kv) { return kv.first == pname; });
      if (kw != kwargs.end()) {
        frame[pname] = kw->second;
      } else {
        frame[pname] =
            pdef ? eval(*pdef, mf) : Value::undefined(fmt::format("'{}' is undefined", pname));
      }
    }
    // Templates come from model files: bound the recursion instead of overflowing the stack.
    if (macro_depth_ >= kMaxMacroDepth) {
      error(def->line, def->col, fmt::format("macro '{}' nested deeper than {} calls", def->name,
                                             kMaxMacroDepth));
    }
    tick(def->line, def->col);
    ++macro_depth_;
    std::string out;
    try {
      exec(def->body, mf, out);
    } catch (...) {
      --macro_depth_;
      throw;
    }
    --macro_depth_;
    return Value::string(std::move(out));
  });
}

// Expressions.

Value Interpreter::eval_expr(const Expr& e, Frames& f) {
  switch (e.type) {
    case Expr::Type::kLiteral: return e.literal;
    case Expr::Type::kName: return lookup(f, e.name);
    case Expr::Type::kList:
    case Expr::Type::kTuple: {
      made_list(e, e.kids.size());
      Array a;
      for (const auto& k : e.kids) a.push_back(eval(*k, f));
      Value v = Value::array(std::move(a));
      v.is_tuple = e.type == Expr::Type::kTuple;
      return v;
    }
    case Expr::Type::kDict: {
      made_list(e, e.kids.size() / 2);
      Value d = Value::object();
      for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
        Value key = eval(*e.kids[k], f);
        if (!key.is_string()) error(e, "only string keys are supported in dict literals");
        d.set(key.s, eval(*e.kids[k + 1], f));
      }
      return d;
    }
    case Expr::Type::kUnary: {
      Value v = eval(*e.kids[0], f);
      if (e.name == "not") return Value::boolean(!v.truthy());
      if (v.kind == Value::Kind::kInt) return Value::integer(e.name == "-" ? -v.i : v.i);
      if (v.kind == Value::Kind::kFloat) return Value::number(e.name == "-" ? -v.f : v.f);
      error(e, fmt::format("bad operand type for unary {}: '{}'", e.name, v.type_name()));
    }
    case Expr::Type::kBinary: return binary(e, f);
    case Expr::Type::kCond:
      if (eval(*e.kids[1], f).truthy()) return eval(*e.kids[0], f);
      return e.kids.size() > 2 ? eval(*e.kids[2], f) : Value::undefined();
    case Expr::Type::kAttr: return get_attr(e, eval(*e.kids[0], f), e.name);
    case Expr::Type::kItem: return get_item(e, eval(*e.kids[0], f), eval(*e.kids[1], f));
    case Expr::Type::kSlice: return slice(e, eval(*e.kids[0], f), f);
    case Expr::Type::kCall: {
      Value callee = eval(*e.kids[0], f);
      if (callee.kind != Value::Kind::kCallable) {
        std::string what = e.kids[0]->type == Expr::Type::kName ? e.kids[0]->name
                           : e.kids[0]->type == Expr::Type::kAttr ? e.kids[0]->name : "value";
        error(e, callee.is_undefined() && !callee.s.empty() ? callee.s
                                                            : fmt::format("'{}' is not callable", what));
      }
      std::vector<Value> args;
      KwArgs kw;
      eval_args(e, 1, f, args, kw);
      return (*callee.fn)(args, kw);
    }
    case Expr::Type::kFilter: return call_filter(e, f);
    case Expr::Type::kTest: return Value::boolean(call_test(e, f) != e.negated);
  }
  error(e, "unknown expression");
}

namespace {

// `a ~ b`: both as strings, joined.
Value tilde(Interpreter& in, const Expr& e, const Value& a, const Value& b) {
  std::string x = in.str(a);
  const std::string y = in.str(b);
  in.check_string(e.line, e.col, x.size() + y.size());
  return in.made_string(e, std::move(x) + y);
}

// `a in b`: a substring of a string, an item of a list, a key of a dict; never in Undefined.
bool contains(Interpreter& in, const Expr& e, const Value& a, const Value& b) {
  bool found = false;
  if (b.is_string()) {
    if (!a.is_string()) in.error(e, "'in <string>' requires string as left operand");
    found = b.s.find(a.s) != std::string::npos;
  } else if (b.is_array()) {
    in.tick(e, b.arr->size());
    for (const auto& x : *b.arr) found = found || equals(a, x);
  } else if (b.is_object()) {
    found = a.is_string() && b.find(a.s) != nullptr;
  } else if (!b.is_undefined()) {
    in.error(e, fmt::format("argument of type '{}' is not iterable", b.type_name()));
  }
  return found;
}

// < > <= >=: Python's ordering; unorderable types are an error naming the line.
Value order(Interpreter& in, const Expr& e, const Value& a, const Value& b) {
  const std::string& op = e.name;
  int c;
  try {
    c = compare(a, b);
  } catch (const Error& err) {
    if (err.kind() == ErrorKind::kResource) in.over_budget(e.line, e.col, err.what());
    in.error(e, err.what());
  }
  return Value::boolean(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
}

// `a + b` of a string or list `a`: two strings or two lists joined, anything else Python's error.
Value concatenate(Interpreter& in, const Expr& e, const Value& a, const Value& b) {
  if (a.is_string() && b.is_string()) {
    in.check_string(e.line, e.col, a.s.size() + b.s.size());
    return in.made_string(e, a.s + b.s);
  }
  if (a.is_array() && b.is_array()) {
    in.made_list(e, a.arr->size() + b.arr->size());
    for (const Array* part : {a.arr.get(), b.arr.get()}) {
      for (const Value& x : *part) in.charge(e.line, e.col, x.s.size());
    }
    Array r = *a.arr;
    r.insert(r.end(), b.arr->begin(), b.arr->end());
    return Value::array(std::move(r));
  }
  // Python's own wording
  in.error(e, fmt::format("can only concatenate {} (not \"{}\") to {}", a.type_name(),
                          b.type_name(), a.type_name()));
}

// `s * n`: the string n times (none for n <= 0).
Value repeat(Interpreter& in, const Expr& e, const std::string& s, int64_t n) {
  // Sized before it is built: "x" * 1000000000 is refused, not allocated.
  const uint64_t max_bytes = in.limits().string_bytes;
  if (n > 0 && !s.empty() && uint64_t(n) > max_bytes / s.size()) {
    in.over_budget(e.line, e.col,
                   fmt::format("a string of {} x {} bytes, more than {}", n, s.size(), max_bytes));
  }
  std::string r;
  r.reserve(n > 0 ? s.size() * uint64_t(n) : 0);
  for (int64_t k = 0; k < n; ++k) r += s;
  return in.made_string(e, std::move(r));
}

// The operands of an arithmetic operator: as integers (a bool is 0 or 1) and as doubles; `ints`
// when neither is a float.
struct Numbers {
  bool ints;
  int64_t x, y;
  double dx, dy;
};

// Integers are 64-bit here (Python's are unbounded): a result past them is an error, never a
// wrapped or undefined value.
[[noreturn]] void overflow(Interpreter& in, const Expr& e, const Numbers& n) {
  in.error(e, fmt::format("integer overflow in {} {} {}", n.x, e.name, n.y));
}

// + - * **: exact on integers, double on floats (and for a negative integer power).
Value add_sub_mul_pow(Interpreter& in, const Expr& e, const Numbers& n) {
  const std::string& op = e.name;
  int64_t r = 0;
  if (op == "+") {
    if (!n.ints) return Value::number(n.dx + n.dy);
    if (__builtin_add_overflow(n.x, n.y, &r)) overflow(in, e, n);
    return Value::integer(r);
  }
  if (op == "-") {
    if (!n.ints) return Value::number(n.dx - n.dy);
    if (__builtin_sub_overflow(n.x, n.y, &r)) overflow(in, e, n);
    return Value::integer(r);
  }
  if (op == "*") {
    if (!n.ints) return Value::number(n.dx * n.dy);
    if (__builtin_mul_overflow(n.x, n.y, &r)) overflow(in, e, n);
    return Value::integer(r);
  }
  if (!n.ints || n.y < 0) return Value::number(std::pow(n.dx, n.dy));
  int64_t p = 1;  // by squaring, each step checked
  for (int64_t base = n.x, k = n.y; k > 0; k >>= 1) {
    if ((k & 1) && __builtin_mul_overflow(p, base, &p)) overflow(in, e, n);
    if (k > 1 && __builtin_mul_overflow(base, base, &base)) overflow(in, e, n);
  }
  return Value::integer(p);
}

// / // %: a zero divisor refused with Python's messages; // and % floor as Python does (the
// remainder takes the divisor's sign).
Value div_mod(Interpreter& in, const Expr& e, const Numbers& n) {
  const std::string& op = e.name;
  if (n.dy == 0) {
    in.error(e, op == "/" ? (n.ints ? "division by zero" : "float division by zero")
                : n.ints  ? "integer division or modulo by zero"
                          : "float modulo");
  }
  if (op == "/") return Value::number(n.dx / n.dy);
  if (op == "//") {
    if (n.ints) {
      if (n.x == INT64_MIN && n.y == -1) overflow(in, e, n);
      return Value::integer(n.x / n.y - ((n.x % n.y != 0) && ((n.x < 0) != (n.y < 0))));  // floor
    }
    return Value::number(std::floor(n.dx / n.dy));
  }
  if (op == "%") {
    if (n.ints) {
      const int64_t m = n.y == -1 ? 0 : n.x % n.y;  // (INT64_MIN % -1 traps)
      return Value::integer(m != 0 && (m < 0) != (n.y < 0) ? m + n.y : m);  // the divisor's sign
    }
    return Value::number(n.dx - n.dy * std::floor(n.dx / n.dy));
  }
  in.error(e, fmt::format("unsupported operator '{}'", op));
}

// The arithmetic operators on numbers and bools.
Value arithmetic(Interpreter& in, const Expr& e, const Value& a, const Value& b) {
  const std::string& op = e.name;
  const bool an = a.is_number() || a.kind == Value::Kind::kBool;
  const bool bn = b.is_number() || b.kind == Value::Kind::kBool;
  if (!an || !bn) {
    in.error(e, fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(),
                            b.type_name()));
  }
  const Numbers n{a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat,
                  a.kind == Value::Kind::kBool ? a.b : a.i,
                  b.kind == Value::Kind::kBool ? b.b : b.i, a.as_double(), b.as_double()};
  if (op == "+" || op == "-" || op == "*" || op == "**") return add_sub_mul_pow(in, e, n);
  return div_mod(in, e, n);
}

}  // namespace

Value Interpreter::binary(const Expr& e, Frames& f) {
  const std::string& op = e.name;
  Value a = eval(*e.kids[0], f);
  if (op == "and") return a.truthy() ? eval(*e.kids[1], f) : a;
  if (op == "or") return a.truthy() ? a : eval(*e.kids[1], f);
  Value b = eval(*e.kids[1], f);
  if (op == "~") return tilde(*this, e, a, b);
  if (op == "==") return Value::boolean(equals(a, b));
  if (op == "!=") return Value::boolean(!equals(a, b));
  if (op == "in" || op == "not in") return Value::boolean(contains(*this, e, a, b) == (op == "in"));
  // The others refuse an Undefined operand.
  for (const Value* u : {&a, &b}) {
    if (u->is_undefined()) error(e, u->s.empty() ? "undefined value in an operation" : u->s);
  }
  if (op == "<" || op == ">" || op == "<=" || op == ">=") return order(*this, e, a, b);
  if (op == "+" && (a.is_string() || a.is_array())) return concatenate(*this, e, a, b);
  if (op == "*" && a.is_string() && b.kind == Value::Kind::kInt) return repeat(*this, e, a.s, b.i);
  return arithmetic(*this, e, a, b);
}

Value Interpreter::get_attr(const Expr& e, const Value& obj, const std::string& name) {
  if (obj.is_undefined()) error(e, obj.s.empty() ? "undefined value has no attribute '" + name + "'" : obj.s);
  if (obj.is_string()) return method(e, obj, name);
  if (obj.is_array()) {
    static const char* kMutating[] = {"append", "pop", "extend", "insert", "remove", "clear",
                                      "sort", "reverse"};
    for (const char* m : kMutating) {
      if (name == m) error(e, fmt::format("access to attribute '{}' of 'list' object is unsafe.", name));
    }
    return Value::undefined(no_attr(obj, name));
  }
  if (obj.is_object()) {
    if (!obj.is_namespace && (name == "get" || name == "items" || name == "keys" ||
                              name == "values" || name == "pop" || name == "update" ||
                              name == "setdefault" || name == "clear")) {
      return method(e, obj, name);
    }
    if (const Value* v = obj.find(name)) return *v;
    return Value::undefined(no_attr(obj, name));
  }
  return Value::undefined(no_attr(obj, name));
}

Value Interpreter::get_item(const Expr& e, const Value& obj, const Value& key) {
  if (obj.is_undefined()) error(e, obj.s.empty() ? "undefined value is not subscriptable" : obj.s);
  if (obj.is_object()) {
    if (key.is_string()) {
      if (const Value* v = obj.find(key.s)) return *v;
    }
    return Value::undefined(no_attr(obj, key.is_string() ? key.s : to_str(key)));
  }
  if ((obj.is_array() || obj.is_string()) && key.kind == Value::Kind::kInt) {
    std::vector<uint32_t> starts;  // a string's code points: their byte offsets, and the end
    if (obj.is_string()) {
      charge(e.line, e.col, obj.s.size());
      starts = utf8_starts(obj.s);
    }
    int64_t n = obj.is_array() ? static_cast<int64_t>(obj.arr->size())
                               : static_cast<int64_t>(starts.size()) - 1;
    int64_t k = key.i < 0 ? key.i + n : key.i;
    if (k < 0 || k >= n) {
      return Value::undefined(fmt::format("{} object has no element {}", obj.type_name(), key.i));
    }
    if (obj.is_array()) return (*obj.arr)[static_cast<size_t>(k)];
    return Value::string(obj.s.substr(starts[k], starts[k + 1] - starts[k]));
  }
  if (key.is_string()) return get_attr(e, obj, key.s);
  return Value::undefined(no_attr(obj, to_str(key)));
}

Value Interpreter::slice(const Expr& e, const Value& obj, Frames& f) {
  auto bound = [&](const ExprPtr& x) -> std::optional<int64_t> {
    if (!x) return std::nullopt;
    Value v = eval(*x, f);
    if (v.is_none()) return std::nullopt;
    if (v.kind != Value::Kind::kInt) error(e, "slice indices must be integers");
    return v.i;
  };
  std::optional<int64_t> start = bound(e.kids[1]), stop = bound(e.kids[2]), step_v = bound(e.kids[3]);
  int64_t step = step_v.value_or(1);
  if (step == 0) error(e, "slice step cannot be zero");
  std::vector<uint32_t> starts;  // a string's code points: their byte offsets, and the end
  if (obj.is_string()) {
    charge(e.line, e.col, obj.s.size());
    starts = utf8_starts(obj.s);
  } else if (!obj.is_array()) {
    error(e, fmt::format("'{}' object is not subscriptable", obj.type_name()));
  }
  int64_t n = obj.is_array() ? static_cast<int64_t>(obj.arr->size())
                             : static_cast<int64_t>(starts.size()) - 1;
  auto norm = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v < 0 ? *v + n : *v;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  int64_t b = norm(start, step > 0 ? 0 : n - 1), en = norm(stop, step > 0 ? n : -1);
  if (obj.is_string() && step == 1) {  // the common [a:b]: one substring
    return Value::string(b < en ? obj.s.substr(starts[b], starts[en] - starts[b]) : std::string());
  }
  Array items;
  std::string s;
  for (int64_t k = b; step > 0 ? k < en : k > en; k += step) {
    if (obj.is_array()) {
      items.push_back((*obj.arr)[static_cast<size_t>(k)]);
      charge(e.line, e.col, sizeof(Value) + items.back().s.size());
    } else {
      s.append(obj.s, starts[k], starts[k + 1] - starts[k]);
    }
  }
  if (obj.is_array()) {
    check_list(e.line, e.col, items.size());
    return Value::array(std::move(items));
  }
  return Value::string(std::move(s));
}

namespace {

void add_builtins(Frame& g, Interpreter& in) {
  g["namespace"] = Value::function([&in](std::vector<Value>& args, KwArgs& kw) {
    Value ns = Value::object();
    ns.is_namespace = true;
    in.track_namespace(ns);
    if (!args.empty() && args[0].is_object()) {
      for (const auto& [k, v] : *args[0].obj) ns.set(k, v);
    }
    for (const auto& [k, v] : kw) ns.set(k, v);
    return ns;
  });
  g["dict"] = Value::function([](std::vector<Value>&, KwArgs& kw) {
    Value d = Value::object();
    for (const auto& [k, v] : kw) d.set(k, v);
    return d;
  });
  g["range"] = Value::function([&in](std::vector<Value>& args, KwArgs&) {
    if (args.empty() || args.size() > 3) fail(ErrorKind::kInvalidArgument, "range() takes 1 to 3 arguments");
    int64_t start = args.size() > 1 ? args[0].i : 0, stop = args.size() > 1 ? args[1].i : args[0].i;
    int64_t step = args.size() > 2 ? args[2].i : 1;
    if (step == 0) fail(ErrorKind::kInvalidArgument, "range() step must not be zero");
    // In 128 bits: stop - start overflows int64 for range(-2**63, 2**63 - 1).
    const __int128 span = static_cast<__int128>(stop) - start;
    const __int128 count = (span > 0) != (step > 0) || span == 0
                               ? 0
                               : (span + step + (step > 0 ? -1 : 1)) / step;
    in.made_list(0, 0, static_cast<uint64_t>(std::min<__int128>(count, INT64_MAX)));
    Array a;
    a.reserve(static_cast<size_t>(count));
    for (__int128 k = 0; k < count; ++k) {
      a.push_back(Value::integer(static_cast<int64_t>(start + k * step)));
    }
    return Value::array(std::move(a));
  });
}

}  // namespace

Template::Template(std::string source, std::string name)
    : name_(std::move(name)), root_(parse_template(source, name_)) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Value& globals, const RenderLimits& limits) const {
  Interpreter interp(name_, limits);
  Frames frames;
  frames.push_back(std::make_shared<Frame>());
  Frame& g = *frames.back();
  add_builtins(g, interp);
  if (globals.is_object()) {
    for (const auto& [k, v] : *globals.obj) g[k] = v;
  }
  frames.push_back(std::make_shared<Frame>());  // the template's own top-level variables
  std::string out;
  interp.exec(*root_, frames, out);
  return out;
}

}  // namespace tandem::jinja
