// RMSNorm for inference on the CPU in one pass per row, with HF's numerics: statistics in float32,
// the normalised row rounded to the input's dtype, then multiplied by the weight. Eager libtorch
// spends eight operators on it (about 20 us a call however small the row), 13 calls a decode step
// of a 6-layer model: most of a one-row step. Autograd, GPUs and other dtypes take the eager path.
#pragma once

#include <torch/torch.h>

namespace coconut {

// Whether cpu_rms_norm takes these arguments: CPU, float32 / bfloat16 / float16 with a weight of the
// same dtype, nothing needing gradients.
bool uses_cpu_rms_norm(const torch::Tensor& x, const torch::Tensor& weight);

// x [..., D], weight [D] -> weight * (x * rsqrt(mean(x^2) + eps)) [..., D] in x's dtype.
torch::Tensor cpu_rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
// The same on float32 (bfloat16) rows in memory: x [rows, width] -> out [rows, width] (model/cpu_decode.h).
void cpu_rms_norm_rows(const float* x, int64_t rows, const float* weight, int64_t width, double eps, float* out);
void cpu_rms_norm_rows(const c10::BFloat16* x, int64_t rows, const c10::BFloat16* weight, int64_t width, double eps,
                       c10::BFloat16* out);

// Training in float32 on the CPU (autograd records the call): one pass each way with gradients
// for x and the weight, where libtorch's rms_norm runs its composite form (about six operators
// forward and ten backward on the CPU).
bool uses_recorded_cpu_rms_norm(const torch::Tensor& x, const torch::Tensor& weight);
torch::Tensor recorded_cpu_rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

}  // namespace coconut
