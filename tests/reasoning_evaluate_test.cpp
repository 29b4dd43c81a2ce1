// Generation with continuous thoughts against a naive cache-free reference, the reference's
// answer rule, and batched evaluation against one question at a time.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <fstream>
#include <set>

#include "data/hops.h"
#include "eval/cost.h"
#include "model/generate.h"
#include "pruning/surgery.h"
#include "reasoning/decode_thoughts.h"
#include "reasoning/evaluate.h"
#include "reasoning/latent_forward.h"
#include "reasoning/special_tokens.h"
#include "support/tiny_model.h"
#include "text/hf_tokenizer.h"

using namespace coconut;

namespace {

// Greedy decoding of one prompt without any cache: every step re-runs the whole sequence of input
// embeddings, thoughts included (a thought's input is the previous position's last hidden state).
// With thought_rms > 0 each thought is first rescaled to that root-mean-square.
std::vector<int64_t> naive_latent_greedy(Llama& model, const std::vector<int64_t>& prompt, int64_t thoughts,
                                         const std::vector<int64_t>& after, int64_t new_tokens, double thought_rms = 0,
                                         bool expected_embedding = false) {
  torch::NoGradGuard no_grad;
  const auto embed = [&](const std::vector<int64_t>& ids) {
    return model->embed(torch::tensor(ids, torch::kInt64).view({1, -1}));  // [1, n, D]
  };
  const auto run = [&](const torch::Tensor& embeddings) {
    auto positions = torch::arange(embeddings.size(1), torch::kInt64).view({1, -1});
    return model->forward(embeddings, positions).hidden;  // [1, n, D]
  };
  auto embeddings = embed(prompt);
  for (int64_t i = 0; i < thoughts; ++i) {
    auto hidden = run(embeddings);
    auto thought = hidden.narrow(1, hidden.size(1) - 1, 1);  // [1, 1, D]
    if (expected_embedding) thought = coconut::testing::naive_expected_embedding(model, thought.view({-1})).view({1, 1, -1});
    if (thought_rms > 0) thought = thought * thought_rms / thought.square().mean().sqrt();
    embeddings = torch::cat({embeddings, thought}, 1);
  }
  if (!after.empty()) embeddings = torch::cat({embeddings, embed(after)}, 1);
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < new_tokens; ++i) {
    auto hidden = run(embeddings);
    const int64_t next = model->logits(hidden.select(1, hidden.size(1) - 1)).argmax(-1).item<int64_t>();
    tokens.push_back(next);
    embeddings = torch::cat({embeddings, embed({next})}, 1);
  }
  return tokens;
}

// A word-level tokenizer over the examples' texts and a tiny random model of its vocabulary.
struct HopsModel {
  std::unique_ptr<HfTokenizer> tokenizer;
  Llama model{nullptr};
  SpecialTokenIds special;
};

HopsModel hops_model(const std::vector<Example>& examples) {
  std::vector<std::string> texts;
  for (const auto& example : examples) {
    texts.push_back(example.question);
    for (const auto& step : example.steps) texts.push_back(step);
    texts.push_back("### " + example.answer);
  }
  std::vector<std::string> specials = {"<pad>", "<unk>", "<s>", "</s>"};
  for (const auto& marker : reasoning_marker_tokens()) specials.push_back(marker);
  HopsModel result;
  result.tokenizer = build_word_level_tokenizer(texts, specials, "<unk>");
  auto config = coconut::testing::tiny_config();
  config.vocab_size = result.tokenizer->vocab_size();
  config.bos_token_ids = {*result.tokenizer->token_to_id("<s>")};
  config.eos_token_ids = {*result.tokenizer->token_to_id("</s>")};
  result.model = coconut::testing::tiny_model(config);
  result.special = find_special_tokens(*result.tokenizer, config);
  return result;
}

}  // namespace

TEST(GenerateWithLatents, BatchedCachedEqualsNaiveRecompute) {
  auto config = coconut::testing::tiny_config();
  auto model = coconut::testing::tiny_model(config);
  const std::vector<std::vector<int64_t>> prompts = {{1, 5, 3, 9, 8}, {4, 7, 8}, {6, 2, 2, 3, 1, 0, 8}};
  for (int64_t thoughts : {0, 1, 3}) {
    GenerationOptions options;
    options.max_new_tokens = 6;
    options.latent_thoughts = thoughts;
    options.after_latents = {10};
    const auto result = generate(model, prompts, options);
    EXPECT_EQ(result.latent_steps, thoughts);
    for (size_t row = 0; row < prompts.size(); ++row)
      EXPECT_EQ(result.tokens[row], naive_latent_greedy(model, prompts[row], thoughts, {10}, 6))
          << "row " << row << ", " << thoughts << " thoughts";
  }
}

// Every way of feeding a thought back (rescaled, expected embedding, both) against the naive
// recompute, and each one changes the answer of the paper's plain last hidden state.
TEST(GenerateWithLatents, ThoughtInputOptionsEqualNaiveRecomputeAndChangeTheAnswer) {
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  const std::vector<std::vector<int64_t>> prompts = {{1, 5, 3, 9, 8}, {4, 7, 8}, {6, 2, 2, 3, 1, 0, 8}};
  GenerationOptions options;
  options.max_new_tokens = 6;
  options.latent_thoughts = 3;
  options.after_latents = {10};
  const auto as_in_the_paper = generate(model, prompts, options).tokens;
  // The tiny model's states have RMS ~1: 0.05 is a 20x smaller input.
  for (const auto& [input, rms] : {std::pair{"last_hidden", 0.05}, {"expected_embedding", 0.0}, {"expected_embedding", 0.05}}) {
    model->set_latent_thought_input(input);
    model->set_latent_thought_rms(rms);
    const auto tokens = generate(model, prompts, options).tokens;
    for (size_t row = 0; row < prompts.size(); ++row)
      EXPECT_EQ(tokens[row], naive_latent_greedy(model, prompts[row], 3, {10}, 6, rms, input == std::string("expected_embedding")))
          << "row " << row << ", " << input << ", rms " << rms;
    EXPECT_NE(tokens, as_in_the_paper) << input << ", rms " << rms;  // the option reaches generation at all
  }
  EXPECT_THROW(model->set_latent_thought_input("soft"), c10::Error);
}

