// Interpreter of the Jinja2 engine: evaluates the AST of jinja_parse.cpp over jinja::Value with
// jinja2's semantics (Undefined prints empty, loop scopes, namespace(), macros) and the filters,
// tests and Python methods chat templates use.
#include "engine/jinja.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <optional>
#include <unordered_map>

#include "core/error.h"
#include "engine/jinja_ast.h"

namespace tandem::jinja {
namespace {

using Frame = std::unordered_map<std::string, Value>;
using Frames = std::vector<std::shared_ptr<Frame>>;
enum class Flow { kNormal, kBreak, kContinue };

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

class Interpreter {
 public:
  Interpreter(const std::string& name, const RenderLimits& limits) : name_(name), lim_(limits) {}
  // A namespace may hold itself ({% set ns.me = ns %}): emptied here, or the cycle of shared
  // pointers would outlive the render.
  ~Interpreter() {
    for (const std::weak_ptr<Object>& w : namespaces_) {
      if (std::shared_ptr<Object> o = w.lock()) Object().swap(*o);
    }
  }
  void track_namespace(const Value& ns) { namespaces_.push_back(ns.obj); }

  [[noreturn]] void error(int line, int col, const std::string& msg) const {
    fail(ErrorKind::kInvalidArgument, "{}:{}:{}: {}", name_, line, col, msg);
  }
  [[noreturn]] void error(const Expr& e, const std::string& msg) const { error(e.line, e.col, msg); }

  // The budgets of RenderLimits. Each failure names the template line.
  // line 0: where no expression is at hand (a builtin's call); exec() names the statement.
  [[noreturn]] void over_budget(int line, int col, const std::string& what) const {
    if (line == 0) fail(ErrorKind::kResource, "{}", what);
    fail(ErrorKind::kResource, "{}:{}:{}: {} (a template's render budget)", name_, line, col, what);
  }
  void tick(int line, int col, uint64_t n = 1) {
    iterations_ += n;
    if (iterations_ > lim_.iterations) [[unlikely]] {
      over_budget(line, col,
                  fmt::format("more than {} loop iterations, macro calls and items walked",
                              lim_.iterations));
    }
  }
  void tick(const Expr& e, uint64_t n = 1) { tick(e.line, e.col, n); }
  void charge(int line, int col, uint64_t bytes) {
    bytes_ += bytes;
    if (bytes_ > lim_.bytes) [[unlikely]] {
      over_budget(line, col, fmt::format("more than {} bytes of strings and lists made or copied",
                                         lim_.bytes));
    }
  }
  void check_string(int line, int col, uint64_t bytes) const {
    if (bytes > lim_.string_bytes) [[unlikely]] {
      over_budget(line, col, fmt::format("a string of {} bytes, more than {}", bytes,
                                         lim_.string_bytes));
    }
  }
  void check_list(int line, int col, uint64_t items) const {
    if (items > lim_.list_items) [[unlikely]] {
      over_budget(line, col, fmt::format("a list of {} items, more than {}", items,
                                         lim_.list_items));
    }
  }
  // A new list of `items` values: bounded and charged.
  void made_list(int line, int col, uint64_t items) {
    check_list(line, col, items);
    charge(line, col, items * sizeof(Value));
  }
  void made_list(const Expr& e, uint64_t items) { made_list(e.line, e.col, items); }
  // A new string made by an operator or filter: bounded (eval() charges it).
  Value made_string(const Expr& e, std::string s) {
    check_string(e.line, e.col, s.size());
    return Value::string(std::move(s));
  }
  std::string str(const Value& v) const { return to_str(v, lim_.string_bytes); }
  void emit(std::string& out, std::string_view text, int line, int col) const {
    if (out.size() + text.size() > lim_.output_bytes) [[unlikely]] {
      over_budget(line, col, fmt::format("output longer than {} bytes", lim_.output_bytes));
    }
    out += text;
  }
  // A string's code points (iterating it, reversing it): one list item each.
  std::vector<std::string> chars_of(const Expr& e, const std::string& s) {
    made_list(e, utf8_length(s));
    return utf8_chars(s);
  }

  Value lookup(const Frames& f, const std::string& n) const {
    for (auto it = f.rbegin(); it != f.rend(); ++it) {
      auto hit = (*it)->find(n);
      if (hit != (*it)->end()) return hit->second;
    }
    return Value::undefined(fmt::format("'{}' is undefined", n));
  }

