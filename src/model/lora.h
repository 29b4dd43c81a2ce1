// LoRA (Hu et al. 2021) on the projections of a Llama, for parameter-efficient healing.
//
// attach_lora adds, to every targeted projection W [N, K] of every layer, A [r, K] (Kaiming-uniform,
// as PEFT initialises it) and B [N, r] (zeros, so the model starts unchanged); the forward adds
// (alpha / r) * x A^T B^T. Every other parameter is frozen. merge_lora is a separate pass that builds
// a new, plain model with W + (alpha / r) B A, which is what checkpoints hold.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "model/llama.h"

namespace coconut {

struct LoraOptions {
  int64_t rank = 8;
  double alpha = 16;
  // Projection names: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj.
  std::vector<std::string> targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
};

const std::vector<std::string>& lora_target_names();  // the seven projection names, in layer order

// "layers.3.self_attn.q_proj" (or "layers.3.mlp.up_proj"): a projection's module path, the prefix
// of its weight's name and of its adapters' names in lora_state.
std::string lora_module_path(int64_t layer, const std::string& projection);

// Throws std::invalid_argument naming the problem (rank < 1, unknown or repeated target).
void validate_lora_options(const LoraOptions& options);

// Adds adapters (on the model's device, float32) and freezes every base parameter. The adapter
// parameters are then the model's only trainable ones; A is drawn from `seed`.
void attach_lora(Llama& model, const LoraOptions& options, uint64_t seed);

bool has_lora(const Llama& model);

// The adapters by parameter name ("layers.3.self_attn.q_proj.lora_A", ".lora_B"), for checkpoints.
std::map<std::string, torch::Tensor> lora_state(const Llama& model);
// Copies saved adapter values into an attached model; names and shapes must match exactly.
void load_lora_state(Llama& model, const std::map<std::string, torch::Tensor>& state, const std::string& source);

// Makes these rows of the embedding table (and so of a tied head) train beside the adapters, as
// PEFT's trainable_token_indices does: the table requires grad and a hook zeroes every other row's
// gradient. Give the table no weight decay, and AdamW leaves the other rows bit-exact (zero
// moments, zero update). For new tokens (reasoning markers) a LoRA run must learn.
void train_token_rows(Llama& model, const std::vector<int64_t>& ids);

// Sets rows `ids` of the embedding table (the head's too when tied) to `rows` [n, D].
void set_token_rows(Llama& model, const std::vector<int64_t>& ids, const torch::Tensor& rows);

// A new model with `model`'s weights (its adapters left out; `model` is untouched) where every
// projection named in `factors` ("<module path>.lora_A" [r, K] and ".lora_B" [N, r]) becomes
// W + scale * B A, computed in float32. Factors for a module or a shape the model lacks are errors
// naming `source`.
Llama with_low_rank_updates(const Llama& model, const std::map<std::string, torch::Tensor>& factors, double scale,
                            const std::string& source);

// A new model without adapters whose weights are W + scale * B A (the original is untouched),
// every parameter trainable.
Llama merge_lora(const Llama& model);

}  // namespace coconut
