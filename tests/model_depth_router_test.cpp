// The learned depth router (ForwardOptions::router_threshold, router_straight_through): a position
// whose gate closes layer l has the state of a model whose layer l is an identity (o_proj and
// down_proj zeroed) and writes the same K/V; decoding one position at a time equals one
// teacher-forced pass that routes the same positions (so skipped layers leave later positions'
// attention exact); batch rows route independently; training's straight-through forward equals the
// hard decisions and carries gradients to the gates.
#include <gtest/gtest.h>

#include "model/depth_router.h"
#include "model/kv_cache.h"
#include "model/llama.h"
#include "support/tiny_model.h"

using namespace coconut;

namespace {

LlamaConfig routed_config(int64_t layers = 4) {
  auto config = coconut::testing::tiny_config();
  config.num_hidden_layers = layers;
  config.depth_router = true;
  config.validate();
  return config;
}

DecoderLayerImpl& layer_of(Llama& model, int64_t layer) { return *model->layers[layer]->as<DecoderLayerImpl>(); }

// Gates that always open (+10) or always close (-10), whatever the state.
void force_gates(Llama& model, const std::vector<bool>& open) {
  torch::NoGradGuard no_grad;
  for (size_t layer = 0; layer < open.size(); ++layer) {
    auto& router = layer_of(model, static_cast<int64_t>(layer)).router;
    router->weight.zero_();
    router->bias.fill_(open[layer] ? 10.0 : -10.0);
  }
}

KVCache prefilled(Llama& model, const torch::Tensor& prompt) {
  auto cache = KVCache::preallocated(model->config(), prompt.size(0), 32, torch::kFloat32, torch::kCPU);
  ForwardOptions every_layer;
  every_layer.depth = DepthPolicy::every_layer();
  model->forward_ids(prompt, &cache, every_layer);
  return cache;
}

}  // namespace

TEST(DepthRouter, AttachedRouterStartsOpenAndChangesNothing) {
  torch::NoGradGuard no_grad;
  auto plain_config = routed_config();
  plain_config.depth_router = false;
  auto plain = coconut::testing::tiny_model(plain_config);
  auto routed = attach_depth_router(plain, 3.0);
  ASSERT_TRUE(routed->config().depth_router);
  EXPECT_EQ(depth_router_parameters(routed).size(), 8u);
  const auto prompt = torch::tensor({{1, 4, 3, 7, 5}}, torch::kInt64);
  auto plain_cache = prefilled(plain, prompt);
  auto routed_cache = prefilled(routed, prompt);
  const auto next = torch::tensor({{6}}, torch::kInt64);
  const auto expected = plain->forward_ids(next, &plain_cache).hidden;
  const auto step = routed->forward_ids(next, &routed_cache);
  EXPECT_TRUE(torch::equal(step.hidden, expected));
  EXPECT_FALSE(step.layers_skipped.any().item<bool>());
  EXPECT_EQ(step.layers_run.item<int64_t>(), 4);
}

TEST(DepthRouter, ClosedGateEqualsIdentityLayerKeysAndValuesIncluded) {
  torch::NoGradGuard no_grad;
  const auto config = routed_config();
  auto model = coconut::testing::tiny_model(config);
  force_gates(model, {true, false, true, false});  // the step skips layers 1 and 3
  auto reference = coconut::testing::tiny_model(config);
  for (int64_t layer : {1, 3}) {  // x + 0 + 0, K/V still from its input
    layer_of(reference, layer).self_attn->o_proj->weight.zero_();
    layer_of(reference, layer).mlp->down_proj->weight.zero_();
  }
  const auto prompt = torch::tensor({{1, 4, 3, 7, 5}}, torch::kInt64);
  // Both prompts run the real layers (the reference's cache is filled by `model`).
  auto routed_cache = prefilled(model, prompt);
  auto reference_cache = prefilled(model, prompt);
  const auto embedding = model->embed(torch::tensor({{6}}, torch::kInt64));
  const auto positions = torch::full({1, 1}, 5, torch::kInt64);
  const auto step = model->forward(embedding, positions, &routed_cache, {});
  ForwardOptions every_layer;
  every_layer.depth = DepthPolicy::every_layer();
  const auto expected = reference->forward(embedding, positions, &reference_cache, every_layer);
  EXPECT_EQ(step.layers_run.item<int64_t>(), 2);
  EXPECT_TRUE(torch::equal(step.layers_skipped, torch::tensor({{false, true, false, true}})));
  EXPECT_TRUE(torch::allclose(step.hidden, expected.hidden, 1e-5, 1e-6));
  for (int64_t layer = 0; layer < 4; ++layer) {
    const auto [k, v] = routed_cache.columns(layer);
    const auto [k_ref, v_ref] = reference_cache.columns(layer);
    EXPECT_TRUE(torch::allclose(k, k_ref, 1e-5, 1e-6)) << "layer " << layer;
    EXPECT_TRUE(torch::allclose(v, v_ref, 1e-5, 1e-6)) << "layer " << layer;
  }
  // The check can fail: running every layer gives another state.
  auto full_cache = prefilled(model, prompt);
  EXPECT_FALSE(torch::allclose(model->forward(embedding, positions, &full_cache, every_layer).hidden, step.hidden, 1e-3, 1e-4));
}

