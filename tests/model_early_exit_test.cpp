// Early exit (ForwardOptions::exit_threshold): a position that stops after layer m has the hidden
// state of the model without the later layers, and the later layers still get its K/V columns,
// computed from the exit state; the reference for both is a model whose later layers are made
// identities (o_proj and down_proj zeroed) and run in full. A batch gives each row what it gets alone.
#include <gtest/gtest.h>

#include "model/kv_cache.h"
#include "model/llama.h"
#include "support/tiny_model.h"

using namespace coconut;

namespace {

LlamaConfig four_layers() {
  auto config = coconut::testing::tiny_config();
  config.num_hidden_layers = 4;
  config.validate();
  return config;
}

// Prompt of 5 tokens, then one position from `embedding` with the given options.
struct Step {
  ForwardResult result;
  KVCache cache;
};
Step prompt_then_step(Llama& model, const torch::Tensor& prompt, const torch::Tensor& embedding, const ForwardOptions& options) {
  auto cache = KVCache::preallocated(model->config(), prompt.size(0), 16, torch::kFloat32, torch::kCPU);
  model->forward_ids(prompt, &cache);
  auto positions = torch::full({prompt.size(0), 1}, prompt.size(1), torch::kInt64);
  auto result = model->forward(embedding, positions, &cache, options);
  return {result, std::move(cache)};
}

}  // namespace

TEST(EarlyExit, StoppedPositionEqualsLaterLayersMadeIdentityKeysAndValuesIncluded) {
  torch::NoGradGuard no_grad;
  const auto config = four_layers();
  auto model = coconut::testing::tiny_model(config);
  auto reference = coconut::testing::tiny_model(config);
  for (int64_t layer = 2; layer < 4; ++layer) {  // layers 2, 3: x + 0 + 0, but K/V from their input
    auto decoder = reference->layers[layer]->as<coconut::DecoderLayerImpl>();
    decoder->self_attn->o_proj->weight.zero_();
    decoder->mlp->down_proj->weight.zero_();
  }
  const auto prompt = torch::tensor({{1, 4, 3, 7, 5}}, torch::kInt64);
  const auto embedding = model->embed(torch::tensor({{6}}, torch::kInt64));

  ForwardOptions exit_after_two;
  exit_after_two.depth.exit_threshold = 2.0;  // every angular distance is below 1: stop as early as allowed
  exit_after_two.depth.exit_min_layers = 2;
  // The reference's prompt must see the real layers 2, 3: prefill with `model`, copy nothing —
  // compare only the step's own column, which depends on the prompt through attention at layers 0, 1.
  auto exited = prompt_then_step(model, prompt, embedding, exit_after_two);
  auto full_reference = prompt_then_step(reference, prompt, embedding, {});
  EXPECT_EQ(exited.result.layers_run.item<int64_t>(), 2);
  EXPECT_TRUE(torch::allclose(exited.result.hidden, full_reference.result.hidden, 1e-5, 1e-6));
  for (int64_t layer = 0; layer < 4; ++layer) {
    const auto [k, v] = exited.cache.columns(layer);
    const auto [k_ref, v_ref] = full_reference.cache.columns(layer);
    const int64_t step = k.size(2) - 1;
    EXPECT_TRUE(torch::allclose(k.narrow(2, step, 1), k_ref.narrow(2, step, 1), 1e-5, 1e-6)) << "layer " << layer;
    EXPECT_TRUE(torch::allclose(v.narrow(2, step, 1), v_ref.narrow(2, step, 1), 1e-5, 1e-6)) << "layer " << layer;
  }
  // Off (threshold 0, whatever the minimum) is the ordinary forward: the reference model's, which
  // the exited step differs from (so this comparison can fail).
  ForwardOptions off_options;
  off_options.depth.exit_threshold = 0.0;
  off_options.depth.exit_min_layers = 2;
  auto off = prompt_then_step(model, prompt, embedding, off_options);
  auto plain = prompt_then_step(model, prompt, embedding, {});
  EXPECT_FALSE(off.result.layers_run.defined());
  EXPECT_TRUE(torch::equal(plain.result.hidden, off.result.hidden));
  EXPECT_FALSE(torch::allclose(off.result.hidden, exited.result.hidden, 1e-3, 1e-4));
}

TEST(EarlyExit, EachRowOfABatchGetsWhatItGetsAlone) {
  torch::NoGradGuard no_grad;
  const auto config = four_layers();
  auto model = coconut::testing::tiny_model(config);
  const auto prompts = torch::tensor({{1, 4, 3, 7, 5}, {2, 9, 8, 1, 3}, {6, 6, 0, 4, 10}}, torch::kInt64);
  const auto embeddings = model->embed(torch::tensor({{6}, {3}, {9}}, torch::kInt64));
  bool rows_differ = false;
  for (double threshold : {0.05, 0.1, 0.2, 0.3, 0.45}) {
    ForwardOptions options;
    options.depth.exit_threshold = threshold;
    auto batch = prompt_then_step(model, prompts, embeddings, options);
    for (int64_t row = 0; row < 3; ++row) {
      auto alone = prompt_then_step(model, prompts.narrow(0, row, 1), embeddings.narrow(0, row, 1), options);
      EXPECT_EQ(batch.result.layers_run[row].item<int64_t>(), alone.result.layers_run[0].item<int64_t>())
          << "threshold " << threshold << " row " << row;
      EXPECT_TRUE(torch::allclose(batch.result.hidden.narrow(0, row, 1), alone.result.hidden, 1e-5, 1e-6));
      for (int64_t layer = 0; layer < 4; ++layer)
        EXPECT_TRUE(torch::allclose(batch.cache.columns(layer).first.narrow(0, row, 1), alone.cache.columns(layer).first,
                                    1e-5, 1e-6));
    }
    rows_differ |= batch.result.layers_run.min().item<int64_t>() != batch.result.layers_run.max().item<int64_t>();
  }
  EXPECT_TRUE(rows_differ) << "no threshold made rows stop at different layers: the test checks nothing per row";
}
