#include "reasoning/layout.h"

#include <filesystem>
#include <stdexcept>

#include "io/hf_config.h"

namespace coconut {

SequenceOptions ReasoningSettings::sequence_options(int64_t at_stage) const {
  SequenceOptions options;
  options.mode = training_mode_from_name(mode);
  options.stage = at_stage >= 0 ? at_stage : stage;
  options.c_thought = c_thought;
  options.max_latent_stage = max_latent_stage;
  options.pad_latent_to_max = pad_latent_to_max;
  options.pause_tokens = pause_tokens;
  // Validation and layer scoring see the model as it is prompted (training draws per sequence).
  options.latent_bottleneck = answer_through_thoughts;
  return options;
}

nlohmann::json reasoning_settings_to_json(const ReasoningSettings& settings) {
  return {{"mode", settings.mode},
          {"stage", settings.stage},
          {"c_thought", settings.c_thought},
          {"max_latent_stage", settings.max_latent_stage},
          {"pad_latent_to_max", settings.pad_latent_to_max},
          {"pause_tokens", settings.pause_tokens},
          {"answer_through_thoughts", settings.answer_through_thoughts}};
}

ReasoningSettings load_reasoning_settings(const std::string& model_dir) {
  ReasoningSettings settings;
  const std::string path = model_dir + "/" + kReasoningSettingsFile;
  if (!std::filesystem::exists(path)) return settings;
  const nlohmann::json value = read_json_file(path);
  try {
    settings.mode = value.at("mode").get<std::string>();
    training_mode_from_name(settings.mode);
    settings.stage = value.at("stage").get<int64_t>();
    settings.c_thought = value.at("c_thought").get<int64_t>();
    settings.max_latent_stage = value.at("max_latent_stage").get<int64_t>();
    settings.pad_latent_to_max = value.at("pad_latent_to_max").get<bool>();
    settings.pause_tokens = value.at("pause_tokens").get<int64_t>();
    settings.answer_through_thoughts = value.value("answer_through_thoughts", false);
  } catch (const std::exception& error) {
    throw std::invalid_argument(path + ": " + error.what());
  }
  return settings;
}

}  // namespace coconut
