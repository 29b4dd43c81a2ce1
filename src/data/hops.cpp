#include "data/hops.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>

namespace coconut {

std::vector<Example> generate_hops(int count, uint64_t seed, const HopsOptions& options) {
  if (options.symbols < 2 || options.symbols > 26 || options.min_hops < 1 || options.max_hops < options.min_hops)
    throw std::invalid_argument("generate_hops: 2 <= symbols <= 26 and 1 <= min_hops <= max_hops");
  std::mt19937_64 rng(seed);
  const auto letter = [](int index) { return std::string(1, static_cast<char>('a' + index)); };
  std::vector<Example> examples;
  for (int i = 0; i < count; ++i) {
    // A random permutation without fixed points, so that every hop moves.
    std::vector<int> image(static_cast<size_t>(options.symbols));
    do {
      std::iota(image.begin(), image.end(), 0);
      std::shuffle(image.begin(), image.end(), rng);
    } while ([&] {
      for (int s = 0; s < options.symbols; ++s)
        if (image[static_cast<size_t>(s)] == s) return true;
      return false;
    }());
    std::vector<int> order(static_cast<size_t>(options.symbols));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    const int hops = std::uniform_int_distribution<int>(options.min_hops, options.max_hops)(rng);
    int current = std::uniform_int_distribution<int>(0, options.symbols - 1)(rng);

    Example example;
    for (int source : order) example.question += letter(source) + " " + letter(image[static_cast<size_t>(source)]) + " ";
    example.question += ". start " + letter(current) + " hops " + std::to_string(hops);
    for (int hop = 0; hop < hops; ++hop) {
      const int next = image[static_cast<size_t>(current)];
      example.steps.push_back(letter(current) + " " + letter(next));
      current = next;
    }
    example.answer = letter(current);
    examples.push_back(std::move(example));
  }
  return examples;
}

}  // namespace coconut
