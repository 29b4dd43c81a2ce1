#include "reasoning/training_loss.h"

#include "reasoning/latent_forward.h"

namespace coconut {

torch::Tensor routed_positions(const Batch& batch, torch::Device device) {
  const int64_t columns = batch.ids.size(1);
  auto column = torch::arange(columns, torch::kInt64).view({1, columns});               // [1, T]
  auto labelled = batch.labels.ne(kIgnoreLabel);                                         // [B, T]
  // The first labelled column of each row (T when a row has none): [B] -> [B, 1]
  auto first = torch::where(labelled.any(1), labelled.to(torch::kInt64).argmax(1), torch::full_like(labelled.any(1), columns, torch::kInt64));
  auto routed = column >= first.view({-1, 1});                                           // [B, T]
  if (batch.latent_count > 0)
    routed = routed.logical_or((column >= batch.first_latent).logical_and(column < batch.first_latent + batch.latent_count));
  return routed.logical_and(batch.attention_mask.to(torch::kBool)).to(device);
}

TrainingLoss training_loss(Llama& model, const Batch& batch, torch::Device device, bool monitor_norms,
                           const ForwardOptions& given_options) {
  ForwardOptions model_options = given_options;
  // A model with a router routes the positions generation would (hard decisions at the threshold, or
  // straight-through ones in training), so the loss is the loss of the model as it runs.
  const bool router = model->config().depth_router &&
                      (model_options.router_straight_through || model_options.router_threshold > 0);
  if (router) model_options.route_mask = routed_positions(batch, device);
  auto ids = batch.ids.to(device), labels = batch.labels.to(device), mask = batch.attention_mask.to(device),
       positions = batch.positions.to(device);
  auto embeddings = model->embed(ids);  // [B, T, D]
  TrainingLoss result;
  torch::Tensor hidden;
  torch::Tensor latent_inputs, router_probabilities;
  const bool padded = !batch.attention_mask.all().item<bool>();
  if (batch.latent_count > 0) {
    LatentBatch latent{embeddings, positions, padded ? mask : torch::Tensor(), batch.first_latent, batch.latent_count,
                       model_options};
    auto forward = latent_forward(model, latent);
    hidden = forward.hidden;
    latent_inputs = forward.latent_inputs;
    router_probabilities = forward.router_probabilities;
  } else {
    ForwardOptions options = model_options;
    if (padded) options.attention_mask = mask;
    auto forward = model->forward(embeddings, positions, nullptr, options);
    hidden = forward.hidden;  // [B, T, D]
    router_probabilities = forward.router_probabilities;
  }
  if (router && router_probabilities.defined()) {
    // [B, T, L] -> mean over routed positions and layers
    const auto routed = model_options.route_mask.unsqueeze(-1).to(router_probabilities.scalar_type());
    result.router_fraction = (router_probabilities * routed).sum() /
                             (routed.sum() * static_cast<double>(router_probabilities.size(-1))).clamp_min(1.0);
  }
  // Position t predicts label t + 1; only labelled targets pay for the head.
  const int64_t columns = hidden.size(1);
  auto targets = labels.narrow(1, 1, columns - 1);                 // [B, T-1]
  auto selected = targets.ne(kIgnoreLabel);                        // [B, T-1]
  auto predicting = hidden.narrow(1, 0, columns - 1).index({selected});  // [N, D]
  auto logits = model->logits(predicting);                         // [N, V] float32
  result.loss = torch::nn::functional::cross_entropy(logits, targets.index({selected}));
  result.logits = logits;
  result.tokens = batch.attention_mask.sum().item<int64_t>();
  result.labelled = predicting.size(0);
  if (monitor_norms) {
    torch::NoGradGuard no_grad;
    auto real = mask.to(torch::kBool);
    result.embedding_norm = embeddings.index({real}).to(torch::kFloat32).norm(2, -1).mean().item<double>();
    if (latent_inputs.defined()) result.latent_norm = latent_inputs.to(torch::kFloat32).norm(2, -1).mean().item<double>();
  }
  return result;
}

}  // namespace coconut
