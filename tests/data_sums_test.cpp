// The demo's running-sum task: every step is the previous sum plus the next digit, mod m, checked
// by recomputing from the question's words; seeded; bad options rejected.
#include <gtest/gtest.h>

#include <sstream>

#include "data/sums.h"

using namespace coconut;

TEST(Sums, StepsAreRunningSumsOfTheQuestionDigits) {
  const auto examples = generate_sums(200, 5, {6, 7});
  ASSERT_EQ(examples.size(), 200u);
  for (const auto& example : examples) {
    std::istringstream words(example.question);
    std::vector<int> digits;
    for (int value; words >> value;) digits.push_back(value);
    ASSERT_EQ(digits.size(), 6u) << example.question;
    ASSERT_EQ(example.steps.size(), 6u);
    int sum = 0;
    for (size_t i = 0; i < digits.size(); ++i) {
      EXPECT_GE(digits[i], 0);
      EXPECT_LT(digits[i], 7);
      sum = (sum + digits[i]) % 7;
      EXPECT_EQ(example.steps[i], std::to_string(sum)) << example.question;
    }
    EXPECT_EQ(example.answer, std::to_string(sum));
  }
}

TEST(Sums, SeededAndVaried) {
  const auto a = generate_sums(50, 1), b = generate_sums(50, 1), c = generate_sums(50, 2);
  int same_as_other_seed = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].question, b[i].question);
    same_as_other_seed += a[i].question == c[i].question;
  }
  EXPECT_LT(same_as_other_seed, 2);
  EXPECT_THROW(generate_sums(1, 0, {0, 10}), std::invalid_argument);
  EXPECT_THROW(generate_sums(1, 0, {4, 1}), std::invalid_argument);
}
