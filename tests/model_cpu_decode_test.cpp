// The decode step over memory (model/cpu_decode.h) against the general forward: the same bits in
// the logits and in the KV cache it writes, on a model whose layers differ in heads and MLP width,
// with biases, one row and several; on quantized weights (Q8_0 and Q4_1 fused, a GGUF file's mix of
// k-quants in separate products); and the calls it must leave to the general path.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "model/cpu_attention.h"
#include "model/cpu_decode.h"
#include "model/cpu_product_choice.h"
#include "model/llama.h"
#include "model/lora.h"
#include "model/quantize_model.h"
#include "support/random_blocks.h"
#include "support/tiny_model.h"

using namespace coconut;

namespace {

// Head width 16 and an MLP width past a multiple of 16 (72): the kernels' vector loops and their
// tails both run; the middle layer is pruned to 4 query heads and 40 MLP channels.
// (Quantized weights take widths of a multiple of 32: `inner` 64, the middle layer 32.)
LlamaConfig decode_config(int64_t inner = 72, int64_t pruned_inner = 40) {
  LlamaConfig config;
  config.hidden_size = 96;
  config.intermediate_size = inner;
  config.num_hidden_layers = 3;
  config.num_attention_heads = 6;
  config.num_key_value_heads = 2;
  config.layer_num_attention_heads = {6, 4, 6};
  config.layer_num_key_value_heads = {2, 2, 2};
  config.layer_intermediate_size = {inner, pruned_inner, inner};
  config.vocab_size = 50;
  config.max_position_embeddings = 64;
  config.rms_norm_eps = 1e-5;
  config.attention_bias = true;
  config.mlp_bias = true;
  config.validate();
  return config;
}

Llama decode_model(const LlamaConfig& config, bool pack = true) {
  auto model = coconut::testing::tiny_model(config, 11);
  {
    torch::NoGradGuard no_grad;
    for (auto& named : model->named_parameters())
      if (named.key().find(".bias") != std::string::npos) named.value().normal_(0.0, 0.3);
  }
  if (pack) pack_for_inference(model);
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
  auto cache = KVCache::preallocated(config, ids.size(0), 16, attention_dtype(model->norm->weight.scalar_type(), torch::kCPU),
                                     torch::kCPU);
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
  auto unpacked = decode_model(config, /*pack=*/false);  // q, k, v, gate and up as products of their own
  if (!has_decode_attention_kernels()) {  // no AVX-512: every call takes the general path
    auto cache = KVCache::preallocated(config, 1, 4, torch::kFloat32, torch::kCPU);
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(uses_cpu_decode_layers(*model, torch::randn({1, 1, config.hidden_size}), &cache, {}, false));
    return;
  }
  for (auto* tested : {&model, &unpacked}) {
    SCOPED_TRACE(tested == &model ? "packed" : "unpacked");
    for (int64_t rows : {1, 3}) {
      SCOPED_TRACE("rows " + std::to_string(rows));
      torch::manual_seed(rows);
      const auto ids = torch::randint(0, config.vocab_size, {rows, 10});
      const auto fast = decode(*tested, ids, true), general = decode(*tested, ids, false);
      EXPECT_EQ(fast.taken, 6);
      EXPECT_EQ(general.taken, 0);
      EXPECT_TRUE(torch::equal(fast.logits, general.logits)) << (fast.logits - general.logits).abs().max().item<double>();
      ASSERT_EQ(fast.caches.size(), general.caches.size());
      for (size_t i = 0; i < fast.caches.size(); ++i) EXPECT_TRUE(torch::equal(fast.caches[i], general.caches[i])) << "cache " << i;
    }
  }
}

TEST_F(CpuDecodeLayers, GiveTheGeneralPathsBitsOnQuantizedWeights) {
  if (!has_decode_attention_kernels()) return;  // nothing takes it (the test above checks that)
  const auto config = decode_config(64, 32);
  for (auto format : {WeightFormat::kQ8_0, WeightFormat::kQ4_1}) {
    SCOPED_TRACE(weight_format_name(format));
    auto model = with_quantized_weights(decode_model(config), format);
    ASSERT_TRUE(model->layers[0]->as<DecoderLayer>()->self_attn->qkv_quantized.defined());
    for (int64_t rows : {1, 3}) {
      SCOPED_TRACE("rows " + std::to_string(rows));
      torch::manual_seed(rows);
      const auto ids = torch::randint(0, config.vocab_size, {rows, 10});
      const auto fast = decode(model, ids, true), general = decode(model, ids, false);
      // Several rows: gate|up fused in blocks gives the general path strided halves, which libtorch's silu takes.
      EXPECT_EQ(fast.taken, rows == 1 ? 6 : 0);
      EXPECT_TRUE(torch::equal(fast.logits, general.logits)) << (fast.logits - general.logits).abs().max().item<double>();
      for (size_t i = 0; i < fast.caches.size(); ++i) EXPECT_TRUE(torch::equal(fast.caches[i], general.caches[i])) << "cache " << i;
    }
  }

  // A GGUF file's mix: q and k in Q4_K, v in Q6_K (three products), o in Q5_K, gate|up in Q4_K (one),
  // down in Q6_K; widths of a multiple of 256.
  LlamaConfig wide;
  wide.hidden_size = 256;
  wide.intermediate_size = 256;
  wide.num_hidden_layers = 2;
  wide.num_attention_heads = 4;
  wide.num_key_value_heads = 2;
  wide.vocab_size = 40;
  wide.max_position_embeddings = 64;
  wide.validate();
  auto dense = decode_model(wide);
  std::map<std::string, FileBlocks> blocks;
  uint64_t seed = 1;
  for (int64_t layer = 0; layer < wide.num_hidden_layers; ++layer) {
    const std::string prefix = "layers." + std::to_string(layer) + ".";
    const auto add = [&](const std::string& name, WeightFormat format, int64_t rows, int64_t columns) {
      blocks[prefix + name] = {format, coconut::testing::random_rows(format, rows, columns, seed++)};
    };
    add("self_attn.q_proj.weight", WeightFormat::kQ4_K, 256, 256);
    add("self_attn.k_proj.weight", WeightFormat::kQ4_K, 128, 256);
    add("self_attn.v_proj.weight", WeightFormat::kQ6_K, 128, 256);
    add("self_attn.o_proj.weight", WeightFormat::kQ5_K, 256, 256);
    add("mlp.gate_proj.weight", WeightFormat::kQ4_K, 256, 256);
    add("mlp.up_proj.weight", WeightFormat::kQ4_K, 256, 256);
    add("mlp.down_proj.weight", WeightFormat::kQ6_K, 256, 256);
  }
  auto mixed = with_file_blocks(dense, blocks);
  const auto& first = *mixed->layers[0]->as<DecoderLayer>();
  ASSERT_FALSE(first.self_attn->qkv_quantized.defined());
  ASSERT_TRUE(first.mlp->gate_up_quantized.defined());
  torch::manual_seed(5);
  const auto ids = torch::randint(0, wide.vocab_size, {1, 10});
  const auto fast = decode(mixed, ids, true), general = decode(mixed, ids, false);
  EXPECT_EQ(fast.taken, 6);
  EXPECT_TRUE(torch::equal(fast.logits, general.logits)) << (fast.logits - general.logits).abs().max().item<double>();
  for (size_t i = 0; i < fast.caches.size(); ++i) EXPECT_TRUE(torch::equal(fast.caches[i], general.caches[i])) << "cache " << i;
}

// bf16 activations round where the general path rounds: each product's sums, RoPE's products, the
// attention's output, the residual sums, libtorch's silu and product for SwiGLU.
TEST_F(CpuDecodeLayers, GiveTheGeneralPathsBitsInBFloat16) {
  if (!has_decode_attention_kernels()) return;  // nothing takes it (the test above checks that)
  auto config = decode_config(64, 32);
  config.attention_bias = config.mlp_bias = false;  // a bf16 model with biases is left to the general path
  config.validate();
  auto dense = coconut::testing::tiny_model(config, 13);
  dense->to(torch::kBFloat16);
  auto quantized = with_quantized_weights(dense, WeightFormat::kQ8_0);
  auto unpacked = coconut::testing::tiny_model(config, 13);
  unpacked->to(torch::kBFloat16);
  pack_for_inference(dense);
  for (auto* tested : {&dense, &unpacked, &quantized}) {
    SCOPED_TRACE(tested == &dense ? "packed" : tested == &unpacked ? "unpacked" : "Q8_0");
    for (int64_t rows : {1, 3}) {
      SCOPED_TRACE("rows " + std::to_string(rows));
      torch::manual_seed(rows);
      const auto ids = torch::randint(0, config.vocab_size, {rows, 10});
      const auto fast = decode(*tested, ids, true), general = decode(*tested, ids, false);
      EXPECT_EQ(fast.taken, tested == &quantized && rows > 1 ? 0 : 6);
      EXPECT_TRUE(torch::equal(fast.logits, general.logits)) << (fast.logits - general.logits).abs().max().item<double>();
      for (size_t i = 0; i < fast.caches.size(); ++i) EXPECT_TRUE(torch::equal(fast.caches[i], general.caches[i])) << "cache " << i;
    }
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
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x.to(torch::kFloat16), &cache, {}, false));
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x.to(torch::kBFloat16), &cache, {}, false));  // float32 weights
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

  auto with_biases = decode_model(config);  // bf16 with biases: the general path adds them in two orders
  with_biases->to(torch::kBFloat16);
  EXPECT_FALSE(uses_cpu_decode_layers(*with_biases, x.to(torch::kBFloat16), &cache, {}, false));
  auto adapted = decode_model(config);
  LoraOptions lora;
  attach_lora(adapted, lora, 3);
  EXPECT_FALSE(uses_cpu_decode_layers(*adapted, x, &cache, {}, false));
}
