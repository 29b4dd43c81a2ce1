// The two products of attention for decode on CPU (a few query rows per head, float32, no
// autograd): scores = q k^T and context = p v, read straight from the KV cache's strided views.
// libtorch's bmm makes such small, strided batches contiguous and multiplies them one by one (about
// 120 us a layer for 16 rows of the shipped 1.6M models against a few here). Everything else
// (prefill, training, GPUs, other dtypes) goes to torch::matmul.
#pragma once

#include <torch/torch.h>

namespace coconut {

// Largest number of query rows per (batch, KV head) that the decode kernels take.
constexpr int64_t kDecodeAttentionMaxRows = 16;

// Whether attention_scores/attention_context take the hand-written kernels for these arguments.
bool uses_decode_attention(const torch::Tensor& queries, const torch::Tensor& keys);

// queries [B, G, Q, Dh], keys [B, G, S, Dh] -> [B, G, Q, S]: (q . k) * scale, in float32.
torch::Tensor attention_scores(const torch::Tensor& queries, const torch::Tensor& keys, double scale);

// probabilities [B, G, Q, S], values [B, G, S, Dh] -> [B, G, Q, Dh]: sum over s of p v.
torch::Tensor attention_context(const torch::Tensor& probabilities, const torch::Tensor& values);

// The same kernels on float32 operands in memory (model/cpu_decode.h), where the CPU has them
// (has_decode_attention_kernels). An operand [B, G, rows, Dh] is given by its data and the element
// strides of its first three dimensions (the last is contiguous); outputs are contiguous:
// scores [B, G, Q, S], context [B, G, Q, Dh] from probabilities [B, G, Q, S].
struct AttentionOperand {
  const float* data;
  int64_t batch_stride, group_stride, row_stride;
};
bool has_decode_attention_kernels();
void attention_scores_into(AttentionOperand queries, AttentionOperand keys, int64_t batch, int64_t groups, int64_t query_rows,
                           int64_t key_rows, int64_t head_dim, double scale, float* out);
void attention_context_into(const float* probabilities, AttentionOperand values, int64_t batch, int64_t groups,
                            int64_t query_rows, int64_t key_rows, int64_t head_dim, float* out);

}  // namespace coconut
