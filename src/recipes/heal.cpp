#include "recipes/heal.h"

#include <stdexcept>

#include "data/text_documents.h"

namespace coconut {

TrainConfig heal_config(TrainConfig config) {
  if (config.load_model_path.empty())
    throw std::invalid_argument(config.source + ": key 'load_model_path': missing (heal fine-tunes an existing, pruned model)");
  const ReasoningSettings settings = load_reasoning_settings(config.load_model_path);
  const auto given = [&](const char* key) { return config.given_keys.count(key) > 0; };
  // Plain text heals with the plain next-token loss (mode lm); a reasoning dataset in the model's layout.
  if (!given("mode")) config.mode = is_plain_text_dataset(config.train_path) ? "lm" : settings.mode;
  if (!given("c_thought")) config.c_thought = settings.c_thought;
  if (!given("max_latent_stage")) config.max_latent_stage = settings.max_latent_stage;
  if (!given("pad_latent_to_max")) config.pad_latent_to_max = settings.pad_latent_to_max;
  if (!given("pause_tokens")) config.pause_tokens = settings.pause_tokens;
  if (!given("first_stage")) config.first_stage = settings.stage;
  if (!given("latent_bottleneck") && settings.answer_through_thoughts) config.latent_bottleneck = 1.0;
  // One stage for the whole run unless the YAML asks for a curriculum.
  if (!given("epochs_per_stage")) config.epochs_per_stage = config.num_epochs;
  config.validate();
  return config;
}

TrainSummary heal(const TrainConfig& config, std::ostream& progress) {
  const TrainConfig healing = heal_config(config);
  progress << "healing " << healing.load_model_path
           << (healing.training_mode() == TrainingMode::kLm ? std::string(" on plain text (mode lm)")
                                                             : " in mode " + healing.mode + " at stage " + std::to_string(healing.first_stage))
           << (healing.distill_from.empty() ? "" : ", distilling from " + healing.distill_from) << "\n";
  return train(healing, progress);
}

}  // namespace coconut
