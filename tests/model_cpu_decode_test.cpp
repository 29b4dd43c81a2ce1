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

// The logits of every step, stacked, and a copy of each layer's K and V storage.
void keep_steps_and_cache(const std::vector<torch::Tensor>& steps, const KVCache& cache, int64_t layers, Decoded& result) {
  result.logits = torch::stack(steps);
  for (int64_t layer = 0; layer < layers; ++layer) {
    result.caches.push_back(cache.key_storage(layer).clone());
    result.caches.push_back(cache.value_storage(layer).clone());
  }
}

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
    result.taken += uses_cpu_decode_layers(*model, model->embed(step), &cache, {});
    steps.push_back(model->logits(model->forward_ids(step, &cache).hidden.select(1, 0)));
  }
  keep_steps_and_cache(steps, cache, config.num_hidden_layers, result);
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
    EXPECT_FALSE(uses_cpu_decode_layers(*model, torch::randn({1, 1, config.hidden_size}), &cache, {}));
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
      // Several rows: gate|up fused in blocks gives the general path strided halves, which libtorch's
      // silu takes; the step takes the same halves to the same calls.
      EXPECT_EQ(fast.taken, 6);
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
      EXPECT_EQ(fast.taken, 6);
      EXPECT_TRUE(torch::equal(fast.logits, general.logits)) << (fast.logits - general.logits).abs().max().item<double>();
      for (size_t i = 0; i < fast.caches.size(); ++i) EXPECT_TRUE(torch::equal(fast.caches[i], general.caches[i])) << "cache " << i;
    }
  }
}

namespace {

// A server's slots (a per-row cache of 4 rows): rows 1-3 prefilled alone with prompts of 4, 6 and 3
// tokens, then decoded together, one position per row per step, each at its own column; the second
// sits out step 2 and the third's first 2 columns are hidden from step 3 on (a latent bottleneck),
// as the scheduler does. The logits of every row taking part, per step, and the cache storage.
Decoded decode_slots(Llama& model, bool decode_step) {
  torch::NoGradGuard no_grad;
  set_cpu_decode_layers(decode_step);
  const auto& config = model->config();
  const auto dtype = model->norm->weight.scalar_type();
  auto cache = KVCache::per_row(config, 4, 16, attention_dtype(dtype, torch::kCPU), torch::kCPU);
  torch::manual_seed(21);
  const std::vector<int64_t> prompt_lengths = {4, 6, 3};
  const int64_t rows = 3;
  std::vector<int64_t> lengths = prompt_lengths;
  Decoded result;
  std::vector<torch::Tensor> steps;
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t length = prompt_lengths[static_cast<size_t>(row)];
    cache.select_rows(1 + row, 1);
    const auto ids = torch::randint(0, config.vocab_size, {1, length});
    model->forward(model->embed(ids), torch::arange(length).view({1, length}), &cache, {});
  }
  for (int64_t step = 0; step < 6; ++step) {
    if (step == 3) cache.hide_row_prefix(3, 2);
    const std::vector<int64_t> takes_part = {1, step == 2 ? 0 : 1, 1};
    ForwardOptions options;
    options.attention_mask = torch::tensor(takes_part, torch::kInt64).view({rows, 1});
    cache.select_rows(1, rows);
    const auto x = model->embed(torch::randint(0, config.vocab_size, {rows, 1}));
    const auto positions = torch::tensor(lengths, torch::kInt64).view({rows, 1});
    result.taken += uses_cpu_decode_layers(*model, x, &cache, options);  // asked as the forward asks, after the mask
    auto logits = model->logits(model->forward(x, positions, &cache, options).hidden.select(1, 0));  // [B, V]
    for (int64_t row = 0; row < rows; ++row) {
      if (takes_part[static_cast<size_t>(row)] == 0) {
        logits[row].zero_();  // meaningless for a row sitting out
      } else {
        ++lengths[static_cast<size_t>(row)];
      }
    }
    steps.push_back(logits);
  }
  for (int64_t row = 0; row < rows; ++row) EXPECT_EQ(cache.row_length(1 + row), lengths[static_cast<size_t>(row)]);
  keep_steps_and_cache(steps, cache, config.num_hidden_layers, result);
  return result;
}

// Batched generation with left padding (a preallocated cache): row 1's first 3 positions are
// padding, so every decoded position attends under the forward's mask.
Decoded decode_padded(Llama& model, bool decode_step) {
  torch::NoGradGuard no_grad;
  set_cpu_decode_layers(decode_step);
  const auto& config = model->config();
  auto cache = KVCache::preallocated(config, 2, 16, attention_dtype(model->norm->weight.scalar_type(), torch::kCPU), torch::kCPU);
  torch::manual_seed(22);
  const auto ids = torch::randint(0, config.vocab_size, {2, 11});
  const auto prompt_mask = torch::tensor({1, 1, 1, 1, 1, 0, 0, 0, 1, 1}, torch::kInt64).view({2, 5});
  const auto prompt_positions = (prompt_mask.cumsum(1) - 1).clamp_min(0);  // [B, 5]
  ForwardOptions prompt;
  prompt.attention_mask = prompt_mask;
  Decoded result;
  std::vector<torch::Tensor> steps = {
      model->logits(model->forward(model->embed(ids.narrow(1, 0, 5)), prompt_positions, &cache, prompt).hidden.select(1, 4))};
  auto positions = prompt_positions.select(1, 4).view({2, 1}) + 1;  // [B, 1]
  for (int64_t t = 5; t < ids.size(1); ++t, positions = positions + 1) {
    ForwardOptions step;
    step.attention_mask = torch::ones({2, 1}, torch::kInt64);
    const auto x = model->embed(ids.narrow(1, t, 1));
    result.taken += uses_cpu_decode_layers(*model, x, &cache, step);
    steps.push_back(model->logits(model->forward(x, positions, &cache, step).hidden.select(1, 0)));
  }
  keep_steps_and_cache(steps, cache, config.num_hidden_layers, result);
  return result;
}

}  // namespace

