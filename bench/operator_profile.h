#pragma once
// Self time per operator (its own time less that of the operators it called), forward and backward
// functions alike, gathered with libtorch's RecordFunction callbacks (what its profiler reads).
// Time spent outside operators (this project's own kernels called from C++) is the difference
// between the profiled call and the operators' total.

#include <ATen/record_function.h>
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace coconut::bench {

struct OperatorTime {
  double self_seconds = 0;
  int64_t calls = 0;
};
struct OpenOperator {
  std::string name;
  std::chrono::steady_clock::time_point start;
  double children_seconds = 0;
};
inline std::mutex operator_times_mutex;
inline std::map<std::string, OperatorTime> operator_times;
inline thread_local std::vector<OpenOperator> open_operators;

inline std::unique_ptr<at::ObserverContext> operator_started(const at::RecordFunction& function) {
  open_operators.push_back({function.name(), std::chrono::steady_clock::now(), 0.0});
  return nullptr;
}

inline void operator_ended(const at::RecordFunction&, at::ObserverContext*) {
  if (open_operators.empty()) return;
  const auto open = std::move(open_operators.back());
  open_operators.pop_back();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - open.start).count();
  if (!open_operators.empty()) open_operators.back().children_seconds += seconds;
  std::lock_guard<std::mutex> lock(operator_times_mutex);
  auto& time = operator_times[open.name];
  time.self_seconds += seconds - open.children_seconds;
  ++time.calls;
}

// Runs `step` once under the callbacks and prints the operators with the most self time.
inline void print_operator_profile(const std::function<void()>& step, double step_seconds, size_t rows) {
  operator_times.clear();
  const auto handle = at::addGlobalCallback(at::RecordFunctionCallback(operator_started, operator_ended)
                                                .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  const auto start = std::chrono::steady_clock::now();
  step();
  const double profiled = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  at::removeCallback(handle);
  std::vector<std::pair<std::string, OperatorTime>> sorted(operator_times.begin(), operator_times.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.self_seconds > b.second.self_seconds; });
  double total = 0;
  int64_t calls = 0;
  for (const auto& [name, time] : sorted) total += time.self_seconds, calls += time.calls;
  fmt::print("  profiled {:.1f} ms (timed {:.1f}), in operators {:.1f} ms over {} calls; self time:\n", profiled * 1e3,
             step_seconds * 1e3, total * 1e3, calls);
  for (size_t i = 0; i < std::min(rows, sorted.size()); ++i)
    fmt::print("  {:>8.2f} ms {:>5.1f}% {:>6} calls  {}\n", sorted[i].second.self_seconds * 1e3,
               100.0 * sorted[i].second.self_seconds / profiled, sorted[i].second.calls, sorted[i].first);
}

}  // namespace coconut::bench
