// Lexer and recursive-descent parser of the Jinja2 engine. Whitespace handling follows jinja2's
// lexer with trim_blocks and lstrip_blocks on: "-" strips all whitespace on its side, "+"
// disables lstrip, a block or comment tag drops the newline right after it, and a block or
// comment tag alone on a line (after spaces/tabs) drops that indentation.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <vector>

#include "core/error.h"
#include "engine/jinja.h"
#include "engine/jinja_ast.h"

namespace tandem::jinja {
namespace {

struct Token {
  enum class Type { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt,
                    kFloat, kOp, kEof };
  Type type;
  std::string s;
  int64_t i = 0;
  double f = 0;
  int line = 0, col = 0;
};
using TT = Token::Type;

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& name) : src_(src), name_(name) {}

  std::vector<Token> run() {
    bool line_starting = true;
    bool strip_next = false;  // the previous tag ended with "-"
    while (pos_ < src_.size()) {
      size_t start = find_tag(pos_);
      std::string text = src_.substr(pos_, start - pos_);
      int tline = line_, tcol = col_;
      advance_to(start);
      if (start < src_.size()) {
        char kind = src_[start + 1];
        char sign = start + 2 < src_.size() ? src_[start + 2] : 0;
        if (sign == '-') {
          size_t e = text.find_last_not_of(" \t\r\n\f\v");
          text.erase(e == std::string::npos ? 0 : e + 1);
        } else if (sign != '+' && kind != '{') {
          size_t l = text.rfind('\n');
          size_t lpos = l == std::string::npos ? 0 : l + 1;
          if ((lpos > 0 || line_starting) &&
              text.find_first_not_of(" \t", lpos) == std::string::npos) {
            text.erase(lpos);
          }
        }
      }
      if (!text.empty()) tokens_.push_back({TT::kText, text, 0, 0, tline, tcol});
      if (start >= src_.size()) break;
      char kind = src_[start + 1];
      bool had_sign = start + 2 < src_.size() && (src_[start + 2] == '-' || src_[start + 2] == '+');
      if (kind == '#') {
        size_t end = src_.find("#}", start + 2);
        if (end == std::string::npos) error("unterminated comment");
        strip_next = src_[end - 1] == '-' && end - 1 > start + 2;
        advance_to(end + 2);
        line_starting = strip_next ? eat_space() : src_[end - 1] != '+' && eat_newline();
        continue;
      }
      if (kind == '%' && is_raw(start)) continue;
      tokens_.push_back({kind == '{' ? TT::kVarBegin : TT::kBlockBegin, "", 0, 0, line_, col_});
      advance_to(start + 2 + (had_sign ? 1 : 0));
      bool trim = false;
      tag_tokens(kind == '{' ? '}' : '%', strip_next, trim);
      line_starting = strip_next ? eat_space() : trim && kind == '%' && eat_newline();
    }
    tokens_.push_back({TT::kEof, "", 0, 0, line_, col_});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(const std::string& msg) {
    fail(ErrorKind::kFormat, "{}:{}:{}: {}", name_, line_, col_, msg);
  }

  size_t find_tag(size_t from) const {
    for (size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) {
        return p;
      }
    }
    return src_.size();
  }

  void advance_to(size_t p) {
    for (; pos_ < p && pos_ < src_.size(); ++pos_) {
      if (src_[pos_] == '\n') {
        ++line_;
        col_ = 1;
      } else {
        ++col_;
      }
    }
  }

  // After a "-" tag end: drops all whitespace; true when the last dropped char was a newline.
  bool eat_space() {
    bool nl = false;
    while (pos_ < src_.size() && isspace(static_cast<unsigned char>(src_[pos_]))) {
      nl = src_[pos_] == '\n';
      advance_to(pos_ + 1);
    }
    return nl;
  }

  bool eat_newline() {
    if (pos_ < src_.size() && src_[pos_] == '\n') {
      advance_to(pos_ + 1);
      return true;
    }
    return false;
  }

