// A Jinja2 template engine for chat templates: lexer, parser to an AST and a tree-walking
// interpreter with the semantics of Python's jinja2 as Hugging Face configures it
// (trim_blocks, lstrip_blocks, loopcontrols, immutable sandbox, tojson = json.dumps). Only
// what real chat templates use is supported; anything else fails with the line and column.
#pragma once

#include <memory>
#include <string>

#include "engine/jinja_value.h"

namespace tandem::jinja {

struct Stmt;

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
  std::string render(const Value& globals) const;

 private:
  std::string name_;
  std::shared_ptr<Stmt> root_;
};

}  // namespace tandem::jinja