// Generation through the latent bottleneck (the prompt but its last token hidden after the
// thoughts) against the teacher-forced latent forward with the same bottleneck: the cached, batched
// decode must pick at every step the token the training forward ranks first.
TEST(GenerateWithLatents, BottleneckEqualsTheTeacherForcedLatentForward) {
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  torch::NoGradGuard no_grad;
  const std::vector<std::vector<int64_t>> prompts = {{1, 5, 3, 9, 8}, {4, 7, 8}, {6, 2, 2, 3, 1, 0, 8}};
  GenerationOptions options;
  options.max_new_tokens = 6;
  options.latent_thoughts = 3;
  options.after_latents = {10};
  const auto open = generate(model, prompts, options).tokens;
  options.latent_bottleneck = true;
  const auto narrowed = generate(model, prompts, options).tokens;
  EXPECT_NE(narrowed, open);  // the option reaches generation at all
  for (size_t row = 0; row < prompts.size(); ++row) {
    // [prompt, 3 thought columns, <eot>, the generated tokens but the last]
    std::vector<int64_t> ids = prompts[row];
    ids.insert(ids.end(), {0, 0, 0, 10});
    ids.insert(ids.end(), narrowed[row].begin(), narrowed[row].end() - 1);
    const auto columns = static_cast<int64_t>(ids.size());
    LatentBatch batch;
    batch.embeddings = model->embed(torch::tensor(ids).view({1, columns}));
    batch.positions = torch::arange(columns, torch::kInt64).view({1, columns});
    batch.first_latent = static_cast<int64_t>(prompts[row].size());
    batch.latent_count = 3;
    batch.bottleneck_rows = torch::ones({1}, torch::kBool);
    const auto hidden = latent_forward(model, batch).hidden[0];  // [T, D]
    const int64_t after = batch.first_latent + 3;                // the <eot> column predicts the first token
    const auto predicted = model->logits(hidden.narrow(0, after, columns - after)).argmax(-1);
    EXPECT_EQ(std::vector<int64_t>(predicted.data_ptr<int64_t>(), predicted.data_ptr<int64_t>() + predicted.numel()),
              narrowed[row])
        << "row " << row;
  }
}

TEST(AnswerRule, TextAfterLastHashWithoutCommas) {
  EXPECT_EQ(extract_answer("Max is a vumpus.\n### True"), "True");
  EXPECT_EQ(extract_answer("<<2*3=6>> # 1,234 "), "1234");
  EXPECT_EQ(extract_answer("no hash here "), "no hash here");
  EXPECT_EQ(extract_answer("a # b ## c"), "c");
  EXPECT_EQ(extract_answer("###"), "");
  EXPECT_TRUE(answer_matches("### 1,000", "1000"));
  EXPECT_TRUE(answer_matches("### Tom is a rempus.", " Tom is a rempus. "));
  EXPECT_FALSE(answer_matches("### Tom is a rempus", "Tom is a rempus."));
  EXPECT_FALSE(answer_matches("### 10", "100"));
}

TEST(LatentThoughtRule, FollowsTheCurriculum) {
  SequenceOptions options;
  options.c_thought = 2;
  options.max_latent_stage = 3;
  EXPECT_EQ(latent_thoughts_for_stage(0, 5, options), 0);
  EXPECT_EQ(latent_thoughts_for_stage(2, 5, options), 4);
  EXPECT_EQ(latent_thoughts_for_stage(2, 1, options), 4);  // stages up to the maximum keep k * c
  EXPECT_EQ(latent_thoughts_for_stage(7, 2, options), 4);  // beyond: min(steps, max) * c
  options.pad_latent_to_max = true;
  EXPECT_EQ(latent_thoughts_for_stage(7, 2, options), 6);
}

TEST(Evaluate, BatchedEqualsOneAtATimeAndCountsCost) {
  const auto examples = generate_hops(7, 3);
  HopsModel hops = hops_model(examples);  // named members, not a structured binding: lambdas capture them (C++17)
  const auto& tokenizer = hops.tokenizer;
  Llama& model = hops.model;
  const SpecialTokenIds& special = hops.special;
  const LlamaConfig config = model->config();
  const std::vector<int64_t> thoughts = {2, 2, 3, 0, 2, 3, 2};
  EvalOptions options;
  options.mode = TrainingMode::kCoconut;
  options.max_new_tokens = 9;
  options.batch_size = 4;
  const auto batched = evaluate(model, *tokenizer, special, examples, thoughts, options);
  options.batch_size = 1;
  const auto single = evaluate(model, *tokenizer, special, examples, thoughts, options);
  ASSERT_EQ(batched.predictions.size(), examples.size());
  double flops = 0;
  for (size_t i = 0; i < examples.size(); ++i) {
    const auto& p = batched.predictions[i];
    EXPECT_EQ(p.generated_text, single.predictions[i].generated_text) << "question " << i;
    EXPECT_EQ(p.latent_thoughts, thoughts[i]);
    // BOS + question + "\n"-less words + <bot>, then <eot> after the thoughts.
    const auto prompt = tokenize_example(examples[i], *tokenizer, special).question.size() + 2;
    EXPECT_EQ(p.prompt_tokens, static_cast<int64_t>(prompt));
    EXPECT_DOUBLE_EQ(p.flops, generation_flops(config, p.prompt_tokens, p.generated_tokens, thoughts[i]).total());
    EXPECT_LE(p.generated_tokens, 9);
    flops += p.flops;
  }
  EXPECT_NEAR(batched.mean_latent_thoughts, 14.0 / 7.0, 1e-12);
  EXPECT_NEAR(batched.mean_flops, flops / 7.0, 1e-6 * flops);
  EXPECT_EQ(batched.unknown_tokens, 0);

  // Words the vocabulary does not know are counted per question, never silently dropped.
  auto strangers = examples;
  strangers[1].question += " zebra okapi";
  strangers[4].question += " zebra";
  const auto counted = evaluate(model, *tokenizer, special, strangers, thoughts, options);
  EXPECT_EQ(counted.unknown_tokens, 3);
  EXPECT_EQ(counted.questions_with_unknown, 2u);
  EXPECT_EQ(counted.predictions[1].unknown_tokens, 2);
  EXPECT_EQ(counted.predictions[0].unknown_tokens, 0);

  // A question longer than the model's context is refused by name before anything is allocated.
  auto long_one = examples;
  for (int64_t i = 0; i < config.max_position_embeddings; ++i) long_one[5].question += " a";
  try {
    evaluate(model, *tokenizer, special, long_one, thoughts, options);
    ADD_FAILURE() << "a question past the context was evaluated";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("question 5:"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("max_position_embeddings"), std::string::npos) << error.what();
  }
}

