#include "recipes/evaluate_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include "eval/cost.h"
#include "io/hf_checkpoint.h"
#include "io/hf_config.h"
#include "io/peft_adapter.h"
#include "model/quantize_model.h"
#include "pruning/surgery.h"
#include "reasoning/decode_thoughts.h"
#include "reasoning/special_tokens.h"
#include "recipes/train.h"
#include "text/hf_tokenizer.h"

namespace coconut {

namespace {

// A model folder ready to evaluate: its weights, tokenizer, markers and trained layout.
struct LoadedModel {
  ReasoningSettings trained;
  Llama model{nullptr};
  std::unique_ptr<HfTokenizer> tokenizer;
  SpecialTokenIds special;
};

// Throws std::invalid_argument naming the folder when the tokenizer or markers are missing.
LoadedModel load_for_evaluation(const std::string& model_dir, const ModelEvalOptions& options) {
  LoadedModel loaded;
  loaded.trained = load_reasoning_settings(folder_with(model_dir, options.adapter, "coconut.json"));
  const TrainingMode mode = training_mode_from_name(options.mode.empty() ? loaded.trained.mode : options.mode);
  loaded.model = load_model_with_adapter(model_dir, options.adapter, options.dtype, options.device);
  if (!options.drop_layers.empty()) {
    try {  // surgery checks the layers; the message gains the folder
      loaded.model = drop_layers(loaded.model, options.drop_layers);
    } catch (const std::invalid_argument& error) {
      throw std::invalid_argument(model_dir + ": " + error.what());
    }
  }
  loaded.model = with_quantized_weights(loaded.model, options.weights);
  const std::string tokenizer_path = folder_with(model_dir, options.adapter, "tokenizer.json") + "/tokenizer.json";
  if (!std::filesystem::exists(tokenizer_path)) throw std::invalid_argument(tokenizer_path + ": not found");
  loaded.tokenizer = HfTokenizer::load(tokenizer_path);
  loaded.special = find_special_tokens(*loaded.tokenizer, loaded.model->config());
  require_markers(loaded.special, mode, tokenizer_path);
  return loaded;
}

// The value of `knob` (a threshold in [0, 1] that lowers the mean layers as it rises) at which the
// examples' thoughts and decoded tokens run `layers` layers on average: bisection, one loaded model.
// The bisection halves the knob's log-odds (clamped to [-20, 20]), not the knob: trained gates sit
// close to 0 or 1, and a small router's calibrated threshold was 0.0012, which twelve halvings of
// [0, 1] (steps of 1/4096) resolved to a few steps and, after a slightly different training, to 0
// (every layer run).
double threshold_for_budget(const std::string& model_dir, const std::vector<Example>& examples, ModelEvalOptions options,
                            double layers, double DepthPolicy::*knob) {
  LoadedModel loaded = load_for_evaluation(model_dir, options);
  const auto log_odds = [](double p) { return p <= 0 ? -20.0 : p >= 1 ? 20.0 : std::clamp(std::log(p / (1 - p)), -20.0, 20.0); };
  double low = 0, high = 1;  // mean layers(low) >= budget > mean layers(high), kept so
  for (int iteration = 0; iteration < 16; ++iteration) {
    options.depth.*knob = 1 / (1 + std::exp(-(log_odds(low) + log_odds(high)) / 2));
    if (evaluate_with_settings(loaded.model, *loaded.tokenizer, loaded.special, loaded.trained, examples, options).mean_layers >= layers)
      low = options.depth.*knob;
    else
      high = options.depth.*knob;
  }
  return low;
}

}  // namespace

EvalSummary evaluate_model_folder(const std::string& model_dir, const std::vector<Example>& examples,
                                  const ModelEvalOptions& options) {
  LoadedModel loaded = load_for_evaluation(model_dir, options);
  return evaluate_with_settings(loaded.model, *loaded.tokenizer, loaded.special, loaded.trained, examples, options);
}

double exit_threshold_for_budget(const std::string& model_dir, const std::vector<Example>& examples,
                                 ModelEvalOptions options, double layers) {
  const int64_t depth = load_config(model_dir + "/config.json").num_hidden_layers;
  if (layers < static_cast<double>(options.depth.exit_min_layers) || layers > static_cast<double>(depth))
    throw std::invalid_argument(model_dir + ": a budget of " + std::to_string(layers) + " layers is outside " +
                                std::to_string(options.depth.exit_min_layers) + ".." + std::to_string(depth));
  return threshold_for_budget(model_dir, examples, options, layers, &DepthPolicy::exit_threshold);
}

double router_threshold_for_budget(const std::string& model_dir, const std::vector<Example>& examples,
                                   ModelEvalOptions options, double layers) {
  const LlamaConfig config = load_config(model_dir + "/config.json");
  if (!config.depth_router)
    throw std::invalid_argument(model_dir + ": the model has no depth router (train one with depth_router: true)");
  if (layers < 0 || layers > static_cast<double>(config.num_hidden_layers))
    throw std::invalid_argument(model_dir + ": a budget of " + std::to_string(layers) + " layers is outside 0.." +
                                std::to_string(config.num_hidden_layers));
  return threshold_for_budget(model_dir, examples, options, layers, &DepthPolicy::router_threshold);
}

DepthCascade cascade_for(const ReasoningSettings& trained, const ModelEvalOptions& options) {
  if (options.cascade) return *options.cascade;
  if (!options.drop_layers.empty() || options.depth.exit_threshold > 0) return {};
  return trained.depth_cascade;
}

double cascade_confidence_for_flops(const std::string& model_dir, const std::vector<Example>& examples,
                                    ModelEvalOptions options, const DepthCascade& cascade, double fraction,
                                    const std::function<void(const std::string&)>& log) {
  if (!cascade.active()) throw std::invalid_argument(model_dir + ": no depth cascade to calibrate (give its depths)");
  if (!(fraction > 0)) throw std::invalid_argument("cascade_confidence_for_flops: the FLOPs fraction must be positive");
  LoadedModel loaded = load_for_evaluation(model_dir, options);
  options.cascade = DepthCascade{};
  const auto full = evaluate_with_settings(loaded.model, *loaded.tokenizer, loaded.special, loaded.trained, examples, options);
  DepthCascade everything = cascade;
  everything.confidence = 1;  // every example through every level
  options.cascade = everything;
  const auto levels = evaluate_with_settings(loaded.model, *loaded.tokenizer, loaded.special, loaded.trained, examples, options);
  // Mean FLOPs and accuracy at threshold t: each example stops at its first level above t (or the last).
  const auto outcome = [&](double threshold) {
    double flops = 0, correct = 0;
    for (size_t i = 0; i < examples.size(); ++i) {
      const auto& steps = levels.predictions[i].cascade;
      for (size_t level = 0; level < steps.size(); ++level) {
        flops += steps[level].flops;
        if (level + 1 == steps.size() || steps[level].confidence > threshold) {
          correct += answer_matches(steps[level].generated_text, examples[i].answer) ? 1 : 0;
          break;
        }
      }
    }
    const auto n = static_cast<double>(examples.size());
    return std::make_pair(flops / n, correct / n);
  };
  std::vector<double> candidates{0.0};
  for (const auto& prediction : levels.predictions)
    for (size_t level = 0; level + 1 < prediction.cascade.size(); ++level) candidates.push_back(prediction.cascade[level].confidence);
  std::sort(candidates.begin(), candidates.end());
  const double budget = fraction * full.mean_flops;
  double chosen = -1;
  for (double threshold : candidates)
    if (outcome(threshold).first <= budget) chosen = threshold;  // FLOPs rise with the threshold
  if (chosen < 0)
    throw std::invalid_argument(model_dir + ": the cascade's first level alone costs " + std::to_string(outcome(0).first / full.mean_flops) +
                                " of the full model's FLOPs, more than " + std::to_string(fraction));
  const auto [flops, accuracy] = outcome(chosen);
  char line[256];
  std::snprintf(line, sizeof line, "full depth: accuracy %.4f, %.4g FLOPs; cascade at confidence %.6g: accuracy %.4f, %.4g FLOPs (%.3f of full)",
                full.accuracy, full.mean_flops, chosen, accuracy, flops, flops / full.mean_flops);
  log(line);
  return chosen;
}

EvalSummary evaluate_with_settings(Llama& model, const Tokenizer& tokenizer, const SpecialTokenIds& special,
                                   const ReasoningSettings& trained, const std::vector<Example>& examples,
                                   const ModelEvalOptions& options) {
  const TrainingMode mode = training_mode_from_name(options.mode.empty() ? trained.mode : options.mode);
  // Thoughts per question: `latents` for all; else the curriculum rule at `stage` (default: the
  // stage the model was trained to).
  const SequenceOptions rule = trained.sequence_options();
  const int64_t stage = options.stage >= 0 ? options.stage : trained.stage;
  std::vector<int64_t> thoughts;
  for (const auto& example : examples)
    thoughts.push_back(options.latents >= 0 ? options.latents
                                            : latent_thoughts_for_stage(stage, static_cast<int64_t>(example.steps.size()), rule));
  EvalOptions eval;
  eval.mode = mode;
  eval.pause_tokens = options.pause_tokens >= 0 ? options.pause_tokens : trained.pause_tokens;
  eval.batch_size = options.batch_size;
  eval.max_new_tokens = options.max_new_tokens;
  eval.depth = options.depth;
  eval.latent_bottleneck = trained.answer_through_thoughts;
  eval.cascade = cascade_for(trained, options);
  EvalSummary summary = evaluate(model, tokenizer, special, examples, thoughts, eval);
  summary.weight_bytes_per_step = weight_bytes_per_decoded_token(model);
  // What each step's thoughts say, recomputed with every layer (early exit and routers left out).
  if ((options.decode_thoughts > 0 || options.thought_top > 0) && mode == TrainingMode::kCoconut)
    for (auto& prediction : summary.predictions) {
      const size_t i = prediction.index;
      const EvalPrompt prompt = build_eval_prompt(tokenize_example(examples[i], tokenizer, special), mode, thoughts[i],
                                                  eval.pause_tokens, special);
      const PromptThoughts thoughts_of_prompt = prompt_thoughts(model, prompt);  // one latent forward for both probes
      if (options.decode_thoughts > 0)
        prediction.thought_texts =
            decode_thoughts(model, tokenizer, thoughts_of_prompt, trained.c_thought, options.decode_thoughts, special.eos);
      if (options.thought_top > 0) prediction.thought_tops = thought_top_tokens(model, tokenizer, thoughts_of_prompt, options.thought_top);
    }
  return summary;
}

}  // namespace coconut
