#include "core/error.h"

namespace tandem {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "invalid argument";
    case ErrorKind::kIo: return "I/O error";
    case ErrorKind::kFormat: return "format error";
    case ErrorKind::kUnsupported: return "unsupported";
    case ErrorKind::kOutOfRange: return "out of range";
    case ErrorKind::kResource: return "out of resources";
    case ErrorKind::kInternal: return "internal error";
  }
  return "error";
}

void check_failed(const char* condition, const char* file, int line, const std::string& detail) {
  throw Error(ErrorKind::kInternal, fmt::format("internal check failed at {}:{}: {}{}{}", file, line,
                                                condition, detail.empty() ? "" : ": ", detail));
}

}  // namespace tandem
