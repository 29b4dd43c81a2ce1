// coconut info: exact parameter breakdown, FLOPs per token and KV-cache bytes of a config.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "eval/cost.h"
#include "io/hf_config.h"
#include "model/llama.h"

namespace coconut::cli {
namespace {

struct InfoFlags {
  std::string path, dtype;
  int64_t context = 0;
  bool json = false;
};

std::string grouped(int64_t value) {
  std::string digits = std::to_string(value), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

nlohmann::json breakdown_json(const FlopsBreakdown& flops) {
  return {{"projections", flops.projections}, {"attention", flops.attention}, {"mlp", flops.mlp}, {"head", flops.head}};
}

int run_info(const InfoFlags& flags) {
  const LlamaConfig config = load_config(flags.path);
  const auto dtype = flags.dtype.empty() ? dtype_from_name(config.torch_dtype) : dtype_from_name(flags.dtype);
  if (flags.context < 0) throw std::invalid_argument("--context must be positive, got " + std::to_string(flags.context));
  // Default context: 2048 or max_position_embeddings, whichever is smaller.
  const int64_t context = flags.context > 0 ? flags.context : std::min<int64_t>(2048, config.max_position_embeddings);
  const std::string context_source =
      flags.context > 0 ? "--context"
      : config.max_position_embeddings < 2048
          ? "default: max_position_embeddings, smaller than 2048"
          : "default: 2048, max_position_embeddings is " + std::to_string(config.max_position_embeddings);
  const ParameterCount count = count_parameters(config);
  const FlopsBreakdown flops = flops_per_token(config, context);
  const int64_t kv_bytes = kv_cache_bytes_per_token(config, dtype);
  // A forward over a whole sequence of `context` tokens with logits at every position.
  const FlopsBreakdown sequence = prefill_flops(config, context, true);
  const char* const tied_note = "tied lm_head shares the embedding table: counted once, under embeddings";

  if (flags.json) {
    nlohmann::json layers = nlohmann::json::array();
    for (size_t l = 0; l < count.layers.size(); ++l) {
      const auto& layer = count.layers[l];
      const auto index = static_cast<int64_t>(l);
      layers.push_back({{"q", layer.q}, {"k", layer.k}, {"v", layer.v}, {"o", layer.o}, {"attention", layer.attention()},
                        {"gate", layer.gate}, {"up", layer.up}, {"down", layer.down}, {"mlp", layer.mlp()},
                        {"norms", layer.norms}, {"total", layer.total()}, {"heads", config.heads(index)},
                        {"kv_heads", config.kv_heads(index)}, {"intermediate_size", config.ffn(index)}});
    }
    const nlohmann::json out = {
        {"total_params", count.total},
        {"non_embedding_params", count.non_embedding},
        {"embedding_params", count.embeddings},
        {"lm_head_params", count.lm_head},
        {"tied_embeddings", config.tie_word_embeddings},
        {"params_note", std::string("non_embedding_params = total_params - embedding_params") +
                            (config.tie_word_embeddings ? "; " + std::string(tied_note) : "")},
        {"final_norm_params", count.final_norm},
        {"layers", layers},
        {"context", context},
        {"context_source", context_source},
        {"flops_per_token", flops.total()},
        {"flops_breakdown", breakdown_json(flops)},
        {"flops_counted", "2 per multiply-accumulate: q/k/v/o projections, attention QK^T and PV, MLP gate/up/down, lm_head"},
        {"flops_not_counted", kFlopsNotCounted},
        {"sequence_flops", {{"tokens", context}, {"logits", "every position"}, {"total", sequence.total()},
                            {"average_per_token", sequence.total() / static_cast<double>(context)},
                            {"breakdown", breakdown_json(sequence)}}},
        {"kv_cache_dtype", dtype_name(dtype)},
        {"kv_cache_bytes_per_token", kv_bytes},
        {"weight_bytes_per_decoded_token", weight_bytes_per_decoded_token(config, dtype)},
    };
    fmt::print("{}\n", out.dump(2));
    return 0;
  }

  fmt::print("model: {} layers, width {}, {} heads / {} KV heads (head_dim {}), MLP {}, vocab {}{}\n",
             config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
             config.head_dim, config.intermediate_size, config.vocab_size, config.is_uniform() ? "" : " (per-layer sizes)");
  fmt::print("\nparameters\n");
  fmt::print("  {:<6} {:>5} {:>4} {:>12} {:>12} {:>12} {:>12} {:>13} {:>14} {:>7} {:>14}\n", "layer", "heads", "kv", "q", "k",
             "v", "o", "attention", "mlp", "norms", "total");
  for (size_t l = 0; l < count.layers.size(); ++l) {
    const auto& layer = count.layers[l];
    const auto index = static_cast<int64_t>(l);
    fmt::print("  {:<6} {:>5} {:>4} {:>12} {:>12} {:>12} {:>12} {:>13} {:>14} {:>7} {:>14}\n", l, config.heads(index),
               config.kv_heads(index), grouped(layer.q), grouped(layer.k), grouped(layer.v), grouped(layer.o),
               grouped(layer.attention()), grouped(layer.mlp()), grouped(layer.norms), grouped(layer.total()));
  }
  fmt::print("  embeddings      {:>15}\n", grouped(count.embeddings));
  fmt::print("  final norm      {:>15}\n", grouped(count.final_norm));
  fmt::print("  lm_head         {:>15}{}\n", grouped(count.lm_head),
             config.tie_word_embeddings ? std::string("  (") + tied_note + ")" : std::string());
  fmt::print("  total           {:>15}\n", grouped(count.total));
  fmt::print("  non-embedding   {:>15}  (total minus the input embedding table)\n", grouped(count.non_embedding));
  fmt::print("\nFLOPs per token at context {} ({}), 2 per multiply-accumulate\n", context, context_source);
  fmt::print("  q/k/v/o projections  {:>16}\n", grouped(static_cast<int64_t>(flops.projections)));
  fmt::print("  attention QK^T, PV   {:>16}\n", grouped(static_cast<int64_t>(flops.attention)));
  fmt::print("  MLP                  {:>16}\n", grouped(static_cast<int64_t>(flops.mlp)));
  fmt::print("  lm_head              {:>16}\n", grouped(static_cast<int64_t>(flops.head)));
  fmt::print("  total                {:>16}  ({:.3f} GFLOP)\n", grouped(static_cast<int64_t>(flops.total())), flops.total() / 1e9);
  fmt::print("  not counted: {}\n", kFlopsNotCounted);
  fmt::print("  a sequence of {} tokens (logits at every position): {} in total, {} per token on average\n", context,
             grouped(static_cast<int64_t>(sequence.total())),
             grouped(std::llround(sequence.total() / static_cast<double>(context))));
  fmt::print("\nKV cache: {} bytes per token in {}\n", grouped(kv_bytes), dtype_name(dtype));
  fmt::print("weights read per decoded token: {} bytes in {}\n", grouped(weight_bytes_per_decoded_token(config, dtype)),
             dtype_name(dtype));
  return 0;
}

const bool registered = register_command({"info", "parameters, FLOPs per token and KV-cache bytes of a model or config",
                                          [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<InfoFlags>();
  app.add_option("path", flags->path, "model folder or config.json")->required();
  app.add_option("--context", flags->context, "context length for FLOPs (default min(2048, max positions))")
      ->check(in_range(1, 16 * kMaxTokensFlag));
  app.add_option("--dtype", flags->dtype, "dtype for byte counts (default: the config's torch_dtype)");
  app.add_flag("--json", flags->json, "print JSON");
  return [flags] { return run_info(*flags); };
}});

}  // namespace
}  // namespace coconut::cli
