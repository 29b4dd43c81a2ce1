#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "model/cpu_training_attention.h"

namespace {

struct Gradients {
  torch::Tensor out, dq, dk, dv;  // out [B, T, H, Dh]
};

// The reference: attention written out in float64 (scores, mask, softmax, context; K/V repeated to
// the query heads), gradients by autograd.
Gradients reference(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask,
                    bool causal, double scale, const torch::Tensor& upstream) {
  auto q64 = q.to(torch::kFloat64).detach().requires_grad_(), k64 = k.to(torch::kFloat64).detach().requires_grad_();
  auto v64 = v.to(torch::kFloat64).detach().requires_grad_();
  const int64_t per_group = q.size(1) / k.size(1), rows = q.size(2), keys = k.size(2);
  auto scores = torch::matmul(q64, k64.repeat_interleave(per_group, 1).transpose(-1, -2)) * scale;  // [B, H, T, S]
  if (mask.defined()) {
    scores = scores + mask.to(torch::kFloat64);
  } else if (causal) {
    scores = scores.masked_fill(torch::ones({rows, keys}, torch::kBool).triu(1), -std::numeric_limits<double>::infinity());
  }
  auto out = torch::matmul(torch::softmax(scores, -1), v64.repeat_interleave(per_group, 1)).transpose(1, 2);  // [B, T, H, Dh]
  out.backward(upstream.to(torch::kFloat64));
  return {out.detach(), q64.grad(), k64.grad(), v64.grad()};
}

Gradients ours(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask, bool causal,
               double scale, const torch::Tensor& upstream) {
  auto our_q = q.detach().clone().requires_grad_(), our_k = k.detach().clone().requires_grad_();
  auto our_v = v.detach().clone().requires_grad_();
  EXPECT_TRUE(coconut::uses_cpu_training_attention(our_q, our_k, our_v, mask));
  auto out = coconut::cpu_training_attention(our_q, our_k, our_v, mask, causal, scale);
  out.backward(upstream);
  return {out.detach(), our_q.grad(), our_k.grad(), our_v.grad()};
}

// Float32 against float64: within 2e-5 of the largest value of each tensor.
void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, const char* what) {
  ASSERT_TRUE(actual.defined()) << what;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double error = (actual.to(torch::kFloat64) - expected).abs().max().item<double>();
  const double size = expected.abs().max().item<double>();
  EXPECT_LE(error, 2e-5 * size) << what << ": max |difference| " << error << " against max |value| " << size;
}

void check(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask, bool causal) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  const auto upstream = torch::randn({q.size(0), q.size(2), q.size(1), q.size(3)});
  const auto expected = reference(q, k, v, mask, causal, scale, upstream);
  const auto actual = ours(q, k, v, mask, causal, scale, upstream);
  expect_close(actual.out, expected.out, "context");
  expect_close(actual.dq, expected.dq, "dq");
  expect_close(actual.dk, expected.dk, "dk");
  expect_close(actual.dv, expected.dv, "dv");
}

// Additive masks as the model writes them: 0 where allowed, float32's lowest where not.
torch::Tensor additive(const torch::Tensor& allowed) {
  return torch::zeros(allowed.sizes()).masked_fill(allowed.logical_not(), std::numeric_limits<float>::lowest());
}

// Causal with no mask; 70 rows so the last of the 32-row blocks is partial; grouped heads (4 over 2).
TEST(CpuTrainingAttention, CausalMatchesWrittenOutAttention) {
  torch::manual_seed(1);
  check(torch::randn({3, 4, 70, 16}), torch::randn({3, 2, 70, 16}), torch::randn({3, 2, 70, 16}), torch::Tensor(), true);
  // Not causal: every row sees every column.
  check(torch::randn({2, 2, 40, 8}), torch::randn({2, 1, 40, 8}), torch::randn({2, 1, 40, 8}), torch::Tensor(), false);
}

