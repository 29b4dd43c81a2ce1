#include "eval/cost.h"

namespace coconut {

ParameterCount count_parameters(const LlamaConfig& c) {
  ParameterCount count;
  const int64_t width = c.hidden_size, dh = c.head_dim;
  count.embeddings = c.vocab_size * width;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerParameterCount layer;
    const int64_t q = c.heads(l) * dh, kv = c.kv_heads(l) * dh, f = c.ffn(l);
    const int64_t attention_bias = c.attention_bias ? 1 : 0, mlp_bias = c.mlp_bias ? 1 : 0;
    layer.q = q * width + attention_bias * q;
    layer.k = kv * width + attention_bias * kv;
    layer.v = kv * width + attention_bias * kv;
    layer.o = width * q + attention_bias * width;
    layer.gate = f * width + mlp_bias * f;
    layer.up = f * width + mlp_bias * f;
    layer.down = width * f + mlp_bias * width;
    layer.norms = 2 * width;
    count.layers.push_back(layer);
  }
  count.final_norm = width;
  count.lm_head = c.tie_word_embeddings ? 0 : c.vocab_size * width;
  count.total = count.embeddings + count.final_norm + count.lm_head;
  for (const auto& layer : count.layers) count.total += layer.total();
  count.non_embedding = count.total - count.embeddings;
  return count;
}

FlopsBreakdown flops_per_token(const LlamaConfig& c, int64_t context) {
  FlopsBreakdown flops;
  const double width = static_cast<double>(c.hidden_size), dh = static_cast<double>(c.head_dim);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const double q = static_cast<double>(c.heads(l)) * dh, kv = static_cast<double>(c.kv_heads(l)) * dh;
    flops.projections += 2.0 * (2.0 * q * width + 2.0 * kv * width);          // q, o and k, v
    flops.attention += 2.0 * 2.0 * q * static_cast<double>(context);            // Q K^T and P V
    flops.mlp += 2.0 * 3.0 * static_cast<double>(c.ffn(l)) * width;
  }
  flops.head = 2.0 * static_cast<double>(c.vocab_size) * width;
  return flops;
}

double prefill_flops_total(const LlamaConfig& c, int64_t tokens, bool all_logits) {
  const FlopsBreakdown one = flops_per_token(c, 1);
  const double per_token_fixed = one.projections + one.mlp;
  const double attention_per_context = one.attention;  // attention FLOPs are linear in context
  const double n = static_cast<double>(tokens);
  const double total = n * per_token_fixed + attention_per_context * n * (n + 1) / 2.0;
  return total + one.head * (all_logits ? n : (tokens > 0 ? 1.0 : 0.0));
}

double generation_flops(const LlamaConfig& c, int64_t prompt_tokens, int64_t new_tokens, int64_t latent_steps) {
  const FlopsBreakdown one = flops_per_token(c, 1);
  const double per_token_fixed = one.projections + one.mlp;
  double total = prefill_flops_total(c, prompt_tokens);
  int64_t context = prompt_tokens;
  for (int64_t i = 0; i < latent_steps; ++i) total += per_token_fixed + one.attention * static_cast<double>(++context);
  // The first new token comes from the last prefill (or latent) position; each later one costs a
  // decode step at growing context with its logits.
  for (int64_t i = 1; i < new_tokens; ++i) total += per_token_fixed + one.attention * static_cast<double>(++context) + one.head;
  return total;
}

int64_t kv_cache_bytes_per_token(const LlamaConfig& c, torch::ScalarType dtype) {
  int64_t elements = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) elements += 2 * c.kv_heads(l) * c.head_dim;
  return elements * static_cast<int64_t>(c10::elementSize(dtype));
}

int64_t weight_bytes_per_decoded_token(const LlamaConfig& c, torch::ScalarType dtype) {
  const ParameterCount count = count_parameters(c);
  int64_t elements = count.total - count.embeddings + c.hidden_size;  // one embedding row
  if (c.tie_word_embeddings) elements += count.embeddings;            // the head reads the whole table
  return elements * static_cast<int64_t>(c10::elementSize(dtype));
}

}  // namespace coconut
