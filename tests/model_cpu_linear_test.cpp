// The decode kernel against at::linear evaluated in float64 on the same (already rounded) values.
#include <gtest/gtest.h>

#include "model/autocast.h"
#include "model/cpu_linear.h"
#include "support/autograd_graph.h"

#include <optional>
#include <string>
#include <tuple>
#include <vector>

using namespace coconut;
using coconut::testing::count_graph_nodes;

namespace {

// Reference: float64 product of exactly the values the kernel sees, then rounded like the output.
torch::Tensor reference(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  auto y = torch::nn::functional::linear(x.to(torch::kFloat64), w.to(torch::kFloat64),
                                         b.defined() ? b.to(torch::kFloat64) : torch::Tensor());
  return y;
}

}  // namespace

TEST(DecodeKernel, AgreesWithFloat64ForEveryDtypeAndShape) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  for (auto dtype : {torch::kFloat32, torch::kFloat16, torch::kBFloat16}) {
    for (int64_t k : {1, 7, 16, 33, 64, 100, 257}) {
      for (int64_t n : {1, 3, 4, 5, 17, 130}) {
        for (int64_t m : std::vector<int64_t>{1, 2, 3, 4, 5, 7, kDecodeKernelRowBlock}) {
          auto x = torch::randn({m, k}).to(dtype);
          auto w = torch::randn({n, k}).to(dtype);
          auto b = torch::randn({n}).to(dtype);
          ASSERT_TRUE(uses_decode_kernel(x, w));
          auto y = dense(x, w, b);
          ASSERT_EQ(y.scalar_type(), dtype);
          ASSERT_EQ(y.sizes(), (std::vector<int64_t>{m, n}));
          auto expected = reference(x, w, b);
          // f32 accumulation of k products of O(1) values: ~k * 2^-24 * sqrt(k) absolute; then the
          // output is rounded to the dtype: relative 2^-8 (bf16), 2^-11 (f16), exact (f32).
          const double output_rounding = dtype == torch::kBFloat16 ? 1.0 / 256 : (dtype == torch::kFloat16 ? 1.0 / 2048 : 0.0);
          auto tolerance = 1e-5 * static_cast<double>(k) + output_rounding * expected.abs();
          auto error = (y.to(torch::kFloat64) - expected).abs();
          EXPECT_TRUE((error <= tolerance).all().item<bool>())
              << c10::toString(dtype) << " m=" << m << " n=" << n << " k=" << k << " worst " << error.max().item<double>();
        }
      }
    }
  }
}

// From two input rows on, each output has one accumulator filled in the same order whatever tile
// computes it, so a row's product does not depend on how many rows share the call (a batch of 16
// decodes its rows to the same bits as any group of 2 to 15 of them). A single row takes the
// bandwidth-bound matrix-vector path, whose order differs: equal within rounding only.
TEST(DecodeKernel, RowsGiveTheSameBitsInAnyBatchOfTwoOrMore) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(1);
  for (auto dtype : {torch::kFloat32, torch::kFloat16, torch::kBFloat16}) {
    for (int64_t k : {33, 128, 300}) {
      auto w = torch::randn({37, k}).to(dtype);
      auto x = torch::randn({kDecodeKernelRowBlock, k}).to(dtype);
      auto batched = dense(x, w);
      for (auto [first, count] : std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 2}, {5, 7}, {12, 4}}) {
        auto part = dense(x.narrow(0, first, count), w);
        EXPECT_TRUE(torch::equal(part, batched.narrow(0, first, count)))
            << c10::toString(dtype) << " k=" << k << " rows " << first << "+" << count;
      }
      auto alone = dense(x.narrow(0, 6, 1), w);
      EXPECT_TRUE(torch::allclose(alone.to(torch::kFloat32), batched.narrow(0, 6, 1).to(torch::kFloat32), 1e-2, 1e-4 * k));
    }
  }
}

// Weight rows go four at a time (their 16 sums reduced together) and the last N mod 4 one at a time
// (each reduced alone): the two reductions add in the same order, so a weight row repeated as the
// last one gives its output's bits again, for every tile height and with a scalar tail (k = 300).
TEST(DecodeKernel, FourWeightRowTilesReduceLikeSingleRows) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (int64_t k : {16, 128, 300}) {
      auto w = torch::randn({4, k}).to(dtype);
      w = torch::cat({w, w.narrow(0, 2, 1)});  // row 4 == row 2: rows 0-3 form a tile, row 4 is alone
      for (int64_t m : {2, 3, 4, 5, 8}) {
        auto x = (torch::randn({m, k}) * torch::rand({m, k}).pow(8)).to(dtype);  // magnitudes spread: order shows
        auto y = dense(x, w);
        EXPECT_TRUE(torch::equal(y.select(1, 4), y.select(1, 2))) << c10::toString(dtype) << " k=" << k << " m=" << m;
      }
    }
  }
}

