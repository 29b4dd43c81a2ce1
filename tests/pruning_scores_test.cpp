// Layer, head and MLP channel scores against independent references: naive loops over the
// residual states and recomputed activations, finite differences of the loss in the head and
// channel masks, and physically pruned models; the width that costs what a depth cut costs.
#include <gtest/gtest.h>

#include <cmath>

#include "eval/cost.h"
#include "pruning/scores.h"
#include "pruning/selection.h"
#include "pruning/surgery.h"
#include "reasoning/latent_forward.h"
#include "recipes/pruning.h"
#include "support/tiny_model.h"

using namespace coconut;

namespace {

LlamaConfig scoring_config() {
  auto config = coconut::testing::tiny_config();
  config.num_hidden_layers = 4;
  config.validate();
  return config;
}

Sequence sequence(std::vector<int64_t> ids, int64_t first_latent = -1, int64_t latents = 0) {
  Sequence s;
  s.labels = ids;
  for (int64_t i = 0; i < std::min<int64_t>(3, static_cast<int64_t>(ids.size())); ++i) s.labels[i] = kIgnoreLabel;
  s.ids = std::move(ids);
  s.first_latent = first_latent;
  s.latent_count = latents;
  return s;
}

// Rows of different lengths (right padding), no thoughts.
std::vector<Batch> plain_batches() {
  return {collate({sequence({1, 5, 3, 9, 7, 2}), sequence({1, 4, 8, 3}), sequence({1, 6, 6, 2, 9, 3, 5, 2})}, 0),
          collate({sequence({1, 7, 2, 4, 4})}, 0)};
}

// Two rows with 3 thoughts (token 10 is the placeholder), left-padded to align them.
Batch latent_batch() {
  return collate({sequence({1, 5, 3, 10, 10, 10, 8, 2}, 3, 3), sequence({1, 9, 4, 7, 10, 10, 10, 6, 5, 2}, 4, 3)}, 0);
}

std::vector<torch::Tensor> plain_residuals(Llama& model, const Batch& batch) {
  ForwardOptions options;
  options.return_residuals = true;
  options.attention_mask = batch.attention_mask;
  return model->forward(model->embed(batch.ids), batch.positions, nullptr, options).residuals;
}

double naive_angle(const torch::Tensor& a, const torch::Tensor& b) {
  double dot = 0, na = 0, nb = 0;
  for (int64_t i = 0; i < a.size(0); ++i) {
    const double x = a[i].item<double>(), y = b[i].item<double>();
    dot += x * y;
    na += x * x;
    nb += y * y;
  }
  return std::acos(std::max(-1.0, std::min(1.0, dot / std::sqrt(na * nb)))) / M_PI;
}

}  // namespace

TEST(LayerScores, ResidualStreamStartsAtEmbeddingsAndEndsBeforeTheFinalNorm) {
  auto model = coconut::testing::tiny_model(scoring_config());
  const auto batch = plain_batches()[0];
  const auto residuals = residual_stream(model, batch, torch::kCPU);
  ASSERT_EQ(residuals.size(), 5u);
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(residuals[0], model->embed(batch.ids)));
  ForwardOptions options;
  options.attention_mask = batch.attention_mask;
  auto hidden = model->forward(model->embed(batch.ids), batch.positions, nullptr, options).hidden;
  EXPECT_TRUE(torch::allclose(model->norm(residuals[4]), hidden, 1e-6, 1e-6));
}