// Heads as wide as the models' (32, 64 and 80 dimensions: the AVX-512 tiles' two, four and four
// plus a masked vector of columns), 75 rows so score blocks end between vectors.
TEST(CpuTrainingAttention, WideHeadsMatch) {
  torch::manual_seed(5);
  for (const int64_t head_dim : {32, 64, 80})
    check(torch::randn({2, 4, 75, head_dim}), torch::randn({2, 2, 75, head_dim}), torch::randn({2, 2, 75, head_dim}), torch::Tensor(),
          true);
}

// A causal mask with left padding per batch row, as a padded training batch has: rows whose keys are
// all padding spread over every column (uniform over the masked scores), as libtorch does.
TEST(CpuTrainingAttention, PaddedCausalMaskMatches) {
  torch::manual_seed(2);
  const int64_t batch = 3, rows = 45;
  auto allowed = torch::ones({rows, rows}, torch::kBool).tril().expand({batch, rows, rows}).clone();
  const std::vector<int64_t> padding = {0, 5, 33};
  for (int64_t b = 0; b < batch; ++b) allowed[b].slice(1, 0, padding[static_cast<size_t>(b)]).fill_(false);
  const auto mask = additive(allowed).unsqueeze(1);  // [B, 1, T, S]
  check(torch::randn({batch, 4, rows, 16}), torch::randn({batch, 4, rows, 16}), torch::randn({batch, 4, rows, 16}), mask, true);
  // One [1, 1, T, S] mask broadcast over the batch.
  const auto shared = additive(torch::ones({rows, rows}, torch::kBool).tril()).view({1, 1, rows, rows});
  check(torch::randn({batch, 2, rows, 16}), torch::randn({batch, 1, rows, 16}), torch::randn({batch, 1, rows, 16}), shared, true);
}

// A thought pass: one query row against a cache of keys, some masked.
TEST(CpuTrainingAttention, OneQueryAgainstCachedKeys) {
  torch::manual_seed(3);
  auto allowed = torch::ones({2, 1, 37}, torch::kBool);
  allowed[1].slice(1, 0, 4).fill_(false);
  check(torch::randn({2, 4, 1, 16}), torch::randn({2, 2, 37, 16}), torch::randn({2, 2, 37, 16}), additive(allowed).unsqueeze(1),
        false);
}

// q, k, v as the model passes them: views of [B, T, H, Dh] projections, transposed to [B, H, T, Dh].
TEST(CpuTrainingAttention, TransposedViewsMatch) {
  torch::manual_seed(4);
  const auto q = torch::randn({2, 50, 4, 8}).transpose(1, 2), k = torch::randn({2, 50, 2, 8}).transpose(1, 2);
  const auto v = torch::randn({2, 50, 2, 8}).transpose(1, 2);
  ASSERT_FALSE(q.is_contiguous());
  check(q, k, v, torch::Tensor(), true);
}

TEST(CpuTrainingAttention, OtherArgumentsAreLeftToLibtorch) {
  const auto q = torch::randn({2, 4, 8, 16}), k = torch::randn({2, 2, 8, 16}), v = torch::randn({2, 2, 8, 16});
  EXPECT_TRUE(coconut::uses_cpu_training_attention(q, k, v, torch::Tensor()));
  EXPECT_FALSE(coconut::uses_cpu_training_attention(q.to(torch::kBFloat16), k, v, torch::Tensor()));
  EXPECT_FALSE(coconut::uses_cpu_training_attention(q, torch::randn({2, 3, 8, 16}), torch::randn({2, 3, 8, 16}), torch::Tensor()));
  EXPECT_FALSE(coconut::uses_cpu_training_attention(q.transpose(2, 3), k, v, torch::Tensor()));  // inner stride not 1
  EXPECT_FALSE(coconut::uses_cpu_training_attention(q, k, v, torch::zeros({2, 1, 8, 9})));        // mask of other keys
  EXPECT_THROW(coconut::cpu_training_attention(q, k.narrow(2, 0, 5), v.narrow(2, 0, 5), torch::Tensor(), true, 0.25), c10::Error);
}

}  // namespace
