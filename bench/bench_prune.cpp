// Does structural pruning show up on the clock? Prefill and decode tokens/s and the latency of a
// Coconut-style answer (prompt, continuous thoughts, a few decoded tokens) for pruned variants of
// one model, next to the analytic FLOPs ratio of the same work. "Realised" is the fraction of the
// analytic gain that the clock shows: (measured speedup - 1) / (analytic speedup - 1).
// Prints ratios measured in one run; nothing here is a pass/fail test.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <chrono>
#include <string>
#include <vector>

#include "bench_support.h"
#include "eval/cost.h"
#include "model/generate.h"
#include "model/llama.h"
#include "model/threads.h"
#include "pruning/surgery.h"

using namespace coconut;

namespace {

struct Timing {
  double prefill_seconds, decode_seconds, answer_seconds;
};

Timing time_model(Llama& model, int64_t prompt, int64_t decode, int64_t thoughts, int repeats) {
  std::vector<int64_t> ids(static_cast<size_t>(prompt));
  for (int64_t i = 0; i < prompt; ++i) ids[static_cast<size_t>(i)] = (i * 7919) % model->config().vocab_size;
  auto prompt_tensor = torch::tensor(ids).view({1, -1});
  Timing timing{};
  timing.prefill_seconds = bench::best_seconds(repeats, [&] {
    KVCache cache = KVCache::growing(model->config());
    auto hidden = model->forward_ids(prompt_tensor, &cache).hidden;
    model->logits(hidden.select(1, prompt - 1));
  });
  GenerationOptions options;
  options.max_new_tokens = decode + 1;
  const double generate_seconds = bench::best_seconds(repeats, [&] { generate(model, {ids}, options); });
  timing.decode_seconds = std::max(generate_seconds - timing.prefill_seconds, 1e-9);
  GenerationOptions answer;
  answer.max_new_tokens = 8;
  answer.latent_thoughts = thoughts;
  answer.after_latents = {1};
  timing.answer_seconds = bench::best_seconds(repeats, [&] { generate(model, {ids}, answer); });
  return timing;
}

}  // namespace

int main(int argc, char** argv) {
  coconut::configure_threads();
  CLI::App app{"bench_prune: pruned vs unpruned prefill/decode tokens/s and answer latency against analytic FLOPs"};
  int64_t prompt = 256, decode = 32, thoughts = 6;
  int repeats = 3;
  app.add_option("--prompt", prompt, "prefill length")->capture_default_str();
  app.add_option("--decode", decode, "decoded tokens")->capture_default_str();
  app.add_option("--thoughts", thoughts, "continuous thoughts of the timed answer")->capture_default_str();
  app.add_option("--repeats", repeats, "timed rounds (best of N per variant)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  torch::NoGradGuard no_grad;

  Llama base(bench::small_bench_config());
  initialize_weights(base, 0.02, 1);
  base->eval();
  const auto& config = base->config();
  HeadSelection half_query_heads, half_groups, half_groups_half_layers;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    half_query_heads[l] = {1, 3, 5, 7};  // one of the two query heads of every KV group
    half_groups[l] = {4, 5, 6, 7};       // KV groups 2 and 3 with their query heads
    if (l % 2 == 1) half_groups_half_layers[l] = {4, 5, 6, 7};
  }
  struct Variant {
    std::string name;
    Llama model;
  };
  std::vector<Variant> variants = {
      {"unpruned", base},
      {"-2 layers", drop_layers(base, {5, 6})},
      {"-4 layers", drop_layers(base, {3, 4, 5, 6})},
      {"-50% q heads", drop_heads(base, half_query_heads)},
      {"-50% kv groups", drop_heads(base, half_groups)},
      {"-50% groups, odd layers", drop_heads(base, half_groups_half_layers)},
  };
  fmt::print("model: {} layers, width {}, {} heads / {} KV heads, vocab {}, {:.1f}M parameters; {} threads\n",
             config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
             config.vocab_size, count_parameters(config).total / 1e6, torch::get_num_threads());
  fmt::print("prefill {} tokens; decode {} tokens; answer = prefill + {} thoughts + 8 tokens\n", prompt, decode, thoughts);
  fmt::print("{:<24} {:>8} | {:>11} {:>8} {:>8} {:>8} | {:>10} {:>8} {:>8} {:>8} | {:>10} {:>8} {:>8} {:>8}\n", "variant",
             "params", "prefill t/s", "speedup", "FLOPs", "realised", "decode t/s", "speedup", "FLOPs", "realised",
             "answer ms", "speedup", "FLOPs", "realised");
  // Rounds interleave the variants (each round times every variant once, after a warm-up round),
  // so drifting machine load hits all of them alike; each variant keeps its best time.
  std::vector<Timing> best(variants.size(), Timing{1e300, 1e300, 1e300});
  for (int round = 0; round <= repeats; ++round) {
    for (size_t v = 0; v < variants.size(); ++v) {
      const auto timing = time_model(variants[v].model, prompt, decode, thoughts, 1);
      if (round == 0) continue;  // warm-up
      best[v].prefill_seconds = std::min(best[v].prefill_seconds, timing.prefill_seconds);
      best[v].decode_seconds = std::min(best[v].decode_seconds, timing.decode_seconds);
      best[v].answer_seconds = std::min(best[v].answer_seconds, timing.answer_seconds);
    }
  }
  Timing reference{};
  double reference_prefill = 0, reference_decode = 0, reference_answer = 0;
  for (size_t v = 0; v < variants.size(); ++v) {
    auto& variant = variants[v];
    const auto& c = variant.model->config();
    const auto timing = best[v];
    const double prefill_flops = prefill_flops_total(c, prompt);
    const double decode_flops = generation_flops(c, prompt, decode + 1).total() - prefill_flops;
    const double answer_flops = generation_flops(c, prompt, 8, thoughts).total();
    if (variant.name == "unpruned") {
      reference = timing;
      reference_prefill = prefill_flops;
      reference_decode = decode_flops;
      reference_answer = answer_flops;
    }
    auto realised = [](double measured, double analytic) {
      return analytic > 1.0 + 1e-9 ? fmt::format("{:.0f}%", 100.0 * (measured - 1.0) / (analytic - 1.0)) : std::string("-");
    };
    const double s_prefill = reference.prefill_seconds / timing.prefill_seconds, a_prefill = reference_prefill / prefill_flops;
    const double s_decode = reference.decode_seconds / timing.decode_seconds, a_decode = reference_decode / decode_flops;
    const double s_answer = reference.answer_seconds / timing.answer_seconds, a_answer = reference_answer / answer_flops;
    fmt::print("{:<24} {:>7.1f}M | {:>11.0f} {:>7.2f}x {:>7.2f}x {:>8} | {:>10.1f} {:>7.2f}x {:>7.2f}x {:>8} | {:>10.1f} {:>7.2f}x {:>7.2f}x {:>8}\n",
               variant.name, count_parameters(c).total / 1e6, prompt / timing.prefill_seconds, s_prefill, a_prefill,
               realised(s_prefill, a_prefill), decode / timing.decode_seconds, s_decode, a_decode,
               realised(s_decode, a_decode), 1e3 * timing.answer_seconds, s_answer, a_answer, realised(s_answer, a_answer));
  }
  return 0;
}
