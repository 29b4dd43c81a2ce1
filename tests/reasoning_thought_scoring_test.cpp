// Scoring with continuous thoughts (reasoning/thought_scoring.h) against the naive latent forward
// (every thought re-runs its whole prefix) and against eval's cached choice scoring without them.
#include <gtest/gtest.h>

#include <vector>

#include "eval/loglikelihood.h"
#include "reasoning/latent_forward.h"
#include "reasoning/thought_scoring.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

using namespace coconut;

namespace {

constexpr int64_t kStart = 8, kEnd = 9;  // marker ids of the tiny vocabulary (11 tokens)

// The naive reference: ids with n columns after the slot's <|start-latent|>, run by
// latent_forward_naive, the thought columns removed: [T, D].
torch::Tensor naive_hidden(Llama& model, const std::vector<int64_t>& ids, int64_t start, int64_t n) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> columns(ids.begin(), ids.begin() + start + 1);
  columns.insert(columns.end(), static_cast<size_t>(n), 0);
  columns.insert(columns.end(), ids.begin() + start + 1, ids.end());
  LatentBatch batch;
  batch.embeddings = model->embed(torch::tensor(columns).view({1, -1}));
  batch.positions = torch::arange(static_cast<int64_t>(columns.size())).view({1, -1});
  batch.first_latent = start + 1;
  batch.latent_count = n;
  const auto hidden = latent_forward_naive(model, batch).hidden[0];
  const auto count = static_cast<int64_t>(ids.size());
  return torch::cat({hidden.narrow(0, 0, start + 1), hidden.narrow(0, start + 1 + n, count - start - 1)});
}

}  // namespace

TEST(ThoughtScoring, TheSlotIsTheFirstStartMarkerRightBeforeAnEndMarker) {
  const ThoughtSlot slot{kStart, kEnd, 3, false};
  EXPECT_EQ(thought_slot_column({1, 4, kStart, kEnd, 5}, slot), 2);
  EXPECT_EQ(thought_slot_column({kStart, 3, kEnd, kStart, kEnd}, slot), 3);  // markers apart are no slot
  EXPECT_EQ(thought_slot_column({1, 4, kEnd, kStart}, slot), -1);
  EXPECT_EQ(thought_slot_column({}, slot), -1);
}

TEST(ThoughtScoring, HiddenStatesEqualTheNaiveLatentForwardWithTheThoughtColumnsLeftOut) {
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  model->eval();
  const std::vector<int64_t> ids = {1, 4, 3, 5, kStart, kEnd, 6, 7, 2};
  const auto hidden = hidden_with_thoughts(model, ids, {kStart, kEnd, 3, false});
  ASSERT_EQ(hidden.sizes(), (std::vector<int64_t>{9, 16}));
  EXPECT_LT((hidden - naive_hidden(model, ids, 4, 3)).abs().max().item<double>(), 1e-5);
  // Through the bottleneck (which the naive forward does not implement; LatentForward.Bottleneck*
  // checks the cached one's): the question's columns and the thoughts as before, the rest otherwise.
  const auto narrow = hidden_with_thoughts(model, ids, {kStart, kEnd, 3, true});
  EXPECT_LT((narrow.narrow(0, 0, 5) - hidden.narrow(0, 0, 5)).abs().max().item<double>(), 1e-6);
  EXPECT_GT((narrow.narrow(0, 5, 4) - hidden.narrow(0, 5, 4)).abs().max().item<double>(), 1e-3);
  // The thoughts change what follows them, not what precedes them.
  const auto plain = model->forward_ids(torch::tensor(ids).view({1, -1})).hidden[0].detach();
  const auto thinking = hidden_with_thoughts(model, ids, {kStart, kEnd, 3, false});
  EXPECT_LT((thinking.narrow(0, 0, 5) - plain.narrow(0, 0, 5)).abs().max().item<double>(), 1e-5);
  EXPECT_GT((thinking.narrow(0, 5, 4) - plain.narrow(0, 5, 4)).abs().max().item<double>(), 1e-3);
  // No slot, or no thoughts: the plain forward (with or without grad mode: 1e-5).
  EXPECT_LT((hidden_with_thoughts(model, ids, {kStart, kEnd, 0, false}) - plain).abs().max().item<double>(), 1e-5);
  const std::vector<int64_t> no_slot = {1, 4, 3, 5, 6};
  EXPECT_LT((hidden_with_thoughts(model, no_slot, {kStart, kEnd, 3, false}) -
             model->forward_ids(torch::tensor(no_slot).view({1, -1})).hidden[0])
                .abs()
                .max()
                .item<double>(),
            1e-5);
}

TEST(ThoughtScoring, ChoiceScoresSumTheNaiveLogProbabilitiesAndEqualEvalsWithoutThoughts) {
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  model->eval();
  torch::NoGradGuard no_grad;
  EncodedChoices item;
  item.context = {1, 4, 3, kStart, kEnd};
  item.continuations = {{6}, {7, 5, 2}, {3, 3}};
  const ThoughtSlot slot{kStart, kEnd, 2, false};
  const auto scores = score_choices_with_thoughts(model, item, 64, slot);
  ASSERT_EQ(scores.size(), 3u);
  for (size_t c = 0; c < 3; ++c) {
    std::vector<int64_t> ids = item.context;
    ids.insert(ids.end(), item.continuations[c].begin(), item.continuations[c].end());
    const auto log_probs = torch::log_softmax(model->logits(naive_hidden(model, ids, 3, 2)), -1);  // [T, V]
    double expected = 0;
    for (size_t t = 0; t < item.continuations[c].size(); ++t)
      expected += log_probs[static_cast<int64_t>(item.context.size() + t) - 1][item.continuations[c][t]].item<double>();
    EXPECT_NEAR(scores[c], expected, 1e-5) << c;
  }
  // Without thoughts: eval's cached implementation (one context pass, the choices from its cache).
  const auto plain = score_choices_with_thoughts(model, item, 64, {kStart, kEnd, 0, false});
  const auto cached = score_choices(model, item, 64);
  for (size_t c = 0; c < 3; ++c) EXPECT_NEAR(plain[c], cached[c], 1e-5) << c;
  // A short limit: the context loses tokens on the left, the thoughts counted (3 kept + 2 thoughts + 2 - 1 = 6).
  EncodedChoices short_item{{5, 1, 4, 3, kStart, kEnd}, {{7, 5}}};
  EncodedChoices cut{{3, kStart, kEnd}, {{7, 5}}};
  EXPECT_NEAR(score_choices_with_thoughts(model, short_item, 6, slot)[0], score_choices_with_thoughts(model, cut, 64, slot)[0], 1e-6);
  EXPECT_THROW_WITH(score_choices_with_thoughts(model, item, 3, slot), "no room", "2 thoughts");
  EXPECT_THROW_WITH(score_choices_with_thoughts(model, {{1}, {{}}}, 64, slot), "a choice without tokens");
}
