// coconut info: exact parameter breakdown, FLOPs per token and KV-cache bytes of a config.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
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
  // The training memory plan, printed when --world-size is given.
  int64_t world_size = 0, zero_stage = 0, train_batch = 1, train_tokens = 1024, labelled_tokens = -1;
  bool activation_checkpointing = false, written_out_attention = false;
  int64_t latent_thoughts = 0, first_latent = -1;
};

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

nlohmann::json training_memory_json(const TrainingMemory& memory, const TrainingMemoryOptions& options) {
  return {{"world_size", options.world_size},
          {"zero_stage", options.zero_stage},
          {"batch_per_rank", options.batch},
          {"tokens", options.tokens},
          {"labelled_tokens", options.labelled_tokens < 0 ? options.tokens : options.labelled_tokens},
          {"activation_checkpointing", options.activation_checkpointing},
          {"fused_attention", options.fused_attention},
          {"latent_thoughts", options.latent_thoughts},
          {"first_latent", options.latent_thoughts > 0 ? first_latent_column(options) : -1},
          {"per_rank_bytes",
           {{"weights_float32", memory.weights},
            {"autocast_bf16_weight_copies", memory.autocast_weight_copies},
            {"gradients", memory.gradients},
            {"adamw_moments", memory.optimizer_moments},
            {"master_copy", memory.master_copy},
            {"activations", memory.activations},
            {"activations_per_layer", memory.activations_per_layer},
            {"activations_head", memory.activations_head},
            {"activations_thoughts", memory.activations_thoughts},
            {"total", memory.total()}}},
          {"per_rank_gib", gib(memory.total())},
          {"assumptions",
           "float32 weights with bf16 autocast (its cache holds a bf16 copy of each weight matrix), AdamW's two float32 "
           "moments; ZeRO-2 shards moments, a float32 master copy and averaged gradients over the ranks and keeps one "
           "bucket of gradients in flight; activations saved for backward, tensor by tensor (eval/cost.cpp)"}};
}

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
  std::optional<TrainingMemoryOptions> plan;
  if (flags.world_size > 0) {
    plan.emplace();
    plan->world_size = flags.world_size;
    plan->zero_stage = flags.zero_stage;
    plan->batch = flags.train_batch;
    plan->tokens = flags.train_tokens;
    plan->labelled_tokens = flags.labelled_tokens;
    plan->activation_checkpointing = flags.activation_checkpointing;
    plan->fused_attention = !flags.written_out_attention;
    plan->latent_thoughts = flags.latent_thoughts;
    plan->first_latent = flags.first_latent;
  }
  const std::optional<TrainingMemory> memory =
      plan ? std::optional<TrainingMemory>(training_memory(config, *plan)) : std::nullopt;

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
    nlohmann::json out = {
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
    if (memory) out["training_memory"] = training_memory_json(*memory, *plan);
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
  if (memory) {
    const std::string thoughts =
        plan->latent_thoughts > 0 ? fmt::format(", {} Coconut thoughts", plan->latent_thoughts) : std::string();
    fmt::print("\ntraining memory per rank: {} ranks, ZeRO stage {}, {} x {} tokens per micro-batch{}{}{}\n", plan->world_size,
               plan->zero_stage, plan->batch, plan->tokens, plan->activation_checkpointing ? ", activation checkpointing" : "",
               plan->fused_attention ? ", fused attention" : ", written-out attention", thoughts);
    const auto line = [](const char* what, int64_t bytes) {
      fmt::print("  {:<34} {:>18} bytes  {:>8.2f} GiB\n", what, grouped(bytes), gib(bytes));
    };
    line("weights (float32)", memory->weights);
    line("autocast bf16 copies of matrices", memory->autocast_weight_copies);
    line("gradients", memory->gradients);
    line("AdamW moments (float32)", memory->optimizer_moments);
    line("master copy (ZeRO-2 shard)", memory->master_copy);
    line("activations", memory->activations);
    if (plan->latent_thoughts > 0) line("  of which thought passes' K/V", memory->activations_thoughts);
    line("total", memory->total());
  }
  return 0;
}

const bool registered = register_command({"info", "parameters, FLOPs per token and KV-cache bytes of a model or config (with --world-size: training memory per rank)",
                                          [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<InfoFlags>();
  app.add_option("path", flags->path, "model folder or config.json")->required();
  app.add_option("--context", flags->context, "context length for FLOPs (default min(2048, max positions))")
      ->check(in_range(1, 16 * kMaxTokensFlag));
  app.add_option("--dtype", flags->dtype, "dtype for byte counts (default: the config's torch_dtype)");
  app.add_flag("--json", flags->json, "print JSON");
  app.add_option("--world-size", flags->world_size, "print the training memory plan of one rank of N")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--zero-stage", flags->zero_stage, "memory plan: 0 (unsharded) or 2 (ZeRO-2)")->check(CLI::IsMember({0, 2}));
  app.add_option("--train-batch", flags->train_batch, "memory plan: rows per micro-batch per rank (default 1)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--train-tokens", flags->train_tokens, "memory plan: positions per row (default 1024)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--labelled-tokens", flags->labelled_tokens, "memory plan: positions per row with a label (default all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  app.add_flag("--activation-checkpointing", flags->activation_checkpointing,
               "memory plan: layers keep only their inputs and are recomputed in backward");
  app.add_option("--latent-thoughts", flags->latent_thoughts,
                 "memory plan: Coconut thoughts per row (their passes keep the K/V cache grown so far)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--first-latent", flags->first_latent, "memory plan: column of the first thought (default: mid-row)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_flag("--written-out-attention", flags->written_out_attention,
               "memory plan: attention written out (T x T scores and probabilities kept), not the fused kernel training runs");

  return [flags] { return run_info(*flags); };
}});

}  // namespace
}  // namespace coconut::cli
