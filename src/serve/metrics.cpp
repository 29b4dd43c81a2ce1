#include "serve/metrics.h"

#include <fmt/core.h>

#include <algorithm>

namespace coconut::serve {
namespace {

constexpr double kTokenRateWindowSeconds = 10;

const std::vector<double> kLatencyBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), counts_(upper_bounds_.size(), 0) {}

void Histogram::observe(double value) {
  const auto bucket = std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin();
  if (bucket < static_cast<std::ptrdiff_t>(counts_.size())) ++counts_[static_cast<size_t>(bucket)];
  sum_ += value;
  ++count_;
}

std::string Histogram::prometheus_lines(const std::string& name) const {
  std::string text;
  int64_t cumulative = 0;
  for (size_t i = 0; i < upper_bounds_.size(); ++i) {
    cumulative += counts_[i];
    text += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, upper_bounds_[i], cumulative);
  }
  text += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
  return text;
}

Metrics::Metrics() : time_to_first_token_(kLatencyBuckets), request_seconds_(kLatencyBuckets) {}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++requests_[{endpoint, status}];
}

void Metrics::observe_time_to_first_token(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  time_to_first_token_.observe(seconds);
}

void Metrics::observe_request_seconds(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  request_seconds_.observe(seconds);
}

void Metrics::count_completion_tokens(int64_t tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  recent_tokens_.emplace_back(std::chrono::steady_clock::now(), tokens);
}

std::string Metrics::prometheus_text(const SchedulerStats& scheduler, const GateStats& gate) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  while (!recent_tokens_.empty() &&
         std::chrono::duration<double>(now - recent_tokens_.front().first).count() > kTokenRateWindowSeconds)
    recent_tokens_.pop_front();
  int64_t recent = 0;
  for (const auto& entry : recent_tokens_) recent += entry.second;

  std::string text;
  text += "# HELP coconut_requests_total HTTP requests by endpoint and status (499: the client left first).\n";
  text += "# TYPE coconut_requests_total counter\n";
  for (const auto& [key, count] : requests_)
    text += fmt::format("coconut_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, count);
  const auto counter = [&](const char* name, const char* help, int64_t value) {
    text += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, value);
  };
  const auto gauge = [&](const char* name, const char* help, double value) {
    text += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, value);
  };
  counter("coconut_accepted_requests_total", "Completion requests taken into the queue.", scheduler.accepted);
  counter("coconut_prompt_tokens_total", "Prompt tokens prefilled.", scheduler.prompt_tokens);
  counter("coconut_generated_tokens_total", "Tokens generated.", scheduler.generated_tokens);
  counter("coconut_latent_thoughts_total", "Continuous thoughts run.", scheduler.latent_thoughts);
  counter("coconut_batch_steps_total", "Batched one-position passes.", scheduler.steps);
  counter("coconut_batch_step_rows_total", "Rows taking part in those passes, summed.", scheduler.step_rows);
  gauge("coconut_tokens_per_second", "Completion tokens per second over the last 10 s.",
        static_cast<double>(recent) / kTokenRateWindowSeconds);
  gauge("coconut_queue_depth", "Requests waiting for a slot.", static_cast<double>(scheduler.queued));
  gauge("coconut_queued_positions", "Positions the queued requests may need (prompt + thoughts + max_tokens).",
        static_cast<double>(scheduler.queued_tokens));
  gauge("coconut_positions_per_second", "Recent rate of prompt chunks and step rows, the basis of admission.",
        scheduler.positions_per_second);
  gauge("coconut_running_requests", "Requests holding a slot.", static_cast<double>(scheduler.running));
  gauge("coconut_batch_occupancy", "Slots in use / slots.",
        static_cast<double>(scheduler.running) / static_cast<double>(std::max<int64_t>(1, scheduler.max_batch)));
  gauge("coconut_mean_batch_rows", "Rows per batched pass since start.",
        scheduler.steps ? static_cast<double>(scheduler.step_rows) / static_cast<double>(scheduler.steps) : 0.0);
  gauge("coconut_open_connections", "Connections open (waiting for a request or being answered).", static_cast<double>(gate.open));
  gauge("coconut_waiting_connections", "Connections waiting for a whole request (no thread held).", static_cast<double>(gate.waiting));
  counter("coconut_connections_timed_out_total", "Connections closed at a deadline (first byte or whole request).",
          gate.timed_out);
  counter("coconut_connections_refused_total", "503s from the gate: too many connections or requests waiting.", gate.refused);
  counter("coconut_requests_rejected_by_gate_total", "Malformed (400) or oversized (413, 431) requests.", gate.rejected);
  text += "# HELP coconut_time_to_first_token_seconds From request arrival to its first token.\n";
  text += "# TYPE coconut_time_to_first_token_seconds histogram\n";
  text += time_to_first_token_.prometheus_lines("coconut_time_to_first_token_seconds");
  text += "# HELP coconut_request_seconds From request arrival to its last byte.\n";
  text += "# TYPE coconut_request_seconds histogram\n";
  text += request_seconds_.prometheus_lines("coconut_request_seconds");
  return text;
}

}  // namespace coconut::serve
