// The one-pass CPU RMSNorm against the eager formula HF uses (float32 statistics, the normalised
// value rounded to the dtype, then the weight), and against float64.
#include <gtest/gtest.h>

#include "model/cpu_norm.h"

using namespace coconut;

namespace {

torch::Tensor eager(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  auto x32 = x.to(torch::kFloat32);
  return weight * (x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(x.scalar_type());
}

}  // namespace

TEST(CpuRmsNorm, AgreesWithTheEagerFormulaForEveryDtypeAndWidth) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    for (int64_t width : {1, 7, 8, 128, 2049}) {
      for (auto sizes : std::vector<std::vector<int64_t>>{{width}, {3, width}, {2, 5, width}}) {
        auto x = (torch::randn(sizes) * 3).to(dtype);
        auto weight = (torch::rand({width}) + 0.5).to(dtype);
        ASSERT_TRUE(uses_cpu_rms_norm(x, weight));
        const double eps = width == 128 ? 0.5 : 1e-5;  // one width where eps moves every output
        auto y = cpu_rms_norm(x, weight, eps);
        ASSERT_EQ(y.sizes(), x.sizes());
        ASSERT_EQ(y.scalar_type(), dtype);
        auto expected = eager(x, weight, eps).to(torch::kFloat64);
        // The float32 statistics differ from libtorch's only in summation order (~1e-7 relative);
        // after the two roundings to bf16/f16 (normalised value, then the product with the weight)
        // that can move an output by a unit in the last place at each: two units, relative.
        const double ulp = dtype == torch::kBFloat16 ? 2.0 / 128 : (dtype == torch::kFloat16 ? 2.0 / 1024 : 1e-6);
        auto error = (y.to(torch::kFloat64) - expected).abs();
        EXPECT_TRUE((error <= ulp * expected.abs() + 1e-6).all().item<bool>())
            << c10::toString(dtype) << " width " << width << " worst " << error.max().item<double>();
        // And the float32 result against float64 arithmetic on the same values.
        if (dtype == torch::kFloat32) {
          auto x64 = x.to(torch::kFloat64);
          auto exact = weight.to(torch::kFloat64) * x64 * torch::rsqrt(x64.pow(2).mean(-1, true) + eps);
          EXPECT_TRUE(torch::allclose(y.to(torch::kFloat64), exact, 1e-5, 1e-6)) << "width " << width;
        }
      }
    }
  }
}

TEST(CpuRmsNorm, LeavesAutogradAndMismatchedDtypesToTheEagerPath) {
  auto x = torch::randn({2, 8}, torch::requires_grad());
  auto weight = torch::ones({8});
  EXPECT_FALSE(uses_cpu_rms_norm(x, weight));
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(uses_cpu_rms_norm(x, weight));
  EXPECT_FALSE(uses_cpu_rms_norm(x, weight.to(torch::kBFloat16)));
  EXPECT_FALSE(uses_cpu_rms_norm(x.to(torch::kFloat64), weight.to(torch::kFloat64)));
  EXPECT_FALSE(uses_cpu_rms_norm(x, torch::ones({7})));
}

// Training: the one-pass float32 kernel with its own backward against libtorch's rms_norm in
// float64 (values and both gradients), on a non-contiguous input, upstream gradient arbitrary.
TEST(CpuRmsNorm, RecordedCallsMatchFloat64ValuesAndGradients) {
  torch::manual_seed(2);
  const auto source = torch::randn({5, 3, 37}), upstream = torch::randn({3, 5, 37});
  const auto weight_values = torch::rand({37}) + 0.5;
  torch::Tensor values[2], input_gradients[2], weight_gradients[2];
  for (int run = 0; run < 2; ++run) {
    const auto dtype = run == 0 ? torch::kFloat64 : torch::kFloat32;
    auto leaf = source.to(dtype).requires_grad_(true);
    auto weight = weight_values.to(dtype).requires_grad_(true);
    const auto x = leaf.transpose(0, 1);  // [3, 5, 37], non-contiguous
    if (run == 1) {
      ASSERT_TRUE(uses_recorded_cpu_rms_norm(x, weight));
    }
    values[run] = run == 0 ? at::rms_norm(x, {37}, weight, 1e-5) : recorded_cpu_rms_norm(x, weight, 1e-5);
    (values[run] * upstream.to(dtype)).sum().backward();
    input_gradients[run] = leaf.grad().to(torch::kFloat64);
    weight_gradients[run] = weight.grad().to(torch::kFloat64);
    values[run] = values[run].to(torch::kFloat64);
  }
  EXPECT_TRUE(torch::allclose(values[1], values[0], 1e-5, 1e-6)) << (values[1] - values[0]).abs().max();
  EXPECT_TRUE(torch::allclose(input_gradients[1], input_gradients[0], 1e-5, 1e-5)) << (input_gradients[1] - input_gradients[0]).abs().max();
  EXPECT_TRUE(torch::allclose(weight_gradients[1], weight_gradients[0], 1e-5, 1e-5)) << (weight_gradients[1] - weight_gradients[0]).abs().max();
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(uses_recorded_cpu_rms_norm(source, weight_values));  // nothing to record: cpu_rms_norm's
}
