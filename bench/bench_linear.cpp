// Decode-time products, measured in one run:
//   1. matrix-vector products of Llama-3.2-1B's shapes: at::linear vs the decode kernel, in GB/s of
//      weights read;
//   2. several rows at once (continuous batching, 1-16 rows; prefill, 64-1,024): at::linear vs the
//      kernel's register tiles, in microseconds, for the shipped 1.6M models' shapes and
//      Llama-3.2-1B's;
//   3. decode attention on a KV-cache view: torch::matmul vs cpu_attention's kernels;
//   4. Q8_0 matrix-vector products of SmolLM2-135M's shapes (model/quantized_linear.h) against the
//      bf16 decode kernel, weights read from memory, in GB/s and microseconds, and their sum over
//      one decoded token of that model;
//   5. the measured choice between the tiles and BLAS for float32 products (forward, input and
//      weight gradients; model/cpu_product_choice.h): the quick check's choice against a longer
//      measurement of both paths, and what the choice costs against the faster path ("regret").
//      `--choice-only` runs this section alone;
//   6. one decoded token of SmolLM2-135M in float32 as its products alone, in the model's order
//      (30 layers of 7 products, then the tied head: 538 MB), against the same weights with q|k|v
//      and gate|up each one matrix (4 products a layer), in GB/s. `--token-only` runs it alone.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <functional>

#include "model/cpu_attention.h"
#include "model/cpu_linear.h"
#include "model/quantized_linear.h"
#include "model/threads.h"
#include "bench_support.h"
#include "util/allocator.h"

