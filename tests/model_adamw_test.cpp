// adamw_step (libtorch's fused AdamW kernel on the optimizer's own state) against
// torch::optim::AdamW::step: the same parameters and state within float32 rounding, step by step,
// with two groups of their own lr and weight decay, a parameter without a gradient, and either step
// continuing the other's state.
#include <gtest/gtest.h>

#include "model/adamw.h"

using namespace coconut;

namespace {

struct TrainedParameters {
  std::vector<torch::Tensor> parameters;
  std::unique_ptr<torch::optim::AdamW> optimizer;
};

TrainedParameters make_parameters() {
  torch::manual_seed(0);
  TrainedParameters run;
  for (auto shape : std::vector<std::vector<int64_t>>{{7, 5}, {33}, {4, 4}, {3}})
    run.parameters.push_back(torch::randn(shape).requires_grad_(true));
  torch::optim::AdamWOptions options(1e-2);
  options.betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{run.parameters[0], run.parameters[1], run.parameters[3]},
                      std::make_unique<torch::optim::AdamWOptions>(options));
  auto second = std::make_unique<torch::optim::AdamWOptions>(options);
  second->lr(3e-2).weight_decay(0.0);
  groups.emplace_back(std::vector<torch::Tensor>{run.parameters[2]}, std::move(second));
  run.optimizer = std::make_unique<torch::optim::AdamW>(groups, options);
  return run;
}

// Gradients of step `step` (the same for both runs); the last parameter never gets one.
void set_gradients(TrainedParameters& run, int step) {
  torch::manual_seed(100 + step);
  for (size_t i = 0; i + 1 < run.parameters.size(); ++i) run.parameters[i].mutable_grad() = torch::randn(run.parameters[i].sizes());
}

}  // namespace

TEST(AdamW, FusedStepEqualsLibtorchsStepWithinRounding) {
  TrainedParameters fused = make_parameters(), reference = make_parameters();
  const auto initial_last = fused.parameters.back().clone();
  for (int step = 0; step < 6; ++step) {
    set_gradients(fused, step);
    set_gradients(reference, step);
    // Steps 0-2 fused against libtorch; steps 3-5 the other way round, each continuing the state
    // the other step left.
    if (step < 3) {
      adamw_step(*fused.optimizer);
      reference.optimizer->step();
    } else {
      fused.optimizer->step();
      adamw_step(*reference.optimizer);
    }
    for (size_t i = 0; i < fused.parameters.size(); ++i)
      EXPECT_TRUE(torch::allclose(fused.parameters[i], reference.parameters[i], 1e-5, 1e-6))
          << "step " << step << " parameter " << i << ": max difference "
          << (fused.parameters[i] - reference.parameters[i]).abs().max().item<double>();
  }
  EXPECT_TRUE(torch::equal(fused.parameters.back(), initial_last));  // no gradient, no step
  for (size_t i = 0; i + 1 < fused.parameters.size(); ++i) {
    const auto& a = static_cast<torch::optim::AdamWParamState&>(*fused.optimizer->state().at(fused.parameters[i].unsafeGetTensorImpl()));
    const auto& b =
        static_cast<torch::optim::AdamWParamState&>(*reference.optimizer->state().at(reference.parameters[i].unsafeGetTensorImpl()));
    EXPECT_EQ(a.step(), 6);
    EXPECT_EQ(b.step(), 6);
    EXPECT_TRUE(torch::allclose(a.exp_avg(), b.exp_avg(), 1e-5, 1e-7));
    EXPECT_TRUE(torch::allclose(a.exp_avg_sq(), b.exp_avg_sq(), 1e-5, 1e-9));
  }
  // The parameters moved as AdamW moves them (the test can fail: a step that did nothing would not).
  EXPECT_FALSE(torch::allclose(fused.parameters[0], make_parameters().parameters[0], 1e-3, 1e-3));
}

// Groups the fused kernel does not take (float64 here) still step, through AdamW's own step, and
// the fused groups are not stepped twice.
TEST(AdamW, GroupsTheKernelDoesNotTakeFallBackToLibtorchsStep) {
  TrainedParameters fused = make_parameters(), reference = make_parameters();
  for (auto* run : {&fused, &reference}) {
    auto& group = run->optimizer->param_groups()[1];
    torch::NoGradGuard no_grad;
    auto doubled = group.params()[0].to(torch::kFloat64).detach().requires_grad_(true);
    group.params()[0] = doubled;
    run->parameters[2] = doubled;
  }
  for (int step = 0; step < 3; ++step) {
    set_gradients(fused, step);
    set_gradients(reference, step);
    fused.parameters[2].mutable_grad() = fused.parameters[2].grad().to(torch::kFloat64);
    reference.parameters[2].mutable_grad() = reference.parameters[2].grad().to(torch::kFloat64);
    adamw_step(*fused.optimizer);
    reference.optimizer->step();
    for (size_t i = 0; i < fused.parameters.size(); ++i)
      EXPECT_TRUE(torch::allclose(fused.parameters[i], reference.parameters[i], 1e-5, 1e-6)) << "step " << step << " parameter " << i;
  }
}
