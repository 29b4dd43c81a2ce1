// Growing the vocabulary: old tokens behave exactly as before, new rows copy their source row.
#include <gtest/gtest.h>

#include "model/vocabulary.h"
#include "support/tiny_model.h"

using namespace coconut;

TEST(GrowVocabulary, OldTokensUnchangedNewRowsCopied) {
  for (bool tied : {true, false}) {
    auto config = coconut::testing::tiny_config();
    config.tie_word_embeddings = tied;
    auto model = coconut::testing::tiny_model(config);
    auto grown = grow_vocabulary(model, {5, 5, 7});
    EXPECT_EQ(grown->config().vocab_size, config.vocab_size + 3);
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::equal(grown->embed_tokens->weight[11], model->embed_tokens->weight[5]));
    EXPECT_TRUE(torch::equal(grown->embed_tokens->weight[13], model->embed_tokens->weight[7]));
    auto ids = torch::tensor(std::vector<int64_t>{1, 4, 9}).view({1, -1});
    auto before = model->logits(model->forward_ids(ids).hidden);
    auto after = grown->logits(grown->forward_ids(ids).hidden);
    EXPECT_TRUE(torch::equal(after.narrow(-1, 0, config.vocab_size), before));
    // New logits equal the logits of their source token (same output row).
    EXPECT_TRUE(torch::equal(after.select(-1, 12), before.select(-1, 5)));
    EXPECT_THROW(grow_vocabulary(model, {11}), std::out_of_range);
  }
}
