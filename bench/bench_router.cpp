// Does the depth router save time at batch 1? Decode tokens/s and the latency of a Coconut-style
// answer (prompt, continuous thoughts, a few decoded tokens) when the gates skip k of the L layers
// for every thought and decoded token, next to the analytic FLOPs ratio of the same work and to
// the model with those k layers removed statically. "Realised" is the fraction of the analytic gain
// the clock shows: (measured speedup - 1) / (analytic speedup - 1). A skipped layer still computes
// the position's K/V (two small projections) and the gate (one dot product per layer).
// Prints ratios measured in one run; nothing here is a pass/fail test.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "bench_support.h"
#include "eval/cost.h"
#include "model/depth_router.h"
#include "model/generate.h"
#include "model/kv_cache.h"
#include "model/llama.h"
#include "model/threads.h"
#include "pruning/surgery.h"

using namespace coconut;

namespace {

// Gates that close (bias -10) on `skipped` layers and open (+10) elsewhere, whatever the state.
void set_gates(Llama& model, const std::set<int64_t>& skipped) {
  for (int64_t layer = 0; layer < model->config().num_hidden_layers; ++layer) {
    auto& router = model->layers[layer]->as<DecoderLayer>()->router;
    router->weight.zero_();
    router->bias.fill_(skipped.count(layer) ? -10.0 : 10.0);
  }
}

struct Timing {
  double decode_seconds, answer_seconds;
};

// Decode: the prompt is prefilled (untimed) into a fresh cache, then `decode` one-position passes
// (the router decides at its default threshold) and their logits are timed. Answer: a whole
// generate() call, prompt included.
Timing time_model(Llama& model, const std::vector<int64_t>& prompt, int64_t decode, int64_t thoughts, int repeats) {
  const auto prompt_ids = torch::tensor(prompt).view({1, -1});  // [1, P]
  double decode_seconds = 1e300;
  for (int round = 0; round < repeats; ++round) {
    auto cache = KVCache::preallocated(model->config(), 1, static_cast<int64_t>(prompt.size()) + decode, torch::kFloat32, torch::kCPU);
    ForwardOptions every_layer;
    every_layer.depth = DepthPolicy::every_layer();
    model->forward_ids(prompt_ids, &cache, every_layer);
    auto token = torch::tensor({{prompt.back()}});  // [1, 1]
    decode_seconds = std::min(decode_seconds, bench::best_seconds(1, [&] {
      for (int64_t step = 0; step < decode; ++step) {
        const auto hidden = model->forward_ids(token, &cache).hidden;  // [1, 1, D]
        token = model->logits(hidden.select(1, 0)).argmax(-1).view({1, 1});
      }
    }));
  }
  GenerationOptions answer;
  answer.max_new_tokens = 8;
  answer.latent_thoughts = thoughts;
  answer.after_latents = {1};
  return {decode_seconds, bench::best_seconds(repeats, [&] { generate(model, {prompt}, answer); })};
}

}  // namespace

