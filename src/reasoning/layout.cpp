#include "reasoning/layout.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <stdexcept>

#include "io/hf_config.h"
#include "model/quantized_linear.h"

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

DepthCascade parse_depth_cascade(const std::string& text) {
  const auto at = text.find('@');
  if (at == std::string::npos) throw std::invalid_argument("depth cascade '" + text + "': expected DEPTHS@CONFIDENCE, e.g. 5,8@0.9");
  DepthCascade cascade;
  try {
    size_t used = 0;
    const std::string threshold = text.substr(at + 1);
    cascade.confidence = std::stod(threshold, &used);
    if (used != threshold.size()) throw std::invalid_argument("trailing text");
    std::string depths = text.substr(0, at);
    for (size_t start = 0; start <= depths.size();) {
      const auto comma = std::min(depths.find(',', start), depths.size());
      const std::string item = depths.substr(start, comma - start);
      cascade.depths.push_back(std::stoll(item, &used));
      if (used != item.size()) throw std::invalid_argument("trailing text");
      start = comma + 1;
    }
  } catch (const std::exception&) {
    throw std::invalid_argument("depth cascade '" + text + "': expected DEPTHS@CONFIDENCE, e.g. 5,8@0.9");
  }
  if (cascade.confidence < 0 || cascade.confidence > 1)
    throw std::invalid_argument("depth cascade '" + text + "': the confidence must be in [0, 1]");
  return cascade;
}

void check_depth_cascade(const DepthCascade& cascade, int64_t layers, const std::string& where) {
  for (size_t i = 0; i < cascade.depths.size(); ++i) {
    const int64_t depth = cascade.depths[i];
    if (depth < 1 || depth > layers || (i > 0 && depth <= cascade.depths[i - 1]))
      throw std::invalid_argument(where + ": depth cascade: the depths must ascend within 1.." + std::to_string(layers));
  }
  if (cascade.confidence < 0 || cascade.confidence > 1)
    throw std::invalid_argument(where + ": depth cascade: the confidence must be in [0, 1]");
}

nlohmann::json reasoning_settings_to_json(const ReasoningSettings& settings) {
  nlohmann::json json = {{"mode", settings.mode},
          {"stage", settings.stage},
          {"c_thought", settings.c_thought},
          {"max_latent_stage", settings.max_latent_stage},
          {"pad_latent_to_max", settings.pad_latent_to_max},
          {"pause_tokens", settings.pause_tokens},
          {"answer_through_thoughts", settings.answer_through_thoughts}};
  if (settings.depth_cascade.active())
    json["depth_cascade"] = {{"depths", settings.depth_cascade.depths}, {"confidence", settings.depth_cascade.confidence}};
  if (!settings.weights.empty()) json["weights"] = settings.weights;
  return json;
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
    if (value.contains("depth_cascade")) {
      const auto& cascade = value.at("depth_cascade");
      settings.depth_cascade.depths = cascade.at("depths").get<std::vector<int64_t>>();
      settings.depth_cascade.confidence = cascade.at("confidence").get<double>();
      if (settings.depth_cascade.depths.empty()) throw std::invalid_argument("depth_cascade.depths is empty");
      check_depth_cascade(settings.depth_cascade, std::numeric_limits<int64_t>::max(), "depth_cascade");
    }
    settings.weights = value.value("weights", std::string());
    if (!settings.weights.empty()) weight_format_from_name(settings.weights);  // throws on an unknown format
  } catch (const std::exception& error) {
    throw std::invalid_argument(path + ": " + error.what());
  }
  return settings;
}

std::string resolve_weights(const std::string& requested, const std::string& model_dir, bool adapter_merged, bool on_cpu) {
  if (requested != "auto") return requested;
  if (adapter_merged || !on_cpu) return "dense";
  const std::string recorded = load_reasoning_settings(model_dir).weights;
  return recorded.empty() ? "dense" : recorded;
}

}  // namespace coconut
