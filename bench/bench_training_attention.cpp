// Attention in a float32 training step on the CPU, forward and backward: ours
// (model/cpu_training_attention.h) against libtorch's fused CPU kernel (scaled_dot_product_attention,
// which training took before), with the causal mask the model passes, on the bench models' shapes
// and SmolLM2-135M's. Alternating rounds; prints the medians and their ratio (above 1: ours faster).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "bench_support.h"
#include "model/cpu_training_attention.h"
#include "model/threads.h"

namespace {

struct Shape {
  std::string name;
  int64_t batch, heads, kv_heads, rows, head_dim;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Training attention on the CPU: ours against libtorch's fused kernel"};
  int rounds = 7;
  app.add_option("--rounds", rounds, "alternating rounds (each: 3 calls of each side, the best kept)");
  CLI11_PARSE(app, argc, argv);
  const std::vector<Shape> shapes = {{"1M (16 x 160)", 16, 4, 4, 160, 32},
                                     {"25M (16 x 160)", 16, 8, 8, 160, 64},
                                     {"SmolLM2 (4 x 512)", 4, 9, 3, 512, 64}};
  fmt::print("{} threads; forward + backward of one layer's attention, float32, causal mask as [B, 1, T, T]\n",
             at::get_num_threads());
  fmt::print("{:<20} {:>12} {:>12} {:>8} {:>14}\n", "shape", "ours ms", "libtorch ms", "ratio", "ours forward");
  for (const auto& shape : shapes) {
    torch::manual_seed(1);
    const int64_t t = shape.rows;
    auto q = torch::randn({shape.batch, t, shape.heads, shape.head_dim}).transpose(1, 2).requires_grad_();  // [B, H, T, Dh]
    auto k = torch::randn({shape.batch, t, shape.kv_heads, shape.head_dim}).transpose(1, 2).requires_grad_();
    auto v = torch::randn({shape.batch, t, shape.kv_heads, shape.head_dim}).transpose(1, 2).requires_grad_();
    const auto mask = torch::zeros({t, t})
                          .masked_fill(torch::ones({t, t}, torch::kBool).triu(1), std::numeric_limits<float>::lowest())
                          .expand({shape.batch, t, t})
                          .unsqueeze(1);  // [B, 1, T, S]
    const auto upstream = torch::randn({shape.batch, t, shape.heads, shape.head_dim});
    const double scale = 1.0 / std::sqrt(static_cast<double>(shape.head_dim));
    const auto ours = [&] {
      coconut::cpu_training_attention(q, k, v, mask, true, scale).backward(upstream);
    };
    const auto theirs = [&] {
      at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, scale, /*enable_gqa=*/shape.heads != shape.kv_heads)
          .transpose(1, 2)
          .backward(upstream);
    };
    const auto ours_forward = [&] {
      torch::NoGradGuard no_grad;
      coconut::cpu_training_attention(q, k, v, mask, true, scale);
    };
    std::vector<double> our_times, their_times, forward_times;
    ours(), theirs();
    for (int round = 0; round < rounds; ++round) {
      our_times.push_back(coconut::bench::best_seconds(3, ours));
      their_times.push_back(coconut::bench::best_seconds(3, theirs));
      forward_times.push_back(coconut::bench::best_seconds(3, ours_forward));
    }
    const double mine = median(our_times), libtorch = median(their_times);
    fmt::print("{:<20} {:>12.2f} {:>12.2f} {:>7.2f}x {:>11.2f} ms\n", shape.name, mine * 1e3, libtorch * 1e3, libtorch / mine,
               median(forward_times) * 1e3);
  }
  return 0;
}
