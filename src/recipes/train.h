// `coconut train`: one readable procedure for every training mode (CoT, no-CoT, Coconut and its
// ablations, pause tokens, stepwise internalisation).
//
//   setup     data -> tokenizer (+ reasoning markers) -> model (checkpoint or fresh) -> resume state
//   each epoch: stage from the curriculum -> sequences -> batches bucketed by latent count
//               -> micro-steps (latent forward when there are thoughts) -> AdamW steps
//               -> validation (loss + greedy accuracy) -> checkpoint
//   finish    <output_dir>/final: an HF folder with tokenizer.json and coconut.json (how to prompt it)
//
// Output folder: train_config.json, metrics.jsonl (one JSON object per logged step / validation),
// checkpoint-<step>/ (HF folder + optimizer.pt + trainer_state.json), last_checkpoint (its name).
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <ostream>
#include <stdexcept>
#include <string>

#include "reasoning/layout.h"
#include "recipes/train_config.h"

namespace coconut {

// The loss or the gradient norm became NaN/inf; nothing was saved after the last good checkpoint.
class TrainingDiverged : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TrainSummary {
  int64_t steps = 0;            // optimizer steps done in total (across resumes)
  int64_t epochs_completed = 0;
  bool stopped_at_max_steps = false;
  std::string final_dir;        // empty when stopped early by max_steps
  nlohmann::json last_validation = nlohmann::json::object();
  double seconds = 0;           // this invocation
};

TrainSummary train(const TrainConfig& config, std::ostream& progress);

// Stochastic depth's mask for one micro-batch of `rows` examples of a `layers`-layer model: [rows,
// layers] bool (true = the example runs the layer), drawn from the device's default generator.
// layer_drop: layer l dropped with probability layer_drop * l / (L - 1) ("rising") or layer_drop
// for every layer but the first ("flat"); then, with probability prefix_drop, the example runs only
// a prefix: its layers from K on dropped as well, K uniform in [prefix_min_layers (0: ceil(L / 2)),
// L - 1]; then, with probability nested_drop, the first k layers of nested_drop_order dropped too,
// k uniform in [1, its length] (std::invalid_argument for a layer the model lacks). All ones when
// all three are 0.
torch::Tensor stochastic_depth_keep(int64_t rows, int64_t layers, const TrainConfig& config, torch::Device device);


}  // namespace coconut
