// The per-row KV cache (continuous batching): rows that are independent sequences of different
// lengths, prefilled one at a time and decoded together, give what each sequence gives alone with
// an ordinary cache: the same hidden states (to float32 reordering) and the same greedy tokens. A
// row sitting a call out is left untouched. The per-row router settings (thresholds, layer caps)
// route each row as the scalar settings route it alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "model/kv_cache.h"
#include "model/llama.h"
#include "support/tiny_model.h"

using namespace coconut;

namespace {

// Greedy decoding of one prompt with an ordinary preallocated cache: the new tokens.
std::vector<int64_t> decode_alone(Llama& model, const std::vector<int64_t>& prompt, int64_t steps) {
  auto cache = KVCache::preallocated(model->config(), 1, 64, torch::kFloat32, torch::kCPU);
  auto hidden = model->forward_ids(torch::tensor(prompt, torch::kInt64).view({1, -1}), &cache).hidden;  // [1, P, D]
  std::vector<int64_t> tokens;
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t next = model->logits(hidden.select(1, hidden.size(1) - 1)).argmax(-1).item<int64_t>();
    tokens.push_back(next);
    hidden = model->forward_ids(torch::tensor({next}, torch::kInt64).view({1, 1}), &cache).hidden;  // [1, 1, D]
  }
  return tokens;
}

// One prompt into row `row` of a per-row cache; returns its last hidden state [1, D].
torch::Tensor prefill_row(Llama& model, KVCache& cache, int64_t row, const std::vector<int64_t>& prompt) {
  const auto length = static_cast<int64_t>(prompt.size());
  cache.reset_row(row);
  cache.select_rows(row, 1);
  auto positions = torch::arange(length, torch::kInt64).view({1, length});
  auto hidden = model->forward(model->embed(torch::tensor(prompt, torch::kInt64).view({1, length})), positions, &cache).hidden;
  return hidden.select(1, length - 1);
}

}  // namespace

TEST(PerRowCache, RowsJoiningAtDifferentStepsDecodeAsAlone) {
  torch::NoGradGuard no_grad;
  const auto config = coconut::testing::tiny_config();
  auto model = coconut::testing::tiny_model(config);
  const std::vector<std::vector<int64_t>> prompts = {{1, 5, 3, 9, 0}, {7, 2}, {4, 4, 8, 1, 6, 3, 10}};
  const std::vector<int64_t> joins_at = {0, 2, 3};  // the decode step at which each row is prefilled
  const int64_t steps = 8;
  const int64_t rows = static_cast<int64_t>(prompts.size());

  auto cache = KVCache::per_row(config, rows, 64, torch::kFloat32, torch::kCPU);
  std::vector<std::vector<int64_t>> tokens(prompts.size());
  std::vector<torch::Tensor> last_hidden(prompts.size());  // [1, D] per row
  for (int64_t step = 0; step < steps + 3; ++step) {
    for (int64_t row = 0; row < rows; ++row)
      if (joins_at[row] == step) last_hidden[row] = prefill_row(model, cache, row, prompts[row]);
    // Each active row picks its next token, then all active rows run one position together.
    std::vector<int64_t> next(rows, 0), mask(rows, 0), positions(rows, 0);
    for (int64_t row = 0; row < rows; ++row) {
      if (!last_hidden[row].defined() || static_cast<int64_t>(tokens[row].size()) == steps) continue;
      next[row] = model->logits(last_hidden[row]).argmax(-1).item<int64_t>();
      tokens[row].push_back(next[row]);
      mask[row] = 1;
      positions[row] = cache.row_length(row);
    }
    if (std::count(mask.begin(), mask.end(), 1) == 0) continue;
    cache.select_rows(0, rows);
    ForwardOptions options;
    options.attention_mask = torch::tensor(mask, torch::kInt64).view({rows, 1});
    const auto before = cache.row_length(0);
    auto hidden = model->forward(model->embed(torch::tensor(next, torch::kInt64).view({rows, 1})),
                                 torch::tensor(positions, torch::kInt64).view({rows, 1}), &cache, options).hidden;  // [B, 1, D]
    for (int64_t row = 0; row < rows; ++row)
      if (mask[row] == 1) last_hidden[row] = hidden.select(1, 0).narrow(0, row, 1);
    if (mask[0] == 0) {
      EXPECT_EQ(cache.row_length(0), before) << "a row sitting the call out keeps its length";
    }
  }
  for (int64_t row = 0; row < rows; ++row) {
    EXPECT_EQ(tokens[row], decode_alone(model, prompts[row], steps)) << "row " << row;
    EXPECT_EQ(cache.row_length(row), static_cast<int64_t>(prompts[row].size()) + steps) << "row " << row;
  }
}

