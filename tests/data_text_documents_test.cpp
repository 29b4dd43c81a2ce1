// Plain text for mode lm: documents from .txt (blank-line separated) and JSONL (`text`), told
// apart from the reasoning formats, refused by the reasoning loader with a message that says where
// it is read, packed into windows with EOS after each document.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "data/example.h"
#include "data/sequences.h"
#include "data/text_documents.h"
#include "support/temp_dir.h"

using namespace coconut;
using coconut::testing::TempDir;

namespace {

std::string write(const TempDir& dir, const std::string& name, const std::string& text) {
  std::ofstream(dir.file(name), std::ios::binary) << text;
  return dir.file(name);
}

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST(TextDocuments, TxtDocumentsAreSeparatedByBlankLines) {
  TempDir dir;
  const auto path = write(dir, "text.txt", "\n\nFirst line.\nSecond line of the first.\r\n\n  \n\nAnother document.\n\n\nLast.");
  EXPECT_TRUE(is_plain_text_dataset(path));
  EXPECT_EQ(load_text_documents(path),
            (std::vector<std::string>{"First line.\nSecond line of the first.", "Another document.", "Last."}));
}

TEST(TextDocuments, JsonlDocumentsAreTheirTextFields) {
  TempDir dir;
  const auto path = write(dir, "text.jsonl", "{\"text\": \"one\\n\\ntwo\", \"id\": 3}\n\n{\"text\": \"three\"}\n");
  EXPECT_TRUE(is_plain_text_dataset(path));
  EXPECT_EQ(load_text_documents(path), (std::vector<std::string>{"one\n\ntwo", "three"}));
}

TEST(TextDocuments, ReasoningFormatsAreNotPlainText) {
  TempDir dir;
  EXPECT_FALSE(is_plain_text_dataset(write(dir, "icot.txt", "1 2 * 3 4||4 0 1 #### 8 0 4 0\n")));
  EXPECT_FALSE(is_plain_text_dataset(write(dir, "gsm.jsonl", "{\"question\": \"q\", \"answer\": \"#### 1\"}\n")));
  EXPECT_FALSE(is_plain_text_dataset(write(dir, "both.jsonl", "{\"question\": \"q\", \"text\": \"t\"}\n")));
  EXPECT_FALSE(is_plain_text_dataset(write(dir, "coconut.json", "[]")));
  EXPECT_FALSE(is_plain_text_dataset(write(dir, "empty.txt", "\n\n")));
}

TEST(TextDocuments, TheReasoningLoaderSaysWherePlainTextIsRead) {
  TempDir dir;
  const auto path = write(dir, "prose.txt", "Paragraphs of prose, no separator.\n");
  const auto message = error_of([&] { load_dataset(path); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("mode: lm"), std::string::npos) << message;
  EXPECT_NE(message.find("eval-lm --text"), std::string::npos) << message;
}

TEST(TextDocuments, BadInputNamesTheFileAndLine) {
  TempDir dir;
  const auto missing = write(dir, "missing.jsonl", "{\"text\": \"fine\"}\n{\"content\": \"x\"}\n");
  EXPECT_NE(error_of([&] { load_text_documents(missing); }).find("missing.jsonl: line 2: field 'text' is missing"),
            std::string::npos);
  const auto empty = write(dir, "empty.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"  \"}\n");
  EXPECT_NE(error_of([&] { load_text_documents(empty); }).find("empty.jsonl: line 2: field 'text' is empty"), std::string::npos);
  const auto malformed = write(dir, "malformed.jsonl", "{\"text\": \"fine\"}\n{\"text\": \n");
  EXPECT_NE(error_of([&] { load_text_documents(malformed); }).find("malformed.jsonl: line 2"), std::string::npos);
  const auto blank = write(dir, "blank.txt", "\n \n");
  EXPECT_NE(error_of([&] { load_text_documents(blank); }).find("blank.txt: empty dataset"), std::string::npos);
  EXPECT_NE(error_of([&] { load_text_documents(dir.file("absent.txt")); }).find("absent.txt: cannot open"), std::string::npos);
}

TEST(TextDocuments, WindowsPackDocumentsEachFollowedByEos) {
  // Documents of 3, 1 and 4 tokens, EOS 0: the stream 1 2 3 0 | 4 0 | 5 6 7 8 0 (11 tokens).
  const auto windows = pack_text_windows({{1, 2, 3}, {4}, {5, 6, 7, 8}}, 0, 4);
  ASSERT_EQ(windows.size(), 3u);
  EXPECT_EQ(windows[0].question, (std::vector<int64_t>{1, 2, 3, 0}));
  EXPECT_EQ(windows[1].question, (std::vector<int64_t>{4, 0, 5, 6}));
  EXPECT_EQ(windows[2].question, (std::vector<int64_t>{7, 8, 0}));
  // A last window of one token predicts nothing: dropped.
  EXPECT_EQ(pack_text_windows({{1, 2, 3}, {4}}, 0, 5).size(), 1u);
  EXPECT_THROW(pack_text_windows({{1}}, 0, 1), std::invalid_argument);
  EXPECT_EQ(text_window_or_default(0, 8192), kDefaultTextWindow);
  EXPECT_EQ(text_window_or_default(0, 64), 64);
  EXPECT_EQ(text_window_or_default(300, 8192), 300);
}

TEST(TextDocuments, AnLmSequenceLearnsEveryTokenOfItsWindow) {
  TokenizedExample window;
  window.question = {5, 6, 7, 0, 8};
  SequenceOptions options;
  options.mode = TrainingMode::kLm;
  const auto sequence = build_sequence(window, options, SpecialTokenIds{});
  EXPECT_EQ(sequence.ids, window.question);
  EXPECT_EQ(sequence.labels, window.question);
  EXPECT_EQ(sequence.latent_count, 0);
  EXPECT_EQ(training_mode_from_name("lm"), TrainingMode::kLm);
  EXPECT_EQ(training_mode_name(TrainingMode::kLm), "lm");
}

// The shipped text (data/text/README.md): each file reads as plain text, with the documents its
// README counts, and the multiple-choice sets are well formed (4 choices, a label among them, the
// context ending in lm-evaluation-harness's delimiter) and built only from test articles.
TEST(TextDocuments, TheShippedTextAndChoicesAreWhatTheReadmeSays) {
  const std::string root = std::string(COCONUT_SOURCE_DIR) + "/data/text/";
  const std::vector<std::pair<std::string, size_t>> texts = {{"wikipedia-test.txt", 1008}, {"wikipedia-calibration.txt", 309},
                                                             {"wikipedia-healing.txt", 3043}};
  std::set<std::string> test_documents;
  for (const auto& [name, documents] : texts) {
    ASSERT_TRUE(is_plain_text_dataset(root + name)) << name;
    const auto loaded = load_text_documents(root + name);
    EXPECT_EQ(loaded.size(), documents) << name;
    if (name == "wikipedia-test.txt") test_documents.insert(loaded.begin(), loaded.end());
  }
  EXPECT_TRUE(is_plain_text_dataset(root + "shakespeare-tempest.txt"));
  for (const auto& [name, items] : std::vector<std::pair<std::string, size_t>>{{"wiki-describe.jsonl", 992},
                                                                               {"wiki-continuation.jsonl", 945}}) {
    std::ifstream file(root + name);
    size_t count = 0;
    for (std::string line; std::getline(file, line); ++count) {
      const auto item = nlohmann::json::parse(line);
      ASSERT_EQ(item["choices"].size(), 4u) << name << " line " << count + 1;
      EXPECT_LT(item["label"].get<size_t>(), 4u);
      const auto context = item["context"].get<std::string>();
      EXPECT_EQ(context.back(), ' ') << name << " line " << count + 1;
      if (name == "wiki-continuation.jsonl") {  // the first sentence of a test document
        const auto first = context.substr(0, context.size() - 1);
        EXPECT_TRUE(std::any_of(test_documents.begin(), test_documents.end(),
                                [&](const std::string& document) { return document.rfind(first, 0) == 0; }))
            << name << " line " << count + 1;
      }
    }
    EXPECT_EQ(count, items) << name;
  }
}
