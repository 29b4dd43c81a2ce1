// The epoch plan of training (reasoning/curriculum.h): the stage schedule, one thought count per
// batch, every example once, and every random choice a function of (seed, epoch).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "reasoning/curriculum.h"
#include "support/word_level.h"
#include "text/hf_tokenizer.h"

using namespace coconut;

namespace {

struct Fixture {
  std::unique_ptr<HfTokenizer> tokenizer;
  SpecialTokenIds special;
  std::vector<Example> examples;
  std::vector<TokenizedExample> tokenized;
  Fixture() {
    tokenizer = coconut::testing::word_level_with_markers(
        {"Ann is red . Bob is blue . Cat is green . Dan is pink . Is Ann red ? step one two three yes no ###"});
    special = coconut::testing::marker_ids();
    // 30 questions of one, two and three steps: the first step quotes "Ann is red ." and no other fact.
    const std::vector<std::string> steps = {"Ann is red .", "step two", "step three"};
    for (int i = 0; i < 30; ++i) {
      const auto step_count = static_cast<size_t>(1 + i % 3);
      examples.push_back({"Ann is red . Bob is blue . Cat is green . Dan is pink . Is Ann red ?",
                          std::vector<std::string>(steps.begin(), steps.begin() + static_cast<long>(step_count)),
                          i % 2 ? "yes" : "no"});
      tokenized.push_back(tokenize_example(examples.back(), *tokenizer, special));
    }
  }
};

Curriculum coconut_curriculum() {
  Curriculum curriculum;
  curriculum.layout.mode = "coconut";
  curriculum.layout.c_thought = 2;
  curriculum.layout.max_latent_stage = 3;
  curriculum.first_stage = 1;
  curriculum.epochs_per_stage = 2;
  curriculum.batch_size = 4;
  curriculum.seed = 7;
  return curriculum;
}

}  // namespace

TEST(Curriculum, StagesFollowTheEpochsInStagedModesOnly) {
  Curriculum curriculum = coconut_curriculum();
  EXPECT_TRUE(curriculum.staged());
  EXPECT_EQ(curriculum.stage_at(0), 1);
  EXPECT_EQ(curriculum.stage_at(1), 1);
  EXPECT_EQ(curriculum.stage_at(2), 2);
  EXPECT_EQ(curriculum.stage_at(5), 3);
  curriculum.layout.mode = "cot";
  EXPECT_FALSE(curriculum.staged());
  EXPECT_EQ(curriculum.stage_at(5), 0);
  curriculum.drop_unused_facts = {0.9, 0.5};
  EXPECT_DOUBLE_EQ(curriculum.drop_unused_facts_at(0), 0.9);
  EXPECT_DOUBLE_EQ(curriculum.drop_unused_facts_at(7), 0.5);
}

TEST(Curriculum, EveryExampleOnceInBatchesOfOneThoughtCount) {
  Fixture f;
  Curriculum curriculum = coconut_curriculum();
  curriculum.layout.max_latent_stage = 2;
  const EpochPlan plan = plan_epoch(curriculum, f.examples, f.tokenized, *f.tokenizer, f.special, 4);  // stage 3
  EXPECT_EQ(plan.stage, 3);
  ASSERT_EQ(plan.sequences.size(), f.examples.size());
  std::multiset<int64_t> thought_counts;
  for (const auto& sequence : plan.sequences) thought_counts.insert(sequence.latent_count);
  // Beyond max_latent_stage (2) every step is latent, at most 2 of them, c_thought 2 each: one-step
  // chains get 2 thoughts, longer ones 4.
  EXPECT_EQ(thought_counts.count(2), 10u);
  EXPECT_EQ(thought_counts.count(4), 20u);
  std::vector<size_t> seen;
  for (const auto& batch : plan.batches) {
    ASSERT_FALSE(batch.rows.empty());
    EXPECT_LE(batch.rows.size(), 4u);
    for (size_t row : batch.rows) {
      EXPECT_EQ(plan.sequences[row].latent_count, plan.sequences[batch.rows.front()].latent_count);
      seen.push_back(row);
    }
  }
  std::sort(seen.begin(), seen.end());
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], i);
  EXPECT_EQ(seen.size(), f.examples.size());
}

TEST(Curriculum, APlanIsAFunctionOfSeedAndEpoch) {
  Fixture f;
  Curriculum curriculum = coconut_curriculum();
  curriculum.uniform_prob = 0.5;
  curriculum.shuffle_facts = true;
  const auto ids_of = [](const EpochPlan& plan) {
    std::vector<std::vector<int64_t>> ids;
    for (const auto& batch : plan.batches)
      for (size_t row : batch.rows) ids.push_back(plan.sequences[row].ids);
    return ids;
  };
  const auto first = ids_of(plan_epoch(curriculum, f.examples, {}, *f.tokenizer, f.special, 3));
  EXPECT_EQ(ids_of(plan_epoch(curriculum, f.examples, {}, *f.tokenizer, f.special, 3)), first);
  EXPECT_NE(ids_of(plan_epoch(curriculum, f.examples, {}, *f.tokenizer, f.special, 4)), first);
  curriculum.seed = 8;
  EXPECT_NE(ids_of(plan_epoch(curriculum, f.examples, {}, *f.tokenizer, f.special, 3)), first);
}

TEST(Curriculum, DistractorsAreDroppedAtTheEpochsRate) {
  Fixture f;
  Curriculum curriculum = coconut_curriculum();
  curriculum.layout.mode = "cot";
  curriculum.shuffle_facts = true;
  curriculum.drop_unused_facts = {1.0, 0.0};
  // Where the query ("Is Ann red ?", always last) starts: after <bos> and the facts kept, 4 tokens each.
  const auto query_positions = [&](int64_t epoch) {
    std::set<int64_t> positions;
    const int64_t query = *f.tokenizer->token_to_id("Is");
    for (const auto& sequence : plan_epoch(curriculum, f.examples, {}, *f.tokenizer, f.special, epoch).sequences)
      positions.insert(std::find(sequence.ids.begin(), sequence.ids.end(), query) - sequence.ids.begin());
    return positions;
  };
  // Epoch 0 (rate 1) keeps only the fact the first step quotes; epoch 1 (rate 0) keeps all four.
  EXPECT_EQ(query_positions(0), std::set<int64_t>{1 + 4});
  EXPECT_EQ(query_positions(1), std::set<int64_t>{1 + 4 * 4});
}
