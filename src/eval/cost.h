// Exact cost accounting from a LlamaConfig alone: parameters, FLOPs per token, KV-cache bytes,
// weight bytes read per decoded token. Per-layer head and MLP sizes (pruned models) included.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace coconut {

struct LayerParameterCount {
  int64_t q = 0, k = 0, v = 0, o = 0;  // weights + biases of each projection
  int64_t gate = 0, up = 0, down = 0;
  int64_t norms = 0;                   // input_layernorm + post_attention_layernorm
  int64_t attention() const { return q + k + v + o; }
  int64_t mlp() const { return gate + up + down; }
  int64_t total() const { return attention() + mlp() + norms; }
};

struct ParameterCount {
  int64_t embeddings = 0;  // the input table [V, D]
  std::vector<LayerParameterCount> layers;
  int64_t final_norm = 0;
  int64_t lm_head = 0;     // 0 when tied to the embeddings (a shared matrix is counted once, as HF does)
  int64_t total = 0;
  int64_t non_embedding = 0;  // total minus the input embedding table (HF exclude_embeddings)
};

ParameterCount count_parameters(const LlamaConfig& config);

// FLOPs of one token's forward pass when it attends to `context` positions (itself included),
// 2 FLOPs per multiply-accumulate:
//   projections  2 * (q + k + v + o weight counts)             per layer
//   attention    2 * 2 * heads(l) * head_dim * context          per layer (Q K^T and P V)
//   mlp          2 * (gate + up + down weight counts)          per layer
//   head         2 * V * D                                      once
// Not counted (elementwise, O(D) per token each): norms, RoPE, softmax, SiLU, residual adds, biases.
struct FlopsBreakdown {
  double projections = 0, attention = 0, mlp = 0, head = 0;
  double total() const { return projections + attention + mlp + head; }
};
FlopsBreakdown flops_per_token(const LlamaConfig& config, int64_t context);

// Sum over a prefill of `tokens` positions (token t attends to t positions), logits at every position
// when `all_logits`, else only at the last one.
double prefill_flops_total(const LlamaConfig& config, int64_t tokens, bool all_logits = false);
// A whole generation: the prompt's prefill (logits of its last position only) plus `new_tokens`
// decode steps at growing context, each with logits. Latent thoughts count like tokens without
// the head: pass them as `latent_steps` (they come right after the prompt).
double generation_flops(const LlamaConfig& config, int64_t prompt_tokens, int64_t new_tokens, int64_t latent_steps = 0);

// KV-cache bytes per token: 2 (K and V) * sum_l kv_heads(l) * head_dim * bytes(dtype).
int64_t kv_cache_bytes_per_token(const LlamaConfig& config, torch::ScalarType dtype);

// Weight bytes one decoded token reads: every matrix of every layer, norms, the head (the whole
// [V, D] matrix) and one embedding row.
int64_t weight_bytes_per_decoded_token(const LlamaConfig& config, torch::ScalarType dtype);

}  // namespace coconut
