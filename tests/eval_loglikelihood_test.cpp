// eval/loglikelihood.h against naive references: every window and every choice run alone, without a
// cache or padding, its log-probabilities summed position by position.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "eval/loglikelihood.h"
#include "support/tiny_model.h"

namespace coconut {
namespace {

// One token a byte (ids = the byte's value modulo the vocabulary): the split of context and
// continuation is then visible character by character.
class ByteTokenizer : public Tokenizer {
 public:
  std::vector<int64_t> encode(const std::string& text) const override {
    std::vector<int64_t> ids;
    for (unsigned char byte : text) ids.push_back(byte % 11);
    return ids;
  }
  std::string decode(const std::vector<int64_t>&, bool) const override { return ""; }
  int64_t vocab_size() const override { return 11; }
  std::optional<int64_t> token_to_id(const std::string&) const override { return std::nullopt; }
  std::optional<std::string> id_to_token(int64_t) const override { return std::nullopt; }
};

// Merges "ab" into one token: an encoding where context + continuation is not the context's
// tokens followed by the continuation's.
class MergingTokenizer : public ByteTokenizer {
 public:
  std::vector<int64_t> encode(const std::string& text) const override {
    std::vector<int64_t> ids;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text.compare(i, 2, "ab") == 0) {
        ids.push_back(10);
        ++i;
      } else {
        ids.push_back(static_cast<unsigned char>(text[i]) % 10);
      }
    }
    return ids;
  }
};

// sum over t in [from, ids.size()) of log p(ids[t] | ids[..t]), the sequence run alone.
double naive_log_probability(Llama& model, const std::vector<int64_t>& ids, size_t from) {
  torch::NoGradGuard no_grad;
  const auto input = torch::tensor(ids, torch::kInt64).view({1, -1});
  const auto log_probs = torch::log_softmax(model->logits(model->forward_ids(input).hidden[0]), -1);  // [T, V]
  double total = 0;
  for (size_t t = from; t < ids.size(); ++t) total += log_probs[static_cast<int64_t>(t) - 1][ids[t]].item<double>();
  return total;
}

std::vector<int64_t> sample_ids(int64_t count, int64_t vocabulary, uint64_t seed) {
  std::vector<int64_t> ids;
  uint64_t state = seed;
  for (int64_t i = 0; i < count; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    ids.push_back(static_cast<int64_t>((state >> 33) % static_cast<uint64_t>(vocabulary)));
  }
  return ids;
}

TEST(PerplexityWindows, NonOverlappingLeavesEachWindowsFirstTokenUnscored) {
  const auto windows = perplexity_windows(10, 4, 4);
  ASSERT_EQ(windows.size(), 3u);
  EXPECT_EQ(windows[0].begin, 0);
  EXPECT_EQ(windows[0].first_scored, 1);
  EXPECT_EQ(windows[1].begin, 4);
  EXPECT_EQ(windows[1].first_scored, 5);
  EXPECT_EQ(windows[2].begin, 8);
  EXPECT_EQ(windows[2].end, 10);
  EXPECT_EQ(windows[2].first_scored, 9);
}

TEST(PerplexityWindows, EveryTokenScoredOnceWithLeftContextWhenStrided) {
  for (int64_t tokens : {2, 3, 7, 20, 33})
    for (int64_t window : {2, 3, 5, 8})
      for (int64_t stride = 1; stride <= window; ++stride) {
        const auto windows = perplexity_windows(tokens, window, stride);
        std::map<int64_t, int> scored;
        for (const auto& w : windows) {
          EXPECT_LE(w.end - w.begin, window);
          EXPECT_GT(w.first_scored, w.begin);  // a window's first position predicts nothing
          EXPECT_LT(w.first_scored, w.end);
          for (int64_t t = w.first_scored; t < w.end; ++t) ++scored[t];
        }
        for (const auto& [token, times] : scored) EXPECT_EQ(times, 1) << "token " << token;
        if (stride < window) {
          EXPECT_EQ(windows.back().end, tokens);
          // Every token after the first, each with at least window - stride tokens before it (or all there are).
          EXPECT_EQ(static_cast<int64_t>(scored.size()), tokens - 1) << tokens << " " << window << " " << stride;
          for (const auto& w : windows)
            EXPECT_GE(w.first_scored - w.begin, std::min(window - stride, w.first_scored)) << tokens << " " << window << " " << stride;
        }
      }
}

