// Prefill and decode throughput of the Llama forward for a few shapes, next to the analytic
// bounds of this machine measured in the same run:
//   - FLOP bound: a large matrix product in the model dtype (GFLOP/s),
//   - memory bound for decode: streaming read bandwidth (GB/s) / bytes of weights per token.
// Prints ratios (achieved / bound); nothing here is a pass/fail test. --model runs a real model
// folder (its weights, in each of --dtypes) instead of the random shapes.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <ATen/Parallel.h>

#include <chrono>
#include <string>
#include <vector>

#include "eval/cost.h"
#include "io/hf_checkpoint.h"
#include "io/hf_config.h"
#include "model/cpu_decode.h"
#include "model/generate.h"
#include "model/llama.h"
#include "recipes/evaluate_model.h"
#include "model/quantize_model.h"
#include "model/threads.h"
#include "bench_support.h"
#include "operator_profile.h"
#include "util/allocator.h"

using namespace coconut;

namespace {

// Streaming read bandwidth with every thread, over a 1 GiB buffer (bytes read / second).
double measure_read_bandwidth() {
  const std::vector<float> data(256 * 1024 * 1024, 1.0f);
  const auto bytes = static_cast<int64_t>(data.size() * sizeof(float));
  return static_cast<double>(bytes) / bench::read_seconds(data.data(), bytes, 3);
}

double measure_matmul_flops(torch::ScalarType dtype, torch::Device device) {
  if (device.is_cuda()) return bench::matmul_peak(dtype, device);
  auto a = torch::randn({1024, 2048}).to(dtype), b = torch::randn({2048, 2048}).to(dtype);
  const double seconds = bench::best_seconds(3, [&] { torch::matmul(a, b); });
  return 2.0 * 1024 * 2048 * 2048 / seconds;
}

struct Shape {
  std::string name;
  LlamaConfig config;
  torch::ScalarType dtype;
  WeightFormat weights = WeightFormat::kDense;
};

LlamaConfig make_config(int64_t width, int64_t inner, int64_t layers, int64_t heads, int64_t kv_heads, int64_t vocab,
                        bool tied) {
  LlamaConfig config;
  config.hidden_size = width;
  config.intermediate_size = inner;
  config.num_hidden_layers = layers;
  config.num_attention_heads = heads;
  config.num_key_value_heads = kv_heads;
  config.vocab_size = vocab;
  config.max_position_embeddings = 4096;
  config.tie_word_embeddings = tied;
  config.rope_theta = 500000.0;
  config.validate();
  return config;
}

}  // namespace