TEST(PerRowCache, BatchedStepEqualsEachRowAloneToFloatReordering) {
  torch::NoGradGuard no_grad;
  const auto config = coconut::testing::tiny_config();
  auto model = coconut::testing::tiny_model(config, 3);
  const std::vector<std::vector<int64_t>> prompts = {{1, 5, 3}, {7, 2, 9, 9, 9, 1}};
  auto cache = KVCache::per_row(config, 2, 16, torch::kFloat32, torch::kCPU);
  for (int64_t row = 0; row < 2; ++row) prefill_row(model, cache, row, prompts[static_cast<size_t>(row)]);
  cache.select_rows(0, 2);
  auto next = torch::tensor({6, 3}, torch::kInt64).view({2, 1});
  auto positions = torch::tensor({3, 6}, torch::kInt64).view({2, 1});
  const auto batched = model->forward(model->embed(next), positions, &cache).hidden;  // [2, 1, D]
  for (int64_t row = 0; row < 2; ++row) {
    auto prompt = prompts[static_cast<size_t>(row)];
    prompt.push_back(next[row][0].item<int64_t>());
    const auto full = model->forward_ids(torch::tensor(prompt, torch::kInt64).view({1, -1})).hidden;  // [1, P + 1, D]
    // Same float32 arithmetic in another order (one column against the whole sequence): 1e-5.
    EXPECT_LT((batched.narrow(0, row, 1).select(1, 0) - full.select(1, full.size(1) - 1)).abs().max().item<double>(), 1e-5)
        << "row " << row;
  }
}

TEST(PerRowCache, RefusesMixedPaddingAndOverflow) {
  torch::NoGradGuard no_grad;
  const auto config = coconut::testing::tiny_config();
  auto model = coconut::testing::tiny_model(config);
  auto cache = KVCache::per_row(config, 2, 4, torch::kFloat32, torch::kCPU);
  cache.select_rows(0, 1);
  ForwardOptions half_padded;
  half_padded.attention_mask = torch::tensor({0, 1}, torch::kInt64).view({1, 2});
  auto two = torch::tensor({1, 2}, torch::kInt64).view({1, 2});
  auto positions = torch::arange(2, torch::kInt64).view({1, 2});
  EXPECT_THROW(model->forward(model->embed(two), positions, &cache, half_padded), std::exception);
  auto five = torch::ones({1, 5}, torch::kInt64);
  EXPECT_THROW(model->forward(model->embed(five), torch::arange(5, torch::kInt64).view({1, 5}), &cache), std::exception);
  EXPECT_THROW(cache.select_rows(1, 2), std::out_of_range);
  EXPECT_THROW(cache.length(), std::logic_error);
}

