// The Python methods of the Jinja2 engine's strings and dicts (`s.strip()`, `d.items()`): each
// a callable bound to its object, made when the template reads the attribute.
#include <cctype>
#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "engine/jinja_interp.h"

namespace tandem::jinja {
namespace {

// A method bound to `self`: `body(self, args, kwargs)` when the template calls it.
template <typename Body>
Value bound(const Value& self, Body body) {
  return Value::function(
      [body, self](std::vector<Value>& args, KwArgs& kw) { return body(self, args, kw); });
}

// A method of `self` called `name`, read by the expression `e`.
using Method = Value (*)(Interpreter& in, const Expr& e, const Value& self,
                         const std::string& name);

// Strings.

// str.startswith / str.endswith: a string or a list of candidates.
Value affix_test(Interpreter&, const Expr&, const Value& self, const std::string& name) {
  const bool starts = name == "startswith";
  return bound(self, [starts](const Value& s, std::vector<Value>& args, KwArgs&) {
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

// str.split / str.rsplit (sep, maxsplit).
Value split_method(Interpreter& in, const Expr& e, const Value& self, const std::string& name) {
  const bool right = name == "rsplit";
  return bound(self, [in = &in, right, ln = e.line, cl = e.col](
                         const Value& s, std::vector<Value>& args, KwArgs& kw) {
    const Value* sep = arg(args, kw, 0, "sep");
    const Value* maxsplit = arg(args, kw, 1, "maxsplit");
    std::vector<std::string> parts = split(s.s, sep, maxsplit ? maxsplit->i : -1, right);
    in->made_list(ln, cl, parts.size());
    return str_array(parts);
  });
}

// str.strip / str.lstrip / str.rstrip (chars).
Value strip_method(Interpreter&, const Expr&, const Value& self, const std::string& name) {
  const bool l = name != "rstrip", r = name != "lstrip";
  return bound(self, [l, r](const Value& s, std::vector<Value>& args, KwArgs& kw) {
    return Value::string(strip_chars(s.s, arg(args, kw, 0, "chars"), l, r));
  });
}

// str.replace(old, new[, count]).
Value replace_method(Interpreter& in, const Expr&, const Value& self, const std::string&) {
  return bound(self, [in = &in](const Value& s, std::vector<Value>& args, KwArgs&) {
    if (args.size() < 2 || !args[0].is_string() || !args[1].is_string()) {
      fail(ErrorKind::kInvalidArgument, "replace() takes two strings");
    }
    return Value::string(replace(s.s, args[0].s, args[1].s, args.size() > 2 ? args[2].i : -1,
                                 in->limits().string_bytes));
  });
}

// str.upper / lower / title / capitalize.
Value case_method(Interpreter&, const Expr&, const Value& self, const std::string& name) {
  std::string (*convert)(std::string) = name == "upper"   ? upper
                                        : name == "lower" ? lower
                                        : name == "title" ? title
                                                          : capitalize;
  return bound(self,
               [convert](const Value& s, auto&, auto&) { return Value::string(convert(s.s)); });
}

// str.find / str.rfind (a code-point index, -1 when absent) and str.count (non-overlapping).
Value search_method(Interpreter&, const Expr&, const Value& self, const std::string& name) {
  return bound(self, [which = name](const Value& s, std::vector<Value>& args, KwArgs&) {
    if (args.empty() || !args[0].is_string()) {
      fail(ErrorKind::kInvalidArgument, "{}() takes a string", which);
    }
    const std::string& sub = args[0].s;
    if (which == "count") {
      int64_t n = 0;
      for (size_t p = s.s.find(sub); p != std::string::npos && !sub.empty();
           p = s.s.find(sub, p + sub.size())) {
        ++n;
      }
      return Value::integer(n);
    }
    size_t p = which == "find" ? s.s.find(sub) : s.s.rfind(sub);
    if (p == std::string::npos) return Value::integer(-1);
    const std::string_view before = std::string_view(s.s).substr(0, p);
    return Value::integer(static_cast<int64_t>(utf8_length(before)));
  });
}

// str.join(list): the items as strings, the string between them.
Value join_method(Interpreter& in, const Expr& e, const Value& self, const std::string&) {
  return bound(
      self, [in = &in, ln = e.line, cl = e.col](const Value& s, std::vector<Value>& args, KwArgs&) {
        std::string r;
        if (!args.empty() && args[0].is_array()) {
          in->tick(ln, cl, args[0].arr->size());
          for (size_t k = 0; k < args[0].arr->size(); ++k) {
            if (k) r += s.s;
            r += in->str((*args[0].arr)[k]);
            in->check_string(ln, cl, r.size());
          }
        }
        return Value::string(std::move(r));
      });
}

// str.isdigit / isspace / isalpha: every byte of a non-empty string in the class (ASCII).
Value class_test(Interpreter&, const Expr&, const Value& self, const std::string& name) {
  return bound(self, [which = name](const Value& s, auto&, auto&) {
    bool ok = !s.s.empty();
    for (unsigned char c : s.s) {
      ok = ok && (which == "isdigit"   ? isdigit(c)
                  : which == "isspace" ? is_space(static_cast<char>(c))
                                       : isalpha(c));
    }
    return Value::boolean(ok);
  });
}

const std::unordered_map<std::string_view, Method>& string_methods() {
  static const std::unordered_map<std::string_view, Method> table = {
      {"startswith", affix_test}, {"endswith", affix_test},    {"split", split_method},
      {"rsplit", split_method},   {"strip", strip_method},     {"lstrip", strip_method},
      {"rstrip", strip_method},   {"replace", replace_method}, {"upper", case_method},
      {"lower", case_method},     {"title", case_method},      {"capitalize", case_method},
      {"find", search_method},    {"rfind", search_method},    {"count", search_method},
      {"join", join_method},      {"isdigit", class_test},     {"isspace", class_test},
      {"isalpha", class_test},
  };
  return table;
}

// Dicts.

// dict.get(key[, default]).
Value dict_get(const Value& self) {
  return bound(self, [](const Value& d, std::vector<Value>& args, KwArgs&) {
    if (args.empty()) fail(ErrorKind::kInvalidArgument, "get() takes a key");
    const Value* v = args[0].is_string() ? d.find(args[0].s) : nullptr;
    return v ? *v : args.size() > 1 ? args[1] : Value::none();
  });
}

// dict.items / keys / values: a list (of (key, value) tuples for items).
Value dict_view(Interpreter& in, const Expr& e, const Value& self, const std::string& name) {
  const int which = name == "items" ? 0 : name == "keys" ? 1 : 2;
  return bound(self, [in = &in, which, ln = e.line, cl = e.col](const Value& d, auto&, auto&) {
    in->made_list(ln, cl, d.obj->size() * (which == 0 ? 3 : 1));
    Array r;
    for (const auto& [k, v] : *d.obj) {
      if (which == 0) {
        r.push_back(Value::array({Value::string(k), v}));
        r.back().is_tuple = true;
      } else {
        r.push_back(which == 1 ? Value::string(k) : v);
      }
    }
    return Value::array(std::move(r));
  });
}

}  // namespace

Value Interpreter::method(const Expr& e, const Value& self, const std::string& name) {
  if (self.is_string()) {
    const auto& methods = string_methods();
    const auto it = methods.find(name);
    if (it == methods.end()) return Value::undefined(no_attr(self, name));
    return it->second(*this, e, self, name);
  }
  if (self.is_object()) {
    if (name == "get") return dict_get(self);
    if (name == "items" || name == "keys" || name == "values") {
      return dict_view(*this, e, self, name);
    }
    error(e, fmt::format("access to attribute '{}' of 'dict' object is unsafe.", name));
  }
  return Value::undefined(no_attr(self, name));
}

}  // namespace tandem::jinja
