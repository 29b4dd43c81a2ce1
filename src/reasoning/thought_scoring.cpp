#include "reasoning/thought_scoring.h"

#include "reasoning/latent_forward.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace coconut {

int64_t thought_slot_column(const std::vector<int64_t>& ids, const ThoughtSlot& slot) {
  for (size_t i = 0; i + 1 < ids.size(); ++i)
    if (ids[i] == slot.start_latent && ids[i + 1] == slot.end_latent) return static_cast<int64_t>(i);
  return -1;
}

torch::Tensor hidden_with_thoughts(Llama& model, const std::vector<int64_t>& ids, const ThoughtSlot& slot) {
  if (ids.empty()) throw std::invalid_argument("hidden_with_thoughts: no ids");
  torch::NoGradGuard no_grad;
  const auto device = model->embed_tokens->weight.device();
  const auto as_tensor = [&](const std::vector<int64_t>& values) {
    return torch::tensor(values, torch::kInt64).view({1, -1}).to(device);  // [1, T]
  };
  const int64_t start = thought_slot_column(ids, slot), n = slot.thoughts, count = static_cast<int64_t>(ids.size());
  if (start < 0 || n == 0) return model->forward_ids(as_tensor(ids)).hidden[0];  // [T, D]
  // The ids with n columns for the thoughts after <|start-latent|> (their inputs are replaced).
  std::vector<int64_t> columns(ids.begin(), ids.begin() + start + 1);
  columns.insert(columns.end(), static_cast<size_t>(n), slot.start_latent);
  columns.insert(columns.end(), ids.begin() + start + 1, ids.end());
  LatentBatch batch;
  batch.embeddings = model->embed(as_tensor(columns));  // [1, T + n, D]
  batch.positions = torch::arange(count + n, torch::TensorOptions().dtype(torch::kInt64).device(device)).view({1, -1});
  batch.first_latent = start + 1;
  batch.latent_count = n;
  if (slot.bottleneck) batch.bottleneck_rows = torch::ones({1}, torch::TensorOptions().dtype(torch::kBool).device(device));
  const auto hidden = latent_forward(model, batch).hidden[0];  // [T + n, D]
  return torch::cat({hidden.narrow(0, 0, start + 1), hidden.narrow(0, start + 1 + n, count - start - 1)});  // [T, D]
}

std::vector<double> score_choices_with_thoughts(Llama& model, const EncodedChoices& item, int64_t max_length, const ThoughtSlot& slot) {
  if (item.context.empty()) throw std::invalid_argument("score_choices_with_thoughts: an empty context (give the prefix token)");
  if (item.continuations.empty()) throw std::invalid_argument("score_choices_with_thoughts: no choices");
  std::vector<double> scores;
  for (const auto& continuation : item.continuations) {
    if (continuation.empty()) throw std::invalid_argument("score_choices_with_thoughts: a choice without tokens");
    const auto length = static_cast<int64_t>(continuation.size());
    // Context + thoughts + the choice but its last token must fit (the last token is only predicted).
    const int64_t room = max_length + 1 - length - slot.thoughts;
    if (room < 1)
      throw std::invalid_argument("score_choices_with_thoughts: a choice of " + std::to_string(length) + " tokens and " +
                                  std::to_string(slot.thoughts) + " thoughts leave no room for its context in " +
                                  std::to_string(max_length));
    const auto kept = std::min(static_cast<int64_t>(item.context.size()), room);
    std::vector<int64_t> ids(item.context.end() - kept, item.context.end());
    ids.insert(ids.end(), continuation.begin(), continuation.end() - 1);
    const auto hidden = hidden_with_thoughts(model, ids, slot);  // [kept + length - 1, D]
    // Positions kept - 1 .. kept + length - 2 predict the choice's tokens.
    const auto log_probs = torch::log_softmax(model->logits(hidden.narrow(0, kept - 1, length)), -1);  // [length, V]
    const auto targets = torch::tensor(continuation, torch::kInt64).to(log_probs.device()).view({-1, 1});
    scores.push_back(log_probs.gather(1, targets).to(torch::kFloat64).sum().item<double>());
  }
  return scores;
}

}  // namespace coconut
