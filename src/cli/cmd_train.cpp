// coconut train CONFIG.yaml [key=value ...]: every training mode, one procedure (recipes/train.h).
// coconut heal CONFIG.yaml [key=value ...]: the same procedure on a pruned model (recipes/heal.h).
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "distributed/launch.h"
#include "recipes/heal.h"
#include "recipes/train.h"
#include "util/output_path.h"

namespace coconut::cli {
namespace {

struct TrainFlags {
  std::string config;
  std::vector<std::string> overrides;
  int processes = 1;
  bool force = false;
};

int run_train(const TrainFlags& flags, bool healing) {
  if (flags.processes > 1) {  // this command again, once per rank, with torchrun's variables
    std::vector<std::string> arguments = {healing ? "heal" : "train", flags.config};
    arguments.insert(arguments.end(), flags.overrides.begin(), flags.overrides.end());
    return launch_local_processes(flags.processes, arguments);
  }
  const TrainConfig config = load_train_config(flags.config, flags.overrides);
  // An earlier run's folder (it holds train_config.json) is reused or resumed; anything else is not ours.
  check_output_path(config.resolved_output_dir(), OutputKind::kFolder, "output_dir", flags.force, "train_config.json");
  try {
    if (healing)
      heal(config, std::cerr);
    else
      train(config, std::cerr);
  } catch (const TrainingDiverged& error) {
    std::cerr << "error: training diverged: " << error.what() << "\n";
    return 3;
  }
  return 0;
}

const bool registered = register_command({"train", "train a model (cot, no_cot, coconut, no_thoughts, pause_as_thought, pause, icot)",
                                          [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<TrainFlags>();
  app.add_option("config", flags->config, "YAML training config")->required();
  app.add_option("overrides", flags->overrides, "key=value overrides of config keys (value parsed as YAML)");
  app.add_option("--nproc", flags->processes, "data-parallel processes on this machine (Gloo on CPU, NCCL on GPUs); "
                                             "or start ranks yourself with torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT")
      ->check(CLI::PositiveNumber);
  app.add_flag("--force", flags->force, "write into output_dir even when it is not an earlier run's folder");
  return [flags] { return run_train(*flags, false); };
}});

const bool registered_heal = register_command({"heal", "fine-tune a pruned model in its trained layout (optionally distilling from the unpruned one)",
                                               [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<TrainFlags>();
  app.add_option("config", flags->config, "YAML config: load_model_path (the pruned model), train_path, optional "
                                          "distill_from / distill_weight / distill_temperature; mode and stage "
                                          "default to the model's coconut.json (mode lm when train_path is "
                                          "plain text)")->required();
  app.add_option("overrides", flags->overrides, "key=value overrides of config keys (value parsed as YAML)");
  app.add_option("--nproc", flags->processes, "data-parallel processes on this machine (Gloo on CPU, NCCL on GPUs); "
                                             "or start ranks yourself with torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT")
      ->check(CLI::PositiveNumber);
  app.add_flag("--force", flags->force, "write into output_dir even when it is not an earlier run's folder");
  return [flags] { return run_train(*flags, true); };
}});

}  // namespace
}  // namespace coconut::cli
