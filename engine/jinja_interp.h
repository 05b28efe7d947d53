// Internal interpreter of the Jinja2 engine, shared by its files: statements and expressions
// (jinja.cpp), filters and tests (jinja_filters.cpp), the Python methods of strings and dicts
// (jinja_methods.cpp). It evaluates the AST of jinja_parse.cpp over jinja::Value and charges
// every render against its RenderLimits.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "engine/jinja.h"
#include "engine/jinja_ast.h"

namespace tandem::jinja {

using Frame = std::unordered_map<std::string, Value>;
using Frames = std::vector<std::shared_ptr<Frame>>;
enum class Flow { kNormal, kBreak, kContinue };

// jinja2's hint for a missing attribute or item, shown when the Undefined is used.
std::string no_attr(const Value& obj, const std::string& name);
// Positional-or-keyword argument `k` (name `key`) of a call, or nullptr.
const Value* arg(std::vector<Value>& args, KwArgs& kwargs, size_t k, const char* key);

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
  const RenderLimits& limits() const { return lim_; }

  [[noreturn]] void error(int line, int col, const std::string& msg) const {
    fail(ErrorKind::kInvalidArgument, "{}:{}:{}: {}", name_, line, col, msg);
  }
  [[noreturn]] void error(const Expr& e, const std::string& msg) const {
    error(e.line, e.col, msg);
  }

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

  // Statements (jinja.cpp).
  Flow exec(const std::vector<StmtPtr>& body, Frames& f, std::string& out);
  Flow exec(const Stmt& s, Frames& f, std::string& out);
  // The items of a list, the keys of a dict, the characters of a string: a copy, charged.
  Array iterate(const Value& v, int line, int col);

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
  void eval_args(const Expr& e, size_t from, Frames& f, std::vector<Value>& args, KwArgs& kw) {
    for (size_t k = from; k < e.kids.size(); ++k) args.push_back(eval(*e.kids[k], f));
    for (const auto& [key, x] : e.kwargs) kw.emplace_back(key, eval(*x, f));
  }
  // `e | name(args)` (jinja_filters.cpp).
  Value call_filter(const Expr& e, Frames& f);
  // `x is name(args)` (jinja_filters.cpp), not negated.
  bool call_test(const Expr& e, Frames& f);
  // `self.name` of a string or dict: the bound Python method (jinja_methods.cpp).
  Value method(const Expr& e, const Value& self, const std::string& name);

 private:
  Flow exec_stmt(const Stmt& s, Frames& f, std::string& out);
  void assign(const Stmt& s, Value v, Frames& f);
  void unpack(const std::vector<std::string>& names, const Value& v, Frame& frame, int line,
              int col);
  Flow exec_for(const Stmt& s, Frames& f, std::string& out);
  void bind(const Stmt& s, const Value& item, Frame& frame);
  void define_macro(const Stmt& s, Frames& f);

  Value eval_expr(const Expr& e, Frames& f);
  Value binary(const Expr& e, Frames& f);
  Value get_attr(const Expr& e, const Value& obj, const std::string& name);
  Value get_item(const Expr& e, const Value& obj, const Value& key);
  Value slice(const Expr& e, const Value& obj, Frames& f);

  static constexpr int kMaxMacroDepth = 200;
  std::string name_;
  const RenderLimits& lim_;
  uint64_t iterations_ = 0, bytes_ = 0;  // spent so far
  int macro_depth_ = 0;
  std::vector<std::weak_ptr<Object>> namespaces_;
};

}  // namespace tandem::jinja