TEST(PerRowCache, PerRowRouterThresholdsAndLayerCapsRouteEachRowAsAlone) {
  torch::NoGradGuard no_grad;
  auto config = coconut::testing::tiny_config();
  config.num_hidden_layers = 4;
  config.depth_router = true;
  config.validate();
  auto model = coconut::testing::tiny_model(config, 11);
  const auto prompts = torch::tensor({{1, 4, 3, 7}, {5, 2, 8, 1}, {9, 9, 3, 6}}, torch::kInt64);
  const auto next = torch::tensor({{6}, {3}, {7}}, torch::kInt64);
  const std::vector<double> thresholds = {0.0, 0.5, 0.9};
  const std::vector<int64_t> caps = {2, 4, 4};
  const auto prefilled = [&](const torch::Tensor& ids) {
    auto cache = KVCache::preallocated(config, ids.size(0), 16, torch::kFloat32, torch::kCPU);
    ForwardOptions every_layer;
    every_layer.depth = DepthPolicy::every_layer();
    model->forward_ids(ids, &cache, every_layer);
    return cache;
  };
  auto batch_cache = prefilled(prompts);
  ForwardOptions per_row;
  per_row.router_thresholds = torch::tensor(thresholds, torch::kFloat64);
  per_row.router_max_layers = torch::tensor(caps, torch::kInt64);
  const auto batch = model->forward_ids(next, &batch_cache, per_row);
  for (int64_t row = 0; row < 3; ++row) {
    auto cache = prefilled(prompts.narrow(0, row, 1));
    ForwardOptions alone_options;
    alone_options.depth.router_threshold = thresholds[static_cast<size_t>(row)];
    const auto alone = model->forward_ids(next.narrow(0, row, 1), &cache, alone_options);
    const int64_t alone_layers = alone.layers_run.defined() ? alone.layers_run[0].item<int64_t>() : config.num_hidden_layers;
    const int64_t cap = caps[static_cast<size_t>(row)];
    EXPECT_LE(batch.layers_run[row].item<int64_t>(), cap) << "row " << row;
    if (alone_layers <= cap) {  // the cap does not bind: exactly the scalar threshold's route
      EXPECT_EQ(batch.layers_run[row].item<int64_t>(), alone_layers) << "row " << row;
      EXPECT_TRUE(torch::allclose(batch.hidden.narrow(0, row, 1), alone.hidden, 1e-5, 1e-6)) << "row " << row;
    }
  }
  EXPECT_EQ(batch.layers_run[0].item<int64_t>(), 2) << "threshold 0 opens every gate; the cap keeps the first 2 layers";
}

// Two ways of writing a step into the per-row cache: memcpy on the CPU without autograd, index_put_
// otherwise (GPUs, or inputs that need gradients). Both write the same values in the same places,
// with a row sitting the call out and two new columns per row.
TEST(PerRowCache, CopyAndIndexPutWriteTheSameColumns) {
  const auto config = coconut::testing::tiny_config();
  const int64_t groups = config.kv_heads(0), head_dim = config.head_dim;
  torch::manual_seed(4);
  auto k = torch::randn({3, groups, 2, head_dim}), v = torch::randn({3, groups, 2, head_dim});  // [B, G, T, Dh]
  std::vector<std::pair<torch::Tensor, torch::Tensor>> written;
  for (bool with_grad : {false, true}) {
    auto cache = KVCache::per_row(config, 4, 8, torch::kFloat32, torch::kCPU);
    cache.select_rows(2, 1);  // row 2 first holds three columns
    cache.append_key_mask(torch::ones({1, 3}, torch::kInt64));
    cache.append(0, torch::zeros({1, groups, 3, head_dim}), torch::zeros({1, groups, 3, head_dim}));
    cache.advance(3);
    cache.select_rows(1, 3);  // rows 1-3; row 3 (batch row 2) sits out
    cache.append_key_mask(torch::tensor({1, 1, 1, 1, 0, 0}, torch::kInt64).view({3, 2}));
    auto keys = with_grad ? k.clone().requires_grad_() : k, values = with_grad ? v.clone().requires_grad_() : v;
    auto [cached_keys, cached_values] = cache.append(0, keys, values);  // [3, G, 5, Dh]
    written.emplace_back(cached_keys.detach().clone(), cached_values.detach().clone());
  }
  EXPECT_TRUE(torch::equal(written[0].first, written[1].first));
  EXPECT_TRUE(torch::equal(written[0].second, written[1].second));
  // Row 1 holds its two new columns at 0-1, row 2 at 3-4 after its three, row 3 nothing.
  EXPECT_TRUE(torch::equal(written[0].first[0].narrow(1, 0, 2), k[0]));
  EXPECT_TRUE(torch::equal(written[0].second[1].narrow(1, 3, 2), v[1]));
  EXPECT_TRUE(torch::equal(written[0].first[2], torch::zeros_like(written[0].first[2])));
}
