// Thought controls (reasoning/thought_control.h): zero is the run without thoughts, shuffle feeds
// another question's recorded thoughts (and one question alone its own), noise keeps each
// thought's RMS and its seed, mean feeds the calibration set's mean thought, token the embedding of
// the thought's argmax token (against a naive cache-free loop).
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "data/hops.h"
#include "reasoning/evaluate.h"
#include "reasoning/thought_control.h"
#include "support/tiny_model.h"
#include "support/word_level.h"

using namespace coconut;

namespace {

struct ControlFixture {
  std::vector<Example> examples = generate_hops(6, 3);
  std::unique_ptr<HfTokenizer> tokenizer;
  SpecialTokenIds special = coconut::testing::marker_ids();
  Llama model{nullptr};
  EvalOptions options;

  ControlFixture() {
    std::vector<std::string> texts;
    for (const auto& example : examples) {
      texts.push_back(example.question);
      texts.push_back("### " + example.answer);
    }
    tokenizer = coconut::testing::word_level_with_markers(texts);
    auto config = coconut::testing::tiny_config();
    config.vocab_size = tokenizer->vocab_size();
    config.bos_token_ids = {*special.bos};
    config.eos_token_ids = {special.eos};
    model = coconut::testing::tiny_model(config);
    options.mode = TrainingMode::kCoconut;
    options.max_new_tokens = 6;
    options.batch_size = 4;
  }

  EvalSummary run(const std::vector<int64_t>& thoughts, const EvalOptions& with) {
    return evaluate(model, *tokenizer, special, examples, thoughts, with);
  }
};

std::vector<std::string> texts_of(const EvalSummary& summary) {
  std::vector<std::string> texts;
  for (const auto& prediction : summary.predictions) texts.push_back(prediction.generated_text);
  return texts;
}

}  // namespace

TEST(ThoughtControl, NamesRoundTripAndUnknownOnesAreRefused) {
  for (const char* name : {"none", "zero", "noise", "shuffle", "mean", "token"})
    EXPECT_STREQ(thought_control_name(thought_control_from_name(name)), name);
  try {
    thought_control_from_name("blank");
    ADD_FAILURE() << "an unknown control was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("shuffle"), std::string::npos) << error.what();
  }
}

TEST(ThoughtControl, ZeroIsTheRunWithoutThoughts) {
  ControlFixture fixture;
  const std::vector<int64_t> thoughts = {2, 3, 2, 1, 3, 2};
  const auto without = fixture.run(std::vector<int64_t>(thoughts.size(), 0), fixture.options);
  const auto zero = evaluate_with_thought_control(fixture.model, *fixture.tokenizer, fixture.special, fixture.examples, thoughts,
                                                  fixture.options, {ThoughtControl::kZero});
  EXPECT_EQ(texts_of(zero), texts_of(without));
  EXPECT_EQ(zero.mean_latent_thoughts, 0.0);
  EXPECT_DOUBLE_EQ(zero.mean_flops, without.mean_flops);
  ASSERT_TRUE(zero.thought_control);
  const auto normal = fixture.run(thoughts, fixture.options);
  EXPECT_DOUBLE_EQ(zero.thought_control->uncontrolled_accuracy, normal.accuracy);
  for (size_t i = 0; i < thoughts.size(); ++i)
    EXPECT_EQ(zero.thought_control->uncontrolled_correct[i], normal.predictions[i].correct) << "question " << i;
}

TEST(ThoughtControl, ShuffleFeedsEachQuestionAnotherQuestionsRecordedThoughts) {
  ControlFixture fixture;
  const std::vector<int64_t> thoughts = {2, 2, 3, 2, 3, 2};
  EvalOptions recording = fixture.options;
  recording.record_thoughts = true;
  const auto normal = fixture.run(thoughts, recording);
  for (size_t i = 0; i < thoughts.size(); ++i)
    EXPECT_EQ(normal.predictions[i].thought_inputs.sizes(), (std::vector<int64_t>{thoughts[i], fixture.model->config().hidden_size}));

  const auto donors = thought_donors(thoughts, 11);
  EXPECT_EQ(donors, thought_donors(thoughts, 11));
  for (size_t i = 0; i < thoughts.size(); ++i) {
    EXPECT_NE(donors[i], i) << "question " << i << " keeps its own thoughts";
    EXPECT_EQ(thoughts[donors[i]], thoughts[i]) << "question " << i << " is given another count of thoughts";
  }
  EXPECT_EQ(std::set<size_t>(donors.begin(), donors.end()).size(), donors.size()) << "each question's thoughts go once";

  EvalOptions shuffled = recording;
  shuffled.replaced_thoughts.control = ThoughtControl::kShuffle;
  for (size_t donor : donors) shuffled.replaced_thoughts.donors.push_back(normal.predictions[donor].thought_inputs);
  const auto fed = fixture.run(thoughts, shuffled);
  for (size_t i = 0; i < thoughts.size(); ++i)
    EXPECT_TRUE(torch::equal(fed.predictions[i].thought_inputs, normal.predictions[donors[i]].thought_inputs)) << "question " << i;

  const auto controlled = evaluate_with_thought_control(fixture.model, *fixture.tokenizer, fixture.special, fixture.examples,
                                                        thoughts, fixture.options, {ThoughtControl::kShuffle, 11});
  EXPECT_EQ(texts_of(controlled), texts_of(fed));
}