  // {% raw %}...{% endraw %}: the body is text, untouched.
  bool is_raw(size_t start) {
    size_t p = start + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    while (p < src_.size() && isspace(static_cast<unsigned char>(src_[p]))) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    size_t close = src_.find("%}", p);
    if (close == std::string::npos) return false;
    bool strip_after_open = src_[close - 1] == '-';
    size_t body = close + 2;
    size_t end = src_.find("endraw", body);
    if (end == std::string::npos) error("missing endraw");
    size_t open = src_.rfind("{%", end);
    size_t end_close = src_.find("%}", end);
    if (open == std::string::npos || open < body || end_close == std::string::npos) {
      error("bad endraw tag");
    }
    std::string text = src_.substr(body, open - body);
    if (strip_after_open) text.erase(0, text.find_first_not_of(" \t\r\n"));
    if (src_[open + 2] == '-') text.erase(text.find_last_not_of(" \t\r\n") + 1);
    tokens_.push_back({TT::kText, text, 0, 0, line_, col_});
    advance_to(end_close + 2);
    if (src_[end_close - 1] == '-') {
      while (pos_ < src_.size() && isspace(static_cast<unsigned char>(src_[pos_]))) advance_to(pos_ + 1);
    } else if (src_[end_close - 1] != '+') {
      eat_newline();
    }
    return true;
  }

  // Tokens inside a tag up to its end delimiter ("}}" or "%}", maybe with "-" or "+").
  void tag_tokens(char closer, bool& strip_after, bool& trim) {
    int depth = 0;
    for (;;) {
      while (pos_ < src_.size() && isspace(static_cast<unsigned char>(src_[pos_]))) advance_to(pos_ + 1);
      if (pos_ >= src_.size()) error("unterminated tag");
      char c = src_[pos_];
      auto at = [&](const char* s) { return src_.compare(pos_, strlen(s), s) == 0; };
      std::string end2 = std::string(1, closer) + "}";
      if (depth == 0 || closer == '%') {
        if ((c == '-' || c == '+') && src_.compare(pos_ + 1, 2, end2) == 0) {
          strip_after = c == '-';
          trim = false;
          tokens_.push_back({closer == '}' ? TT::kVarEnd : TT::kBlockEnd, "", 0, 0, line_, col_});
          advance_to(pos_ + 3);
          return;
        }
        if (at(end2.c_str()) && (closer == '%' || depth == 0)) {
          strip_after = false;
          trim = true;
          tokens_.push_back({closer == '}' ? TT::kVarEnd : TT::kBlockEnd, "", 0, 0, line_, col_});
          advance_to(pos_ + 2);
          return;
        }
      }
      Token t{TT::kOp, "", 0, 0, line_, col_};
      if (isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() && (isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        t.type = TT::kName;
        t.s = src_.substr(pos_, e - pos_);
        advance_to(e);
      } else if (isdigit(static_cast<unsigned char>(c))) {
        size_t e = pos_;
        bool is_float = false;
        while (e < src_.size() && (isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        if (e + 1 < src_.size() && src_[e] == '.' && isdigit(static_cast<unsigned char>(src_[e + 1]))) {
          is_float = true;
          ++e;
          while (e < src_.size() && isdigit(static_cast<unsigned char>(src_[e]))) ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          size_t q = e + 1;
          if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
          if (q < src_.size() && isdigit(static_cast<unsigned char>(src_[q]))) {
            is_float = true;
            e = q;
            while (e < src_.size() && isdigit(static_cast<unsigned char>(src_[e]))) ++e;
          }
        }
        std::string num;
        for (size_t k = pos_; k < e; ++k) {
          if (src_[k] != '_') num += src_[k];
        }
        t.type = is_float ? TT::kFloat : TT::kInt;
        // from_chars: a literal out of range is a template error, not std::stoll's bare "stoll".
        const char* end = num.data() + num.size();
        const auto r = is_float ? std::from_chars(num.data(), end, t.f)
                                : std::from_chars(num.data(), end, t.i);
        if (r.ec != std::errc() || r.ptr != end) {
          error(fmt::format("number {} is out of range", printable(num)));
        }
        advance_to(e);
      } else if (c == '\'' || c == '"') {
        t.type = TT::kString;
        t.s = read_string(c);
      } else {
        static const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        t.s = std::string(1, c);
        for (const char* op : kTwo) {
          if (at(op)) t.s = op;
        }
        if (t.s.size() == 1 && std::string("+-*/%~<>=()[]{}.,:|!").find(c) == std::string::npos) {
          error(fmt::format("unexpected character '{}'", c));
        }
        if (c == '(' || c == '[' || c == '{') ++depth;
        if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        advance_to(pos_ + t.s.size());
      }
      tokens_.push_back(std::move(t));
    }
  }

  std::string read_string(char q) {
    std::string out;
    advance_to(pos_ + 1);
    while (pos_ < src_.size() && src_[pos_] != q) {
      char c = src_[pos_];
      if (c == '\\' && pos_ + 1 < src_.size()) {
        char n = src_[pos_ + 1];
        advance_to(pos_ + 2);
        switch (n) {
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'r': out += '\r'; break;
          case '0': out += '\0'; break;
          case '\\': out += '\\'; break;
          case '\'': out += '\''; break;
          case '"': out += '"'; break;
          case '\n': break;
          case 'u':
          case 'x': {
            size_t len = n == 'u' ? 4 : 2;
            uint32_t cp = 0;
            const char* hex = src_.data() + pos_;
            const char* hex_end = src_.data() + std::min(src_.size(), pos_ + len);
            const auto r = std::from_chars(hex, hex_end, cp, 16);
            if (r.ec != std::errc() || r.ptr != hex + len) {
              error(fmt::format("\\{} needs {} hex digits", n, len));
            }
            advance_to(pos_ + len);
            if (cp < 0x80) {
              out += static_cast<char>(cp);
            } else if (cp < 0x800) {
              out += static_cast<char>(0xC0 | (cp >> 6));
              out += static_cast<char>(0x80 | (cp & 0x3F));
            } else {
              out += static_cast<char>(0xE0 | (cp >> 12));
              out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
              out += static_cast<char>(0x80 | (cp & 0x3F));
            }
            break;
          }
          default: out += '\\'; out += n;
        }
        continue;
      }
      out += c;
      advance_to(pos_ + 1);
    }
    if (pos_ >= src_.size()) error("unterminated string literal");
    advance_to(pos_ + 1);
    return out;
  }

  const std::string& src_;
  const std::string& name_;
  size_t pos_ = 0;
  int line_ = 1, col_ = 1;
  std::vector<Token> tokens_;
};

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& name) : t_(std::move(tokens)), name_(name) {}

  StmtPtr parse() {
    auto root = std::make_shared<Stmt>();
    root->type = Stmt::Type::kBody;
    std::string end = parse_body(root->body, {}, "");
    if (!end.empty()) error(t_[p_], fmt::format("unexpected '{}'", end));
    return root;
  }

 private:
  [[noreturn]] void error(const Token& t, const std::string& msg) {
    fail(ErrorKind::kFormat, "{}:{}:{}: {}", name_, t.line, t.col, msg);
  }
  const Token& cur() const { return t_[p_]; }
  bool is_op(const char* op) const { return cur().type == TT::kOp && cur().s == op; }
  bool is_name(const char* n) const { return cur().type == TT::kName && cur().s == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) error(cur(), fmt::format("expected '{}'", op));
    ++p_;
  }
  std::string expect_name() {
    if (cur().type != TT::kName) error(cur(), "expected a name");
    return t_[p_++].s;
  }
  void expect(TT type, const char* what) {
    if (cur().type != type) error(cur(), fmt::format("expected {}", what));
    ++p_;
  }
  template <typename N>
  std::shared_ptr<N> node(const Token& at) {
    auto n = std::make_shared<N>();
    n->line = at.line;
    n->col = at.col;
    return n;
  }

