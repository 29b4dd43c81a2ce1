// Dataset loaders on the real shipped files, the multiplication generator against the icot
// release line for line, and one test per malformed input.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <regex>
#include <set>

#include <fstream>
#include <sstream>

#include "data/example.h"
#include "support/temp_dir.h"

using namespace coconut;
using coconut::testing::test_data;
using coconut::testing::TempDir;

TEST(Loaders, CoconutJsonOfEveryShippedSet) {
  const auto prontoqa = load_dataset(test_data("prontoqa/valid.json"));
  EXPECT_EQ(prontoqa.size(), 200u);
  EXPECT_EQ(prontoqa[0].answer, "True");
  EXPECT_EQ(prontoqa[0].steps.size(), 6u);
  EXPECT_EQ(load_dataset(test_data("prontoqa/train.json")).size(), 9000u);
  const auto prosqa = load_dataset(test_data("prosqa/valid.json"));
  EXPECT_EQ(prosqa.size(), 300u);
  EXPECT_TRUE(prosqa[0].extra.contains("edges"));  // extra fields kept
  EXPECT_TRUE(prosqa[0].extra.contains("idx_to_symbol"));
  const auto gsm8k = load_dataset(test_data("gsm8k/valid.json"));
  EXPECT_EQ(gsm8k.size(), 500u);
  EXPECT_EQ(gsm8k[0].steps[0], "<<4-2=2>>");
}

// data/gsm8k/train.json (data/make_gsm8k_train.py): openai/grade-school-math's training problems
// less the validation set's, each step one calculator annotation, the answers as the original
// JSONL loader reads them (the fixture holds train.jsonl's first two lines).
TEST(Loaders, Gsm8kTrainingSetIsTheOriginalLessValidation) {
  const auto train = load_dataset(test_data("gsm8k/train.json"));
  const auto valid = load_dataset(test_data("gsm8k/valid.json"));
  ASSERT_EQ(train.size(), 6973u);
  std::set<std::string> held_out;
  for (const auto& example : valid) held_out.insert(example.question);
  const std::regex annotation(R"(<<[^<>=]+(=[^<>=]+)+>>)");
  size_t without_steps = 0;
  for (const auto& example : train) {
    EXPECT_EQ(held_out.count(example.question), 0u) << example.question;
    without_steps += example.steps.empty();
    for (const auto& step : example.steps) EXPECT_TRUE(std::regex_match(step, annotation)) << step;
  }
  EXPECT_EQ(without_steps, 89u);
  const auto original = load_dataset(std::string(COCONUT_SOURCE_DIR) + "/tests/fixtures/data/gsm8k_original.jsonl");
  for (size_t i = 0; i < original.size(); ++i) {
    EXPECT_EQ(train[i].question, original[i].question);
    EXPECT_EQ(train[i].steps, original[i].steps);
    EXPECT_EQ(train[i].answer, original[i].answer);
  }
}

TEST(Loaders, IcotTextMultiplicationAndGsm8k) {
  const auto mult = load_dataset(test_data("icot/4_by_4_mult/valid.txt"));
  ASSERT_EQ(mult.size(), 1000u);
  EXPECT_EQ(mult[0].question, "5 6 3 2 * 7 4 3 4");
  EXPECT_EQ(mult[0].steps, (std::vector<std::string>{"5 5 5 6 1", "0 0 6 4 9 0 ( 5 5 1 1 1 1 )",
                                                      "0 0 5 9 0 7 0 ( 5 5 6 0 2 8 0 )", "0 0 0 0 6 4 9 0"}));
  EXPECT_EQ(mult[0].answer, "5 5 6 0 8 2 0 1");
  const auto gsm8k = load_dataset(test_data("icot/gsm8k/valid.txt"));
  EXPECT_EQ(gsm8k.size(), 500u);
  EXPECT_EQ(gsm8k[0].steps, (std::vector<std::string>{"<<4-2=2>>", "<<2/.5=4>>", "<<12/4=3>>", "<<100*3=300>>"}));
  EXPECT_EQ(gsm8k[0].answer, "300");
}

