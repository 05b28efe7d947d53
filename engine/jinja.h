// A Jinja2 template engine for chat templates: lexer, parser to an AST and a tree-walking
// interpreter with the semantics of Python's jinja2 as Hugging Face configures it
// (trim_blocks, lstrip_blocks, loopcontrols, immutable sandbox, tojson = json.dumps). Only
// what real chat templates use is supported; anything else fails with the line and column.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/jinja_value.h"

namespace tandem::jinja {

struct Stmt;

// What one render may spend. A template comes from a model file (untrusted): nested range()
// loops would run for hours, {{ "x" * 1000000000 }}, a self-doubling string or a list grown item
// by item would take all memory. Each bound is far above what the real templates of
// tests/data/templates use on long conversations; going past one throws Error(kResource) naming
// the template line and column.
struct RenderLimits {
  uint64_t output_bytes = uint64_t{64} << 20;  // the rendered text; a {% set %} block; a macro's
  uint64_t string_bytes = uint64_t{64} << 20;  // one string value
  uint64_t list_items = uint64_t{1} << 20;     // one list (range(), split(), +, a string's chars)
  // Loop iterations, macro calls and items walked by filters and tests, the whole render (a
  // 400-message conversation takes a few thousand; this many run in about half a second).
  uint64_t iterations = uint64_t{1} << 18;
  // Bytes of strings made or copied (a variable read copies its string) and of list items, the
  // whole render: what bounds the time and memory of everything else.
  uint64_t bytes = uint64_t{256} << 20;
};

class Template {
 public:
  // Parses `source`; throws Error(kFormat) "<name>:<line>:<col>: ..." on a syntax error.
  explicit Template(std::string source, std::string name = "template");
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the members of the object `globals` as variables (functions included).
  // Runtime errors (raise_exception, type errors) throw Error naming the line and column,
  // except raise_exception whose message is the template's own.
  std::string render(const Value& globals, const RenderLimits& limits = {}) const;

 private:
  std::string name_;
  std::shared_ptr<Stmt> root_;
};

}  // namespace tandem::jinja
