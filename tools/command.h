// Subcommand registration for the `tandem` CLI. Each tools/cmd_<name>.cpp defines one
// subcommand and registers it with a file-scope Registrar, so adding a command touches one file:
//
//   static tandem::tools::Registrar reg("info", "Print CPU, memory and GPU facts", add_info);
//
// The add function declares the options on the given CLI::App and sets its callback; the
// callback may throw tandem::Error, which main() prints as one clear message (exit code 1).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace tandem::tools {

struct CommandSpec {
  std::string name;
  std::string description;
  std::function<void(CLI::App&)> add;
};

std::vector<CommandSpec>& command_registry();

struct Registrar {
  Registrar(std::string name, std::string description, std::function<void(CLI::App&)> add) {
    command_registry().push_back({std::move(name), std::move(description), std::move(add)});
  }
};

}  // namespace tandem::tools