TEST(LayerScores, AngularDistanceEqualsNaiveLoopsAtTheLastRealToken) {
  auto model = coconut::testing::tiny_model(scoring_config());
  const auto batches = plain_batches();
  const auto distances = angular_distances(model, batches, ScorePositions::kLastToken, torch::kCPU);
  // Reference: every row's last real column, every (l, n), the angle from scalar loops.
  std::vector<std::vector<double>> sums(5, std::vector<double>(5, 0.0));
  int64_t samples = 0;
  for (const auto& batch : batches) {
    torch::NoGradGuard no_grad;
    const auto residuals = plain_residuals(model, batch);
    for (int64_t row = 0; row < batch.ids.size(0); ++row) {
      const int64_t last = batch.attention_mask[row].sum().item<int64_t>() - 1;  // right padding
      for (int64_t a = 0; a <= 4; ++a)
        for (int64_t b = a + 1; b <= 4; ++b) sums[a][b] += naive_angle(residuals[a][row][last], residuals[b][row][last]);
      ++samples;
    }
  }
  for (int64_t n = 1; n <= 4; ++n) {
    for (int64_t l = 0; l < 4; ++l) {
      const double value = distances[n - 1][l].item<double>();
      if (l + n > 4) {
        EXPECT_TRUE(std::isnan(value));
      } else {
        EXPECT_NEAR(value, sums[l][l + n] / static_cast<double>(samples), 1e-6) << "l " << l << " n " << n;
        EXPECT_GT(value, 0.0);
      }
    }
  }
}

TEST(LayerScores, LatentPositionsUseTheStatesTheModelFeedsBack) {
  auto model = coconut::testing::tiny_model(scoring_config());
  const auto batch = latent_batch();
  const auto cached = residual_stream(model, batch, torch::kCPU);
  // The naive latent forward (whole prefix recomputed per thought) gives the same residuals.
  torch::NoGradGuard no_grad;
  LatentBatch naive{model->embed(batch.ids), batch.positions, batch.attention_mask, batch.first_latent, batch.latent_count, {}, {}};
  naive.options.return_residuals = true;
  const auto reference = latent_forward_naive(model, naive).residuals;
  ASSERT_EQ(cached.size(), reference.size());
  auto real = batch.attention_mask.to(torch::kBool);
  for (size_t depth = 0; depth < cached.size(); ++depth)
    EXPECT_TRUE(torch::allclose(cached[depth].index({real}), reference[depth].index({real}), 1e-5, 1e-5))
        << depth << " max difference " << (cached[depth] - reference[depth]).index({real}).abs().max().item<double>();
  // A thought's input is not the placeholder token's embedding.
  EXPECT_FALSE(torch::allclose(cached[0][0][batch.first_latent + 1], model->embed(torch::tensor({10}))[0], 1e-3, 1e-3));
  const auto distances = angular_distances(model, {batch}, ScorePositions::kLatents, torch::kCPU);
  double sum = 0;
  for (int64_t row = 0; row < 2; ++row)
    for (int64_t t = batch.first_latent; t < batch.first_latent + 3; ++t) sum += naive_angle(reference[1][row][t], reference[3][row][t]);
  EXPECT_NEAR(distances[1][1].item<double>(), sum / 6.0, 1e-6);
  EXPECT_THROW(angular_distances(model, plain_batches(), ScorePositions::kLatents, torch::kCPU), std::invalid_argument);
}

TEST(LayerScores, BlockInfluenceEqualsNaiveLoopsOverEveryRealToken) {
  auto model = coconut::testing::tiny_model(scoring_config());
  const auto batches = plain_batches();
  const auto influence = block_influence(model, batches, torch::kCPU);
  for (int64_t l = 0; l < 4; ++l) {
    double sum = 0;
    int64_t tokens = 0;
    for (const auto& batch : batches) {
      torch::NoGradGuard no_grad;
      const auto residuals = plain_residuals(model, batch);
      for (int64_t row = 0; row < batch.ids.size(0); ++row)
        for (int64_t t = 0; t < batch.ids.size(1); ++t) {
          if (batch.attention_mask[row][t].item<int64_t>() == 0) continue;
          sum += std::cos(M_PI * naive_angle(residuals[l][row][t], residuals[l + 1][row][t]));
          ++tokens;
        }
    }
    EXPECT_NEAR(influence[l].item<double>(), 1.0 - sum / static_cast<double>(tokens), 1e-6) << l;
  }
}

