// y = x W^T + b, the projection every layer uses. For decode on CPU (up to 16 rows, no autograd)
// hand-written kernels: for one row a matrix-vector kernel that streams the weights at close to
// memory bandwidth, which libtorch's BLAS path does not reach for bf16/f16 (about half of it on this
// machine kind); for 2-16 rows (continuous batching) register tiles of 4 rows by 4 weight rows,
// which load each weight once for all rows and match or beat BLAS there (bench_linear).
// Everything else (training, prefill with many rows, GPUs) goes to at::linear.
#pragma once

#include <torch/torch.h>

namespace coconut {

// x [..., K], weight [N, K], bias [N] or undefined -> [..., N] in x's dtype (as at::linear).
torch::Tensor dense(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias = {});

// Whether `dense` would take the hand-written kernel for these arguments (for tests/benchmarks).
bool uses_decode_kernel(const torch::Tensor& x, const torch::Tensor& weight);

// Largest number of rows (B*T) that the decode kernels handle: the server's default batch.
constexpr int64_t kDecodeKernelMaxRows = 16;

}  // namespace coconut
