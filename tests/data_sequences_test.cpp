// Sequence building for every training mode and batching with aligned latents.
#include <gtest/gtest.h>

#include "data/sequences.h"
#include "support/temp_dir.h"
#include "support/word_level.h"
#include "text/hf_tokenizer.h"

using namespace coconut;

namespace {

struct Fixture {
  std::unique_ptr<HfTokenizer> tokenizer;
  SpecialTokenIds special;
  TokenizedExample example;
  Fixture() {
    tokenizer = coconut::testing::word_level_with_markers({"is A a B ? yes no ### 1 2 3 step one two three"});
    special = coconut::testing::marker_ids();
    Example raw{"is A a B ?", {"step one", "step two", "step three"}, "yes"};
    example = tokenize_example(raw, *tokenizer, special);
  }
};

std::vector<int64_t> concat(std::initializer_list<std::vector<int64_t>> parts) {
  std::vector<int64_t> out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

}  // namespace

TEST(Sequences, TokenizationFollowsTheReferenceLayout) {
  Fixture f;
  EXPECT_EQ(f.example.question.front(), 1);  // BOS
  EXPECT_EQ(f.example.question.size(), 6u);  // <bos> is A a B ?  ("\n" is whitespace for word-level)
  EXPECT_EQ(f.example.steps.size(), 3u);
  EXPECT_EQ(f.example.answer, (std::vector<int64_t>{*f.tokenizer->token_to_id("###"), *f.tokenizer->token_to_id("yes"), 2}));
}

TEST(Sequences, CotAndNoCot) {
  Fixture f;
  SequenceOptions options;
  options.mode = TrainingMode::kCot;
  const auto cot = build_sequence(f.example, options, f.special);
  EXPECT_EQ(cot.ids, concat({f.example.question, f.example.steps[0], f.example.steps[1], f.example.steps[2], f.example.answer}));
  for (size_t i = 0; i < cot.ids.size(); ++i)
    EXPECT_EQ(cot.labels[i], i < f.example.question.size() ? kIgnoreLabel : cot.ids[i]) << i;
  options.mode = TrainingMode::kNoCot;
  const auto no_cot = build_sequence(f.example, options, f.special);
  EXPECT_EQ(no_cot.ids, concat({f.example.question, f.example.answer}));
  EXPECT_EQ(no_cot.first_latent, -1);
}

TEST(Sequences, CoconutStageReplacesStepsByThoughts) {
  Fixture f;
  SequenceOptions options;
  options.mode = TrainingMode::kCoconut;
  options.stage = 2;
  options.c_thought = 2;
  const auto sequence = build_sequence(f.example, options, f.special);
  EXPECT_EQ(sequence.ids, concat({f.example.question, {4, 6, 6, 6, 6, 5}, f.example.steps[2], f.example.answer}));
  EXPECT_EQ(sequence.first_latent, static_cast<int64_t>(f.example.question.size()) + 1);
  EXPECT_EQ(sequence.latent_count, 4);
  const size_t learned_from = f.example.question.size() + 6;
  for (size_t i = 0; i < sequence.ids.size(); ++i)
    EXPECT_EQ(sequence.labels[i], i < learned_from ? kIgnoreLabel : sequence.ids[i]) << i;
  // What step supervision decodes: thoughts 0-1 stand for step 0, thoughts 2-3 for step 1.
  EXPECT_EQ(sequence.latent_steps, (std::vector<std::vector<int64_t>>{f.example.steps[0], f.example.steps[1]}));
  EXPECT_EQ(sequence.thoughts_per_step, 2);
  // Pause columns stand for the same steps (pause_as_thought's step supervision); CoT has none.
  options.mode = TrainingMode::kPauseAsThought;
  EXPECT_EQ(build_sequence(f.example, options, f.special).latent_steps, sequence.latent_steps);
  options.mode = TrainingMode::kCot;
  EXPECT_TRUE(build_sequence(f.example, options, f.special).latent_steps.empty());
}

TEST(Sequences, StagesBeyondTheMaximum) {
  Fixture f;
  SequenceOptions options;
  options.mode = TrainingMode::kCoconut;
  options.stage = 9;
  options.max_latent_stage = 5;
  options.pad_latent_to_max = true;
  EXPECT_EQ(build_sequence(f.example, options, f.special).latent_count, 5);  // padded to the maximum
  options.pad_latent_to_max = false;
  const auto unpadded = build_sequence(f.example, options, f.special);
  EXPECT_EQ(unpadded.latent_count, 3);  // one per step of this chain
  EXPECT_EQ(unpadded.ids, concat({f.example.question, {4, 6, 6, 6, 5}, f.example.answer}));
  EXPECT_EQ(unpadded.latent_steps, f.example.steps);  // every step latent, one thought each
  options.max_latent_stage = 2;  // two thoughts for three dropped steps: the third has no thought
  EXPECT_EQ(build_sequence(f.example, options, f.special).latent_steps,
            (std::vector<std::vector<int64_t>>{f.example.steps[0], f.example.steps[1]}));
}

// answer_in_last_thought: only when every step is in thoughts does the last group decode the answer.
TEST(Sequences, AnswerInLastThoughtOnlyWhenNoStepIsLeftInWords) {
  Fixture f;
  SequenceOptions options;
  options.mode = TrainingMode::kCoconut;
  options.max_latent_stage = 5;
  options.answer_in_last_thought = true;
  options.stage = 3;  // all three steps of the chain
  const auto all = build_sequence(f.example, options, f.special);
  ASSERT_EQ(all.latent_steps.size(), 3u);
  EXPECT_EQ(all.latent_steps[0], f.example.steps[0]);
  EXPECT_EQ(all.latent_steps[2], concat({f.example.steps[2], f.example.answer}));
  EXPECT_EQ(all.ids, concat({f.example.question, {4, 6, 6, 6, 5}, f.example.answer}));  // the sequence itself unchanged
  options.stage = 2;  // step 3 still in words: no answer in the thoughts
  EXPECT_EQ(build_sequence(f.example, options, f.special).latent_steps,
            (std::vector<std::vector<int64_t>>{f.example.steps[0], f.example.steps[1]}));
}

// latent_bottleneck: only a row whose every step is in thoughts gets it, and collate carries it per row.
TEST(Sequences, LatentBottleneckOnlyWhenTheAnswerFollowsTheThoughts) {
  Fixture f;
  SequenceOptions options;
  options.mode = TrainingMode::kCoconut;
  options.max_latent_stage = 5;
  options.latent_bottleneck = true;
  options.stage = 3;
  const auto all = build_sequence(f.example, options, f.special);
  EXPECT_TRUE(all.latent_bottleneck);
  options.stage = 2;
  const auto partial = build_sequence(f.example, options, f.special);
  EXPECT_FALSE(partial.latent_bottleneck);
  options.stage = 3;
  options.latent_bottleneck = false;
  const auto open = build_sequence(f.example, options, f.special);
  EXPECT_FALSE(open.latent_bottleneck);
  const auto batch = collate({all, open}, f.special.pad);
  ASSERT_TRUE(batch.bottleneck_rows.defined());
  EXPECT_TRUE(torch::equal(batch.bottleneck_rows, torch::tensor(std::vector<uint8_t>{1, 0}).to(torch::kBool)));
  EXPECT_FALSE(collate({open, open}, f.special.pad).bottleneck_rows.defined());
}

TEST(Sequences, GraphExamplesCarryReachableSetsPerThought) {
  Fixture f;
  // A ProsQA-shaped example: A -> a -> B, A -> three; the names are words of the vocabulary.
  Example raw{"is A a B ?", {"step one", "step two"}, "yes"};
  raw.extra = {{"idx_to_symbol", {"A", "a", "B", "three"}}, {"edges", {{0, 1}, {1, 2}, {0, 3}}}, {"root", 0}};
  const auto example = tokenize_example(raw, *f.tokenizer, f.special);
  const auto token = [&](const std::string& word) { return f.tokenizer->encode(word).back(); };
  auto within_one = std::vector<int64_t>{token("a"), token("three")};  // the root, A, is in none
  auto within_two = std::vector<int64_t>{token("a"), token("B"), token("three")};
  std::sort(within_one.begin(), within_one.end());
  std::sort(within_two.begin(), within_two.end());
  ASSERT_EQ(example.reachable, (std::vector<std::vector<int64_t>>{within_one, within_two}));
  EXPECT_TRUE(f.example.reachable.empty());  // no graph, no sets
  SequenceOptions options;
  options.mode = TrainingMode::kCoconut;
  options.c_thought = 2;
  options.max_latent_stage = 3;
  options.pad_latent_to_max = true;
  options.stage = 4;  // beyond the maximum: 3 x 2 thoughts, deeper than the graph
  const auto sequence = build_sequence(example, options, f.special);
  ASSERT_EQ(sequence.latent_count, 6);
  EXPECT_EQ(sequence.latent_reachable,
            (std::vector<std::vector<int64_t>>{within_one, within_one, within_two, within_two, within_two, within_two}));
  // From the root: thought j holds the nodes within j / c edges, the root included.
  options.reachable_from_root = true;
  auto root_alone = std::vector<int64_t>{token("A")};
  auto root_and_one = within_one, root_and_two = within_two;
  for (auto* set : {&root_and_one, &root_and_two}) {
    set->push_back(token("A"));
    std::sort(set->begin(), set->end());
  }
  EXPECT_EQ(example.root_token, token("A"));
  EXPECT_EQ(build_sequence(example, options, f.special).latent_reachable,
            (std::vector<std::vector<int64_t>>{root_alone, root_alone, root_and_one, root_and_one, root_and_two, root_and_two}));
  options.reachable_from_root = false;
  options.stage = 1;
  const auto first = build_sequence(example, options, f.special);
  EXPECT_EQ(first.latent_reachable, (std::vector<std::vector<int64_t>>{within_one, within_one}));
  const auto batch = collate({first, build_sequence(f.example, options, f.special)}, f.special.pad);
  ASSERT_EQ(batch.latent_reachable.size(), 2u);
  EXPECT_EQ(batch.latent_reachable[0], first.latent_reachable);
  EXPECT_TRUE(batch.latent_reachable[1].empty());
  // pause_as_thought's pause columns are supervised with the same sets as Coconut's thoughts.
  options.mode = TrainingMode::kPauseAsThought;
  EXPECT_EQ(build_sequence(example, options, f.special).latent_reachable, first.latent_reachable);
  options.mode = TrainingMode::kCot;
  EXPECT_TRUE(build_sequence(example, options, f.special).latent_reachable.empty());
}

TEST(Sequences, PauseNoThoughtsAndIcot) {
  Fixture f;
  SequenceOptions options;
  options.mode = TrainingMode::kPauseAsThought;
  options.stage = 1;
  const auto pause_thought = build_sequence(f.example, options, f.special);
  EXPECT_EQ(pause_thought.ids, concat({f.example.question, {4, 7, 5}, f.example.steps[1], f.example.steps[2], f.example.answer}));
  // Pause tokens are fed as tokens, laid out as thoughts (the same columns, batched the same way).
  EXPECT_EQ(pause_thought.first_latent, static_cast<int64_t>(f.example.question.size()) + 1);
  EXPECT_EQ(pause_thought.latent_count, 1);
  EXPECT_TRUE(pause_thought.thoughts_are_pauses);
  // The step its column stands for, as Coconut's thought would (step supervision decodes it).
  EXPECT_EQ(pause_thought.latent_steps, std::vector<std::vector<int64_t>>{f.example.steps[0]});
  options.mode = TrainingMode::kCoconut;
  const auto coconut_thought = build_sequence(f.example, options, f.special);
  EXPECT_FALSE(coconut_thought.thoughts_are_pauses);
  EXPECT_TRUE(collate({pause_thought, pause_thought}, f.special.pad).thoughts_are_pauses);
  EXPECT_FALSE(collate({coconut_thought}, f.special.pad).thoughts_are_pauses);
  EXPECT_THROW_WITH(collate({pause_thought, coconut_thought}, f.special.pad), "collate", "pause tokens");
  options.mode = TrainingMode::kNoThoughts;
  EXPECT_EQ(build_sequence(f.example, options, f.special).ids,
            concat({f.example.question, {4, 5}, f.example.steps[1], f.example.steps[2], f.example.answer}));
  options.mode = TrainingMode::kPause;
  options.pause_tokens = 3;
  EXPECT_EQ(build_sequence(f.example, options, f.special).ids, concat({f.example.question, {7, 7, 7}, f.example.answer}));
  options.mode = TrainingMode::kIcot;
  options.removed_tokens = 3;  // "step one step" gone
  const auto icot = build_sequence(f.example, options, f.special);
  EXPECT_EQ(icot.ids, concat({f.example.question, {f.example.steps[1][1]}, f.example.steps[2], f.example.answer}));
  options.removed_tokens = 100;
  EXPECT_EQ(build_sequence(f.example, options, f.special).ids, concat({f.example.question, f.example.answer}));
}

TEST(Collate, AlignsLatentsWithLeftPaddingAndMasksPadding) {
  Fixture f;
  Example longer{"is A a B ? is A a B ?", {"step one", "step two"}, "no"};
  const auto second = tokenize_example(longer, *f.tokenizer, f.special);
  SequenceOptions options;
  options.mode = TrainingMode::kCoconut;
  options.stage = 1;
  const auto a = build_sequence(f.example, options, f.special), b = build_sequence(second, options, f.special);
  const Batch batch = collate({a, b}, 0);
  EXPECT_EQ(batch.first_latent, std::max(a.first_latent, b.first_latent));
  EXPECT_EQ(batch.latent_count, 1);
  for (int64_t row = 0; row < 2; ++row) {
    EXPECT_EQ(batch.ids[row][batch.first_latent].item<int64_t>(), 6) << "latent column differs in row " << row;
    auto padding = batch.attention_mask[row] == 0;
    // Padding: no loss, pad id; positions count real tokens from 0.
    EXPECT_TRUE((batch.labels[row].masked_select(padding) == kIgnoreLabel).all().item<bool>());
    EXPECT_TRUE((batch.ids[row].masked_select(padding) == 0).all().item<bool>());
    auto real_positions = batch.positions[row].masked_select(batch.attention_mask[row] == 1);
    EXPECT_TRUE(torch::equal(real_positions, torch::arange(real_positions.size(0))));
  }
  // The shorter-question row was left-padded, the other right-padded.
  EXPECT_EQ(batch.attention_mask[0][0].item<int64_t>(), 0);
  EXPECT_EQ(batch.attention_mask[1][0].item<int64_t>(), 1);
  options.stage = 2;
  EXPECT_THROW(collate({a, build_sequence(second, options, f.special)}, 0), std::invalid_argument);
}

TEST(Sampling, EpochOrderAndStageMixingAreSeeded) {
  EXPECT_EQ(epoch_order(100, 3, 1), epoch_order(100, 3, 1));
  EXPECT_NE(epoch_order(100, 3, 1), epoch_order(100, 3, 2));
  std::mt19937_64 first(5), second(5);
  std::vector<int64_t> a, b;
  for (int i = 0; i < 50; ++i) a.push_back(sample_stage(1, 4, 0.5, first)), b.push_back(sample_stage(1, 4, 0.5, second));
  EXPECT_EQ(a, b);
  EXPECT_NE(std::count(a.begin(), a.end(), 1), 50);  // some were mixed
  std::mt19937_64 rng(1);
  EXPECT_EQ(sample_stage(2, 4, 0.0, rng), 2);
}

// The one batching rule of training, scoring and evaluation: rows that share a key, keys ascending,
// rows in index order, at most batch_size per batch; every row exactly once.
TEST(Batching, BatchesOfEqualKeysAgreeWithANaiveGrouping) {
  const std::vector<int64_t> keys = {3, 0, 3, 3, 1, 0, 3, 3, 1};
  const auto batches = coconut::batches_of_equal_keys(keys, 2);
  const std::vector<std::vector<size_t>> expected = {{1, 5}, {4, 8}, {0, 2}, {3, 6}, {7}};
  EXPECT_EQ(batches, expected);
  std::vector<int> seen(keys.size(), 0);
  for (const auto& batch : batches)
    for (size_t row : batch) {
      ++seen[row];
      EXPECT_EQ(keys[row], keys[batch.front()]);
    }
  EXPECT_EQ(seen, std::vector<int>(keys.size(), 1));
  EXPECT_TRUE(coconut::batches_of_equal_keys(std::vector<int64_t>{}, 4).empty());
  EXPECT_THROW(coconut::batches_of_equal_keys(keys, 0), std::invalid_argument);
}