TEST(LayerScores, AblationLossEqualsSkippingTheBlock) {
  auto model = coconut::testing::tiny_model(scoring_config());
  const auto batches = plain_batches();
  const auto scores = layer_ablation(model, {1, 2}, [&](Llama& pruned) { return mean_loss(pruned, batches, torch::kCPU); });
  ASSERT_EQ(scores.size(), 4u + 3u);
  for (const auto& block : scores) {
    ForwardOptions skip;
    for (int64_t l = block.start; l < block.start + block.size; ++l) skip.skip_layers.insert(l);
    EXPECT_NEAR(block.score, mean_loss(model, batches, torch::kCPU, skip), 1e-5);
  }
  const auto chosen = layers_to_drop_by_ablation(scores, 2, false);
  EXPECT_EQ(chosen.size(), 2u);
}

// measure_layer_scores is the three scores above measured once; choose_layers applies each rule
// (the block with the least angular distance, the least influential layers, the best ablation).
TEST(LayerScores, ChooseLayersAppliesEachRuleToWhatWasMeasured) {
  auto model = coconut::testing::tiny_model(scoring_config());
  const auto batches = plain_batches();
  LayerScoreRequest request;
  request.scores = {LayerScore::kAngular, LayerScore::kBlockInfluence, LayerScore::kAblation};
  request.ablation_sizes = {1, 2};
  request.ablation_metric = [&](Llama& pruned) { return mean_loss(pruned, batches, torch::kCPU); };
  std::vector<BlockScore> heard;
  request.on_ablated_block = [&](const BlockScore& block) { heard.push_back(block); };
  const LayerScores scores = measure_layer_scores(model, batches, request);

  const auto angular = angular_distances(model, batches, ScorePositions::kLastToken, torch::kCPU);
  EXPECT_TRUE(torch::allclose(scores.angular, angular, 0, 1e-12, /*equal_nan=*/true));
  EXPECT_TRUE(torch::allclose(scores.influence, block_influence(model, batches, torch::kCPU), 0, 1e-12));
  EXPECT_NEAR(scores.ablation_baseline, mean_loss(model, batches, torch::kCPU), 1e-6);
  ASSERT_EQ(heard.size(), 4u + 3u);  // every block, as measured
  ASSERT_EQ(scores.ablation.size(), heard.size());

  for (int64_t k : {1, 2}) {
    // Naive: the smallest entry of row k - 1; the k smallest influences; the block of least loss.
    int64_t best_start = 0;
    for (int64_t l = 1; l + k <= 4; ++l)
      if (angular[k - 1][l].item<double>() < angular[k - 1][best_start].item<double>()) best_start = l;
    std::set<int64_t> block;
    for (int64_t l = best_start; l < best_start + k; ++l) block.insert(l);
    EXPECT_EQ(choose_layers(scores, LayerScore::kAngular, k), block) << k;

    const auto order = scores.influence.argsort();
    std::set<int64_t> least;
    for (int64_t i = 0; i < k; ++i) least.insert(order[i].item<int64_t>());
    EXPECT_EQ(choose_layers(scores, LayerScore::kBlockInfluence, k), least) << k;

    const BlockScore* best = nullptr;
    for (const auto& b : scores.ablation)
      if (b.size == k && (best == nullptr || b.score < best->score)) best = &b;
    ASSERT_NE(best, nullptr);
    std::set<int64_t> ablated;
    for (int64_t l = best->start; l < best->start + k; ++l) ablated.insert(l);
    EXPECT_EQ(choose_layers(scores, LayerScore::kAblation, k), ablated) << k;
  }
  EXPECT_THROW(choose_layers(scores, LayerScore::kAblation, 3), std::invalid_argument);  // no blocks of 3 measured

  LayerScoreRequest angular_only;
  angular_only.scores = {LayerScore::kAngular};
  const auto partial = measure_layer_scores(model, batches, angular_only);
  EXPECT_FALSE(partial.influence.defined());
  EXPECT_TRUE(partial.ablation.empty());
  try {
    choose_layers(partial, LayerScore::kBlockInfluence, 1);
    FAIL() << "choosing by an unmeasured score must throw";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("bi"), std::string::npos) << error.what();
  }
}

