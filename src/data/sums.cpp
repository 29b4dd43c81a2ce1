#include "data/sums.h"

#include <random>
#include <stdexcept>
#include <string>

namespace coconut {

std::vector<Example> generate_sums(int count, uint64_t seed, const SumsOptions& options) {
  if (options.digits < 1 || options.modulus < 2 || options.modulus > 100)
    throw std::invalid_argument("generate_sums: digits >= 1 and 2 <= modulus <= 100");
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> digit(0, options.modulus - 1);
  std::vector<Example> examples;
  examples.reserve(static_cast<size_t>(std::max(count, 0)));
  for (int i = 0; i < count; ++i) {
    Example example;
    int sum = 0;
    for (int d = 0; d < options.digits; ++d) {
      const int value = digit(rng);
      example.question += (d == 0 ? "" : " ") + std::to_string(value);
      sum = (sum + value) % options.modulus;
      example.steps.push_back(std::to_string(sum));
    }
    example.answer = std::to_string(sum);
    examples.push_back(std::move(example));
  }
  return examples;
}

}  // namespace coconut
