// Leveled logging to stderr. The level comes from set_log_level() (the CLI's -v / --quiet) or
// the TANDEM_LOG environment variable (error, warn, info, debug, trace). Not for hot paths.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace tandem {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

LogLevel log_level();
void set_log_level(LogLevel level);
// Parses "error|warn|info|debug|trace"; returns false when the name is unknown.
bool parse_log_level(std::string_view name, LogLevel* level);
void log_message(LogLevel level, std::string_view message);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (level <= log_level()) log_message(level, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... a) { log(LogLevel::kError, f, std::forward<Args>(a)...); }
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... a) { log(LogLevel::kWarn, f, std::forward<Args>(a)...); }
template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... a) { log(LogLevel::kInfo, f, std::forward<Args>(a)...); }
template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... a) { log(LogLevel::kDebug, f, std::forward<Args>(a)...); }

}  // namespace tandem
