// How a trained model reasons and must be prompted, saved beside its weights as coconut.json:
// its training mode and the Coconut curriculum's layout (stage, thoughts per step, the largest
// latent stage, padding). Written by training; read by eval, pruning, healing, the sweep and serve.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "data/sequences.h"

namespace coconut {

inline constexpr const char* kReasoningSettingsFile = "coconut.json";

struct ReasoningSettings {
  std::string mode = "cot";
  int64_t stage = 0, c_thought = 1, max_latent_stage = 0, pause_tokens = 0;
  bool pad_latent_to_max = false;
  // Trained with latent_bottleneck 1: every answer saw the question only through the thoughts, so
  // it is prompted that way too (GenerationOptions::latent_bottleneck). Optional in coconut.json.
  bool answer_through_thoughts = false;

  // The sequence layout at `stage` (-1: the trained stage), e.g. for latent_thoughts_for_stage.
  SequenceOptions sequence_options(int64_t at_stage = -1) const;
};

nlohmann::json reasoning_settings_to_json(const ReasoningSettings& settings);
// Defaults (cot) when <model_dir>/coconut.json does not exist; errors name the file when it is malformed.
ReasoningSettings load_reasoning_settings(const std::string& model_dir);

}  // namespace coconut
