#include "recipes/evaluate_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <tuple>

#include "eval/cost.h"
#include "eval/paired_test.h"
#include "io/gguf_import.h"
#include "io/hf_checkpoint.h"
#include "io/hf_config.h"
#include "io/peft_adapter.h"
#include "model/huge_pages.h"
#include "model/quantize_model.h"
#include "pruning/surgery.h"
#include "reasoning/decode_thoughts.h"
#include "reasoning/special_tokens.h"
#include "recipes/train.h"
#include "text/hf_tokenizer.h"

namespace coconut {

Llama load_model_variant(const std::string& model_dir, const std::string& adapter, std::optional<torch::ScalarType> dtype,
                         torch::Device device, const std::set<int64_t>& drop, WeightFormat weights, bool allow_nonfinite) {
  const auto pruned_base = [&](const Llama& base, const BasePruning& pruning) {
    Llama copy = base;
    try {
      if (!pruning.mlp_channels.empty()) copy = drop_mlp_channels(copy, pruning.mlp_channels);
    } catch (const std::invalid_argument& error) {
      throw std::invalid_argument(adapter + "/coconut.json: dropped_mlp_channels of " + model_dir + ": " + error.what());
    }
    try {
      if (!pruning.layers.empty()) copy = drop_layers(copy, std::set<int64_t>(pruning.layers.begin(), pruning.layers.end()));
    } catch (const std::invalid_argument& error) {
      throw std::invalid_argument(adapter + "/coconut.json: dropped_layers of " + model_dir + ": " + error.what());
    }
    return copy;
  };
  if (weights == WeightFormat::kGguf && !adapter.empty())
    throw std::invalid_argument(adapter + ": an adapter changes the weights, so they are no longer " + model_dir +
                                "'s GGUF blocks: use --weights dense (or q8_0, q4_0, q4_1)");
  // On a GGUF file's blocks the dense tensors they stand for are never read (nor held).
  std::map<std::string, FileBlocks> file_blocks;
  std::set<std::string> from_blocks;
  if (weights == WeightFormat::kGguf) {
    file_blocks = read_file_blocks(model_dir);
    for (const auto& entry : file_blocks) from_blocks.insert(entry.first);
  }
  Llama model = adapter.empty() ? load_model(model_dir, dtype, device, allow_nonfinite, from_blocks)
                                : load_model_with_adapter(model_dir, adapter, dtype, device, allow_nonfinite, pruned_base);
  std::vector<int64_t> source_layers;  // the file's layer index of each layer kept (its GGUF blocks are named by it)
  for (int64_t layer = 0; layer < model->config().num_hidden_layers; ++layer)
    if (!drop.count(layer)) source_layers.push_back(layer);
  if (!drop.empty()) {
    try {  // surgery checks the layers; the message gains the folder
      model = drop_layers(model, drop);
    } catch (const std::invalid_argument& error) {
      throw std::invalid_argument(model_dir + ": " + error.what());
    }
  }
  if (weights == WeightFormat::kGguf)
    model = with_file_blocks(model, file_blocks, source_layers);
  else if (weights == WeightFormat::kDense)
    pack_for_inference(model);  // q|k|v and gate|up each one product; weights out of the mapped file
  else
    model = with_quantized_weights(model, weights);
  // Decoding reads every weight once a token, faster from 2 MiB pages than from the file mapping's
  // or the heap's 4 KiB ones (model/huge_pages.h).
  if (device.is_cpu()) move_to_huge_pages(held_weight_tensors(model));
  return model;
}

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
  loaded.model = load_model_variant(model_dir, options.adapter, options.dtype, options.device, options.drop_layers, options.weights);
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
  if (!options.drop_layers.empty() || options.depth.exit_threshold > 0 || options.halting.active() ||
      options.thought_control != ThoughtControl::kNone)
    return {};
  return trained.depth_cascade;
}