// Rows of their own lengths, a row sitting a step out, hidden columns, left padding: the step adds
// the general path's mask to its scores and writes each row's own column, with the same bits.
TEST_F(CpuDecodeLayers, GiveTheGeneralPathsBitsOnPerRowAndPaddedCaches) {
  if (!has_decode_attention_kernels()) return;  // nothing takes it (the first test checks that)
  const auto config = decode_config();
  auto model = decode_model(config);
  auto bf16_config = decode_config(64, 32);
  bf16_config.attention_bias = bf16_config.mlp_bias = false;
  bf16_config.validate();
  auto bf16 = coconut::testing::tiny_model(bf16_config, 13);
  bf16->to(torch::kBFloat16);
  pack_for_inference(bf16);
  for (auto* tested : {&model, &bf16}) {
    SCOPED_TRACE(tested == &model ? "float32" : "bf16");
    const auto fast = decode_slots(*tested, true), general = decode_slots(*tested, false);
    EXPECT_EQ(fast.taken, 6);
    EXPECT_EQ(general.taken, 0);
    EXPECT_TRUE(torch::equal(fast.logits, general.logits)) << (fast.logits - general.logits).abs().max().item<double>();
    for (size_t i = 0; i < fast.caches.size(); ++i) EXPECT_TRUE(torch::equal(fast.caches[i], general.caches[i])) << "cache " << i;

    const auto padded = decode_padded(*tested, true), padded_general = decode_padded(*tested, false);
    EXPECT_EQ(padded.taken, 6);
    EXPECT_EQ(padded_general.taken, 0);
    EXPECT_TRUE(torch::equal(padded.logits, padded_general.logits))
        << (padded.logits - padded_general.logits).abs().max().item<double>();
    for (size_t i = 0; i < padded.caches.size(); ++i)
      EXPECT_TRUE(torch::equal(padded.caches[i], padded_general.caches[i])) << "cache " << i;
  }
}

TEST_F(CpuDecodeLayers, LeaveOtherCallsToTheGeneralPath) {
  if (!has_decode_attention_kernels()) return;  // nothing takes it (the test above checks that)
  const auto config = decode_config();
  auto model = decode_model(config);
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({1, 1, config.hidden_size});
  auto cache = KVCache::preallocated(config, 1, 4, torch::kFloat32, torch::kCPU);
  ASSERT_TRUE(uses_cpu_decode_layers(*model, x, &cache, {}));

  EXPECT_FALSE(uses_cpu_decode_layers(*model, x, nullptr, {}));
  EXPECT_FALSE(uses_cpu_decode_layers(*model, torch::randn({1, 2, config.hidden_size}), &cache, {}));
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x.to(torch::kFloat16), &cache, {}));
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x.to(torch::kBFloat16), &cache, {}));  // float32 weights
  EXPECT_FALSE(uses_cpu_decode_layers(*model, torch::randn({2, 1, config.hidden_size}), &cache, {}));  // cache of 1 row
  {
    torch::AutoGradMode recording(true);
    EXPECT_FALSE(uses_cpu_decode_layers(*model, x, &cache, {}));
  }
  auto fixed = KVCache::fixed(config, 1, 4, torch::kFloat32, torch::kCPU);
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x, &fixed, {}));
  auto full = KVCache::preallocated(config, 1, 1, torch::kFloat32, torch::kCPU);
  full.append_key_mask(torch::ones({1, 1}, torch::kBool));
  full.advance(1);
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x, &full, {}));  // the general path reports the full cache

  ForwardOptions head_mask;
  head_mask.head_mask = torch::ones({config.num_hidden_layers, config.max_heads()});
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x, &cache, head_mask));
  ForwardOptions skip;
  skip.skip_layers = {1};
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x, &cache, skip));
  ForwardOptions early_exit;
  early_exit.depth.exit_threshold = 0.1;
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x, &cache, early_exit));
  ForwardOptions shallow;
  shallow.end_layer = 2;
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x, &cache, shallow));

  set_cpu_decode_layers(false);
  EXPECT_FALSE(uses_cpu_decode_layers(*model, x, &cache, {}));
  set_cpu_decode_layers(true);

  auto with_biases = decode_model(config);  // bf16 with biases: the general path adds them in two orders
  with_biases->to(torch::kBFloat16);
  EXPECT_FALSE(uses_cpu_decode_layers(*with_biases, x.to(torch::kBFloat16), &cache, {}));
  auto adapted = decode_model(config);
  LoraOptions lora;
  attach_lora(adapted, lora, 3);
  EXPECT_FALSE(uses_cpu_decode_layers(*adapted, x, &cache, {}));
}
