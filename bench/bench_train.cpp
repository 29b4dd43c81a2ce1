// Training step cost: a Coconut step with k continuous thoughts against a chain-of-thought step on
// sequences of the same length and the same model (the target: ratio <= 1.3; the floor is
// one pass, since k thoughts add k one-column calls to one teacher-forced pass), plus training
// tokens/s and achieved GFLOP/s against the matrix-product peak measured in the same run.
// Prints ratios measured here; nothing is pass/fail.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <ATen/Parallel.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "data/sequences.h"
#include "eval/cost.h"
#include "model/adamw.h"
#include "model/cpu_product_choice.h"
#include "model/device.h"
#include "model/llama.h"
#include "reasoning/training_loss.h"
#include "model/threads.h"
#include "operator_profile.h"
#include "model/autocast.h"
#include "bench_support.h"
#include "util/allocator.h"

using namespace coconut;

namespace {

LlamaConfig make_config(int64_t width, int64_t inner, int64_t layers, int64_t heads, int64_t kv_heads, int64_t vocab) {
  LlamaConfig config;
  config.hidden_size = width;
  config.intermediate_size = inner;
  config.num_hidden_layers = layers;
  config.num_attention_heads = heads;
  config.num_key_value_heads = kv_heads;
  config.vocab_size = vocab;
  config.max_position_embeddings = 8192;
  config.rope_theta = 500000.0;
  config.tie_word_embeddings = true;
  config.eos_token_ids = {3};
  config.validate();
  return config;
}

// B rows of `length` tokens: a question of `question` tokens (no loss), then (Coconut) <bot>,
// k thoughts, <eot>, then labelled tokens up to `length`.
Batch make_batch(int64_t batch, int64_t length, int64_t question, int64_t thoughts, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> token(8, vocab - 1);
  std::vector<Sequence> rows;
  for (int64_t row = 0; row < batch; ++row) {
    Sequence sequence;
    for (int64_t i = 0; i < question; ++i) {
      sequence.ids.push_back(token(rng));
      sequence.labels.push_back(kIgnoreLabel);
    }
    if (thoughts > 0) {
      sequence.ids.push_back(4);  // <bot>
      sequence.labels.push_back(kIgnoreLabel);
      sequence.first_latent = static_cast<int64_t>(sequence.ids.size());
      sequence.latent_count = thoughts;
      for (int64_t i = 0; i < thoughts; ++i) {
        sequence.ids.push_back(6);
        sequence.labels.push_back(kIgnoreLabel);
      }
      sequence.ids.push_back(5);  // <eot>
      sequence.labels.push_back(kIgnoreLabel);
    }
    while (static_cast<int64_t>(sequence.ids.size()) < length) {
      sequence.ids.push_back(token(rng));
      sequence.labels.push_back(sequence.ids.back());
    }
    rows.push_back(std::move(sequence));
  }
  return collate(rows, 0);
}

// The step under each float32 product policy (COCONUT_CPU_KERNELS's values), a step of each in
// turn for `rounds` rounds after one warm-up step each, so that the host's drift falls on all of
// them alike: each policy's median, and the median of its per-round ratio to the first policy.
// The measured policy reads (or fills) the cache the environment names. Restores the environment's
// settings after.
void print_policies_alternated(const std::vector<std::string>& policies, int rounds, const std::function<void()>& step) {
  const auto base = coconut::product_choice_settings_from_environment();
  std::vector<coconut::ProductChoiceSettings> settings;
  for (const auto& name : policies) {  // measure, tiles or blas (checked when parsed)
    auto policy = base;
    policy.policy = name == "measure" ? coconut::ProductPolicy::kMeasure
                    : name == "tiles" ? coconut::ProductPolicy::kTiles
                                      : coconut::ProductPolicy::kBlas;
    settings.push_back(policy);
  }
  std::vector<std::vector<double>> seconds(policies.size()), ratios(policies.size());
  for (size_t p = 0; p < policies.size(); ++p) {
    coconut::configure_product_choices(settings[p]);
    step();
  }
  for (int round = 0; round < rounds; ++round)
    for (size_t p = 0; p < policies.size(); ++p) {
      coconut::configure_product_choices(settings[p]);
      const auto start = std::chrono::steady_clock::now();
      step();
      seconds[p].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      ratios[p].push_back(seconds[p].back() / seconds[0].back());
    }
  coconut::configure_product_choices(base);
  const auto median = [](std::vector<double> values) {
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
  };
  std::string line = fmt::format("  alternated {} rounds:", rounds);
  for (size_t p = 0; p < policies.size(); ++p)
    line += fmt::format(" {} {:.1f} ms ({:.3f}x {})", policies[p], median(seconds[p]) * 1e3, median(ratios[p]), policies[0]);
  fmt::print("{}\n", line);
}

// One training step as `coconut train` takes it: the loss (under bf16 autocast where asked),
// backward, AdamW. Returns the labelled tokens the loss counted.
int64_t train_step(Llama& model, torch::optim::AdamW& optimizer, const Batch& data, torch::Device device, bool bf16,
                   const ForwardOptions& options) {
  optimizer.zero_grad();
  torch::Tensor loss;
  int64_t labelled = 0;
  {
    AutocastScope autocast(bf16, device);
    auto step = training_loss(model, data, device, false, options);
    labelled = step.labelled;
    loss = step.loss;
  }
  loss.backward();
  coconut::adamw_step(optimizer);
  return labelled;
}

struct Shape {
  std::string name;
  LlamaConfig config;
};

std::vector<Shape> bench_shapes() {
  return {{"1M", make_config(128, 512, 4, 4, 4, 160)},
          {"25M", make_config(512, 1536, 8, 8, 8, 160)},
          {"llama-3.2-1B", make_config(2048, 8192, 16, 32, 8, 128256)}};
}

// The step of each thought count (0: CoT) of one bench model, two steps per request read on stdin,
// the second's time printed: another process (eager PyTorch) takes its turn between two of ours, so that
// both sides' times come from the same minutes of a host whose speed drifts.
int run_lockstep(const std::vector<std::string>& only, const std::vector<int64_t>& latents, int64_t batch, int64_t length,
                 int64_t question, torch::Device device, bool bf16) {
  const auto shapes = bench_shapes();
  const auto shape =
      only.size() != 1 ? shapes.end() : std::find_if(shapes.begin(), shapes.end(), [&](const Shape& s) { return s.name == only[0]; });
  if (shape == shapes.end()) {
    fmt::print(stderr, "bench_train: --lockstep takes one shape (--only)\n");
    return 2;
  }
  const LlamaConfig& config = shape->config;
  Llama model(config);
  initialize_weights(model, 0.02, 1);
  model->to(device);
  model->train();
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-4));
  std::map<int64_t, Batch> batches = {{0, make_batch(batch, length, question, 0, config.vocab_size, 11)}};
  for (int64_t thoughts : latents) batches.emplace(thoughts, make_batch(batch, length, question, thoughts, config.vocab_size, 11));
  fmt::print("ready\n");
  std::fflush(stdout);
  for (std::string line; std::getline(std::cin, line);) {
    const auto found = batches.find(std::stoll(line));
    if (found == batches.end()) {
      fmt::print(stderr, "bench_train: no batch for {} thoughts (--latents)\n", line);
      return 2;
    }
    // Untimed first: the timed step starts from the caches and heap a step leaves, as in training.
    train_step(model, optimizer, found->second, device, bf16, ForwardOptions{});
    const auto start = std::chrono::steady_clock::now();
    train_step(model, optimizer, found->second, device, bf16, ForwardOptions{});
    fmt::print("{:.3f}\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 1e3);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  coconut::configure_threads();
  coconut::keep_freed_memory();  // as `coconut train` runs
  CLI::App app{"Coconut vs CoT training step"};
  int64_t batch = 16, length = 160, question = 105, repeats = 5;
  std::vector<int64_t> latents = {3, 6};
  std::vector<std::string> only;
  std::string device_name = "cpu";
  bool bf16 = false;
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--length", length, "tokens per row (same for every mode)")->capture_default_str();
  app.add_option("--question", question, "question tokens (no loss)")->capture_default_str();
  app.add_option("--latents", latents, "thought counts to compare")->capture_default_str();
  app.add_option("--repeats", repeats)->capture_default_str();
  app.add_option("--only", only, "shapes to run: 1M, 25M, llama-3.2-1B (default: 1M and 25M)");
  app.add_option("--device", device_name, "cpu | cuda | cuda:N")->capture_default_str();
  app.add_flag("--bf16", bf16, "bfloat16 autocast (float32 master weights), as `train` with bf16: true");
  bool checkpointing = false;
  app.add_flag("--activation-checkpointing", checkpointing,
               "also time the CoT step with activation checkpointing, and the activations each keeps after forward");
  std::vector<std::string> policies;
  app.add_option("--policies", policies,
                 "CPU: also time each step under these float32 product policies (measure, tiles, blas), alternating them "
                 "a step at a time in this process, and print each one's median and its ratio to the first")
      ->check(CLI::IsMember({"measure", "tiles", "blas"}));
  bool lockstep = false;
  app.add_flag("--lockstep", lockstep,
               "for one shape (--only): print `ready`, then for each line read on stdin (a thought count: 0 for CoT, or one "
               "of --latents) run two steps and print the second's milliseconds (bench/train_vs_eager.sh alternates "
               "processes so)");
  size_t profile_rows = 0;
  app.add_option("--profile", profile_rows, "after timing each step, run it once more and print this many operators by self time");
  CLI11_PARSE(app, argc, argv);
  if (only.empty()) only = {"1M", "25M"};
  const torch::Device device(device_name);
  if (lockstep) return run_lockstep(only, latents, batch, length, question, device, bf16);

  const double peak = bench::matmul_peak(bf16 ? torch::kBFloat16 : torch::kFloat32, device);
  fmt::print("device {}, {} threads, {} matmul peak {:.0f} GFLOP/s; batch {} x {} tokens, question {} tokens\n",
             device.str(), at::get_num_threads(), bf16 ? "bf16" : "f32", peak / 1e9, batch, length, question);
  const std::vector<Shape> shapes = bench_shapes();
  fmt::print("{:<13} {:<12} {:>9} {:>10} {:>9} {:>9} {:>11}\n", "model", "step", "ms", "tokens/s", "GFLOP/s",
             "of peak", "vs CoT");
  for (const auto& shape : shapes) {
    if (std::find(only.begin(), only.end(), shape.name) == only.end()) continue;
    Llama model(shape.config);
    initialize_weights(model, 0.02, 1);
    model->to(device);
    model->train();
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-4));
    double cot_seconds = 0;
    // (thought count, activation checkpointing): CoT, [CoT checkpointed,] then each Coconut count.
    std::vector<std::pair<int64_t, bool>> steps = {{0, false}};
    if (checkpointing) steps.push_back({0, true});
    for (int64_t thoughts : latents) steps.push_back({thoughts, false});
    for (const auto& [thoughts, checkpointed] : steps) {
      const Batch data = make_batch(batch, length, question, thoughts, shape.config.vocab_size, 11);
      ForwardOptions forward_options;
      forward_options.checkpoint_layers = checkpointed;
      int64_t labelled = 0;
      reset_peak_device_memory(device);
      const auto run_step = [&] { labelled = train_step(model, optimizer, data, device, bf16, forward_options); };
      const double seconds = bench::median_seconds(device, static_cast<int>(repeats), run_step);
      // What the forward leaves for backward (CPU: glibc's heap in use before and after it).
      std::string kept = "";
      if (device.is_cuda()) {
        // Beside it, the accounting's estimate for this step (the forward runs fused attention).
        TrainingMemoryOptions plan;
        plan.batch = batch;
        plan.tokens = length;
        plan.labelled_tokens = labelled / batch;
        plan.activation_checkpointing = checkpointed;
        plan.latent_thoughts = thoughts;
        plan.first_latent = question + 1;  // after the question and <bot>
        const double estimate = static_cast<double>(training_memory(shape.config, plan).total()) / (1024.0 * 1024.0 * 1024.0);
        kept = fmt::format("  peak {:.2f} GiB allocated (accounting {:.2f} GiB)", static_cast<double>(peak_device_memory_bytes(device)) / (1024.0 * 1024.0 * 1024.0), estimate);
      }
      if (checkpointing && device.is_cpu()) {
        const auto heap = [] { return static_cast<double>(mallinfo2().uordblks + mallinfo2().hblkhd); };
        optimizer.zero_grad();
        AutocastScope autocast(bf16, device);
        const double before = heap();
        auto step = training_loss(model, data, device, false, forward_options);
        kept = fmt::format("  {:.1f} MB kept for backward", (heap() - before) / 1e6);
      }
      // Training FLOPs: forward (projections, attention, MLP over every column; the head only on
      // labelled tokens) x 3 for forward + backward, less what the last layer leaves out before
      // the first column whose output the loss reads (the question's; every column keeps its K/V):
      // the FLOPs the step needs, not those of a pass that computes every output.
      const LlamaConfig& config = shape.config;
      const auto forward = prefill_flops(config, length, false);
      const double head = 2.0 * static_cast<double>(config.hidden_size * config.vocab_size);
      const int64_t last = config.num_hidden_layers - 1, cut = thoughts > 0 ? question : question - 1;
      const double key_values = 4.0 * static_cast<double>(config.hidden_size * config.kv_heads(last) * config.head_dim);
      const double left_out =
          cuts_last_layer(device) ? layers_prefill_flops(config, cut, last, last + 1).total() - key_values * static_cast<double>(cut) : 0.0;
      const double flops =
          3.0 * (static_cast<double>(batch) * (forward.total() - forward.head - left_out) + head * static_cast<double>(labelled));
      if (thoughts == 0 && !checkpointed) cot_seconds = seconds;
      const std::string name = thoughts > 0 ? fmt::format("Coconut k={}", thoughts) : checkpointed ? "CoT ckpt" : "CoT";
      fmt::print("{:<13} {:<12} {:>9.1f} {:>10.0f} {:>9.1f} {:>8.0f}% {:>11.2f}{}\n", shape.name, name, seconds * 1e3,
                 static_cast<double>(batch * length) / seconds, flops / seconds / 1e9, 100.0 * flops / seconds / peak,
                 seconds / cot_seconds, kept);
      if (profile_rows > 0) bench::print_operator_profile(run_step, seconds, profile_rows);
      if (!policies.empty() && device.is_cpu()) print_policies_alternated(policies, static_cast<int>(repeats), run_step);
    }
  }
  return 0;
}