  // Parses statements until a block tag whose keyword is in `ends`; returns that keyword with
  // the parser after it (before the tag end), or "" at end of input.
  std::string parse_body(std::vector<StmtPtr>& out, const std::vector<std::string>& ends,
                         const std::string& tag) {
    if (end_stack_.size() >= kMaxDepth) error(cur(), fmt::format("blocks nested deeper than {}", kMaxDepth));
    if (!ends.empty()) {
      end_stack_.push_back(ends);
      tag_stack_.push_back(tag);
    }
    std::string found = parse_body_inner(out, ends);
    if (!ends.empty()) {
      end_stack_.pop_back();
      tag_stack_.pop_back();
    }
    return found;
  }

  std::string parse_body_inner(std::vector<StmtPtr>& out, const std::vector<std::string>& ends) {
    for (;;) {
      const Token& t = cur();
      if (t.type == TT::kEof) {
        if (!ends.empty()) error(t, fmt::format("missing '{}'", ends.back()));
        return "";
      }
      if (t.type == TT::kText) {
        auto s = node<Stmt>(t);
        s->type = Stmt::Type::kText;
        s->text = t.s;
        out.push_back(s);
        ++p_;
      } else if (t.type == TT::kVarBegin) {
        ++p_;
        auto s = node<Stmt>(t);
        s->type = Stmt::Type::kOutput;
        s->expr = parse_expr();
        expect(TT::kVarEnd, "'}}'");
        out.push_back(s);
      } else if (t.type == TT::kBlockBegin) {
        ++p_;
        const Token& kw = cur();
        if (kw.type != TT::kName) error(kw, "expected a statement keyword");
        if (std::find(ends.begin(), ends.end(), kw.s) != ends.end()) {
          ++p_;
          return kw.s;
        }
        out.push_back(parse_statement());
      } else {
        error(t, "unexpected token");
      }
    }
  }