TEST(Evaluate, PromptLayoutPerMode) {
  TokenizedExample example;
  example.question = {1, 20, 21};
  SpecialTokenIds special;
  special.start_latent = 5;
  special.end_latent = 6;
  special.latent = 7;
  special.pause = 8;
  auto coconut_prompt = build_eval_prompt(example, TrainingMode::kCoconut, 3, 0, special);
  EXPECT_EQ(coconut_prompt.prompt, (std::vector<int64_t>{1, 20, 21, 5}));
  EXPECT_EQ(coconut_prompt.latent_thoughts, 3);
  EXPECT_EQ(coconut_prompt.after_latents, (std::vector<int64_t>{6}));
  EXPECT_EQ(build_eval_prompt(example, TrainingMode::kPauseAsThought, 2, 0, special).prompt,
            (std::vector<int64_t>{1, 20, 21, 5, 8, 8, 6}));
  EXPECT_EQ(build_eval_prompt(example, TrainingMode::kNoThoughts, 2, 0, special).prompt,
            (std::vector<int64_t>{1, 20, 21, 5, 6}));
  EXPECT_EQ(build_eval_prompt(example, TrainingMode::kPause, 0, 2, special).prompt,
            (std::vector<int64_t>{1, 20, 21, 8, 8}));
  EXPECT_EQ(build_eval_prompt(example, TrainingMode::kCot, 4, 4, special).prompt, example.question);
}

// thought_top_tokens against the naive recompute: thought j's distribution is the head on the last
// hidden state of the prompt plus thoughts 0..j-1, run with no cache.
TEST(ThoughtTopTokens, EachThoughtsTopTokensAreTheNaiveReferencesInOrder) {
  const auto examples = generate_hops(2, 5);
  HopsModel hops = hops_model(examples);
  const auto& tokenizer = hops.tokenizer;
  Llama& model = hops.model;
  const SpecialTokenIds& special = hops.special;
  const int64_t n = 3, k = 4;
  const EvalPrompt prompt =
      build_eval_prompt(tokenize_example(examples[0], *tokenizer, special), TrainingMode::kCoconut, n, 0, special);
  const auto tops = thought_top_tokens(model, *tokenizer, prompt_thoughts(model, prompt), k);
  ASSERT_EQ(tops.size(), static_cast<size_t>(n));

  torch::NoGradGuard no_grad;
  auto embeddings = model->embed(torch::tensor(prompt.prompt, torch::kInt64).view({1, -1}));
  for (int64_t j = 0; j < n; ++j) {
    const auto hidden = model->forward(embeddings, torch::arange(embeddings.size(1), torch::kInt64).view({1, -1})).hidden;
    const auto last = hidden.narrow(1, hidden.size(1) - 1, 1);  // [1, 1, D]
    const auto probabilities = torch::softmax(model->logits(last[0][0]), -1);  // [V]
    const auto [values, indices] = probabilities.topk(k);
    ASSERT_EQ(tops[static_cast<size_t>(j)].size(), static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i) {
      EXPECT_EQ(tops[static_cast<size_t>(j)][static_cast<size_t>(i)].first,
                tokenizer->decode({indices[i].item<int64_t>()}, false)) << "thought " << j << " rank " << i;
      EXPECT_NEAR(tops[static_cast<size_t>(j)][static_cast<size_t>(i)].second, values[i].item<double>(), 1e-5);
    }
    embeddings = torch::cat({embeddings, model->thought_input(last)}, 1);
  }
  const EvalPrompt no_thoughts =
      build_eval_prompt(tokenize_example(examples[0], *tokenizer, special), TrainingMode::kCoconut, 0, 0, special);
  EXPECT_TRUE(thought_top_tokens(model, *tokenizer, prompt_thoughts(model, no_thoughts), k).empty());
}

// decode_thoughts against a naive reference: the thoughts from the cache-free recompute, then each
// group of c read as the only inputs and decoded greedily by recomputing everything per token.
TEST(DecodeThoughts, EachGroupDecodesLikeTheNaiveReference) {
  const auto examples = generate_hops(2, 5);
  HopsModel hops = hops_model(examples);  // named members, not a structured binding: lambdas capture them (C++17)
  const auto& tokenizer = hops.tokenizer;
  Llama& model = hops.model;
  const SpecialTokenIds& special = hops.special;
  const int64_t c = 2, groups = 3, max_tokens = 5;
  const EvalPrompt prompt =
      build_eval_prompt(tokenize_example(examples[0], *tokenizer, special), TrainingMode::kCoconut, c * groups, 0, special);
  const auto decoded = decode_thoughts(model, *tokenizer, prompt_thoughts(model, prompt), c, max_tokens, special.eos);
  ASSERT_EQ(decoded.size(), static_cast<size_t>(groups));

  torch::NoGradGuard no_grad;
  const auto run = [&](const torch::Tensor& embeddings) {  // [1, n, D] -> [1, n, D]
    return model->forward(embeddings, torch::arange(embeddings.size(1), torch::kInt64).view({1, -1})).hidden;
  };
  auto embeddings = model->embed(torch::tensor(prompt.prompt, torch::kInt64).view({1, -1}));
  std::vector<torch::Tensor> thoughts;
  for (int64_t i = 0; i < c * groups; ++i) {
    const auto hidden = run(embeddings);
    thoughts.push_back(model->thought_input(hidden.narrow(1, hidden.size(1) - 1, 1)));  // [1, 1, D]
    embeddings = torch::cat({embeddings, thoughts.back()}, 1);
  }
  for (int64_t group = 0; group < groups; ++group) {
    auto inputs = torch::cat({thoughts[static_cast<size_t>(group * c)], thoughts[static_cast<size_t>(group * c + 1)]}, 1);  // [1, c, D]
    std::vector<int64_t> tokens;
    for (int64_t t = 0; t < max_tokens; ++t) {
      const auto hidden = run(inputs);
      const int64_t next = model->logits(hidden.select(1, hidden.size(1) - 1)).argmax(-1).item<int64_t>();
      if (next == special.eos) break;
      tokens.push_back(next);
      inputs = torch::cat({inputs, model->embed(torch::tensor(std::vector<int64_t>{next}, torch::kInt64).view({1, -1}))}, 1);
    }
    std::string expected = tokenizer->decode(tokens, true);
    expected = expected.substr(0, expected.find('\n'));
    EXPECT_EQ(decoded[static_cast<size_t>(group)], expected) << "group " << group;
  }
  const EvalPrompt no_thoughts =
      build_eval_prompt(tokenize_example(examples[0], *tokenizer, special), TrainingMode::kCoconut, 0, 0, special);
  EXPECT_TRUE(decode_thoughts(model, *tokenizer, prompt_thoughts(model, no_thoughts), c, max_tokens, special.eos).empty());
}

