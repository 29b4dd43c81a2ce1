// coconut demo: the main job (src/recipes/demo.h): the shipped ProntoQA models (or, --task sums, no-CoT /
// CoT / Coconut trained on the running-sum task), prune the layer the continuous thoughts use least,
// heal it, and compare cost and accuracy.
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "recipes/demo.h"

namespace coconut::cli {
namespace {

const bool registered = register_command({"demo", "the main job: train, think in latent space, prune, heal, compare (CPU minutes)",
                                          [](CLI::App& app) -> std::function<int()> {
  auto options = std::make_shared<DemoOptions>();
  app.add_option("--task", options->task, "prontoqa (the shipped models) or sums (trained from scratch)")
      ->capture_default_str()
      ->check(CLI::IsMember({"prontoqa", "sums"}));
  app.add_option("--out", options->out, "output folder (an earlier demo's is replaced unless --reuse)")->capture_default_str();
  app.add_option("--models-dir", options->models_dir, "prontoqa: folder of the shipped models")->capture_default_str();
  app.add_option("--data-dir", options->data_dir, "prontoqa: folder of the datasets")->capture_default_str();
  app.add_option("--heal-examples", options->heal_examples, "prontoqa: training questions to heal on")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--score-examples", options->score_examples, "prontoqa: training questions to score layers on")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--digits", options->digits, "sums: digits per question (= reasoning steps)")->capture_default_str();
  app.add_option("--train-examples", options->train_examples, "training questions")->capture_default_str();
  app.add_option("--valid-examples", options->valid_examples, "validation questions")->capture_default_str();
  app.add_option("--cot-epochs", options->cot_epochs, "CoT epochs")->capture_default_str();
  app.add_option("--epochs-per-stage", options->epochs_per_stage, "Coconut epochs per curriculum stage")->capture_default_str();
  app.add_option("--max-latent-stage", options->max_latent_stage, "Coconut's last stage (thoughts)")->capture_default_str();
  app.add_option("--nocot-epochs", options->nocot_epochs, "no-CoT epochs")->capture_default_str();
  app.add_option("--heal-epochs", options->heal_epochs, "healing epochs")->capture_default_str();
  app.add_option("--latency-questions", options->latency_questions, "questions timed one at a time")->capture_default_str();
  app.add_flag("--reuse", options->reuse, "keep finished models of an earlier run (it says which)");
  app.add_flag("--force", options->force, "replace --out even when it is not an earlier demo's folder");
  app.add_option("--seed", options->seed, "seed of data and training")->capture_default_str();
  return [options] { return run_demo(*options, std::cout); };
}});

}  // namespace
}  // namespace coconut::cli