// llama.cpp's tools/perplexity: chunks of n_ctx from token 0, whole ones only; logits from position
// first = n_ctx / 2 on predict the next token, up to the chunk's last.
TEST(LlamaPerplexityWindows, WholeChunksScoringTheirSecondHalf) {
  const auto windows = llama_perplexity_windows(21, 8);
  ASSERT_EQ(windows.size(), 2u);  // tokens 16..20 are not a whole chunk
  EXPECT_EQ(windows[0].begin, 0);
  EXPECT_EQ(windows[0].end, 8);
  EXPECT_EQ(windows[0].first_scored, 5);  // positions 4..6 predict tokens 5..7: n_ctx - 1 - first = 3
  EXPECT_EQ(windows[1].begin, 8);
  EXPECT_EQ(windows[1].first_scored, 13);
  EXPECT_EQ(llama_perplexity_windows(7, 7).front().first_scored, 4);  // odd: first = 3
  EXPECT_THROW(llama_perplexity_windows(7, 8), std::invalid_argument);
  EXPECT_THROW(llama_perplexity_windows(10, 2), std::invalid_argument);
}

TEST(PerplexityWindows, RefusesWhatCannotBeScored) {
  EXPECT_THROW(perplexity_windows(1, 4, 4), std::invalid_argument);
  EXPECT_THROW(perplexity_windows(10, 1, 1), std::invalid_argument);
  EXPECT_THROW(perplexity_windows(10, 4, 5), std::invalid_argument);
  EXPECT_THROW(perplexity_windows(10, 4, 0), std::invalid_argument);
}

TEST(ScoreText, EqualsEachWindowRunAloneInAnyBatch) {
  auto model = testing::tiny_model(testing::tiny_config());
  const auto ids = sample_ids(45, 11, 3);
  for (auto [window, stride] : {std::pair<int64_t, int64_t>{16, 16}, {16, 5}, {45, 45}, {8, 7}}) {
    double expected = 0;
    int64_t scored = 0;
    for (const auto& w : perplexity_windows(45, window, stride)) {
      const std::vector<int64_t> part(ids.begin() + w.begin, ids.begin() + w.end);
      expected -= naive_log_probability(model, part, static_cast<size_t>(w.first_scored - w.begin));
      scored += w.end - w.first_scored;
    }
    for (int64_t batch : {1, 3, 64}) {
      int64_t calls = 0;
      const auto result = score_text(model, ids, window, stride, batch, [&](int64_t, int64_t, int64_t) { ++calls; });
      EXPECT_NEAR(result.nll, expected, 1e-4 * std::abs(expected)) << window << " " << stride << " batch " << batch;
      EXPECT_EQ(result.scored, scored);
      EXPECT_EQ(result.tokens, 45);
      EXPECT_NEAR(result.perplexity(), std::exp(expected / static_cast<double>(scored)), 1e-4 * result.perplexity());
      EXPECT_EQ(calls, (result.windows + batch - 1) / batch);
    }
  }
}

// Each chunk run alone with its first id replaced (llama-perplexity's BOS), and without the
// replacement another result: the replaced position is context, never a target.
TEST(ScoreWindows, PutsTheChunkFirstTokenAtEveryWindowStart) {
  auto model = testing::tiny_model(testing::tiny_config());
  const auto ids = sample_ids(40, 11, 5);
  const auto windows = llama_perplexity_windows(40, 12);
  double expected = 0;
  for (const auto& w : windows) {
    std::vector<int64_t> part(ids.begin() + w.begin, ids.begin() + w.end);
    part.front() = 10;
    expected -= naive_log_probability(model, part, static_cast<size_t>(w.first_scored - w.begin));
  }
  for (int64_t batch : {1, 2}) {
    const auto result = score_windows(model, ids, windows, batch, 10);
    EXPECT_NEAR(result.nll, expected, 1e-4 * std::abs(expected)) << "batch " << batch;
    EXPECT_EQ(result.scored, 3 * 5);
    EXPECT_EQ(result.windows, 3);
  }
  EXPECT_GT(std::abs(score_windows(model, ids, windows, 2).nll - expected), 1e-3);
}

TEST(EncodeChoices, MovesTheContextsTrailingSpaceIntoEachContinuation) {
  ByteTokenizer bytes;
  const auto encoded = encode_choices(bytes, "ab ", {"c", "dd"}, 9);
  EXPECT_EQ(encoded.context, bytes.encode("ab"));
  ASSERT_EQ(encoded.continuations.size(), 2u);
  EXPECT_EQ(encoded.continuations[0], bytes.encode(" c"));
  EXPECT_EQ(encoded.continuations[1], bytes.encode(" dd"));
  // An empty context: the prefix token, the choice encoded alone.
  const auto empty = encode_choices(bytes, "", {"x"}, 9);
  EXPECT_EQ(empty.context, std::vector<int64_t>{9});
  EXPECT_EQ(empty.continuations[0], bytes.encode("x"));
}