namespace {

// The tiny model four layers deep, so that prefixes of 1..3 layers leave something out.
LlamaConfig four_layer_config() {
  auto config = coconut::testing::tiny_config();
  config.num_hidden_layers = 4;
  config.validate();
  return config;
}

GenerationOptions prefix_generation(int64_t layers) {
  GenerationOptions options;
  options.max_new_tokens = 5;
  options.latent_thoughts = 2;
  options.after_latents = {10};
  options.layers = layers;
  options.record_probabilities = true;
  return options;
}

void expect_same_generation(const GenerationResult& got, const GenerationResult& want, const std::string& what) {
  ASSERT_EQ(got.tokens.size(), want.tokens.size()) << what;
  for (size_t row = 0; row < want.tokens.size(); ++row) {
    EXPECT_EQ(got.tokens[row], want.tokens[row]) << what << ", row " << row;
    ASSERT_EQ(got.token_probabilities[row].size(), want.token_probabilities[row].size()) << what << ", row " << row;
    for (size_t i = 0; i < want.token_probabilities[row].size(); ++i)
      EXPECT_NEAR(got.token_probabilities[row][i], want.token_probabilities[row][i], 1e-6) << what << ", row " << row << ", token " << i;
  }
}

}  // namespace

// generate(layers = k) is the model with layers k.. removed (surgery's copy), thoughts and all; the
// recorded probabilities are the softmax of the logits each token was picked from.
TEST(GeneratePrefix, FirstLayersEqualTheModelWithTheOthersRemoved) {
  auto model = coconut::testing::tiny_model(four_layer_config());
  const std::vector<std::vector<int64_t>> prompts = {{1, 5, 3, 9, 8}, {4, 7, 8}, {6, 2, 2, 3, 1, 0, 8}};
  for (int64_t layers = 1; layers <= 3; ++layers) {
    std::set<int64_t> removed;
    for (int64_t layer = layers; layer < 4; ++layer) removed.insert(layer);
    auto shallow = drop_layers(model, removed);
    expect_same_generation(generate(model, prompts, prefix_generation(layers)), generate(shallow, prompts, prefix_generation(0)),
                           std::to_string(layers) + " layers");
  }
  // A probability is the picked token's softmax: rebuild the first one of row 1 from the prompt alone.
  torch::NoGradGuard no_grad;
  auto options = prefix_generation(0);
  options.latent_thoughts = 0;
  options.after_latents.clear();
  const auto result = generate(model, {prompts[1]}, options);
  const auto logits = model->logits(model->forward_ids(torch::tensor(prompts[1], torch::kInt64).view({1, -1})).hidden.select(1, 2));
  EXPECT_NEAR(result.token_probabilities[0][0], torch::softmax(logits.to(torch::kFloat64), -1)[0][result.tokens[0][0]].item<double>(), 1e-12);
}

// A deeper pass that continues from a shallower pass's prompt prefixes (a subset of its rows, in
// another order, in a batch of other padding) generates what one full-depth pass generates; so does
// a chain of them (1 -> 3 -> 4 layers).
TEST(GeneratePrefix, ContinuingFromPromptPrefixesEqualsTheFullRun) {
  auto model = coconut::testing::tiny_model(four_layer_config());
  const std::vector<std::vector<int64_t>> prompts = {{1, 5, 3, 9, 8}, {4, 7, 8}, {6, 2, 2, 3, 1, 0, 8}};
  const auto full = generate(model, prompts, prefix_generation(0));

  auto shallow_options = prefix_generation(2);
  shallow_options.keep_prompt_prefixes = true;
  const auto shallow = generate(model, prompts, shallow_options);
  ASSERT_EQ(shallow.prompt_prefixes.size(), 3u);
  EXPECT_EQ(shallow.prompt_prefixes[1].residual.size(0), 3);
  EXPECT_EQ(shallow.prompt_prefixes[1].keys.size(), 2u);
  auto deeper = prefix_generation(0);
  deeper.prompt_prefixes = {shallow.prompt_prefixes[2], shallow.prompt_prefixes[1]};
  const auto continued = generate(model, {prompts[2], prompts[1]}, deeper);
  GenerationResult want;
  want.tokens = {full.tokens[2], full.tokens[1]};
  want.token_probabilities = {full.token_probabilities[2], full.token_probabilities[1]};
  expect_same_generation(continued, want, "2 -> 4 layers, rows 2 and 1");

  auto first = prefix_generation(1);
  first.keep_prompt_prefixes = true;
  auto middle = prefix_generation(3);
  middle.keep_prompt_prefixes = true;
  middle.prompt_prefixes = generate(model, prompts, first).prompt_prefixes;
  auto last = prefix_generation(4);
  last.prompt_prefixes = generate(model, prompts, middle).prompt_prefixes;
  expect_same_generation(generate(model, prompts, last), full, "1 -> 3 -> 4 layers");

  // Prefixes that do not fit are refused by name: too deep, or for other prompts.
  auto wrong = prefix_generation(2);
  wrong.prompt_prefixes = shallow.prompt_prefixes;
  EXPECT_THROW(generate(model, prompts, wrong), std::invalid_argument);
  wrong = prefix_generation(0);
  wrong.prompt_prefixes = shallow.prompt_prefixes;
  EXPECT_THROW(generate(model, {prompts[1], prompts[0], prompts[2]}, wrong), std::invalid_argument);
  EXPECT_THROW(generate(model, prompts, prefix_generation(5)), std::invalid_argument);
}

