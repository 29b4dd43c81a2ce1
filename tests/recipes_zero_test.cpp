// ZeRO-2's optimizer in one process (W = 1, the same code without collectives): its steps equal
// libtorch's AdamW with clip_grad_norm_ on the whole model; the hooks reduce every bucket during
// backward and free the gradients; its state round-trips through a checkpoint folder. The
// 2- and 3-process runs are in cli_distributed_test.cpp.
#include <gtest/gtest.h>

#include "distributed/zero.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

using namespace coconut;
using coconut::testing::TempDir;
using coconut::testing::tiny_config;
using coconut::testing::tiny_model;

namespace {

torch::optim::AdamWOptions adamw_options() {
  torch::optim::AdamWOptions options(0.02);
  options.weight_decay(0.1);
  return options;
}

// Two groups, as make_optimizer builds with a router: the norms at half the rate, no decay.
std::unique_ptr<torch::optim::AdamW> two_group_adamw(Llama& model) {
  std::vector<torch::Tensor> matrices, norms;
  for (auto& named : model->named_parameters())
    (named.key().find("norm") != std::string::npos ? norms : matrices).push_back(named.value());
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(matrices, std::make_unique<torch::optim::AdamWOptions>(adamw_options()));
  auto norm_options = std::make_unique<torch::optim::AdamWOptions>(adamw_options());
  norm_options->lr(0.01).weight_decay(0.0);
  groups.emplace_back(norms, std::move(norm_options));
  return std::make_unique<torch::optim::AdamW>(groups, adamw_options());
}

void backward_on(Llama& model, int64_t seed) {
  torch::manual_seed(seed);
  const auto ids = torch::randint(0, 11, {3, 9}, torch::kInt64);   // [B, T]
  const auto logits = model->logits(model->forward_ids(ids.narrow(1, 0, 8)).hidden);  // [B, 8, V]
  torch::nn::functional::cross_entropy(logits.reshape({-1, 11}), ids.narrow(1, 1, 8).reshape({-1})).backward();
}

void expect_same_parameters(Llama& a, Llama& b, double rtol, double atol) {
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto& item : pa) {
    const auto& other = pb[item.key()];
    EXPECT_TRUE(torch::allclose(item.value(), other, rtol, atol))
        << item.key() << ": max difference " << (item.value() - other).abs().max().item<double>();
  }
}

}  // namespace

TEST(Zero, OneProcessStepsEqualAdamWWithClipping) {
  auto plain = tiny_model(tiny_config());
  auto sharded = tiny_model(tiny_config());
  plain->train();
  sharded->train();
  auto adamw = two_group_adamw(plain);
  auto layout = two_group_adamw(sharded);
  ZeroOptimizer zero(nullptr, *layout, /*bucket_elements=*/200);  // several buckets, parameters in both groups
  ASSERT_GT(zero.bucket_count(), 4);
  int64_t clipped = 0;
  for (int64_t step = 0; step < 6; ++step) {
    // Two micro-batches per step (accumulation), the second scaled as the trainer scales it.
    for (int64_t micro = 0; micro < 2; ++micro) {
      backward_on(plain, step * 2 + micro);
      backward_on(sharded, step * 2 + micro);
      zero.finish_backward();
    }
    for (const auto& parameter : sharded->parameters())
      EXPECT_FALSE(parameter.grad().defined()) << "a gradient outlived its bucket's reduction";
    const double max_norm = 0.5;  // below the norms seen here: clipping acts
    const double expected = torch::nn::utils::clip_grad_norm_(plain->parameters(), max_norm);
    const double norm = zero.clip_grad_norm(max_norm);
    EXPECT_NEAR(norm, expected, 1e-5 * expected);
    clipped += expected > max_norm;
    adamw->step();
    adamw->zero_grad();
    zero.step();
    expect_same_parameters(plain, sharded, 1e-5, 1e-6);
  }
  EXPECT_EQ(clipped, 6);
  // Every parameter had a gradient, so the hooks reduced every bucket inside backward.
  EXPECT_EQ(zero.buckets_reduced_in_backward(), zero.bucket_count() * 12);
}

TEST(Zero, StateRoundTripsThroughACheckpointFolder) {
  TempDir dir;
  auto first = tiny_model(tiny_config());
  first->train();
  auto layout = two_group_adamw(first);
  ZeroOptimizer zero(nullptr, *layout, 150);
  for (int64_t step = 0; step < 3; ++step) {
    backward_on(first, step);
    zero.finish_backward();
    zero.clip_grad_norm(1.0);
    zero.step();
  }
  zero.save(dir.path());
  EXPECT_TRUE(std::filesystem::exists(dir.file(kZeroIndexFile)));
  EXPECT_TRUE(std::filesystem::exists(dir.file(zero_shard_file_name(0, 1))));

  // A copy of the weights with the state read back continues exactly as the original.
  auto second = tiny_model(tiny_config());
  second->train();
  {
    torch::NoGradGuard no_grad;
    const auto source = first->named_parameters();
    for (auto& item : second->named_parameters()) item.value().copy_(source[item.key()]);
  }
  auto second_layout = two_group_adamw(second);
  ZeroOptimizer resumed(nullptr, *second_layout, 150);
  resumed.load(dir.path());
  for (int64_t step = 3; step < 5; ++step) {
    backward_on(first, step);
    zero.finish_backward();
    zero.clip_grad_norm(1.0);
    zero.step();
    backward_on(second, step);
    resumed.finish_backward();
    resumed.clip_grad_norm(1.0);
    resumed.step();
  }
  expect_same_parameters(first, second, 0, 0);

  // Fresh moments instead would not: the check above can fail.
  auto third = tiny_model(tiny_config());
  third->train();
  {
    torch::NoGradGuard no_grad;
    auto source = second->named_parameters();
    for (auto& item : third->named_parameters()) item.value().copy_(source[item.key()]);
  }
  auto third_layout = two_group_adamw(third);
  ZeroOptimizer fresh(nullptr, *third_layout, 150);
  backward_on(second, 9);
  resumed.finish_backward();
  resumed.step();
  backward_on(third, 9);
  fresh.finish_backward();
  fresh.step();
  EXPECT_FALSE(torch::allclose(second->parameters()[0], third->parameters()[0], 1e-6, 1e-7));
}

TEST(Zero, ACheckpointOfOtherParametersIsRefusedWithItsFile) {
  TempDir dir;
  auto model = tiny_model(tiny_config());
  auto layout = two_group_adamw(model);
  ZeroOptimizer zero(nullptr, *layout, 150);
  zero.save(dir.path());
  auto other = tiny_model(tiny_config());
  auto other_layout = two_group_adamw(other);
  ZeroOptimizer differently_bucketed(nullptr, *other_layout, 400);
  try {
    differently_bucketed.load(dir.path());
    FAIL() << "loaded a state of other buckets";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find(kZeroIndexFile), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("other parameters"), std::string::npos) << error.what();
  }
  std::filesystem::remove(dir.file(zero_shard_file_name(0, 1)));
  try {
    zero.load(dir.path());
    FAIL() << "loaded without its shard file";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("missing"), std::string::npos) << error.what();
  }
}
