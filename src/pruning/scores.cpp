#include "pruning/scores.h"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "reasoning/latent_forward.h"
#include "reasoning/training_loss.h"

namespace coconut {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The selected vectors of every depth: [L + 1, N, D] float64, N = selected positions of the batch.
torch::Tensor selected_states(const std::vector<torch::Tensor>& residuals, const Batch& batch, ScorePositions positions) {
  auto stacked = torch::stack(residuals).to(torch::kFloat64);  // [L + 1, B, T, D]
  if (positions == ScorePositions::kLatents) {
    if (batch.latent_count <= 0)
      throw std::invalid_argument("scoring latent positions needs continuous thoughts, but the batch has none "
                                  "(score a Coconut model in coconut mode, or give latents)");
    auto latents = stacked.narrow(2, batch.first_latent, batch.latent_count);  // [L + 1, B, n, D]
    return latents.reshape({stacked.size(0), -1, stacked.size(3)});           // [L + 1, B*n, D]
  }
  // Last real column of each row: the highest index whose mask is 1.
  const int64_t columns = batch.attention_mask.size(1);
  auto column_index = torch::arange(columns, torch::kInt64).unsqueeze(0);           // [1, T]
  auto last = (batch.attention_mask.to(torch::kInt64) * (column_index + 1)).argmax(1);  // [B]
  auto rows = torch::arange(batch.attention_mask.size(0), torch::kInt64);
  return stacked.index({torch::indexing::Slice(), rows.to(stacked.device()), last.to(stacked.device())});  // [L + 1, B, D]
}

}  // namespace

ScorePositions score_positions_from_name(const std::string& name) {
  if (name == "last") return ScorePositions::kLastToken;
  if (name == "latents") return ScorePositions::kLatents;
  throw std::invalid_argument("unknown score positions '" + name + "' (expected last or latents)");
}

std::vector<torch::Tensor> residual_stream(Llama& model, const Batch& batch, torch::Device device) {
  torch::NoGradGuard no_grad;
  auto ids = batch.ids.to(device), mask = batch.attention_mask.to(device), positions = batch.positions.to(device);
  auto embeddings = model->embed(ids);  // [B, T, D]
  const bool padded = !batch.attention_mask.all().item<bool>();
  ForwardOptions options;
  options.return_residuals = true;
  if (batch.latent_count > 0 && !batch.thoughts_are_pauses) {  // pause tokens are plain inputs
    LatentBatch latent{embeddings, positions, padded ? mask : torch::Tensor(), batch.first_latent, batch.latent_count,
                       torch::Tensor(), options};
    return latent_forward(model, latent).residuals;
  }
  if (padded) options.attention_mask = mask;
  return model->forward(embeddings, positions, nullptr, options).residuals;
}

torch::Tensor angular_distances(Llama& model, const std::vector<Batch>& batches, ScorePositions positions,
                                torch::Device device) {
  if (batches.empty()) throw std::invalid_argument("angular distances need at least one batch of data");
  const int64_t layers = model->config().num_hidden_layers;
  auto sums = torch::zeros({layers + 1, layers + 1}, torch::kFloat64);  // [depth a, depth b]
  int64_t samples = 0;
  for (const auto& batch : batches) {
    auto states = selected_states(residual_stream(model, batch, device), batch, positions).cpu();  // [L+1, N, D]
    auto unit = states / states.norm(2, -1, /*keepdim=*/true).clamp_min(1e-30);
    auto cosines = torch::einsum("and,bnd->abn", {unit, unit}).clamp(-1.0, 1.0);  // [L+1, L+1, N]
    sums += (torch::acos(cosines) / M_PI).sum(-1);
    samples += states.size(1);
  }
  auto mean = sums / static_cast<double>(samples);
  auto distances = torch::full({layers, layers}, kNaN, torch::kFloat64);  // [n - 1, l]
  for (int64_t n = 1; n <= layers; ++n)
    for (int64_t l = 0; l + n <= layers; ++l) distances[n - 1][l] = mean[l][l + n];
  return distances;
}