  Flow exec(const std::vector<StmtPtr>& body, Frames& f, std::string& out) {
    for (const auto& s : body) {
      Flow flow = exec(*s, f, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow exec(const Stmt& s, Frames& f, std::string& out) {
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

  Flow exec_stmt(const Stmt& s, Frames& f, std::string& out) {
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

  void assign(const Stmt& s, Value v, Frames& f) {
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

  void unpack(const std::vector<std::string>& names, const Value& v, Frame& frame, int line, int col) {
    if (!v.is_array() || v.arr->size() != names.size()) {
      error(line, col, fmt::format("cannot unpack {} into {} names", v.type_name(), names.size()));
    }
    for (size_t k = 0; k < names.size(); ++k) frame[names[k]] = (*v.arr)[k];
  }

  // The items of a list, the keys of a dict, the characters of a string: a copy, charged.
  Array iterate(const Value& v, int line, int col) {
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

  Flow exec_for(const Stmt& s, Frames& f, std::string& out) {
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

  void bind(const Stmt& s, const Value& item, Frame& frame) {
    if (s.targets.size() == 1) {
      frame[s.targets[0]] = item;
    } else {
      unpack(s.targets, item, frame, s.line, s.col);
    }
  }

  void define_macro(const Stmt& s, Frames& f) {
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
        auto kw = std::find_if(kwargs.begin(), kwargs.end(), [&](auto& kv) { return kv.first == pname; });
        if (kw != kwargs.end()) frame[pname] = kw->second;
        else frame[pname] = pdef ? eval(*pdef, mf) : Value::undefined(fmt::format("'{}' is undefined", pname));
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

  // Every expression's value passes here: a string result is bounded and its bytes (made or
  // copied from a variable) charged.
  Value eval(const Expr& e, Frames& f) {
    Value v = eval_expr(e, f);
    if (v.kind == Value::Kind::kString) {
      check_string(e.line, e.col, v.s.size());
      charge(e.line, e.col, v.s.size());
    }
    return v;
  }
  Value eval_expr(const Expr& e, Frames& f);
  Value binary(const Expr& e, Frames& f);
  Value get_attr(const Expr& e, const Value& obj, const std::string& name);
  Value get_item(const Expr& e, const Value& obj, const Value& key);
  Value slice(const Expr& e, const Value& obj, Frames& f);
  Value call_filter(const Expr& e, Frames& f);
  bool call_test(const Expr& e, Frames& f);
  Value method(const Expr& e, const Value& self, const std::string& name);

  void eval_args(const Expr& e, size_t from, Frames& f, std::vector<Value>& args, KwArgs& kw) {
    for (size_t k = from; k < e.kids.size(); ++k) args.push_back(eval(*e.kids[k], f));
    for (const auto& [key, x] : e.kwargs) kw.emplace_back(key, eval(*x, f));
  }

 private:
  static constexpr int kMaxMacroDepth = 200;
  std::string name_;
  const RenderLimits& lim_;
  uint64_t iterations_ = 0, bytes_ = 0;  // spent so far
  int macro_depth_ = 0;
  std::vector<std::weak_ptr<Object>> namespaces_;
};

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

Value Interpreter::binary(const Expr& e, Frames& f) {
  const std::string& op = e.name;
  Value a = eval(*e.kids[0], f);
  if (op == "and") return a.truthy() ? eval(*e.kids[1], f) : a;
  if (op == "or") return a.truthy() ? a : eval(*e.kids[1], f);
  Value b = eval(*e.kids[1], f);
  if (op == "~") {
    std::string x = str(a);
    const std::string y = str(b);
    check_string(e.line, e.col, x.size() + y.size());
    return made_string(e, std::move(x) + y);
  }
  if (op != "==" && op != "!=" && op != "in" && op != "not in") {
    for (const Value* u : {&a, &b}) {
      if (u->is_undefined()) error(e, u->s.empty() ? "undefined value in an operation" : u->s);
    }
  }
  if (op == "==") return Value::boolean(equals(a, b));
  if (op == "!=") return Value::boolean(!equals(a, b));
  if (op == "in" || op == "not in") {
    bool found = false;
    if (b.is_string()) {
      if (!a.is_string()) error(e, "'in <string>' requires string as left operand");
      found = b.s.find(a.s) != std::string::npos;
    } else if (b.is_array()) {
      tick(e, b.arr->size());
      for (const auto& x : *b.arr) found = found || equals(a, x);
    } else if (b.is_object()) {
      found = a.is_string() && b.find(a.s) != nullptr;
    } else if (!b.is_undefined()) {
      error(e, fmt::format("argument of type '{}' is not iterable", b.type_name()));
    }
    return Value::boolean(found == (op == "in"));
  }
  if (op == "<" || op == ">" || op == "<=" || op == ">=") {
    int c;
    try {
      c = compare(a, b);
    } catch (const Error& err) {
      if (err.kind() == ErrorKind::kResource) over_budget(e.line, e.col, err.what());
      error(e, err.what());
    }
    return Value::boolean(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      check_string(e.line, e.col, a.s.size() + b.s.size());
      return made_string(e, a.s + b.s);
    }
    if (a.is_array() && b.is_array()) {
      made_list(e, a.arr->size() + b.arr->size());
      for (const Array* part : {a.arr.get(), b.arr.get()}) {
        for (const Value& x : *part) charge(e.line, e.col, x.s.size());
      }
      Array r = *a.arr;
      r.insert(r.end(), b.arr->begin(), b.arr->end());
      return Value::array(std::move(r));
    }
  }
  if (op == "+" && (a.is_string() || a.is_array())) {  // Python's own wording
    error(e, fmt::format("can only concatenate {} (not \"{}\") to {}", a.type_name(), b.type_name(),
                         a.type_name()));
  }
  if (op == "*" && a.is_string() && b.kind == Value::Kind::kInt) {
    // Sized before it is built: "x" * 1000000000 is refused, not allocated.
    if (b.i > 0 && !a.s.empty() && uint64_t(b.i) > lim_.string_bytes / a.s.size()) {
      over_budget(e.line, e.col, fmt::format("a string of {} x {} bytes, more than {}", b.i,
                                             a.s.size(), lim_.string_bytes));
    }
    std::string r;
    r.reserve(b.i > 0 ? a.s.size() * uint64_t(b.i) : 0);
    for (int64_t k = 0; k < b.i; ++k) r += a.s;
    return made_string(e, std::move(r));
  }
  bool an = a.is_number() || a.kind == Value::Kind::kBool;
  bool bn = b.is_number() || b.kind == Value::Kind::kBool;
  if (!an || !bn) {
    error(e, fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(),
                         b.type_name()));
  }
  bool ints = a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat;
  int64_t x = a.kind == Value::Kind::kBool ? a.b : a.i, y = b.kind == Value::Kind::kBool ? b.b : b.i;
  double dx = a.as_double(), dy = b.as_double();
  // Integers are 64-bit here (Python's are unbounded): a result past them is an error, never a
  // wrapped or undefined value.
  auto overflow = [&]() -> Value {
    error(e, fmt::format("integer overflow in {} {} {}", x, op, y));
  };
  int64_t r = 0;
  if (op == "+") {
    if (!ints) return Value::number(dx + dy);
    return __builtin_add_overflow(x, y, &r) ? overflow() : Value::integer(r);
  }
  if (op == "-") {
    if (!ints) return Value::number(dx - dy);
    return __builtin_sub_overflow(x, y, &r) ? overflow() : Value::integer(r);
  }
  if (op == "*") {
    if (!ints) return Value::number(dx * dy);
    return __builtin_mul_overflow(x, y, &r) ? overflow() : Value::integer(r);
  }
  if (op == "**") {
    if (!ints || y < 0) return Value::number(std::pow(dx, dy));
    int64_t p = 1;  // by squaring, each step checked
    for (int64_t base = x, n = y; n > 0; n >>= 1) {
      if ((n & 1) && __builtin_mul_overflow(p, base, &p)) return overflow();
      if (n > 1 && __builtin_mul_overflow(base, base, &base)) return overflow();
    }
    return Value::integer(p);
  }
  if (dy == 0) {
    error(e, op == "/" ? (ints ? "division by zero" : "float division by zero")
                       : ints ? "integer division or modulo by zero" : "float modulo");
  }
  if (op == "/") return Value::number(dx / dy);
  if (op == "//") {
    if (ints) {
      if (x == INT64_MIN && y == -1) return overflow();
      return Value::integer(x / y - ((x % y != 0) && ((x < 0) != (y < 0))));  // floor
    }
    return Value::number(std::floor(dx / dy));
  }
  if (op == "%") {
    if (ints) {
      const int64_t m = y == -1 ? 0 : x % y;  // (INT64_MIN % -1 traps)
      return Value::integer(m != 0 && (m < 0) != (y < 0) ? m + y : m);  // the divisor's sign
    }
    return Value::number(dx - dy * std::floor(dx / dy));
  }
  error(e, fmt::format("unsupported operator '{}'", op));
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

}  // namespace
}  // namespace tandem::jinja

namespace tandem::jinja {
namespace {

Value Interpreter::method(const Expr& e, const Value& self, const std::string& name) {
  auto m = [&](auto body) {
    return Value::function([body, self](std::vector<Value>& args, KwArgs& kw) { return body(self, args, kw); });
  };
  if (self.is_string()) {
    if (name == "startswith" || name == "endswith") {
      bool starts = name == "startswith";
      return m([starts](const Value& s, std::vector<Value>& args, KwArgs&) {
        if (args.empty()) fail(ErrorKind::kInvalidArgument, "startswith/endswith needs an argument");
        Array cands = args[0].is_array() ? *args[0].arr : Array{args[0]};
        for (const auto& c : cands) {
          if (!c.is_string() || c.s.size() > s.s.size()) continue;
          if (starts ? s.s.compare(0, c.s.size(), c.s) == 0
                     : s.s.compare(s.s.size() - c.s.size(), c.s.size(), c.s) == 0) {
            return Value::boolean(true);
          }
        }
        return Value::boolean(false);
      });
    }
    if (name == "split" || name == "rsplit") {
      bool right = name == "rsplit";
      return m([this, right, ln = e.line, cl = e.col](const Value& s, std::vector<Value>& args,
                                                       KwArgs& kw) {
        const Value* sep = arg(args, kw, 0, "sep");
        const Value* maxsplit = arg(args, kw, 1, "maxsplit");
        std::vector<std::string> parts = split(s.s, sep, maxsplit ? maxsplit->i : -1, right);
        made_list(ln, cl, parts.size());
        return str_array(parts);
      });
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      bool l = name != "rstrip", r = name != "lstrip";
      return m([l, r](const Value& s, std::vector<Value>& args, KwArgs& kw) {
        return Value::string(strip_chars(s.s, arg(args, kw, 0, "chars"), l, r));
      });
    }
    if (name == "replace") {
      return m([this](const Value& s, std::vector<Value>& args, KwArgs&) {
        if (args.size() < 2 || !args[0].is_string() || !args[1].is_string()) {
          fail(ErrorKind::kInvalidArgument, "replace() takes two strings");
        }
        return Value::string(replace(s.s, args[0].s, args[1].s, args.size() > 2 ? args[2].i : -1,
                                     lim_.string_bytes));
      });
    }
    if (name == "upper") return m([](const Value& s, auto&, auto&) { return Value::string(upper(s.s)); });
    if (name == "lower") return m([](const Value& s, auto&, auto&) { return Value::string(lower(s.s)); });
    if (name == "title") return m([](const Value& s, auto&, auto&) { return Value::string(title(s.s)); });
    if (name == "capitalize") {
      return m([](const Value& s, auto&, auto&) {
        std::string r = lower(s.s);
        if (!r.empty()) r[0] = static_cast<char>(toupper(static_cast<unsigned char>(r[0])));
        return Value::string(r);
      });
    }
    if (name == "find" || name == "rfind" || name == "count") {
      std::string which = name;
      return m([which](const Value& s, std::vector<Value>& args, KwArgs&) {
        if (args.empty() || !args[0].is_string()) fail(ErrorKind::kInvalidArgument, "{}() takes a string", which);
        const std::string& sub = args[0].s;
        if (which == "count") {
          int64_t n = 0;
          for (size_t p = s.s.find(sub); p != std::string::npos && !sub.empty(); p = s.s.find(sub, p + sub.size())) ++n;
          return Value::integer(n);
        }
        size_t p = which == "find" ? s.s.find(sub) : s.s.rfind(sub);
        if (p == std::string::npos) return Value::integer(-1);
        const std::string_view before = std::string_view(s.s).substr(0, p);
        return Value::integer(static_cast<int64_t>(utf8_length(before)));
      });
    }
    if (name == "join") {
      return m([this, ln = e.line, cl = e.col](const Value& s, std::vector<Value>& args, KwArgs&) {
        std::string r;
        if (!args.empty() && args[0].is_array()) {
          tick(ln, cl, args[0].arr->size());
          for (size_t k = 0; k < args[0].arr->size(); ++k) {
            if (k) r += s.s;
            r += str((*args[0].arr)[k]);
            check_string(ln, cl, r.size());
          }
        }
        return Value::string(std::move(r));
      });
    }
    if (name == "isdigit" || name == "isspace" || name == "isalpha") {
      std::string which = name;
      return m([which](const Value& s, auto&, auto&) {
        bool ok = !s.s.empty();
        for (unsigned char c : s.s) {
          ok = ok && (which == "isdigit" ? isdigit(c) : which == "isspace" ? is_space(static_cast<char>(c)) : isalpha(c));
        }
        return Value::boolean(ok);
      });
    }
    return Value::undefined(no_attr(self, name));
  }
  if (self.is_object()) {
    if (name == "get") {
      return m([](const Value& d, std::vector<Value>& args, KwArgs&) {
        if (args.empty()) fail(ErrorKind::kInvalidArgument, "get() takes a key");
        const Value* v = args[0].is_string() ? d.find(args[0].s) : nullptr;
        return v ? *v : args.size() > 1 ? args[1] : Value::none();
      });
    }
    if (name == "items" || name == "keys" || name == "values") {
      int which = name == "items" ? 0 : name == "keys" ? 1 : 2;
      return m([this, which, ln = e.line, cl = e.col](const Value& d, auto&, auto&) {
        made_list(ln, cl, d.obj->size() * (which == 0 ? 3 : 1));
        Array r;
        for (const auto& [k, v] : *d.obj) {
          if (which == 0) {
            r.push_back(Value::array({Value::string(k), v}));
            r.back().is_tuple = true;
          }
          else r.push_back(which == 1 ? Value::string(k) : v);
        }
        return Value::array(std::move(r));
      });
    }
    error(e, fmt::format("access to attribute '{}' of 'dict' object is unsafe.", name));
  }
  return Value::undefined(no_attr(self, name));
}

int64_t length_of(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kString: return static_cast<int64_t>(utf8_length(v.s));
    case Value::Kind::kArray: return static_cast<int64_t>(v.arr->size());
    case Value::Kind::kObject: return static_cast<int64_t>(v.obj->size());
    case Value::Kind::kUndefined: return 0;
    default: fail(ErrorKind::kInvalidArgument, "object of type '{}' has no len()", v.type_name());
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

Value Interpreter::call_filter(const Expr& e, Frames& f) {
  Value v = eval(*e.kids[0], f);
  std::vector<Value> args;
  KwArgs kw;
  eval_args(e, 1, f, args, kw);
  const std::string& n = e.name;
  using K = Value::Kind;
  if (n == "safe") return v;  // no autoescaping: Markup is plain text here
  if (n == "tojson") {
    const Value* indent = arg(args, kw, 1, "indent");
    const Value* seps = arg(args, kw, 2, "separators");
    const Value* sort = arg(args, kw, 3, "sort_keys");
    const Value* ascii = arg(args, kw, 0, "ensure_ascii");
    if (ascii && ascii->truthy()) error(e, "tojson(ensure_ascii=True) is not supported");
    int ind = indent && indent->kind == K::kInt ? static_cast<int>(indent->i) : -1;
    std::string item_sep = ind >= 0 ? "," : ", ", key_sep = ": ";
    if (seps && seps->is_array() && seps->arr->size() == 2) {
      item_sep = (*seps->arr)[0].s;
      key_sep = (*seps->arr)[1].s;
    }
    try {
      return Value::string(
          to_json(v, ind, item_sep, key_sep, sort && sort->truthy(), lim_.string_bytes));
    } catch (const Error& err) {
      if (err.kind() == ErrorKind::kResource) over_budget(e.line, e.col, err.what());
      error(e, err.what());
    }
  }
  if (n == "from_json") {  // (llama.cpp's templates: DeepSeek-V3.2's arguments as a JSON string)
    if (v.kind != K::kString) error(e, fmt::format("from_json expects a string, got {}", v.type_name()));
    const Json j = Json::parse(v.s, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) error(e, "from_json: not valid JSON");
    try {
      return from_json(j);
    } catch (const Error& err) {
      error(e, err.what());
    }
  }
  if (n == "length" || n == "count") return Value::integer(length_of(v));
  if (n == "string") return Value::string(str(v));
  if (n == "trim") return Value::string(strip_chars(str(v), arg(args, kw, 0, "chars"), true, true));
  if (n == "upper") return Value::string(upper(str(v)));
  if (n == "lower") return Value::string(lower(str(v)));
  if (n == "title") return Value::string(title(str(v)));
  if (n == "capitalize") {
    std::string r = lower(str(v));
    if (!r.empty()) r[0] = static_cast<char>(toupper(static_cast<unsigned char>(r[0])));
    return Value::string(r);
  }
  if (n == "replace") {
    if (args.size() < 2) error(e, "replace needs two arguments");
    return Value::string(replace(str(v), str(args[0]), str(args[1]),
                                 args.size() > 2 ? args[2].i : -1, lim_.string_bytes));
  }
  if (n == "default" || n == "d") {
    const Value* def = arg(args, kw, 0, "default_value");
    const Value* boolean = arg(args, kw, 1, "boolean");
    bool use = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
    return use ? (def ? *def : Value::string("")) : v;
  }
  if (n == "items") {
    if (v.is_undefined()) return Value::array();
    if (!v.is_object()) error(e, "Can only get item pairs from a mapping.");
    return method(e, v, "items").fn->operator()(args, kw);
  }
  if (n == "list") {
    Value r = Value::array(iterate(v, e.line, e.col));
    return r;
  }
  if (n == "first" || n == "last") {
    Array items = iterate(v, e.line, e.col);
    if (items.empty()) return Value::undefined(fmt::format("No {} item, sequence was empty.", n));
    return n == "first" ? items.front() : items.back();
  }
  if (n == "join") {
    const Value* sep = arg(args, kw, 0, "d");
    const Value* attribute = arg(args, kw, 1, "attribute");
    std::string r;
    Array items = iterate(v, e.line, e.col);
    tick(e, items.size());
    const std::string separator = sep ? str(*sep) : std::string();
    for (size_t k = 0; k < items.size(); ++k) {
      if (k) r += separator;
      r += str(attribute ? attr_path(items[k], str(*attribute)) : items[k]);
      check_string(e.line, e.col, r.size());
    }
    return Value::string(std::move(r));
  }
  if (n == "selectattr" || n == "rejectattr" || n == "select" || n == "reject") {
    bool by_attr = n == "selectattr" || n == "rejectattr";
    bool keep_if = n == "selectattr" || n == "select";
    size_t t0 = by_attr ? 1 : 0;
    if (by_attr && args.empty()) error(e, fmt::format("{} needs an attribute name", n));
    Array out;
    for (const auto& item : iterate(v, e.line, e.col)) {
      tick(e);
      Value x = by_attr ? attr_path(item, to_str(args[0])) : item;
      bool ok;
      if (args.size() <= t0) {
        ok = x.truthy();
      } else {
        // Builds the test as an expression over literals so the test code is shared.
        Expr test;
        test.type = Expr::Type::kTest;
        test.line = e.line;
        test.col = e.col;
        test.name = to_str(args[t0]);
        auto lit = [](Value val) {
          auto p = std::make_shared<Expr>();
          p->type = Expr::Type::kLiteral;
          p->literal = std::move(val);
          return p;
        };
        test.kids.push_back(lit(x));
        for (size_t k = t0 + 1; k < args.size(); ++k) test.kids.push_back(lit(args[k]));
        ok = call_test(test, f);
      }
      if (ok == keep_if) out.push_back(item);
    }
    Value r = Value::array(std::move(out));
    r.is_generator = true;
    return r;
  }
  if (n == "map") {
    const Value* attribute = arg(args, kw, 99, "attribute");
    const Value* def = arg(args, kw, 99, "default");
    Array out;
    for (const auto& item : iterate(v, e.line, e.col)) {
      tick(e);
      if (attribute) {
        Value x = attr_path(item, to_str(*attribute));
        out.push_back(x.is_undefined() && def ? *def : x);
      } else {
        if (args.empty()) error(e, "map needs a filter name or attribute=");
        Expr call;
        call.type = Expr::Type::kFilter;
        call.line = e.line;
        call.col = e.col;
        call.name = to_str(args[0]);
        auto p = std::make_shared<Expr>();
        p->type = Expr::Type::kLiteral;
        p->literal = item;
        call.kids.push_back(p);
        for (size_t k = 1; k < args.size(); ++k) {
          auto a = std::make_shared<Expr>();
          a->type = Expr::Type::kLiteral;
          a->literal = args[k];
          call.kids.push_back(a);
        }
        out.push_back(call_filter(call, f));
      }
    }
    Value r = Value::array(std::move(out));
    r.is_generator = true;
    return r;
  }
  if (n == "unique") {
    Array out;
    for (const auto& item : iterate(v, e.line, e.col)) {
      tick(e, out.size() + 1);  // quadratic: every item against those kept
      bool seen = false;
      for (const auto& o : out) seen = seen || equals(o, item);
      if (!seen) out.push_back(item);
    }
    return Value::array(std::move(out));
  }
  if (n == "reverse") {
    if (v.is_string()) {
      auto chars = chars_of(e, v.s);
      std::string r;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) r += *it;
      return Value::string(r);
    }
    Array items = iterate(v, e.line, e.col);
    std::reverse(items.begin(), items.end());
    Value r = Value::array(std::move(items));
    r.is_generator = true;
    return r;
  }
  if (n == "sort") {
    const Value* rev = arg(args, kw, 0, "reverse");
    const Value* attribute = arg(args, kw, 2, "attribute");
    Array items = iterate(v, e.line, e.col);
    tick(e, items.size() * (1 + std::bit_width(items.size())));  // n log n comparisons
    auto key = [&](const Value& x) { return attribute ? attr_path(x, to_str(*attribute)) : x; };
    std::stable_sort(items.begin(), items.end(),
                     [&](const Value& a, const Value& b) { return compare(key(a), key(b)) < 0; });
    if (rev && rev->truthy()) std::reverse(items.begin(), items.end());
    return Value::array(std::move(items));
  }
  if (n == "int") {
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
    const Value* def = arg(args, kw, 0, "default");
    return def ? *def : Value::integer(0);
  }
  if (n == "float") {
    if (v.is_number() || v.kind == K::kBool) return Value::number(v.as_double());
    try {
      return Value::number(std::stod(to_str(v)));
    } catch (const std::exception&) {
      const Value* def = arg(args, kw, 0, "default");
      return def ? *def : Value::number(0);
    }
  }
  if (n == "abs") {
    if (v.kind == K::kInt) return Value::integer(v.i < 0 ? -v.i : v.i);
    return Value::number(std::fabs(v.as_double()));
  }
  if (n == "round") {
    const Value* prec = arg(args, kw, 0, "precision");
    double scale = std::pow(10.0, prec ? static_cast<double>(prec->i) : 0.0);
    return Value::number(std::nearbyint(v.as_double() * scale) / scale);  // half to even
  }
  if (n == "wordcount") {
    const std::string s = str(v);
    charge(e.line, e.col, s.size() * sizeof(Value));  // split() makes a string per word
    return Value::integer(static_cast<int64_t>(split(s, nullptr, -1, false).size()));
  }
  if (n == "indent") {
    const Value* width = arg(args, kw, 0, "width");
    const Value* first = arg(args, kw, 1, "first");
    const int64_t w = width ? width->i : 4;  // " " * w: nothing when negative, as in Python
    check_string(e.line, e.col, w > 0 ? uint64_t(w) : 0);
    std::string pad(w > 0 ? static_cast<size_t>(w) : 0, ' ');
    std::string s = str(v), r = first && first->truthy() ? pad : "";
    for (size_t k = 0; k < s.size(); ++k) {
      r += s[k];
      if (s[k] == '\n' && k + 1 < s.size() && s[k + 1] != '\n') {
        r += pad;
        check_string(e.line, e.col, r.size());
      }
    }
    return Value::string(std::move(r));
  }
  if (n == "dictsort") {
    if (v.is_undefined()) return Value::array();
    if (!v.is_object()) error(e, "You can only sort by either \"key\" or \"value\" of a mapping.");
    Array items = *method(e, v, "items").fn->operator()(args, kw).arr;
    tick(e, items.size() * (1 + std::bit_width(items.size())));
    std::stable_sort(items.begin(), items.end(), [](const Value& a, const Value& b) {
      return lower((*a.arr)[0].s) < lower((*b.arr)[0].s);
    });
    return Value::array(std::move(items));
  }
  error(e, fmt::format("No filter named '{}'.", n));
}

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
}  // namespace tandem::jinja

namespace tandem::jinja {

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
