#include "reasoning/evaluate.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>

#include "eval/cost.h"
#include "model/generate.h"

namespace coconut {

namespace {

std::string trim(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  const auto end = text.find_last_not_of(" \t\r\n");
  return text.substr(begin, end - begin + 1);
}

std::string without_commas(std::string text) {
  text.erase(std::remove(text.begin(), text.end(), ','), text.end());
  return text;
}

// The inputs a batch's rows are fed as thought `thought` under a control: rows are the questions
// `members`, `hidden` [B, 1, D] the last hidden states the model's `input` [B, 1, D] came from.
torch::Tensor controlled_thought(Llama& model, const ThoughtReplacement& replacement, const std::vector<size_t>& members,
                                 int64_t thought, const torch::Tensor& hidden, const torch::Tensor& input) {
  const auto row_stack = [&](const std::function<torch::Tensor(size_t)>& row) {
    std::vector<torch::Tensor> rows;
    for (size_t j = 0; j < members.size(); ++j) rows.push_back(row(j).to(input.options()));
    return torch::stack(rows).unsqueeze(1);  // [B, 1, D]
  };
  switch (replacement.control) {
    case ThoughtControl::kNone:
    case ThoughtControl::kZero:
      return input;
    case ThoughtControl::kNoise:
      return row_stack([&](size_t j) { return noise_like_thought(input[j][0], replacement.seed, members[j], thought); });
    case ThoughtControl::kShuffle:
      return row_stack([&](size_t j) {
        const torch::Tensor& donor = replacement.donors.at(members[j]);
        if (thought >= donor.size(0))
          throw std::invalid_argument("shuffled thoughts: question " + std::to_string(members[j]) + " is given " +
                                      std::to_string(donor.size(0)) + " thoughts, not " + std::to_string(thought + 1));
        return donor[thought];
      });
    case ThoughtControl::kMean:
      if (thought >= replacement.mean_thoughts.size(0))
        throw std::invalid_argument("mean thoughts: the calibration set's questions have at most " +
                                    std::to_string(replacement.mean_thoughts.size(0)) + " thoughts; thought " +
                                    std::to_string(thought + 1) + " has no mean");
      return replacement.mean_thoughts[thought].to(input.options()).view({1, 1, -1}).expand_as(input).contiguous();
    case ThoughtControl::kToken: {
      const auto tokens = model->logits(hidden.select(1, 0)).argmax(-1).view({-1, 1});  // [B, 1]
      return model->embed(tokens);                                                        // [B, 1, D]
    }
  }
  return input;
}

// A batch through a depth cascade: every row runs the first level; the rows whose answer's
// confidence is at most the threshold go on to the next level from their prompts' prefixes. Each level
// counts what it runs: its thoughts and answer at its depth, and the prompt's layers above the
// previous level's depth (those below are the prefix's). A layer-set cascade runs each level's
// question whole, without its removed layers, and counts all of it.
// `describe(index, tokens)` fills predictions[index] from a run's tokens as a full-depth answer.
template <typename Describe>
void run_cascade_levels(Llama& model, const DepthCascade& cascade, const std::vector<size_t>& members,
                        const std::vector<EvalPrompt>& prompts, GenerationOptions generation,
                        std::vector<Prediction>& predictions, const Describe& describe) {
  const LlamaConfig& config = model->config();
  std::vector<size_t> rows = members;
  const bool sets = cascade.layer_sets();
  for (size_t level = 0; level < cascade.levels() && !rows.empty(); ++level) {
    const int64_t layers = cascade.level_layers(level, config.num_hidden_layers);
    const bool last = level + 1 == cascade.levels();
    if (sets)
      generation.skip_layers = std::set<int64_t>(cascade.removed[level].begin(), cascade.removed[level].end());
    else
      generation.layers = layers;
    generation.keep_prompt_prefixes = !last && !sets;
    generation.record_probabilities = true;
    std::vector<std::vector<int64_t>> level_prompts;
    for (size_t index : rows) level_prompts.push_back(prompts[index].prompt);
    const auto start = std::chrono::steady_clock::now();
    const auto result = generate(model, level_prompts, generation);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::vector<size_t> deeper;
    std::vector<PromptPrefix> deeper_prefixes;
    for (size_t j = 0; j < rows.size(); ++j) {
      const size_t index = rows[j];
      const auto& probabilities = result.token_probabilities[j];
      const double confidence = lowest_probability(probabilities);
      const double flops_before = level == 0 ? 0.0 : predictions[index].flops;
      const double latency_before = level == 0 ? 0.0 : predictions[index].latency_seconds;
      auto levels = level == 0 ? std::vector<CascadeLevel>{} : std::move(predictions[index].cascade);
      Prediction& prediction = describe(index, result.tokens[j]);
      const int64_t prompt = static_cast<int64_t>(prompts[index].prompt.size());
      CascadeLevel record;
      record.layers = layers;
      record.thoughts = prediction.latent_thoughts;
      record.confidence = confidence;
      record.generated_text = prediction.generated_text;
      record.generated_tokens = prediction.generated_tokens;
      record.flops = cascade_level_cost(config, cascade, level, prediction.prompt_tokens, prompt, prediction.generated_tokens,
                                        prediction.latent_thoughts);
      levels.push_back(record);
      prediction.cascade = std::move(levels);
      prediction.flops = flops_before + record.flops;
      prediction.latency_seconds = latency_before + seconds / static_cast<double>(rows.size());
      prediction.mean_layers = static_cast<double>(layers);
      if (!last && confidence <= cascade.confidence) {
        deeper.push_back(index);
        if (!sets) deeper_prefixes.push_back(result.prompt_prefixes[j]);
      }
    }
    generation.prompt_prefixes = std::move(deeper_prefixes);
    rows = std::move(deeper);
  }
}

// Row `row` of a halting run: the thoughts it took, a level per peek it undid and one for the
// answer kept, and FLOPs that count them all (the thoughts once). `prediction` already describes
// the kept answer as if after the last thought count.
void record_halting(const LlamaConfig& config, const ThoughtHalting& halting, const Tokenizer& tokenizer,
                    const GenerationResult& result, size_t row, int64_t prompt_only, Prediction& prediction) {
  const int64_t layers = config.num_hidden_layers;
  std::vector<CascadeLevel> levels;
  double flops = 0;
  for (const auto& peek : result.undone_peeks[row]) {
    CascadeLevel level{layers, peek.thoughts, lowest_probability(peek.probabilities, halting.peek_tokens),
                       tokenizer.decode(peek.tokens, true), static_cast<int64_t>(peek.tokens.size())};
    level.flops = undone_peek_flops(config, prediction.prompt_tokens, prompt_only, static_cast<int64_t>(peek.tokens.size()),
                                    peek.thoughts);
    flops += level.flops;
    levels.push_back(std::move(level));
  }
  prediction.latent_thoughts = result.thoughts_taken[row];
  CascadeLevel kept{layers, prediction.latent_thoughts, lowest_probability(result.token_probabilities[row], halting.peek_tokens),
                    prediction.generated_text, prediction.generated_tokens};
  kept.flops = generation_flops(config, prediction.prompt_tokens, prediction.generated_tokens, prediction.latent_thoughts).total();
  levels.push_back(std::move(kept));
  prediction.flops = flops + levels.back().flops;
  prediction.cascade = std::move(levels);
}

}  // namespace

std::string extract_answer(const std::string& generated_text) {
  const auto hash = generated_text.rfind('#');
  const std::string tail = hash == std::string::npos ? generated_text : generated_text.substr(hash + 1);
  return trim(without_commas(tail));
}

bool answer_matches(const std::string& generated_text, const std::string& expected_answer) {
  return extract_answer(generated_text) == trim(without_commas(expected_answer));
}

EvalPrompt build_eval_prompt(const TokenizedExample& example, TrainingMode mode, int64_t latent_thoughts,
                             int64_t pause_tokens, const SpecialTokenIds& special) {
  EvalPrompt prompt;
  prompt.prompt = example.question;
  auto& ids = prompt.prompt;
  switch (mode) {
    case TrainingMode::kCoconut:
      ids.push_back(special.start_latent);
      prompt.latent_thoughts = latent_thoughts;
      prompt.after_latents = {special.end_latent};
      break;
    case TrainingMode::kPauseAsThought:
      ids.push_back(special.start_latent);
      ids.insert(ids.end(), static_cast<size_t>(latent_thoughts), special.pause);
      ids.push_back(special.end_latent);
      break;
    case TrainingMode::kNoThoughts:
      ids.push_back(special.start_latent);
      ids.push_back(special.end_latent);
      break;
    case TrainingMode::kPause:
      ids.insert(ids.end(), static_cast<size_t>(pause_tokens), special.pause);
      break;
    default:
      break;
  }
  return prompt;
}

EvalSummary evaluate(Llama& model, const Tokenizer& tokenizer, const SpecialTokenIds& special,
                     const std::vector<Example>& examples, const std::vector<int64_t>& latent_thoughts,
                     const EvalOptions& options) {
  if (examples.empty()) throw std::invalid_argument("evaluate: no examples");
  if (latent_thoughts.size() != examples.size())
    throw std::invalid_argument("evaluate: one latent thought count per example is needed");
  if (options.batch_size < 1) throw std::invalid_argument("evaluate: batch_size must be at least 1");
  const LlamaConfig& config = model->config();
  if (options.cascade.active()) {
    check_depth_cascade(options.cascade, config.num_hidden_layers, "evaluate");
    if (options.depth.exit_threshold > 0 || (config.depth_router && options.depth.router_threshold > 0))
      throw std::invalid_argument("evaluate: a depth cascade runs whole prefixes: no early exit or depth router with it");
  }
  const ThoughtHalting& halting = options.halting;
  if (halting.active()) {
    if (options.mode != TrainingMode::kCoconut)
      throw std::invalid_argument("evaluate: halting chooses a count of continuous thoughts: coconut mode only, not " +
                                  std::string(training_mode_name(options.mode)));
    if (options.cascade.active()) throw std::invalid_argument("evaluate: halting or a depth cascade, not both");
  }
  const ThoughtReplacement& replacement = options.replaced_thoughts;
  const bool controlled = replacement.control != ThoughtControl::kNone;
  if (controlled) {
    if (options.mode != TrainingMode::kCoconut)
      throw std::invalid_argument(std::string("evaluate: thought controls replace continuous thoughts: coconut mode only, not ") +
                                  training_mode_name(options.mode));
    if (options.cascade.active() || halting.active())
      throw std::invalid_argument("evaluate: a thought control runs each question once: no depth cascade or halting");
    if (replacement.control == ThoughtControl::kShuffle && replacement.donors.size() != examples.size())
      throw std::invalid_argument("evaluate: shuffled thoughts need one donor per question");
  }
  if (options.record_thoughts && (options.cascade.active() || halting.active()))
    throw std::invalid_argument("evaluate: thoughts are recorded from one run per question: no depth cascade or halting");
  std::vector<EvalPrompt> prompts;
  prompts.reserve(examples.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    prompts.push_back(build_eval_prompt(tokenize_example(examples[i], tokenizer, special), options.mode,
                                        halting.active()                                ? halting.thoughts.back()
                                        : replacement.control == ThoughtControl::kZero ? 0
                                                                                        : latent_thoughts[i],
                                        options.pause_tokens,
                                        special));
    const EvalPrompt& prompt = prompts.back();
    const auto needed = static_cast<int64_t>(prompt.prompt.size() + prompt.after_latents.size()) +
                        prompt.latent_thoughts + options.max_new_tokens;
    if (needed > config.max_position_embeddings)
      throw std::invalid_argument("question " + std::to_string(i) + ": " + std::to_string(prompt.prompt.size()) +
                                  " prompt tokens, " + std::to_string(prompt.latent_thoughts) + " thoughts and " +
                                  std::to_string(options.max_new_tokens) + " new tokens need " + std::to_string(needed) +
                                  " positions; the model has max_position_embeddings " +
                                  std::to_string(config.max_position_embeddings) + " (lower max_new_tokens or shorten it)");
  }

  // Batches of examples with the same thoughts and the same tokens after them, in input order.
  std::vector<std::pair<int64_t, std::vector<int64_t>>> thought_layouts;
  for (const auto& prompt : prompts) thought_layouts.emplace_back(prompt.latent_thoughts, prompt.after_latents);

  EvalSummary summary;
  summary.mode = training_mode_name(options.mode);
  summary.cascade = options.cascade;
  summary.halting = halting;
  summary.questions = examples.size();
  summary.predictions.resize(examples.size());
  const auto start_all = std::chrono::steady_clock::now();
  for (const auto& members : batches_of_equal_keys(thought_layouts, options.batch_size)) {
    const auto& [thoughts, after_latents] = thought_layouts[members.front()];
    std::vector<std::vector<int64_t>> batch_prompts;
    for (size_t index : members) batch_prompts.push_back(prompts[index].prompt);
    GenerationOptions generation;
    generation.max_new_tokens = options.max_new_tokens;
    generation.stop_ids = {special.eos};
    generation.latent_thoughts = thoughts;
    generation.after_latents = after_latents;
    generation.latent_bottleneck = options.latent_bottleneck;
    generation.depth = options.depth;
    generation.halting = halting;
    generation.record_probabilities = halting.active();
    // Each row's fed-back thought inputs: replaced under a control, kept when recording.
    std::vector<std::vector<torch::Tensor>> fed(members.size());
    if (controlled || options.record_thoughts)
      generation.replace_thought = [&](int64_t thought, const torch::Tensor& hidden, const torch::Tensor& input) {
        const auto inputs = controlled_thought(model, replacement, members, thought, hidden, input);  // [B, 1, D]
        if (options.record_thoughts)
          for (size_t j = 0; j < members.size(); ++j) fed[j].push_back(inputs[j][0].to(torch::kFloat32).cpu());  // [D]
        return inputs;
      };
    // What any run tells about a question: its answer, tokens and the FLOPs of a full-depth run.
    const auto describe = [&](size_t index, const std::vector<int64_t>& tokens) -> Prediction& {
      Prediction& prediction = summary.predictions[index];
      prediction.index = index;
      prediction.question = examples[index].question;
      prediction.expected = examples[index].answer;
      prediction.generated_text = tokenizer.decode(tokens, true);
      prediction.predicted = extract_answer(prediction.generated_text);
      prediction.correct = answer_matches(prediction.generated_text, examples[index].answer);
      prediction.generated_tokens = static_cast<int64_t>(tokens.size());
      prediction.latent_thoughts = thoughts;
      // The tokens after the thoughts are processed like prompt tokens (one forward).
      prediction.prompt_tokens = static_cast<int64_t>(prompts[index].prompt.size() + after_latents.size());
      if (const auto unknown = tokenizer.unknown_token_id())
        prediction.unknown_tokens = std::count(prompts[index].prompt.begin(), prompts[index].prompt.end(), *unknown);
      prediction.flops = generation_flops(config, prediction.prompt_tokens, prediction.generated_tokens, thoughts).total();
      prediction.mean_layers = static_cast<double>(config.num_hidden_layers);
      return prediction;
    };
    if (options.cascade.active()) {
      run_cascade_levels(model, options.cascade, members, prompts, generation, summary.predictions, describe);
      continue;
    }
    const auto start = std::chrono::steady_clock::now();
    const auto result = generate(model, batch_prompts, generation);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (size_t j = 0; j < members.size(); ++j) {
      Prediction& prediction = describe(members[j], result.tokens[j]);
      prediction.latency_seconds = seconds / static_cast<double>(members.size());
      if (options.record_thoughts)
        prediction.thought_inputs = fed[j].empty() ? torch::zeros({0, config.hidden_size}) : torch::stack(fed[j]);  // [n, D]
      if (halting.active()) {
        record_halting(config, halting, tokenizer, result, j, static_cast<int64_t>(prompts[members[j]].prompt.size()),
                       prediction);
        continue;
      }
      const auto& exits = result.exits[j];
      if (!exits.empty()) {
        double layers = 0;
        for (const auto& pass : exits) {
          for (int64_t layer : pass.skipped_layers) prediction.flops -= skipped_layer_savings(config, pass.context, layer);
          if (config.depth_router)
            prediction.flops += router_gate_flops(config, config.num_hidden_layers - config.depth_router_first_layer);
          layers += static_cast<double>(pass.layers_run);
        }
        prediction.mean_layers = layers / static_cast<double>(exits.size());
      }
    }
  }
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_all).count();
  for (const auto& prediction : summary.predictions) {
    summary.accuracy += prediction.correct ? 1.0 : 0.0;
    summary.mean_generated_tokens += static_cast<double>(prediction.generated_tokens);
    summary.mean_latent_thoughts += static_cast<double>(prediction.latent_thoughts);
    summary.mean_flops += prediction.flops;
    summary.mean_latency_seconds += prediction.latency_seconds;
    summary.mean_layers += prediction.mean_layers;
    if (prediction.cascade.size() > 1) summary.deepened += 1;
    summary.unknown_tokens += prediction.unknown_tokens;
    if (prediction.unknown_tokens > 0) ++summary.questions_with_unknown;
  }
  const auto n = static_cast<double>(summary.questions);
  summary.accuracy /= n;
  summary.mean_generated_tokens /= n;
  summary.mean_latent_thoughts /= n;
  summary.mean_flops /= n;
  summary.mean_latency_seconds /= n;
  summary.mean_layers /= n;
  summary.deepened /= n;
  return summary;
}