TEST(DepthRouter, DecodingPositionByPositionEqualsOneTeacherForcedPass) {
  torch::NoGradGuard no_grad;
  const auto config = routed_config();
  auto model = coconut::testing::tiny_model(config);  // random gates: decisions vary by position and layer
  const auto ids = torch::tensor({{1, 4, 3, 7, 5, 6, 2, 9, 8, 3, 1, 4}}, torch::kInt64);
  const int64_t prompt = 4, total = ids.size(1);
  ForwardOptions options;
  options.depth.router_threshold = 0.5;
  // One pass over every column, routing the columns after the prompt.
  auto route_mask = torch::arange(total).ge(prompt).view({1, total});
  ForwardOptions teacher = options;
  teacher.route_mask = route_mask;
  const auto forced = model->forward_ids(ids, nullptr, teacher).hidden;  // [1, T, D]
  // The prompt at once, then one column per call.
  auto cache = prefilled(model, ids.narrow(1, 0, prompt));
  int64_t skipped = 0, ran = 0;
  for (int64_t column = prompt; column < total; ++column) {
    const auto step = model->forward_ids(ids.narrow(1, column, 1), &cache, options);
    skipped += step.layers_skipped.sum().item<int64_t>();
    ran += step.layers_run.item<int64_t>();
    // Float rounding differs between one pass and many (hidden values are O(1)).
    EXPECT_TRUE(torch::allclose(step.hidden, forced.narrow(1, column, 1), 1e-4, 1e-5)) << "column " << column;
  }
  EXPECT_GT(skipped, 0) << "the random gates must skip something for the test to mean anything";
  EXPECT_GT(ran, 0);
  // Without routing the teacher-forced pass differs at routed columns.
  const auto unrouted = model->forward_ids(ids, nullptr, ForwardOptions{}).hidden;
  EXPECT_FALSE(torch::allclose(unrouted.narrow(1, prompt, total - prompt), forced.narrow(1, prompt, total - prompt), 1e-3, 1e-4));
}

TEST(DepthRouter, BatchRowsRouteAsAlone) {
  torch::NoGradGuard no_grad;
  const auto config = routed_config();
  auto model = coconut::testing::tiny_model(config, 11);
  const auto prompts = torch::tensor({{1, 4, 3, 7}, {5, 2, 8, 1}, {9, 9, 3, 6}}, torch::kInt64);
  const auto next = torch::tensor({{6}, {3}, {7}}, torch::kInt64);
  auto batch_cache = prefilled(model, prompts);
  const auto batch = model->forward_ids(next, &batch_cache, {});
  bool rows_differ = false;
  for (int64_t row = 0; row < 3; ++row) {
    auto cache = prefilled(model, prompts.narrow(0, row, 1));
    const auto alone = model->forward_ids(next.narrow(0, row, 1), &cache, {});
    EXPECT_TRUE(torch::allclose(batch.hidden.narrow(0, row, 1), alone.hidden, 1e-5, 1e-6)) << "row " << row;
    EXPECT_TRUE(torch::equal(batch.layers_skipped.narrow(0, row, 1), alone.layers_skipped)) << "row " << row;
    rows_differ |= !torch::equal(batch.layers_skipped[row], batch.layers_skipped[0]);
  }
  EXPECT_TRUE(rows_differ) << "the rows should take different routes for the test to mean anything";
}