TEST(EncodeChoices, TakesTheContinuationFromTheWholeEncoding) {
  MergingTokenizer merging;
  // "a" + "b": the whole encodes as one merged token; the context's own encoding has one token, so
  // the continuation is what follows it in the whole: nothing, an error naming the choice.
  EXPECT_THROW(encode_choices(merging, "a", {"b"}, 9), std::invalid_argument);
  const auto encoded = encode_choices(merging, "ca", {"bc"}, 9);  // "cabc" -> c, ab, c; context "ca" -> c, a
  EXPECT_EQ(encoded.context, (std::vector<int64_t>{9 % 10, 97 % 10}));
  EXPECT_EQ(encoded.continuations[0], std::vector<int64_t>{99 % 10});
}

TEST(ScoreChoices, EqualsEachChoiceRunAloneAfterItsContext) {
  auto model = testing::tiny_model(testing::tiny_config());
  EncodedChoices item;
  item.context = sample_ids(9, 11, 5);
  item.continuations = {sample_ids(1, 11, 6), sample_ids(4, 11, 7), sample_ids(2, 11, 8), sample_ids(6, 11, 9)};
  const auto scores = score_choices(model, item, 64);
  ASSERT_EQ(scores.size(), 4u);
  for (size_t c = 0; c < scores.size(); ++c) {
    auto whole = item.context;
    whole.insert(whole.end(), item.continuations[c].begin(), item.continuations[c].end());
    const double expected = naive_log_probability(model, whole, item.context.size());
    EXPECT_NEAR(scores[c], expected, 1e-4 * std::abs(expected)) << "choice " << c;
  }
  // One-token choices only: the context's last position alone.
  item.continuations = {sample_ids(1, 11, 10), sample_ids(1, 11, 11)};
  const auto single = score_choices(model, item, 64);
  for (size_t c = 0; c < single.size(); ++c) {
    auto whole = item.context;
    whole.push_back(item.continuations[c][0]);
    EXPECT_NEAR(single[c], naive_log_probability(model, whole, item.context.size()), 1e-5);
  }
}

TEST(ScoreChoices, ALongContextLosesTokensOnTheLeft) {
  auto model = testing::tiny_model(testing::tiny_config());
  EncodedChoices item;
  item.context = sample_ids(30, 11, 12);
  item.continuations = {sample_ids(5, 11, 13), sample_ids(3, 11, 14)};
  const int64_t max_length = 20;  // the longest continuation (5) leaves 16 of the context's 30
  const auto scores = score_choices(model, item, max_length);
  const std::vector<int64_t> kept(item.context.end() - 16, item.context.end());
  for (size_t c = 0; c < scores.size(); ++c) {
    auto whole = kept;
    whole.insert(whole.end(), item.continuations[c].begin(), item.continuations[c].end());
    EXPECT_LE(static_cast<int64_t>(whole.size()) - 1, max_length);
    EXPECT_NEAR(scores[c], naive_log_probability(model, whole, kept.size()), 1e-4 * std::abs(scores[c]));
  }
  item.continuations = {sample_ids(20, 11, 15)};
  EXPECT_THROW(score_choices(model, item, max_length), std::invalid_argument);
}

TEST(ArgmaxChoice, NormalizesByCharactersAsPythonCountsThem) {
  EXPECT_EQ(argmax_choice({-3.0, -1.0, -2.0}), 1);
  EXPECT_EQ(argmax_choice({-1.0, -1.0}), 0);  // ties: the first
  // -4 over 4 characters beats -3 over 2; "é" is 2 bytes and 1 character: -2.5 / 2 loses to -1.0 / 1.
  EXPECT_EQ(argmax_choice_normalized({-3.0, -4.0}, {"ab", "abcd"}), 1);
  EXPECT_EQ(argmax_choice_normalized({-2.5, -1.0}, {"\xC3\xA9x", "y"}), 1);
  EXPECT_EQ(argmax_choice_normalized({-2.5, -1.4}, {"\xC3\xA9xy", "y"}), 0);  // -0.833 against -1.4
}

}  // namespace
}  // namespace coconut
