// Physical pruning against masking: the pruned model's logits must equal the original's with
// the removed layers skipped / the removed heads' outputs and MLP channels multiplied by zero.
#include <gtest/gtest.h>

#include "io/hf_checkpoint.h"
#include "model/depth_router.h"
#include "model/kv_cache.h"
#include "pruning/surgery.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

using namespace coconut;

namespace {

LlamaConfig four_layer_config(bool bias) {
  auto config = coconut::testing::tiny_config();
  config.num_hidden_layers = 4;
  config.num_attention_heads = 6;  // 3 query heads per KV group
  config.num_key_value_heads = 2;
  config.head_dim = 4;             // independent of hidden_size, as pruned heads need
  config.attention_bias = bias;
  config.validate();
  return config;
}

torch::Tensor sample_ids() {
  return torch::tensor(std::vector<int64_t>{1, 5, 3, 9, 7, 2, 6, 4, 8, 3, 2, 1, 0, 5}).view({2, 7});
}

torch::Tensor logits_of(Llama& model, const ForwardOptions& options = {}) {
  torch::NoGradGuard no_grad;
  return model->logits(model->forward_ids(sample_ids(), nullptr, options).hidden);
}

}  // namespace

TEST(Surgery, DroppedLayersEqualSkippedLayers) {
  auto model = coconut::testing::tiny_model(four_layer_config(false));
  ForwardOptions skip;
  skip.skip_layers = {1, 2};
  auto pruned = drop_layers(model, {1, 2});
  EXPECT_EQ(pruned->config().num_hidden_layers, 2);
  EXPECT_TRUE(pruned->config().is_uniform());
  EXPECT_TRUE(torch::allclose(logits_of(pruned), logits_of(model, skip), 1e-5, 1e-6));
  // And it is not a no-op: the full model differs.
  EXPECT_FALSE(torch::allclose(logits_of(pruned), logits_of(model), 1e-3, 1e-3));
}

TEST(Surgery, DroppedHeadsEqualMaskedHeadsWithinGroups) {
  for (bool bias : {false, true}) {
    auto model = coconut::testing::tiny_model(four_layer_config(bias));
    // Layer 0: one query head from each group (uniform R 3 -> 2); layer 2: the whole group 1.
    const HeadSelection heads = {{0, {1, 3}}, {2, {3, 4, 5}}};
    auto pruned = drop_heads(model, heads);
    const auto& config = pruned->config();
    EXPECT_FALSE(config.is_uniform());
    EXPECT_EQ(config.heads(0), 4);
    EXPECT_EQ(config.kv_heads(0), 2);
    EXPECT_EQ(config.heads(2), 3);
    EXPECT_EQ(config.kv_heads(2), 1);
    EXPECT_EQ(config.heads(1), 6);
    ForwardOptions mask;
    mask.head_mask = head_mask_for(model->config(), heads);
    // Float32 rounding of differently shaped products: ~1e-6 on logits of size ~1-10.
    EXPECT_TRUE(torch::allclose(logits_of(pruned), logits_of(model, mask), 1e-5, 2e-5))
        << "bias " << bias << " max difference " << (logits_of(pruned) - logits_of(model, mask)).abs().max().item<double>();
    EXPECT_FALSE(torch::allclose(logits_of(pruned), logits_of(model), 1e-3, 1e-3));
  }
}

TEST(Surgery, UniformHeadPruningGivesAPlainConfig) {
  auto model = coconut::testing::tiny_model(four_layer_config(false));
  HeadSelection heads;
  for (int64_t l = 0; l < 4; ++l) heads[l] = {0, 5};  // one query head of each group, every layer
  auto pruned = drop_heads(model, heads);
  EXPECT_TRUE(pruned->config().is_uniform());
  EXPECT_TRUE(pruned->config().layer_num_attention_heads.empty());
  EXPECT_EQ(pruned->config().num_attention_heads, 4);
  EXPECT_EQ(pruned->config().num_key_value_heads, 2);
  EXPECT_EQ(pruned->config().head_dim, 4);
}

TEST(Surgery, RejectsUnequalGroupsAndEmptyLayers) {
  auto model = coconut::testing::tiny_model(four_layer_config(false));
  EXPECT_THROW(drop_heads(model, {{0, {0}}}), std::invalid_argument);         // groups of 2 and 3
  EXPECT_THROW(drop_heads(model, {{0, {0, 1, 2, 3, 4, 5}}}), std::invalid_argument);  // no head left
  EXPECT_THROW(drop_heads(model, {{0, {6}}}), std::invalid_argument);         // no such head
  EXPECT_THROW(drop_layers(model, {4}), std::invalid_argument);
  EXPECT_THROW(drop_layers(model, {0, 1, 2, 3}), std::invalid_argument);
  try {
    drop_heads(model, {{2, {0}}});
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("layer 2"), std::string::npos) << error.what();
  }
}

