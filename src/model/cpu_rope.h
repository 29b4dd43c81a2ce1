// Rotary position embedding for inference on the CPU in one pass: x * cos + rotate_half(x) * sin
// with eager libtorch's roundings (each product and the sum rounded to x's dtype), so the result is
// the same bits as the eager chain, which costs five operators and a concatenation per call (two
// calls a layer). Recorded (training) calls on the CPU take it too, with their own backward; GPUs
// and other dtypes take the eager path.
#pragma once

#include <torch/torch.h>

namespace coconut {

// x [B, H, T, Dh] (any strides), cos/sin [B or 1, 1, T, Dh] in x's dtype.
bool uses_cpu_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// -> [B, H, T, Dh], contiguous, in x's dtype.
torch::Tensor cpu_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// The same for one position on float32 (bfloat16) in memory: x [rows, Dh] -> out [rows, Dh], every row rotated
// by the same cos/sin [Dh] (model/cpu_decode.h).
void cpu_rope_rows(const float* x, int64_t rows, const float* cos, const float* sin, int64_t head_dim, float* out);
void cpu_rope_rows(const c10::BFloat16* x, int64_t rows, const c10::BFloat16* cos, const c10::BFloat16* sin, int64_t head_dim,
                   c10::BFloat16* out);

// Training: the same kernel with a gradient for x (the tables take none), where autograd records
// the call. The gradient is a rotation by the opposite angle, exact where cos and sin repeat over
// the two halves of a head, as the model's tables do (cat(angles, angles)).
bool uses_recorded_cpu_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
torch::Tensor recorded_cpu_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace coconut
