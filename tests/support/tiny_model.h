// Tiny deterministic Llama fixtures for unit tests (2 layers, width 16, seeded weights).
#pragma once

#include "model/llama.h"

namespace coconut::testing {

inline LlamaConfig tiny_config(bool llama3_rope = true) {
  LlamaConfig config;
  config.hidden_size = 16;
  config.intermediate_size = 24;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.vocab_size = 11;
  config.max_position_embeddings = 64;
  config.rms_norm_eps = 1e-5;
  config.rope_theta = 500.0;
  if (llama3_rope) {
    // Small original context so that all three llama3 frequency bands occur at head_dim 4..8.
    config.rope_scaling = {"llama3", 4.0, 1.0, 4.0, 64};
  }
  config.eos_token_ids = {2};
  config.validate();
  return config;
}

// A small model with grouped-query attention (width 64, 3 layers, 4 query heads over 2 KV heads
// of 16, vocabulary 300), for tests that measure memory against the plan of eval/cost.h.
inline LlamaConfig small_gqa_config(int64_t max_positions) {
  LlamaConfig config;
  config.hidden_size = 64;
  config.intermediate_size = 176;
  config.num_hidden_layers = 3;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.vocab_size = 300;
  config.max_position_embeddings = max_positions;
  config.validate();
  return config;
}

// Random weights; norms get non-trivial scales so that they are exercised too.
inline Llama tiny_model(const LlamaConfig& config, uint64_t seed = 7) {
  Llama model(config);
  initialize_weights(model, 0.3, seed);
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  for (auto& named : model->named_parameters())
    if (named.key().find("norm") != std::string::npos) named.value().uniform_(0.5, 1.5);
  model->eval();
  return model;
}

// Gives every LoRA B factor random values (attach_lora starts them at zero), so that the adapters
// change the model.
inline void randomize_adapters(Llama& model, double std = 0.2, uint64_t seed = 3) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  for (auto& named : model->named_parameters())
    if (named.key().find("lora_B") != std::string::npos) named.value().normal_(0.0, std);
}

// Reference for latent_thought_input "expected_embedding": a thought's source state [D] ->
// sum over the vocabulary of softmax(head @ source)[v] x embed_tokens[v], one row at a time.
inline torch::Tensor naive_expected_embedding(Llama& model, const torch::Tensor& source) {
  const auto table = model->embed_tokens->weight.detach();                                // [V, D]
  const auto probabilities = torch::softmax(model->output_weight().detach().matmul(source), 0);  // [V]
  auto mixed = torch::zeros_like(source);
  for (int64_t v = 0; v < table.size(0); ++v) mixed += probabilities[v] * table[v];
  return mixed;
}

}  // namespace coconut::testing
