// `tandem tokenize`: runs a model's tokenizer on a text so any vocabulary can be checked from the
// shell. Prints one token per line (id, then the piece it decodes to, escaped), or with
// --ids-only just the ids on one line.
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <string>

#include "core/error.h"
#include "core/input_file.h"
#include "engine/tokenizer.h"
#include "tools/command.h"

namespace tandem::tools {
namespace {

namespace fs = std::filesystem;

struct TokenizeArgs {
  std::string model;
  std::string prompt;
  std::string file;
  bool ids_only = false;
  bool special = false;
  bool no_bos = false;
};

// Printable form of a piece: control bytes and broken UTF-8 are shown as escapes.
std::string escape_piece(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = uint8_t(s[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02x}", c);
    } else if (c < 0x80) {
      out.push_back(char(c));
    } else {
      size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
      bool ok = n > 0 && i + n <= s.size();
      for (size_t k = 1; ok && k < n; ++k) ok = (uint8_t(s[i + k]) & 0xC0) == 0x80;
      if (ok) {
        out.append(s, i, n);
        i += n - 1;
      } else {
        out += fmt::format("\\x{:02x}", c);
      }
    }
  }
  return out;
}

void run_tokenize(const TokenizeArgs& a) {
  std::error_code ec;
  if (!fs::exists(a.model, ec)) fail(ErrorKind::kIo, "-m {}: no such file or directory", a.model);
  std::string text = a.prompt;
  if (!a.file.empty()) text = read_input_file(a.file, kMaxTextFileBytes, "-f");
  const Tokenizer tok = Tokenizer::load(a.model);
  const std::vector<TokenId> ids = tok.encode(text, !a.no_bos, a.special);
  if (a.ids_only) {
    fmt::print("{}\n", fmt::join(ids, " "));
    return;
  }
  for (TokenId id : ids) {
    fmt::print("{:>7} '{}'\n", id, escape_piece(tok.token_to_piece(id, true)));
  }
  fmt::print("{} tokens\n", ids.size());
}

void add_tokenize(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  app.add_option("-m,--model", a->model,
                 "a .gguf, tokenizer.model or tokenizer.json file, or an HF directory")
      ->required();
  auto* p = app.add_option("-p,--prompt", a->prompt, "the text to tokenize");
  auto* f = app.add_option("-f,--file", a->file, "read the text from this file");
  p->excludes(f);
  f->excludes(p);
  app.add_flag("--ids-only", a->ids_only, "print only the ids, space-separated on one line");
  app.add_flag("--special", a->special, "turn special-token text such as <s> into its id");
  app.add_flag("--no-bos", a->no_bos, "do not add the BOS/EOS tokens the model asks for");
  app.callback([a, p, f] {
    if (p->count() == 0 && f->count() == 0) {
      fail(ErrorKind::kInvalidArgument, "tokenize: give the text with -p TEXT or -f FILE");
    }
    run_tokenize(*a);
  });
}

Registrar reg("tokenize", "Print the token ids (and pieces) a model's tokenizer gives a text",
              add_tokenize);

}  // namespace
}  // namespace tandem::tools
