// LlamaConfig: the architecture of a decoder-only Llama, mirroring Hugging Face `config.json`
// for `LlamaForCausalLM`, plus optional per-layer head / KV-head / MLP sizes so that a pruned
// model is just another config. Runtime settings (dtype of a run, device) live elsewhere.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace coconut {

struct RopeScaling {
  // "none", "linear" or "llama3" (HF `rope_scaling.rope_type`, older files say `type`).
  std::string type = "none";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct LlamaConfig {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // 0 in a file means hidden_size / num_attention_heads (filled by validate)
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  std::vector<int64_t> bos_token_ids;  // HF allows an int or a list
  std::vector<int64_t> eos_token_ids;
  std::string torch_dtype = "float32";  // "float32", "float16" or "bfloat16"

  // Extension for pruned models (empty = uniform). When present, one entry per layer.
  std::vector<int64_t> layer_num_attention_heads;
  std::vector<int64_t> layer_num_key_value_heads;
  std::vector<int64_t> layer_intermediate_size;

  // Extension for compute-adaptive depth: every layer has a gate (`layers.{l}.router`, [1, D] +
  // bias) that decides per position whether the layer runs (ForwardOptions::router_threshold).
  bool depth_router = false;
  int64_t depth_router_first_layer = 0;  // layers before it always run (their gates are unused)

  // Extension for Coconut: a continuous thought is the last hidden state (after the final norm)
  // fed back as the next input embedding. 0 feeds it back as it is (the paper); > 0 first rescales
  // each thought vector to this root-mean-square, the scale of the token embeddings, so that a
  // thought does not outweigh the tokens in the residual stream (LlamaImpl::thought_input).
  double latent_thought_rms = 0;
  // ... and what is fed back: "last_hidden" (that state, the paper) or "expected_embedding" (the
  // mean of the token embeddings under the model's own next-token distribution at that state,
  // softmax(logits) @ embed_tokens: a thought that spreads its probability over a set of tokens is
  // fed back as the superposition of their embeddings, the form a token-level lookup can read;
  // "soft thinking"). Its cost is two [V, D] products per thought (eval/cost.h).
  std::string latent_thought_input = "last_hidden";
  bool thought_is_expected_embedding() const { return latent_thought_input == "expected_embedding"; }
  static bool is_latent_thought_input(const std::string& name) {
    return name == "last_hidden" || name == "expected_embedding";
  }

  // Per-layer accessors: the only way model code reads head and MLP sizes.
  int64_t heads(int64_t layer) const;
  int64_t kv_heads(int64_t layer) const;
  int64_t ffn(int64_t layer) const;
  int64_t mlp_channels() const;  // ffn(layer) summed over the layers
  // The largest per-layer size: the width of a [L, max] mask or score table over a pruned model.
  int64_t max_heads() const;
  int64_t max_kv_heads() const;
  int64_t max_ffn() const;
  bool is_uniform() const;  // no per-layer array differs from the global value

  // Fills derived values (head_dim) and throws std::invalid_argument naming the field on
  // inconsistent values (heads not a multiple of KV heads, non-positive sizes, bad arrays...).
  void validate();
};

}  // namespace coconut