// Nine hops questions, a random 4-layer Coconut model of their vocabulary, two thoughts each, and
// the evaluation options of the cascade tests.
struct CascadeSetup {
  std::vector<Example> examples = generate_hops(9, 3);
  HopsModel hops = hops_model(examples);
  Llama model{nullptr};
  std::vector<int64_t> thoughts = std::vector<int64_t>(examples.size(), 2);
  EvalOptions options;
  CascadeSetup() {
    auto config = hops.model->config();
    config.num_hidden_layers = 4;
    config.validate();
    model = coconut::testing::tiny_model(config);
    options.mode = TrainingMode::kCoconut;
    options.max_new_tokens = 6;
    options.batch_size = 4;
  }
};

// A cascade at confidence 0 is its first level alone: the model without its deeper layers, FLOPs
// included; at confidence 1 every answer is the full model's, at the first level's cost plus the
// full run's less the prompt's shared layers; between, exactly the questions whose first answer's
// lowest token probability is at or below the threshold go deeper.
TEST(EvaluateCascade, LevelsAreTheSubStacksAndCountWhatRuns) {
  CascadeSetup setup;
  auto& [examples, hops, model, thoughts, options] = setup;
  const auto config = model->config();
  const auto full = evaluate(model, *hops.tokenizer, hops.special, examples, thoughts, options);
  auto shallow_model = drop_layers(model, {2, 3});
  const auto shallow = evaluate(shallow_model, *hops.tokenizer, hops.special, examples, thoughts, options);

  options.cascade = DepthCascade{{2, 4}, 0.0};
  const auto first_only = evaluate(model, *hops.tokenizer, hops.special, examples, thoughts, options);
  options.cascade.confidence = 1.0;
  const auto every_level = evaluate(model, *hops.tokenizer, hops.special, examples, thoughts, options);
  EXPECT_DOUBLE_EQ(first_only.deepened, 0.0);
  EXPECT_DOUBLE_EQ(every_level.deepened, 1.0);
  std::vector<double> confidences;
  for (size_t i = 0; i < examples.size(); ++i) {
    const auto& one = first_only.predictions[i];
    EXPECT_EQ(one.generated_text, shallow.predictions[i].generated_text) << i;
    EXPECT_NEAR(one.flops, shallow.predictions[i].flops, 1e-9 * one.flops) << i;
    EXPECT_EQ(one.mean_layers, 2.0);
    ASSERT_EQ(one.cascade.size(), 1u);
    const auto& both = every_level.predictions[i];
    EXPECT_EQ(both.generated_text, full.predictions[i].generated_text) << i;
    EXPECT_EQ(both.mean_layers, 4.0);
    ASSERT_EQ(both.cascade.size(), 2u);
    EXPECT_EQ(both.cascade[0].generated_text, one.generated_text);
    EXPECT_NEAR(both.cascade[0].confidence, one.cascade[0].confidence, 1e-9);
    const int64_t prompt = both.prompt_tokens - 1;  // <eot> comes after the thoughts
    const double shared = layers_prefill_flops(config, prompt, 0, 2).total();
    EXPECT_NEAR(both.cascade[1].flops, full.predictions[i].flops - shared, 1e-9 * both.flops) << i;
    EXPECT_NEAR(both.flops, one.flops + full.predictions[i].flops - shared, 1e-9 * both.flops) << i;
    confidences.push_back(one.cascade[0].confidence);
  }
  std::sort(confidences.begin(), confidences.end());
  options.cascade.confidence = confidences[4];
  const auto between = evaluate(model, *hops.tokenizer, hops.special, examples, thoughts, options);
  for (size_t i = 0; i < examples.size(); ++i) {
    const bool deeper = first_only.predictions[i].cascade[0].confidence <= confidences[4];
    EXPECT_EQ(between.predictions[i].cascade.size(), deeper ? 2u : 1u) << i;
    EXPECT_EQ(between.predictions[i].generated_text, (deeper ? full : shallow).predictions[i].generated_text) << i;
  }

  options.cascade = DepthCascade{{2, 5}, 0.5};  // deeper than the model
  EXPECT_THROW(evaluate(model, *hops.tokenizer, hops.special, examples, thoughts, options), std::invalid_argument);
  options.cascade = DepthCascade{{2, 4}, 0.5};
  options.depth.exit_threshold = 0.1;
  EXPECT_THROW(evaluate(model, *hops.tokenizer, hops.special, examples, thoughts, options), std::invalid_argument);
}

