// The model a server runs, loaded once: weights, tokenizer, the prompt layout it was trained for
// (coconut.json), and how a validated request becomes token ids for the scheduler.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/sequences.h"
#include "model/generate.h"
#include "model/llama.h"
#include "model/quantized_linear.h"
#include "reasoning/layout.h"
#include "serve/completion_request.h"
#include "serve/scheduler.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace coconut::serve {

struct ServedModel {
  std::string id;  // what /v1/models lists and answers name: served_model_id
  std::string base, adapter;  // the folders' names (adapter: empty without one), listed beside it
  Llama model{nullptr};
  std::unique_ptr<Tokenizer> tokenizer;
  SpecialTokenIds special;
  TrainingMode mode = TrainingMode::kCot;  // the prompt layout (coconut.json; cot without one)
  int64_t default_latent_thoughts = 0;     // Coconut: thoughts at the trained stage
  int64_t pause_tokens = 0;                // pause mode
  bool latent_bottleneck = false;          // coconut.json's answer_through_thoughts
  DepthCascade cascade;                    // coconut.json's depth_cascade: what a request runs by default
  // tokenizer_config.json's chat template, when ChatTemplate renders it; otherwise its `problem`
  // says why /v1/chat/completions cannot serve this model.
  ModelChatTemplate chat;
};

// A folder's name as a model id: its last path component ("models/x/" -> "x"; "." -> the current
// folder's name). A model served with an adapter is named after the adapter, what was trained.
std::string folder_id(const std::string& folder);
std::string served_model_id(const std::string& model_dir, const std::string& adapter_dir);

// A completion prompt's tokens: a text after BOS (where the model has one), or the ids as given,
// each checked to be in the vocabulary (a RequestError naming 'prompt').
std::vector<int64_t> prompt_tokens(const ServedModel& served, const CompletionRequest::Prompt& prompt);

// Reads DIR (config.json, weights, tokenizer.json, coconut.json, tokenizer_config.json).
// `adapter_dir`: a PEFT adapter folder merged in at load (empty: none); its tokenizer and settings
// files, where it has them, replace the base's.
// `weights`: q8_0 quantizes the projections at load (model/quantize_model.h).
ServedModel load_served_model(const std::string& model_dir, const std::string& adapter_dir, std::optional<torch::ScalarType> dtype,
                              torch::Device device, WeightFormat weights = WeightFormat::kDense);

// The thoughts a request runs: its `latent_thoughts`, else the model's default. A generation
// thinks in coconut and pause_as_thought mode (`pauses_think`); scoring (echo) in coconut mode
// alone, as it places no pause tokens. A 400 RequestError naming 'latent_thoughts' when the request
// asks a model that does not think for some.
int64_t request_thoughts(const ServedModel& served, const CompletionRequest& request, bool pauses_think);

// The token ids and settings of a request, checked against the model and the slot context
// (`context` columns): a 400 RequestError names what does not fit.
GenerationRequest prepare_generation(const ServedModel& served, const CompletionRequest& request, int64_t context);

// What a finished request cost: the exact accounting of eval/cost.h (prompt prefill with the
// closing tokens, the thoughts, completion tokens), less what skipped layers saved, plus the
// router's gates. `passes` are the routed one-position passes (empty without a router).
struct RequestCost {
  double flops = 0;
  double layers_per_position = 0;  // mean over the thoughts and fed-back tokens
};
// `prefix_layers` > 0: a request that ran only the model's first layers (GenerationRequest::layers).
RequestCost request_cost(const LlamaConfig& config, int64_t prompt_tokens, int64_t completion_tokens,
                         int64_t latent_thoughts, const std::vector<AdaptivePass>& passes, int64_t prefix_layers = 0);
// A depth cascade's request, as eval counts it (docs/adaptive-depth.md): each level run, the ones
// left (`left`) and then the kept one (the next level, `completion_tokens`), pays its thoughts and
// answer at its depth, and the prompt's layers from the previous level's depth up (a layer-set
// level: the whole question without its removed layers). `prompt_tokens` counts the prompt and the
// tokens after the thoughts; `prompt_only` the prompt alone (what a deeper level continues from).
// layers_per_position: the kept level's layers.
RequestCost cascade_request_cost(const LlamaConfig& config, const DepthCascade& cascade, int64_t prompt_tokens, int64_t prompt_only,
                                 int64_t latent_thoughts, const std::vector<CascadeLevelRun>& left, int64_t completion_tokens);

}  // namespace coconut::serve
