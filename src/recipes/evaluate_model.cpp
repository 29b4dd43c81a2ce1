#include "recipes/evaluate_model.h"

#include <filesystem>
#include <stdexcept>

#include "io/hf_checkpoint.h"
#include "io/hf_config.h"
#include "reasoning/special_tokens.h"
#include "recipes/train.h"
#include "text/hf_tokenizer.h"

namespace coconut {

EvalSummary evaluate_model_folder(const std::string& model_dir, const std::vector<Example>& examples,
                                  const ModelEvalOptions& options) {
  const ReasoningSettings trained = load_reasoning_settings(model_dir);
  const TrainingMode mode = training_mode_from_name(options.mode.empty() ? trained.mode : options.mode);
  auto model = load_model(model_dir, options.dtype, options.device);
  const std::string tokenizer_path = model_dir + "/tokenizer.json";
  if (!std::filesystem::exists(tokenizer_path)) throw std::invalid_argument(tokenizer_path + ": not found");
  const auto tokenizer = HfTokenizer::load(tokenizer_path);
  const SpecialTokenIds special = find_special_tokens(*tokenizer, model->config());
  require_markers(special, mode, tokenizer_path);
  return evaluate_with_settings(model, *tokenizer, special, trained, examples, options);
}

double exit_threshold_for_budget(const std::string& model_dir, const std::vector<Example>& examples,
                                 ModelEvalOptions options, double layers) {
  const int64_t depth = load_config(model_dir + "/config.json").num_hidden_layers;
  if (layers < static_cast<double>(options.exit_min_layers) || layers > static_cast<double>(depth))
    throw std::invalid_argument(model_dir + ": a budget of " + std::to_string(layers) + " layers is outside " +
                                std::to_string(options.exit_min_layers) + ".." + std::to_string(depth));
  double low = 0, high = 1;  // mean layers(low) >= budget > mean layers(high), kept so
  for (int iteration = 0; iteration < 12; ++iteration) {
    options.exit_threshold = (low + high) / 2;
    if (evaluate_model_folder(model_dir, examples, options).mean_layers >= layers)
      low = options.exit_threshold;
    else
      high = options.exit_threshold;
  }
  return low;
}

double router_threshold_for_budget(const std::string& model_dir, const std::vector<Example>& examples,
                                   ModelEvalOptions options, double layers) {
  const LlamaConfig config = load_config(model_dir + "/config.json");
  if (!config.depth_router)
    throw std::invalid_argument(model_dir + ": the model has no depth router (train one with depth_router: true)");
  if (layers < 0 || layers > static_cast<double>(config.num_hidden_layers))
    throw std::invalid_argument(model_dir + ": a budget of " + std::to_string(layers) + " layers is outside 0.." +
                                std::to_string(config.num_hidden_layers));
  // One loaded model for every probe.
  const ReasoningSettings trained = load_reasoning_settings(model_dir);
  auto model = load_model(model_dir, options.dtype, options.device);
  const auto tokenizer = HfTokenizer::load(model_dir + "/tokenizer.json");
  const SpecialTokenIds special = find_special_tokens(*tokenizer, model->config());
  double low = 0, high = 1;  // mean layers(low) >= budget > mean layers(high), kept so
  for (int iteration = 0; iteration < 12; ++iteration) {
    options.router_threshold = (low + high) / 2;
    if (evaluate_with_settings(model, *tokenizer, special, trained, examples, options).mean_layers >= layers)
      low = options.router_threshold;
    else
      high = options.router_threshold;
  }
  return low;
}

EvalSummary evaluate_with_settings(Llama& model, const Tokenizer& tokenizer, const SpecialTokenIds& special,
                                   const ReasoningSettings& trained, const std::vector<Example>& examples,
                                   const ModelEvalOptions& options) {
  const TrainingMode mode = training_mode_from_name(options.mode.empty() ? trained.mode : options.mode);
  // Thoughts per question: `latents` for all; else the curriculum rule at `stage` (default: the
  // stage the model was trained to).
  SequenceOptions rule;
  rule.c_thought = trained.c_thought;
  rule.max_latent_stage = trained.max_latent_stage;
  rule.pad_latent_to_max = trained.pad_latent_to_max;
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
  eval.exit_threshold = options.exit_threshold;
  eval.exit_min_layers = options.exit_min_layers;
  eval.router_threshold = options.router_threshold;
  return evaluate(model, tokenizer, special, examples, thoughts, eval);
}

}  // namespace coconut
