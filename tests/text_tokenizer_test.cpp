// Tokenizers against the reference: the Llama 3 cases produced with HF tokenizers (and an
// independent JavaScript implementation), the stories260K answer keys from llama2.c, round trips,
// added tokens, word-level tokenizers and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <nlohmann/json.hpp>

#include "support/temp_dir.h"
#include "text/hf_tokenizer.h"

using namespace coconut;
using coconut::testing::test_data;
using coconut::testing::TempDir;
using nlohmann::json;

namespace {

// Every line of a fixture; a missing or empty file is an error (a loop over nothing asserts nothing).
std::vector<json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open the fixture");
  std::vector<json> lines;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) lines.push_back(json::parse(line));
  if (lines.empty()) throw std::runtime_error(path + ": no lines");
  return lines;
}

const HfTokenizer& llama3() {
  static const auto tokenizer = HfTokenizer::load(test_data("tokenizers/llama3/tokenizer.json"));
  return *tokenizer;
}

const HfTokenizer& stories() {
  static const auto tokenizer = HfTokenizer::load(test_data("models/stories260K/tokenizer.json"));
  return *tokenizer;
}

}  // namespace

TEST(Llama3Tokenizer, EncodesEveryReferenceCaseExactly) {
  const auto cases = read_jsonl(test_data("tokenizers/llama3/encode_cases.jsonl"));
  ASSERT_GE(cases.size(), 100u);
  int special = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(llama3().encode(text), c["ids"].get<std::vector<int64_t>>()) << "text: " << text;
    if (c.value("special_in_text", false)) {
      ++special;
      EXPECT_EQ(llama3().encode(text, /*parse_special=*/false), c["ids_plain_text"].get<std::vector<int64_t>>())
          << "plain text: " << text;
    }
  }
  EXPECT_GT(special, 0);
}

TEST(Llama3Tokenizer, PairMergesSpellingGivesIdenticalIds) {
  const auto variant = HfTokenizer::load(test_data("tokenizers/llama3/variants/tokenizer.pair-merges.json"));
  for (const auto& c : read_jsonl(test_data("tokenizers/llama3/encode_cases.jsonl")))
    EXPECT_EQ(variant->encode(c["text"].get<std::string>()), c["ids"].get<std::vector<int64_t>>());
}

TEST(Llama3Tokenizer, DecodeRoundTripsAndTemplateAddsBos) {
  for (const auto& c : read_jsonl(test_data("tokenizers/llama3/encode_cases.jsonl"))) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(llama3().decode(c["ids"].get<std::vector<int64_t>>()), text);
  }
  EXPECT_EQ(llama3().encode_with_special_tokens("Hi").front(), 128000);
  EXPECT_EQ(llama3().decode(llama3().encode_with_special_tokens("Hi"), /*skip_special_tokens=*/true), "Hi");
  EXPECT_EQ(llama3().vocab_size(), 128256);
  EXPECT_EQ(llama3().token_to_id("<|eot_id|>"), 128009);
}

TEST(StoriesTokenizer, EncodesTheAnswerKeyPromptsAndDecodesTheirOutputs) {
  std::ifstream in(test_data("models/stories260K/answer_keys.json"));
  const json keys = json::parse(in);
  for (const auto& key : keys) {
    auto prompt_ids = key["prompt_ids"].get<std::vector<int64_t>>();
    ASSERT_EQ(prompt_ids.front(), 1);
    prompt_ids.erase(prompt_ids.begin());
    EXPECT_EQ(stories().encode(key["prompt"].get<std::string>()), prompt_ids);
    EXPECT_EQ(stories().decode(key["output_ids"].get<std::vector<int64_t>>()), key["output_text"].get<std::string>());
    EXPECT_EQ(stories().encode_with_special_tokens(key["prompt"].get<std::string>()), key["prompt_ids"].get<std::vector<int64_t>>());
  }
}

TEST(StoriesTokenizer, ByteFallbackRoundTripsUnseenCharacters) {
  const std::string text = "Tom saw a ñandú and 猫 at 9:30!";
  const auto ids = stories().encode(text);
  // Characters outside the 512-token vocabulary become <0xNN> byte tokens, not <unk>.
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 0), 0);
  EXPECT_EQ(stories().decode(ids), text);
}