TEST(ThoughtControl, ShuffleOfOneQuestionIsThePlainRun) {
  ControlFixture fixture;
  fixture.examples.resize(1);
  const auto plain = fixture.run({3}, fixture.options);
  const auto shuffled = evaluate_with_thought_control(fixture.model, *fixture.tokenizer, fixture.special, fixture.examples, {3},
                                                      fixture.options, {ThoughtControl::kShuffle, 5});
  EXPECT_EQ(texts_of(shuffled), texts_of(plain));
  ASSERT_TRUE(shuffled.thought_control);
  EXPECT_EQ(shuffled.thought_control->test.only_first, 0);
  EXPECT_EQ(shuffled.thought_control->test.only_second, 0);
  EXPECT_EQ(shuffled.thought_control->test.p_value, 1.0);
}

TEST(ThoughtControl, NoiseHasTheThoughtsRmsAndIsReproducibleBySeedWhateverTheBatching) {
  const auto thought = torch::randn({64}, torch::TensorOptions().dtype(torch::kFloat32)) * 3 + 1;
  const auto noise = noise_like_thought(thought, 9, 4, 2);
  EXPECT_NEAR(noise.square().mean().sqrt().item<double>(), thought.square().mean().sqrt().item<double>(), 1e-5);
  EXPECT_TRUE(torch::equal(noise, noise_like_thought(thought, 9, 4, 2)));
  EXPECT_FALSE(torch::equal(noise, noise_like_thought(thought, 10, 4, 2))) << "the seed changes nothing";
  EXPECT_FALSE(torch::equal(noise, noise_like_thought(thought, 9, 5, 2))) << "two questions share their noise";
  EXPECT_FALSE(torch::equal(noise, noise_like_thought(thought, 9, 4, 3))) << "two thoughts share their noise";
  EXPECT_NEAR(noise.mean().item<double>(), 0.0, 0.5) << "the noise is not centred";

  ControlFixture fixture;
  const std::vector<int64_t> thoughts = {2, 2, 3, 2, 3, 2};
  EvalOptions noisy = fixture.options;
  noisy.record_thoughts = true;
  noisy.replaced_thoughts.control = ThoughtControl::kNoise;
  noisy.replaced_thoughts.seed = 3;
  const auto batched = fixture.run(thoughts, noisy);
  noisy.batch_size = 1;
  const auto single = fixture.run(thoughts, noisy);
  noisy.replaced_thoughts.seed = 4;
  const auto reseeded = fixture.run(thoughts, noisy);
  for (size_t i = 0; i < thoughts.size(); ++i) {
    EXPECT_TRUE(torch::allclose(batched.predictions[i].thought_inputs, single.predictions[i].thought_inputs, 1e-5, 1e-5))
        << "question " << i;
    EXPECT_FALSE(torch::allclose(batched.predictions[i].thought_inputs, reseeded.predictions[i].thought_inputs)) << "question " << i;
  }
  EXPECT_EQ(texts_of(batched), texts_of(single));
}

