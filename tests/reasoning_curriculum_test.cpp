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

// Length grouping: every example once, as many batches, one thought count each, and far less
// padding than the epoch order gives; still a function of (seed, epoch).
TEST(Curriculum, LengthGroupingCutsPadding) {
  Fixture f;
  // Lengths that vary within a thought count: 1-3 steps, plus 0-4 extra facts in the question.
  std::vector<Example> examples;
  std::vector<TokenizedExample> tokenized;
  for (size_t i = 0; i < f.examples.size(); ++i) {
    Example example = f.examples[i];
    for (size_t extra = 0; extra < (i * 7) % 5; ++extra) example.question = "Bob is blue . " + example.question;
    examples.push_back(example);
    tokenized.push_back(tokenize_example(example, *f.tokenizer, f.special));
  }
  const auto padding = [](const EpochPlan& plan) {
    const PlanPositions positions = plan_positions(plan);
    EXPECT_GE(positions.padded, positions.real);
    return positions.padded - positions.real;
  };
  for (const std::string mode : {"cot", "coconut"}) {
    Curriculum curriculum = coconut_curriculum();
    curriculum.layout.mode = mode;
    const EpochPlan in_order = plan_epoch(curriculum, examples, tokenized, *f.tokenizer, f.special, 2);
    curriculum.group_by_length = 8;  // windows of 32 rows: the whole epoch
    const EpochPlan grouped = plan_epoch(curriculum, examples, tokenized, *f.tokenizer, f.special, 2);
    EXPECT_EQ(grouped.batches.size(), in_order.batches.size()) << mode;
    std::vector<size_t> seen;
    for (const auto& batch : grouped.batches) {
      EXPECT_LE(batch.rows.size(), 4u);
      for (size_t row : batch.rows) {
        EXPECT_EQ(grouped.sequences[row].latent_count, grouped.sequences[batch.rows.front()].latent_count) << mode;
        seen.push_back(row);
      }
    }
    std::sort(seen.begin(), seen.end());
    ASSERT_EQ(seen.size(), examples.size());
    for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], i);
    std::printf("%s: padding %lld tokens in epoch order, %lld grouped\n", mode.c_str(),
                static_cast<long long>(padding(in_order)), static_cast<long long>(padding(grouped)));
    EXPECT_LT(padding(grouped), padding(in_order) / 2) << mode;
    int64_t collated = 0;  // the positions plan_positions counts are collate's
    for (const auto& batch : grouped.batches) {
      std::vector<Sequence> rows;
      for (size_t row : batch.rows) rows.push_back(grouped.sequences[row]);
      collated += collate(rows, 0).ids.numel();
    }
    EXPECT_EQ(plan_positions(grouped).padded, collated) << mode;
    const auto rows_of = [](const EpochPlan& plan) {
      std::vector<std::vector<size_t>> rows;
      for (const auto& batch : plan.batches) rows.push_back(batch.rows);
      return rows;
    };
    EXPECT_EQ(rows_of(plan_epoch(curriculum, examples, tokenized, *f.tokenizer, f.special, 2)), rows_of(grouped));
    EXPECT_NE(rows_of(plan_epoch(curriculum, examples, tokenized, *f.tokenizer, f.special, 3)), rows_of(grouped));
  }
}
