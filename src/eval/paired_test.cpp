#include "eval/paired_test.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace coconut {

double binomial_tail_at_most(int64_t k, int64_t n, double p) {
  if (n <= 0 || k >= n || p <= 0 || p >= 1) return k >= n || p >= 1 ? 1.0 : 0.0;
  const double log_p = std::log(p), log_q = std::log1p(-p);
  double sum = 0;
  for (int64_t i = 0; i <= k; ++i)
    sum += std::exp(std::lgamma(n + 1.0) - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0) + i * log_p + (n - i) * log_q);
  return std::min(1.0, sum);
}

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
  test.p_value = std::min(1.0, 2 * binomial_tail_at_most(std::min(test.only_first, test.only_second), n, 0.5));
  return test;
}

}  // namespace coconut