TEST(LayerScores, NamesRoundTripAndUnknownNamesAreRefused) {
  for (auto score : {LayerScore::kAngular, LayerScore::kBlockInfluence, LayerScore::kAblation})
    EXPECT_EQ(layer_score_from_name(layer_score_name(score)), score);
  EXPECT_EQ(layer_score_name(LayerScore::kBlockInfluence), "bi");
  EXPECT_THROW(layer_score_from_name("cosine"), std::invalid_argument);
}

TEST(HeadScores, GradientImportanceMatchesFiniteDifferences) {
  auto model = coconut::testing::tiny_model(scoring_config());
  model->to(torch::kFloat64);
  const std::vector<Batch> batches = {plain_batches()[1], latent_batch()};
  const auto importance = head_gradient_importance(model, batches, torch::kCPU);
  const double epsilon = 1e-3;  // the loss is float32 (logits are): central differences, O(eps^2)
  auto loss_with = [&](const Batch& batch, const std::vector<int64_t>& heads, int64_t layer, double value) {
    ForwardOptions options;
    options.head_mask = torch::ones({4, 4}, torch::kFloat64);
    for (int64_t h : heads) options.head_mask[layer][h] = value;
    return mean_loss(model, {batch}, torch::kCPU, options);
  };
  for (int64_t layer : {0, 3}) {
    for (int64_t head = 0; head < 4; ++head) {
      double expected = 0;
      for (const auto& batch : batches)
        expected += std::abs(loss_with(batch, {head}, layer, 1 + epsilon) - loss_with(batch, {head}, layer, 1 - epsilon)) /
                    (2 * epsilon);
      EXPECT_NEAR(importance.heads[layer][head].item<double>(), expected, 2e-3) << layer << ":" << head;
    }
    for (int64_t group = 0; group < 2; ++group) {
      double expected = 0;
      const std::vector<int64_t> heads = {2 * group, 2 * group + 1};
      for (const auto& batch : batches)
        expected += std::abs(loss_with(batch, heads, layer, 1 + epsilon) - loss_with(batch, heads, layer, 1 - epsilon)) /
                    (2 * epsilon);
      EXPECT_NEAR(importance.groups[layer][group].item<double>(), expected, 2e-3) << layer << " group " << group;
    }
  }
  // The weights' gradient flags are restored.
  for (const auto& parameter : model->parameters()) EXPECT_TRUE(parameter.requires_grad());
}

TEST(HeadScores, GroupAblationEqualsThePhysicallyPrunedModel) {
  auto model = coconut::testing::tiny_model(scoring_config());
  const auto batches = plain_batches();
  const auto losses = head_ablation_losses(model, batches, torch::kCPU, true);  // [L, G]
  for (int64_t layer : {0, 2}) {
    auto pruned = drop_heads(model, heads_of_groups(model->config(), {{layer, {1}}}));
    EXPECT_NEAR(losses[layer][1].item<double>(), mean_loss(pruned, batches, torch::kCPU), 1e-5);
  }
  // Each single head against the model with that head's columns of o_proj zeroed (its output
  // removed from the residual: what a mask of 0 on the head means), with no head mask at all.
  const auto single = head_ablation_losses(model, batches, torch::kCPU, false);  // [L, H]
  const auto& config = model->config();
  ASSERT_EQ(single.size(0), config.num_hidden_layers);
  ASSERT_EQ(single.size(1), config.num_attention_heads);
  const double intact = mean_loss(model, batches, torch::kCPU);
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer)
    for (int64_t head = 0; head < config.num_attention_heads; ++head) {
      auto o_proj = model->layers[layer]->as<DecoderLayer>()->self_attn->o_proj->weight;  // [D, H*Dh]
      auto columns = o_proj.narrow(1, head * config.head_dim, config.head_dim);
      const auto kept = columns.detach().clone();
      {
        torch::NoGradGuard no_grad;
        columns.zero_();
      }
      const double expected = mean_loss(model, batches, torch::kCPU);
      {
        torch::NoGradGuard no_grad;
        columns.copy_(kept);
      }
      // Same float32 forward with one head's contribution removed in two places (mask on the
      // context vs zero weights): differences are rounding, measured below 1e-6; the ablated
      // losses differ from the intact one by 1e-3..1e-1.
      EXPECT_NEAR(single[layer][head].item<double>(), expected, 1e-5) << layer << ":" << head;
      EXPECT_GT(std::abs(expected - intact), 1e-5) << layer << ":" << head << " does not matter: a vacuous check";
    }
}

