#include "model/adamw.h"

#include <memory>
#include <vector>

#include "model/device.h"

namespace coconut {

namespace {

bool fused_kernel_takes(const torch::optim::OptimizerParamGroup& group) {
  const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
  if (options.amsgrad()) return false;
  std::optional<torch::Device> device;
  for (const auto& parameter : group.params()) {
    if (!parameter.grad().defined()) continue;
    if (parameter.scalar_type() != torch::kFloat32 || parameter.grad().scalar_type() != torch::kFloat32 ||
        parameter.grad().is_sparse() || !(parameter.device().is_cpu() || parameter.device().is_cuda()))
      return false;
    if (device && *device != parameter.device()) return false;
    device = parameter.device();
  }
  return true;
}

}  // namespace

void adamw_step(torch::optim::AdamW& optimizer) {
  torch::NoGradGuard no_grad;
  auto& state = optimizer.state();
  std::vector<torch::optim::OptimizerParamGroup*> fused;  // the groups stepped here
  for (auto& group : optimizer.param_groups()) {
    if (!fused_kernel_takes(group)) continue;
    fused.push_back(&group);
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    std::vector<torch::Tensor> parameters, gradients, exp_avgs, exp_avg_sqs;
    std::vector<float> steps;  // each parameter's step count after this step
    for (auto& parameter : group.params()) {
      if (!parameter.grad().defined()) continue;
      auto& slot = state[parameter.unsafeGetTensorImpl()];
      if (!slot) {  // a new parameter: AdamW's own initial state
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(parameter, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(parameter, torch::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& parameter_state = static_cast<torch::optim::AdamWParamState&>(*slot);
      parameter_state.step(parameter_state.step() + 1);
      parameters.push_back(parameter);
      gradients.push_back(parameter.grad());
      exp_avgs.push_back(parameter_state.exp_avg());
      exp_avg_sqs.push_back(parameter_state.exp_avg_sq());
      steps.push_back(static_cast<float>(parameter_state.step()));
    }
    if (parameters.empty()) continue;
    // The kernel reads each parameter's step count from a float32 scalar on its device: one copy
    // of them all per group, without waiting for the device (model/device.h).
    const auto step_counts = host_to_device(torch::tensor(steps), parameters.front().device()).unbind(0);
    at::_fused_adamw_(parameters, gradients, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, step_counts, options.lr(),
                      std::get<0>(options.betas()), std::get<1>(options.betas()), options.weight_decay(), options.eps(),
                      /*amsgrad=*/false, /*maximize=*/false);
  }
  if (fused.size() == optimizer.param_groups().size()) return;
  // Groups the kernel does not take: AdamW's own step on those alone (the others' gradients are
  // hidden from it for the call, so it leaves them as they are).
  std::vector<std::pair<torch::Tensor, torch::Tensor>> hidden;
  for (auto* group : fused) {
    for (auto& parameter : group->params())
      if (parameter.grad().defined()) hidden.emplace_back(parameter, parameter.grad()), parameter.mutable_grad() = torch::Tensor();
  }
  optimizer.step();
  for (auto& [parameter, gradient] : hidden) parameter.mutable_grad() = gradient;
}

}  // namespace coconut
