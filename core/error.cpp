#include "core/error.h"

#include <algorithm>

namespace tandem {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "invalid argument";
    case ErrorKind::kIo: return "I/O error";
    case ErrorKind::kFormat: return "format error";
    case ErrorKind::kUnsupported: return "unsupported";
    case ErrorKind::kOutOfRange: return "out of range";
    case ErrorKind::kResource: return "out of resources";
    case ErrorKind::kBusy: return "busy";
    case ErrorKind::kInternal: return "internal error";
  }
  return "error";
}

std::string printable(std::string_view text, size_t max_bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  const size_t n = std::min(text.size(), max_bytes);
  out.reserve(n + 8);
  auto escape = [&](char kind, unsigned v, int digits) {  // \xNN or \uNNNN
    out.push_back('\\');
    out.push_back(kind);
    for (int d = digits - 1; d >= 0; --d) out.push_back(kHex[(v >> (4 * d)) & 15]);
  };
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n' || c == '\t' || c == '\r') {
      out.push_back('\\');
      out.push_back(c == '\n' ? 'n' : c == '\t' ? 't' : 'r');
    } else if (c < 0x20 || c == 0x7f) {
      escape('x', c, 2);
    } else if (c == 0xc2 && i + 1 < n && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(text[i + 1]) <= 0x9f) {
      // U+0080..U+009F, the C1 controls (U+009B is a CSI to some terminals)
      escape('u', static_cast<unsigned char>(text[++i]), 4);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (text.size() > max_bytes) out.append(3, '.');
  return out;
}

void check_failed(const char* condition, const char* file, int line, const std::string& detail) {
  throw Error(ErrorKind::kInternal, fmt::format("internal check failed at {}:{}: {}{}{}", file, line,
                                                condition, detail.empty() ? "" : ": ", detail));
}

}  // namespace tandem