// A cascade over layer sets: each level is the model without its removed layers, run whole (the
// answers, confidences and FLOPs of `prune --drop-layers`'s model), the question run again at the
// next level where the answer's confidence is at or below the threshold, its FLOPs the sum of the
// levels it ran.
TEST(EvaluateCascade, LayerSetLevelsAreThePrunedModelsRunWhole) {
  CascadeSetup setup;
  auto& [examples, hops, model, thoughts, options] = setup;
  auto without_0_2 = drop_layers(model, {0, 2});
  auto without_1 = drop_layers(model, {1});
  const auto first = evaluate(without_0_2, *hops.tokenizer, hops.special, examples, thoughts, options);
  const auto second = evaluate(without_1, *hops.tokenizer, hops.special, examples, thoughts, options);
  const auto full = evaluate(model, *hops.tokenizer, hops.special, examples, thoughts, options);
  options.cascade = parse_depth_cascade("{0,2},{1},{}@1");  // every question through every level
  const auto every_level = evaluate(model, *hops.tokenizer, hops.special, examples, thoughts, options);
  EXPECT_DOUBLE_EQ(every_level.deepened, 1.0);
  std::vector<double> confidences;
  for (size_t i = 0; i < examples.size(); ++i) {
    const auto& all = every_level.predictions[i];
    ASSERT_EQ(all.cascade.size(), 3u);
    EXPECT_EQ(all.cascade[0].generated_text, first.predictions[i].generated_text) << i;
    EXPECT_EQ(all.cascade[1].generated_text, second.predictions[i].generated_text) << i;
    EXPECT_EQ(all.generated_text, full.predictions[i].generated_text) << i;
    EXPECT_EQ(all.cascade[0].layers, 2);
    EXPECT_EQ(all.cascade[1].layers, 3);
    EXPECT_EQ(all.mean_layers, 4.0);
    EXPECT_NEAR(all.cascade[0].flops, first.predictions[i].flops, 1e-9 * all.flops) << i;
    EXPECT_NEAR(all.cascade[1].flops, second.predictions[i].flops, 1e-9 * all.flops) << i;
    EXPECT_NEAR(all.flops, first.predictions[i].flops + second.predictions[i].flops + full.predictions[i].flops, 1e-9 * all.flops);
    confidences.push_back(all.cascade[0].confidence);
  }
  // The pruned model's own confidences decide: at a threshold between them, exactly the questions
  // at or below it get the second level's answer.
  options.cascade = parse_depth_cascade("{0,2},{1}@0");
  const auto first_only = evaluate(model, *hops.tokenizer, hops.special, examples, thoughts, options);
  std::sort(confidences.begin(), confidences.end());
  options.cascade.confidence = confidences[4];
  const auto between = evaluate(model, *hops.tokenizer, hops.special, examples, thoughts, options);
  for (size_t i = 0; i < examples.size(); ++i) {
    EXPECT_EQ(first_only.predictions[i].generated_text, first.predictions[i].generated_text) << i;
    const bool deeper = every_level.predictions[i].cascade[0].confidence <= confidences[4];
    EXPECT_EQ(between.predictions[i].cascade.size(), deeper ? 2u : 1u) << i;
    EXPECT_EQ(between.predictions[i].generated_text, (deeper ? second : first).predictions[i].generated_text) << i;
  }
  options.cascade = parse_depth_cascade("{1},{0,2}@0.5");  // the second level runs fewer layers
  EXPECT_THROW(evaluate(model, *hops.tokenizer, hops.special, examples, thoughts, options), std::invalid_argument);
  options.cascade = parse_depth_cascade("{0,4}@0.5");  // no layer 4
  EXPECT_THROW(evaluate(model, *hops.tokenizer, hops.special, examples, thoughts, options), std::invalid_argument);
}

namespace {

// What halting compares with its confidence: the lowest of the first `peek_tokens` probabilities (all at 0).
double lowest_of_first(const std::vector<double>& probabilities, int64_t peek_tokens) {
  const size_t count = peek_tokens > 0 ? std::min(probabilities.size(), static_cast<size_t>(peek_tokens)) : probabilities.size();
  return *std::min_element(probabilities.begin(), probabilities.begin() + static_cast<std::ptrdiff_t>(count));
}

}  // namespace

// Halting against plain generation at each thought count: every row's kept answer is the answer
// after the thoughts it took, each peek it undid is the answer after that count (its first
// peek_tokens tokens), every undone peek is at or below the confidence and every halt above it.
// Rows that halt at different counts share one batch of prompts of different lengths: the cache
// rewound under the rows that think on must leave their thoughts as they were.
TEST(GenerateHalting, EveryRowAnswersAsAfterTheThoughtsItTook) {
  auto model = coconut::testing::tiny_model(four_layer_config());
  const std::vector<std::vector<int64_t>> prompts = {{1, 5, 3, 9, 8}, {4, 7, 8}, {6, 2, 2, 3, 1, 0, 8}, {3, 3, 1}, {9, 8, 7, 6}};
  const std::vector<int64_t> counts = {0, 1, 3};
  std::map<int64_t, GenerationResult> plain;
  for (int64_t thoughts : counts) {
    auto options = prefix_generation(0);
    options.latent_thoughts = thoughts;
    plain[thoughts] = generate(model, prompts, options);
  }
  for (int64_t peek_tokens : {0, 2}) {
    // Thresholds between the confidences the peeks see, so that rows halt at every count.
    std::vector<double> seen;
    for (int64_t thoughts : {0, 1})
      for (const auto& probabilities : plain[thoughts].token_probabilities) seen.push_back(lowest_of_first(probabilities, peek_tokens));
    std::sort(seen.begin(), seen.end());
    std::vector<double> thresholds = {0.0, 1.0};
    for (size_t i = 0; i + 1 < seen.size(); ++i)
      if (seen[i] < seen[i + 1]) thresholds.push_back((seen[i] + seen[i + 1]) / 2);
    std::set<int64_t> taken_at;
    for (double threshold : thresholds) {
      auto options = prefix_generation(0);
      options.latent_thoughts = 3;
      options.halting = {counts, threshold, peek_tokens};
      const auto got = generate(model, prompts, options);
      const std::string what = "peek " + std::to_string(peek_tokens) + ", confidence " + std::to_string(threshold);
      ASSERT_EQ(got.thoughts_taken.size(), prompts.size()) << what;
      for (size_t row = 0; row < prompts.size(); ++row) {
        const int64_t taken = got.thoughts_taken[row];
        taken_at.insert(taken);
        const auto& want = plain.at(taken);
        EXPECT_EQ(got.tokens[row], want.tokens[row]) << what << ", row " << row;
        ASSERT_EQ(got.token_probabilities[row].size(), want.token_probabilities[row].size()) << what << ", row " << row;
        for (size_t i = 0; i < want.token_probabilities[row].size(); ++i)
          EXPECT_NEAR(got.token_probabilities[row][i], want.token_probabilities[row][i], 1e-9) << what << ", row " << row;
        const auto level = static_cast<size_t>(std::find(counts.begin(), counts.end(), taken) - counts.begin());
        ASSERT_EQ(got.undone_peeks[row].size(), level) << what << ", row " << row;
        for (size_t j = 0; j < level; ++j) {
          const auto& peek = got.undone_peeks[row][j];
          const auto& full_answer = plain.at(counts[j]).tokens[row];
          const size_t read = peek_tokens > 0 ? std::min(full_answer.size(), static_cast<size_t>(peek_tokens)) : full_answer.size();
          EXPECT_EQ(peek.thoughts, counts[j]);
          EXPECT_EQ(peek.tokens, std::vector<int64_t>(full_answer.begin(), full_answer.begin() + static_cast<std::ptrdiff_t>(read)))
              << what << ", row " << row << ", peek " << j;
          EXPECT_LE(lowest_of_first(peek.probabilities, peek_tokens), threshold) << what << ", row " << row;
        }
        if (taken < 3) {
          EXPECT_GT(lowest_of_first(want.token_probabilities[row], peek_tokens), threshold) << what << ", row " << row;
        }
      }
      if (threshold == 0.0) {
        EXPECT_EQ(got.thoughts_taken, std::vector<int64_t>(prompts.size(), 0)) << what;
      }
      if (threshold == 1.0) {
        EXPECT_EQ(got.thoughts_taken, std::vector<int64_t>(prompts.size(), 3)) << what;
      }
    }
    EXPECT_EQ(taken_at, std::set<int64_t>(counts.begin(), counts.end())) << "peek " << peek_tokens;
  }

  auto options = prefix_generation(0);
  options.latent_thoughts = 3;
  for (const auto& bad : {std::vector<int64_t>{1, 2}, {2, 1, 3}, {-1, 3}}) {
    options.halting = {bad, 0.5, 0};
    EXPECT_THROW(generate(model, prompts, options), std::invalid_argument);
  }
  options.halting = {counts, 0.5, 0};
  options.latent_bottleneck = true;
  EXPECT_THROW(generate(model, prompts, options), std::invalid_argument);
  options.latent_bottleneck = false;
  options.fixed_cache = true;
  EXPECT_THROW(generate(model, prompts, options), std::invalid_argument);
}