namespace {

// Section 6. Every product reads its weights from memory (538 MB, twice this host's 260 MB L3).
int decode_token_products(int repeats, int threads) {
  struct Layer {
    std::vector<torch::Tensor> separate, fused;  // q, k, v, o, gate, up, down; q|k|v, o, gate|up, down
  };
  std::vector<Layer> layers(30);
  const int64_t width = 576, inner = 1536;
  for (auto& layer : layers) {
    const auto qkv = torch::randn({576 + 192 + 192, width}) * 0.05, gate_up = torch::randn({2 * inner, width}) * 0.05;
    const auto o = torch::randn({width, width}) * 0.05, down = torch::randn({width, inner}) * 0.05;
    layer.separate = {qkv.narrow(0, 0, 576).clone(), qkv.narrow(0, 576, 192).clone(), qkv.narrow(0, 768, 192).clone(), o.clone(),
                      gate_up.narrow(0, 0, inner).clone(), gate_up.narrow(0, inner, inner).clone(), down.clone()};
    layer.fused = {qkv, o, gate_up, down};
  }
  const auto head = torch::randn({49152, width}) * 0.05;
  const auto x = torch::randn({1, 1, width}), activation = torch::randn({1, 1, inner});
  const double bytes = (30.0 * (2 * 576 + 2 * 192 + 3 * inner) * width + 49152.0 * width) * 4;
  const auto token = [&](bool fused) {
    for (const auto& layer : layers) {
      if (fused) {
        coconut::dense(x, layer.fused[0]), coconut::dense(x, layer.fused[1]);
        coconut::dense(x, layer.fused[2]), coconut::dense(activation, layer.fused[3]);
      } else {
        for (int i = 0; i < 6; ++i) coconut::dense(x, layer.separate[i]);
        coconut::dense(activation, layer.separate[6]);
      }
    }
    coconut::dense(x, head);
  };
  fmt::print("\nSmolLM2-135M's decoded token as its products, float32, {} threads: GB/s of weights ({:.0f} MB), {} alternating rounds\n",
             threads, bytes / 1e6, repeats);
  std::vector<double> separate, fused;
  for (int round = 0; round < repeats; ++round) {
    separate.push_back(bytes / coconut::bench::best_seconds(1, [&] { token(false); }) / 1e9);
    fused.push_back(bytes / coconut::bench::best_seconds(1, [&] { token(true); }) / 1e9);
  }
  std::sort(separate.begin(), separate.end()), std::sort(fused.begin(), fused.end());
  fmt::print("  7 products a layer: median {:.1f} GB/s ({:.1f}-{:.1f}); q|k|v and gate|up fused: {:.1f} ({:.1f}-{:.1f})\n",
             separate[separate.size() / 2], separate.front(), separate.back(), fused[fused.size() / 2], fused.front(), fused.back());
  return 0;
}

// Section 5. Each product's quick check (a fresh in-memory choice, as a program's first product of
// that size makes it) against the best of `repeats` alternating runs of each path.
int measured_choice(int repeats) {
  coconut::configure_product_choices({coconut::ProductPolicy::kMeasure, ""});
  fmt::print("\nfloat32 products, tiles or BLAS: the quick check at first use against {} alternating runs of each path\n",
             repeats);
  fmt::print("{:>16} {:>20} {:>9} {:>9} {:>7} {:>9} {:>9} {:>7} {:>7}\n", "product", "rows x K x N", "quick t", "quick b",
             "choice", "long t", "long b", "faster", "regret");
  // The bench models' shapes (1M: width 128, MLP 512; 25M: 512 and 2,048) and SmolLM2's MLP.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{128, 128}, {128, 512}, {512, 128}, {512, 512},
                                                          {512, 2048}, {2048, 512}, {576, 1536}, {1536, 576}};
  int agree = 0, total = 0;
  double worst_regret = 1, chosen_sum = 0, best_sum = 0;
  for (auto kind : {coconut::ProductKind::kForward, coconut::ProductKind::kInputGradient, coconut::ProductKind::kWeightGradient}) {
    for (int64_t rows : {16, 64, 256, 1024}) {
      for (auto [k, n] : shapes) {
        const auto path = coconut::float32_product_path(kind, rows, k, n);
        const auto choices = coconut::product_choices();
        const auto key = coconut::product_choice_key(kind, rows, k, n);
        const auto found = std::find_if(choices.begin(), choices.end(), [&](const auto& choice) { return choice.key == key; });
        if (found == choices.end()) continue;  // no tiles for this product on this CPU
        const bool forward = kind == coconut::ProductKind::kForward;
        const auto a = torch::randn({rows, forward ? k : n});
        const auto b = kind == coconut::ProductKind::kWeightGradient ? torch::randn({rows, k}) : torch::randn({n, k});
        double tiles = 1e30, blas = 1e30;
        for (int round = 0; round < repeats; ++round) {
          tiles = std::min(tiles, coconut::bench::best_seconds(1, [&] { coconut::float32_product(kind, coconut::ProductPath::kTiles, a, b); }));
          blas = std::min(blas, coconut::bench::best_seconds(1, [&] { coconut::float32_product(kind, coconut::ProductPath::kBlas, a, b); }));
        }
        const auto faster = tiles <= blas ? coconut::ProductPath::kTiles : coconut::ProductPath::kBlas;
        const double chosen = path == coconut::ProductPath::kTiles ? tiles : blas;
        const double regret = chosen / std::min(tiles, blas);
        agree += path == faster;
        ++total;
        worst_regret = std::max(worst_regret, regret);
        chosen_sum += chosen;
        best_sum += std::min(tiles, blas);
        fmt::print("{:>16} {:>20} {:>9.1f} {:>9.1f} {:>7} {:>9.1f} {:>9.1f} {:>7} {:>6.2f}x\n", coconut::product_kind_name(kind),
                   fmt::format("{} x {} x {}", rows, k, n), found->tiles_seconds * 1e6, found->blas_seconds * 1e6,
                   coconut::product_path_name(path), tiles * 1e6, blas * 1e6, coconut::product_path_name(faster), regret);
      }
    }
  }
  fmt::print("times in microseconds. The quick choice agreed with the long measurement on {} of {} products; worst regret "
             "{:.2f}x; all products together {:.3f}x the faster paths' time\n",
             agree, total, worst_regret, best_sum > 0 ? chosen_sum / best_sum : 1.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  coconut::configure_threads();
  coconut::keep_freed_memory();
  CLI::App app{"bench_linear: decode matrix-vector throughput"};
  int threads = 2, repeats = 20;
  bool choice_only = false;
  app.add_option("--threads", threads)->capture_default_str();
  app.add_option("--repeats", repeats)->capture_default_str();
  app.add_flag("--choice-only", choice_only, "only section 5: the measured choice between the tiles and BLAS");
  bool token_only = false;
  app.add_flag("--token-only", token_only, "only section 6: a decoded token's products, separate and fused");
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(threads);
  torch::NoGradGuard no_grad;
  if (choice_only) return measured_choice(repeats);
  if (token_only) return decode_token_products(repeats, threads);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{2048, 2048}, {512, 2048}, {8192, 2048}, {2048, 8192}, {128256, 2048}};
  fmt::print("{:>16} {:>6} {:>14} {:>14} {:>8}\n", "N x K", "dtype", "at::linear GB/s", "kernel GB/s", "ratio");
  for (auto dtype : {torch::kBFloat16, torch::kFloat16, torch::kFloat32}) {
    for (auto [n, k] : shapes) {
      auto w = torch::randn({n, k}).to(dtype);
      auto x = torch::randn({1, k}).to(dtype);
      auto time = [&](const std::function<void()>& function) {
        function();  // warm-up
        return static_cast<double>(w.numel() * w.element_size()) / coconut::bench::best_seconds(repeats, function) / 1e9;
      };
      // libtorch 1.x has no float16 matrix product on CPU: that row shows the kernel alone.
      const bool torch_has_op = dtype != torch::kFloat16 || TORCH_VERSION_MAJOR >= 2;
      const double torch_rate = torch_has_op ? time([&] { torch::nn::functional::linear(x, w); }) : 0.0;
      const double kernel_rate = time([&] { coconut::dense(x, w); });
      fmt::print("{:>16} {:>6} {:>14.1f} {:>14.1f} {:>7.2f}x\n", fmt::format("{} x {}", n, k), c10::toString(dtype),
                 torch_rate, kernel_rate, torch_has_op ? kernel_rate / torch_rate : 0.0);
    }
  }

