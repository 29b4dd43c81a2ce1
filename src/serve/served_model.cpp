#include "serve/served_model.h"

#include <cmath>
#include <filesystem>
#include <random>

#include "eval/cost.h"
#include "io/hf_checkpoint.h"
#include "model/quantized_linear.h"
#include "io/peft_adapter.h"
#include "reasoning/evaluate.h"
#include "reasoning/special_tokens.h"
#include "reasoning/layout.h"
#include "recipes/evaluate_model.h"
#include "text/hf_tokenizer.h"

namespace coconut::serve {
namespace {

RequestError bad(const std::string& param, const std::string& message) { return RequestError(400, param, message); }

}  // namespace

std::string folder_id(const std::string& folder) {
  auto path = std::filesystem::absolute(folder).lexically_normal();  // "x/", "." and "a/./b" end in a name
  if (!path.has_filename()) path = path.parent_path();                // "/work/x/" -> "/work/x"
  return path.filename().string();
}

std::string served_model_id(const std::string& model_dir, const std::string& adapter_dir) {
  return folder_id(adapter_dir.empty() ? model_dir : adapter_dir);
}

ServedModel load_served_model(const std::string& model_dir, const std::string& adapter_dir, std::optional<torch::ScalarType> dtype,
                              torch::Device device, WeightFormat weights) {
  ServedModel served;
  served.id = served_model_id(model_dir, adapter_dir);
  served.base = folder_id(model_dir);
  if (!adapter_dir.empty()) served.adapter = folder_id(adapter_dir);
  served.model = load_model_variant(model_dir, adapter_dir, dtype, device, {}, weights);
  const std::string tokenizer_path = folder_with(model_dir, adapter_dir, "tokenizer.json") + "/tokenizer.json";
  if (!std::filesystem::exists(tokenizer_path)) throw std::invalid_argument(tokenizer_path + ": not found; serve needs the model's tokenizer");
  served.tokenizer = HfTokenizer::load(tokenizer_path);
  served.special = find_special_tokens(*served.tokenizer, served.model->config());
  const ReasoningSettings settings = load_reasoning_settings(folder_with(model_dir, adapter_dir, "coconut.json"));
  served.mode = training_mode_from_name(settings.mode);
  served.latent_bottleneck = settings.answer_through_thoughts;
  if (settings.depth_cascade.active()) {
    const std::string where = folder_with(model_dir, adapter_dir, "coconut.json") + "/coconut.json: depth_cascade";
    check_depth_cascade(settings.depth_cascade, served.model->config().num_hidden_layers, where);
    if (served.model->config().depth_router)
      throw std::invalid_argument(where + ": a depth cascade runs whole prefixes of the layers; this model has a depth router");
    served.cascade = settings.depth_cascade;
  }
  require_markers(served.special, served.mode, tokenizer_path);
  if (served.mode == TrainingMode::kCoconut || served.mode == TrainingMode::kPauseAsThought)
    served.default_latent_thoughts = settings.trained_latent_thoughts();
  served.pause_tokens = settings.pause_tokens;
  served.chat = load_chat_template(folder_with(model_dir, adapter_dir, "tokenizer_config.json"));
  return served;
}

std::vector<int64_t> prompt_tokens(const ServedModel& served, const CompletionRequest::Prompt& prompt) {
  if (prompt.text) {  // as the model was trained: BOS from the config first
    std::vector<int64_t> ids;
    if (served.special.bos) ids.push_back(*served.special.bos);
    const auto encoded = served.tokenizer->encode(*prompt.text);
    ids.insert(ids.end(), encoded.begin(), encoded.end());
    return ids;
  }
  const int64_t vocabulary = served.model->config().vocab_size;
  for (int64_t id : prompt.ids)
    if (id >= vocabulary)
      throw bad("prompt", "token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocabulary) + ")");
  return prompt.ids;
}

int64_t request_thoughts(const ServedModel& served, const CompletionRequest& request, bool pauses_think) {
  const bool thinks = served.mode == TrainingMode::kCoconut || (pauses_think && served.mode == TrainingMode::kPauseAsThought);
  const int64_t thoughts = request.latent_thoughts.value_or(thinks ? served.default_latent_thoughts : 0);
  if (thoughts > 0 && !thinks)
    throw bad("latent_thoughts", "this model was trained in mode '" + training_mode_name(served.mode) +
                                     "' and has no continuous thoughts; leave 'latent_thoughts' out or set it to 0");
  return thoughts;
}

GenerationRequest prepare_generation(const ServedModel& served, const CompletionRequest& request, int64_t context) {
  const LlamaConfig& config = served.model->config();
  // The prompt's tokens (a chat rendered by the model's template).
  TokenizedExample example;
  if (request.chat) {
    // The template writes every marker itself (Llama 3's BOS included); special tokens parsed.
    if (!served.chat.chat) throw RequestError(400, "messages", "the model '" + served.id + "' cannot chat: " + served.chat.problem);
    example.question = served.tokenizer->encode(served.chat.chat->render(request.messages, served.chat.bos_text));
  } else {
    example.question = prompt_tokens(served, {request.prompt_text, request.prompt_ids});
  }
  if (example.question.empty()) throw bad("prompt", "'prompt' is empty (and the model has no BOS token to start from)");

  // Thoughts: the request's count or the model's default, in the layout the model was trained for.
  const int64_t thoughts = request_thoughts(served, request, /*pauses_think=*/true);
  const EvalPrompt prompt = build_eval_prompt(example, served.mode, thoughts, served.pause_tokens, served.special);

  const bool routed = config.depth_router;
  // Without a router a budget is a prefix: the request's first floor(budget) layers run for everything.
  if (request.depth_budget && !routed && (*request.depth_budget < 1 || *request.depth_budget >= static_cast<double>(config.num_hidden_layers + 1)))
    throw bad("depth_budget", "'depth_budget' must be in [1, " + std::to_string(config.num_hidden_layers) +
                                  "] for this model: without a depth router the request runs its first floor(depth_budget) layers, "
                                  "prompt included");
  if (request.router_threshold && !routed)
    throw bad("router_threshold", "this model has no depth router; leave 'router_threshold' out");
  // The depth cascade: the request's, else the model's unless the request asks for a depth budget.
  DepthCascade cascade = request.depth_budget ? DepthCascade{} : served.cascade;
  if (request.depth_cascade) {
    cascade = *request.depth_cascade;
    if (cascade.active() && routed)
      throw bad("depth_cascade", "this model has a depth router; a depth cascade runs whole prefixes of the layers: leave "
                                 "'depth_cascade' out");
    try {
      check_depth_cascade(cascade, config.num_hidden_layers, "'depth_cascade'");
    } catch (const std::invalid_argument& error) {
      throw bad("depth_cascade", error.what());
    }
  }
  if (request.depth_budget && routed &&
      (*request.depth_budget < static_cast<double>(config.depth_router_first_layer) ||
       *request.depth_budget > static_cast<double>(config.num_hidden_layers)))
    throw bad("depth_budget", "'depth_budget' must be in [" + std::to_string(config.depth_router_first_layer) + ", " +
                                  std::to_string(config.num_hidden_layers) + "] layers per position for this model");

  GenerationRequest generation;
  generation.prompt = prompt.prompt;
  generation.latent_thoughts = prompt.latent_thoughts;
  generation.after_latents = prompt.after_latents;
  generation.latent_bottleneck = served.latent_bottleneck && prompt.latent_thoughts > 0;
  generation.max_new_tokens = request.max_tokens;
  generation.sampling.temperature = request.temperature;
  generation.sampling.top_p = request.top_p;
  generation.sampling.seed = request.seed ? static_cast<uint64_t>(*request.seed) : std::random_device{}();
  generation.stop_ids = config.eos_token_ids;  // EOS and any end-of-turn token the config lists
  if (request.router_threshold) generation.router_threshold = *request.router_threshold;
  if (request.depth_budget && routed) generation.depth_budget = *request.depth_budget;
  if (request.depth_budget && !routed) generation.layers = static_cast<int64_t>(std::floor(*request.depth_budget));
  generation.cascade = cascade;
  if (request.logprobs) {
    if (cascade.active())
      throw bad("logprobs", "a depth cascade holds its answers back until one is kept: 'logprobs' is not served with it (set "
                            "'depth_cascade' to \"off\")");
    generation.top_logprobs = *request.logprobs;
  }

  const auto prompt_positions = static_cast<int64_t>(generation.prompt.size());
  const int64_t thought_positions = generation.latent_thoughts + static_cast<int64_t>(generation.after_latents.size());
  if (prompt_positions + thought_positions >= context)
    throw bad("prompt", "the prompt is " + std::to_string(prompt_positions) + " tokens (+" + std::to_string(thought_positions) +
                            " thought positions), longer than the context of " + std::to_string(context) + " positions");
  if (prompt_positions + thought_positions + generation.max_new_tokens > context)
    throw bad("max_tokens", "the prompt (" + std::to_string(prompt_positions) + " tokens, +" + std::to_string(thought_positions) +
                                " thought positions) and max_tokens " + std::to_string(generation.max_new_tokens) +
                                " exceed the context of " + std::to_string(context) + " positions");
  return generation;
}

RequestCost request_cost(const LlamaConfig& config, int64_t prompt_tokens, int64_t completion_tokens,
                         int64_t latent_thoughts, const std::vector<AdaptivePass>& passes, int64_t prefix_layers) {
  RequestCost cost;
  cost.flops = generation_flops(config, prompt_tokens, completion_tokens, latent_thoughts, prefix_layers).total();
  cost.layers_per_position = static_cast<double>(prefix_layers > 0 ? prefix_layers : config.num_hidden_layers);
  if (passes.empty()) return cost;
  double layers = 0;
  for (const auto& pass : passes) {
    for (int64_t layer : pass.skipped_layers) cost.flops -= skipped_layer_savings(config, pass.context, layer);
    cost.flops += router_gate_flops(config, config.num_hidden_layers - config.depth_router_first_layer);
    layers += static_cast<double>(pass.layers_run);
  }
  cost.layers_per_position = layers / static_cast<double>(passes.size());
  return cost;
}

RequestCost cascade_request_cost(const LlamaConfig& config, const DepthCascade& cascade, int64_t prompt_tokens, int64_t prompt_only,
                                 int64_t latent_thoughts, const std::vector<CascadeLevelRun>& left, int64_t completion_tokens) {
  RequestCost cost;
  const size_t kept = std::min(left.size(), cascade.levels() - 1);
  for (size_t level = 0; level < left.size(); ++level)
    cost.flops += cascade_level_cost(config, cascade, level, prompt_tokens, prompt_only, left[level].tokens, latent_thoughts);
  cost.flops += cascade_level_cost(config, cascade, kept, prompt_tokens, prompt_only, completion_tokens, latent_thoughts);
  cost.layers_per_position = static_cast<double>(cascade.level_layers(kept, config.num_hidden_layers));
  return cost;
}

}  // namespace coconut::serve
