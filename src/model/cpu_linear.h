// y = x W^T + b, the projection every layer uses. On CPU hand-written kernels:
// - one row (decode of a single sequence): a matrix-vector kernel that streams the weights at close
//   to memory bandwidth, which libtorch's BLAS path does not reach for bf16/f16 (about half of it on
//   this machine kind);
// - 2-16 rows (continuous batching): register tiles of 4 rows by 4 weight rows, which load each
//   weight once for all rows of a tile and beat BLAS there;
// - more rows of float32 (prefill, evaluation; weights up to 64 MiB): the same tiles over blocks of
//   16 input rows that stay in cache while the weights stream past, 1.1-2x BLAS's speed up to 1,024
//   rows on this machine (AMD EPYC, where the wheel's MKL takes its generic kernels; bench_linear);
// - float32 training without autocast (autograd): the tiles for the forward and the input
//   gradient, outer-product tiles for the weight gradient.
// Everything else (bf16/f16 prefill, where oneDNN is faster, autocast, GPUs) goes to at::linear.
#pragma once

#include <torch/torch.h>

namespace coconut {

// x [..., K], weight [N, K], bias [N] or undefined -> [..., N] in x's dtype (as at::linear).
torch::Tensor dense(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias = {});

// Whether `dense` would take the hand-written kernel for these arguments (for tests/benchmarks).
bool uses_decode_kernel(const torch::Tensor& x, const torch::Tensor& weight);

// Input rows (B*T) a tile pass covers at once; more rows are taken a block at a time.
constexpr int64_t kDecodeKernelRowBlock = 16;

}  // namespace coconut