TEST(Loaders, Gsm8kOriginalJsonl) {
  const auto examples = load_dataset(std::string(COCONUT_SOURCE_DIR) + "/tests/fixtures/data/gsm8k_original.jsonl");
  ASSERT_EQ(examples.size(), 2u);
  EXPECT_EQ(examples[0].steps, (std::vector<std::string>{"<<48/2=24>>", "<<48+24=72>>"}));
  EXPECT_EQ(examples[0].answer, "72");
  EXPECT_EQ(examples[1].answer, "10");
}

TEST(Multiplication, RegeneratesTheReleaseLineForLine) {
  for (const char* file : {"icot/4_by_4_mult/valid.txt", "icot/5_by_5_mult/valid.txt"}) {
    std::ifstream in(test_data(file));
    std::string line;
    int checked = 0;
    while (std::getline(in, line)) {
      // Operands from the question "a0 a1 ... * b0 b1 ...".
      std::vector<int> a, b;
      std::istringstream words(line.substr(0, line.find("||")));
      std::string word;
      bool second = false;
      while (words >> word) {
        if (word == "*") {
          second = true;
          continue;
        }
        (second ? b : a).push_back(std::stoi(word));
      }
      ASSERT_EQ(icot_line(multiplication_example(a, b)), line) << file << " line " << checked + 1;
      ++checked;
    }
    EXPECT_EQ(checked, 1000) << file;
  }
}

TEST(Multiplication, GeneratorIsSeededAndCorrect) {
  const auto first = generate_multiplication(4, 50, 7), again = generate_multiplication(4, 50, 7);
  ASSERT_EQ(first.size(), 50u);
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(icot_line(first[i]), icot_line(again[i]));
  EXPECT_NE(icot_line(generate_multiplication(4, 1, 8)[0]), icot_line(first[0]));
  // The answer is the product (digits least-significant first).
  const auto value = [](const std::string& digits) {
    std::istringstream words(digits);
    long long number = 0, scale = 1;
    std::string word;
    while (words >> word) number += std::stoll(word) * scale, scale *= 10;
    return number;
  };
  for (const auto& example : first) {
    const auto star = example.question.find(" * ");
    EXPECT_EQ(value(example.question.substr(0, star)) * value(example.question.substr(star + 3)), value(example.answer));
  }
}

TEST(Loaders, MalformedInputNamesFileLineAndField) {
  TempDir dir;
  { std::ofstream(dir.file("a.json")) << R"([{"question": "q", "steps": ["s"], "answer": "a"}, {"question": "q", "answer": "a"}])"; }
  EXPECT_THROW_WITH(load_dataset(dir.file("a.json")), "a.json", "example 1", "steps");
  { std::ofstream(dir.file("b.json")) << R"([{"question": "q", "steps": [], "answer": 3}])"; }
  EXPECT_THROW_WITH(load_dataset(dir.file("b.json")), "b.json", "example 0", "answer");
  { std::ofstream(dir.file("c.json")) << "[{\"question\": "; }
  EXPECT_THROW_WITH(load_dataset(dir.file("c.json")), "c.json", "malformed JSON");
  { std::ofstream(dir.file("d.txt")) << "1 2 * 3 4||4 0 1 #### 8 0 4 0\nno separator here\n"; }
  EXPECT_THROW_WITH(load_dataset(dir.file("d.txt")), "d.txt", "line 2", "question");
  { std::ofstream(dir.file("e.jsonl")) << "{\"question\": \"q\", \"answer\": \"no final answer\"}\n"; }
  EXPECT_THROW_WITH(load_dataset(dir.file("e.jsonl")), "e.jsonl", "line 1", "answer");
  { std::ofstream(dir.file("f.csv")) << "x"; }
  EXPECT_THROW_WITH(load_dataset(dir.file("f.csv")), "f.csv", "unknown dataset format");
  EXPECT_THROW_WITH(load_dataset(dir.file("missing.json")), "missing.json", "cannot open");
  // Empty questions and answers: refused by every loader alike.
  { std::ofstream(dir.file("g.json")) << R"([{"question": " ", "steps": [], "answer": "a"}])"; }
  EXPECT_THROW_WITH(load_dataset(dir.file("g.json")), "g.json", "example 0", "'question' is empty");
  { std::ofstream(dir.file("h.json")) << R"([{"question": "q", "steps": [], "answer": ""}])"; }
  EXPECT_THROW_WITH(load_dataset(dir.file("h.json")), "h.json", "example 0", "'answer' is empty");
  { std::ofstream(dir.file("i.jsonl")) << "{\"question\": \"q\", \"answer\": \"3 + 4 ####  \"}\n"; }
  EXPECT_THROW_WITH(load_dataset(dir.file("i.jsonl")), "i.jsonl", "line 1", "nothing after '####'");
}

