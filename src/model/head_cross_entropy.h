// The output head's cross-entropy without its logits: the mean over rows of
// -log softmax(hidden W^T)[target], computed a chunk of rows at a time. The [N, V] logits (float32,
// 49,152 columns for SmolLM2) are never all alive: forward keeps each row's log-sum-exp, backward
// recomputes a chunk's logits and turns them into its gradients at once. The products run as the
// unfused head runs them: in bf16 under autocast (the cast of each operand, float32 softmax),
// otherwise in the operands' dtype.
#pragma once

#include <torch/torch.h>

namespace coconut {

// hidden [N, D], weight [V, D], targets [N] int64 (every row labelled) -> a scalar; gradients reach
// hidden and, where it requires grad, weight. `chunk_rows` 0: as many rows as make 64 Mi logits.
torch::Tensor head_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                                 int64_t chunk_rows = 0);

}  // namespace coconut
