// The decode step over memory (model/cpu_decode.h) against the general forward: the same bits in
// the logits and in the KV cache it writes, on a model whose layers differ in heads and MLP width,
// with biases, one row and several; and the calls it must leave to the general path.
#include <gtest/gtest.h>

#include <vector>

#include "model/cpu_attention.h"
#include "model/cpu_decode.h"
#include "model/cpu_product_choice.h"
#include "model/llama.h"
#include "model/lora.h"
#include "support/tiny_model.h"

using namespace coconut;

namespace {

// Head width 16 and an MLP width past a multiple of 16 (72): the kernels' vector loops and their
// tails both run; the middle layer is pruned to 4 query heads and 40 MLP channels.
LlamaConfig decode_config() {
  LlamaConfig config;
  config.hidden_size = 96;
  config.intermediate_size = 72;
  config.num_hidden_layers = 3;
  config.num_attention_heads = 6;
  config.num_key_value_heads = 2;
  config.layer_num_attention_heads = {6, 4, 6};
  config.layer_num_key_value_heads = {2, 2, 2};
  config.layer_intermediate_size = {72, 40, 72};
  config.vocab_size = 50;
  config.max_position_embeddings = 64;
  config.rms_norm_eps = 1e-5;
  config.attention_bias = true;
  config.mlp_bias = true;
  config.validate();
  return config;
}

Llama decode_model(const LlamaConfig& config) {
  auto model = coconut::testing::tiny_model(config, 11);
  {
    torch::NoGradGuard no_grad;
    for (auto& named : model->named_parameters())
      if (named.key().find(".bias") != std::string::npos) named.value().normal_(0.0, 0.3);
  }
  pack_for_inference(model);
  return model;
}

// Every product on the hand-written kernels, as the decode step needs, whatever this host measured.
class CpuDecodeLayers : public ::testing::Test {
 protected:
  void SetUp() override { configure_product_choices({ProductPolicy::kTiles, ""}); }
  void TearDown() override {
    set_cpu_decode_layers(true);
    configure_product_choices(product_choice_settings_from_environment());
  }
};

struct Decoded {
  torch::Tensor logits;               // [steps, B, V]
  std::vector<torch::Tensor> caches;  // each layer's K and V storage
  int taken = 0;                      // steps the decode step took
};

// A 4-token prompt, then one token at a time for the rest of `ids` [B, T].
Decoded decode(Llama& model, const torch::Tensor& ids, bool decode_step) {
  torch::NoGradGuard no_grad;
  set_cpu_decode_layers(decode_step);
  const auto& config = model->config();
  Decoded result;
  auto cache = KVCache::preallocated(config, ids.size(0), 16, torch::kFloat32, torch::kCPU);
  std::vector<torch::Tensor> steps = {model->logits(model->forward_ids(ids.narrow(1, 0, 4), &cache).hidden.select(1, 3))};
  for (int64_t t = 4; t < ids.size(1); ++t) {
    const auto step = ids.narrow(1, t, 1);
    result.taken += uses_cpu_decode_layers(*model, model->embed(step), &cache, {}, false);
    steps.push_back(model->logits(model->forward_ids(step, &cache).hidden.select(1, 0)));
  }
  result.logits = torch::stack(steps);
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    result.caches.push_back(cache.key_storage(layer).clone());
    result.caches.push_back(cache.value_storage(layer).clone());
  }
  return result;
}

}  // namespace

TEST_F(CpuDecodeLayers, GiveTheGeneralPathsBitsAndCache) {
  const auto config = decode_config();
  auto model = decode_model(config);
  if (!has_decode_attention_kernels()) {  // no AVX-512: every call takes the general path
    auto cache = KVCache::preallocated(config, 1, 4, torch::kFloat32, torch::kCPU);
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(uses_cpu_decode_layers(*model, torch::randn({1, 1, config.hidden_size}), &cache, {}, false));
    return;
  }
  for (int64_t rows : {1, 3}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    torch::manual_seed(rows);
    const auto ids = torch::randint(0, config.vocab_size, {rows, 10});
    const auto fast = decode(model, ids, true), general = decode(model, ids, false);
    EXPECT_EQ(fast.taken, 6);
    EXPECT_EQ(general.taken, 0);
    EXPECT_TRUE(torch::equal(fast.logits, general.logits)) << (fast.logits - general.logits).abs().max().item<double>();
    ASSERT_EQ(fast.caches.size(), general.caches.size());
    for (size_t i = 0; i < fast.caches.size(); ++i) EXPECT_TRUE(torch::equal(fast.caches[i], general.caches[i])) << "cache " << i;
  }
}

TEST_F(CpuDecodeLayers, LeaveOtherCallsToTheGeneralPath) {
  if (!has_decode_attention_kernels()) return;  // nothing takes it (the test above checks that)
  const auto config = decode_config();
  auto model = decode_model(config);
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({1, 1, config.hidden_size});
  auto cache = KVCache::preallocated(config, 1, 4, torch::kFloat32, torch::kCPU);
  ASSERT_TRUE(uses_cpu_decode_layers(*model, x, &cache, {}, false));

  EXPECT_FALSE(uses_cpu_decode_layers(*model, x, &cache, {}, /*masked=*/true));
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x, nullptr, {}, false));
  EXPECT_FALSE(uses_cpu_decode_layers(*model, torch::randn({1, 2, config.hidden_size}), &cache, {}, false));
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x.to(torch::kBFloat16), &cache, {}, false));
  EXPECT_FALSE(uses_cpu_decode_layers(*model, torch::randn({2, 1, config.hidden_size}), &cache, {}, false));  // cache of 1 row
  {
    torch::AutoGradMode recording(true);
    EXPECT_FALSE(uses_cpu_decode_layers(*model, x, &cache, {}, false));
  }
  auto fixed = KVCache::fixed(config, 1, 4, torch::kFloat32, torch::kCPU);
  auto per_row = KVCache::per_row(config, 1, 4, torch::kFloat32, torch::kCPU);
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x, &fixed, {}, false));
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x, &per_row, {}, false));
  auto full = KVCache::preallocated(config, 1, 1, torch::kFloat32, torch::kCPU);
  full.append_key_mask(torch::ones({1, 1}, torch::kBool));
  full.advance(1);
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x, &full, {}, false));  // the general path reports the full cache

  ForwardOptions head_mask;
  head_mask.head_mask = torch::ones({config.num_hidden_layers, config.max_heads()});
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x, &cache, head_mask, false));
  ForwardOptions skip;
  skip.skip_layers = {1};
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x, &cache, skip, false));
  ForwardOptions early_exit;
  early_exit.depth.exit_threshold = 0.1;
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x, &cache, early_exit, false));
  ForwardOptions shallow;
  shallow.end_layer = 2;
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x, &cache, shallow, false));

  set_cpu_decode_layers(false);
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x, &cache, {}, false));
  set_cpu_decode_layers(true);

  // A layer whose q|k|v no longer lie packed, and then adapters.
  auto& last = *model->layers[2]->as<DecoderLayer>();
  last.self_attn->v_proj->weight.set_data(last.self_attn->v_proj->weight.clone());
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x, &cache, {}, false));
  auto adapted = decode_model(config);
  LoraOptions lora;
  attach_lora(adapted, lora, 3);
  EXPECT_FALSE(uses_cpu_decode_layers(*adapted, x, &cache, {}, false));
}
