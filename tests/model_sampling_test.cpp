// Sampling (temperature, top-k, top-p) against its definition, on a fixed logit vector: the set of
// tokens that can be drawn exactly, and the frequencies of many draws against the probabilities
// computed here from the definition:
//   temperature T: p(v) = exp(l_v / T) / sum_u exp(l_u / T)
//   top-k: only the k most probable tokens, renormalised
//   top-p (nucleus, after top-k): the smallest set of most probable tokens whose mass reaches p,
//   renormalised.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "model/generate.h"

using namespace coconut;

namespace {

// Probabilities 0.35 .. 0.01, placed at shuffled token ids (so that sorting matters).
const std::vector<double> kBase = {0.35, 0.25, 0.15, 0.10, 0.07, 0.05, 0.02, 0.01};
const std::vector<int64_t> kTokenOf = {5, 2, 7, 0, 3, 6, 1, 4};  // kBase[i] is token kTokenOf[i]

std::vector<double> logits() {
  std::vector<double> l(kBase.size());
  for (size_t i = 0; i < kBase.size(); ++i) l[kTokenOf[i]] = std::log(kBase[i]) + 0.7;  // any offset
  return l;
}

// The distribution by the definitions above, indexed by token id.
std::vector<double> expected_distribution(const SamplingOptions& options) {
  const auto l = logits();
  const size_t vocab = l.size();
  std::vector<double> p(vocab);
  double total = 0;
  for (size_t v = 0; v < vocab; ++v) total += (p[v] = std::exp(l[v] / options.temperature));
  for (auto& value : p) value /= total;
  std::vector<size_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
  size_t kept = options.top_k > 0 ? std::min<size_t>(options.top_k, vocab) : vocab;
  double kept_mass = 0;
  for (size_t i = 0; i < kept; ++i) kept_mass += p[order[i]];
  if (options.top_p < 1.0) {
    double mass = 0;
    for (size_t i = 0; i < kept; ++i) {
      mass += p[order[i]] / kept_mass;
      if (mass >= options.top_p) {
        kept = i + 1;
        break;
      }
    }
  }
  std::vector<double> result(vocab, 0.0);
  double mass = 0;
  for (size_t i = 0; i < kept; ++i) mass += p[order[i]];
  for (size_t i = 0; i < kept; ++i) result[order[i]] = p[order[i]] / mass;
  return result;
}

void expect_draws_follow_the_definition(const SamplingOptions& options, const std::string& name) {
  const auto expected = expected_distribution(options);
  const auto l = logits();
  const int64_t vocab = static_cast<int64_t>(l.size()), rows = 4000, calls = 5;
  const auto row = torch::tensor(l, torch::kFloat64).to(torch::kFloat32).view({1, vocab});
  const auto batch = row.expand({rows, vocab}).contiguous();  // [B, V] the same logits in every row
  std::mt19937_64 rng(options.seed);
  std::vector<int64_t> counts(vocab, 0);
  for (int64_t call = 0; call < calls; ++call)
    for (int64_t token : sample_next_tokens(batch, options, rng)) {
      ASSERT_GE(token, 0);
      ASSERT_LT(token, vocab);
      ++counts[token];
    }
  const double draws = static_cast<double>(rows * calls);
  for (int64_t v = 0; v < vocab; ++v) {
    const double p = expected[v], frequency = static_cast<double>(counts[v]) / draws;
    if (p == 0.0) {
      EXPECT_EQ(counts[v], 0) << name << ": token " << v << " is outside the filtered set";
      continue;
    }
    // 20,000 draws: the frequency's standard deviation is sqrt(p (1 - p) / N) <= 0.0036. Within
    // 5 of them for every token of every case (a false alarm below 1e-5 in all); the draws are
    // seeded, so the outcome is fixed. A temperature applied the wrong way or a set one token off
    // moves some probability by 0.05 or more, over 14 deviations.
    const double sigma = std::sqrt(p * (1 - p) / draws);
    EXPECT_NEAR(frequency, p, 5 * sigma) << name << ": token " << v;
  }
}

}  // namespace

TEST(Sampling, TemperatureOneDrawsTheSoftmax) { expect_draws_follow_the_definition({1.0, 0, 1.0, 11}, "T=1"); }

TEST(Sampling, TemperatureSharpensAndFlattens) {
  expect_draws_follow_the_definition({0.5, 0, 1.0, 12}, "T=0.5");
  expect_draws_follow_the_definition({2.0, 0, 1.0, 13}, "T=2");
}

TEST(Sampling, TopKKeepsTheKMostProbable) {
  expect_draws_follow_the_definition({1.0, 3, 1.0, 14}, "top-k 3");
  // The set itself: exactly the 3 most probable tokens.
  const auto p = expected_distribution({1.0, 3, 1.0, 0});
  for (size_t i = 0; i < kBase.size(); ++i) EXPECT_EQ(p[kTokenOf[i]] > 0, i < 3) << i;
}

TEST(Sampling, TopPKeepsTheSmallestNucleus) {
  // Cumulative masses 0.35, 0.60, 0.75, 0.85: top-p 0.8 keeps 4 tokens, 0.5 keeps 2.
  const auto p = expected_distribution({1.0, 0, 0.8, 0});
  for (size_t i = 0; i < kBase.size(); ++i) EXPECT_EQ(p[kTokenOf[i]] > 0, i < 4) << i;
  expect_draws_follow_the_definition({1.0, 0, 0.8, 15}, "top-p 0.8");
  expect_draws_follow_the_definition({1.0, 0, 0.5, 16}, "top-p 0.5");
  // After temperature and top-k together.
  expect_draws_follow_the_definition({2.0, 5, 0.7, 17}, "T=2 top-k 5 top-p 0.7");
}
