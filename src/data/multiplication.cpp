// The multiplication task of the stepwise-internalisation release, regenerated from operands.
#include <random>
#include <stdexcept>

#include "data/example.h"

namespace coconut {

namespace {

using Digits = std::vector<int>;  // least-significant digit first

// a * b_digit * 10^shift, written with exactly `width` digits.
Digits partial_product(const Digits& a, int b_digit, int shift, size_t width) {
  Digits out(width, 0);
  int carry = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const int value = a[i] * b_digit + carry;
    out[i + static_cast<size_t>(shift)] = value % 10;
    carry = value / 10;
  }
  for (size_t i = a.size() + static_cast<size_t>(shift); carry > 0; ++i) {
    if (i >= width) throw std::logic_error("partial product overflows its width");
    out[i] = carry % 10;
    carry /= 10;
  }
  return out;
}

Digits add(const Digits& x, const Digits& y, size_t width) {
  Digits out(width, 0);
  int carry = 0;
  for (size_t i = 0; i < width; ++i) {
    const int value = (i < x.size() ? x[i] : 0) + (i < y.size() ? y[i] : 0) + carry;
    out[i] = value % 10;
    carry = value / 10;
  }
  if (carry) throw std::logic_error("sum overflows its width");
  return out;
}

std::string spell(const Digits& digits) {
  std::string text;
  for (size_t i = 0; i < digits.size(); ++i) text += (i ? " " : "") + std::to_string(digits[i]);
  return text;
}

}  // namespace

Example multiplication_example(const Digits& a, const Digits& b) {
  if (a.empty() || b.empty()) throw std::invalid_argument("multiplication_example: empty operand");
  Example example;
  example.question = spell(a) + " * " + spell(b);
  Digits running;
  for (size_t i = 0; i < b.size(); ++i) {
    const size_t width = a.size() + 1 + i;
    const Digits product = partial_product(a, b[i], static_cast<int>(i), width);
    if (i == 0) {
      example.steps.push_back(spell(product));
      running = product;
      continue;
    }
    running = add(running, product, width);
    example.steps.push_back(i + 1 < b.size() ? spell(product) + " ( " + spell(running) + " )" : spell(product));
  }
  running.resize(a.size() + b.size(), 0);
  example.answer = spell(running);
  return example;
}

std::vector<Example> generate_multiplication(int digits, int count, uint64_t seed) {
  if (digits < 1 || count < 0) throw std::invalid_argument("generate_multiplication: digits >= 1, count >= 0");
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> digit(0, 9), leading(1, 9);
  const auto operand = [&] {
    Digits value(static_cast<size_t>(digits));
    for (int i = 0; i < digits; ++i) value[static_cast<size_t>(i)] = i + 1 == digits ? leading(rng) : digit(rng);
    return value;
  };
  std::vector<Example> examples;
  for (int i = 0; i < count; ++i) {
    const Digits a = operand(), b = operand();
    examples.push_back(multiplication_example(a, b));
  }
  return examples;
}

std::string icot_line(const Example& example) {
  std::string chain;
  for (size_t i = 0; i < example.steps.size(); ++i) chain += (i ? " + " : "") + example.steps[i];
  return example.question + "||" + chain + " #### " + example.answer;
}

}  // namespace coconut