TEST(ThoughtControl, MeanFeedsThePerThoughtMeanOfTheCalibrationRuns) {
  const auto a = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({2, 2});
  const auto b = torch::tensor({3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f}).view({3, 2});
  const auto mean = mean_of_thoughts({a, torch::zeros({0, 2}), b});
  EXPECT_TRUE(torch::equal(mean, torch::tensor({2.0f, 3.0f, 4.0f, 5.0f, 7.0f, 8.0f}).view({3, 2}))) << mean;
  EXPECT_THROW(mean_of_thoughts({torch::zeros({0, 2})}), std::invalid_argument);

  ControlFixture fixture;
  const std::vector<int64_t> thoughts = {2, 2, 3, 2, 3, 1};
  EvalOptions recording = fixture.options;
  recording.record_thoughts = true;
  std::vector<torch::Tensor> recorded;
  for (const auto& prediction : fixture.run(thoughts, recording).predictions) recorded.push_back(prediction.thought_inputs);
  EvalOptions averaged = recording;
  averaged.replaced_thoughts.control = ThoughtControl::kMean;
  averaged.replaced_thoughts.mean_thoughts = mean_of_thoughts(recorded);
  const auto fed = fixture.run(thoughts, averaged);
  for (size_t i = 0; i < thoughts.size(); ++i)
    EXPECT_TRUE(torch::allclose(fed.predictions[i].thought_inputs, averaged.replaced_thoughts.mean_thoughts.narrow(0, 0, thoughts[i])))
        << "question " << i;
  const auto controlled = evaluate_with_thought_control(fixture.model, *fixture.tokenizer, fixture.special, fixture.examples,
                                                        thoughts, fixture.options, {ThoughtControl::kMean});
  EXPECT_EQ(texts_of(controlled), texts_of(fed));
  EXPECT_EQ(controlled.thought_control->mean_over_questions, thoughts.size());

  // A calibration set of fewer thoughts than a question asks for is refused by name.
  ThoughtControlRun shallow{ThoughtControl::kMean, 0, {fixture.examples[0]}, {1}};
  try {
    evaluate_with_thought_control(fixture.model, *fixture.tokenizer, fixture.special, fixture.examples, thoughts, fixture.options,
                                  shallow);
    ADD_FAILURE() << "thought 2 was fed a mean of nothing";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("at most 1 thoughts"), std::string::npos) << error.what();
  }
}

// Token: each thought is the embedding of the argmax token of the hidden state it replaces, as a
// cache-free loop re-running the whole sequence computes it.
TEST(ThoughtControl, TokenFeedsTheArgmaxTokensEmbeddingAsANaiveLoopDoes) {
  ControlFixture fixture;
  Llama& model = fixture.model;
  const std::vector<int64_t> thoughts = {2, 3, 1, 2, 3, 2};
  EvalOptions tokens = fixture.options;
  tokens.replaced_thoughts.control = ThoughtControl::kToken;
  const auto controlled = fixture.run(thoughts, tokens);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < thoughts.size(); ++i) {
    const auto prompt = build_eval_prompt(tokenize_example(fixture.examples[i], *fixture.tokenizer, fixture.special),
                                          TrainingMode::kCoconut, thoughts[i], 0, fixture.special);
    const auto embed = [&](const std::vector<int64_t>& ids) {
      return model->embed(torch::tensor(ids, torch::kInt64).view({1, -1}));  // [1, n, D]
    };
    const auto last_hidden = [&](const torch::Tensor& embeddings) {  // [1, D]
      const auto positions = torch::arange(embeddings.size(1), torch::kInt64).view({1, -1});
      const auto hidden = model->forward(embeddings, positions).hidden;
      return hidden.select(1, hidden.size(1) - 1);
    };
    auto embeddings = embed(prompt.prompt);
    for (int64_t k = 0; k < thoughts[i]; ++k)
      embeddings = torch::cat({embeddings, embed({model->logits(last_hidden(embeddings)).argmax(-1).item<int64_t>()})}, 1);
    embeddings = torch::cat({embeddings, embed(prompt.after_latents)}, 1);
    std::vector<int64_t> answer;
    for (int64_t step = 0; step < fixture.options.max_new_tokens; ++step) {
      answer.push_back(model->logits(last_hidden(embeddings)).argmax(-1).item<int64_t>());
      if (answer.back() == fixture.special.eos) break;
      embeddings = torch::cat({embeddings, embed({answer.back()})}, 1);
    }
    EXPECT_EQ(controlled.predictions[i].generated_text, fixture.tokenizer->decode(answer, true)) << "question " << i;
  }
}

TEST(ThoughtControl, RefusedOutsideCoconutModeAndBesideHalting) {
  ControlFixture fixture;
  EvalOptions cot = fixture.options;
  cot.mode = TrainingMode::kCot;
  EXPECT_THROW(evaluate_with_thought_control(fixture.model, *fixture.tokenizer, fixture.special, fixture.examples,
                                             std::vector<int64_t>(6, 1), cot, {ThoughtControl::kNoise}),
               std::invalid_argument);
  EvalOptions halting = fixture.options;
  halting.halting.thoughts = {0, 2};
  EXPECT_THROW(evaluate_with_thought_control(fixture.model, *fixture.tokenizer, fixture.special, fixture.examples,
                                             std::vector<int64_t>(6, 2), halting, {ThoughtControl::kShuffle}),
               std::invalid_argument);
}
