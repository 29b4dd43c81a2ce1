#pragma once
// Timing and machine bounds shared by the benchmarks, on CPU or CUDA: every timed region ends
// with a device synchronisation, so GPU times are the kernels' and not the launches'.

#include <torch/torch.h>

#include "model/config.h"
#include "model/device.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace coconut::bench {

inline void synchronize(torch::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
}

// Median of `repeats` timed calls after one warm-up (seconds).
inline double median_seconds(torch::Device device, int repeats, const std::function<void()>& function) {
  function();
  synchronize(device);
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    function();
    synchronize(device);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// The matrix-product peak in `dtype` on `device` (FLOP/s): 1024x2048x2048 on a CPU, 8192^3 on a
// GPU (large enough to reach the tensor cores' plateau).
inline double matmul_peak(torch::ScalarType dtype, torch::Device device) {
  const int64_t m = device.is_cuda() ? 8192 : 1024, k = device.is_cuda() ? 8192 : 2048, n = k;
  const auto options = torch::TensorOptions().dtype(dtype).device(device);
  auto a = torch::randn({m, k}, options), b = torch::randn({k, n}, options);
  const double seconds = median_seconds(device, device.is_cuda() ? 10 : 3, [&] { torch::matmul(a, b); });
  return 2.0 * static_cast<double>(m * k * n) / seconds;
}

// GPU memory bandwidth (bytes/s), read + written by a 1 GiB device-to-device copy.
inline double device_copy_bandwidth(torch::Device device) { return measure_copy_bandwidth(device, int64_t{1} << 30); }

// Best (smallest) of `repeats` timed calls, no warm-up (seconds); the caller synchronises a GPU.
inline double best_seconds(int repeats, const std::function<void()>& function) {
  double best = 1e300;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    function();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

// The 27.8M-parameter Llama of bench_prune and bench_router: width 512, 8 layers, 8 heads / 4 KV
// heads, MLP 1408, vocab 8192, tied embeddings.
inline LlamaConfig small_bench_config() {
  LlamaConfig config;
  config.hidden_size = 512;
  config.intermediate_size = 1408;
  config.num_hidden_layers = 8;
  config.num_attention_heads = 8;
  config.num_key_value_heads = 4;
  config.vocab_size = 8192;
  config.max_position_embeddings = 4096;
  config.rope_theta = 500000.0;
  config.tie_word_embeddings = true;
  config.validate();
  return config;
}

}  // namespace coconut::bench
