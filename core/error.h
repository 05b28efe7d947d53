// Typed errors. Parsers, loaders and the CLI throw tandem::Error whose message names the file,
// tensor or argument at fault; the CLI and server turn it into one clear message (STYLE.md #7).
// TD_CHECK is only for broken invariants (a bug in tandem, not bad input).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace tandem {

enum class ErrorKind {
  kInvalidArgument,  // a bad CLI flag or API argument
  kIo,               // a file that cannot be opened, read, mapped or written
  kFormat,           // a model/config file whose content is malformed (truncated, bad magic...)
  kUnsupported,      // well-formed but not supported (an unknown dtype or architecture)
  kOutOfRange,       // a value outside what the model allows (token id, context length)
  kResource,         // not enough memory or disk
  kBusy,             // a service at its limit (the server's queue is full): try again later
  kInternal,         // a broken invariant: a bug
};

const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

template <typename... Args>
[[noreturn]] void fail(ErrorKind kind, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(kind, fmt::format(format, std::forward<Args>(args)...));
}

// Text from a file made safe to print in a message: control characters (newlines, ANSI escape
// sequences, NUL, C1 controls) as \n, \t, \xNN, and more than max_bytes cut with "...".
std::string printable(std::string_view text, size_t max_bytes = 200);

[[noreturn]] void check_failed(const char* condition, const char* file, int line,
                               const std::string& detail);

}  // namespace tandem

// Invariant check, always on. TD_CHECK(x) or TD_CHECK(x, "fmt {}", args...).
#define TD_CHECK(cond, ...)                                                               \
  do {                                                                                    \
    if (!(cond)) [[unlikely]]                                                             \
      ::tandem::check_failed(#cond, __FILE__, __LINE__, ::fmt::format("" __VA_ARGS__)); \
  } while (0)
