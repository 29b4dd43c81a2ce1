// coconut: a thin CLI over the library. One subcommand per src/cli/cmd_*.cpp.
#include <csignal>
#include <cstdio>
#include <exception>
#include <map>
#include <set>
#include <string>

#include <c10/util/Exception.h>

#include "cli/command.h"
#include "model/cpu_product_choice.h"
#include "model/threads.h"
#include "util/allocator.h"

namespace coconut::cli {

std::vector<Command>& command_registry() {
  static std::vector<Command> registry;
  return registry;
}

bool register_command(Command command) {
  command_registry().push_back(std::move(command));
  return true;
}

}  // namespace coconut::cli

int main(int argc, char** argv) {
  // A write past the file-size limit then fails like a full disk (an error naming the file)
  // instead of killing the process.
  std::signal(SIGXFSZ, SIG_IGN);
  coconut::configure_threads();
  using namespace coconut::cli;
  CLI::App app{"coconut: train, prune and measure latent-reasoning Llama models"};
  app.require_subcommand(1);
  app.get_formatter()->column_width(36);
  std::map<CLI::App*, std::function<int()>> actions;
  for (const Command& command : command_registry()) {
    CLI::App* sub = app.add_subcommand(command.name, command.description);
    actions[sub] = command.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }
  try {
    // A bad COCONUT_CPU_KERNELS is refused before any work (not at the first product, which a
    // server's lane thread may run).
    coconut::configure_product_choices(coconut::product_choice_settings_from_environment());
    for (auto& [sub, action] : actions)
      if (sub->parsed()) {
        // Commands that run pass after pass (inference and training) reuse freed memory instead
        // of mapping fresh pages for every activation (util/allocator.h).
        static const std::set<std::string> kRepeatedPasses = {"generate", "eval", "eval-lm", "logits", "serve",
                                                              "train",    "heal", "sweep",   "demo"};
        if (kRepeatedPasses.count(sub->get_name()) != 0) coconut::keep_freed_memory();
        return action();
      }
  } catch (const c10::Error& error) {
    // libtorch's message without its C++ backtrace: the first line says what went wrong.
    const std::string message = error.what_without_backtrace();
    std::fprintf(stderr, "coconut: error: %s\n", message.substr(0, message.find('\n')).c_str());
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "coconut: error: %s\n", error.what());
    return 1;
  }
  return 0;
}