int main(int argc, char** argv) {
  coconut::configure_threads();
  CLI::App app{"bench_router: batch-1 decode and answer latency when the depth router skips layers, against FLOPs"};
  int64_t prompt_length = 256, decode = 32, thoughts = 6;
  int repeats = 3;
  app.add_option("--prompt", prompt_length, "prefill length")->capture_default_str();
  app.add_option("--decode", decode, "decoded tokens")->capture_default_str();
  app.add_option("--thoughts", thoughts, "continuous thoughts of the timed answer")->capture_default_str();
  app.add_option("--repeats", repeats, "timed rounds (best of N per variant)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  torch::NoGradGuard no_grad;

  Llama base(bench::small_bench_config());
  initialize_weights(base, 0.02, 1);
  base->eval();
  auto routed = attach_depth_router(base);
  const auto& config = base->config();
  const int64_t layers = config.num_hidden_layers;
  std::vector<int64_t> prompt(static_cast<size_t>(prompt_length));
  for (int64_t i = 0; i < prompt_length; ++i) prompt[static_cast<size_t>(i)] = (i * 7919) % config.vocab_size;

  fmt::print("model: {} layers, width {}, {} heads / {} KV heads, vocab {}; {} threads; batch 1\n", layers,
             config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.vocab_size,
             torch::get_num_threads());
  fmt::print("prefill {} tokens (every layer); decode {} tokens; answer = prefill + {} thoughts + 8 tokens\n", prompt_length,
             decode, thoughts);
  fmt::print("{:<22} | {:>10} {:>8} {:>8} {:>8} | {:>10} {:>8} {:>8} | {:>10} {:>8}\n", "gates skip", "decode t/s", "speedup",
             "FLOPs", "realised", "answer ms", "speedup", "FLOPs", "static t/s", "speedup");

  // Reference: every gate open. The decode FLOPs of one token at the mean context of the run.
  const int64_t context = prompt_length + decode / 2;
  const auto per_token = [&](const std::set<int64_t>& skipped) {
    double flops = flops_per_token(config, context).total();
    for (int64_t layer : skipped) flops -= skipped_layer_savings(config, context, layer);
    return flops + router_gate_flops(config, layers);
  };
  const auto answer_flops = [&](const std::set<int64_t>& skipped) {
    double flops = generation_flops(config, prompt_length + 1, 8, thoughts).total();
    for (int64_t step = 0; step < thoughts + 7; ++step)  // thoughts, then the decoded tokens fed back
      for (int64_t layer : skipped) flops -= skipped_layer_savings(config, prompt_length + 2 + step, layer);
    return flops;
  };
  set_gates(routed, {});
  const Timing all = time_model(routed, prompt, decode, thoughts, repeats);
  const Timing plain = time_model(base, prompt, decode, thoughts, repeats);
  fmt::print("{:<22} | {:>10.1f} {:>7.2f}x {:>7.2f}x {:>8} | {:>10.2f} {:>7.2f}x {:>7.2f}x | {:>10} {:>8}\n", "none (router on)",
             decode / all.decode_seconds, 1.0, 1.0, "-", 1e3 * all.answer_seconds, 1.0, 1.0, "", "");
  fmt::print("{:<22} | {:>10.1f} {:>7.2f}x {:>8} {:>8} | {:>10.2f} {:>7.2f}x {:>8} | {:>10} {:>8}\n", "no router (plain)",
             decode / plain.decode_seconds, all.decode_seconds / plain.decode_seconds, "", "", 1e3 * plain.answer_seconds,
             all.answer_seconds / plain.answer_seconds, "", "", "");
  for (int64_t k = 2; k < layers; k += 2) {
    std::set<int64_t> skipped;
    for (int64_t layer = 1; layer <= k; ++layer) skipped.insert(layer);  // keep the first and last layers
    set_gates(routed, skipped);
    const Timing timing = time_model(routed, prompt, decode, thoughts, repeats);
    auto pruned = drop_layers(base, skipped);
    const Timing static_timing = time_model(pruned, prompt, decode, thoughts, repeats);
    const double speedup = all.decode_seconds / timing.decode_seconds;
    const double analytic = per_token({}) / per_token(skipped);
    fmt::print("{:<22} | {:>10.1f} {:>7.2f}x {:>7.2f}x {:>7.0f}% | {:>10.2f} {:>7.2f}x {:>7.2f}x | {:>10.1f} {:>7.2f}x\n",
               fmt::format("{} of {} layers", k, layers), decode / timing.decode_seconds, speedup, analytic,
               100 * (speedup - 1) / (analytic - 1), 1e3 * timing.answer_seconds, all.answer_seconds / timing.answer_seconds,
               answer_flops({}) / answer_flops(skipped), decode / static_timing.decode_seconds,
               all.decode_seconds / static_timing.decode_seconds);
  }
  return 0;
}
