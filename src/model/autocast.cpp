#include "model/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace coconut {

namespace {

void set_autocast(bool enabled, torch::Device device) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  if (enabled) at::autocast::set_autocast_dtype(device.type(), torch::kBFloat16);
  at::autocast::set_autocast_enabled(device.type(), enabled);
#else
  if (device.is_cuda()) {
    if (enabled) at::autocast::set_autocast_gpu_dtype(torch::kBFloat16);
    at::autocast::set_enabled(enabled);
  } else {
    if (enabled) at::autocast::set_autocast_cpu_dtype(torch::kBFloat16);
    at::autocast::set_cpu_enabled(enabled);
  }
#endif
}

}  // namespace

AutocastScope::AutocastScope(bool enabled, torch::Device device) : enabled_(enabled), device_(device) {
  if (!enabled_) return;
  at::autocast::clear_cache();  // casts of weights an optimizer step has changed since must not be reused
  set_autocast(true, device_);
}

AutocastScope::~AutocastScope() {
  if (!enabled_) return;
  set_autocast(false, device_);
  at::autocast::clear_cache();
}

bool autocast_enabled(torch::Device device) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  return at::autocast::is_autocast_enabled(device.type());
#else
  return device.is_cuda() ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

AutocastRestore::AutocastRestore(bool enabled, torch::Device device)
    : enabled_(enabled), previous_(autocast_enabled(device)), device_(device) {
  set_autocast(enabled, device_);
}

AutocastRestore::~AutocastRestore() {
  set_autocast(previous_, device_);
  // Turned on where it was off (a checkpointed layer recomputed in a backward run after the
  // scope): the casts it cached belong to no scope that would clear them.
  if (enabled_ && !previous_) at::autocast::clear_cache();
}

}  // namespace coconut
