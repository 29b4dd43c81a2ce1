#pragma once
// Timing and machine bounds shared by the benchmarks, on CPU or CUDA: every timed region ends
// with a device synchronisation, so GPU times are the kernels' and not the launches'.

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "model/config.h"
#include "model/device.h"
#include "model/x86_intrinsics.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
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

// The sum of [data, data + bytes) as 64-bit words (bytes a multiple of 128), four independent
// 256-bit lanes where the CPU has AVX2 (a plain loop reads far below the memory's rate on one core).
#ifdef COCONUT_X86
__attribute__((target("avx2"))) inline uint64_t sum_words_avx2(const unsigned char* data, int64_t bytes) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (int64_t i = 0; i < bytes; i += 128) {
    a = _mm256_add_epi64(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i)));
    b = _mm256_add_epi64(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i + 32)));
    c = _mm256_add_epi64(c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i + 64)));
    d = _mm256_add_epi64(d, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i + 96)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif
inline uint64_t sum_words(const unsigned char* data, int64_t bytes) {
#ifdef COCONUT_X86
  if (has_avx2_fma()) return sum_words_avx2(data, bytes);
#endif
  uint64_t lanes[4] = {};
  for (int64_t i = 0; i < bytes; i += 32)
    for (int lane = 0; lane < 4; ++lane) {
      uint64_t word;
      std::memcpy(&word, data + i + 8 * lane, 8);
      lanes[lane] += word;
    }
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

// Seconds (best of `repeats`, no warm-up) to read [data, data + bytes) once with every thread, each
// summing its share of 4 KiB blocks (sum_words): where the bytes are far larger than the caches,
// their memory's read rate (bytes / seconds). A partial last block is not read.
inline double read_seconds(const void* data, int64_t bytes, int repeats) {
  const auto* base = static_cast<const unsigned char*>(data);
  std::vector<uint64_t> sinks(64, 0);
  return best_seconds(repeats, [&] {
    at::parallel_for(0, bytes / 4096, 16, [&](int64_t begin, int64_t end) {
      // keeps the loop from being optimised away
      sinks[static_cast<size_t>(begin) % sinks.size()] += sum_words(base + begin * 4096, (end - begin) * 4096);
    });
  });
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