TEST(DecodeKernel, KeepsLeadingDimensions) {
  torch::NoGradGuard no_grad;
  auto x = torch::randn({1, 1, 48});
  auto w = torch::randn({20, 48});
  auto y = dense(x, w);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{1, 1, 20}));
  EXPECT_TRUE(torch::allclose(y, torch::nn::functional::linear(x, w), 1e-5, 1e-5));
}

TEST(DecodeKernel, FallsBackForAutogradAndLowPrecisionPrefill) {
  auto w = torch::randn({8, 16}, torch::requires_grad());
  auto x = torch::randn({1, 16});
  EXPECT_FALSE(uses_decode_kernel(x, w));  // training: autograd must see the op
  auto y = dense(x, w);
  y.sum().backward();
  EXPECT_TRUE(torch::allclose(w.grad(), x.expand({8, 16})));
  torch::NoGradGuard no_grad;
  // bf16 / f16 past one block of rows: oneDNN's products are faster there.
  EXPECT_FALSE(uses_decode_kernel(torch::randn({kDecodeKernelRowBlock + 1, 16}).to(torch::kBFloat16), w.to(torch::kBFloat16)));
  EXPECT_TRUE(uses_decode_kernel(torch::randn({kDecodeKernelRowBlock, 16}).to(torch::kBFloat16), w.to(torch::kBFloat16)));
  EXPECT_FALSE(uses_decode_kernel(torch::randn({1, 16}).to(torch::kFloat64), w.to(torch::kFloat64)));
  EXPECT_TRUE(uses_decode_kernel(torch::randn({kDecodeKernelRowBlock, 16}), w));
  EXPECT_TRUE(uses_decode_kernel(torch::randn({1000, 16}), w));  // float32 prefill: blocks of rows
  // Past 64 MiB of weights a prefill goes to BLAS (it blocks the matrix); one row still streams it.
  auto large = torch::empty({16 * 1024 + 1, 1024});
  EXPECT_FALSE(uses_decode_kernel(torch::randn({kDecodeKernelRowBlock + 1, 1024}), large));
  EXPECT_TRUE(uses_decode_kernel(torch::randn({1, 1024}), large));
}

// A float32 prefill takes the tiles a block of rows at a time (never a block of one row), so every
// row of it gets the bits it gets in any decode batch of 2 or more: prompt and decode agree.
TEST(DecodeKernel, ManyRowsAgreeWithFloat64AndGiveEachRowItsBatchBits) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(2);
  for (int64_t k : {33, 128, 512}) {
    auto w = torch::randn({130, k});
    auto b = torch::randn({130});
    for (int64_t m : {17, 18, 33, 64, 65, 257}) {
      auto x = torch::randn({m, k});
      ASSERT_TRUE(uses_decode_kernel(x, w));
      auto y = dense(x, w, b);
      auto error = (y.to(torch::kFloat64) - reference(x, w, b)).abs();
      EXPECT_TRUE((error <= 1e-5 * static_cast<double>(k)).all().item<bool>()) << "m=" << m << " k=" << k;
      for (auto [first, count] : std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {m - 2, 2}, {m / 2, 5}}) {
        auto part = dense(x.narrow(0, first, count), w, b);
        EXPECT_TRUE(torch::equal(part, y.narrow(0, first, count))) << "m=" << m << " k=" << k << " rows " << first << "+" << count;
      }
    }
  }
}

// Training (float32, autograd, no autocast) runs forward and backward on the tiles: the output and
// both gradients agree with float64 products of the same values, for 3-D inputs and sizes that are
// not multiples of the tiles or vectors.
TEST(DecodeKernel, TrainingProductsAndGradientsAgreeWithFloat64) {
  torch::manual_seed(3);
  for (auto [m, k, n] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 16, 8}, {37, 33, 19}, {50, 40, 70}, {160, 128, 512}, {70, 512, 130}, {300, 81, 37}}) {
    auto x = torch::randn({2, m, k}, torch::requires_grad());
    auto w = torch::randn({n, k}, torch::requires_grad());
    auto b = torch::randn({n}, torch::requires_grad());
    auto upstream = torch::randn({2, m, n});
    auto y = dense(x, w, b);
    ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, m, n}));
    (y * upstream).sum().backward();
    auto x64 = x.detach().to(torch::kFloat64).requires_grad_(), w64 = w.detach().to(torch::kFloat64).requires_grad_(),
         b64 = b.detach().to(torch::kFloat64).requires_grad_();
    auto y64 = torch::nn::functional::linear(x64, w64, b64);
    (y64 * upstream.to(torch::kFloat64)).sum().backward();
    // f32 sums of k (forward, dx: n) or 2m (dW) products of O(1) values.
    EXPECT_TRUE(torch::allclose(y.to(torch::kFloat64), y64, 0, 1e-5 * k)) << m << " " << k << " " << n;
    EXPECT_TRUE(torch::allclose(x.grad().to(torch::kFloat64), x64.grad(), 0, 1e-5 * n)) << m << " " << k << " " << n;
    EXPECT_TRUE(torch::allclose(w.grad().to(torch::kFloat64), w64.grad(), 0, 1e-5 * 2 * m)) << m << " " << k << " " << n;
    EXPECT_TRUE(torch::allclose(b.grad().to(torch::kFloat64), b64.grad(), 0, 1e-5 * 2 * m)) << m << " " << k << " " << n;
  }
}

