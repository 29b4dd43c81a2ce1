// Subcommand registry: each src/cli/cmd_*.cpp registers one subcommand. A subcommand parses its
// flags into a struct and calls one library function; main() prints errors and sets the exit code.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace coconut::cli {

// `setup` adds the subcommand's flags to `app` and returns the action to run once parsed.
using CommandSetup = std::function<std::function<int()>(CLI::App& app)>;

struct Command {
  std::string name;
  std::string description;
  CommandSetup setup;
};

std::vector<Command>& command_registry();

// Use at namespace scope: `static const bool registered = register_command({...});`
bool register_command(Command command);

}  // namespace coconut::cli