TEST(AddedTokens, NewSpecialTokensAreNeverSplitAndSurviveSaveAndReload) {
  TempDir dir;
  auto tokenizer = HfTokenizer::load(test_data("tokenizers/llama3/tokenizer.json"));
  const auto ids = tokenizer->add_special_tokens({"<|start-latent|>", "<|end-latent|>", "<|latent|>"});
  EXPECT_EQ(ids, (std::vector<int64_t>{128256, 128257, 128258}));
  EXPECT_EQ(tokenizer->add_special_tokens({"<|latent|>"}), (std::vector<int64_t>{128258}));  // idempotent
  const auto encoded = tokenizer->encode("Q?<|start-latent|><|latent|><|latent|><|end-latent|>A");
  EXPECT_EQ(std::count(encoded.begin(), encoded.end(), 128258), 2);
  tokenizer->save(dir.file("tokenizer.json"));
  const auto reloaded = HfTokenizer::load(dir.file("tokenizer.json"));
  EXPECT_EQ(reloaded->vocab_size(), 128259);
  EXPECT_EQ(reloaded->encode("Q?<|start-latent|><|latent|><|latent|><|end-latent|>A"), encoded);
  EXPECT_EQ(reloaded->decode(encoded), "Q?<|start-latent|><|latent|><|latent|><|end-latent|>A");
  EXPECT_EQ(reloaded->decode(encoded, true), "Q?A");
}