namespace {

struct Gradients {
  torch::Tensor loss, weight, first_input, second_input;
};

// Three products with one square weight, two of them chained, as Coconut's thought passes run
// them; with `defer`, inside a DeferredWeightGradients scope.
Gradients three_products(torch::ScalarType dtype, bool defer, bool autocast) {
  torch::manual_seed(5);
  auto weight = torch::randn({8, 8}).to(dtype).requires_grad_(true);
  auto first = torch::randn({2, 3, 8}).to(dtype).requires_grad_(true), second = torch::randn({4, 8}).to(dtype).requires_grad_(true);
  const auto scale = torch::randn({2, 3, 8}).to(dtype);
  torch::Tensor loss;
  {
    AutocastScope scope(autocast, torch::kCPU);
    std::optional<DeferredWeightGradients> deferred;
    if (defer) deferred.emplace();
    const auto chained = dense(torch::tanh(dense(first, weight)), weight);  // [2, 3, 8]
    loss = (chained * scale).sum() + dense(second, weight).pow(2).sum();
    if (defer) {
      EXPECT_EQ(count_graph_nodes(loss, "GatherWeightGradient"), 1) << "one gathering node for the weight";
    }
  }
  loss.backward();
  return {loss.detach(), weight.grad(), first.grad(), second.grad()};
}

}  // namespace

// Deferred weight gradients equal those of the plain path: float64 (the generic products, as on a
// GPU) to rounding, float32 on the CPU's tiles, and under bf16 autocast within its rounding; the
// inputs' gradients too. All three products reach the weight through one gathering node.
TEST(DeferredWeightGradients, EqualThePlainPathInEveryDtype) {
  struct Case {
    torch::ScalarType dtype;
    bool autocast;
    double tolerance;
  };
  for (const Case& c : {Case{torch::kFloat64, false, 1e-12}, Case{torch::kFloat32, false, 1e-5}, Case{torch::kFloat32, true, 3e-2}}) {
    const auto dtype = c.dtype;
    const bool autocast = c.autocast;
    const double tolerance = c.tolerance;  // (a lambda may not capture a structured binding in C++17)
    const auto plain = three_products(dtype, false, autocast), deferred = three_products(dtype, true, autocast);
    const auto close = [&](const torch::Tensor& a, const torch::Tensor& b) {
      return (a - b).abs().max().item<double>() <= tolerance * b.abs().max().item<double>();
    };
    const auto label = std::string(c10::toString(dtype)) + (autocast ? " autocast" : "");
    EXPECT_TRUE(close(deferred.loss, plain.loss)) << label;
    ASSERT_TRUE(deferred.weight.defined()) << label;
    EXPECT_TRUE(close(deferred.weight, plain.weight)) << label << "\n" << deferred.weight - plain.weight;
    EXPECT_TRUE(close(deferred.first_input, plain.first_input)) << label;
    EXPECT_TRUE(close(deferred.second_input, plain.second_input)) << label;
  }
}

// Under autocast the deferred products read autocast's own cached cast of the weight, the one a
// plain product of the same scope made: their graphs meet there, and no second copy is made.
TEST(DeferredWeightGradients, UnderAutocastShareTheScopesCastOfTheWeight) {
  auto weight = torch::randn({8, 8}).requires_grad_(true);
  const auto x = torch::randn({3, 8});
  AutocastScope scope(true, torch::kCPU);
  const auto plain = dense(x, weight);
  torch::Tensor deferred;
  {
    DeferredWeightGradients deferral;
    deferred = dense(x, weight);
  }
  EXPECT_EQ(deferred.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(count_graph_nodes(plain, "ToCopyBackward"), 1);
  EXPECT_EQ(count_graph_nodes(plain + deferred, "ToCopyBackward"), 1) << "the deferred product cast the weight again";
}

// A gradient asked for the inputs alone runs no gathering node and leaves the weight without one;
// no scope open, products take the plain path again.
TEST(DeferredWeightGradients, InputGradientsAloneAndNoScopeLeaveTheWeightAsItWas) {
  auto weight = torch::randn({8, 8}).requires_grad_(true);
  auto x = torch::randn({3, 8}).requires_grad_(true);
  torch::Tensor y;
  {
    DeferredWeightGradients deferral;
    y = dense(torch::tanh(dense(x, weight)), weight);
  }
  const auto input_gradient = torch::autograd::grad({y.sum()}, {x})[0];
  EXPECT_FALSE(weight.grad().defined());
  torch::Tensor reference;
  {
    auto x_again = x.detach().requires_grad_(true);
    reference = torch::autograd::grad({dense(torch::tanh(dense(x_again, weight)), weight).sum()}, {x_again})[0];
  }
  EXPECT_TRUE(torch::allclose(input_gradient, reference, 1e-5, 1e-6));
  EXPECT_EQ(count_graph_nodes(dense(x, weight), "GatherWeightGradient"), 0);
}
