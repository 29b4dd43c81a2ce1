#include "model/threads.h"

#include <ATen/Parallel.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

namespace coconut {

int available_cores() {
  int cpus = 0;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cpus = CPU_COUNT(&set);
  if (cpus <= 0) cpus = static_cast<int>(std::thread::hardware_concurrency());
  return cpus;
}

int busy_cores_elsewhere(const char* loadavg_path) {
  int fewest = -1;
  for (int reading = 0; reading < 10; ++reading) {
    if (reading > 0) std::this_thread::sleep_for(std::chrono::microseconds(500));
    std::ifstream file(loadavg_path);
    double one, five, fifteen;
    int running = 0;
    char slash = 0;
    if (!(file >> one >> five >> fifteen >> running >> slash) || slash != '/' || running < 1) return 0;
    fewest = fewest < 0 ? running : std::min(fewest, running);
  }
  return std::max(0, fewest - 1);  // this thread is one of them
}

int64_t last_level_cache_bytes() {
  // sysfs describes the cache this CPU shares (sysconf can report the whole package's, e.g. 384
  // MiB on an EPYC whose cores share 32 MiB each): the highest level's size, such as "32768K".
  int64_t bytes = 0, highest = 0;
  for (int index = 0; index < 8; ++index) {
    const std::string base = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_file(base + "level"), size_file(base + "size");
    int64_t level = 0;
    std::string size;
    if (!(level_file >> level) || !(size_file >> size) || size.empty() || level <= highest) continue;
    const char unit = size.back();
    const int64_t scale = unit == 'K' ? 1 << 10 : unit == 'M' ? 1 << 20 : unit == 'G' ? 1 << 30 : 1;
    try {
      bytes = std::stoll(size) * scale;
      highest = level;
    } catch (const std::exception&) {
    }
  }
  return bytes > 0 ? bytes : int64_t{32} << 20;
}

int wide_pass_threads() {
  if (std::getenv("OMP_NUM_THREADS") != nullptr) return 0;
  return std::max(1, available_cores() - busy_cores_elsewhere());
}

int configure_threads(int reserved_cores) {
  if (const char* value = std::getenv("OMP_NUM_THREADS"); value && std::atoi(value) > 0) return at::get_num_threads();
  int cpus = available_cores();
  if (cpus > 0) cpus = std::max(1, cpus - std::max(0, reserved_cores) - busy_cores_elsewhere());
  if (cpus > 0 && cpus != at::get_num_threads()) at::set_num_threads(cpus);
  return at::get_num_threads();
}

}  // namespace coconut
