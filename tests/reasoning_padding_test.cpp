// Padding never leaks: the loss of a padded Coconut batch equals the losses of its rows alone.
#include <gtest/gtest.h>

#include "data/sequences.h"
#include "reasoning/latent_forward.h"
#include "support/tiny_model.h"

using namespace coconut;

namespace {

// Sum of token cross-entropies over labelled positions (labels shifted: position t predicts t+1).
torch::Tensor summed_loss(Llama& model, const Batch& batch) {
  LatentBatch input;
  input.embeddings = model->embed(batch.ids);
  input.positions = batch.positions;
  input.attention_mask = batch.attention_mask;
  input.first_latent = batch.first_latent;
  input.latent_count = batch.latent_count;
  auto hidden = latent_forward(model, input).hidden;
  auto logits = model->logits(hidden).narrow(1, 0, batch.ids.size(1) - 1);  // [B, T-1, V]
  auto targets = batch.labels.narrow(1, 1, batch.ids.size(1) - 1);         // [B, T-1]
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreLabel).reduction(torch::kSum));
}

Sequence make_sequence(int question_length, int tail_length, int latents) {
  Sequence sequence;
  for (int i = 0; i < question_length; ++i) sequence.ids.push_back(1 + i % 7), sequence.labels.push_back(kIgnoreLabel);
  sequence.first_latent = latents > 0 ? question_length : -1;
  sequence.latent_count = latents;
  for (int i = 0; i < latents; ++i) sequence.ids.push_back(10), sequence.labels.push_back(kIgnoreLabel);
  for (int i = 0; i < tail_length; ++i) sequence.ids.push_back(2 + i % 5), sequence.labels.push_back(2 + i % 5);
  return sequence;
}

}  // namespace

TEST(Padding, BatchLossEqualsSumOfRowsAlone) {
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  torch::NoGradGuard no_grad;
  const std::vector<Sequence> rows = {make_sequence(3, 6, 2), make_sequence(6, 2, 2), make_sequence(4, 4, 2)};
  const double batched = summed_loss(model, collate(rows, 0)).item<double>();
  double alone = 0;
  for (const auto& row : rows) alone += summed_loss(model, collate({row}, 0)).item<double>();
  // float32, a dozen labelled tokens of O(1) loss each.
  EXPECT_NEAR(batched, alone, 1e-4);
  // And the padding really was there (left and right).
  const Batch batch = collate(rows, 0);
  EXPECT_LT(batch.attention_mask.sum().item<int64_t>(), batch.attention_mask.numel());
}
