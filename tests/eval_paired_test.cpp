// McNemar's exact test against binomial sums computed by hand and by Python's exact integers.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "eval/paired_test.h"

using coconut::mcnemar_exact;

TEST(McNemar, ExactPValuesAreTheBinomialSums) {
  const auto test = [](int64_t only_first, int64_t only_second, int64_t both) {
    std::vector<bool> first, second;
    for (int64_t i = 0; i < only_first; ++i) first.push_back(true), second.push_back(false);
    for (int64_t i = 0; i < only_second; ++i) first.push_back(false), second.push_back(true);
    for (int64_t i = 0; i < both; ++i) first.push_back(true), second.push_back(true);
    return mcnemar_exact(first, second);
  };
  const auto one_nine = test(1, 9, 5);
  EXPECT_EQ(one_nine.only_first, 1);
  EXPECT_EQ(one_nine.only_second, 9);
  EXPECT_NEAR(one_nine.p_value, 22.0 / 1024.0, 1e-12);       // 2 (C(10,0) + C(10,1)) / 2^10
  EXPECT_NEAR(test(0, 6, 0).p_value, 2.0 / 64.0, 1e-12);    // 2 / 2^6
  EXPECT_EQ(test(5, 5, 3).p_value, 1.0);                    // capped at 1
  EXPECT_EQ(test(0, 0, 7).p_value, 1.0);                    // never disagree
  EXPECT_NEAR(test(80, 120, 0).p_value, 0.0056851559967503055, 1e-12);   // Python's math.comb, exactly summed
  EXPECT_NEAR(test(1050, 950, 0).p_value, 0.026824146240280695, 1e-10);
  EXPECT_THROW(mcnemar_exact({true}, {true, false}), std::invalid_argument);
}