namespace {

// The calibration runs both choices of a cascade's confidence read: the examples at full depth,
// and each taken through every level of `cascade`.
struct CascadeCalibration {
  EvalSummary full;
  std::vector<CascadeCalibrationQuestion> questions;
};

CascadeCalibration run_cascade_calibration(const std::string& model_dir, const std::vector<Example>& examples,
                                           ModelEvalOptions options, const DepthCascade& cascade) {
  if (!cascade.active()) throw std::invalid_argument(model_dir + ": no depth cascade to calibrate (give its depths)");
  LoadedModel loaded = load_for_evaluation(model_dir, options);
  CascadeCalibration calibration;
  options.cascade = DepthCascade{};
  calibration.full = evaluate_with_settings(loaded.model, *loaded.tokenizer, loaded.special, loaded.trained, examples, options);
  DepthCascade everything = cascade;
  everything.confidence = 1;  // every example through every level
  options.cascade = everything;
  const auto levels = evaluate_with_settings(loaded.model, *loaded.tokenizer, loaded.special, loaded.trained, examples, options);
  calibration.questions.resize(examples.size());
  for (const auto& prediction : calibration.full.predictions) calibration.questions[prediction.index].full_correct = prediction.correct;
  for (const auto& prediction : levels.predictions) {
    auto& question = calibration.questions[prediction.index];
    for (const auto& level : prediction.cascade) {
      question.confidence.push_back(level.confidence);
      question.flops.push_back(level.flops);
      question.correct.push_back(answer_matches(level.generated_text, examples[prediction.index].answer));
    }
  }
  return calibration;
}

// Mean FLOPs and accuracy of the questions at threshold t.
std::pair<double, double> cascade_outcome(const std::vector<CascadeCalibrationQuestion>& questions, double threshold) {
  double flops = 0, correct = 0;
  for (const auto& question : questions) {
    const size_t stop = cascade_stop_level(question, threshold);
    for (size_t level = 0; level <= stop; ++level) flops += question.flops[level];
    correct += question.correct[stop] ? 1 : 0;
  }
  const auto n = static_cast<double>(questions.size());
  return {flops / n, correct / n};
}

// The thresholds at which some question changes where it stops: 0 and every confidence a shallower
// level showed, ascending, each once.
std::vector<double> cascade_thresholds(const std::vector<CascadeCalibrationQuestion>& questions) {
  std::vector<double> thresholds{0.0};
  for (const auto& question : questions)
    for (size_t level = 0; level + 1 < question.confidence.size(); ++level) thresholds.push_back(question.confidence[level]);
  std::sort(thresholds.begin(), thresholds.end());
  thresholds.erase(std::unique(thresholds.begin(), thresholds.end()), thresholds.end());
  return thresholds;
}

}  // namespace

double cascade_confidence_for_flops(const std::string& model_dir, const std::vector<Example>& examples,
                                    ModelEvalOptions options, const DepthCascade& cascade, double fraction,
                                    const std::function<void(const std::string&)>& log, CascadeCalibrationReport* report) {
  if (!(fraction > 0)) throw std::invalid_argument("cascade_confidence_for_flops: the FLOPs fraction must be positive");
  const auto calibration = run_cascade_calibration(model_dir, examples, options, cascade);
  const auto& questions = calibration.questions;
  const double budget = fraction * calibration.full.mean_flops;
  double chosen = -1;
  for (double threshold : cascade_thresholds(questions))
    if (cascade_outcome(questions, threshold).first <= budget) chosen = threshold;  // FLOPs rise with the threshold
  if (chosen < 0)
    throw std::invalid_argument(model_dir + ": the cascade's first level alone costs " +
                                std::to_string(cascade_outcome(questions, 0).first / calibration.full.mean_flops) +
                                " of the full model's FLOPs, more than " + std::to_string(fraction));
  const auto [flops, accuracy] = cascade_outcome(questions, chosen);
  char line[256];
  std::snprintf(line, sizeof line, "full depth: accuracy %.4f, %.4g FLOPs; cascade at confidence %.6g: accuracy %.4f, %.4g FLOPs (%.3f of full)",
                calibration.full.accuracy, calibration.full.mean_flops, chosen, accuracy, flops, flops / calibration.full.mean_flops);
  log(line);
  if (report != nullptr) {
    *report = {"flops", fraction, 0, chosen, accuracy, calibration.full.accuracy, flops / calibration.full.mean_flops};
    report->questions = static_cast<int64_t>(questions.size());
  }
  return chosen;
}

size_t cascade_stop_level(const CascadeCalibrationQuestion& question, double threshold) {
  for (size_t level = 0; level + 1 < question.confidence.size(); ++level)
    if (question.confidence[level] > threshold) return level;
  return question.confidence.empty() ? 0 : question.confidence.size() - 1;
}

