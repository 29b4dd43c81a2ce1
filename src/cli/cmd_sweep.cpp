// coconut sweep CONFIG.yaml: the test-time-compute grid (src/recipes/sweep.h), resumable.
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "recipes/sweep.h"

namespace coconut::cli {
namespace {

struct SweepFlags {
  std::string config, out;
};

const bool registered = register_command({"sweep", "test-time compute vs accuracy: train, prune, heal and evaluate a grid from YAML (resumable)",
                                          [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<SweepFlags>();
  app.add_option("config", flags->config, "YAML sweep config (see configs/sweep_*.yaml)")->required();
  app.add_option("--out", flags->out, "output folder (default: the config's output_dir)");
  return [flags] {
    auto config = load_sweep_config(flags->config);
    if (!flags->out.empty()) config.output_dir = flags->out;
    run_sweep(config, std::cout);
    return 0;
  };
}});

}  // namespace
}  // namespace coconut::cli
