// The cached Coconut latent forward against the naive one that re-runs the whole prefix for
// every thought: values and gradients (weights and input embeddings) must agree.
#include <gtest/gtest.h>

#include <ATen/record_function.h>

#include <atomic>

#include "eval/cost.h"
#include "model/autocast.h"
#include "model/lora.h"
#include "reasoning/latent_forward.h"
#include "reasoning/training_loss.h"
#include "support/heap.h"
#include "support/autograd_graph.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

using namespace coconut;
using coconut::testing::count_graph_nodes;

namespace {

LatentBatch make_batch(Llama& model, int64_t latents) {
  // Two rows, the second left-padded by 2; latents start at column 4 in both.
  auto ids = torch::tensor(std::vector<int64_t>{1, 5, 3, 9, 0, 0, 0, 7, 2, 6, 0, 0, 1, 4, 0, 0, 0, 8, 3, 2}).view({2, 10});
  auto mask = torch::ones({2, 10}, torch::kInt64);
  mask[1][0] = 0;
  mask[1][1] = 0;
  LatentBatch batch;
  batch.embeddings = model->embed(ids);
  batch.attention_mask = mask;
  batch.positions = (mask.cumsum(1) - 1).clamp_min(0);
  batch.first_latent = 4;
  batch.latent_count = latents;
  return batch;
}

// One row of 8 columns, two thoughts at columns 4 and 5 (token 6 there), the last two labelled.
Batch one_row_thought_batch() {
  Batch batch;
  batch.ids = torch::tensor(std::vector<int64_t>{1, 5, 3, 9, 6, 6, 7, 2}).view({1, 8});
  batch.labels = torch::full({1, 8}, kIgnoreLabel, torch::kInt64);
  batch.labels[0][6] = 7;
  batch.labels[0][7] = 2;
  batch.attention_mask = torch::ones({1, 8}, torch::kInt64);
  batch.positions = torch::arange(8).view({1, 8});
  batch.first_latent = 4;
  batch.latent_count = 2;
  return batch;
}

// Appends <bot> (id 4), `latent` thought columns and <eot> (id 5 each), none labelled; nothing
// without thoughts.
void append_thoughts(Sequence& sequence, int64_t latent) {
  if (latent == 0) return;
  sequence.ids.push_back(4);
  sequence.labels.push_back(kIgnoreLabel);
  sequence.first_latent = static_cast<int64_t>(sequence.ids.size());
  sequence.latent_count = latent;
  for (int64_t i = 0; i <= latent; ++i) {
    sequence.ids.push_back(5);
    sequence.labels.push_back(kIgnoreLabel);
  }
}

}  // namespace

TEST(LatentForward, CachedEqualsNaiveInValuesAndGradients) {
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  model->train();
  torch::manual_seed(3);
  auto probe = torch::randn({2, 10, model->config().hidden_size});

  auto run = [&](bool naive) {
    model->zero_grad();
    auto batch = make_batch(model, 3);
    auto embeddings = batch.embeddings.detach().requires_grad_(true);
    batch.embeddings = embeddings;
    auto result = naive ? latent_forward_naive(model, batch) : latent_forward(model, batch);
    // The thought passes' weight gradients are gathered: one node for each of the 2 x 7 projections.
    if (!naive) {
      EXPECT_EQ(count_graph_nodes(result.hidden, "GatherWeightGradient"), 14);
    }
    // Loss on the columns after the thoughts, as training does, plus a little on every real
    // column (padding columns are garbage by design and must not reach the loss).
    auto real = batch.attention_mask.to(torch::kFloat32).unsqueeze(-1);  // [B, T, 1]
    auto loss = (result.hidden.narrow(1, 7, 3) * probe.narrow(1, 7, 3)).sum() +
                (model->logits(result.hidden) * real).sum() * 1e-2;
    loss.backward();
    std::map<std::string, torch::Tensor> gradients;
    for (auto& named : model->named_parameters())  // the embedding table is reached only through the inputs
      if (named.value().grad().defined()) gradients[named.key()] = named.value().grad().clone();
    gradients["<inputs_embeds>"] = embeddings.grad().clone();
    return std::make_tuple(result.hidden.detach(), result.latent_inputs.detach(), gradients);
  };
  auto [hidden, latents, gradients] = run(false);
  auto [hidden_naive, latents_naive, gradients_naive] = run(true);

  // Same float32 arithmetic in a different grouping of columns: 1e-5 absolute on O(1) values.
  // Padding columns (row 1, columns 0-1) are excluded: they are garbage by design in both.
  EXPECT_LT((hidden - hidden_naive).narrow(1, 2, 8).abs().max().item<double>(), 1e-5);
  EXPECT_LT((latents - latents_naive).abs().max().item<double>(), 1e-5);
  ASSERT_EQ(gradients.size(), gradients_naive.size());
  ASSERT_GE(gradients.size(), 19u);  // 2 layers x 9 tensors + final norm (+ inputs)
  double worst = 0;
  std::string worst_name;
  for (auto& [name, gradient] : gradients) {
    const auto& reference = gradients_naive.at(name);
    const double scale = reference.abs().max().item<double>() + 1e-6;
    const double difference = (gradient - reference).abs().max().item<double>() / scale;
    if (difference > worst) worst = difference, worst_name = name;
    ASSERT_GT(reference.abs().sum().item<double>(), 0.0) << name << " got no gradient";
  }
  std::printf("largest relative gradient difference %.3g (%s)\n", worst, worst_name.c_str());
  // Relative to the largest gradient entry of each tensor; float32 accumulation differences.
  EXPECT_LT(worst, 1e-4) << worst_name;
}