TEST(HeadScores, FractionPicksTheLeastImportantWithinGqaRules) {
  auto config = scoring_config();  // 4 layers, 4 query heads in 2 groups
  auto importance = torch::ones({4, 4}, torch::kFloat64);
  importance[1][0] = 0.1;  // group 0 of layer 1
  importance[1][3] = 0.2;  // group 1 of layer 1
  importance[2][1] = 0.05;
  // 2 of 16 heads: one unit of layer 1 (one head from each group).
  auto query = choose_heads(config, importance, 2.0 / 16, "query");
  EXPECT_EQ(query, (HeadSelection{{1, {0, 3}}}));
  // Every pruned layer keeps at least one head per group: asking for 75% takes one per group.
  query = choose_heads(config, importance, 0.75, "query");
  int64_t removed = 0;
  for (const auto& [layer, heads] : query) {
    EXPECT_EQ(heads.size(), 2u);
    removed += static_cast<int64_t>(heads.size());
  }
  EXPECT_EQ(removed, 8);
  auto group_scores = torch::ones({4, 2}, torch::kFloat64);
  group_scores[3][0] = 0.01;
  group_scores[3][1] = 0.02;  // never both: a layer keeps one group
  group_scores[0][1] = 0.03;
  const auto groups = choose_heads(config, group_scores, 4.0 / 16, "kv-group");
  EXPECT_EQ(groups, (HeadSelection{{0, {2, 3}}, {3, {0, 1}}}));
  // Multi-head attention (one query head per KV head): heads go singly, each layer keeps one.
  auto mha = scoring_config();
  mha.num_key_value_heads = 4;
  mha.validate();
  auto single = torch::ones({4, 4}, torch::kFloat64);
  single[0][2] = 0.1;
  single[2][1] = 0.2;
  EXPECT_EQ(choose_heads(mha, single, 2.0 / 16, "query"), (HeadSelection{{0, {2}}, {2, {1}}}));
  int64_t kept_min = 4;
  for (const auto& [layer, heads] : choose_heads(mha, single, 0.9, "query"))
    kept_min = std::min<int64_t>(kept_min, 4 - static_cast<int64_t>(heads.size()));
  EXPECT_EQ(kept_min, 1);
}

// prune_model: explicit removals pass through (heads of a removed layer dropped, with a note);
// drop_block chooses what choose_layers would; the result is the surgery of those choices.
TEST(PruneModel, ChoosesLikeTheScoresAndBuildsTheSurgeryOfItsChoices) {
  coconut::ScoringData source;
  source.model = coconut::testing::tiny_model(scoring_config());
  source.model->eval();
  source.batches = plain_batches();

  coconut::PruneRequest explicit_request;
  explicit_request.layers = {1};
  explicit_request.heads = {{1, {0}}, {2, {1, 3}}};  // one query head of each KV group
  const auto explicit_result = coconut::prune_model(source, explicit_request);
  EXPECT_EQ(explicit_result.layers, (std::set<int64_t>{1}));
  EXPECT_EQ(explicit_result.heads, (HeadSelection{{2, {1, 3}}}));
  ASSERT_EQ(explicit_result.notes.size(), 1u);
  EXPECT_NE(explicit_result.notes[0].find("layer 1"), std::string::npos);
  EXPECT_EQ(explicit_result.model->config().num_hidden_layers, 3);
  EXPECT_EQ(explicit_result.model->config().heads(1), 2);  // old layer 2, less two query heads
  EXPECT_EQ(source.model->config().num_hidden_layers, 4);  // the source is untouched

  coconut::PruneRequest block;
  block.drop_block = 2;
  block.layer_score.scores = {LayerScore::kBlockInfluence};
  auto chosen = coconut::prune_model(source, block);
  EXPECT_EQ(chosen.layers, layers_to_drop_by_influence(block_influence(source.model, source.batches, torch::kCPU), 2));
  auto expected = drop_layers(source.model, chosen.layers);
  const auto& batch = source.batches.front();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(chosen.model->forward(chosen.model->embed(batch.ids), batch.positions).hidden,
                              expected->forward(expected->embed(batch.ids), batch.positions).hidden));
}

