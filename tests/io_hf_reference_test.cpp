// Our forward pass against HF transformers itself: a tiny random Llama with llama3 RoPE scaling
// (all three frequency bands), grouped-query attention and tied embeddings, saved by transformers'
// save_pretrained, with transformers' float32 logits for two sequences (tests/fixtures/models/
// hf-tiny-llama3, made by tests/reference/make_hf_tiny_llama_reference.py; no Python at test time).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "io/hf_checkpoint.h"
#include "model/llama.h"
#include "support/temp_dir.h"

using namespace coconut;

TEST(HfReference, TinyLlama3GqaTiedLogitsMatchTransformers) {
  const std::string folder = coconut::testing::test_data("models/hf-tiny-llama3");
  auto model = load_model(folder);
  model->eval();
  const auto& config = model->config();
  // What the folder's config.json says (transformers 5 writes RoPE settings as rope_parameters).
  EXPECT_EQ(config.rope_scaling.type, "llama3");
  EXPECT_EQ(config.rope_scaling.original_max_position_embeddings, 32);
  EXPECT_EQ(config.rope_theta, 500.0);
  EXPECT_TRUE(config.tie_word_embeddings);
  EXPECT_EQ(config.num_attention_heads, 4);
  EXPECT_EQ(config.num_key_value_heads, 2);
  std::ifstream in(folder + "/reference.json");
  const auto reference = nlohmann::json::parse(in);
  const auto sequences = reference["ids"].get<std::vector<std::vector<int64_t>>>();
  ASSERT_EQ(sequences.size(), 2u);
  torch::NoGradGuard no_grad;
  for (size_t s = 0; s < sequences.size(); ++s) {
    const auto& ids = sequences[s];
    const auto logits = model->logits(model->forward_ids(torch::tensor(ids).view({1, -1})).hidden)[0].to(torch::kFloat64);  // [T, V]
    const auto rows = reference["logits"][s].get<std::vector<std::vector<double>>>();  // [T][V]
    std::vector<double> flat;
    for (const auto& row : rows) flat.insert(flat.end(), row.begin(), row.end());
    const auto expected = torch::tensor(flat, torch::kFloat64).view({static_cast<int64_t>(rows.size()), -1});
    ASSERT_EQ(logits.sizes(), expected.sizes());
    const double worst = (logits - expected).abs().max().template item<double>();
    const double largest = expected.abs().max().template item<double>();
    std::printf("sequence %zu: max |ours - transformers| = %.3g (max |logit| %.3g)\n", s, worst, largest);
    // Two float32 implementations of the same arithmetic in different orders (transformers' sdpa,
    // our CPU kernels): measured 1.1e-5 and 1.9e-5 on logits up to 6.8; bound 1e-4. A RoPE band, a
    // GQA head mapping or the tied head gone wrong moves logits by O(1) (a config.json whose
    // rope_parameters went unread: 4.1).
    EXPECT_LT(worst, 1e-4) << "sequence " << s;
  }
}
