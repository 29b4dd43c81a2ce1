#include "reasoning/training_loss.h"

#include "model/device.h"
#include "model/head_cross_entropy.h"
#include "reasoning/latent_forward.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace coconut {

torch::Tensor routed_positions(const Batch& batch, torch::Device device) {
  const int64_t columns = batch.ids.size(1);
  auto column = torch::arange(columns, torch::kInt64).view({1, columns});               // [1, T]
  auto labelled = batch.labels.ne(kIgnoreLabel);                                         // [B, T]
  // The first labelled column of each row (T when a row has none): [B] -> [B, 1]
  auto first = torch::where(labelled.any(1), labelled.to(torch::kInt64).argmax(1), torch::full_like(labelled.any(1), columns, torch::kInt64));
  auto routed = column >= first.view({-1, 1});                                           // [B, T]
  if (batch.latent_count > 0 && !batch.thoughts_are_pauses)  // pause tokens are prompt, not generated
    routed = routed.logical_or((column >= batch.first_latent).logical_and(column < batch.first_latent + batch.latent_count));
  return host_to_device(routed.logical_and(batch.attention_mask.to(torch::kBool)), device);
}

TrainingLoss training_loss(Llama& model, const Batch& batch, torch::Device device, bool monitor_norms,
                           const ForwardOptions& given_options, const LossPaths& paths) {
  ForwardOptions model_options = given_options;
  // A model with a router routes the positions generation would (hard decisions at the threshold, or
  // straight-through ones in training), so the loss is the loss of the model as it runs.
  const bool router = model->config().depth_router &&
                      (model_options.router_straight_through || model_options.depth.router_threshold > 0);
  if (router) model_options.route_mask = routed_positions(batch, device);
  // The batch's host tensors reach the device without a wait (model/device.h).
  auto ids = host_to_device(batch.ids, device), mask = host_to_device(batch.attention_mask, device),
       positions = host_to_device(batch.positions, device);
  auto embeddings = model->embed(ids);  // [B, T, D]
  TrainingLoss result;
  // Position t predicts label t + 1; only labelled targets pay for the head. Which positions those
  // are is read off the batch's labels on the host: a boolean index on the device would wait for
  // the device to count them (a host synchronisation in every step).
  const int64_t columns = batch.ids.size(1);
  const auto targets = batch.labels.narrow(1, 1, columns - 1);  // [B, T-1] host
  const auto selected = targets.ne(kIgnoreLabel);               // [B, T-1] host
  const auto coordinates = selected.nonzero();                  // [N, 2] (row, column), row-major
  // The forward's output is needed from the first column that predicts a label (or is the source
  // of a thought) on: the last layer skips the columns before it (a question's), where it does
  // (cuts_last_layer).
  int64_t first_needed = coordinates.size(0) > 0 ? coordinates.select(1, 1).min().item<int64_t>() : columns - 1;
  if (batch.latent_count > 0) first_needed = std::min(first_needed, batch.first_latent - 1);
  if (paths.cut_last_layer.value_or(cuts_last_layer(device))) model_options.first_output_column = std::max<int64_t>(first_needed, 0);
  torch::Tensor hidden;  // [B, T - first_column, D]: the columns from first_column
  int64_t first_column = model_options.first_output_column;
  torch::Tensor latent_inputs, router_probabilities;
  const bool padded = !batch.attention_mask.all().item<bool>();
  if (batch.latent_count > 0 && !batch.thoughts_are_pauses) {
    LatentBatch latent{embeddings, positions, padded ? mask : torch::Tensor(), batch.first_latent, batch.latent_count,
                       batch.bottleneck_rows.defined() ? host_to_device(batch.bottleneck_rows, device) : torch::Tensor(), model_options};
    auto forward = latent_forward(model, latent);
    hidden = forward.hidden;
    first_column = forward.first_column;
    latent_inputs = forward.latent_inputs;
    router_probabilities = forward.router_probabilities;
  } else {
    ForwardOptions options = model_options;
    if (padded) options.attention_mask = mask;
    auto forward = model->forward(embeddings, positions, nullptr, options);
    hidden = forward.hidden;
    router_probabilities = forward.router_probabilities;
  }
  if (router && router_probabilities.defined()) {
    // [B, T, L] -> mean over routed positions and layers
    const auto routed = model_options.route_mask.unsqueeze(-1).to(router_probabilities.scalar_type());
    result.router_fraction = (router_probabilities * routed).sum() /
                             (routed.sum() * static_cast<double>(router_probabilities.size(-1))).clamp_min(1.0);
  }
  const int64_t kept = hidden.size(1), width = hidden.size(2);
  const auto flat_positions =
      host_to_device(coordinates.select(1, 0) * kept + (coordinates.select(1, 1) - first_column), device);  // [N] into B*kept
  auto predicting = hidden.reshape({-1, width}).index_select(0, flat_positions);  // [B*kept, D] -> [N, D]
  const auto labels = host_to_device(targets.index({selected}), device);           // [N]
  if (paths.chunked_head_loss && predicting.size(0) > 0 && !model->output_quantized.defined()) {
    result.loss = head_cross_entropy(predicting, model->output_weight(), labels);
  } else {
    result.logits = model->logits(predicting);  // [N, V] float32
    result.loss = torch::nn::functional::cross_entropy(result.logits, labels);
  }
  result.labelled = predicting.size(0);
  if (monitor_norms) {
    torch::NoGradGuard no_grad;
    const auto real = host_to_device(batch.attention_mask.reshape({-1}).nonzero().squeeze(1), device);  // [R] into B*T
    result.embedding_norm = embeddings.reshape({-1, embeddings.size(2)}).index_select(0, real).to(torch::kFloat32).norm(2, -1).mean();
    if (latent_inputs.defined()) result.latent_norm = latent_inputs.to(torch::kFloat32).norm(2, -1).mean();
  }
  result.thoughts = latent_inputs;
  // The hidden state before each thought column: what Coconut feeds back into it; for pause tokens,
  // the same position, whose state only the supervision reads.
  if (batch.latent_count > 0) result.thought_sources = hidden.narrow(1, batch.first_latent - 1 - first_column, batch.latent_count);
  return result;
}

