#include "recipes/evaluate_model.h"

#include <filesystem>
#include <stdexcept>

#include "io/hf_checkpoint.h"
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
  return evaluate(model, tokenizer, special, examples, thoughts, eval);
}

}  // namespace coconut
