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

// The projection weights of every layer that do not train (all seven, targeted or not, once
// attach_lora froze them). Under bf16 autocast a product casts a float32 weight afresh at every call
// unless it requires grad (autocast caches only the casts of leaves that train), so with LoRA every
// pass of a step made its own bf16 copy of the base and autograd kept each one: a Coconut step with n
// thoughts n + 2 copies. These weights set to bf16 (set_data) are used as they are: the same products,
// bit for bit, without the casts, the copies or the float32 values (TrainConfig::frozen_base_bf16).
std::vector<torch::Tensor> frozen_projection_weights(const Llama& model);

// A LoRA model's frozen projections held in float32 or bf16. While both are kept (a comparison),
// use() switches between them without a copy; keep_only() frees the other.
class FrozenBase {
 public:
  FrozenBase() = default;
  explicit FrozenBase(Llama& model);  // the weights as they are (float32), a bf16 copy beside them
  void use(bool bf16);
  void keep_only(bool bf16);

 private:
  std::vector<torch::Tensor> weights_, float32_, bfloat16_;
};

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
