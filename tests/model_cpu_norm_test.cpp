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