TEST(WordLevel, BuildsSavesAndReloads) {
  TempDir dir;
  auto tokenizer = build_word_level_tokenizer({"a b c", "c d  e\nf"}, {"<pad>", "<bos>", "<eos>", "<unk>"});
  EXPECT_EQ(tokenizer->vocab_size(), 10);
  EXPECT_EQ(tokenizer->encode("a c f"), (std::vector<int64_t>{4, 6, 9}));
  EXPECT_EQ(tokenizer->encode("a <eos>"), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(tokenizer->encode("a zebra"), (std::vector<int64_t>{4, 3}));  // unknown word -> <unk>
  EXPECT_EQ(tokenizer->decode({4, 6, 9}), "a c f");
  tokenizer->save(dir.file("tokenizer.json"));
  const auto reloaded = HfTokenizer::load(dir.file("tokenizer.json"));
  EXPECT_EQ(reloaded->encode("e d c b a"), tokenizer->encode("e d c b a"));
  std::ifstream in(dir.file("tokenizer.json"));
  const json saved = json::parse(in);
  EXPECT_EQ(saved["model"]["type"], "WordLevel");
  EXPECT_EQ(saved["pre_tokenizer"]["type"], "WhitespaceSplit");
}

// Word forms: one token per concept whatever its case or number, and decoding restores the text.
TEST(WordForms, CaseAndPluralShareTheStemToken) {
  auto tokenizer = build_word_level_tokenizer({"Every brimpus is a yumpus. Brimpuses are not wooden.", "### True"},
                                              {"<pad>", "<unk>"}, "<unk>", true);
  const auto id = [&](const std::string& token) { return *tokenizer->token_to_id(token); };
  EXPECT_FALSE(tokenizer->token_to_id("brimpuses"));
  EXPECT_FALSE(tokenizer->token_to_id("Brimpuses"));
  EXPECT_EQ(tokenizer->encode("Brimpuses are wooden."),
            (std::vector<int64_t>{id("<cap>"), id("brimpus"), id("##es"), id("are"), id("wooden"), id(".")}));
  EXPECT_EQ(tokenizer->encode("every yumpus"), (std::vector<int64_t>{id("every"), id("yumpus")}));
  EXPECT_EQ(tokenizer->encode("Yumpuses"), (std::vector<int64_t>{id("<cap>"), id("yumpus"), id("##es")}));
  EXPECT_EQ(tokenizer->encode("### True"), (std::vector<int64_t>{id("###"), id("<cap>"), id("true")}));
  EXPECT_EQ(tokenizer->encode("zebras"), (std::vector<int64_t>{id("<unk>")}));  // unknown stem: unknown word
  EXPECT_EQ(tokenizer->unknown_token_id(), id("<unk>"));
  EXPECT_EQ(tokenizer->decode(tokenizer->encode("Yumpuses are not wooden. ### True")), "Yumpuses are not wooden. ### True");
}

TEST(WordForms, RoundTripsEveryProntoQaAndProsQaTextAndReloads) {
  TempDir dir;
  std::vector<std::string> texts;
  for (const char* file : {"prontoqa/valid.json", "prosqa/valid.json"}) {
    std::ifstream in(test_data(file));
    ASSERT_TRUE(in) << test_data(file);
    for (const json& example : json::parse(in)) {
      texts.push_back(example["question"].get<std::string>());
      for (const json& step : example["steps"]) texts.push_back(step.get<std::string>());
      texts.push_back("### " + example["answer"].get<std::string>());
    }
  }
  ASSERT_GT(texts.size(), 2000u);
  auto tokenizer = build_word_level_tokenizer(texts, {"<pad>", "<unk>", "<s>", "</s>"}, "<unk>", true);
  EXPECT_LT(tokenizer->vocab_size(), 200);  // the whitespace-split vocabulary of the same texts is about twice as large
  tokenizer->save(dir.file("tokenizer.json"));
  const auto reloaded = HfTokenizer::load(dir.file("tokenizer.json"));
  size_t words = 0, tokens = 0;
  for (const auto& text : texts) {
    const auto ids = reloaded->encode(text);
    ASSERT_EQ(ids, tokenizer->encode(text)) << text;
    ASSERT_EQ(std::count(ids.begin(), ids.end(), *tokenizer->unknown_token_id()), 0) << text;
    ASSERT_EQ(reloaded->decode(ids), text);
    tokens += ids.size();
    std::istringstream split(text);
    for (std::string word; split >> word;) ++words;
  }
  // Markers, suffixes and punctuation cost tokens: under twice the words.
  EXPECT_LT(static_cast<double>(tokens), 2.0 * static_cast<double>(words));
  const auto whitespace = build_word_level_tokenizer(texts, {"<pad>", "<unk>"});
  EXPECT_GT(whitespace->vocab_size(), tokenizer->vocab_size() * 3 / 2);
  // With postfix negation: the same vocabulary size ("~not" for "not"), every text exact.
  WordModifiers postfix_not, fused_not;
  postfix_not.postfix = {"not"};
  fused_not.fused = {"not"};
  const auto postfix = build_word_level_tokenizer(texts, {"<pad>", "<unk>", "<s>", "</s>"}, "<unk>", true, postfix_not);
  EXPECT_EQ(postfix->vocab_size(), tokenizer->vocab_size());
  for (const auto& text : texts) ASSERT_EQ(postfix->decode(postfix->encode(text)), text);
  // Fused negation: one token per negated property, every text exact, never unknown.
  const auto fused = build_word_level_tokenizer(texts, {"<pad>", "<unk>", "<s>", "</s>"}, "<unk>", true, fused_not);
  EXPECT_GT(fused->vocab_size(), tokenizer->vocab_size());
  EXPECT_LT(fused->vocab_size(), tokenizer->vocab_size() + 60);
  for (const auto& text : texts) {
    const auto ids = fused->encode(text);
    ASSERT_EQ(std::count(ids.begin(), ids.end(), *fused->unknown_token_id()), 0) << text;
    ASSERT_EQ(fused->decode(ids), text);
  }
}

// Postfix negation: "not" goes behind the word it negates, and back when decoding; a "not" with no
// word after it stays where it is.
TEST(WordForms, PostfixNegationMovesNotBehindItsWordAndBack) {
  const std::vector<std::string> texts = {"Every brimpus is not wooden.", "Brimpuses are not Wooden. Alex is not. not"};
  WordModifiers postfix_not;
  postfix_not.postfix = {"not"};
  auto tokenizer = build_word_level_tokenizer(texts, {"<pad>", "<unk>"}, "<unk>", true, postfix_not);
  const auto id = [&](const std::string& token) { return *tokenizer->token_to_id(token); };
  EXPECT_TRUE(tokenizer->token_to_id("~not"));
  EXPECT_EQ(tokenizer->encode("Brimpuses are not wooden."),
            (std::vector<int64_t>{id("<cap>"), id("brimpus"), id("##es"), id("are"), id("wooden"), id("~not"), id(".")}));
  EXPECT_EQ(tokenizer->encode("are not Brimpuses"),
            (std::vector<int64_t>{id("are"), id("<cap>"), id("brimpus"), id("##es"), id("~not")}));
  EXPECT_EQ(tokenizer->encode("is not."), (std::vector<int64_t>{id("is"), id("not"), id(".")}));
  for (const std::string text : {"Every brimpus is not wooden.", "Brimpuses are not Wooden. Alex is not. not",
                                 "are not Brimpuses", "not not wooden", "Alex is not. Brimpuses are not wooden"})
    EXPECT_EQ(tokenizer->decode(tokenizer->encode(text)), text);
  // Saved and reloaded, the same; a malformed postfix list is named.
  TempDir dir;
  tokenizer->save(dir.file("tokenizer.json"));
  EXPECT_EQ(HfTokenizer::load(dir.file("tokenizer.json"))->encode("are not wooden"), tokenizer->encode("are not wooden"));
  const json bad = json::parse(R"({"model": {"type": "WordLevel", "vocab": {"<cap>": 0}},
                                   "pre_tokenizer": {"type": "WordForms", "case_marker": "<cap>", "postfix": ["Not"]}})");
  EXPECT_THROW_WITH(HfTokenizer::from_json(bad, "t.json"), "t.json", "pre_tokenizer.WordForms.postfix", "lower-case");
  EXPECT_THROW_WITH(build_word_level_tokenizer(texts, {"<unk>"}, "<unk>", false, postfix_not), "need word_forms");
}

