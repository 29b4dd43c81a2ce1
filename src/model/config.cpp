#include "model/config.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace coconut {

namespace {
int64_t per_layer(const std::vector<int64_t>& values, int64_t layer, int64_t fallback) {
  return values.empty() ? fallback : values.at(static_cast<size_t>(layer));
}

void require(bool condition, const std::string& message) {
  if (!condition) throw std::invalid_argument("invalid LlamaConfig: " + message);
}
}  // namespace

int64_t LlamaConfig::heads(int64_t layer) const {
  return per_layer(layer_num_attention_heads, layer, num_attention_heads);
}
int64_t LlamaConfig::kv_heads(int64_t layer) const {
  return per_layer(layer_num_key_value_heads, layer, num_key_value_heads);
}
int64_t LlamaConfig::ffn(int64_t layer) const {
  return per_layer(layer_intermediate_size, layer, intermediate_size);
}

int64_t LlamaConfig::mlp_channels() const {
  int64_t total = 0;
  for (int64_t layer = 0; layer < num_hidden_layers; ++layer) total += ffn(layer);
  return total;
}

namespace {

int64_t largest_over_layers(const LlamaConfig& config, int64_t (LlamaConfig::*size)(int64_t) const) {
  int64_t largest = 0;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) largest = std::max(largest, (config.*size)(layer));
  return largest;
}

}  // namespace

int64_t LlamaConfig::max_heads() const { return largest_over_layers(*this, &LlamaConfig::heads); }
int64_t LlamaConfig::max_kv_heads() const { return largest_over_layers(*this, &LlamaConfig::kv_heads); }
int64_t LlamaConfig::max_ffn() const { return largest_over_layers(*this, &LlamaConfig::ffn); }

bool LlamaConfig::is_uniform() const {
  for (int64_t layer = 0; layer < num_hidden_layers; ++layer) {
    if (heads(layer) != num_attention_heads || kv_heads(layer) != num_key_value_heads ||
        ffn(layer) != intermediate_size)
      return false;
  }
  return true;
}

void LlamaConfig::validate() {
  require(hidden_size > 0, "hidden_size must be positive, got " + std::to_string(hidden_size));
  require(intermediate_size > 0, "intermediate_size must be positive");
  require(num_hidden_layers >= 0, "num_hidden_layers must not be negative");
  require(num_attention_heads > 0, "num_attention_heads must be positive");
  require(std::isfinite(latent_thought_rms) && latent_thought_rms >= 0,
          "latent_thought_rms must be a finite number >= 0, got " + std::to_string(latent_thought_rms));
  require(is_latent_thought_input(latent_thought_input),
          "latent_thought_input must be last_hidden or expected_embedding, got '" + latent_thought_input + "'");
  require(depth_router_first_layer >= 0 && depth_router_first_layer <= num_hidden_layers,
          "depth_router_first_layer must be in 0..num_hidden_layers, got " + std::to_string(depth_router_first_layer));
  if (num_key_value_heads == 0) num_key_value_heads = num_attention_heads;
  require(num_attention_heads % num_key_value_heads == 0,
          "num_attention_heads (" + std::to_string(num_attention_heads) +
              ") must be a multiple of num_key_value_heads (" + std::to_string(num_key_value_heads) + ")");
  if (head_dim == 0) {
    require(hidden_size % num_attention_heads == 0,
            "hidden_size must be divisible by num_attention_heads when head_dim is absent");
    head_dim = hidden_size / num_attention_heads;
  }
  require(head_dim > 0 && head_dim % 2 == 0, "head_dim must be positive and even, got " + std::to_string(head_dim));
  require(vocab_size > 0, "vocab_size must be positive");
  // Upper bounds far above any Llama (405B: hidden 16384, 126 layers, 128 heads, ffn 53248, vocab
  // 128256) keep every count in int64 and every loop over layers short.
  const auto bounded = [&](int64_t value, int64_t limit, const char* name) {
    require(value <= limit, std::string(name) + " is " + std::to_string(value) + ", above the supported " +
                                std::to_string(limit));
  };
  bounded(hidden_size, int64_t{1} << 20, "hidden_size");
  bounded(intermediate_size, int64_t{1} << 22, "intermediate_size");
  bounded(num_hidden_layers, 4096, "num_hidden_layers");
  bounded(num_attention_heads, 4096, "num_attention_heads");
  bounded(num_key_value_heads, 4096, "num_key_value_heads");
  bounded(head_dim, 4096, "head_dim");
  bounded(num_attention_heads * head_dim, int64_t{1} << 20, "num_attention_heads x head_dim");
  bounded(vocab_size, int64_t{1} << 24, "vocab_size");
  require(max_position_embeddings > 0, "max_position_embeddings must be positive");
  bounded(max_position_embeddings, int64_t{1} << 24, "max_position_embeddings");
  // Values that are positive but absurd give garbage silently: bounded too.
  require(std::isfinite(rms_norm_eps) && rms_norm_eps > 0 && rms_norm_eps <= 1e-1,
          "rms_norm_eps must be in (0, 0.1], got " + fmt::format("{}", rms_norm_eps));
  require(std::isfinite(rope_theta) && rope_theta >= 1 && rope_theta <= 1e12,
          "rope_theta must be in [1, 1e12], got " + fmt::format("{}", rope_theta));
  require(rope_scaling.type == "none" || rope_scaling.type == "linear" || rope_scaling.type == "llama3",
          "unsupported rope_scaling type '" + rope_scaling.type + "' (supported: none, linear, llama3)");
  if (rope_scaling.type != "none")
    require(std::isfinite(rope_scaling.factor) && rope_scaling.factor > 0 && rope_scaling.factor <= 1e6,
            "rope_scaling.factor must be in (0, 1e6], got " + fmt::format("{}", rope_scaling.factor));
  if (rope_scaling.type == "llama3")
    require(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor &&
                rope_scaling.original_max_position_embeddings > 0,
            "llama3 rope_scaling needs high_freq_factor > low_freq_factor and original_max_position_embeddings > 0");
  require(torch_dtype == "float32" || torch_dtype == "float16" || torch_dtype == "bfloat16",
          "unsupported torch_dtype '" + torch_dtype + "' (supported: float32, float16, bfloat16)");
  const auto check_array = [&](const std::vector<int64_t>& values, const char* name) {
    require(values.empty() || static_cast<int64_t>(values.size()) == num_hidden_layers,
            std::string(name) + " has " + std::to_string(values.size()) + " entries for " +
                std::to_string(num_hidden_layers) + " layers");
  };
  check_array(layer_num_attention_heads, "layer_num_attention_heads");
  check_array(layer_num_key_value_heads, "layer_num_key_value_heads");
  check_array(layer_intermediate_size, "layer_intermediate_size");
  for (int64_t layer = 0; layer < num_hidden_layers; ++layer) {
    const std::string where = " in layer " + std::to_string(layer);
    require(kv_heads(layer) > 0 && heads(layer) > 0, "heads must be positive" + where);
    require(heads(layer) % kv_heads(layer) == 0,
            "query heads must be a multiple of KV heads" + where + " (" + std::to_string(heads(layer)) + " vs " +
                std::to_string(kv_heads(layer)) + ")");
    require(ffn(layer) > 0, "intermediate size must be positive" + where);
    require(heads(layer) <= 4096 && ffn(layer) <= (int64_t{1} << 22), "heads or intermediate size too large" + where);
  }
}

}  // namespace coconut
