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
