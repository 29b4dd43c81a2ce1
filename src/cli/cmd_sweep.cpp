// coconut sweep CONFIG.yaml: the test-time-compute grid (src/recipes/sweep.h), resumable.
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "recipes/sweep.h"
#include "util/output_path.h"

namespace coconut::cli {
namespace {

struct SweepFlags {
  std::string config, out;
  bool force = false;
};

const bool registered = register_command({"sweep", "test-time compute vs accuracy: train, prune, heal and evaluate a grid from YAML (resumable)",
                                          [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<SweepFlags>();
  app.add_option("config", flags->config, "YAML sweep config (see configs/sweep_*.yaml)")->required();
  app.add_option("--out", flags->out, "output folder (default: the config's output_dir)");
  app.add_flag("--force", flags->force, "write into the output folder even when it is not an earlier sweep's");
  return [flags] {
    auto config = load_sweep_config(flags->config);
    if (!flags->out.empty()) config.output_dir = flags->out;
    // An earlier sweep's folder (experiment.yaml) resumes; any other non-empty folder is not ours.
    check_output_path(config.output_dir, OutputKind::kFolder, flags->out.empty() ? "output_dir" : "--out", flags->force,
                      "experiment.yaml");
    run_sweep(config, std::cout);
    return 0;
  };
}});

}  // namespace
}  // namespace coconut::cli