// Fused negation: "not" and the word it negates are one token, split back when decoding; a fused
// pair the vocabulary lacks encodes as its two words; a capitalised word or a lone "not" is not fused.
TEST(WordForms, FusedNegationMakesOneTokenOfNotAndItsWord) {
  const std::vector<std::string> texts = {"Every brimpus is not wooden.", "Brimpuses are green. Alex is not. not"};
  WordModifiers fused_not;
  fused_not.fused = {"not"};
  auto tokenizer = build_word_level_tokenizer(texts, {"<pad>", "<unk>"}, "<unk>", true, fused_not);
  const auto id = [&](const std::string& token) { return *tokenizer->token_to_id(token); };
  ASSERT_TRUE(tokenizer->token_to_id("not~wooden"));
  EXPECT_FALSE(tokenizer->token_to_id("wooden"));  // never seen on its own
  EXPECT_EQ(tokenizer->encode("Brimpuses are not wooden."),
            (std::vector<int64_t>{id("<cap>"), id("brimpus"), id("##es"), id("are"), id("not~wooden"), id(".")}));
  EXPECT_EQ(tokenizer->encode("are not green"), (std::vector<int64_t>{id("are"), id("not"), id("green")}));
  EXPECT_EQ(tokenizer->encode("are not brimpuses"), (std::vector<int64_t>{id("are"), id("not"), id("brimpus"), id("##es")}));
  EXPECT_EQ(tokenizer->encode("is not Brimpus"), (std::vector<int64_t>{id("is"), id("not"), id("<cap>"), id("brimpus")}));
  EXPECT_EQ(tokenizer->encode("is not."), (std::vector<int64_t>{id("is"), id("not"), id(".")}));
  for (const std::string text : {"Every brimpus is not wooden.", "Brimpuses are green. Alex is not. not", "are not green",
                                 "not not wooden", "is not Brimpus", "Alex is not. Brimpuses are not wooden"})
    EXPECT_EQ(tokenizer->decode(tokenizer->encode(text)), text);
  // Saved and reloaded, the same; a word both fused and joined is named.
  TempDir dir;
  tokenizer->save(dir.file("tokenizer.json"));
  EXPECT_EQ(HfTokenizer::load(dir.file("tokenizer.json"))->encode("are not wooden"), tokenizer->encode("are not wooden"));
  const json bad = json::parse(R"({"model": {"type": "WordLevel", "vocab": {"<cap>": 0}},
                                   "pre_tokenizer": {"type": "WordForms", "case_marker": "<cap>", "fused": ["not"], "joined": ["not"]}})");
  EXPECT_THROW_WITH(HfTokenizer::from_json(bad, "t.json"), "t.json", "pre_tokenizer.WordForms.joined", "also a fused word");
}

namespace {

// `tokenizer` saved and loaded again encodes each text as before and decodes it back exactly.
void expect_same_after_reload(const HfTokenizer& tokenizer, std::initializer_list<std::string> texts) {
  TempDir dir;
  tokenizer.save(dir.file("tokenizer.json"));
  const auto reloaded = HfTokenizer::load(dir.file("tokenizer.json"));
  for (const std::string& text : texts) {
    EXPECT_EQ(reloaded->encode(text), tokenizer.encode(text)) << text;
    EXPECT_EQ(reloaded->decode(reloaded->encode(text)), text);
  }
}

}  // namespace