TEST(LatentForward, ThoughtIsPreviousFinalHiddenState) {
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  torch::NoGradGuard no_grad;
  auto batch = make_batch(model, 2);
  auto result = latent_forward(model, batch);
  // The first thought is the output at column 3, the second the output at column 4.
  EXPECT_TRUE(torch::allclose(result.latent_inputs.select(1, 0), result.hidden.select(1, 3)));
  EXPECT_TRUE(torch::allclose(result.latent_inputs.select(1, 1), result.hidden.select(1, 4)));
}

TEST(LatentForward, RescaledThoughtsHaveTheTargetRmsInBothImplementations) {
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  torch::NoGradGuard no_grad;
  model->set_latent_thought_rms(0.05);
  auto batch = make_batch(model, 2);
  const auto cached = latent_forward(model, batch), naive = latent_forward_naive(model, batch);
  // The first thought is the output at column 3 rescaled to RMS 0.05, the second the output at column 4.
  for (int64_t i = 0; i < 2; ++i) {
    const auto source = cached.hidden.select(1, 3 + i);  // [B, D]
    const auto expected = source * 0.05 / source.square().mean(-1, true).sqrt();
    EXPECT_LT((cached.latent_inputs.select(1, i) - expected).abs().max().item<double>(), 1e-6) << "thought " << i;
  }
  EXPECT_LT((cached.latent_inputs - naive.latent_inputs).abs().max().item<double>(), 1e-6);
  EXPECT_LT((cached.hidden - naive.hidden).narrow(1, 2, 8).abs().max().item<double>(), 1e-5);
  model->set_latent_thought_rms(0);
  EXPECT_GT((latent_forward(model, batch).hidden - cached.hidden).narrow(1, 5, 5).abs().max().item<double>(), 1e-3);
}

TEST(LatentForward, ExpectedEmbeddingThoughtsMixTheTableByTheNextTokenDistribution) {
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  model->set_latent_thought_input("expected_embedding");
  auto batch = make_batch(model, 2);
  const auto cached = latent_forward(model, batch);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t row = 0; row < cached.hidden.size(0); ++row) {
      // Reference: softmax of the source's logits, then the table's rows weighted one at a time.
      const auto expected = coconut::testing::naive_expected_embedding(model, cached.hidden[row][3 + i].detach());
      EXPECT_LT((cached.latent_inputs[row][i].detach() - expected).abs().max().item<double>(), 1e-6)
          << "row " << row << ", thought " << i;
    }
  const auto naive = latent_forward_naive(model, batch);
  EXPECT_LT((cached.latent_inputs - naive.latent_inputs).abs().max().item<double>(), 1e-6);
  // Training reaches the thoughts through the mixture: the columns after the thoughts have a
  // gradient with respect to the table's row 10, which no token of the batch is (ids 0..9).
  cached.hidden.narrow(1, 5, 5).sum().backward();
  EXPECT_GT(model->embed_tokens->weight.grad()[10].abs().sum().item<double>(), 0);
  model->zero_grad();
  model->set_latent_thought_input("last_hidden");
  latent_forward(model, make_batch(model, 2)).hidden.narrow(1, 5, 5).sum().backward();
  // Without the option that row gets none: the check above tells the two apart.
  EXPECT_EQ(model->embed_tokens->weight.grad()[10].abs().sum().item<double>(), 0);
}

