#include "reasoning/thought_control.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <stdexcept>

namespace coconut {

namespace {

constexpr std::pair<ThoughtControl, const char*> kNames[] = {
    {ThoughtControl::kNone, "none"},       {ThoughtControl::kZero, "zero"}, {ThoughtControl::kNoise, "noise"},
    {ThoughtControl::kShuffle, "shuffle"}, {ThoughtControl::kMean, "mean"}, {ThoughtControl::kToken, "token"}};

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

ThoughtControl thought_control_from_name(const std::string& name) {
  std::string known;
  for (const auto& [control, control_name] : kNames) {
    if (name == control_name) return control;
    known += known.empty() ? control_name : std::string(", ") + control_name;
  }
  throw std::invalid_argument("unknown thought control '" + name + "' (known: " + known + ")");
}

const char* thought_control_name(ThoughtControl control) {
  for (const auto& [known, name] : kNames)
    if (known == control) return name;
  return "?";
}

torch::Tensor noise_like_thought(const torch::Tensor& input, uint64_t seed, size_t question, int64_t thought) {
  TORCH_CHECK(input.dim() == 1, "noise_like_thought: one thought [D] at a time, got ", input.sizes());
  const double rms = input.to(torch::kFloat64).square().mean().sqrt().item<double>();
  std::mt19937_64 rng(splitmix64(seed ^ splitmix64(static_cast<uint64_t>(question) ^ splitmix64(static_cast<uint64_t>(thought)))));
  std::normal_distribution<double> normal;
  std::vector<double> noise(static_cast<size_t>(input.size(0)));
  double squares = 0;
  for (double& value : noise) {
    value = normal(rng);
    squares += value * value;
  }
  const double noise_rms = std::sqrt(squares / static_cast<double>(noise.size()));
  const double scale = noise_rms > 0 ? rms / noise_rms : 0.0;
  return (torch::tensor(noise, torch::kFloat64) * scale).to(input.options());
}

std::vector<size_t> thought_donors(const std::vector<int64_t>& thought_counts, uint64_t seed) {
  std::map<int64_t, std::vector<size_t>> groups;  // thought count -> its questions, in order
  for (size_t i = 0; i < thought_counts.size(); ++i) groups[thought_counts[i]].push_back(i);
  std::vector<size_t> donors(thought_counts.size());
  for (const auto& [count, members] : groups) {
    std::vector<size_t> cycle(members.size());
    for (size_t i = 0; i < cycle.size(); ++i) cycle[i] = i;
    std::mt19937_64 rng(splitmix64(seed ^ splitmix64(static_cast<uint64_t>(count))));
    for (size_t i = cycle.size(); i-- > 1;) {  // Sattolo: j < i, so the result is one cycle
      const size_t j = std::uniform_int_distribution<size_t>(0, i - 1)(rng);
      std::swap(cycle[i], cycle[j]);
    }
    for (size_t i = 0; i < members.size(); ++i) donors[members[i]] = members[cycle[i]];
  }
  return donors;
}

torch::Tensor mean_of_thoughts(const std::vector<torch::Tensor>& recorded) {
  torch::Tensor sum, count;  // [n, D] float64, [n]
  for (const auto& thoughts : recorded) {
    if (!thoughts.defined() || thoughts.size(0) == 0) continue;
    TORCH_CHECK(thoughts.dim() == 2, "mean_of_thoughts: each question's thoughts are [n, D], got ", thoughts.sizes());
    const auto values = thoughts.to(torch::kFloat64).cpu();
    if (!sum.defined()) {
      sum = torch::zeros({0, values.size(1)}, values.options());
      count = torch::zeros({0}, values.options());
    }
    TORCH_CHECK(values.size(1) == sum.size(1), "mean_of_thoughts: thoughts of widths ", values.size(1), " and ", sum.size(1));
    if (values.size(0) > sum.size(0)) {  // more thoughts than any question so far: grow the rows
      const int64_t extra = values.size(0) - sum.size(0);
      sum = torch::cat({sum, torch::zeros({extra, sum.size(1)}, sum.options())});
      count = torch::cat({count, torch::zeros({extra}, count.options())});
    }
    sum.narrow(0, 0, values.size(0)).add_(values);
    count.narrow(0, 0, values.size(0)).add_(1);
  }
  if (!sum.defined()) throw std::invalid_argument("mean thought: no question of the calibration set has a thought");
  return (sum / count.unsqueeze(1)).to(torch::kFloat32);
}

}  // namespace coconut