TEST(Surgery, NonUniformPrunedModelRoundTripsThroughAnHfFolder) {
  coconut::testing::TempDir dir;
  auto model = coconut::testing::tiny_model(four_layer_config(false));
  auto pruned = drop_layers(model, {3});
  pruned = drop_heads(pruned, {{1, {0, 1, 2}}});
  save_hf_folder(dir.file("pruned"), pruned);
  auto loaded = load_model(dir.file("pruned"));
  EXPECT_EQ(loaded->config().num_hidden_layers, 3);
  EXPECT_EQ(loaded->config().heads(1), 3);
  EXPECT_TRUE(torch::equal(logits_of(loaded), logits_of(pruned)));
}

TEST(Surgery, GroupsAndIndexListsParse) {
  auto config = four_layer_config(false);
  const auto heads = heads_of_groups(config, {{2, {1}}});
  EXPECT_EQ(heads.at(2), (std::set<int64_t>{3, 4, 5}));
  EXPECT_EQ(parse_layer_index_pairs("3:0,3:5,7:1"), (std::map<int64_t, std::set<int64_t>>{{3, {0, 5}}, {7, {1}}}));
  EXPECT_EQ(parse_index_list("5,6,7"), (std::set<int64_t>{5, 6, 7}));
  EXPECT_THROW(parse_index_list("5,x"), std::invalid_argument);
  EXPECT_THROW(parse_layer_index_pairs("3-1"), std::invalid_argument);
  EXPECT_THROW(heads_of_groups(config, {{0, {2}}}), std::invalid_argument);
}

// Depth expansion: the copies' output projections are zero, so the grown model's logits are the
// original's exactly (adding a zero to the residual stream is exact in floating point), with and
// without biases, on a model whose layers differ in heads, and through the KV cache.
TEST(Surgery, ExpandedModelComputesExactlyWhatTheOriginalDid) {
  for (bool bias : {false, true}) {
    auto model = coconut::testing::tiny_model(four_layer_config(bias));
    auto pruned = drop_heads(model, {{2, {3, 4, 5}}});  // layer 2: one KV group of two
    auto expanded = expand_layers(pruned, {2, 0, 2});
    const auto& config = expanded->config();
    ASSERT_EQ(config.num_hidden_layers, 7);
    // Layers 0, copy of 0, 1, 2, copy of 2, copy of 2, 3: the copies keep their layer's sizes.
    for (int64_t layer : {3, 4, 5}) {
      EXPECT_EQ(config.heads(layer), 3) << layer;
      EXPECT_EQ(config.kv_heads(layer), 1) << layer;
    }
    EXPECT_EQ(config.heads(1), 6);
    EXPECT_EQ(config.heads(6), 6);
    const auto original = logits_of(pruned), grown = logits_of(expanded);
    EXPECT_TRUE(torch::equal(grown, original)) << "bias " << bias << " max difference "
                                               << (grown - original).abs().max().item<double>();
    // Decoding one token at a time through the cache gives the same last logits.
    torch::NoGradGuard no_grad;
    KVCache cache = KVCache::preallocated(expanded->config(), 2, 16, torch::kFloat32, torch::kCPU);
    const auto ids = sample_ids();
    torch::Tensor last;
    for (int64_t t = 0; t < ids.size(1); ++t)
      last = expanded->logits(expanded->forward_ids(ids.slice(1, t, t + 1), &cache).hidden);
    EXPECT_TRUE(torch::allclose(last.squeeze(1), original.select(1, ids.size(1) - 1), 1e-5, 1e-5));
  }
}

// The copies are not dead weight: their output projections get gradients, and one step of
// training makes the grown model differ from the original.
TEST(Surgery, ExpandedCopiesTrain) {
  auto model = coconut::testing::tiny_model(four_layer_config(false));
  auto expanded = expand_layers(model, {1});
  auto& copy = *expanded->layers[2]->as<DecoderLayer>();
  EXPECT_EQ(copy.self_attn->o_proj->weight.abs().sum().item<double>(), 0.0);
  EXPECT_EQ(copy.mlp->down_proj->weight.abs().sum().item<double>(), 0.0);
  const auto ids = sample_ids();
  auto logits = expanded->logits(expanded->forward_ids(ids).hidden);
  auto loss = torch::nn::functional::cross_entropy(logits.slice(1, 0, -1).reshape({-1, logits.size(2)}),
                                                   ids.slice(1, 1).reshape({-1}));
  loss.backward();
  EXPECT_GT(copy.self_attn->o_proj->weight.grad().abs().sum().item<double>(), 0.0);
  EXPECT_GT(copy.mlp->down_proj->weight.grad().abs().sum().item<double>(), 0.0);
  {
    torch::NoGradGuard no_grad;
    for (auto& parameter : expanded->parameters())
      if (parameter.grad().defined()) parameter.sub_(0.1 * parameter.grad());
  }
  EXPECT_FALSE(torch::allclose(logits_of(expanded), logits_of(model), 1e-4, 1e-4));
}

