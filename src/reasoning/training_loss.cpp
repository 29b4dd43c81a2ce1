#include "reasoning/training_loss.h"

#include "reasoning/latent_forward.h"

namespace coconut {

TrainingLoss training_loss(Llama& model, const Batch& batch, torch::Device device, bool monitor_norms,
                           const ForwardOptions& model_options) {
  auto ids = batch.ids.to(device), labels = batch.labels.to(device), mask = batch.attention_mask.to(device),
       positions = batch.positions.to(device);
  auto embeddings = model->embed(ids);  // [B, T, D]
  TrainingLoss result;
  torch::Tensor hidden;
  torch::Tensor latent_inputs;
  const bool padded = !batch.attention_mask.all().item<bool>();
  if (batch.latent_count > 0) {
    LatentBatch latent{embeddings, positions, padded ? mask : torch::Tensor(), batch.first_latent, batch.latent_count,
                       model_options};
    auto forward = latent_forward(model, latent);
    hidden = forward.hidden;
    latent_inputs = forward.latent_inputs;
  } else {
    ForwardOptions options = model_options;
    if (padded) options.attention_mask = mask;
    hidden = model->forward(embeddings, positions, nullptr, options).hidden;  // [B, T, D]
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
