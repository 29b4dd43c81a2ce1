#include "reasoning/latent_forward.h"

#include "model/cpu_linear.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace coconut {

namespace {

void check_batch(const LatentBatch& batch) {
  const int64_t columns = batch.embeddings.size(1);
  if (batch.latent_count < 0 || batch.first_latent < 1 || batch.first_latent + batch.latent_count > columns)
    throw std::invalid_argument("latent columns [" + std::to_string(batch.first_latent) + ", " +
                                std::to_string(batch.first_latent + batch.latent_count) +
                                ") must follow at least one token and fit in " + std::to_string(columns) + " columns");
}

// The options of the pass over columns [begin, begin + count), its output from column
// begin + first_output on.
ForwardOptions options_for(const LatentBatch& batch, int64_t begin, int64_t count, int64_t first_output = 0) {
  ForwardOptions options = batch.options;
  options.first_output_column = first_output;
  options.attention_mask = torch::Tensor();
  if (batch.attention_mask.defined()) options.attention_mask = batch.attention_mask.narrow(1, begin, count);
  if (batch.options.route_mask.defined()) options.route_mask = batch.options.route_mask.narrow(1, begin, count);
  return options;
}

}  // namespace

LatentForwardResult latent_forward(Llama& model, const LatentBatch& batch) {
  check_batch(batch);
  const int64_t columns = batch.embeddings.size(1), start = batch.first_latent, n = batch.latent_count;
  const int64_t first_output = std::min(batch.options.first_output_column, start - 1);
  KVCache cache = KVCache::growing(model->config());
  std::vector<torch::Tensor> hidden_parts, latent_inputs;
  std::vector<std::vector<torch::Tensor>> residual_parts;  // per pass: L + 1 x [B, columns, D]
  std::vector<torch::Tensor> router_parts;                   // per pass: [B, columns, L]
  // Only the first pass leaves columns out: the output is every column from first_output on.
  auto run_pass = [&](const torch::Tensor& inputs, int64_t begin, int64_t count) {
    auto forward = model->forward(inputs, batch.positions.narrow(1, begin, count), &cache,
                                  options_for(batch, begin, count, begin == 0 ? first_output : 0));
    if (batch.options.return_residuals) residual_parts.push_back(std::move(forward.residuals));
    if (forward.router_probabilities.defined()) router_parts.push_back(forward.router_probabilities);
    return forward.hidden;  // [B, count, D]
  };
  // Pass 0: every column before the first thought.
  auto hidden = run_pass(batch.embeddings.narrow(1, 0, start), 0, start);  // [B, start - first_output, D]
  hidden_parts.push_back(hidden);
  auto previous = hidden.narrow(1, hidden.size(1) - 1, 1);  // [B, 1, D]: column start - 1
  // Passes 1..n: one column each, its input the previous column's output as a thought. Their
  // weight gradients are taken together, as one product per weight at the end of backward.
  {
    DeferredWeightGradients one_weight_gradient_for_every_thought;
    for (int64_t i = 0; i < n; ++i) {
      const auto thought = model->thought_input(previous);  // [B, 1, D]
      latent_inputs.push_back(thought);
      previous = run_pass(thought, start + i, 1);  // [B, 1, D]
      hidden_parts.push_back(previous);
    }
  }
  // Last pass: the rest of the sequence (through the bottleneck in the rows that have one).
  const int64_t rest = columns - start - n;
  if (batch.bottleneck_rows.defined()) cache.hide_prefix(batch.bottleneck_rows, start - 1);
  if (rest > 0)
    hidden_parts.push_back(run_pass(batch.embeddings.narrow(1, start + n, rest), start + n, rest));
  LatentForwardResult result;
  result.hidden = torch::cat(hidden_parts, 1);  // [B, T - first_output, D]
  result.first_column = first_output;
  if (n > 0) result.latent_inputs = torch::cat(latent_inputs, 1);  // [B, n, D]
  if (!router_parts.empty()) result.router_probabilities = torch::cat(router_parts, 1);  // [B, T, L]
  for (size_t depth = 0; !residual_parts.empty() && depth < residual_parts.front().size(); ++depth) {
    std::vector<torch::Tensor> pieces;
    for (const auto& pass : residual_parts) pieces.push_back(pass[depth]);
    result.residuals.push_back(torch::cat(pieces, 1));  // [B, T, D]
  }
  return result;
}

LatentForwardResult latent_forward_naive(Llama& model, const LatentBatch& batch) {
  check_batch(batch);
  const int64_t start = batch.first_latent, n = batch.latent_count;
  auto embeddings = batch.embeddings;
  std::vector<torch::Tensor> latent_inputs;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t prefix = start + i;
    auto hidden = model->forward(embeddings.narrow(1, 0, prefix), batch.positions.narrow(1, 0, prefix), nullptr,
                                 options_for(batch, 0, prefix))
                      .hidden;
    auto thought = model->thought_input(hidden.narrow(1, prefix - 1, 1));  // [B, 1, D]
    latent_inputs.push_back(thought);
    // Out of place, so the graph keeps every version of the embeddings.
    embeddings = torch::cat({embeddings.narrow(1, 0, prefix), thought,
                             embeddings.narrow(1, prefix + 1, embeddings.size(1) - prefix - 1)},
                            1);
  }
  LatentForwardResult result;
  auto forward = model->forward(embeddings, batch.positions, nullptr, options_for(batch, 0, embeddings.size(1)));
  result.hidden = forward.hidden;
  result.residuals = std::move(forward.residuals);
  result.router_probabilities = forward.router_probabilities;
  if (n > 0) result.latent_inputs = torch::cat(latent_inputs, 1);
  return result;
}

}  // namespace coconut
