// AdamW's step on libtorch's fused kernel (at::_fused_adamw_: each parameter read and written once
// per step, on the CPU and on CUDA) instead of torch::optim::AdamW::step's dozen operators per
// parameter. The state stays the optimizer's own (step count, exp_avg, exp_avg_sq per parameter),
// so checkpoints save and load as before and either step can continue the other's state.
#pragma once

#include <torch/torch.h>

namespace coconut {

// One AdamW step of every parameter group (its lr, betas, eps, weight decay), for parameters with a
// gradient, as torch::optim::AdamW::step does; float32 parameters on the CPU or a CUDA device (the
// same for every parameter of a group) take the fused kernel, anything else (amsgrad, other dtypes)
// the optimizer's own step. Equal to AdamW's within float32 rounding (tested).
void adamw_step(torch::optim::AdamW& optimizer);

}  // namespace coconut
