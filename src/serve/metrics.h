// What GET /metrics reports, in Prometheus' text format: requests by endpoint and status, tokens
// (counters and a tokens/s gauge over the last 10 s), queue depth, batch occupancy, and latency
// histograms of time to first token and of the whole request, and the connection gate's counts.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "serve/connection_gate.h"
#include "serve/scheduler.h"

namespace coconut::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // The metric's lines: NAME_bucket{le=...}, NAME_sum, NAME_count.
  std::string prometheus_lines(const std::string& name) const;

 private:
  std::vector<double> upper_bounds_;
  std::vector<int64_t> counts_;  // per bucket (not cumulative)
  double sum_ = 0;
  int64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  // Status 499: the client went away before its answer was complete.
  void count_request(const std::string& endpoint, int status);
  void observe_time_to_first_token(double seconds);
  void observe_request_seconds(double seconds);
  void count_completion_tokens(int64_t tokens);
  std::string prometheus_text(const SchedulerStats& scheduler, const GateStats& gate);

 private:
  std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  Histogram time_to_first_token_, request_seconds_;
  std::deque<std::pair<std::chrono::steady_clock::time_point, int64_t>> recent_tokens_;  // the last 10 s
};

}  // namespace coconut::serve
