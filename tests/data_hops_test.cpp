// The demo task: steps follow the mapping stated in the question, the answer ends the chain.
#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "data/hops.h"

using namespace coconut;

TEST(Hops, StepsFollowTheStatedMapping) {
  const auto examples = generate_hops(300, 5);
  ASSERT_EQ(examples.size(), 300u);
  for (const auto& example : examples) {
    std::istringstream words(example.question);
    std::map<std::string, std::string> image;
    std::string from, to;
    while (words >> from && from != ".") {
      words >> to;
      EXPECT_NE(from, to);
      image[from] = to;
    }
    EXPECT_EQ(image.size(), 10u);
    std::string start_word, start, hops_word;
    int hops = 0;
    words >> start_word >> start >> hops_word >> hops;
    ASSERT_EQ(static_cast<int>(example.steps.size()), hops);
    EXPECT_GE(hops, 3);
    EXPECT_LE(hops, 5);
    std::string current = start;
    for (const auto& step : example.steps) {
      EXPECT_EQ(step, current + " " + image[current]);
      current = image[current];
    }
    EXPECT_EQ(example.answer, current);
  }
  EXPECT_EQ(generate_hops(3, 5)[2].question, examples[2].question);  // seeded
}
