// Cost accounting against published parameter counts of public models, a hand count of a pruned
// config, and FLOPs against an independent count of the multiply-accumulates of the naive loops.
#include <gtest/gtest.h>

#include "eval/cost.h"
#include "io/hf_config.h"
#include "model/llama.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

using namespace coconut;

namespace {
LlamaConfig fixture(const std::string& name) {
  return load_config(std::string(COCONUT_SOURCE_DIR) + "/tests/fixtures/configs/" + name + ".json");
}
}  // namespace

// Totals as published for each model (HF num_parameters(), tied matrices counted once).
TEST(CostParameters, PublicModelsExactTotals) {
  EXPECT_EQ(count_parameters(fixture("llama-3.2-1b")).total, 1235814400);
  EXPECT_EQ(count_parameters(fixture("llama-3.2-3b")).total, 3212749824);
  EXPECT_EQ(count_parameters(fixture("llama-7b")).total, 6738415616);
  EXPECT_EQ(count_parameters(fixture("llama-3.1-8b")).total, 8030261248);
  EXPECT_EQ(count_parameters(load_config(coconut::testing::shared_data("tokenizers/llama3/config.json"))).total, 1235814400);
}

TEST(CostParameters, Llama32OneBAttentionPerLayerIsTenMillion) {
  const auto count = count_parameters(fixture("llama-3.2-1b"));
  // q 2048x2048 + k 512x2048 + v 512x2048 + o 2048x2048 (GQA: 8 KV heads), not 4 x 2048^2.
  EXPECT_EQ(count.layers[0].attention(), 10485760);
  EXPECT_NE(count.layers[0].attention(), 12582912);
  EXPECT_EQ(count.non_embedding, 1235814400 - 128256LL * 2048);
}

TEST(CostParameters, CountEqualsTheModelsOwnParameters) {
  auto config = coconut::testing::tiny_config();
  config.tie_word_embeddings = false;
  config.attention_bias = true;
  config.mlp_bias = true;
  config.layer_num_attention_heads = {4, 2};
  config.layer_num_key_value_heads = {2, 1};
  config.layer_intermediate_size = {24, 7};
  config.validate();
  Llama model(config);
  int64_t actual = 0;
  for (const auto& parameter : model->parameters()) actual += parameter.numel();
  EXPECT_EQ(count_parameters(config).total, actual);
  // Hand sum of the pruned layer 1: q 2*4x16 (+8), k/v 1*4x16 (+4 each), o 16x8 (+16),
  // MLP 7x16 (+7) twice and 16x7 (+16), norms 2x16.
  const int64_t layer1 = (128 + 8) + (64 + 4) * 2 + (128 + 16) + (112 + 7) * 2 + (112 + 16) + 32;
  EXPECT_EQ(count_parameters(config).layers[1].total(), layer1);
}

TEST(CostKVCache, Llama32ThreeBFloat16) {
  EXPECT_EQ(kv_cache_bytes_per_token(fixture("llama-3.2-3b"), torch::kFloat16), 114688);
  EXPECT_EQ(kv_cache_bytes_per_token(fixture("llama-3.2-1b"), torch::kBFloat16), 2 * 16 * 8 * 64 * 2);
}

// Independent count: the multiply-accumulates of the naive forward loops for one token at
// context N (matvec rows x cols per weight, dh per score and per weighted value).
TEST(CostFlops, MatchesMultiplyAccumulateCountOfNaiveLoops) {
  auto config = coconut::testing::tiny_config();
  config.layer_num_attention_heads = {4, 2};
  config.layer_num_key_value_heads = {2, 2};
  config.layer_intermediate_size = {24, 9};
  config.validate();
  const int64_t context = 13, width = 16, dh = config.head_dim;
  int64_t macs = 0;
  for (int64_t l = 0; l < 2; ++l) {
    const int64_t heads = config.heads(l), groups = config.kv_heads(l), f = config.ffn(l);
    macs += heads * dh * width + 2 * groups * dh * width + width * heads * dh;  // q, k, v, o
    macs += heads * context * dh * 2;                                          // scores, weighted sum
    macs += 3 * f * width;
  }
  macs += config.vocab_size * width;
  EXPECT_DOUBLE_EQ(flops_per_token(config, context).total(), 2.0 * static_cast<double>(macs));
  // A prefill of N tokens is the sum over contexts 1..N (logits at the last only).
  double sum = 0;
  for (int64_t t = 1; t <= context; ++t) sum += flops_per_token(config, t).total() - flops_per_token(config, t).head;
  sum += flops_per_token(config, 1).head;
  EXPECT_DOUBLE_EQ(prefill_flops_total(config, context), sum);
}

TEST(CostFlops, Llama32OneBAtContext2048) {
  const auto flops = flops_per_token(fixture("llama-3.2-1b"), 2048);
  // 2 x (matrix weights of the layers) + 4 x (32 heads x 64) x 2048 context x 16 layers + 2 x V x D.
  EXPECT_DOUBLE_EQ(flops.projections + flops.mlp, 2.0 * 16 * (10485760 + 50331648));
  EXPECT_DOUBLE_EQ(flops.attention, 4.0 * (32 * 64) * 2048 * 16);
  EXPECT_DOUBLE_EQ(flops.head, 2.0 * 128256 * 2048);
}