CascadeRiskChoice choose_cascade_threshold_for_risk(const std::vector<CascadeCalibrationQuestion>& questions, double epsilon,
                                                    double delta) {
  if (!(epsilon > 0 && epsilon < 1) || !(delta > 0 && delta < 1))
    throw std::invalid_argument("cascade risk: epsilon and delta must be in (0, 1)");
  // 1 deepens every question (no confidence is above it); then every confidence a shallower level
  // showed, descending, down to 0.
  std::vector<double> thresholds = cascade_thresholds(questions);
  if (thresholds.back() < 1.0) thresholds.push_back(1.0);
  std::reverse(thresholds.begin(), thresholds.end());
  const auto n = static_cast<int64_t>(questions.size());
  CascadeRiskChoice choice;
  for (double threshold : thresholds) {
    int64_t losses = 0;
    for (const auto& question : questions)
      losses += question.full_correct && !question.correct[cascade_stop_level(question, threshold)] ? 1 : 0;
    const double p_value = binomial_tail_at_most(losses, n, epsilon);
    ++choice.thresholds_tested;
    if (p_value > delta) break;  // the first failure ends the sequence
    choice.threshold = threshold;
    choice.p_value = p_value;
    choice.risk = static_cast<double>(losses) / static_cast<double>(n);
    std::tie(choice.mean_flops, choice.accuracy) = cascade_outcome(questions, threshold);
  }
  return choice;
}

double cascade_confidence_for_risk(const std::string& model_dir, const std::vector<Example>& examples, ModelEvalOptions options,
                                   const DepthCascade& cascade, double epsilon, double delta,
                                   const std::function<void(const std::string&)>& log, CascadeCalibrationReport* report) {
  const auto calibration = run_cascade_calibration(model_dir, examples, options, cascade);
  const auto choice = choose_cascade_threshold_for_risk(calibration.questions, epsilon, delta);
  char line[320];
  if (choice.threshold < 0) {
    std::snprintf(line, sizeof line, "%s: no confidence keeps the risk within %g at level %g on %zu questions, not even "
                  "deepening every one (more calibration questions, or a larger epsilon or delta)",
                  model_dir.c_str(), epsilon, delta, examples.size());
    throw std::invalid_argument(line);
  }
  const auto& full = calibration.full;
  std::snprintf(line, sizeof line, "full depth: accuracy %.4f, %.4g FLOPs; cascade at confidence %.6g: risk %.4f (p = %.3g <= %g, "
                "%lld thresholds tested), accuracy %.4f, %.4g FLOPs (%.3f of full)",
                full.accuracy, full.mean_flops, choice.threshold, choice.risk, choice.p_value, delta,
                static_cast<long long>(choice.thresholds_tested), choice.accuracy, choice.mean_flops,
                choice.mean_flops / full.mean_flops);
  log(line);
  if (report != nullptr) {
    *report = {"risk", epsilon, delta, choice.threshold, choice.accuracy, full.accuracy, choice.mean_flops / full.mean_flops,
               choice.risk, choice.p_value, static_cast<int64_t>(examples.size())};
  }
  return choice.threshold;
}

EvalSummary evaluate_with_settings(Llama& model, const Tokenizer& tokenizer, const SpecialTokenIds& special,
                                   const ReasoningSettings& trained, const std::vector<Example>& examples,
                                   const ModelEvalOptions& options) {
  const TrainingMode mode = training_mode_from_name(options.mode.empty() ? trained.mode : options.mode);
  // Thoughts per question: `latents` for all; else the curriculum rule at `stage` (default: the
  // stage the model was trained to).
  const SequenceOptions rule = trained.sequence_options();
  const int64_t stage = options.stage >= 0 ? options.stage : trained.stage;
  const auto thoughts_of = [&](const std::vector<Example>& questions) {
    std::vector<int64_t> counts;
    for (const auto& example : questions)
      counts.push_back(options.latents >= 0 ? options.latents
                                            : latent_thoughts_for_stage(stage, static_cast<int64_t>(example.steps.size()), rule));
    return counts;
  };
  const std::vector<int64_t> thoughts = thoughts_of(examples);
  EvalOptions eval;
  eval.mode = mode;
  eval.pause_tokens = options.pause_tokens >= 0 ? options.pause_tokens : trained.pause_tokens;
  eval.batch_size = options.batch_size;
  eval.max_new_tokens = options.max_new_tokens;
  eval.depth = options.depth;
  eval.latent_bottleneck = trained.answer_through_thoughts;
  eval.cascade = cascade_for(trained, options);
  eval.halting = options.halting;
  EvalSummary summary;
  if (options.thought_control != ThoughtControl::kNone) {
    if (options.decode_thoughts > 0 || options.thought_top > 0)
      throw std::invalid_argument("a thought control replaces the thoughts: decode them without one");
    ThoughtControlRun run{options.thought_control, options.control_seed, options.control_calibration,
                          thoughts_of(options.control_calibration)};
    summary = evaluate_with_thought_control(model, tokenizer, special, examples, thoughts, eval, run);
  } else {
    summary = evaluate(model, tokenizer, special, examples, thoughts, eval);
  }
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
