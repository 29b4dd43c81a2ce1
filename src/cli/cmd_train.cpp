// coconut train CONFIG.yaml [key=value ...]: every training mode, one procedure (recipes/train.h).
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "recipes/train.h"

namespace coconut::cli {
namespace {

struct TrainFlags {
  std::string config;
  std::vector<std::string> overrides;
};

int run_train(const TrainFlags& flags) {
  const TrainConfig config = load_train_config(flags.config, flags.overrides);
  try {
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
  return [flags] { return run_train(*flags); };
}});

}  // namespace
}  // namespace coconut::cli
