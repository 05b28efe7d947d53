// `tandem`: one executable, one subcommand per tools/cmd_*.cpp (see tools/command.h).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "tools/command.h"

namespace tandem::tools {

std::vector<CommandSpec>& command_registry() {
  static std::vector<CommandSpec> registry;
  return registry;
}

namespace {

// CLI11 reads numbers with strtoull / strtoll / strtod: "-1" becomes 2^64 - 1 in an unsigned
// option, a value past the type's range saturates, and "nan" passes every range check (NaN
// compares false). Every numeric option of every subcommand gets a check by its type that
// refuses those; text that is no number at all is left to CLI11's own conversion error.
std::string check_number(const std::string& text, const std::string& type) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  if (type == "UINT") {
    const char* p = begin;
    while (*p == ' ' || *p == '\t') ++p;
    (void)std::strtoull(begin, &end, 0);
    if (end == begin || *end != '\0') return {};
    if (*p == '-' || errno == ERANGE) {
      return fmt::format("{} is not an integer in 0..{}", text, UINT64_MAX);
    }
  } else if (type == "INT") {
    (void)std::strtoll(begin, &end, 0);
    if (end == begin || *end != '\0') return {};
    if (errno == ERANGE) return fmt::format("{} is out of range", text);
  } else if (type == "FLOAT") {
    const double v = std::strtod(begin, &end);
    if (end == begin || *end != '\0') return {};
    if (!std::isfinite(v)) return fmt::format("{} is not a finite number", text);
  }
  return {};
}

void check_numeric_options(CLI::App& app) {
  for (CLI::Option* o : app.get_options()) {
    std::string type = o->get_type_name();
    type = type.substr(0, type.find(':'));
    if (type != "UINT" && type != "INT" && type != "FLOAT") continue;
    o->check(CLI::Validator([type](std::string& text) { return check_number(text, type); }, ""));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    check_numeric_options(*sub);
  }
}

}  // namespace
}  // namespace tandem::tools

int main(int argc, char** argv) {
  using namespace tandem;
  CLI::App app{"tandem: Mixture-of-Experts inference on a CPU with lots of DRAM and a small GPU"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tandem 0.1.0");
  std::string log_level;
  app.add_option("--log", log_level, "log level: error, warn, info, debug, trace")
      ->check(CLI::IsMember({"error", "warn", "info", "debug", "trace"}));
  app.add_flag_callback("-v,--verbose", [] { set_log_level(LogLevel::kInfo); }, "log progress (info)");

  auto& registry = tools::command_registry();
  std::sort(registry.begin(), registry.end(),
            [](const tools::CommandSpec& a, const tools::CommandSpec& b) { return a.name < b.name; });
  for (auto& spec : registry) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.description);
    spec.add(*sub);
  }
  tools::check_numeric_options(app);
  app.parse_complete_callback([&] {
    LogLevel level;
    if (!log_level.empty() && parse_log_level(log_level, &level)) set_log_level(level);
  });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fprintf(stderr, "tandem: %s (see --help)\n", printable(e.what(), 4096).c_str());
    return 1;
  } catch (const Error& e) {
    // printable(): a message quoting a file's text must not carry its escape sequences or
    // newlines to the terminal.
    std::fprintf(stderr, "tandem: %s\n", printable(e.what(), 4096).c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "tandem: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: %s\n", printable(e.what(), 4096).c_str());
    return 1;
  }
  // Standard output is an output file too (`tandem run > /full/disk`): a failed write is an error.
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "tandem: standard output: write failed: %s\n",
                 errno != 0 ? std::strerror(errno) : "I/O error");
    return 1;
  }
  return 0;
}
