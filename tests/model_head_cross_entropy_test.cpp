// The head's cross-entropy a chunk of rows at a time against the unfused head (logits, then
// cross_entropy), in float32 and under bf16 autocast: the loss and the gradients of the hidden
// states and of the weight.
#include <gtest/gtest.h>

#include "model/autocast.h"
#include "model/head_cross_entropy.h"
#include "support/heap.h"

using namespace coconut;

namespace {

struct Result {
  torch::Tensor loss, grad_hidden, grad_weight;
};

Result run(bool chunked, bool bf16, int64_t chunk_rows) {
  torch::manual_seed(3);
  auto hidden = torch::randn({37, 24}).requires_grad_(true);
  auto weight = (torch::randn({101, 24}) * 0.5).requires_grad_(true);
  const auto targets = torch::randint(0, 101, {37}, torch::kInt64);
  Result result;
  {
    AutocastScope autocast(bf16, torch::kCPU);
    result.loss = chunked ? head_cross_entropy(hidden, weight, targets, chunk_rows)
                          : torch::nn::functional::cross_entropy(at::linear(hidden, weight).to(torch::kFloat32), targets);
    result.loss.backward();
  }
  result.grad_hidden = hidden.grad();
  result.grad_weight = weight.grad();
  return result;
}

}  // namespace

TEST(HeadCrossEntropy, MatchesTheUnfusedHeadInFloat32AndBf16) {
  for (const bool bf16 : {false, true}) {
    const Result unfused = run(false, bf16, 0);
    for (const int64_t chunk_rows : {1, 8, 37, 0}) {  // one row, uneven chunks, all rows, the default
      const Result chunked = run(true, bf16, chunk_rows);
      // float32: summation order only; bf16: the same bf16 products, the weight's gradient summed
      // over chunks in float32 where the unfused product rounds it to bf16 once (8 bits: 4e-3).
      const double tolerance = bf16 ? 1e-2 : 1e-5;
      EXPECT_NEAR(chunked.loss.item<double>(), unfused.loss.item<double>(), tolerance * 1e-1 * unfused.loss.item<double>())
          << bf16 << " " << chunk_rows;
      // The largest difference against the gradient's own scale.
      const auto relative = [](const torch::Tensor& a, const torch::Tensor& b) {
        return ((a - b).abs().max() / b.abs().max()).item<double>();
      };
      EXPECT_LT(relative(chunked.grad_hidden, unfused.grad_hidden), tolerance) << bf16 << " " << chunk_rows;
      EXPECT_LT(relative(chunked.grad_weight, unfused.grad_weight), tolerance) << bf16 << " " << chunk_rows;
      EXPECT_EQ(chunked.grad_hidden.scalar_type(), torch::kFloat32);
    }
  }
}

// A frozen weight gets no gradient, and bad shapes are refused.
TEST(HeadCrossEntropy, AFrozenWeightAndBadShapes) {
  auto hidden = torch::randn({5, 8}).requires_grad_(true);
  const auto weight = torch::randn({11, 8});
  const auto targets = torch::randint(0, 11, {5}, torch::kInt64);
  head_cross_entropy(hidden, weight, targets, 2).backward();
  EXPECT_TRUE(hidden.grad().defined());
  EXPECT_FALSE(weight.grad().defined());
  EXPECT_THROW(head_cross_entropy(hidden, weight.narrow(1, 0, 7), targets), std::invalid_argument);
  EXPECT_THROW(head_cross_entropy(hidden, weight, targets.narrow(0, 0, 4)), std::invalid_argument);
  EXPECT_THROW(head_cross_entropy(hidden.narrow(0, 0, 0), weight, targets.narrow(0, 0, 0)), std::invalid_argument);
}

// What the loss keeps between forward and backward: no [N, V] logits (the unfused head keeps its
// float32 logits and their log-softmax, 8 bytes a logit, beside the bf16 product).
TEST(HeadCrossEntropy, KeepsNoLogits) {
  if (!coconut::testing::kGlibcHeap) GTEST_SKIP() << "AddressSanitizer replaces malloc: glibc's heap counters read 0";
  const int64_t rows = 256, width = 64, vocabulary = 4096;
  auto hidden = torch::randn({rows, width}).requires_grad_(true);
  auto weight = torch::randn({vocabulary, width}).requires_grad_(true);
  const auto targets = torch::randint(0, vocabulary, {rows}, torch::kInt64);
  const auto kept = [&](bool chunked) {
    int64_t bytes = 0;
    for (int repeat = 0; repeat < 2; ++repeat) {  // the first fills what libraries keep once allocated
      const int64_t before = coconut::testing::heap_in_use();
      auto loss = chunked ? head_cross_entropy(hidden, weight, targets, 64)
                          : torch::nn::functional::cross_entropy(at::linear(hidden, weight), targets);
      bytes = coconut::testing::heap_in_use() - before;
      loss.backward();
    }
    return bytes;
  };
  const int64_t unfused = kept(false), chunked = kept(true);
  std::printf("kept after forward: unfused %lld bytes, chunked %lld\n", static_cast<long long>(unfused), static_cast<long long>(chunked));
  EXPECT_GT(unfused, rows * vocabulary * 4);  // at least the log-softmax
  EXPECT_LT(chunked, rows * vocabulary);      // a quarter of one float32 copy of the logits
}
