#include <gtest/gtest.h>

#include "model/cpu_swiglu.h"

namespace {

using coconut::SwigluKernel;

// Each kernel this CPU runs.
std::vector<SwigluKernel> kernels_here() {
  std::vector<SwigluKernel> kernels;
  for (auto kernel : {SwigluKernel::kBest, SwigluKernel::kAvx512, SwigluKernel::kAvx2, SwigluKernel::kPortable})
    if (coconut::cpu_runs(kernel)) kernels.push_back(kernel);
  return kernels;
}

// Gate values over the range where silu bends and saturates, exp overflowing at both ends; a last
// dimension no vector width divides, so every kernel's tail runs too.
torch::Tensor gate_values() {
  torch::manual_seed(5);
  auto gate = torch::randn({3, 37, 53}) * 4;
  gate.view({-1}).slice(0, 0, 6).copy_(torch::tensor({-120.0f, -88.0f, -30.0f, 0.0f, 30.0f, 100.0f}));
  return gate;
}

// |a - b| <= 4e-6 |b| + 1e-6 everywhere: SLEEF's and libm's exp are within 1 ulp of each other and
// the rest is the same float32 arithmetic (the absolute term where silu' crosses zero).
void expect_close(const torch::Tensor& actual, const torch::Tensor& expected) {
  ASSERT_EQ(actual.sizes(), expected.sizes());
  const auto excess = ((actual - expected).abs() - (4e-6 * expected.abs() + 1e-6)).max().item<float>();
  EXPECT_LE(excess, 0.0f) << "max |difference| " << (actual - expected).abs().max().item<float>();
}

TEST(CpuSwiglu, ForwardIsSiluTimesUp) {
  const auto gate = gate_values(), up = torch::randn_like(gate);
  const auto expected = torch::silu(gate) * up;
  for (auto kernel : kernels_here()) {
    SCOPED_TRACE(static_cast<int>(kernel));
    const auto out = coconut::cpu_swiglu(gate, up, kernel);
    EXPECT_FALSE(out.requires_grad());
    expect_close(out, expected);
  }
}

TEST(CpuSwiglu, GradientsAreAutogradsOfSiluTimesUp) {
  const auto gate_data = gate_values(), up_data = torch::randn_like(gate_data), upstream = torch::randn_like(gate_data);
  auto gate = gate_data.clone().requires_grad_(), up = up_data.clone().requires_grad_();
  (torch::silu(gate) * up).backward(upstream);
  for (auto kernel : kernels_here()) {
    SCOPED_TRACE(static_cast<int>(kernel));
    auto our_gate = gate_data.clone().requires_grad_(), our_up = up_data.clone().requires_grad_();
    const auto out = coconut::cpu_swiglu(our_gate, our_up, kernel);
    ASSERT_TRUE(out.requires_grad());
    out.backward(upstream);
    expect_close(our_gate.grad(), gate.grad());
    expect_close(our_up.grad(), up.grad());
    // Only one input needing a gradient: the other stays without.
    auto lone_gate = gate_data.clone().requires_grad_();
    coconut::cpu_swiglu(lone_gate, up_data, kernel).backward(upstream);
    expect_close(lone_gate.grad(), gate.grad());
  }
}

TEST(CpuSwiglu, OtherInputsTakeLibtorchsOperators) {
  const auto gate = gate_values(), up = torch::randn_like(gate);
  EXPECT_TRUE(coconut::uses_cpu_swiglu(gate, up));
  EXPECT_FALSE(coconut::uses_cpu_swiglu(gate.to(torch::kBFloat16), up.to(torch::kBFloat16)));
  EXPECT_FALSE(coconut::uses_cpu_swiglu(gate.transpose(1, 2), up.transpose(1, 2)));  // not contiguous
  EXPECT_FALSE(coconut::uses_cpu_swiglu(gate, up.slice(2, 0, 10)));
  EXPECT_THROW(coconut::cpu_swiglu(gate.transpose(1, 2), up.transpose(1, 2)), c10::Error);
  // swiglu falls back to silu * up, exactly.
  const auto bf16_gate = gate.to(torch::kBFloat16), bf16_up = up.to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(coconut::swiglu(bf16_gate, bf16_up), torch::silu(bf16_gate) * bf16_up));
}

}  // namespace
