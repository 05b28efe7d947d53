// `tandem`: one executable, one subcommand per tools/cmd_*.cpp (see tools/command.h).
#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "core/log.h"
#include "tools/command.h"

namespace tandem::tools {

std::vector<CommandSpec>& command_registry() {
  static std::vector<CommandSpec> registry;
  return registry;
}

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
  app.parse_complete_callback([&] {
    LogLevel level;
    if (!log_level.empty() && parse_log_level(log_level, &level)) set_log_level(level);
  });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const Error& e) {
    std::fprintf(stderr, "tandem: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "tandem: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: %s\n", e.what());
    return 1;
  }
  return 0;
}