  // Best time of `repeats` runs after a warm-up, in microseconds.
  const auto microseconds = [&](const std::function<void()>& function) {
    function();
    return coconut::bench::best_seconds(repeats, function) * 1e6;
  };
  fmt::print("\n{:>22} {:>6} {:>14} {:>14} {:>8}\n", "rows x N x K", "dtype", "at::linear us", "kernel us", "ratio");
  const std::vector<std::pair<int64_t, int64_t>> batch_shapes = {{128, 128}, {512, 128}, {128, 512}, {2048, 2048}, {8192, 2048}};
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (auto [n, k] : batch_shapes) {
      auto w = torch::randn({n, k}).to(dtype);
      for (int64_t rows : {int64_t{1}, int64_t{4}, coconut::kDecodeKernelRowBlock, int64_t{64}, int64_t{256}, int64_t{1024}}) {
        auto x = torch::randn({rows, k}).to(dtype);
        const double torch_us = microseconds([&] { torch::nn::functional::linear(x, w); });
        const double kernel_us = microseconds([&] { coconut::dense(x, w); });
        fmt::print("{:>22} {:>6} {:>14.1f} {:>14.1f} {:>7.2f}x\n", fmt::format("{} x {} x {}", rows, n, k),
                   c10::toString(dtype), torch_us, kernel_us, torch_us / kernel_us);
      }
    }
  }

  // One decode step's attention for 16 rows: keys and values are a prefix of a preallocated cache.
  // The shipped models have 4 KV heads of 32 and one query head each; Llama-3.2-1B 8 of 64, and 4
  // query heads per KV head (stacked as query rows).
  fmt::print("\n{:>34} {:>14} {:>14} {:>8}\n", "rows x KV heads x queries x keys x Dh", "matmul us", "kernel us", "ratio");
  struct Heads {
    int64_t groups, head_dim, per_group;
  };
  for (auto [groups, head_dim, per_group] : std::vector<Heads>{{4, 32, 1}, {8, 64, 4}}) {
    for (int64_t keys : {150, 1000}) {
      const int64_t rows = 16;
      auto cache_k = torch::randn({rows, groups, keys + 64, head_dim}), cache_v = torch::randn({rows, groups, keys + 64, head_dim});
      auto k = cache_k.narrow(2, 0, keys), v = cache_v.narrow(2, 0, keys);  // [B, G, S, Dh] views
      auto q = torch::randn({rows, groups, per_group, head_dim});
      const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
      const double torch_us = microseconds([&] {
        auto p = torch::softmax(torch::matmul(q, k.transpose(2, 3)) * scale, -1);
        torch::matmul(p, v);
      });
      const double kernel_us = microseconds([&] {
        auto p = torch::softmax(coconut::attention_scores(q, k, scale), -1);
        coconut::attention_context(p, v);
      });
      fmt::print("{:>34} {:>14.1f} {:>14.1f} {:>7.2f}x\n",
                 fmt::format("{} x {} x {} x {} x {}", rows, groups, per_group, keys, head_dim),
                 torch_us, kernel_us, torch_us / kernel_us);
    }
  }

  // SmolLM2-135M: 30 layers of q/o [576, 576], k/v [192, 576], gate/up [1536, 576], down [576, 1536],
  // and the tied head [49152, 576]. Each product reads its weights from memory, as in decode: the
  // calls cycle through copies that add up to twice the last-level cache.
  fmt::print("\n{:>16} {:>6} {:>12} {:>12} {:>12} {:>12} {:>8}\n", "N x K", "calls", "bf16 GB/s", "q8_0 GB/s", "bf16 us",
             "q8_0 us", "ratio");
  struct Projection {
    int64_t n, k, calls;
  };
  double token_bf16_us = 0, token_q8_us = 0;
  for (auto [n, k, calls] : std::vector<Projection>{{576, 576, 60}, {192, 576, 60}, {1536, 576, 60}, {576, 1536, 30}, {49152, 576, 1}}) {
    const int64_t copies = std::max<int64_t>(2, 2 * coconut::last_level_cache_bytes() / (n * k) + 1);
    std::vector<torch::Tensor> dense_weights;
    std::vector<coconut::QuantizedWeight> quantized;
    for (int64_t copy = 0; copy < copies; ++copy) {
      auto w = torch::randn({n, k}) * 0.05;
      dense_weights.push_back(w.to(torch::kBFloat16));
      quantized.push_back(coconut::quantize_q8_0(w));
    }
    auto x = torch::randn({1, k}).to(torch::kBFloat16);
    size_t next_dense = 0, next_quantized = 0;
    const double bf16_us = microseconds([&] { coconut::dense(x, dense_weights[next_dense++ % dense_weights.size()]); });
    const double q8_us = microseconds([&] { coconut::quantized_dense(x, quantized[next_quantized++ % quantized.size()]); });
    token_bf16_us += calls * bf16_us;
    token_q8_us += calls * q8_us;
    fmt::print("{:>16} {:>6} {:>12.1f} {:>12.1f} {:>12.1f} {:>12.1f} {:>7.2f}x\n", fmt::format("{} x {}", n, k), calls,
               static_cast<double>(n * k * 2) / bf16_us / 1e3, static_cast<double>(quantized[0].packed.numel()) / q8_us / 1e3,
               bf16_us, q8_us, bf16_us / q8_us);
  }
  fmt::print("{:>16} {:>6} {:>12} {:>12} {:>12.0f} {:>12.0f} {:>7.2f}x\n", "one token", "", "", "", token_bf16_us, token_q8_us,
             token_bf16_us / token_q8_us);
  measured_choice(repeats);
  return decode_token_products(repeats, threads);
}
