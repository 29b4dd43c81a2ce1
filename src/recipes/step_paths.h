// The paths of a training step that compute the same thing, chosen per run, and their comparison
// inside a run: a lease measures a new GPU path in the training job's own steps before it becomes
// the default there (issue 70), with no probe of its own.
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "model/llama.h"
#include "reasoning/training_loss.h"

namespace coconut {

struct StepPaths {
  bool cut_last_layer = false;     // the last layer runs only the columns the loss reads
  bool frozen_base_bf16 = false;   // LoRA's frozen projections in bf16 (frozen_projection_weights)
  bool chunked_head_loss = false;  // the head's cross-entropy without its logits (head_cross_entropy)
  std::string name() const;        // "old", or the new paths joined by "+": "cut", "bf16-base", "chunked-loss"
  LossPaths loss_paths() const { return LossPaths{cut_last_layer, chunked_head_loss}; }
};

// Optimizer steps alternating over `arms` (the first the old paths), one round of each arm
// unmeasured, then `rounds` measured: a step's arm is arm(), and finished_step() records its time
// and tokens. Alternating a step at a time shares the drift of a run (stage, lengths, a neighbour
// on the device) between the arms.
class PathComparison {
 public:
  PathComparison(std::vector<StepPaths> arms, int64_t rounds);
  bool active() const { return step_ < total_steps(); }
  const StepPaths& arm() const { return arms_[static_cast<size_t>(step_) % arms_.size()]; }
  // `peak_bytes`: the most device memory the step allocated (0 where it is not measured).
  void finished_step(double seconds, int64_t tokens, int64_t peak_bytes = 0);
  // Each arm's tokens/s over its measured steps (their tokens over their time), its ratio to the old
  // paths', and its largest step's peak memory: {"event": "path_comparison", "arms": [{"paths",
  // "steps", "tokens_per_second", "ratio", "peak_gib"}]} (peak_gib 0 where not measured).
  nlohmann::json report() const;
  std::string summary() const;  // one line for the progress

 private:
  int64_t total_steps() const { return static_cast<int64_t>(arms_.size()) * (rounds_ + 1); }
  std::vector<StepPaths> arms_;
  int64_t rounds_;
  int64_t step_ = 0;
  std::vector<double> seconds_;
  std::vector<int64_t> tokens_, steps_, peak_bytes_;
};

// The arms a run compares: the old paths, each new one that applies alone, then all of them
// (frozen_base_bf16 applies under LoRA with bf16 autocast; chunked_head_loss where `chunked_loss`:
// not beside a distillation teacher, which reads the logits).
std::vector<StepPaths> comparison_arms(bool lora_bf16, bool chunked_loss);

}  // namespace coconut
