// Matrix-vector products of Llama-3.2-1B's shapes: at::linear vs the decode kernel, in GB/s of
// weights read, measured in one run.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <torch/version.h>

#include <chrono>

#include "model/cpu_linear.h"
#include "model/threads.h"

int main(int argc, char** argv) {
  coconut::configure_threads();
  CLI::App app{"bench_linear: decode matrix-vector throughput"};
  int threads = 2, repeats = 20;
  app.add_option("--threads", threads)->capture_default_str();
  app.add_option("--repeats", repeats)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(threads);
  torch::NoGradGuard no_grad;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{2048, 2048}, {512, 2048}, {8192, 2048}, {2048, 8192}, {128256, 2048}};
  fmt::print("{:>16} {:>6} {:>14} {:>14} {:>8}\n", "N x K", "dtype", "at::linear GB/s", "kernel GB/s", "ratio");
  for (auto dtype : {torch::kBFloat16, torch::kFloat16, torch::kFloat32}) {
    for (auto [n, k] : shapes) {
      auto w = torch::randn({n, k}).to(dtype);
      auto x = torch::randn({1, k}).to(dtype);
      auto time = [&](auto&& function) {
        function();
        double best = 1e30;
        for (int i = 0; i < repeats; ++i) {
          const auto start = std::chrono::steady_clock::now();
          function();
          best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        }
        return static_cast<double>(w.numel() * w.element_size()) / best / 1e9;
      };
      // libtorch 1.x has no float16 matrix product on CPU: that row shows the kernel alone.
      const bool torch_has_op = dtype != torch::kFloat16 || TORCH_VERSION_MAJOR >= 2;
      const double torch_rate = torch_has_op ? time([&] { torch::nn::functional::linear(x, w); }) : 0.0;
      const double kernel_rate = time([&] { coconut::dense(x, w); });
      fmt::print("{:>16} {:>6} {:>14.1f} {:>14.1f} {:>7.2f}x\n", fmt::format("{} x {}", n, k), c10::toString(dtype),
                 torch_rate, kernel_rate, torch_has_op ? kernel_rate / torch_rate : 0.0);
    }
  }
  return 0;
}