// Halting in evaluation: at confidence 0 every question answers after the first count (the
// answers and FLOPs of evaluating at that count), at 1 after the last, paying for the answer it
// peeked at and undid (its tokens after the thoughts and its answer, position by position);
// between, exactly the questions whose first peek is not confident think on.
TEST(EvaluateHalting, QuestionsThinkOnWhereTheirPeekIsNotConfident) {
  CascadeSetup setup;
  auto& [examples, hops, model, thoughts, options] = setup;
  const auto config = model->config();
  const auto one = evaluate(model, *hops.tokenizer, hops.special, examples, std::vector<int64_t>(examples.size(), 1), options);
  const auto two = evaluate(model, *hops.tokenizer, hops.special, examples, thoughts, options);
  const std::vector<int64_t> ignored(examples.size(), 5);  // halting's counts replace the examples' own
  options.halting = parse_thought_halting("1,2@0");
  const auto first = evaluate(model, *hops.tokenizer, hops.special, examples, ignored, options);
  options.halting.confidence = 1.0;
  const auto last = evaluate(model, *hops.tokenizer, hops.special, examples, ignored, options);
  EXPECT_DOUBLE_EQ(first.deepened, 0.0);
  EXPECT_DOUBLE_EQ(first.mean_latent_thoughts, 1.0);
  EXPECT_DOUBLE_EQ(last.deepened, 1.0);
  EXPECT_DOUBLE_EQ(last.mean_latent_thoughts, 2.0);
  EXPECT_DOUBLE_EQ(first.accuracy, one.accuracy);
  EXPECT_DOUBLE_EQ(last.accuracy, two.accuracy);
  std::vector<double> confidences;
  for (size_t i = 0; i < examples.size(); ++i) {
    const auto& early = first.predictions[i];
    EXPECT_EQ(early.generated_text, one.predictions[i].generated_text) << i;
    EXPECT_NEAR(early.flops, one.predictions[i].flops, 1e-9 * early.flops) << i;
    ASSERT_EQ(early.cascade.size(), 1u);
    EXPECT_EQ(early.cascade[0].thoughts, 1);
    const auto& late = last.predictions[i];
    EXPECT_EQ(late.generated_text, two.predictions[i].generated_text) << i;
    ASSERT_EQ(late.cascade.size(), 2u);
    EXPECT_EQ(late.cascade[0].generated_text, early.generated_text) << i;
    EXPECT_EQ(late.cascade[0].generated_tokens, early.generated_tokens) << i;
    EXPECT_EQ(late.cascade[1].thoughts, 2);
    EXPECT_EQ(late.cascade[1].generated_tokens, late.generated_tokens) << i;
    // The peek undone: <eot> after the first thought, then its n answer tokens, each position with its head.
    const int64_t prompt = late.prompt_tokens - 1, n = early.generated_tokens;
    double peek = 0;
    for (int64_t t = 0; t < n; ++t) peek += flops_per_token(config, prompt + 1 + 1 + t).total();
    EXPECT_NEAR(late.cascade[0].flops, peek, 1e-9 * peek) << i;
    EXPECT_NEAR(late.flops, two.predictions[i].flops + peek, 1e-9 * late.flops) << i;
    confidences.push_back(late.cascade[0].confidence);
  }
  std::sort(confidences.begin(), confidences.end());
  options.halting.confidence = (confidences[4] + confidences[5]) / 2;
  const auto between = evaluate(model, *hops.tokenizer, hops.special, examples, ignored, options);
  for (size_t i = 0; i < examples.size(); ++i) {
    const bool on = last.predictions[i].cascade[0].confidence <= options.halting.confidence;
    EXPECT_EQ(between.predictions[i].latent_thoughts, on ? 2 : 1) << i;
    EXPECT_EQ(between.predictions[i].generated_text, (on ? two : one).predictions[i].generated_text) << i;
  }
  EXPECT_GT(between.deepened, 0.0);
  EXPECT_LT(between.deepened, 1.0);

  options.cascade = DepthCascade{{2, 4}, 0.5};
  EXPECT_THROW(evaluate(model, *hops.tokenizer, hops.special, examples, ignored, options), std::invalid_argument);
  options.cascade = DepthCascade{};
  options.mode = TrainingMode::kCot;
  EXPECT_THROW(evaluate(model, *hops.tokenizer, hops.special, examples, ignored, options), std::invalid_argument);
}