TEST(ThoughtStepLoss, EqualsDecodingEachStepAloneAndReachesTheThoughts) {
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  torch::manual_seed(5);
  const int64_t c = 2, width = model->config().hidden_size;
  auto thoughts = torch::randn({2, 4, width}).requires_grad_(true);  // 2 rows x 2 steps x c thoughts
  Batch batch;
  batch.thoughts_per_step = c;
  batch.latent_steps = {{{3, 7, 9}, {8, 1}}, {{5}}};  // row 1: one step described, of one token
  const auto loss = thought_step_loss(model, thoughts, batch, torch::kCPU);
  // Reference: each step decoded alone, no padding; the sum of token losses over all 6 tokens.
  double total = 0;
  int64_t tokens = 0;
  for (int64_t row = 0; row < 2; ++row)
    for (size_t i = 0; i < batch.latent_steps[static_cast<size_t>(row)].size(); ++i) {
      const auto& step = batch.latent_steps[static_cast<size_t>(row)][i];
      auto inputs = thoughts[row].narrow(0, static_cast<int64_t>(i) * c, c).unsqueeze(0);  // [1, c, D]
      if (step.size() > 1) {
        auto ids = torch::tensor(std::vector<int64_t>(step.begin(), step.end() - 1)).view({1, -1});
        inputs = torch::cat({inputs, model->embed(ids)}, 1);  // [1, c + L - 1, D]
      }
      auto hidden = model->forward(inputs, torch::arange(inputs.size(1)).view({1, -1})).hidden;
      auto logits = model->logits(hidden[0].narrow(0, c - 1, static_cast<int64_t>(step.size())));  // [L, V]
      total += torch::nn::functional::cross_entropy(logits, torch::tensor(step),
                                                    torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                   .item<double>();
      tokens += static_cast<int64_t>(step.size());
    }
  EXPECT_NEAR(loss.item<double>(), total / static_cast<double>(tokens), 1e-5);
  loss.backward();
  // Row 1's second step has no text: its thoughts get no gradient; every described thought does.
  EXPECT_EQ(thoughts.grad()[1].narrow(0, 2, 2).abs().sum().item<double>(), 0.0);
  EXPECT_GT(thoughts.grad()[0].abs().min().item<double>(), 0.0);
  EXPECT_GT(thoughts.grad()[1].narrow(0, 0, 2).abs().sum().item<double>(), 0.0);
  batch.latent_steps = {{}, {}};
  EXPECT_FALSE(thought_step_loss(model, thoughts, batch, torch::kCPU).defined());
}

TEST(ThoughtReachableLoss, EqualsEachThoughtsDivergenceFromUniformOverItsSetAndReachesOnlyThoseThoughts) {
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  torch::manual_seed(7);
  const int64_t width = model->config().hidden_size, vocabulary = model->config().vocab_size;
  auto sources = torch::randn({2, 3, width}).requires_grad_(true);
  Batch batch;
  batch.latent_reachable = {{{1, 2}, {3}, {}}, {{4, 5, 6}, {}, {}}};
  const auto loss = thought_reachable_loss(model, sources, batch, torch::kCPU);
  // Reference: KL(uniform over the set || softmax of the thought's logits), one thought at a time:
  // sum over the set of (1/|S|) log((1/|S|) / p_v); weighted by thought index (the last weight for
  // every later thought), the first thought counting 4 times and the others half.
  double total = 0, weighted_total = 0;
  int counted = 0;
  for (int64_t row = 0; row < 2; ++row)
    for (int64_t j = 0; j < 3; ++j) {
      const auto& set = batch.latent_reachable[static_cast<size_t>(row)][static_cast<size_t>(j)];
      if (set.empty()) continue;
      const auto probabilities = torch::softmax(model->logits(sources[row][j]).to(torch::kFloat64), -1);  // [V]
      const double uniform = 1.0 / static_cast<double>(set.size());
      double divergence = 0;
      for (int64_t token : set) divergence += uniform * std::log(uniform / probabilities[token].item<double>());
      total += divergence;
      weighted_total += (j == 0 ? 4.0 : 0.5) * divergence;
      ++counted;
    }
  EXPECT_NEAR(loss.item<double>(), total / counted, 1e-5);
  EXPECT_GT(loss.item<double>(), 0.1);
  EXPECT_NEAR(thought_reachable_loss(model, sources, batch, torch::kCPU, {4.0, 0.5}).item<double>(), weighted_total / counted, 1e-5);
  EXPECT_EQ(thought_reachable_loss(model, sources, batch, torch::kCPU, {1.0}).item<double>(), loss.item<double>());
  loss.backward();
  EXPECT_GT(sources.grad()[0][0].abs().sum().item<double>(), 0.0);
  EXPECT_GT(sources.grad()[1][0].abs().sum().item<double>(), 0.0);
  EXPECT_EQ(sources.grad()[0][2].abs().sum().item<double>(), 0.0);
  EXPECT_EQ(sources.grad()[1].narrow(0, 1, 2).abs().sum().item<double>(), 0.0);
  // No sets, no loss; a token beyond the vocabulary is named.
  batch.latent_reachable = {{}, {}};
  EXPECT_FALSE(thought_reachable_loss(model, sources, batch, torch::kCPU).defined());
  batch.latent_reachable = {{{vocabulary}, {}, {}}, {}};
  EXPECT_THROW_WITH(thought_reachable_loss(model, sources, batch, torch::kCPU), "node token", "vocabulary");
}

TEST(ThoughtReachableLoss, ThoughtSourcesAreTheHiddenStatesTheThoughtsAreMadeOf) {
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  torch::NoGradGuard no_grad;
  model->set_latent_thought_rms(0.05);
  Batch batch = one_row_thought_batch();
  const auto result = training_loss(model, batch, torch::kCPU, false);
  ASSERT_TRUE(result.thought_sources.defined());
  ASSERT_EQ(result.thought_sources.sizes(), result.thoughts.sizes());
  EXPECT_TRUE(torch::allclose(model->thought_input(result.thought_sources), result.thoughts, 1e-6, 1e-6));
  // The first is the last hidden state of the question's columns, before any rescaling.
  const auto question = model->forward_ids(batch.ids.narrow(1, 0, 4)).hidden;  // [1, 4, D]
  EXPECT_TRUE(torch::allclose(result.thought_sources[0][0], question[0][3], 1e-5, 1e-5));
  EXPECT_GT((result.thought_sources[0][0] - result.thoughts[0][0]).abs().max().item<double>(), 1e-3);
}

TEST(ThoughtReachableLoss, PauseThoughtsAreTokensAndTheirSourcesThePlainForwardsStates) {
  // pause_as_thought: the same columns as the test above, holding the pause token (6): the loss is
  // the plain forward's over the ids, nothing is fed back, and the supervised states are the plain
  // forward's hidden states before each pause column.
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  torch::NoGradGuard no_grad;
  Batch batch = one_row_thought_batch();
  batch.thoughts_are_pauses = true;
  const auto result = training_loss(model, batch, torch::kCPU, true);
  EXPECT_FALSE(result.thoughts.defined());
  EXPECT_FALSE(result.latent_norm.defined());
  const auto plain = model->forward_ids(batch.ids).hidden;  // [1, 8, D]
  ASSERT_TRUE(result.thought_sources.defined());
  EXPECT_TRUE(torch::allclose(result.thought_sources[0], plain[0].narrow(0, 3, 2), 1e-5, 1e-5));
  // Naive loss: position 5 predicts 7, position 6 predicts 2.
  const auto log_probs = torch::log_softmax(model->logits(plain[0]), -1);  // [8, V]
  const double expected = -(log_probs[5][7].item<double>() + log_probs[6][2].item<double>()) / 2;
  EXPECT_NEAR(result.loss.item<double>(), expected, 1e-5);
  // The same columns as continuous thoughts give another loss: the flag decides.
  batch.thoughts_are_pauses = false;
  EXPECT_GT(std::abs(training_loss(model, batch, torch::kCPU, false).loss.item<double>() - expected), 1e-4);
}

// training_loss runs the last layer on the columns from the first labelled prediction (and the
// thought sources) only: its loss, logits and gradients are those of the whole forward read at the
// labelled columns, for CoT, Coconut (the first pass is cut) and pause rows, left-padded.
TEST(TrainingLoss, TheCutLastLayerGivesTheWholeForwardsLossAndGradients) {
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  model->train();
  const auto make = [](int64_t latent, bool pauses) {
    std::vector<Sequence> sequences;
    for (int64_t row = 0; row < 2; ++row) {
      Sequence sequence;
      for (int64_t i = 0; i < 6 + 2 * row; ++i) {  // questions of 6 and 8 tokens
        sequence.ids.push_back(1 + (3 * i + row) % 9);
        sequence.labels.push_back(kIgnoreLabel);
      }
      append_thoughts(sequence, latent);
      sequence.thoughts_are_pauses = pauses;
      for (int64_t i = 0; i < 4; ++i) {
        sequence.ids.push_back(2 + (i + row) % 7);
        sequence.labels.push_back(sequence.ids.back());
      }
      sequences.push_back(std::move(sequence));
    }
    return collate(sequences, 0);
  };
  for (const auto& [latent, pauses] : {std::pair<int64_t, bool>{0, false}, {2, false}, {2, true}}) {
    const Batch batch = make(latent, pauses);
    model->zero_grad();
    const auto cut = training_loss(model, batch, torch::kCPU, false);
    cut.loss.backward();
    std::vector<torch::Tensor> cut_gradients;
    for (const auto& parameter : model->parameters()) cut_gradients.push_back(parameter.grad().clone());

    // The reference: every column through every layer, then the labelled ones.
    model->zero_grad();
    const auto embeddings = model->embed(batch.ids);
    const auto mask = batch.attention_mask;
    torch::Tensor hidden;  // [B, T, D]
    if (latent > 0 && !pauses) {
      LatentBatch whole{embeddings, batch.positions, mask, batch.first_latent, batch.latent_count, torch::Tensor(), ForwardOptions()};
      hidden = latent_forward(model, whole).hidden;
    } else {
      ForwardOptions options;
      options.attention_mask = mask;
      hidden = model->forward(embeddings, batch.positions, nullptr, options).hidden;
    }
    const int64_t columns = batch.ids.size(1);
    const auto targets = batch.labels.narrow(1, 1, columns - 1);
    const auto selected = targets.ne(kIgnoreLabel);
    const auto logits = model->logits(hidden.narrow(1, 0, columns - 1).index({selected}));  // [N, V]
    const auto loss = torch::nn::functional::cross_entropy(logits, targets.index({selected}));
    loss.backward();
    const std::string name = latent == 0 ? "CoT" : (pauses ? "pauses" : "Coconut");
    EXPECT_NEAR(cut.loss.item<double>(), loss.item<double>(), 1e-5) << name;
    EXPECT_LT((cut.logits - logits).abs().max().item<double>(), 1e-5) << name;
    if (latent > 0) {
      EXPECT_LT((cut.thought_sources - hidden.narrow(1, batch.first_latent - 1, latent)).abs().max().item<double>(), 1e-5) << name;
    }
    const auto parameters = model->parameters();
    for (size_t i = 0; i < parameters.size(); ++i) {
      const double scale = parameters[i].grad().abs().max().item<double>() + 1e-12;
      EXPECT_LT((cut_gradients[i] - parameters[i].grad()).abs().max().item<double>() / scale, 1e-4) << name << ", parameter " << i;
    }
  }
}

TEST(LatentForward, NoLatentsEqualsPlainForward) {
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  torch::NoGradGuard no_grad;
  auto batch = make_batch(model, 0);
  ForwardOptions options;
  options.attention_mask = batch.attention_mask;
  auto plain = model->forward(batch.embeddings, batch.positions, nullptr, options).hidden;
  EXPECT_LT((latent_forward(model, batch).hidden - plain).narrow(1, 2, 8).abs().max().item<double>(), 1e-5);
}

TEST(LatentForward, TheRouterDecidesForThoughtsAndGeneratedTokensOnly) {
  // Row 0: pad, q q <bot> T T <eot> a a ; row 1: q q q <bot> T T <eot> a (left-padded so the
  // thoughts share columns 4, 5). Generation runs the thoughts and every fed-back answer token one at
  // a time; the question, <bot> and <eot> run with the prompt.
  coconut::Batch batch;
  const int64_t ignore = coconut::kIgnoreLabel, a7 = 7, a8 = 8;
  batch.ids = torch::tensor({{0, 5, 5, 5, 3, 3, 4, 7, 8}, {5, 5, 5, 5, 3, 3, 4, 7, 0}}, torch::kInt64);
  batch.labels = torch::tensor({{ignore, ignore, ignore, ignore, ignore, ignore, ignore, a7, a8},
                                {ignore, ignore, ignore, ignore, ignore, ignore, ignore, a7, ignore}}, torch::kInt64);
  batch.attention_mask = torch::tensor({{0, 1, 1, 1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1, 1, 1, 0}}, torch::kInt64);
  batch.first_latent = 4;
  batch.latent_count = 2;
  const auto routed = coconut::routed_positions(batch, torch::kCPU);
  const auto expected = torch::tensor({{false, false, false, false, true, true, false, true, true},
                                       {false, false, false, false, true, true, false, true, false}});
  EXPECT_TRUE(torch::equal(routed, expected)) << routed;
}

TEST(LatentForward, BottleneckHidesTheQuestionFromTheColumnsAfterTheThoughtsOnly) {
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  torch::NoGradGuard no_grad;
  auto open = make_batch(model, 2);  // columns: question 0-2, <bot> 3, thoughts 4-5, the rest 6-9
  auto narrowed = make_batch(model, 2);
  narrowed.bottleneck_rows = torch::tensor(std::vector<uint8_t>{0, 1}).to(torch::kBool);
  const auto without = latent_forward(model, open), with = latent_forward(model, narrowed);
  // Row 0 has no bottleneck, and the thoughts of both rows see the question: all unchanged.
  EXPECT_TRUE(torch::equal(with.hidden[0], without.hidden[0]));
  EXPECT_TRUE(torch::equal(with.latent_inputs, without.latent_inputs));
  EXPECT_TRUE(torch::equal(with.hidden[1].narrow(0, 0, 6), without.hidden[1].narrow(0, 0, 6)));
  EXPECT_GT((with.hidden[1].narrow(0, 6, 4) - without.hidden[1].narrow(0, 6, 4)).abs().max().item<double>(), 1e-3);

  // Reference for row 1: the naive thoughts written into the embeddings, one forward of columns
  // 0-5 into a preallocated cache, columns 0-2 hidden, then one forward of the rest.
  const auto thoughts = latent_forward_naive(model, open).latent_inputs;  // [B, 2, D]
  auto embeddings = torch::cat({open.embeddings.narrow(1, 0, 4), thoughts, open.embeddings.narrow(1, 6, 4)}, 1);
  auto cache = KVCache::preallocated(model->config(), 2, 10, embeddings.scalar_type(), embeddings.device());
  ForwardOptions first;
  first.attention_mask = open.attention_mask.narrow(1, 0, 6);
  model->forward(embeddings.narrow(1, 0, 6), open.positions.narrow(1, 0, 6), &cache, first);
  cache.hide_prefix(narrowed.bottleneck_rows, 3);
  ForwardOptions rest;
  rest.attention_mask = open.attention_mask.narrow(1, 6, 4);
  const auto expected = model->forward(embeddings.narrow(1, 6, 4), open.positions.narrow(1, 6, 4), &cache, rest).hidden;
  EXPECT_LT((with.hidden.narrow(1, 6, 4) - expected).abs().max().item<double>(), 1e-5);
}

TEST(KVCache, HiddenColumnsAreLeftOutOfLaterAttention) {
  // One layer: a column's K/V depend on its own input alone, so attending with column 0 hidden is
  // attending over columns 1-3 as if column 0 were never there (positions kept).
  auto config = coconut::testing::tiny_config();
  config.num_hidden_layers = 1;
  auto model = coconut::testing::tiny_model(config);
  torch::NoGradGuard no_grad;
  auto embeddings = model->embed(torch::tensor(std::vector<int64_t>{1, 5, 3, 9}).view({1, 4}));
  auto positions = torch::arange(4, torch::kInt64).view({1, 4});
  auto cache = KVCache::growing(model->config());
  model->forward(embeddings.narrow(1, 0, 3), positions.narrow(1, 0, 3), &cache, {});
  cache.hide_prefix(torch::ones({1}, torch::kBool), 1);
  const auto hidden = model->forward(embeddings.narrow(1, 3, 1), positions.narrow(1, 3, 1), &cache, {}).hidden;
  const auto expected = model->forward(embeddings.narrow(1, 1, 3), positions.narrow(1, 1, 3), nullptr, {}).hidden.narrow(1, 2, 1);
  EXPECT_LT((hidden - expected).abs().max().item<double>(), 1e-6);
  const auto open = model->forward(embeddings, positions, nullptr, {}).hidden.narrow(1, 3, 1);
  EXPECT_GT((hidden - open).abs().max().item<double>(), 1e-4);
  EXPECT_THROW(cache.hide_prefix(torch::ones({1}, torch::kBool), 9), std::out_of_range);
  EXPECT_THROW(cache.hide_prefix(torch::ones({3}, torch::kBool), 1), std::invalid_argument);
}

// Distillation against the definition, one position at a time in float64:
// T^2 * mean_n sum_v q_v (log q_v - log p_v), q = softmax(teacher / T), p = softmax(student / T).
TEST(DistillationLoss, EqualsTemperatureScaledKlPerPosition) {
  torch::manual_seed(5);
  const auto student = torch::randn({3, 7}, torch::kFloat64), teacher = torch::randn({3, 7}, torch::kFloat64) * 2;
  for (double t : {1.0, 2.0}) {
    double sum = 0;
    for (int64_t n = 0; n < 3; ++n) {
      double zs = 0, zt = 0;
      for (int64_t v = 0; v < 7; ++v) zs += std::exp(student[n][v].item<double>() / t), zt += std::exp(teacher[n][v].item<double>() / t);
      for (int64_t v = 0; v < 7; ++v) {
        const double q = std::exp(teacher[n][v].item<double>() / t) / zt, p = std::exp(student[n][v].item<double>() / t) / zs;
        sum += q * (std::log(q) - std::log(p));
      }
    }
    EXPECT_NEAR(coconut::distillation_loss(student, teacher, t).item<double>(), t * t * sum / 3, 1e-12) << t;
  }
  EXPECT_NEAR(coconut::distillation_loss(teacher, teacher, 2.0).item<double>(), 0.0, 1e-12);
  EXPECT_THROW(coconut::distillation_loss(student, teacher, 0.0), std::invalid_argument);
  EXPECT_THROW(coconut::distillation_loss(student, teacher.narrow(1, 0, 6), 1.0), std::invalid_argument);
}

// The memory plan's Coconut term against measured steps: what a training forward with six
// thoughts keeps alive beyond one with three (glibc's heap in use after each, bf16 autocast on the
// CPU, whose attention keeps its K/V in float32: thought_kv_bytes 4) is the last three passes'
// caches, against the plan's difference between the two (measured 1.03). Against a CoT step of
// the same length (pass 0 keeps its own K/V too) it measured 1.13: about 4.6 MB of splitting the
// step into passes, 2.5% of this step, are not modelled.
TEST(TrainingMemory, ThoughtPassesKeepWhatThePlanCounts) {
  if (!coconut::testing::kGlibcHeap) GTEST_SKIP() << "AddressSanitizer replaces malloc: glibc's heap counters read 0";
  const LlamaConfig config = coconut::testing::small_gqa_config(1024);
  // Long enough that the caches dwarf autograd's own bookkeeping of a pass on the host (about
  // 75 KB a layer for a one-position pass, whatever the cache length: not device memory).
  const int64_t rows = 16, tokens = 640, question = 512, thoughts = 6;
  torch::manual_seed(0);
  Llama model(config);
  model->train();
  const auto make_batch = [&](int64_t latent) {
    std::mt19937_64 random(11);
    std::uniform_int_distribution<int64_t> token(8, config.vocab_size - 1);
    std::vector<Sequence> sequences;
    for (int64_t row = 0; row < rows; ++row) {
      Sequence sequence;
      for (int64_t i = 0; i < question; ++i) {
        sequence.ids.push_back(token(random));
        sequence.labels.push_back(kIgnoreLabel);
      }
      append_thoughts(sequence, latent);
      while (static_cast<int64_t>(sequence.ids.size()) < tokens) {
        sequence.ids.push_back(token(random));
        sequence.labels.push_back(sequence.ids.back());
      }
      sequences.push_back(std::move(sequence));
    }
    return collate(sequences, 0);
  };
  using coconut::testing::heap_in_use;
  const std::vector<int64_t> counts = {0, thoughts / 2, thoughts};
  std::vector<int64_t> kept, labelled;
  for (const int64_t latent : counts) {
    const Batch batch = make_batch(latent);
    {  // a first step fills what libraries keep once allocated; the second is measured
      AutocastScope autocast(true, torch::kCPU);
      training_loss(model, batch, torch::kCPU, false).loss.backward();
    }
    AutocastScope autocast(true, torch::kCPU);
    const int64_t before = heap_in_use();
    const auto step = training_loss(model, batch, torch::kCPU, false);
    kept.push_back(heap_in_use() - before);
    labelled.push_back(step.labelled / rows);
  }
  const auto plan = [&](int64_t latent, int64_t labelled_tokens) {
    TrainingMemoryOptions options;
    options.batch = rows;
    options.tokens = tokens;
    options.labelled_tokens = labelled_tokens;
    options.latent_thoughts = latent;
    options.first_latent = question + 1;
    options.thought_kv_bytes = 4;
    return training_memory(config, options);
  };
  std::vector<int64_t> planned;
  for (size_t i = 0; i < counts.size(); ++i) planned.push_back(plan(counts[i], labelled[i]).activations);
  const auto ratio = [&](size_t from, size_t to) {
    return static_cast<double>(kept[to] - kept[from]) / static_cast<double>(planned[to] - planned[from]);
  };
  std::printf("measured / planned: 3 -> 6 thoughts %.3f (%lld bytes measured), CoT -> 6 thoughts %.3f\n", ratio(1, 2),
              static_cast<long long>(kept[2] - kept[1]), ratio(0, 2));
  EXPECT_NEAR(ratio(1, 2), 1.0, 0.05);
  EXPECT_NEAR(ratio(0, 2), 1.0, 0.15);
  EXPECT_GT(plan(thoughts, labelled[2]).activations_thoughts, 0);
}

namespace {

// Operations dispatched (aten ops, nested ones included) while a callback is installed.
std::atomic<int64_t> dispatched_operations{0};

std::unique_ptr<at::ObserverContext> count_operation(const at::RecordFunction&) {
  dispatched_operations.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

// The operations a Coconut step (forward with `latents` thoughts, then backward) dispatches for a
// batch of `rows` (the two rows of make_batch, repeated).
int64_t step_operations(Llama& model, int64_t rows, int64_t latents) {
  auto batch = make_batch(model, latents);
  const auto repeat = [rows](const torch::Tensor& t) {
    std::vector<int64_t> times(static_cast<size_t>(t.dim()), 1);
    times[0] = rows / 2;
    return t.repeat(times);  // [2, ...] -> [rows, ...]
  };
  batch.embeddings = repeat(batch.embeddings.detach());
  batch.attention_mask = repeat(batch.attention_mask);
  batch.positions = repeat(batch.positions);
  model->zero_grad();
  dispatched_operations = 0;
  const auto handle = at::addGlobalCallback(at::RecordFunctionCallback(count_operation).scopes({at::RecordScope::FUNCTION}));
  latent_forward(model, batch).hidden.sum().backward();
  at::removeCallback(handle);
  return dispatched_operations.load();
}

}  // namespace

// The thought passes are launch-bound on a GPU (docs/smollm2-coconut.md): a pass must dispatch the
// same operations for 2 rows as for 64, so that a larger batch is more rows per launch and never
// more launches. Counted with libtorch's RecordFunction callbacks (what its profiler reads).
TEST(LatentForward, AStepDispatchesTheSameOperationsForAnyBatch) {
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  model->train();
  const int64_t two = step_operations(model, 2, 3);
  EXPECT_GT(two, 100);  // the callback saw the step
  EXPECT_EQ(step_operations(model, 16, 3), two);
  EXPECT_EQ(step_operations(model, 64, 3), two);
  // Thoughts, unlike rows, are passes: each adds about one pass's operations (measured 675 and 672
  // on the tiny model: the cache's bookkeeping differs by a few).
  const int64_t one_thought = step_operations(model, 2, 1), two_thoughts = step_operations(model, 2, 2);
  EXPECT_GT(two_thoughts - one_thought, 300);
  EXPECT_NEAR(static_cast<double>(two - two_thoughts), static_cast<double>(two_thoughts - one_thought), 10.0);
}

// LoRA under bf16 autocast: a frozen float32 projection is cast at every product (autocast caches
// only the casts of weights that train), so each pass of a Coconut step made its own bf16 copy of
// the base and autograd kept every one. The frozen projections held in bf16 (FrozenBase, which
// TrainConfig::frozen_base_bf16 uses) give the same step bit for bit, without those casts and copies.
TEST(LatentForward, AFrozenBaseInBf16IsTheSameLoraStepWithoutACopyPerPass) {
  if (!coconut::testing::kGlibcHeap) GTEST_SKIP() << "AddressSanitizer replaces malloc: glibc's heap counters read 0";
  const LlamaConfig config = coconut::testing::small_gqa_config(64);
  auto model = coconut::testing::tiny_model(config);
  model->train();
  LoraOptions lora;
  lora.rank = 2;
  attach_lora(model, lora, 3);
  // Two marker rows train, as in the SmolLM2 runs: every product's input then requires grad. (A
  // first layer whose input does not is an inference product on the CPU, which may take a float32
  // kernel of its own for a float32 weight; a GPU's autocast casts it all the same.)
  train_token_rows(model, {1, 5});
  coconut::testing::randomize_adapters(model, 0.1);  // B away from zero: the adapters take part
  const int64_t thoughts = 3, passes = thoughts + 2;  // make_batch: columns before, the thoughts, columns after
  struct Step {
    torch::Tensor loss;
    std::vector<torch::Tensor> gradients;
    int64_t operations = 0, kept = 0;
  };
  const auto step = [&]() {
    Step result;
    for (int repeat = 0; repeat < 2; ++repeat) {  // the first fills what libraries keep once allocated
      model->zero_grad();
      auto batch = make_batch(model, thoughts);
      AutocastScope autocast(true, torch::kCPU);
      dispatched_operations = 0;
      const auto handle = at::addGlobalCallback(at::RecordFunctionCallback(count_operation).scopes({at::RecordScope::FUNCTION}));
      const int64_t before = coconut::testing::heap_in_use();
      auto hidden = latent_forward(model, batch).hidden;
      result.kept = coconut::testing::heap_in_use() - before;
      result.loss = hidden.to(torch::kFloat32).pow(2).mean();
      result.loss.backward();
      at::removeCallback(handle);
      result.operations = dispatched_operations.load();
    }
    for (const auto& parameter : model->parameters())
      if (parameter.requires_grad()) result.gradients.push_back(parameter.grad().clone());
    return result;
  };
  const Step float32_base = step();
  FrozenBase frozen(model);
  frozen.keep_only(true);
  int64_t frozen_elements = 0;
  for (const auto& weight : frozen_projection_weights(model)) {
    EXPECT_EQ(weight.scalar_type(), torch::kBFloat16);
    frozen_elements += weight.numel();
  }
  EXPECT_EQ(frozen_elements, 3 * (64 * 64 * 2 + 2 * 32 * 64 + 3 * 176 * 64));
  const Step bf16_base = step();
  EXPECT_TRUE(torch::equal(bf16_base.loss, float32_base.loss));
  ASSERT_EQ(bf16_base.gradients.size(), float32_base.gradients.size());
  ASSERT_EQ(bf16_base.gradients.size(), 1u + 3u * 7u * 2u);  // the table's rows, A and B of 7 projections in 3 layers
  for (size_t i = 0; i < bf16_base.gradients.size(); ++i) EXPECT_TRUE(torch::equal(bf16_base.gradients[i], float32_base.gradients[i])) << i;
  // A cast of each of the 7 x 3 frozen weights in every pass, and its copy, are gone.
  const int64_t casts = passes * 7 * config.num_hidden_layers;
  std::printf("operations %lld -> %lld; kept after forward %lld -> %lld bytes (copies of the base: %lld)\n",
              static_cast<long long>(float32_base.operations), static_cast<long long>(bf16_base.operations),
              static_cast<long long>(float32_base.kept), static_cast<long long>(bf16_base.kept),
              static_cast<long long>(passes * 2 * frozen_elements));
  EXPECT_GE(float32_base.operations - bf16_base.operations, casts);
  EXPECT_NEAR(static_cast<double>(float32_base.kept - bf16_base.kept), static_cast<double>(passes * 2 * frozen_elements),
              0.1 * static_cast<double>(passes * 2 * frozen_elements));
}
