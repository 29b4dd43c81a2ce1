// The training loss of one collated batch in any mode: the latent forward when the batch has
// continuous thoughts, a plain forward otherwise; next-token cross-entropy on labelled tokens only
// (the head runs only where a label exists).
#pragma once

#include <torch/torch.h>

#include "data/sequences.h"
#include "model/llama.h"

namespace coconut {

struct TrainingLoss {
  torch::Tensor loss;           // scalar, mean over labelled tokens
  torch::Tensor logits;         // [N, V] float32 at the N labelled positions (row-major order)
  int64_t tokens = 0;           // real tokens in the batch
  int64_t labelled = 0;         // tokens with a loss
  double latent_norm = 0;       // mean L2 norm of fed-back hidden states (0 without thoughts)
  double embedding_norm = 0;    // mean L2 norm of the batch's token embeddings
};

// `monitor_norms` also measures the fed-back hidden states against the token embeddings (the
// known instability of continuous thoughts: their scale drifts away from the embeddings').
// `model_options` reaches every forward pass (head masks and skipped layers of pruning scores).
TrainingLoss training_loss(Llama& model, const Batch& batch, torch::Device device, bool monitor_norms,
                           const ForwardOptions& model_options = {});

}  // namespace coconut
