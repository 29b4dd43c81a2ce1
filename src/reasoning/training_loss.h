// The training loss of one collated batch in any mode: the latent forward when the batch has
// continuous thoughts, a plain forward otherwise; next-token cross-entropy on labelled tokens only
// (the head runs only where a label exists).
#pragma once

#include <torch/torch.h>

#include <optional>
#include <vector>

#include "data/sequences.h"
#include "model/llama.h"

namespace coconut {

struct TrainingLoss {
  torch::Tensor loss;           // scalar, mean over labelled tokens
  torch::Tensor logits;         // [N, V] float32 at the N labelled positions (row-major order); none chunked
  int64_t labelled = 0;         // tokens with a loss
  // monitor_norms: mean L2 norms of the fed-back hidden states (undefined without thoughts) and of
  // the batch's token embeddings, 0-dim float32 on the device (reading one is a host sync on a GPU:
  // the training loop reads them at log steps only).
  torch::Tensor latent_norm;
  torch::Tensor embedding_norm;
  // Depth router training (model_options.router_straight_through on a model with a router): the
  // mean gate probability over routed positions and layers, i.e. the expected fraction of layers
  // run (with grad, for the compute penalty); undefined otherwise. (A model with a router routes
  // the same positions with hard decisions when router_threshold > 0, the default.)
  torch::Tensor router_fraction;
  torch::Tensor thoughts;       // [B, n, D] the continuous thoughts fed back (in the graph); undefined without
  torch::Tensor thought_sources;  // [B, n, D] the last hidden states they were made of (before
                                  // thought_input's rescaling: what the head reads); undefined without
};

// The positions a depth router decides for in a training batch: those that generation runs one at
// a time (continuous thoughts and the tokens the model generates: every labelled column), not the
// prompt or the <eot> marker. [B, T] bool on `device`.
torch::Tensor routed_positions(const Batch& batch, torch::Device device);

// `monitor_norms` also measures the fed-back hidden states against the token embeddings (the
// known instability of continuous thoughts: their scale drifts away from the embeddings').
// Paths of the loss that compute the same thing (recipes/step_paths.h chooses them for a run).
struct LossPaths {
  // The last layer runs only the columns the loss reads; unset: as cuts_last_layer(device) says.
  std::optional<bool> cut_last_layer;
  // The head's cross-entropy a chunk of rows at a time (model/head_cross_entropy.h), its [N, V]
  // logits never kept: TrainingLoss::logits is then undefined. Where the head is dense.
  bool chunked_head_loss = false;
};

// `model_options` reaches every forward pass (head masks and skipped layers of pruning scores).
TrainingLoss training_loss(Llama& model, const Batch& batch, torch::Device device, bool monitor_norms,
                           const ForwardOptions& model_options = {}, const LossPaths& paths = {});

// Knowledge distillation (Hinton et al. 2015) at the same labelled positions: T^2 times the mean
// over positions of KL(softmax(teacher / T) || softmax(student / T)); T^2 keeps its gradient's
// scale independent of T. Logits [N, V] (training_loss's), the teacher's without gradient.
torch::Tensor distillation_loss(const torch::Tensor& student_logits, const torch::Tensor& teacher_logits, double temperature);

// Step supervision of continuous thoughts (the idea of SIM-CoT, "Supervised Implicit
// Chain-of-Thought", 2025, with the model itself as the decoder): each group of c thoughts, read as
// input embeddings, must decode the step it stands for. For every row and replaced step i, one
// extra sequence [thoughts i*c .. i*c+c-1, step tokens but the last] predicts the step's tokens;
// the mean cross-entropy over all of them. The gradient reaches the thoughts, hence the chain that
// made them. Undefined when the batch has no latent steps. `thoughts` [B, n, D] from training_loss.
torch::Tensor thought_step_loss(Llama& model, const torch::Tensor& thoughts, const Batch& batch, torch::Device device);

// Reachable-set supervision of continuous thoughts on graph reachability (ProsQA): thought j, read
// by the LM head, must spread its probability evenly over the nodes within h = 1 + j / c edges of
// the root (Batch::latent_reachable): KL(uniform over the set || softmax(logits)) =
// -(1/|S|) sum_{v in S} log p_v - log |S|, 0 when it holds exactly the set; the mean over every
// thought of every row that has a set. What a thought is asked to hold is the breadth-first
// search's state, every node reached so far at once (in superposition), not one path: the
// representation Zhu et al. 2025 ("Reasoning by Superposition", arXiv 2505.12514) prove a two-layer
// model can use. Their follow-up ("Emergence of Superposition", arXiv 2509.23365, appendix E.2)
// supervises with -log sum_{v in S} p_v instead, which one node that is in every set (the first
// hop's) satisfies alone: measured here, a model did exactly that and its answers stayed at chance.
// `sources` [B, n, D] from training_loss (thought_sources). `weights_by_thought` scales thought j's
// divergence by weights[min(j, size - 1)] before the mean (empty or {1}: unweighted). Undefined
// when no row has sets.
torch::Tensor thought_reachable_loss(Llama& model, const torch::Tensor& sources, const Batch& batch, torch::Device device,
                                     const std::vector<double>& weights_by_thought = {});

}  // namespace coconut
