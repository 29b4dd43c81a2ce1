// Redundancy scores of layers and attention heads, measured on batches of reasoning sequences
// (any training mode; Coconut batches run the latent forward, so continuous thoughts are scored
// with the states the model really feeds back).
//
// Residual stream: x_0 = the input of layer 0 (embeddings), x_l = the input of layer l, and x_L =
// the last layer's output *before* the final norm (the norm would rescale the state and bias the
// last block's distance).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "data/sequences.h"
#include "model/llama.h"

namespace coconut {

enum class ScorePositions {
  kLastToken,  // each row's last real token (Gromov et al.)
  kLatents,    // the columns of the continuous thoughts (Coconut batches only)
};
ScorePositions score_positions_from_name(const std::string& name);  // "last" | "latents"

// L + 1 residual states [B, T, D] of one batch (no gradients).
std::vector<torch::Tensor> residual_stream(Llama& model, const Batch& batch, torch::Device device);

// Angular distance of Gromov et al. between the states at depth l and l + n:
// d(l, n) = arccos(cos(x_l, x_{l+n})) / pi, averaged over the chosen positions of every sample.
// Returns [L, L] float64 with entry [n - 1][l] for blocks of n layers starting at l (blocks that
// start at layer 0 included); NaN where l + n > L.
torch::Tensor angular_distances(Llama& model, const std::vector<Batch>& batches, ScorePositions positions,
                                torch::Device device);

// ShortGPT block influence of each layer: 1 - mean cos(x_l, x_{l+1}) over every real token. [L] float64.
torch::Tensor block_influence(Llama& model, const std::vector<Batch>& batches, torch::Device device);

// Mean next-token loss over the batches (each batch weighted by its labelled tokens).
double mean_loss(Llama& model, const std::vector<Batch>& batches, torch::Device device,
                 const ForwardOptions& model_options = {});

// Michel et al. head importance: with head masks xi (all ones), I_h = sum over batches of
// |dL/dxi_h| (batch size 1 gives the paper's per-example expectation, up to a constant).
// Per KV group, the same with one mask per group (the gradient summed over its query heads
// before the absolute value). heads [L, H_max], groups [L, G_max], float64; 0 where a layer has
// fewer heads.
struct HeadImportance {
  torch::Tensor heads;
  torch::Tensor groups;
};
HeadImportance head_gradient_importance(Llama& model, const std::vector<Batch>& batches, torch::Device device);

// The loss with each single query head masked out: [L, H_max] float64 (NaN where a layer has
// fewer heads); with `whole_groups`, each KV group's query heads together: [L, G_max].
torch::Tensor head_ablation_losses(Llama& model, const std::vector<Batch>& batches, torch::Device device,
                                   bool whole_groups = false);

// Importance of every MLP channel (the input of down_proj, a = silu(gate) * up), [L, F_max]
// float64, larger = more important, 0 where a layer is narrower:
//   "activation" (Minitron, Muralidharan et al. 2024): per sequence the mean of |a_c| over its real
//     tokens, then the L2 norm over sequences (their best aggregation for width);
//   "wanda" (Wanda-sp, the structured Wanda of An et al. 2024): ||a_c||_2 over every real token
//     times sum_i |W_down[i, c]|, the channel's weights scaled by its input's norm;
//   "taylor": |dL/dm_c|, the first-order estimate of the loss change when channel c's activation
//     is masked out (m_c: 1 -> 0), over the labelled tokens of all the batches (each batch's mean
//     loss weighted by its labelled tokens); it equals LLM-Pruner's (Ma et al. 2023) first-order
//     score of the channel's down_proj column.
torch::Tensor mlp_channel_importance(Llama& model, const std::vector<Batch>& batches, torch::Device device,
                                     const std::string& metric);

}  // namespace coconut
