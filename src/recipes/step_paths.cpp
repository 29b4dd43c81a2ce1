#include "recipes/step_paths.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace coconut {

std::string StepPaths::name() const {
  std::string name;
  for (const auto& [on, part] : {std::pair{cut_last_layer, "cut"}, std::pair{frozen_base_bf16, "bf16-base"},
                                 std::pair{chunked_head_loss, "chunked-loss"}})
    if (on) name += (name.empty() ? "" : "+") + std::string(part);
  return name.empty() ? "old" : name;
}

PathComparison::PathComparison(std::vector<StepPaths> arms, int64_t rounds)
    : arms_(std::move(arms)),
      rounds_(rounds),
      seconds_(arms_.size(), 0.0),
      tokens_(arms_.size(), 0),
      steps_(arms_.size(), 0),
      peak_bytes_(arms_.size(), 0) {
  if (arms_.empty() || rounds_ < 1) throw std::invalid_argument("PathComparison: needs arms and at least one round");
}

void PathComparison::finished_step(double seconds, int64_t tokens, int64_t peak_bytes) {
  const size_t arm = static_cast<size_t>(step_) % arms_.size();
  if (step_ >= static_cast<int64_t>(arms_.size())) {  // the first round warms up
    seconds_[arm] += seconds;
    tokens_[arm] += tokens;
    ++steps_[arm];
    peak_bytes_[arm] = std::max(peak_bytes_[arm], peak_bytes);
  }
  ++step_;
}

nlohmann::json PathComparison::report() const {
  nlohmann::json arms = nlohmann::json::array();
  const auto rate = [&](size_t i) { return seconds_[i] > 0 ? static_cast<double>(tokens_[i]) / seconds_[i] : 0.0; };
  for (size_t i = 0; i < arms_.size(); ++i)
    arms.push_back({{"paths", arms_[i].name()}, {"steps", steps_[i]}, {"tokens_per_second", rate(i)},
                    {"ratio", rate(0) > 0 ? rate(i) / rate(0) : 0.0},
                    {"peak_gib", static_cast<double>(peak_bytes_[i]) / (1024.0 * 1024.0 * 1024.0)}});
  return {{"event", "path_comparison"}, {"arms", arms}};
}

std::string PathComparison::summary() const {
  const auto record = report();
  std::string line = "paths compared, " + std::to_string(rounds_) + " steps each:";
  for (const auto& arm : record["arms"]) {
    char part[128];
    std::snprintf(part, sizeof part, " %s %.0f tok/s (%.3fx)", arm["paths"].get<std::string>().c_str(),
                  arm["tokens_per_second"].get<double>(), arm["ratio"].get<double>());
    line += part;
    if (arm["peak_gib"].get<double>() > 0) {
      std::snprintf(part, sizeof part, " peak %.1f GiB", arm["peak_gib"].get<double>());
      line += part;
    }
  }
  return line;
}

std::vector<StepPaths> comparison_arms(bool lora_bf16, bool chunked_loss) {
  std::vector<StepPaths> arms = {StepPaths{}};
  StepPaths all;
  const auto add = [&](bool StepPaths::*path) {
    StepPaths alone;
    alone.*path = true;
    all.*path = true;
    arms.push_back(alone);
  };
  add(&StepPaths::cut_last_layer);
  if (lora_bf16) add(&StepPaths::frozen_base_bf16);
  if (chunked_loss) add(&StepPaths::chunked_head_loss);
  if (arms.size() > 2) arms.push_back(all);
  return arms;
}

}  // namespace coconut
