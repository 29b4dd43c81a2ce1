// Device names as users write them: "cpu", "cuda", "cuda:N", "auto" (CUDA when available).
#pragma once

#include <torch/torch.h>

#include <string>

namespace coconut {

// Whether `name` is spelled as one of those (the machine is not asked).
bool is_device_name(const std::string& name);

// Throws std::invalid_argument naming `where` (a flag or a config key) for a malformed name, for
// CUDA on a machine without it, and for a CUDA index the machine does not have.
torch::Device device_from_name(const std::string& name, const std::string& where);

// A host tensor on `device` without waiting for the device: to a GPU through pinned memory and a
// non-blocking copy (a copy from pageable memory synchronises the stream, so each would stall the
// host behind every kernel queued before it); elsewhere as `host.to(device)`.
torch::Tensor host_to_device(const torch::Tensor& host, torch::Device device);

// The most bytes a CUDA `device`'s caching allocator has handed out since the last reset (what a
// step needed); 0 on other devices and where libtorch was built without CUDA.
void reset_peak_device_memory(torch::Device device);
int64_t peak_device_memory_bytes(torch::Device device);

// Memory bandwidth on `device` in bytes/s, read + written, by the median of five copies of a buffer
// of `bytes` after one warm-up (a GPU: its HBM; a CPU: main memory, for a buffer well past its caches).
double measure_copy_bandwidth(torch::Device device, int64_t bytes);

}  // namespace coconut
