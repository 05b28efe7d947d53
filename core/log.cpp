#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace tandem {
namespace {

LogLevel initial_level() {
  LogLevel level = LogLevel::kWarn;
  if (const char* env = std::getenv("TANDEM_LOG")) parse_log_level(env, &level);
  return level;
}

std::atomic<int>& level_storage() {
  static std::atomic<int> level{static_cast<int>(initial_level())};
  return level;
}

}  // namespace

LogLevel log_level() { return static_cast<LogLevel>(level_storage().load(std::memory_order_relaxed)); }

void set_log_level(LogLevel level) { level_storage().store(static_cast<int>(level)); }

bool parse_log_level(std::string_view name, LogLevel* level) {
  static constexpr std::pair<std::string_view, LogLevel> kNames[] = {
      {"error", LogLevel::kError}, {"warn", LogLevel::kWarn},   {"info", LogLevel::kInfo},
      {"debug", LogLevel::kDebug}, {"trace", LogLevel::kTrace},
  };
  for (const auto& [n, l] : kNames) {
    if (n == name) {
      *level = l;
      return true;
    }
  }
  return false;
}

void log_message(LogLevel level, std::string_view message) {
  static constexpr const char* kPrefix[] = {"error", "warning", "info", "debug", "trace"};
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  std::fprintf(stderr, "tandem: %s: %.*s\n", kPrefix[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}

}  // namespace tandem
