// Internal AST of the Jinja2 engine shared by the parser (jinja_parse.cpp) and the
// interpreter (jinja_interp.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/jinja_value.h"

namespace tandem::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::shared_ptr<Expr>;
using StmtPtr = std::shared_ptr<Stmt>;

struct Expr {
  enum class Type {
    kLiteral, kName, kList, kTuple, kDict, kUnary, kBinary, kCond, kAttr, kItem, kSlice, kCall,
    kFilter, kTest
  };
  Type type;
  int line = 0, col = 0;
  Value literal;                 // kLiteral
  std::string name;              // kName, kAttr, kFilter, kTest; operator for kUnary/kBinary
  std::vector<ExprPtr> kids;     // operands; kCall: callee then args; kFilter/kTest: input then args
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // kCall, kFilter, kTest
  bool negated = false;          // kTest: "is not"
};

struct Stmt {
  enum class Type { kBody, kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue };
  Type type;
  int line = 0, col = 0;
  std::string text;                 // kText
  std::vector<StmtPtr> body;        // kBody, kFor, kSetBlock, kMacro
  std::vector<StmtPtr> else_body;   // kFor
  std::vector<ExprPtr> conds;       // kIf: one per branch (nullptr for else); kFor: filter
  std::vector<std::vector<StmtPtr>> branches;  // kIf
  std::vector<std::string> targets; // kFor, kSet: names; kSet "ns.attr": {ns, attr} + attr_target
  bool attr_target = false;
  ExprPtr expr;                     // kOutput, kFor iterable, kSet value
  std::string name;                 // kMacro
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro (default nullptr when none)
};

// Python string helpers (jinja_strings.cpp).
std::vector<std::string> utf8_chars(const std::string& s);  // one entry per code point
size_t utf8_length(std::string_view s);                     // utf8_chars(s).size(), no copies
// The byte offset of each code point, then s.size(): n + 1 entries (strings < 4 GiB).
std::vector<uint32_t> utf8_starts(const std::string& s);
bool is_space(char c);
// str.strip/lstrip/rstrip: `chars` (a string Value) or whitespace when null or not a string.
std::string strip_chars(const std::string& s, const Value* chars, bool left, bool right);
// str.split / str.rsplit: `sep` null or None splits on whitespace runs; maxsplit < 0: no limit.
std::vector<std::string> split(const std::string& s, const Value* sep, int64_t maxsplit,
                               bool from_right);
Value str_array(const std::vector<std::string>& v);
std::string upper(std::string s);
std::string lower(std::string s);
std::string title(std::string s);
std::string capitalize(std::string s);  // lower case, the first byte upper
// str.replace; Error(kResource) when the result would pass max_bytes.
std::string replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count, uint64_t max_bytes);

// Parses a template source into a kBody statement; `name` prefixes error positions.
StmtPtr parse_template(const std::string& source, const std::string& name);

}  // namespace tandem::jinja