// Marked negation (a word both postfix and fused): the fused token, or the words as they stand where
// they cannot fuse, then the mark "~not"; decoding drops the mark, so every text comes back exactly,
// also where a fused pair is missing from the vocabulary.
TEST(WordForms, MarkedNegationFusesAndThenMarks) {
  const std::vector<std::string> texts = {"Every brimpus is not wooden.", "Brimpuses are green. Alex is not. not"};
  WordModifiers marked;
  marked.postfix = marked.fused = {"not"};
  auto tokenizer = build_word_level_tokenizer(texts, {"<pad>", "<unk>"}, "<unk>", true, marked);
  const auto id = [&](const std::string& token) { return *tokenizer->token_to_id(token); };
  ASSERT_TRUE(tokenizer->token_to_id("not~wooden"));
  ASSERT_TRUE(tokenizer->token_to_id("~not"));
  EXPECT_EQ(tokenizer->encode("Brimpuses are not wooden."),
            (std::vector<int64_t>{id("<cap>"), id("brimpus"), id("##es"), id("are"), id("not~wooden"), id("~not"), id(".")}));
  EXPECT_EQ(tokenizer->encode("are not green"), (std::vector<int64_t>{id("are"), id("not"), id("green"), id("~not")}));
  EXPECT_EQ(tokenizer->encode("is not Brimpus"),
            (std::vector<int64_t>{id("is"), id("not"), id("<cap>"), id("brimpus"), id("~not")}));
  EXPECT_EQ(tokenizer->encode("is not."), (std::vector<int64_t>{id("is"), id("not"), id(".")}));
  EXPECT_EQ(tokenizer->encode("not not wooden"), (std::vector<int64_t>{id("not"), id("not~wooden"), id("~not")}));
  for (const std::string text : {"Every brimpus is not wooden.", "Brimpuses are green. Alex is not. not", "are not green",
                                 "not not wooden", "is not Brimpus", "not not Brimpus", "Alex is not. Brimpuses are not wooden"})
    EXPECT_EQ(tokenizer->decode(tokenizer->encode(text)), text);
  // Saved and reloaded (both lists in the file), the same.
  expect_same_after_reload(*tokenizer, {"Brimpuses are not wooden.", "not not Brimpus"});
}

// Joined articles: "a"/"an" and the word before them are one token ("is~a"), split back when
// decoding; so "Every X is a Y" and "Every X is Y" put Y equally far from X. A capitalised word,
// a modifier or an article before an article is not joined; a joined pair the vocabulary lacks
// encodes as its two words.
TEST(WordForms, JoinedArticlesMakeOneTokenWithTheWordBefore) {
  const std::vector<std::string> texts = {"Every brimpus is a wumpus.", "Max is an impus. Each yumpus is not a dog. A cat is a a."};
  WordModifiers modifiers;
  modifiers.fused = {"not"};
  modifiers.joined = {"a", "an"};
  auto tokenizer = build_word_level_tokenizer(texts, {"<pad>", "<unk>"}, "<unk>", true, modifiers);
  const auto id = [&](const std::string& token) { return *tokenizer->token_to_id(token); };
  ASSERT_TRUE(tokenizer->token_to_id("is~a"));
  ASSERT_TRUE(tokenizer->token_to_id("is~an"));
  EXPECT_EQ(tokenizer->encode("Every brimpus is a wumpus."),
            (std::vector<int64_t>{id("<cap>"), id("every"), id("brimpus"), id("is~a"), id("wumpus"), id(".")}));
  EXPECT_EQ(tokenizer->encode("is not a dog"), (std::vector<int64_t>{id("is"), id("not"), id("a"), id("dog")}));
  EXPECT_EQ(tokenizer->encode("A cat"), (std::vector<int64_t>{id("<cap>"), id("a"), id("cat")}));
  EXPECT_EQ(tokenizer->encode("dog a"), (std::vector<int64_t>{id("dog"), id("a")}));  // "dog~a" is not in the vocabulary
  for (const std::string text : {"Every brimpus is a wumpus.", "Max is an impus. Each yumpus is not a dog. A cat is a a.",
                                 "is not a dog", "A cat", "a an a", "Is a cat", "is a. a", "dog a"})
    EXPECT_EQ(tokenizer->decode(tokenizer->encode(text)), text);
  // Saved and reloaded, the same; a word both fused and joined is named.
  TempDir dir;
  tokenizer->save(dir.file("tokenizer.json"));
  EXPECT_EQ(HfTokenizer::load(dir.file("tokenizer.json"))->encode("Max is an impus."), tokenizer->encode("Max is an impus."));
  const json bad = json::parse(R"({"model": {"type": "WordLevel", "vocab": {"<cap>": 0}},
                                   "pre_tokenizer": {"type": "WordForms", "case_marker": "<cap>", "fused": ["a"], "joined": ["a"]}})");
  EXPECT_THROW_WITH(HfTokenizer::from_json(bad, "t.json"), "t.json", "pre_tokenizer.WordForms.joined", "also a fused word");
}