// The activation a = silu(gate) * up recomputed from each layer's post-attention state h: with the
// layer's MLP masked out entirely, the layer's output is h (the earlier layers are unchanged).
TEST(ChannelScores, ActivationAndWandaEqualNaiveLoopsOverTheRecomputedActivation) {
  auto model = coconut::testing::tiny_model(scoring_config());
  model->to(torch::kFloat64);
  const auto data = plain_batches();
  const auto activation = mlp_channel_importance(model, data, torch::kCPU, "activation");
  const auto wanda = mlp_channel_importance(model, data, torch::kCPU, "wanda");
  ASSERT_EQ(activation.sizes(), (std::vector<int64_t>{4, 24}));
  torch::NoGradGuard no_grad;
  for (int64_t layer = 0; layer < 4; ++layer) {
    auto& mlp = *model->layers[layer]->as<DecoderLayer>()->mlp;
    auto& norm = *model->layers[layer]->as<DecoderLayer>()->post_attention_layernorm;
    std::vector<double> sequence_squares(24, 0.0), token_squares(24, 0.0);
    for (const auto& batch : data) {
      ForwardOptions options;
      options.attention_mask = batch.attention_mask;
      options.return_residuals = true;
      options.mlp_channel_mask = torch::ones({4, 24}, torch::kFloat64);
      options.mlp_channel_mask[layer].zero_();
      const auto h = model->forward(model->embed(batch.ids), batch.positions, nullptr, options).residuals[layer + 1];
      for (int64_t row = 0; row < batch.ids.size(0); ++row) {
        std::vector<double> sums(24, 0.0);
        double tokens = 0;
        for (int64_t t = 0; t < batch.ids.size(1); ++t) {
          if (batch.attention_mask[row][t].item<int64_t>() == 0) continue;
          const auto state = h[row][t];  // [D]
          const auto normed = state / torch::sqrt(state.square().mean() + model->config().rms_norm_eps) * norm.weight;
          for (int64_t c = 0; c < 24; ++c) {
            const double gate = torch::dot(mlp.gate_proj->weight[c], normed).item<double>();
            const double up = torch::dot(mlp.up_proj->weight[c], normed).item<double>();
            const double a = gate / (1 + std::exp(-gate)) * up;
            sums[c] += std::abs(a);
            token_squares[c] += a * a;
          }
          tokens += 1;
        }
        for (int64_t c = 0; c < 24; ++c) sequence_squares[c] += std::pow(sums[c] / tokens, 2);
      }
    }
    // The model's norms and products round through float32 in places: 1e-6 relative.
    for (int64_t c = 0; c < 24; ++c) {
      const double expected_activation = std::sqrt(sequence_squares[c]);
      EXPECT_NEAR(activation[layer][c].item<double>(), expected_activation, 1e-6 * expected_activation) << layer << ":" << c;
      const double column = mlp.down_proj->weight.select(1, c).abs().sum().item<double>();
      const double expected_wanda = std::sqrt(token_squares[c]) * column;
      EXPECT_NEAR(wanda[layer][c].item<double>(), expected_wanda, 1e-6 * expected_wanda) << layer << ":" << c;
    }
  }
  EXPECT_THROW(mlp_channel_importance(model, data, torch::kCPU, "magnitude"), std::invalid_argument);
  // A Coconut batch (its thoughts run one column a pass) counts every pass's positions.
  const auto latent = mlp_channel_importance(model, {latent_batch()}, torch::kCPU, "activation");
  EXPECT_TRUE(torch::isfinite(latent).all().item<bool>());
  EXPECT_GT(latent.min().item<double>(), 0.0);
}

