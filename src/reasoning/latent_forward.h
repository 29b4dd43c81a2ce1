// The Coconut latent forward: a continuous thought is the last hidden state (after the final
// norm) at the previous position, fed back as the next input embedding.
//
// Shapes: B batch, T columns, D width, n latent thoughts. Rows are left-padded so that the n
// latent columns [first_latent, first_latent + n) are the same in every row.
//
// n thoughts need n + 1 sequential passes; with a growing KV cache each pass runs only its new
// columns, so the whole step costs about one teacher-forced pass (plus n small calls), and the
// cache stays in the autograd graph so gradients flow through the chain of thoughts.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "model/llama.h"

namespace coconut {

struct LatentBatch {
  torch::Tensor embeddings;      // [B, T, D] token embeddings (latent columns hold anything)
  torch::Tensor positions;       // [B, T] int64
  torch::Tensor attention_mask;  // [B, T] 1 = real, 0 = padding; undefined = no padding
  int64_t first_latent = 0;      // column of the first latent thought
  int64_t latent_count = 0;      // n
  // Latent bottleneck: [B] bool, undefined = none. In the rows where it is true, the columns after
  // the thoughts see no column before <bot> (first_latent - 1): what they need of the question must
  // come through the thoughts, which saw it. The thoughts themselves see everything.
  torch::Tensor bottleneck_rows;
  // Applied to every pass: head_mask, skip_layers, return_residuals, the router settings (the
  // attention mask of each pass comes from `attention_mask` above; route_mask [B, T] is cut per pass).
  // first_output_column c: the output starts at column min(c, first_latent - 1) (the column before
  // the first thought is always there: it makes the first thought); each pass's last layer runs
  // only the columns of it that are asked for.
  ForwardOptions options;
};

struct LatentForwardResult {
  torch::Tensor hidden;          // [B, T - first_column, D] after the final norm, the columns from first_column
  int64_t first_column = 0;      // min(options.first_output_column, first_latent - 1)
  torch::Tensor latent_inputs;   // [B, n, D] the fed-back states actually used as inputs
  std::vector<torch::Tensor> residuals;  // L + 1 x [B, T, D] with options.return_residuals
  torch::Tensor router_probabilities;    // [B, T, L] with options.router_straight_through
};

// Cached implementation (the one training and evaluation use).
LatentForwardResult latent_forward(Llama& model, const LatentBatch& batch);

// Reference implementation for tests: re-runs the whole prefix for every thought.
LatentForwardResult latent_forward_naive(Llama& model, const LatentBatch& batch);

}  // namespace coconut