TEST(ThoughtHaltingSettings, Parsed) {
  const auto halting = parse_thought_halting("2,4,6@0.9");
  EXPECT_EQ(halting.thoughts, (std::vector<int64_t>{2, 4, 6}));
  EXPECT_DOUBLE_EQ(halting.confidence, 0.9);
  EXPECT_EQ(describe_thought_halting(halting), "2,4,6@0.9");
  EXPECT_EQ(parse_thought_halting("0,3@1").thoughts, (std::vector<int64_t>{0, 3}));
  for (const std::string bad : {"2,4", "2,4@", "@0.5", "4,2@0.5", "2,2@0.5", "2,,4@0.5", "2,4@1.5", "2,4@-0.1", "a@0.5", "2,4@0.9x"})
    EXPECT_THROW(parse_thought_halting(bad), std::invalid_argument) << bad;
}

TEST(DepthCascadeSettings, ParsedCheckedAndKeptInCoconutJson) {
  const auto cascade = parse_depth_cascade("5,6,8@0.95");
  EXPECT_EQ(cascade.depths, (std::vector<int64_t>{5, 6, 8}));
  EXPECT_DOUBLE_EQ(cascade.confidence, 0.95);
  for (const std::string bad : {"5,8", "5,8@", "5,,8@0.9", "5,8@1.5", "a@0.5", "5,8@0.9x", "{1,3},@0.9", "{1,3}{1}@0.9",
                                "{1,3},5@0.9", "{1,,3}@0.9", "{1@0.9", "{ 1}@0.9", "5,{1}@0.9"})
    EXPECT_THROW(parse_depth_cascade(bad), std::invalid_argument) << bad;
  const auto sets = parse_depth_cascade("{1,3,5,7},{1,5},{}@0.9");
  EXPECT_TRUE(sets.layer_sets());
  EXPECT_TRUE(sets.depths.empty());
  EXPECT_EQ(sets.removed, (std::vector<std::vector<int64_t>>{{1, 3, 5, 7}, {1, 5}, {}}));
  EXPECT_EQ(sets.levels(), 3u);
  EXPECT_EQ(sets.level_layers(1, 8), 6);
  EXPECT_EQ(describe_depth_cascade(sets), "{1,3,5,7},{1,5},{}@0.9");
  EXPECT_EQ(describe_depth_cascade(cascade), "5,6,8@0.95");
  EXPECT_NO_THROW(check_depth_cascade(sets, 8, "m"));
  EXPECT_THROW(check_depth_cascade(sets, 7, "m"), std::invalid_argument);  // no layer 7
  EXPECT_THROW(check_depth_cascade(parse_depth_cascade("{3,1}@0.5"), 8, "m"), std::invalid_argument);
  EXPECT_THROW(check_depth_cascade(parse_depth_cascade("{1},{2}@0.5"), 8, "m"), std::invalid_argument);
  EXPECT_THROW(check_depth_cascade(parse_depth_cascade("{0,1}@0.5"), 2, "m"), std::invalid_argument);
  EXPECT_THROW(check_depth_cascade({{5, 5}, 0.5}, 8, "m"), std::invalid_argument);
  EXPECT_THROW(check_depth_cascade({{0, 8}, 0.5}, 8, "m"), std::invalid_argument);
  EXPECT_NO_THROW(check_depth_cascade({{5, 8}, 0.5}, 8, "m"));

  const auto folder = std::filesystem::temp_directory_path() / ("coconut_cascade_" + std::to_string(::getpid()));
  std::filesystem::create_directories(folder);
  ReasoningSettings settings;
  settings.mode = "coconut";
  settings.depth_cascade = cascade;
  std::ofstream(folder / kReasoningSettingsFile) << reasoning_settings_to_json(settings).dump();
  const auto read = load_reasoning_settings(folder.string());
  EXPECT_EQ(read.depth_cascade.depths, cascade.depths);
  EXPECT_DOUBLE_EQ(read.depth_cascade.confidence, cascade.confidence);
  settings.depth_cascade = sets;
  std::ofstream(folder / kReasoningSettingsFile) << reasoning_settings_to_json(settings).dump();
  EXPECT_EQ(load_reasoning_settings(folder.string()).depth_cascade.removed, sets.removed);
  settings.depth_cascade = cascade;
  EXPECT_FALSE(reasoning_settings_to_json(ReasoningSettings{}).contains("depth_cascade"));
  auto broken = reasoning_settings_to_json(settings);
  broken["depth_cascade"]["depths"] = {8, 5};
  std::ofstream(folder / kReasoningSettingsFile) << broken.dump();
  try {
    load_reasoning_settings(folder.string());
    ADD_FAILURE() << "descending depths were read";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("coconut.json"), std::string::npos) << error.what();
  }
  std::filesystem::remove_all(folder);
}

// coconut.json's "weights" is what `--weights auto` runs, on the CPU and without a merged adapter.
TEST(WeightsSetting, AutoIsTheFoldersFormatOnTheCpuWithoutAnAdapter) {
  const auto folder = std::filesystem::temp_directory_path() / ("coconut_weights_" + std::to_string(::getpid()));
  std::filesystem::create_directories(folder);
  EXPECT_EQ(resolve_weights("auto", folder.string(), false, true), "dense");  // no coconut.json
  ReasoningSettings settings;
  settings.weights = "q4_1";
  std::ofstream(folder / kReasoningSettingsFile) << reasoning_settings_to_json(settings).dump();
  EXPECT_EQ(load_reasoning_settings(folder.string()).weights, "q4_1");
  EXPECT_EQ(resolve_weights("auto", folder.string(), false, true), "q4_1");
  EXPECT_EQ(resolve_weights("auto", folder.string(), true, true), "dense");   // an adapter merged in
  EXPECT_EQ(resolve_weights("auto", folder.string(), false, false), "dense");  // a GPU
  EXPECT_EQ(resolve_weights("dense", folder.string(), false, true), "dense");
  EXPECT_EQ(resolve_weights("q8_0", folder.string(), true, true), "q8_0");
  EXPECT_FALSE(reasoning_settings_to_json(ReasoningSettings{}).contains("weights"));
  auto broken = reasoning_settings_to_json(settings);
  broken["weights"] = "q3_k";
  std::ofstream(folder / kReasoningSettingsFile) << broken.dump();
  try {
    resolve_weights("auto", folder.string(), false, true);
    ADD_FAILURE() << "an unknown format was read";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("coconut.json"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("q3_k"), std::string::npos) << error.what();
  }
  std::filesystem::remove_all(folder);
}