  StmtPtr parse_statement() {
    const Token& kw = t_[p_++];
    auto s = node<Stmt>(kw);
    if (kw.s == "if") {
      s->type = Stmt::Type::kIf;
      s->conds.push_back(parse_expr());
      for (;;) {
        expect(TT::kBlockEnd, "'%}'");
        s->branches.emplace_back();
        std::string end = parse_body(s->branches.back(), {"elif", "else", "endif"}, "if");
        if (end == "endif") break;
        s->conds.push_back(end == "elif" ? parse_expr() : nullptr);
        if (end == "else") {
          expect(TT::kBlockEnd, "'%}'");
          s->branches.emplace_back();
          parse_body(s->branches.back(), {"endif"}, "if");
          break;
        }
      }
    } else if (kw.s == "for") {
      s->type = Stmt::Type::kFor;
      s->targets.push_back(expect_name());
      while (is_op(",")) {
        ++p_;
        s->targets.push_back(expect_name());
      }
      if (!is_name("in")) error(cur(), "expected 'in'");
      ++p_;
      s->expr = parse_cond_free();
      if (is_name("if")) {
        ++p_;
        s->conds.push_back(parse_expr());
      }
      if (is_name("recursive")) error(cur(), "recursive loops are not supported");
      expect(TT::kBlockEnd, "'%}'");
      std::string end = parse_body(s->body, {"endfor", "else"}, "for");
      if (end == "else") {
        expect(TT::kBlockEnd, "'%}'");
        parse_body(s->else_body, {"endfor"}, "for");
      }
    } else if (kw.s == "set") {
      s->targets.push_back(expect_name());
      if (is_op(".")) {
        ++p_;
        s->targets.push_back(expect_name());
        s->attr_target = true;
      }
      while (is_op(",")) {
        ++p_;
        s->targets.push_back(expect_name());
      }
      if (is_op("=")) {
        ++p_;
        s->type = Stmt::Type::kSet;
        s->expr = parse_tuple_or_expr();
      } else {
        s->type = Stmt::Type::kSetBlock;
        if (is_op("|")) error(cur(), "filtered block set is not supported");
        expect(TT::kBlockEnd, "'%}'");
        parse_body(s->body, {"endset"}, "set");
      }
    } else if (kw.s == "macro") {
      s->type = Stmt::Type::kMacro;
      s->name = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        std::string param = expect_name();
        ExprPtr def;
        if (is_op("=")) {
          ++p_;
          def = parse_expr();
        }
        s->params.emplace_back(param, def);
        if (!is_op(")")) expect_op(",");
      }
      ++p_;
      expect(TT::kBlockEnd, "'%}'");
      parse_body(s->body, {"endmacro"}, "macro");
    } else if (kw.s == "break" || kw.s == "continue") {
      s->type = kw.s == "break" ? Stmt::Type::kBreak : Stmt::Type::kContinue;
    } else {
      error(kw, unknown_tag(kw.s));
    }
    if (cur().type == TT::kName) ++p_;  // optional name after endmacro/endblock
    expect(TT::kBlockEnd, "'%}'");
    return s;
  }

  ExprPtr make(Expr::Type type, const Token& at) {
    auto e = node<Expr>(at);
    e->type = type;
    return e;
  }

  // `a, b` without brackets (set a value, for's iterable).
  ExprPtr parse_tuple_or_expr() {
    const Token& at = cur();
    ExprPtr first = parse_expr();
    if (!is_op(",")) return first;
    auto t = make(Expr::Type::kTuple, at);
    t->kids.push_back(first);
    while (is_op(",")) {
      ++p_;
      t->kids.push_back(parse_expr());
    }
    return t;
  }

  ExprPtr parse_cond_free() { return parse_or(); }

  ExprPtr parse_expr() {
    DepthGuard guard(*this);
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const Token& at = t_[p_++];
      auto c = make(Expr::Type::kCond, at);
      c->kids.push_back(e);
      c->kids.push_back(parse_or());
      if (is_name("else")) {
        ++p_;
        c->kids.push_back(parse_expr());
      }
      e = c;
    }
    return e;
  }

  ExprPtr binary(const std::string& op, const Token& at, ExprPtr a, ExprPtr b) {
    auto e = make(Expr::Type::kBinary, at);
    e->name = op;
    e->kids = {std::move(a), std::move(b)};
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const Token& at = t_[p_++];
      e = binary("or", at, e, parse_and());
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const Token& at = t_[p_++];
      e = binary("and", at, e, parse_not());
    }
    return e;
  }
  ExprPtr parse_not() {
    DepthGuard guard(*this);
    if (is_name("not")) {
      const Token& at = t_[p_++];
      auto e = make(Expr::Type::kUnary, at);
      e->name = "not";
      e->kids.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    for (;;) {
      const Token& at = cur();
      if (at.type == TT::kOp && (at.s == "==" || at.s == "!=" || at.s == "<" || at.s == ">" ||
                                 at.s == "<=" || at.s == ">=")) {
        ++p_;
        e = binary(at.s, at, e, parse_math1());
      } else if (is_name("in")) {
        ++p_;
        e = binary("in", at, e, parse_math1());
      } else if (is_name("not") && t_[p_ + 1].type == TT::kName && t_[p_ + 1].s == "in") {
        p_ += 2;
        e = binary("not in", at, e, parse_math1());
      } else {
        return e;
      }
    }
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& at = t_[p_++];
      e = binary(at.s, at, e, parse_concat());
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const Token& at = t_[p_++];
      e = binary("~", at, e, parse_math2());
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& at = t_[p_++];
      e = binary(at.s, at, e, parse_pow());
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token& at = t_[p_++];
      e = binary("**", at, e, parse_unary(true));
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& at = t_[p_++];
      e = make(Expr::Type::kUnary, at);
      e->name = at.s;
      e->kids.push_back(parse_unary(false));
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filters(e) : e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    if (t.type == TT::kName) {
      ++p_;
      if (t.s == "true" || t.s == "True") return literal(t, Value::boolean(true));
      if (t.s == "false" || t.s == "False") return literal(t, Value::boolean(false));
      if (t.s == "none" || t.s == "None") return literal(t, Value::none());
      auto e = make(Expr::Type::kName, t);
      e->name = t.s;
      return e;
    }
    if (t.type == TT::kString) {
      std::string s;
      while (cur().type == TT::kString) s += t_[p_++].s;  // adjacent literals concatenate
      return literal(t, Value::string(s));
    }
    if (t.type == TT::kInt) {
      ++p_;
      return literal(t, Value::integer(t.i));
    }
    if (t.type == TT::kFloat) {
      ++p_;
      return literal(t, Value::number(t.f));
    }
    if (is_op("(")) {
      ++p_;
      if (is_op(")")) {
        ++p_;
        return make(Expr::Type::kTuple, t);
      }
      ExprPtr e = parse_expr();
      if (is_op(",")) {
        auto tup = make(Expr::Type::kTuple, t);
        tup->kids.push_back(e);
        while (is_op(",")) {
          ++p_;
          if (is_op(")")) break;
          tup->kids.push_back(parse_expr());
        }
        e = tup;
      }
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      ++p_;
      auto e = make(Expr::Type::kList, t);
      while (!is_op("]")) {
        e->kids.push_back(parse_expr());
        if (!is_op("]")) expect_op(",");
      }
      ++p_;
      return e;
    }
    if (is_op("{")) {
      ++p_;
      auto e = make(Expr::Type::kDict, t);
      while (!is_op("}")) {
        e->kids.push_back(parse_expr());
        expect_op(":");
        e->kids.push_back(parse_expr());
        if (!is_op("}")) expect_op(",");
      }
      ++p_;
      return e;
    }
    error(t, t.type == TT::kEof || t.type == TT::kBlockEnd || t.type == TT::kVarEnd
                 ? "unexpected end of expression" : fmt::format("unexpected '{}'", t.s));
  }

  ExprPtr literal(const Token& at, Value v) {
    auto e = make(Expr::Type::kLiteral, at);
    e->literal = std::move(v);
    return e;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (cur().type == TT::kName && t_[p_ + 1].type == TT::kOp && t_[p_ + 1].s == "=") {
        std::string key = t_[p_].s;
        p_ += 2;
        e.kwargs.emplace_back(key, parse_expr());
      } else {
        if (is_op("*")) error(cur(), "*args in calls is not supported");
        e.kids.push_back(parse_expr());
      }
      if (!is_op(")")) expect_op(",");
    }
    ++p_;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      const Token& at = cur();
      if (is_op(".")) {
        ++p_;
        auto a = make(Expr::Type::kAttr, at);
        if (cur().type == TT::kInt) {  // foo.0 is foo[0]
          a->type = Expr::Type::kItem;
          a->kids = {e, literal(cur(), Value::integer(cur().i))};
          ++p_;
        } else {
          a->name = expect_name();
          a->kids.push_back(e);
        }
        e = a;
      } else if (is_op("[")) {
        ++p_;
        ExprPtr parts[3];
        int n = 0;
        bool slice = false;
        for (;;) {
          if (!is_op(":") && !is_op("]")) parts[n] = parse_expr();
          if (is_op(":") && n < 2) {
            slice = true;
            ++n;
            ++p_;
            continue;
          }
          break;
        }
        if (!slice && !parts[0]) error(cur(), "expected an index between [ and ]");  // x[]
        expect_op("]");
        auto a = make(slice ? Expr::Type::kSlice : Expr::Type::kItem, at);
        a->kids = {e, parts[0]};
        if (slice) {
          a->kids.push_back(parts[1]);
          a->kids.push_back(parts[2]);
        }
        e = a;
      } else if (is_op("(")) {
        auto c = make(Expr::Type::kCall, at);
        c->kids.push_back(e);
        parse_call_args(*c);
        e = c;
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filters(ExprPtr e) {
    for (;;) {
      const Token& at = cur();
      if (is_op("|")) {
        ++p_;
        auto f = make(Expr::Type::kFilter, at);
        f->name = expect_name();
        f->kids.push_back(e);
        if (is_op("(")) parse_call_args(*f);
        e = parse_postfix(f);
      } else if (is_name("is")) {
        ++p_;
        auto t = make(Expr::Type::kTest, at);
        if (is_name("not")) {
          ++p_;
          t->negated = true;
        }
        t->name = expect_name();
        t->kids.push_back(e);
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((cur().type == TT::kName || cur().type == TT::kString ||
                    cur().type == TT::kInt || cur().type == TT::kFloat || is_op("[") ||
                    is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and") && !is_name("is")) {
          t->kids.push_back(parse_postfix(parse_primary()));
        }
        e = t;
      } else {
        return e;
      }
    }
  }

  // jinja2's wording, naming the tags the innermost open block expects.
  std::string unknown_tag(const std::string& tag) const {
    std::string msg = fmt::format("Encountered unknown tag '{}'.", tag);
    if (end_stack_.empty()) return msg;
    std::string looking;
    bool expected_anywhere = false;
    for (const auto& ends : end_stack_) {
      expected_anywhere = expected_anywhere || std::find(ends.begin(), ends.end(), tag) != ends.end();
    }
    for (const auto& e : end_stack_.back()) looking += (looking.empty() ? "'" : " or '") + e + "'";
    if (expected_anywhere) {
      msg += fmt::format(" You probably made a nesting mistake. Jinja is expecting this tag, but "
                         "currently looking for {}.", looking);
    } else {
      msg += fmt::format(" Jinja was looking for the following tags: {}.", looking);
    }
    return msg + fmt::format(" The innermost block that needs to be closed is '{}'.", tag_stack_.back());
  }

  // Bounded nesting: templates come from model files and must not overflow the stack.
  static constexpr int kMaxDepth = 200;
  struct DepthGuard {
    explicit DepthGuard(Parser& p) : p(p) {
      if (++p.depth_ > kMaxDepth) {
        --p.depth_;
        p.error(p.cur(), fmt::format("expression nested deeper than {}", kMaxDepth));
      }
    }
    ~DepthGuard() { --p.depth_; }
    Parser& p;
  };
  int depth_ = 0;
  std::vector<std::vector<std::string>> end_stack_;
  std::vector<std::string> tag_stack_;
  std::vector<Token> t_;
  const std::string& name_;
  size_t p_ = 0;
};

}  // namespace

StmtPtr parse_template(const std::string& raw, const std::string& name) {
  // As jinja2: newlines normalized to \n, and one trailing newline dropped
  // (keep_trailing_newline=False).
  std::string source;
  source.reserve(raw.size());
  for (size_t k = 0; k < raw.size(); ++k) {
    if (raw[k] != '\r') {
      source += raw[k];
    } else {
      source += '\n';
      if (k + 1 < raw.size() && raw[k + 1] == '\n') ++k;
    }
  }
  if (!source.empty() && source.back() == '\n') source.pop_back();
  Lexer lexer(source, name);
  Parser parser(lexer.run(), name);
  return parser.parse();
}

}  // namespace tandem::jinja