TEST(Loaders, EmptyDatasetIsAnError) {
  TempDir dir;
  { std::ofstream(dir.file("empty.json")) << "[]"; }
  EXPECT_THROW_WITH(load_dataset(dir.file("empty.json")), "empty.json", "empty dataset");
  { std::ofstream(dir.file("empty.txt")) << "\n\n"; }
  EXPECT_THROW_WITH(load_dataset(dir.file("empty.txt")), "empty.txt", "empty dataset");
}

TEST(Loaders, SaveAndReloadKeepsExtraFields) {
  TempDir dir;
  auto examples = load_dataset(test_data("prosqa/valid.json"));
  examples.resize(3);
  save_coconut_json(dir.file("out.json"), examples);
  const auto again = load_dataset(dir.file("out.json"));
  ASSERT_EQ(again.size(), 3u);
  EXPECT_EQ(again[2].steps, examples[2].steps);
  EXPECT_EQ(again[2].extra, examples[2].extra);
}

TEST(ShuffleFacts, PermutesEverySentenceButTheQuery) {
  Example example;
  example.question = "Every a is a b. Each b is c. Max is a a. Fae is a d. True or false: Max is c.";
  example.steps = {"Max is a a."};
  example.answer = "True";
  const auto sentences = [](const std::string& text) {
    std::vector<std::string> parts;
    std::string part;
    for (size_t i = 0; i < text.size(); ++i) {
      part += text[i];
      if (text[i] == '.' && (i + 1 == text.size() || text[i + 1] == ' ')) {
        parts.push_back(part);
        part.clear();
        if (i + 1 < text.size()) ++i;
      }
    }
    return parts;
  };
  std::set<std::string> orders;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::mt19937_64 rng(seed);
    const auto shuffled = coconut::shuffle_question_sentences(example, rng);
    auto got = sentences(shuffled.question), want = sentences(example.question);
    ASSERT_EQ(got.size(), 5u) << shuffled.question;
    EXPECT_EQ(got.back(), "True or false: Max is c.");
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(got, want);
    EXPECT_EQ(shuffled.steps, example.steps);
    EXPECT_EQ(shuffled.answer, example.answer);
    orders.insert(shuffled.question);
    std::mt19937_64 again(seed);
    EXPECT_EQ(coconut::shuffle_question_sentences(example, again).question, shuffled.question);  // seeded
  }
  EXPECT_GT(orders.size(), 10u);  // 24 orders of 4 facts are possible

  // Dropping unquoted facts: the quoted fact and the query always stay, the others go at the rate asked.
  size_t kept_unquoted = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    std::mt19937_64 rng(seed);
    const auto shorter = coconut::shuffle_question_sentences(example, rng, 0.75);
    const auto parts = sentences(shorter.question);
    EXPECT_NE(shorter.question.find("Max is a a."), std::string::npos) << shorter.question;
    EXPECT_EQ(parts.back(), "True or false: Max is c.");
    kept_unquoted += parts.size() - 2;
  }
  EXPECT_NEAR(static_cast<double>(kept_unquoted) / (200.0 * 3), 0.25, 0.06);  // 3 unquoted facts each

  // Keeping the hard distractors: a fact sharing a rare query word ("c", in one fact) stays even at a
  // drop rate of 1; "is" is in every fact, so it makes none of them hard.
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::mt19937_64 rng(seed);
    auto parts = sentences(coconut::shuffle_question_sentences(example, rng, 1.0, true).question);
    ASSERT_EQ(parts.size(), 3u);
    EXPECT_EQ(parts.back(), "True or false: Max is c.");
    parts.pop_back();
    std::sort(parts.begin(), parts.end());
    EXPECT_EQ(parts, (std::vector<std::string>{"Each b is c.", "Max is a a."}));
  }
}