torch::Tensor distillation_loss(const torch::Tensor& student_logits, const torch::Tensor& teacher_logits, double temperature) {
  if (!(temperature > 0)) throw std::invalid_argument("distillation temperature must be positive");
  if (student_logits.sizes() != teacher_logits.sizes())
    throw std::invalid_argument("distillation: student and teacher logits differ in shape");
  const auto student_log_probs = torch::log_softmax(student_logits / temperature, -1);  // [N, V]
  const auto teacher_log_probs = torch::log_softmax(teacher_logits / temperature, -1);  // [N, V]
  const auto kl = (teacher_log_probs.exp() * (teacher_log_probs - student_log_probs)).sum(-1).mean();
  return temperature * temperature * kl;
}

torch::Tensor thought_step_loss(Llama& model, const torch::Tensor& thoughts, const Batch& batch, torch::Device device) {
  const int64_t c = batch.thoughts_per_step;
  std::vector<torch::Tensor> prefixes;            // per decoded step: [c, D]
  std::vector<const std::vector<int64_t>*> steps;  // its tokens
  int64_t longest = 0;
  for (size_t row = 0; row < batch.latent_steps.size(); ++row)
    for (size_t i = 0; i < batch.latent_steps[row].size(); ++i) {
      const auto& tokens = batch.latent_steps[row][i];
      if (tokens.empty()) continue;
      prefixes.push_back(thoughts[static_cast<int64_t>(row)].narrow(0, static_cast<int64_t>(i) * c, c));
      steps.push_back(&tokens);
      longest = std::max(longest, static_cast<int64_t>(tokens.size()));
    }
  if (steps.empty()) return torch::Tensor();
  // Right-padded: causal attention keeps the padding out of every real position.
  const auto count = static_cast<int64_t>(steps.size());
  const int64_t columns = c + longest - 1;
  auto inputs = torch::zeros({count, longest - 1}, torch::kInt64);       // step tokens but the last
  auto targets = torch::full({count, columns}, kIgnoreLabel, torch::kInt64);  // position t predicts targets[t]
  auto input_ids = inputs.accessor<int64_t, 2>();
  auto target_ids = targets.accessor<int64_t, 2>();
  for (int64_t k = 0; k < count; ++k) {
    const auto& tokens = *steps[static_cast<size_t>(k)];
    for (size_t j = 0; j < tokens.size(); ++j) {
      if (j + 1 < tokens.size()) input_ids[k][static_cast<int64_t>(j)] = tokens[j];
      target_ids[k][c - 1 + static_cast<int64_t>(j)] = tokens[j];
    }
  }
  auto embedded = torch::cat({torch::stack(prefixes), model->embed(inputs.to(device)).to(thoughts.scalar_type())}, 1);  // [K, c + L - 1, D]
  auto positions = torch::arange(columns, torch::TensorOptions().dtype(torch::kInt64).device(device)).expand({count, columns});
  auto hidden = model->forward(embedded, positions).hidden;  // [K, c + L - 1, D]
  targets = targets.to(device);
  auto selected = targets.ne(kIgnoreLabel);
  return torch::nn::functional::cross_entropy(model->logits(hidden.index({selected})), targets.index({selected}));
}

