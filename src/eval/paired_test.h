// Exact binomial tests on paired answers: the binomial tail (the cascade's risk guarantee,
// recipes/evaluate_model.h) and McNemar's test (do two ways of answering the same questions differ?).
#pragma once

#include <cstdint>
#include <vector>

namespace coconut {

// P(Binomial(n, p) <= k): e.g. the p-value of "the risk exceeds p" after k losses in n independent
// questions (exact, summed in log space; 1 when k >= n or p >= 1, 0 when p <= 0 and k < n).
double binomial_tail_at_most(int64_t k, int64_t n, double p);

struct McNemarTest {
  int64_t only_first = 0;   // questions only the first answers right
  int64_t only_second = 0;  // questions only the second answers right
  double p_value = 1;       // exact two-sided, under H0 "on a question they disagree on, either is as likely right"
};

// first[i], second[i]: whether each answers question i right. The p-value is
// min(1, 2 P(Binomial(b + c, 1/2) <= min(b, c))) (1 when they never disagree).
// Throws std::invalid_argument when the lists differ in length.
McNemarTest mcnemar_exact(const std::vector<bool>& first, const std::vector<bool>& second);

}  // namespace coconut