torch::Tensor block_influence(Llama& model, const std::vector<Batch>& batches, torch::Device device) {
  if (batches.empty()) throw std::invalid_argument("block influence needs at least one batch of data");
  const int64_t layers = model->config().num_hidden_layers;
  auto sums = torch::zeros({layers}, torch::kFloat64);
  double tokens = 0;
  for (const auto& batch : batches) {
    const auto residuals = residual_stream(model, batch, device);
    auto real = batch.attention_mask.to(device).to(torch::kBool);  // [B, T]
    for (int64_t l = 0; l < layers; ++l) {
      auto cosine = torch::cosine_similarity(residuals[l].to(torch::kFloat64), residuals[l + 1].to(torch::kFloat64), -1);
      sums[l] += cosine.index({real}).sum().cpu();  // [B, T] -> real tokens
    }
    tokens += real.sum().item<double>();
  }
  return 1.0 - sums / tokens;
}

double mean_loss(Llama& model, const std::vector<Batch>& batches, torch::Device device, const ForwardOptions& model_options) {
  if (batches.empty()) throw std::invalid_argument("a loss needs at least one batch of data");
  torch::NoGradGuard no_grad;
  double total = 0, labelled = 0;
  for (const auto& batch : batches) {
    const auto step = training_loss(model, batch, device, false, model_options);
    total += step.loss.item<double>() * static_cast<double>(step.labelled);
    labelled += static_cast<double>(step.labelled);
  }
  return total / labelled;
}

HeadImportance head_gradient_importance(Llama& model, const std::vector<Batch>& batches, torch::Device device) {
  if (batches.empty()) throw std::invalid_argument("head importance needs at least one batch of data");
  const auto& config = model->config();
  const int64_t layers = config.num_hidden_layers, widest = config.max_heads(),
                widest_groups = config.max_kv_heads();
  const auto dtype = model->parameters().front().scalar_type();
  // Weights need no gradients: only the masks do.
  std::vector<bool> required;
  for (auto& parameter : model->parameters()) {
    required.push_back(parameter.requires_grad());
    parameter.set_requires_grad(false);
  }
  HeadImportance importance{torch::zeros({layers, widest}, torch::kFloat64),
                            torch::zeros({layers, widest_groups}, torch::kFloat64)};
  for (const auto& batch : batches) {
    auto mask = torch::ones({layers, widest}, torch::TensorOptions().dtype(dtype).device(device)).requires_grad_(true);
    ForwardOptions options;
    options.head_mask = mask;
    const auto step = training_loss(model, batch, device, false, options);
    auto gradient = torch::autograd::grad({step.loss}, {mask})[0].to(torch::kFloat64).cpu();  // [L, H_max]
    importance.heads += gradient.abs();
    for (int64_t l = 0; l < layers; ++l) {
      const int64_t groups = config.kv_heads(l), per_group = config.heads(l) / groups;
      // [H] -> [G, R] -> per-group sum
      auto group_gradient = gradient[l].narrow(0, 0, groups * per_group).view({groups, per_group}).sum(1);
      importance.groups[l].narrow(0, 0, groups) += group_gradient.abs();
    }
  }
  size_t index = 0;
  for (auto& parameter : model->parameters()) parameter.set_requires_grad(required[index++]);
  return importance;
}

