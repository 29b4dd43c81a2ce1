#include "eval/paired_test.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace coconut {

McNemarTest mcnemar_exact(const std::vector<bool>& first, const std::vector<bool>& second) {
  if (first.size() != second.size())
    throw std::invalid_argument("mcnemar_exact: " + std::to_string(first.size()) + " and " + std::to_string(second.size()) +
                                " answers: the same questions are needed");
  McNemarTest test;
  for (size_t i = 0; i < first.size(); ++i) {
    if (first[i] && !second[i]) ++test.only_first;
    if (second[i] && !first[i]) ++test.only_second;
  }
  const int64_t n = test.only_first + test.only_second;
  if (n == 0) return test;
  const int64_t smaller = std::min(test.only_first, test.only_second);
  // log C(n, k) - n log 2, summed with the largest term factored out.
  const auto log_term = [&](int64_t k) {
    return std::lgamma(static_cast<double>(n) + 1) - std::lgamma(static_cast<double>(k) + 1) -
           std::lgamma(static_cast<double>(n - k) + 1) - static_cast<double>(n) * std::log(2.0);
  };
  const double largest = log_term(smaller);  // the terms rise up to k = n / 2 >= smaller
  double sum = 0;
  for (int64_t k = 0; k <= smaller; ++k) sum += std::exp(log_term(k) - largest);
  test.p_value = std::min(1.0, 2 * std::exp(largest) * sum);
  return test;
}

}  // namespace coconut