TEST(DepthRouter, StraightThroughForwardIsTheHardRouteAndTrainsTheGates) {
  const auto config = routed_config();
  auto model = coconut::testing::tiny_model(config, 5);
  model->train();
  const auto ids = torch::tensor({{1, 4, 3, 7, 5, 6, 2, 9}}, torch::kInt64);
  const auto route_mask = torch::arange(8).ge(3).view({1, 8});
  ForwardOptions hard;
  hard.route_mask = route_mask;
  ForwardOptions straight_through = hard;
  straight_through.router_straight_through = true;
  straight_through.router_noise = 0;  // deterministic: the same decisions as the threshold 0.5
  const auto result = model->forward_ids(ids, nullptr, straight_through);
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::allclose(result.hidden, model->forward_ids(ids, nullptr, hard).hidden, 1e-5, 1e-6));
  }
  ASSERT_TRUE(result.router_probabilities.defined());
  EXPECT_EQ(result.router_probabilities.sizes(), (std::vector<int64_t>{1, 8, 4}));
  EXPECT_TRUE(result.router_probabilities.gt(0).all().item<bool>() && result.router_probabilities.lt(1).all().item<bool>());
  result.hidden.pow(2).sum().backward();
  for (auto& parameter : depth_router_parameters(model)) {
    ASSERT_TRUE(parameter.grad().defined());
    EXPECT_GT(parameter.grad().abs().sum().item<double>(), 0.0);
  }
}

TEST(DepthRouter, NoiseSamplesDecisionsWithTheGateProbability) {
  // With logistic noise of scale 1 a gate of probability p runs its layer with probability p.
  const auto config = routed_config(1);
  auto model = coconut::testing::tiny_model(config);
  {
    torch::NoGradGuard no_grad;
    layer_of(model, 0).router->weight.zero_();
    layer_of(model, 0).router->bias.fill_(std::log(0.3 / 0.7));  // p = 0.3
  }
  torch::manual_seed(3);
  const int64_t positions = 4000;
  auto embeddings = torch::randn({1, positions, config.hidden_size});
  auto positions_ids = torch::zeros({1, positions}, torch::kInt64);
  // One position per row and no cache: run[i] shows in whether the state changed.
  ForwardOptions options;
  options.router_straight_through = true;
  options.route_mask = torch::ones({positions, 1}, torch::kBool);
  torch::NoGradGuard no_grad;
  const auto inputs = embeddings.view({positions, 1, config.hidden_size});
  auto hidden_in = model->norm(inputs);
  const auto out = model->forward(inputs, positions_ids.view({positions, 1}), nullptr, options).hidden;
  const double ran = out.ne(hidden_in).any(-1).to(torch::kFloat64).mean().item<double>();
  EXPECT_NEAR(ran, 0.3, 0.03);  // 4000 draws: standard error 0.007
}

TEST(DepthRouter, LayersBeforeTheFirstRoutedOneAlwaysRun) {
  torch::NoGradGuard no_grad;
  auto config = routed_config();
  config.depth_router_first_layer = 2;
  auto model = coconut::testing::tiny_model(config);
  force_gates(model, {false, false, false, false});  // every gate closed: only layers 2, 3 may skip
  auto reference = coconut::testing::tiny_model(config);
  for (int64_t layer : {2, 3}) {
    layer_of(reference, layer).self_attn->o_proj->weight.zero_();
    layer_of(reference, layer).mlp->down_proj->weight.zero_();
  }
  const auto prompt = torch::tensor({{1, 4, 3, 7, 5}}, torch::kInt64);
  auto routed_cache = prefilled(model, prompt);
  auto reference_cache = prefilled(model, prompt);
  const auto next = torch::tensor({{6}}, torch::kInt64);
  const auto step = model->forward_ids(next, &routed_cache, {});
  ForwardOptions every_layer;
  every_layer.depth = DepthPolicy::every_layer();
  const auto expected = reference->forward_ids(next, &reference_cache, every_layer);
  EXPECT_TRUE(torch::equal(step.layers_skipped, torch::tensor({{false, false, true, true}})));
  EXPECT_TRUE(torch::allclose(step.hidden, expected.hidden, 1e-5, 1e-6));
  // Training sees (and penalises) only the routed layers' gates.
  ForwardOptions training;
  training.router_straight_through = true;
  training.route_mask = torch::ones({1, 5}, torch::kBool);
  EXPECT_EQ(model->forward_ids(prompt, nullptr, training).router_probabilities.size(-1), 2);
  // A first layer beyond the model is named.
  config.depth_router_first_layer = 5;
  EXPECT_THROW(config.validate(), std::invalid_argument);
}
