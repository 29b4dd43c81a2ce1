#include "model/threads.h"

#include <ATen/Parallel.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

namespace coconut {

int available_cores() {
  int cpus = 0;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cpus = CPU_COUNT(&set);
  if (cpus <= 0) cpus = static_cast<int>(std::thread::hardware_concurrency());
  return cpus;
}

int wide_pass_threads() { return std::getenv("OMP_NUM_THREADS") != nullptr ? 0 : available_cores(); }

int configure_threads(int reserved_cores) {
  if (const char* value = std::getenv("OMP_NUM_THREADS"); value && std::atoi(value) > 0) return at::get_num_threads();
  int cpus = available_cores();
  if (cpus > 0) cpus = std::max(1, cpus - std::max(0, reserved_cores));
  if (cpus > 0 && cpus != at::get_num_threads()) at::set_num_threads(cpus);
  return at::get_num_threads();
}

}  // namespace coconut