namespace {

// Activation statistics of every MLP channel, [L, F_max] float64 each: Minitron's, the sum over
// sequences of (mean |a| over the sequence's real tokens)^2; and the sum of a^2 over every real
// token. A Coconut batch runs several passes (the thoughts one column at a time): a pass over every
// column counts its real tokens, a shorter one (thoughts, all real) every position it has.
struct ActivationStatistics {
  torch::Tensor sequence_mean_squares, token_squares;
};
ActivationStatistics activation_statistics(Llama& model, const std::vector<Batch>& batches, torch::Device device) {
  const auto& config = model->config();
  const int64_t layers = config.num_hidden_layers, widest = config.max_ffn();
  ActivationStatistics statistics{torch::zeros({layers, widest}, torch::kFloat64), torch::zeros({layers, widest}, torch::kFloat64)};
  torch::NoGradGuard no_grad;
  for (const auto& batch : batches) {
    const int64_t rows = batch.ids.size(0), columns = batch.ids.size(1);
    auto real = batch.attention_mask.to(device).to(torch::kFloat64).unsqueeze(-1);  // [B, T, 1]
    auto magnitude = torch::zeros({layers, rows, widest}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
    auto squares = torch::zeros({layers, widest}, magnitude.options());
    auto tokens = torch::zeros({layers, rows, 1}, magnitude.options());
    ForwardOptions options;
    options.on_mlp_activation = [&](int64_t layer, const torch::Tensor& activation) {
      auto values = activation.to(torch::kFloat64);  // [B, t, F]
      const int64_t width = activation.size(-1);
      if (activation.size(1) == columns) values = values * real;
      magnitude[layer].narrow(1, 0, width) += values.abs().sum(1);
      squares[layer].narrow(0, 0, width) += values.square().sum(1).sum(0);
      tokens[layer] += activation.size(1) == columns ? real.sum(1) : torch::full_like(tokens[layer], activation.size(1));
    };
    training_loss(model, batch, device, false, options);
    statistics.sequence_mean_squares += (magnitude / tokens.clamp_min(1.0)).square().sum(1).cpu();  // [L, B, F] -> [L, F]
    statistics.token_squares += squares.cpu();
  }
  return statistics;
}

}  // namespace

torch::Tensor mlp_channel_importance(Llama& model, const std::vector<Batch>& batches, torch::Device device,
                                     const std::string& metric) {
  if (batches.empty()) throw std::invalid_argument("MLP channel importance needs at least one batch of data");
  const auto& config = model->config();
  if (metric == "activation") return activation_statistics(model, batches, device).sequence_mean_squares.sqrt();
  if (metric == "wanda") {
    auto norms = activation_statistics(model, batches, device).token_squares.sqrt();  // [L, F_max]
    for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
      auto& mlp = *model->layers[layer]->as<DecoderLayer>()->mlp;
      const auto column_sums = mlp.down_proj->weight.detach().to(torch::kCPU, torch::kFloat64).abs().sum(0);  // [D, F] -> [F]
      norms[layer].narrow(0, 0, column_sums.size(0)) *= column_sums;
    }
    return norms;
  }
  if (metric != "taylor")
    throw std::invalid_argument("unknown MLP channel metric '" + metric + "' (expected activation, wanda or taylor)");
  const auto dtype = model->parameters().front().scalar_type();
  std::vector<bool> required;  // weights need no gradients: only the masks do
  for (auto& parameter : model->parameters()) {
    required.push_back(parameter.requires_grad());
    parameter.set_requires_grad(false);
  }
  auto gradient = torch::zeros({config.num_hidden_layers, config.max_ffn()}, torch::kFloat64);
  double labelled = 0;
  for (const auto& batch : batches) {
    auto mask = torch::ones(gradient.sizes(), torch::TensorOptions().dtype(dtype).device(device)).requires_grad_(true);
    ForwardOptions options;
    options.mlp_channel_mask = mask;
    const auto step = training_loss(model, batch, device, false, options);
    const auto weight = static_cast<double>(step.labelled);  // the batch's mean loss -> its sum over tokens
    gradient += torch::autograd::grad({step.loss}, {mask})[0].to(torch::kFloat64).cpu() * weight;
    labelled += weight;
  }
  size_t index = 0;
  for (auto& parameter : model->parameters()) parameter.set_requires_grad(required[index++]);
  return (gradient / labelled).abs();
}

torch::Tensor head_ablation_losses(Llama& model, const std::vector<Batch>& batches, torch::Device device,
                                   bool whole_groups) {
  const auto& config = model->config();
  const int64_t layers = config.num_hidden_layers, widest = config.max_heads();
  const auto dtype = model->parameters().front().scalar_type();
  auto losses = torch::full({layers, whole_groups ? config.max_kv_heads() : config.max_heads()}, kNaN, torch::kFloat64);
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t width = whole_groups ? config.heads(l) / config.kv_heads(l) : 1;  // heads per unit
    for (int64_t unit = 0; unit < config.heads(l) / width; ++unit) {
      ForwardOptions options;
      options.head_mask = torch::ones({layers, widest}, torch::TensorOptions().dtype(dtype).device(device));
      options.head_mask[l].narrow(0, unit * width, width).fill_(0.0);
      losses[l][unit] = mean_loss(model, batches, device, options);
    }
  }
  return losses;
}

}  // namespace coconut