EvalSummary evaluate_with_thought_control(Llama& model, const Tokenizer& tokenizer, const SpecialTokenIds& special,
                                          const std::vector<Example>& examples, const std::vector<int64_t>& latent_thoughts,
                                          EvalOptions options, const ThoughtControlRun& run) {
  if (run.control == ThoughtControl::kNone) throw std::invalid_argument("evaluate_with_thought_control: no control given");
  if (options.mode != TrainingMode::kCoconut)
    throw std::invalid_argument(std::string("thought controls replace continuous thoughts: coconut mode only, not ") +
                                training_mode_name(options.mode));
  if (!run.calibration.empty() && run.control != ThoughtControl::kMean)
    throw std::invalid_argument("a calibration set gives the mean thoughts: control mean only");
  if (run.calibration.size() != run.calibration_thoughts.size())
    throw std::invalid_argument("evaluate_with_thought_control: one thought count per calibration question is needed");
  options.replaced_thoughts = {};
  const bool own_mean = run.control == ThoughtControl::kMean && run.calibration.empty();
  options.record_thoughts = run.control == ThoughtControl::kShuffle || own_mean;
  const EvalSummary normal = evaluate(model, tokenizer, special, examples, latent_thoughts, options);

  ThoughtControlReport report;
  report.control = run.control;
  report.seed = run.seed;
  ThoughtReplacement replacement;
  replacement.control = run.control;
  replacement.seed = run.seed;
  if (run.control == ThoughtControl::kShuffle)
    for (size_t donor : thought_donors(latent_thoughts, run.seed)) replacement.donors.push_back(normal.predictions[donor].thought_inputs);
  if (run.control == ThoughtControl::kMean) {
    std::vector<torch::Tensor> recorded;
    if (own_mean) {
      for (const auto& prediction : normal.predictions) recorded.push_back(prediction.thought_inputs);
    } else {
      options.record_thoughts = true;
      for (const auto& prediction :
           evaluate(model, tokenizer, special, run.calibration, run.calibration_thoughts, options).predictions)
        recorded.push_back(prediction.thought_inputs);
    }
    replacement.mean_thoughts = mean_of_thoughts(recorded);
    report.mean_over_questions = recorded.size();
  }
  options.record_thoughts = false;
  options.replaced_thoughts = replacement;
  EvalSummary controlled = evaluate(model, tokenizer, special, examples, latent_thoughts, options);

  std::vector<bool> controlled_correct;
  for (size_t i = 0; i < examples.size(); ++i) {
    report.uncontrolled_correct.push_back(normal.predictions[i].correct);
    controlled_correct.push_back(controlled.predictions[i].correct);
  }
  report.uncontrolled_accuracy = normal.accuracy;
  report.test = mcnemar_exact(report.uncontrolled_correct, controlled_correct);
  controlled.thought_control = std::move(report);
  return controlled;
}

}  // namespace coconut