TEST(ChannelScores, TaylorIsTheSlopeOfTheLossInTheChannelMask) {
  auto model = coconut::testing::tiny_model(scoring_config());
  model->to(torch::kFloat64);
  const auto data = plain_batches();
  const auto taylor = mlp_channel_importance(model, data, torch::kCPU, "taylor");
  const double epsilon = 1e-3;  // the loss is float32 (logits are): central differences, O(eps^2)
  const auto loss_with = [&](int64_t layer, int64_t channel, double value) {
    ForwardOptions options;
    options.mlp_channel_mask = torch::ones({4, 24}, torch::kFloat64);
    options.mlp_channel_mask[layer][channel] = value;
    return mean_loss(model, data, torch::kCPU, options);  // batches weighted by their labelled tokens
  };
  for (int64_t layer : {0, 3})
    for (int64_t channel : {0, 7, 23}) {
      const double slope = (loss_with(layer, channel, 1 + epsilon) - loss_with(layer, channel, 1 - epsilon)) / (2 * epsilon);
      EXPECT_NEAR(taylor[layer][channel].item<double>(), std::abs(slope), 2e-3) << layer << ":" << channel;
    }
  for (const auto& parameter : model->parameters()) EXPECT_TRUE(parameter.requires_grad());
}

TEST(WidthSelection, EveryLayerKeepsItsMostImportantChannels) {
  auto config = scoring_config();
  config.layer_intermediate_size = {24, 6, 24, 24};  // layer 1 is already narrow
  config.validate();
  auto importance = torch::zeros({4, 24}, torch::kFloat64);
  for (int64_t c = 0; c < 24; ++c) {
    importance[0][c] = static_cast<double>(c);         // the highest indices matter most
    importance[2][c] = static_cast<double>(24 - c);    // the lowest do
  }
  importance[2][5] = 24.0;  // a tie with channel 0: the lower index stays first
  const auto removed = choose_mlp_channels(config, importance, 8);
  std::set<int64_t> first_16;
  for (int64_t c = 0; c < 16; ++c) first_16.insert(c);
  EXPECT_EQ(removed.at(0), first_16);
  EXPECT_EQ(removed.count(1), 0u);
  std::set<int64_t> expected_2;
  for (int64_t c = 8; c < 24; ++c) expected_2.insert(c);  // keeps 0..7 with 5 among them
  EXPECT_EQ(removed.at(2), expected_2);
  EXPECT_EQ(removed.at(3).size(), 16u);
  EXPECT_EQ(config_without_mlp_channels(config, removed).mlp_channels(), 8 + 6 + 8 + 8);
  EXPECT_THROW(choose_mlp_channels(config, importance, 0), std::invalid_argument);
}

TEST(WidthSelection, WidthForAFlopsRatioIsTheWidestWithinIt) {
  const auto config = coconut::testing::small_gqa_config(256);
  // What dropping one of the three layers costs: the width cut of the same FLOPs.
  const double ratio = flops_per_token(config_without_layers(config, {1}), 128).total() / flops_per_token(config, 128).total();
  const int64_t width = mlp_width_for_flops_ratio(config, ratio, 128);
  const auto flops_at = [&](int64_t w) {
    auto narrow = config;
    narrow.intermediate_size = w;
    return flops_per_token(narrow, 128).total();
  };
  EXPECT_LE(flops_at(width), ratio * flops_per_token(config, 128).total());
  EXPECT_GT(flops_at(width + 1), ratio * flops_per_token(config, 128).total());
  EXPECT_LT(width, config.intermediate_size);
  EXPECT_EQ(mlp_width_for_flops_ratio(config, 1.0, 128), config.intermediate_size);
  EXPECT_THROW(mlp_width_for_flops_ratio(config, 0.05, 128), std::invalid_argument);  // attention and head alone cost more
}
