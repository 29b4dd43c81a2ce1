// The one-pass CPU RoPE against the eager chain it replaces: the same bits for every dtype, on the
// transposed views the attention passes it.
#include <gtest/gtest.h>

#include "model/cpu_rope.h"

using namespace coconut;

TEST(CpuRope, GivesTheEagerChainsBitsForEveryDtype) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    for (int64_t table_batch : {1, 3}) {
      const int64_t batch = 3, time = 5, heads = 4, head_dim = 16;
      // [B, T, H, Dh] -> [B, H, T, Dh], as the attention's projections arrive.
      auto x = torch::randn({batch, time, heads, head_dim}).to(dtype).transpose(1, 2);
      auto angles = torch::rand({table_batch, 1, time, head_dim}) * 100;
      auto cos = angles.cos().to(dtype), sin = angles.sin().to(dtype);
      ASSERT_TRUE(uses_cpu_rope(x, cos, sin));
      const int64_t half = head_dim / 2;
      auto rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
      auto expected = x * cos + rotated * sin;
      auto y = cpu_rope(x, cos, sin);
      EXPECT_TRUE(torch::equal(y, expected)) << c10::toString(dtype) << " table batch " << table_batch;
    }
  }
}

TEST(CpuRope, LeavesAutogradAndOddShapesToTheEagerPath) {
  auto x = torch::randn({1, 2, 3, 8}, torch::requires_grad());
  auto cos = torch::randn({1, 1, 3, 8}), sin = torch::randn({1, 1, 3, 8});
  EXPECT_FALSE(uses_cpu_rope(x, cos, sin));
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(uses_cpu_rope(x, cos, sin));
  EXPECT_FALSE(uses_cpu_rope(x, cos.to(torch::kBFloat16), sin.to(torch::kBFloat16)));
  EXPECT_FALSE(uses_cpu_rope(torch::randn({1, 2, 3, 7}), torch::randn({1, 1, 3, 7}), torch::randn({1, 1, 3, 7})));
  EXPECT_FALSE(uses_cpu_rope(x, torch::randn({2, 1, 3, 8}), torch::randn({2, 1, 3, 8})));  // 2 tables, 1 row
}

// Recorded (training) calls: the eager chain's bits forward and its gradient backward (within
// float32 rounding; the kernel's backward is a rotation by the opposite angle, exact where the
// tables repeat over the two halves of a head, as the model's do), on the transposed views the
// attention passes, with a gradient arriving non-contiguous.
TEST(CpuRope, RecordedCallsGiveTheEagerChainsValuesAndGradients) {
  torch::manual_seed(1);
  const int64_t batch = 2, time = 5, heads = 3, head_dim = 8, half = head_dim / 2;
  auto angles = torch::rand({batch, 1, time, half}) * 100;
  angles = torch::cat({angles, angles}, -1);  // [B, 1, T, Dh], halves repeated
  const auto cos = angles.cos(), sin = angles.sin();
  const auto source = torch::randn({batch, time, heads, head_dim});
  const auto upstream = torch::randn({batch, time, heads, head_dim}).transpose(1, 2);  // non-contiguous
  torch::Tensor outputs[2], gradients[2];
  for (int run = 0; run < 2; ++run) {
    auto leaf = source.clone().requires_grad_(true);
    const auto x = leaf.transpose(1, 2);  // [B, H, T, Dh]
    if (run == 0) {
      const auto rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
      outputs[run] = x * cos + rotated * sin;
    } else {
      ASSERT_TRUE(uses_recorded_cpu_rope(x, cos, sin));
      ASSERT_FALSE(uses_cpu_rope(x, cos, sin));
      outputs[run] = recorded_cpu_rope(x, cos, sin);
    }
    (outputs[run] * upstream).sum().backward();
    gradients[run] = leaf.grad();
  }
  EXPECT_TRUE(torch::equal(outputs[1], outputs[0]));
  EXPECT_TRUE(torch::allclose(gradients[1], gradients[0], 1e-6, 1e-6))
      << "max difference " << (gradients[1] - gradients[0]).abs().max().item<double>();
  EXPECT_FALSE(uses_recorded_cpu_rope(torch::randn({1, 2, 3, 8}), cos.narrow(0, 0, 1).narrow(2, 0, 3),
                                      sin.narrow(0, 0, 1).narrow(2, 0, 3)))  // nothing to record
      << "a call autograd does not record takes cpu_rope";
}