torch::Tensor thought_reachable_loss(Llama& model, const torch::Tensor& sources, const Batch& batch, torch::Device device,
                                     const std::vector<double>& weights_by_thought) {
  std::vector<int64_t> rows, thoughts;  // the (row, thought) pairs with a set
  for (size_t row = 0; row < batch.latent_reachable.size(); ++row)
    for (size_t j = 0; j < batch.latent_reachable[row].size(); ++j)
      if (!batch.latent_reachable[row][j].empty()) {
        rows.push_back(static_cast<int64_t>(row));
        thoughts.push_back(static_cast<int64_t>(j));
      }
  if (rows.empty()) return torch::Tensor();
  const auto count = static_cast<int64_t>(rows.size());
  auto picked = sources.index({torch::tensor(rows).to(device), torch::tensor(thoughts).to(device)});  // [K, D]
  auto log_probs = torch::log_softmax(model->logits(picked), -1);                                     // [K, V]
  auto members = torch::zeros({count, log_probs.size(1)}, torch::kBool);  // [K, V]
  auto member = members.accessor<bool, 2>();
  const int64_t vocabulary = log_probs.size(1);
  for (int64_t k = 0; k < count; ++k) {
    const auto& set = batch.latent_reachable[static_cast<size_t>(rows[static_cast<size_t>(k)])][static_cast<size_t>(thoughts[static_cast<size_t>(k)])];
    for (int64_t token : set) {
      if (token < 0 || token >= vocabulary)
        throw std::invalid_argument("thought_reachable_loss: node token " + std::to_string(token) +
                                    " is outside the model's vocabulary of " + std::to_string(vocabulary));
      member[k][token] = true;
    }
  }
  // KL(uniform over the set || p) = -mean_{v in S} log p_v - log |S|, per thought.
  auto in_set = members.to(device).to(log_probs.scalar_type());                 // [K, V]
  auto sizes = in_set.sum(-1);                                                   // [K]
  auto cross_entropy = -(log_probs * in_set).sum(-1) / sizes;                    // [K]
  auto divergence = cross_entropy - sizes.log();                                 // [K]
  if (weights_by_thought.empty() || weights_by_thought == std::vector<double>{1.0}) return divergence.mean();
  std::vector<double> weights(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k)
    weights[static_cast<size_t>(k)] =
        weights_by_thought[std::min(static_cast<size_t>(thoughts[static_cast<size_t>(k)]), weights_by_thought.size() - 1)];
  return (divergence * torch::tensor(weights).to(device).to(divergence.scalar_type())).mean();
}

}  // namespace coconut