// Joined articles behind (a word both joined and postfix): "is a wumpus." -> wumpus ~is~a ., so that
// a fact's subject and object are side by side, and decoding puts "is a" back. Where no lower-case
// word follows, the joined piece stays; a lone article stays as it stands; every text comes back.
TEST(WordForms, JoinedPostfixArticlesGoBehindTheNextWord) {
  const std::vector<std::string> texts = {"Every brimpus is a wumpus.", "Tom is a yumpus. Is Tom a wumpus or brimpus?",
                                          "Max is an impus. It is not a dog. It is a."};
  WordModifiers modifiers;
  modifiers.postfix = {"not", "a", "an"};
  modifiers.joined = {"a", "an"};
  auto tokenizer = build_word_level_tokenizer(texts, {"<pad>", "<unk>"}, "<unk>", true, modifiers);
  const auto id = [&](const std::string& token) { return *tokenizer->token_to_id(token); };
  ASSERT_TRUE(tokenizer->token_to_id("~is~a"));
  ASSERT_TRUE(tokenizer->token_to_id("~is~an"));
  EXPECT_EQ(tokenizer->encode("Every brimpus is a wumpus."),
            (std::vector<int64_t>{id("<cap>"), id("every"), id("brimpus"), id("wumpus"), id("~is~a"), id(".")}));
  EXPECT_EQ(tokenizer->encode("Is Tom a wumpus?"),
            (std::vector<int64_t>{id("<cap>"), id("is"), id("<cap>"), id("tom"), id("a"), id("wumpus"), id("?")}));
  EXPECT_EQ(tokenizer->encode("Max is an impus."),
            (std::vector<int64_t>{id("<cap>"), id("max"), id("impus"), id("~is~an"), id(".")}));
  EXPECT_EQ(tokenizer->encode("It is a."), (std::vector<int64_t>{id("<cap>"), id("it"), id("is~a"), id(".")}));
  EXPECT_EQ(tokenizer->encode("is a Tom"), (std::vector<int64_t>{id("is~a"), id("<cap>"), id("tom")}));
  EXPECT_EQ(tokenizer->encode("is not a dog"), (std::vector<int64_t>{id("is"), id("not"), id("a"), id("dog")}));
  EXPECT_EQ(tokenizer->decode({id("~is~a"), id("wumpus")}), "is a wumpus");  // nothing before the mark
  for (const std::string text : {"Every brimpus is a wumpus.", "Tom is a yumpus. Is Tom a wumpus or brimpus?",
                                 "Max is an impus. It is not a dog. It is a.", "is a Tom", "is a is a dog", "a is a"})
    EXPECT_EQ(tokenizer->decode(tokenizer->encode(text)), text);
  // Saved and reloaded (a and an in both lists of the file), the same.
  expect_same_after_reload(*tokenizer, {"Every brimpus is a wumpus.", "Is Tom a wumpus or brimpus?"});
}

TEST(WordForms, OtherCasingsStayAndMalformedConfigIsNamed) {
  auto tokenizer = build_word_level_tokenizer({"ABC and iPhone: 12"}, {"<unk>"}, "<unk>", true);
  EXPECT_TRUE(tokenizer->token_to_id("ABC"));
  EXPECT_TRUE(tokenizer->token_to_id("iPhone"));
  EXPECT_EQ(tokenizer->decode(tokenizer->encode("ABC and iPhone: 12")), "ABC and iPhone: 12");
  const json bad = json::parse(R"({"model": {"type": "WordLevel", "vocab": {"a": 0}},
                                   "pre_tokenizer": {"type": "WordForms", "case_marker": "<cap>"}})");
  EXPECT_THROW_WITH(HfTokenizer::from_json(bad, "t.json"), "t.json", "case_marker", "not in the vocab");
}

