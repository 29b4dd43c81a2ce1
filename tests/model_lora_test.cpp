// LoRA adapters: a fresh adapter leaves the model unchanged; with trained (here: random) adapters
// the forward equals a plain model whose weights are W + (alpha/r) B A computed by naive loops;
// merge_lora builds exactly that model; only adapters train; adapter state round-trips.
#include <gtest/gtest.h>

#include "model/lora.h"
#include "support/tiny_model.h"

using namespace coconut;
using coconut::testing::tiny_config;
using coconut::testing::tiny_model;
using coconut::testing::randomize_adapters;

namespace {

torch::Tensor sample_ids() { return torch::tensor({3, 1, 4, 1, 5, 9, 2, 6}, torch::kInt64).view({2, 4}); }

torch::Tensor logits_of(Llama& model) {
  torch::NoGradGuard no_grad;
  return model->logits(model->forward_ids(sample_ids()).hidden);
}

}  // namespace

TEST(Lora, FreshAdaptersLeaveTheModelUnchanged) {
  auto model = tiny_model(tiny_config());
  const auto before = logits_of(model);
  attach_lora(model, {}, 1);
  EXPECT_TRUE(has_lora(model));
  EXPECT_TRUE(torch::equal(before, logits_of(model)));  // B = 0
}

TEST(Lora, ForwardEqualsTheNaivelyMergedWeights) {
  auto original = tiny_model(tiny_config());
  auto model = tiny_model(tiny_config());
  LoraOptions options;
  options.rank = 3;
  options.alpha = 6;
  attach_lora(model, options, 1);
  randomize_adapters(model);

  // W' = W + (alpha / r) sum_k B[n, k] A[k, m], by loops, into a copy of the original.
  auto adapters = lora_state(model);
  {
    torch::NoGradGuard no_grad;
    auto weights = original->named_parameters();
    for (const auto& [name, a] : adapters) {
      if (name.size() < 7 || name.compare(name.size() - 7, 7, ".lora_A") != 0) continue;
      const std::string base = name.substr(0, name.size() - 7);
      const auto b = adapters.at(base + ".lora_B");
      auto weight = weights[base + ".weight"];
      auto w = weight.accessor<float, 2>();
      const auto av = a.accessor<float, 2>();
      const auto bv = b.accessor<float, 2>();
      for (int64_t n = 0; n < weight.size(0); ++n)
        for (int64_t m = 0; m < weight.size(1); ++m) {
          double sum = 0;
          for (int64_t k = 0; k < options.rank; ++k) sum += static_cast<double>(bv[n][k]) * av[k][m];
          w[n][m] += static_cast<float>(2.0 * sum);
        }
    }
  }
  EXPECT_EQ(adapters.size(), 2u * 7u * 2u);  // A and B, seven projections, two layers
  const auto expected = logits_of(original);
  EXPECT_TRUE(torch::allclose(logits_of(model), expected, 1e-5, 1e-5));

  auto merged = merge_lora(model);
  EXPECT_FALSE(has_lora(merged));
  EXPECT_TRUE(torch::allclose(logits_of(merged), expected, 1e-5, 1e-5));
  for (auto& named : merged->named_parameters()) EXPECT_EQ(named.key().find("lora"), std::string::npos) << named.key();
  EXPECT_TRUE(has_lora(model));  // the merge built a new model
}

TEST(Lora, OnlyTheAdaptersOfTheTargetsTrain) {
  auto model = tiny_model(tiny_config());
  LoraOptions options;
  options.rank = 2;
  options.targets = {"v_proj", "q_proj"};
  attach_lora(model, options, 1);
  randomize_adapters(model);
  const auto config = model->config();
  const int64_t width = config.hidden_size, head_dim = config.head_dim;
  int64_t trainable = 0;
  for (const auto& named : model->named_parameters())
    if (named.value().requires_grad()) {
      trainable += named.value().numel();
      EXPECT_NE(named.key().find("lora"), std::string::npos) << named.key() << " should be frozen";
    }
  // Per layer: q: r (D + H Dh), v: r (D + G Dh).
  const int64_t per_layer = 2 * (width + config.num_attention_heads * head_dim) + 2 * (width + config.num_key_value_heads * head_dim);
  EXPECT_EQ(trainable, config.num_hidden_layers * per_layer);

  model->train();
  auto loss = model->logits(model->forward_ids(sample_ids()).hidden).logsumexp(-1).mean();
  loss.backward();
  for (const auto& named : model->named_parameters()) {
    const bool adapter = named.key().find("lora") != std::string::npos;
    EXPECT_EQ(named.value().grad().defined(), adapter) << named.key();
    if (adapter) {
      EXPECT_GT(named.value().grad().abs().sum().item<double>(), 0.0) << named.key();
    }
  }
}

TEST(Lora, AdapterStateRoundTripsAndMismatchesAreErrors) {
  auto trained = tiny_model(tiny_config());
  attach_lora(trained, {}, 1);
  randomize_adapters(trained);
  auto restored = tiny_model(tiny_config());
  attach_lora(restored, {}, 2);  // other draws, overwritten by the load
  load_lora_state(restored, lora_state(trained), "adapters.safetensors");
  EXPECT_TRUE(torch::equal(logits_of(restored), logits_of(trained)));

  auto other_rank = tiny_model(tiny_config());
  LoraOptions rank4;
  rank4.rank = 4;
  attach_lora(other_rank, rank4, 1);
  try {
    load_lora_state(other_rank, lora_state(trained), "adapters.safetensors");
    FAIL() << "a rank mismatch must be an error";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("adapters.safetensors"), std::string::npos) << error.what();
  }
  EXPECT_THROW(attach_lora(trained, {}, 1), std::invalid_argument);  // twice
}

TEST(Lora, BadOptionsAreErrors) {
  LoraOptions options;
  options.rank = 0;
  EXPECT_THROW(validate_lora_options(options), std::invalid_argument);
  options.rank = 4;
  options.targets = {"q_proj", "lm_head"};
  EXPECT_THROW(validate_lora_options(options), std::invalid_argument);
  options.targets = {"q_proj", "q_proj"};
  EXPECT_THROW(validate_lora_options(options), std::invalid_argument);
}