int main(int argc, char** argv) {
  coconut::configure_threads();
  coconut::keep_freed_memory();
  CLI::App app{"bench_model: prefill/decode tokens/s against the machine's FLOP and bandwidth bounds"};
  int threads = 2, prompt = 128, decode = 32;
  std::vector<std::string> only;
  app.add_option("--threads", threads, "torch intra-op threads")->capture_default_str();
  app.add_option("--prompt", prompt, "prefill length")->capture_default_str();
  app.add_option("--decode", decode, "decoded tokens")->capture_default_str();
  size_t profile_rows = 0;
  app.add_option("--profile", profile_rows,
                 "after timing each shape, generate once more and print this many operators by self time (prompt and decode)");
  app.add_option("--only", only, "shape names to run (tiny, 50M, llama-3.2-1B)");
  std::string device_name = "cpu";
  app.add_option("--device", device_name, "cpu | cuda | cuda:N")->capture_default_str();
  bool fixed_cache = false;
  app.add_flag("--fixed-cache", fixed_cache,
               "decode with the fixed-shape KV cache (every step the same shapes: the path a CUDA graph replays)");
  bool cuda_graph = false;
  app.add_flag("--cuda-graph", cuda_graph,
               "decode steps replay one captured CUDA graph (implies --fixed-cache; the capture is timed with the decode)");
  bool separate_projections = false;
  app.add_flag("--separate-projections", separate_projections,
               "with --model: q, k, v, gate and up as separate products (undoes pack_for_inference, and so the decode step over memory too; for A/B runs)");
  bool general_decode = false;
  app.add_flag("--general-decode", general_decode,
               "decode on the general forward, not the decode step over memory (model/cpu_decode.h; for A/B runs)");
  std::string model_dir;
  app.add_option("--model", model_dir, "an HF model folder to run instead of the random shapes");
  std::vector<std::string> dtypes = {"float32", "bfloat16"};
  app.add_option("--dtypes", dtypes, "with --model: the dtypes to run it in")->capture_default_str();
  std::vector<std::string> weight_formats = {"dense"};
  app.add_option("--weights", weight_formats, "with --model: dense | q8_0 | q4_0 | q4_1 | gguf (projections quantized, or on the blocks of the GGUF file the folder came from; each dtype with each)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(threads);
  set_cpu_decode_layers(!general_decode);
  torch::NoGradGuard no_grad;
  const torch::Device device(device_name);

  std::vector<Shape> shapes = {
      {"tiny", make_config(64, 172, 5, 8, 4, 512, true), torch::kFloat32},
      {"50M", make_config(512, 1408, 8, 8, 8, 32000, false), torch::kFloat32},
      {"llama-3.2-1B", make_config(2048, 8192, 16, 32, 8, 128256, true), torch::kBFloat16},
  };
  if (!model_dir.empty()) {
    shapes.clear();
    for (const auto& dtype : dtypes)
      for (const auto& format : weight_formats)
        shapes.push_back({model_dir, load_config(model_dir), dtype_from_name(dtype), weight_format_from_name(format)});
  }
  // GPU: bytes read + written by a device copy; CPU: streaming read with every thread.
  const double bandwidth = device.is_cuda() ? bench::device_copy_bandwidth(device) : measure_read_bandwidth();
  fmt::print("machine: {}, {} threads, {} bandwidth {:.1f} GB/s, matmul f32 {:.0f} GFLOP/s, bf16 {:.0f} GFLOP/s\n",
             device.str(), threads, device.is_cuda() ? "copy" : "read", bandwidth / 1e9,
             measure_matmul_flops(torch::kFloat32, device) / 1e9, measure_matmul_flops(torch::kBFloat16, device) / 1e9);
  fmt::print("{:<14} {:>6} {:>7} {:>12} {:>10} {:>12} {:>10} {:>10} {:>10} {:>10}\n", "shape", "dtype", "weights", "prefill t/s", "GFLOP/s",
             "of matmul", "decode t/s", "bound t/s", "of bound", "held MB");
  for (const auto& shape : shapes) {
    if (!only.empty() && std::find(only.begin(), only.end(), shape.name) == only.end()) continue;
    Llama model(shape.config);
    if (model_dir.empty()) {
      initialize_weights(model, 0.02, 1);
      model->to(device, shape.dtype);
      pack_for_inference(model);  // as a loaded model is (load_model_variant)
    } else {
      model = load_model_variant(model_dir, "", shape.dtype, device, {}, shape.weights);
      if (separate_projections)
        for (auto& parameter : model->parameters()) parameter.set_data(parameter.clone());  // each in its own storage
    }
    model->eval();
    std::vector<int64_t> ids(static_cast<size_t>(prompt));
    for (int i = 0; i < prompt; ++i) ids[static_cast<size_t>(i)] = (i * 7919) % shape.config.vocab_size;

    // Prefill: one forward over the prompt plus the logits of its last position.
    auto prompt_tensor = torch::tensor(ids).view({1, -1}).to(device);
    const double prefill_seconds = bench::best_seconds(3, [&] {
      KVCache cache = KVCache::preallocated(shape.config, 1, prompt + decode, attention_dtype(shape.dtype, device), device);
      auto hidden = model->forward_ids(prompt_tensor, &cache).hidden;
      model->logits(hidden.select(1, prompt - 1));
      bench::synchronize(device);
    });
    const double prefill_flops = prefill_flops_total(shape.config, prompt);

    // Decode: generation after the prompt, minus the prefill.
    GenerationOptions options;
    options.max_new_tokens = decode + 1;
    options.fixed_cache = fixed_cache;
    options.cuda_graph = cuda_graph;
    const double generate_seconds = bench::best_seconds(2, [&] {
      generate(model, {ids}, options);
      bench::synchronize(device);
    });
    const double decode_seconds = std::max(generate_seconds - prefill_seconds, 1e-9);
    const double decode_rate = decode / decode_seconds;
    // Every decoded token reads all weights once (the KV cache is small next to them).
    const double bound = bandwidth / static_cast<double>(weight_bytes_per_decoded_token(model));
    const double matmul_peak = measure_matmul_flops(shape.dtype, device);
    // The weights as the model holds them (quantized blocks as held, float tensors in their dtype).
    const double held_megabytes = static_cast<double>(held_weight_bytes(model)) / 1e6;
    fmt::print("{:<14} {:>6} {:>7} {:>12.1f} {:>10.1f} {:>11.0f}% {:>10.2f} {:>10.2f} {:>9.0f}% {:>10.1f}\n", shape.name,
               dtype_name(shape.dtype), weight_format_name(shape.weights), prompt / prefill_seconds, prefill_flops / prefill_seconds / 1e9,
               100.0 * prefill_flops / prefill_seconds / matmul_peak, decode_rate, bound, 100.0 * decode_rate / bound, held_megabytes);
    if (profile_rows > 0) bench::print_operator_profile([&] { generate(model, {ids}, options); }, generate_seconds, profile_rows);
  }
  return 0;
}