TEST(WordLevel, UnknownWordWithoutUnkIsAnErrorNamingTheWord) {
  auto tokenizer = build_word_level_tokenizer({"x y"}, {"<pad>"}, "<unk>");
  EXPECT_THROW_WITH(tokenizer->encode("x zebra"), "zebra");
}

TEST(TokenizerErrors, MalformedJsonNamesTheFile) {
  TempDir dir;
  std::ofstream(dir.file("tokenizer.json")) << "{\"model\": {";
  EXPECT_THROW_WITH(HfTokenizer::load(dir.file("tokenizer.json")), "tokenizer.json", "malformed JSON");
  // A million nested lists: refused before any tree is built (it used to overflow the stack).
  std::ofstream(dir.file("deep.json")) << "{\"model\": " << std::string(1000000, '[') << std::string(1000000, ']') << "}";
  EXPECT_THROW_WITH(HfTokenizer::load(dir.file("deep.json")), "deep.json", "nested deeper than 64");
  // A number past double's range names the file too.
  std::ofstream(dir.file("huge.json")) << "{\"model\": {\"dropout\": 1e400}}";
  EXPECT_THROW_WITH(HfTokenizer::load(dir.file("huge.json")), "huge.json", "malformed JSON");
}

TEST(TokenizerErrors, UnsupportedModelAndPreTokenizerAreNamed) {
  EXPECT_THROW_WITH(HfTokenizer::from_json(json::parse(R"({"model": {"type": "Unigram", "vocab": []}})"), "t.json"),
                    "t.json", "model.type", "Unigram");
  EXPECT_THROW_WITH(HfTokenizer::from_json(json::parse(R"({"model": {"type": "WordLevel", "vocab": {"a": 0}},
                                                           "pre_tokenizer": {"type": "BertPreTokenizer"}})"),
                                           "t.json"),
                    "t.json", "pre_tokenizer", "BertPreTokenizer");
  EXPECT_THROW_WITH(HfTokenizer::from_json(json::parse(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})"), "t.json"),
                    "t.json", "model.merges");
  EXPECT_THROW_WITH(HfTokenizer::load("/nonexistent/tokenizer.json"), "/nonexistent/tokenizer.json");
}

// Fields of the wrong type are named, not ignored; ids that would size an absurd table are refused.
TEST(TokenizerErrors, WrongTypesAndLyingIdsAreNamed) {
  const auto load = [](const std::string& text) { return HfTokenizer::from_json(json::parse(text), "t.json"); };
  const std::string vocab = R"("model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1}, "unk_token": "a"})";
  EXPECT_NO_THROW(load("{" + vocab + R"(, "added_tokens": [{"id": 2, "content": "<s>"}]})"));
  EXPECT_THROW_WITH(load("{" + vocab + R"(, "added_tokens": {"id": 2, "content": "<s>"}})"), "t.json", "added_tokens",
                    "must be a list");
  EXPECT_THROW_WITH(load("{" + vocab + R"(, "added_tokens": [{"id": 2}]})"), "t.json", "added_tokens", "content");
  EXPECT_THROW_WITH(load("{" + vocab + R"(, "added_tokens": [{"id": 2, "content": 5}]})"), "t.json", "added_tokens");
  EXPECT_THROW_WITH(load("{" + vocab + R"(, "added_tokens": [{"id": -1, "content": "<s>"}]})"), "t.json", "'<s>'",
                    "negative id");
  EXPECT_THROW_WITH(load("{" + vocab + R"(, "added_tokens": [{"id": 1099511627776, "content": "<s>"}]})"), "t.json",
                    "'<s>'", "1099511627776", "dense");
  EXPECT_THROW_WITH(load(R"({"model": {"type": "WordLevel", "vocab": {"a": 0, "b": 4000000000}}})"), "t.json",
                    "model.vocab", "'b'", "dense");
  EXPECT_THROW_WITH(load(R"({"model": {"type": "WordLevel", "vocab": {"a": "0"}}})"), "t.json", "model.vocab",
                    "non-integer");
  EXPECT_THROW_WITH(load("{" + vocab + R"(, "post_processor": {"type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}],
                    "special_tokens": {"<s>": {"ids": [99]}}}})"),
                    "t.json", "post_processor.special_tokens", "99");
  EXPECT_THROW_WITH(load("{" + vocab + R"(, "normalizer": "lowercase"})"), "t.json", "malformed tokenizer field");
}
