// SwiGLU's activation silu(gate) * up in one pass on the CPU in float32, forward and backward, where
// libtorch runs silu and a product forward and three passes backward (mul, mul, silu_backward),
// keeping silu(gate) for them. The 1M training step spent 10% of its time there (bench_train
// --profile, one thread). Other dtypes, devices and layouts take libtorch's operators.
#pragma once

#include <torch/torch.h>

namespace coconut {

// The kernels: the best this CPU runs, or one named (tests run each the CPU has).
enum class SwigluKernel { kBest, kAvx512, kAvx2, kPortable };
bool cpu_runs(SwigluKernel kernel);

// Whether cpu_swiglu takes these: float32 CPU tensors of one shape, both contiguous.
bool uses_cpu_swiglu(const torch::Tensor& gate, const torch::Tensor& up);

// gate, up [..., F] -> gate / (1 + exp(-gate)) * up [..., F], libtorch's silu formula. Recorded by
// autograd when either input needs a gradient: backward recomputes the sigmoid from gate (nothing
// but the inputs is kept) and returns both gradients from one pass.
torch::Tensor cpu_swiglu(const torch::Tensor& gate, const torch::Tensor& up, SwigluKernel kernel = SwigluKernel::kBest);

// The forward values on float32 in memory, the best kernel this CPU runs: gate, up [count] -> out [count].
void cpu_swiglu_values(const float* gate, const float* up, int64_t count, float* out);

// cpu_swiglu where it takes the inputs, silu(gate) * up elsewhere.
torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up);

}  // namespace coconut
