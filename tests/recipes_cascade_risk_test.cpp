// The depth cascade's confidence with a statistical guarantee (learn then test): the binomial
// p-value against a naive product, the fixed-sequence choice against its definition on a small
// case, and the guarantee itself, simulated: over many calibration sets drawn from a population
// whose risk at each threshold is known, the chosen threshold's true risk exceeds epsilon in at
// most about delta of them.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "eval/paired_test.h"
#include "recipes/evaluate_model.h"

using coconut::CascadeCalibrationQuestion;

namespace {

// n choose k by the multiplicative formula, in long double.
long double choose(int n, int k) {
  long double value = 1;
  for (int i = 1; i <= k; ++i) value = value * (n - k + i) / i;
  return value;
}

CascadeCalibrationQuestion question(double confidence, bool shallow_correct, bool full_correct) {
  return {{confidence, 1.0}, {10.0, 6.0}, {shallow_correct, full_correct}, full_correct};
}

}  // namespace

TEST(CascadeRisk, BinomialTailEqualsTheNaiveSum) {
  for (int n : {1, 10, 57, 300})
    for (double epsilon : {0.01, 0.1, 0.35})
      for (int losses : {0, 1, 3, n / 2}) {
        if (losses > n) continue;
        long double naive = 0;
        for (int k = 0; k <= losses; ++k)
          naive += choose(n, k) * std::pow(static_cast<long double>(epsilon), k) * std::pow(1.0L - epsilon, n - k);
        EXPECT_NEAR(coconut::binomial_tail_at_most(losses, n, epsilon), static_cast<double>(std::min(naive, 1.0L)), 1e-12)
            << n << " " << epsilon << " " << losses;
      }
  EXPECT_DOUBLE_EQ(coconut::binomial_tail_at_most(0, 10, 0.1), std::pow(0.9, 10));
  EXPECT_DOUBLE_EQ(coconut::binomial_tail_at_most(10, 10, 0.1), 1.0);
}

TEST(CascadeRisk, StopsAtTheFirstThresholdThatFails) {
  // Ten questions the full model answers right; the shallow level answers the two least confident
  // (0.2, 0.3) wrong. Deepening those two costs nothing in risk: thresholds 1 down to 0.3 have no
  // loss, 0.2 one (the 0.3 question stops shallow), 0 two.
  std::vector<CascadeCalibrationQuestion> questions;
  for (double c : {0.2, 0.3}) questions.push_back(question(c, false, true));
  for (double c : {0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99}) questions.push_back(question(c, true, true));
  // epsilon 0.3: zero losses give p = 0.7^10 = 0.028, one loss 0.149, two 0.383.
  auto choice = coconut::choose_cascade_threshold_for_risk(questions, 0.3, 0.1);
  EXPECT_DOUBLE_EQ(choice.threshold, 0.3);  // 0.2 fails (p = 0.149 > 0.1) and ends the sequence
  EXPECT_DOUBLE_EQ(choice.risk, 0.0);
  EXPECT_DOUBLE_EQ(choice.accuracy, 1.0);
  EXPECT_NEAR(choice.p_value, std::pow(0.7, 10), 1e-12);
  // At 0.3 the questions at 0.2 and 0.3 run both levels (16 FLOPs), the others one (10).
  EXPECT_DOUBLE_EQ(choice.mean_flops, (2 * 16.0 + 8 * 10.0) / 10);
  // A looser delta lets one loss through: 0.2 passes, 0 (two losses, p = 0.383) does not.
  choice = coconut::choose_cascade_threshold_for_risk(questions, 0.3, 0.2);
  EXPECT_DOUBLE_EQ(choice.threshold, 0.2);
  EXPECT_DOUBLE_EQ(choice.risk, 0.1);
  // Too few questions for a small epsilon: not even deepening every one passes.
  EXPECT_LT(coconut::choose_cascade_threshold_for_risk(questions, 0.01, 0.1).threshold, 0);
  // A question the full model gets wrong is no loss, whatever the shallow level says: with both
  // such, no threshold loses anything and the sequence runs down to 0.
  questions[0] = question(0.2, false, false);
  questions[1] = question(0.3, false, false);
  EXPECT_DOUBLE_EQ(coconut::choose_cascade_threshold_for_risk(questions, 0.3, 0.1).threshold, 0.0);
  EXPECT_THROW(coconut::choose_cascade_threshold_for_risk(questions, 0, 0.1), std::invalid_argument);
}

// Population: confidence c ~ U(0, 1), the shallow answer wrong with probability 0.2 (1 - c), the
// full model always right. A question stops shallow when c > t, so risk(t) = 0.1 (1 - t)^2.
TEST(CascadeRisk, TheGuaranteeHoldsOverCalibrationSets) {
  const double epsilon = 0.02, delta = 0.1;
  const int trials = 1000, n = 300;
  std::mt19937_64 random(7);
  std::uniform_real_distribution<double> uniform(0, 1);
  int violated = 0;
  double mean_threshold = 0;
  for (int trial = 0; trial < trials; ++trial) {
    std::vector<CascadeCalibrationQuestion> questions;
    for (int i = 0; i < n; ++i) {
      const double c = uniform(random);
      questions.push_back(question(c, uniform(random) >= 0.2 * (1 - c), true));
    }
    const auto choice = coconut::choose_cascade_threshold_for_risk(questions, epsilon, delta);
    ASSERT_GE(choice.threshold, 0);
    const double true_risk = 0.1 * std::pow(1 - choice.threshold, 2);
    violated += true_risk > epsilon ? 1 : 0;
    mean_threshold += choice.threshold / trials;
  }
  // At most delta, with room for the simulation's own noise (3 standard deviations: 0.028).
  EXPECT_LE(violated, static_cast<int>(trials * (delta + 0.028))) << violated << " of " << trials;
  // And useful: the risk-free threshold would be 1; the boundary is 1 - sqrt(0.2) = 0.553.
  EXPECT_LT(mean_threshold, 0.75);
  EXPECT_GT(mean_threshold, 0.553);
}
