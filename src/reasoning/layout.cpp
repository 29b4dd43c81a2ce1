#include "reasoning/layout.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "eval/cost.h"
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

int64_t ReasoningSettings::trained_latent_thoughts() const {
  SequenceOptions rule = sequence_options();
  rule.pad_latent_to_max = true;  // past max_latent_stage every step is latent: the padded count
  return latent_thoughts_for_stage(stage, max_latent_stage, rule);
}

namespace {

// "1,3,5" -> {1, 3, 5}; "" -> {} when `empty_ok`; anything else throws.
std::vector<int64_t> integers(const std::string& text, bool empty_ok) {
  std::vector<int64_t> values;
  if (text.empty() && empty_ok) return values;
  for (size_t start = 0; start <= text.size();) {
    const auto comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    size_t used = 0;
    values.push_back(std::stoll(item, &used));
    if (used != item.size() || item.empty() || item[0] == ' ') throw std::invalid_argument("not an integer");
    start = comma + 1;
  }
  return values;
}

// "LEVELS@CONFIDENCE" -> {LEVELS, CONFIDENCE}; throws when there is no '@' or the confidence is not
// a number alone (the caller names the setting).
std::pair<std::string, double> levels_at_confidence(const std::string& text) {
  const auto at = text.find('@');
  if (at == std::string::npos) throw std::invalid_argument("no @");
  size_t used = 0;
  const std::string threshold = text.substr(at + 1);
  const double confidence = std::stod(threshold, &used);
  if (used != threshold.size()) throw std::invalid_argument("trailing text");
  return {text.substr(0, at), confidence};
}

}  // namespace

DepthCascade parse_depth_cascade(const std::string& text) {
  const char* const expected = "': expected DEPTHS@CONFIDENCE (5,8@0.9) or {REMOVED},...@CONFIDENCE ({1,3,5,7},{1,5}@0.9)";
  DepthCascade cascade;
  try {
    const auto [levels, confidence] = levels_at_confidence(text);
    cascade.confidence = confidence;
    if (levels.find('{') == std::string::npos) {
      cascade.depths = integers(levels, false);
    } else {  // {a,b},{c},{}: each level in braces, the levels separated by commas
      for (size_t start = 0;;) {
        if (start >= levels.size() || levels[start] != '{') throw std::invalid_argument("a level is not in braces");
        const auto close = levels.find('}', start);
        if (close == std::string::npos) throw std::invalid_argument("unclosed brace");
        cascade.removed.push_back(integers(levels.substr(start + 1, close - start - 1), true));
        if (close + 1 == levels.size()) break;
        if (levels[close + 1] != ',') throw std::invalid_argument("levels not separated by commas");
        start = close + 2;
      }
    }
  } catch (const std::exception&) {
    throw std::invalid_argument("depth cascade '" + text + expected);
  }
  if (cascade.confidence < 0 || cascade.confidence > 1)
    throw std::invalid_argument("depth cascade '" + text + "': the confidence must be in [0, 1]");
  return cascade;
}

ThoughtHalting parse_thought_halting(const std::string& text) {
  const std::string expected = "halting '" + text + "': expected THOUGHTS@CONFIDENCE, e.g. 2,4,6@0.9";
  ThoughtHalting halting;
  try {
    const auto [counts, confidence] = levels_at_confidence(text);
    halting.confidence = confidence;
    halting.thoughts = integers(counts, true);
  } catch (const std::exception&) {
    throw std::invalid_argument(expected);
  }
  if (halting.thoughts.empty()) throw std::invalid_argument(expected);
  for (size_t i = 1; i < halting.thoughts.size(); ++i)
    if (halting.thoughts[i] <= halting.thoughts[i - 1])
      throw std::invalid_argument("halting '" + text + "': the thought counts must ascend");
  if (halting.confidence < 0 || halting.confidence > 1)
    throw std::invalid_argument("halting '" + text + "': the confidence must be in [0, 1]");
  return halting;
}

std::string describe_thought_halting(const ThoughtHalting& halting) {
  std::string text;
  for (int64_t thoughts : halting.thoughts) text += (text.empty() ? "" : ",") + std::to_string(thoughts);
  std::ostringstream confidence;
  confidence << halting.confidence;
  return text + "@" + confidence.str();
}

std::string describe_depth_cascade(const DepthCascade& cascade) {
  std::string text;
  const auto join = [](const std::vector<int64_t>& values) {
    std::string joined;
    for (int64_t value : values) joined += (joined.empty() ? "" : ",") + std::to_string(value);
    return joined;
  };
  if (cascade.layer_sets())
    for (const auto& removed : cascade.removed) text += (text.empty() ? "{" : ",{") + join(removed) + "}";
  else
    text = join(cascade.depths);
  std::ostringstream confidence;
  confidence << cascade.confidence;
  return text + "@" + confidence.str();
}

double cascade_level_cost(const LlamaConfig& config, const DepthCascade& cascade, size_t level, int64_t prompt_tokens,
                          int64_t prompt_only, int64_t new_tokens, int64_t latent_steps) {
  if (cascade.layer_sets()) return layer_set_flops(config, cascade.removed[level], prompt_tokens, new_tokens, latent_steps);
  const int64_t previous = level > 0 ? cascade.depths[level - 1] : 0;  // the layers the prompt's state already holds
  return cascade_level_flops(config, prompt_tokens, prompt_only, new_tokens, latent_steps, cascade.depths[level], previous);
}

void check_depth_cascade(const DepthCascade& cascade, int64_t layers, const std::string& where) {
  if (cascade.layer_sets() && !cascade.depths.empty())
    throw std::invalid_argument(where + ": depth cascade: give depths or layer sets, not both");
  for (size_t i = 0; i < cascade.removed.size(); ++i) {
    const auto& removed = cascade.removed[i];
    for (size_t j = 0; j < removed.size(); ++j)
      if (removed[j] < 0 || removed[j] >= layers || (j > 0 && removed[j] <= removed[j - 1]))
        throw std::invalid_argument(where + ": depth cascade: the layers a level leaves out must ascend within 0.." +
                                    std::to_string(layers - 1));
    if (static_cast<int64_t>(removed.size()) >= layers)
      throw std::invalid_argument(where + ": depth cascade: a level leaves out every layer");
    if (i > 0 && removed.size() >= cascade.removed[i - 1].size())
      throw std::invalid_argument(where + ": depth cascade: each level must run more layers than the one before");
  }
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
  if (settings.depth_cascade.layer_sets())
    json["depth_cascade"] = {{"removed", settings.depth_cascade.removed}, {"confidence", settings.depth_cascade.confidence}};
  else if (settings.depth_cascade.active())
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
      if (cascade.contains("removed"))
        settings.depth_cascade.removed = cascade.at("removed").get<std::vector<std::vector<int64_t>>>();
      else
        settings.depth_cascade.depths = cascade.at("depths").get<std::vector<int64_t>>();
      settings.depth_cascade.confidence = cascade.at("confidence").get<double>();
      if (!settings.depth_cascade.active()) throw std::invalid_argument("depth_cascade has no levels");
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
