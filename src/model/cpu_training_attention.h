// Attention for training on the CPU in float32 (autograd records it), forward and backward, where
// libtorch's fused CPU kernel (scaled_dot_product_attention) took a fifth of the 1M training step
// (bench_train --profile, one thread: 39 of 220 ms for 4 layers of 16 x 160 positions). Per
// (batch row, KV head) task, its query heads one after another, in blocks of 32 query rows: the
// scores of a block against the keys up to the last column any of its rows may see (the mask's
// causal edge, so about half the products of a causal pass are skipped), softmax in place,
// then the products with V, all on those blocks as AVX-512 register tiles (elsewhere BLAS calls:
// MKL's sgemm through libtorch). Backward recomputes the probabilities block by block (nothing
// [T, S] is kept) and accumulates the KV head's dK and dV over its query heads in the task itself
// (no atomics). The context comes out as [B, T, H, Dh], the layout the output projection reads, so
// the transpose copy after attention (and its backward) is gone too. Inference prompts on the CPU
// take the forward as well (model/llama.cpp): a row's result depends on its own sequence only.
#pragma once

#include <torch/torch.h>

namespace coconut {

// Whether cpu_training_attention takes these: float32 CPU tensors with unit inner strides,
// q [B, H, T, Dh], k and v [B, G, S, Dh] with G dividing H, a mask (if any) broadcastable to
// [B, 1, T, S], and AVX-512 or a BLAS in libtorch to call.
bool uses_cpu_training_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 const torch::Tensor& mask);

// softmax(scale q k^T + mask) v for each query head against its group's KV head; with no mask,
// causal (T == S) or, with `causal` false, every column. Returns [B, T, H, Dh]. The mask is
// additive (0 where allowed, a large negative number or -inf where not) and gets no gradient.
torch::Tensor cpu_training_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& mask, bool causal, double scale);

}  // namespace coconut
