#include "model/device.h"

#if __has_include(<c10/cuda/CUDACachingAllocator.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#define COCONUT_CUDA_MEMORY_STATS 1
#endif

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <vector>

namespace coconut {

bool is_device_name(const std::string& name) {
  return name == "auto" || name == "cpu" || name == "cuda" ||
         (name.rfind("cuda:", 0) == 0 && name.size() > 5 && name.size() < 9 &&
          name.find_first_not_of("0123456789", 5) == std::string::npos);
}

void reset_peak_device_memory(torch::Device device) {
#ifdef COCONUT_CUDA_MEMORY_STATS
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index() < 0 ? 0 : device.index());
#else
  (void)device;
#endif
}

int64_t peak_device_memory_bytes(torch::Device device) {
#ifdef COCONUT_CUDA_MEMORY_STATS
  if (device.is_cuda())  // allocated_bytes[0]: all pools
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index()).allocated_bytes[0].peak;
#else
  (void)device;
#endif
  return 0;
}

torch::Tensor host_to_device(const torch::Tensor& host, torch::Device device) {
  if (!device.is_cuda() || !host.device().is_cpu()) return host.to(device);
  // pin_memory copies into libtorch's caching host allocator, which keeps the block until the copy
  // that reads it has run on the stream.
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

torch::Device device_from_name(const std::string& name, const std::string& where) {
  if (!is_device_name(name)) throw std::invalid_argument(where + ": '" + name + "' is not one of cpu, cuda, cuda:N, auto");
  if (name == "auto") return torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  if (name == "cpu") return torch::Device(torch::kCPU);
  const auto count = static_cast<int64_t>(torch::cuda::device_count());
  if (count == 0) throw std::invalid_argument(where + ": '" + name + "' asked for, but this machine has no CUDA device");
  const torch::Device device(name);
  if (device.has_index() && device.index() >= count)
    throw std::invalid_argument(where + ": '" + name + "', but this machine has " + std::to_string(count) +
                                " CUDA device(s)");
  return device;
}

double measure_copy_bandwidth(torch::Device device, int64_t bytes) {
  const int64_t elements = std::max<int64_t>(1, bytes / 4);
  auto source = torch::ones({elements}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  auto target = torch::empty_like(source);
  const auto synchronize = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index() < 0 ? 0 : device.index());
  };
  target.copy_(source);  // warm-up: pages touched, kernels loaded
  synchronize();
  std::vector<double> seconds;
  for (int i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    target.copy_(source);
    synchronize();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return 2.0 * static_cast<double>(elements) * 4.0 / seconds[seconds.size() / 2];
}

}  // namespace coconut
