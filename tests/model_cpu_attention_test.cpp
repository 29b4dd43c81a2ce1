// The decode attention products against float64 loops on the same float32 values, on strided
// views shaped like the KV cache's (a prefix of a preallocated cache, rows of a per-row cache).
#include <gtest/gtest.h>

#include "model/cpu_attention.h"

using namespace coconut;

namespace {

// A [B, G, S, Dh] view into a larger cache [B + 2, G, capacity, Dh]: rows 1..B, columns 0..S.
torch::Tensor cache_view(int64_t batch, int64_t groups, int64_t columns, int64_t head_dim) {
  auto cache = torch::randn({batch + 2, groups, columns + 7, head_dim});
  return cache.narrow(0, 1, batch).narrow(2, 0, columns);
}

bool has_avx512() { return __builtin_cpu_supports("avx512f"); }

}  // namespace

// Without AVX-512 attention_scores/attention_context fall back to libtorch's matmul, which this
// test is not about (FallsBackForAutogradDoublesAndPrefill checks the choice itself).
#define SKIP_WITHOUT_THE_KERNEL() \
  if (!has_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU: the decode attention kernel does not run here, only libtorch's matmul would be tested"

TEST(DecodeAttention, ScoresAndContextAgreeWithFloat64Loops) {
  SKIP_WITHOUT_THE_KERNEL();
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  for (int64_t head_dim : {8, 17, 32, 64}) {
    for (int64_t columns : {1, 3, 4, 150}) {
      for (int64_t rows : {int64_t{1}, int64_t{3}, kDecodeAttentionMaxRows}) {
        const int64_t batch = 3, groups = 2;
        auto keys = cache_view(batch, groups, columns, head_dim);
        auto values = cache_view(batch, groups, columns, head_dim);
        auto queries = torch::randn({batch, groups, rows, head_dim});
        const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
        ASSERT_TRUE(uses_decode_attention(queries, keys));  // our kernel, not the fallback
        auto scores = attention_scores(queries, keys, scale);
        ASSERT_EQ(scores.sizes(), (std::vector<int64_t>{batch, groups, rows, columns}));
        auto probabilities = torch::softmax(scores, -1);
        auto context = attention_context(probabilities, values);
        ASSERT_EQ(context.sizes(), (std::vector<int64_t>{batch, groups, rows, head_dim}));
        // Reference: the same float32 inputs, products and sums in float64.
        auto q64 = queries.to(torch::kFloat64), k64 = keys.to(torch::kFloat64), v64 = values.to(torch::kFloat64);
        auto p64 = probabilities.to(torch::kFloat64);
        auto q_access = q64.accessor<double, 4>(), k_access = k64.accessor<double, 4>(), v_access = v64.accessor<double, 4>();
        auto p_access = p64.accessor<double, 4>();
        auto s_access = scores.accessor<float, 4>(), c_access = context.accessor<float, 4>();
        double worst_score = 0, worst_context = 0;
        for (int64_t b = 0; b < batch; ++b)
          for (int64_t g = 0; g < groups; ++g)
            for (int64_t r = 0; r < rows; ++r) {
              for (int64_t s = 0; s < columns; ++s) {
                double dot = 0;
                for (int64_t d = 0; d < head_dim; ++d) dot += q_access[b][g][r][d] * k_access[b][g][s][d];
                worst_score = std::max(worst_score, std::abs(dot * scale - s_access[b][g][r][s]));
              }
              for (int64_t d = 0; d < head_dim; ++d) {
                double sum = 0;
                for (int64_t s = 0; s < columns; ++s) sum += p_access[b][g][r][s] * v_access[b][g][s][d];
                worst_context = std::max(worst_context, std::abs(sum - c_access[b][g][r][d]));
              }
            }
        // float32 sums of head_dim (scores) or columns (context) products of O(1) values.
        EXPECT_LE(worst_score, 1e-6 * static_cast<double>(head_dim)) << "Dh=" << head_dim << " S=" << columns << " Q=" << rows;
        EXPECT_LE(worst_context, 1e-6 * static_cast<double>(columns)) << "Dh=" << head_dim << " S=" << columns << " Q=" << rows;
      }
    }
  }
}

// Each (batch row, head) is computed on its own: a row's attention is the same bits in a batch of
// 16 as alone.
TEST(DecodeAttention, RowsGiveTheSameBitsAloneOrInABatch) {
  SKIP_WITHOUT_THE_KERNEL();
  torch::NoGradGuard no_grad;
  torch::manual_seed(2);
  const int64_t batch = 16, groups = 4, columns = 37, head_dim = 32;
  auto keys = cache_view(batch, groups, columns, head_dim), values = cache_view(batch, groups, columns, head_dim);
  auto queries = torch::randn({batch, groups, 1, head_dim});
  ASSERT_TRUE(uses_decode_attention(queries, keys));
  auto scores = attention_scores(queries, keys, 0.25);
  auto context = attention_context(torch::softmax(scores, -1), values);
  for (int64_t row : {0, 7, 15}) {
    auto one_scores = attention_scores(queries.narrow(0, row, 1), keys.narrow(0, row, 1), 0.25);
    EXPECT_TRUE(torch::equal(one_scores, scores.narrow(0, row, 1))) << row;
    auto one_context = attention_context(torch::softmax(one_scores, -1), values.narrow(0, row, 1));
    EXPECT_TRUE(torch::equal(one_context, context.narrow(0, row, 1))) << row;
  }
}

TEST(DecodeAttention, FallsBackForAutogradDoublesAndPrefill) {
  torch::manual_seed(0);
  auto keys = torch::randn({1, 2, 5, 8});
  auto queries = torch::randn({1, 2, 1, 8}, torch::requires_grad());
  EXPECT_FALSE(uses_decode_attention(queries, keys));  // training: autograd must see the products
  auto scores = attention_scores(queries, keys, 0.5);
  scores.sum().backward();
  // Sums of 5 values in two orders: equal within float32 rounding of their magnitude (not relative
  // to a sum that may come out near zero).
  EXPECT_TRUE(torch::allclose(queries.grad(), 0.5 * keys.sum(2, true).expand({1, 2, 1, 8}), 1e-5, 1e-5));
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(uses_decode_attention(torch::randn({1, 2, 1, 8}, torch::kFloat64), keys.to(torch::kFloat64)));
  EXPECT_FALSE(uses_decode_attention(torch::randn({1, 2, kDecodeAttentionMaxRows + 1, 8}), keys));  // prefill: BLAS
}