TEST(Surgery, ExpansionRejectsLayersTheModelLacks) {
  auto model = coconut::testing::tiny_model(four_layer_config(false));
  try {
    expand_layers(model, {4});
    FAIL() << "layer 4 of a 4-layer model was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("layers 0..3"), std::string::npos) << error.what();
  }
  EXPECT_THROW(expand_layers(model, {}), std::invalid_argument);
  EXPECT_THROW(expand_layers(model, {-1}), std::invalid_argument);
}

// A model with a depth router whose gates start at layer 2: after growing or pruning, the gates
// still start at the layer that was layer 2, so the routed model computes what it did (grown) or
// what the masked original did (pruned), and a gate that was always on stays always on.
TEST(Surgery, DepthRouterStartsAtTheSameLayerAfterGrowingOrPruning) {
  auto plain = coconut::testing::tiny_model(four_layer_config(false));
  auto routed = attach_depth_router(plain, -2.0, 2);  // sigmoid(-2) = 0.12: gated layers skip
  ForwardOptions gated;
  gated.depth.router_threshold = 0.5;
  gated.route_mask = torch::ones_like(sample_ids(), torch::kBool);  // every position routed
  const auto reference = logits_of(routed, gated);
  auto grown = expand_layers(routed, {0, 2});  // 0, 0', 1, 2, 2', 3: layer 2 is now at 3
  EXPECT_EQ(grown->config().depth_router_first_layer, 3);
  EXPECT_TRUE(torch::equal(logits_of(grown, gated), reference));
  auto pruned = drop_layers(routed, {0});  // 1, 2, 3: layer 2 is now at 1
  EXPECT_EQ(pruned->config().depth_router_first_layer, 1);
  ForwardOptions skip_first = gated;
  skip_first.skip_layers = {0};
  EXPECT_TRUE(torch::allclose(logits_of(pruned, gated), logits_of(routed, skip_first), 1e-5, 1e-6));
}

TEST(WidthSurgery, DroppedChannelsEqualMaskedChannels) {
  for (bool bias : {false, true}) {
    auto config = four_layer_config(false);
    config.mlp_bias = bias;
    auto model = coconut::testing::tiny_model(config);
    if (bias) {  // libtorch's init leaves biases small; make them count
      torch::NoGradGuard no_grad;
      for (auto& named : model->named_parameters())
        if (named.key().find("mlp") != std::string::npos && named.key().find("bias") != std::string::npos)
          named.value().uniform_(-0.5, 0.5);
    }
    const ChannelSelection channels = {{0, {0, 5, 23}}, {2, {1, 2, 3, 4, 10, 11, 12, 20}}};
    auto pruned = drop_mlp_channels(model, channels);
    const auto& narrow = pruned->config();
    EXPECT_FALSE(narrow.is_uniform());
    EXPECT_EQ(narrow.ffn(0), 21);
    EXPECT_EQ(narrow.ffn(1), 24);
    EXPECT_EQ(narrow.ffn(2), 16);
    EXPECT_EQ(narrow.mlp_channels(), 21 + 24 + 16 + 24);
    ForwardOptions mask;
    mask.mlp_channel_mask = mlp_channel_mask_for(model->config(), channels);
    EXPECT_TRUE(torch::allclose(logits_of(pruned), logits_of(model, mask), 1e-5, 2e-5))
        << "bias " << bias << " max difference " << (logits_of(pruned) - logits_of(model, mask)).abs().max().item<double>();
    EXPECT_FALSE(torch::allclose(logits_of(pruned), logits_of(model), 1e-3, 1e-3));
  }
}

TEST(WidthSurgery, UniformWidthGivesAPlainConfigAndBadChannelsAreRefused) {
  auto model = coconut::testing::tiny_model(four_layer_config(false));
  ChannelSelection channels;
  for (int64_t layer = 0; layer < 4; ++layer) channels[layer] = {static_cast<int64_t>(layer), 7, 9, 11};
  const auto config = drop_mlp_channels(model, channels)->config();
  EXPECT_TRUE(config.is_uniform());
  EXPECT_EQ(config.intermediate_size, 20);
  EXPECT_TRUE(config.layer_intermediate_size.empty());

  const auto refused = [&](const ChannelSelection& selection, const std::string& expected) {
    try {
      config_without_mlp_channels(model->config(), selection);
      ADD_FAILURE() << "accepted " << expected;
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
    }
  };
  refused({{1, {24}}}, "layer 1 has MLP channels 0..23");
  refused({{4, {0}}}, "the model has layers 0..3");
  std::set<int64_t> every;
  for (int64_t c = 0; c < 24; ++c) every.insert(c);
  refused({{2, every}}, "layer 2 would lose every MLP channel");
}
