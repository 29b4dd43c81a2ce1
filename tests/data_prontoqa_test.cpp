// The ProntoQA generator (data/prontoqa.h) against the released questions: one structural reader,
// written here from the released set alone, must accept every released question and every
// generated one; then the generated set's frequencies beside the released set's, its words within
// the released vocabulary, reproducibility by seed, and no generated question equal to a released one.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "data/prontoqa.h"
#include "support/temp_dir.h"

using namespace coconut;

namespace {

struct Rule {
  std::string subject, object;  // singular class names; object an adjective when !to_class
  bool to_class = false, negated = false, plural = false;
};

std::vector<std::string> sentences_of(const std::string& question) {
  std::vector<std::string> sentences;
  size_t begin = 0;
  while (begin < question.size()) {
    size_t end = question.find(". ", begin);
    if (end == std::string::npos) end = question.size() - 1;
    sentences.push_back(question.substr(begin, end + 1 - begin));
    begin = end + 2;
  }
  return sentences;
}

std::string singular(const std::string& word) {  // "Tumpuses" -> "tumpus"
  std::string lower = word;
  lower[0] = static_cast<char>(std::tolower(lower[0]));
  return lower.size() > 2 && lower.compare(lower.size() - 4, 4, "uses") == 0 ? lower.substr(0, lower.size() - 2) : lower;
}

bool parse_rule(const std::string& sentence, Rule& rule) {
  static const std::regex quantified(R"((Each|Every) (\w+) is (not )?((a|an) )?(\w+)\.)");
  static const std::regex plural(R"((\w+uses) are (not )?(\w+)\.)");
  std::smatch m;
  if (std::regex_match(sentence, m, quantified)) {
    rule = {m[2], m[6], m[4].matched, m[3].matched, false};
    return true;
  }
  if (std::regex_match(sentence, m, plural)) {
    const std::string object = m[3];
    const bool to_class = object.size() > 4 && object.compare(object.size() - 4, 4, "uses") == 0;
    rule = {singular(m[1]), to_class ? singular(object) : object, to_class, m[2].matched, true};
    return true;
  }
  return false;
}

// What a question in the released shape must hold; an empty string when it does, else the first
// thing that does not. Reads the roles off the steps: the chain C1..C5 and the conclusion.
std::string shape_problem(const Example& example) {
  const auto sentences = sentences_of(example.question);
  if (sentences.size() != 26) return "sentences: " + std::to_string(sentences.size());
  if (example.steps.size() != 6) return "steps: " + std::to_string(example.steps.size());
  std::vector<Rule> rules(23);
  for (int i = 0; i < 23; ++i)
    if (!parse_rule(sentences[static_cast<size_t>(i)], rules[static_cast<size_t>(i)])) return "not a rule: " + sentences[static_cast<size_t>(i)];
  std::smatch m;
  static const std::regex fact(R"((\w+) is (a|an) (\w+)\.)"), query(R"(True or false: (\w+) is (not )?(\w+)\.)");
  std::string facts[2];
  std::string name;
  for (int i = 0; i < 2; ++i) {
    if (!std::regex_match(sentences[static_cast<size_t>(23 + i)], m, fact)) return "not a fact: " + sentences[static_cast<size_t>(23 + i)];
    facts[i] = m[3];
    if (i == 1 && m[1] != name) return "two names";
    name = m[1];
  }
  if (!std::regex_match(sentences[25], m, query) || m[1] != name) return "not the query: " + sentences[25];
  const bool query_negated = m[2].matched;
  const std::string property = m[3];
  // Steps 1..5: "Name is a Ck. <a rule of the question>", the rule taking Ck to Ck+1 (k < 5) or to P.
  std::vector<std::string> chain;
  Rule conclusion;
  for (int k = 0; k < 5; ++k) {
    const std::string& step = example.steps[static_cast<size_t>(k)];
    static const std::regex step_form(R"((\w+) is (a|an) (\w+)\. (.*))");
    if (!std::regex_match(step, m, step_form) || m[1] != name) return "step: " + step;
    chain.push_back(m[3]);
    const std::string quoted = m[4];
    if (std::find(sentences.begin(), sentences.begin() + 23, quoted) == sentences.begin() + 23) return "step quotes no rule: " + step;
    Rule rule;
    parse_rule(quoted, rule);
    if (rule.subject != chain.back() || rule.to_class != (k < 4)) return "step's rule: " + step;
    if (k == 4) conclusion = rule;
  }
  for (int k = 1; k < 5; ++k) {
    Rule rule;
    parse_rule(example.steps[static_cast<size_t>(k - 1)].substr(example.steps[static_cast<size_t>(k - 1)].find(". ") + 2), rule);
    if (rule.object != chain[static_cast<size_t>(k)]) return "the chain breaks at step " + std::to_string(k + 1);
  }
  if (facts[0] != chain[0] && facts[1] != chain[0]) return "no fact puts the entity in C1";
  const std::string entity_class = facts[0] == chain[0] ? facts[1] : facts[0];
  if (conclusion.object != property) return "the query asks another property";
  if (example.steps[5] != name + " is " + (conclusion.negated ? "not " : "") + property + ".") return "last step: " + example.steps[5];
  const bool expected_true = query_negated == conclusion.negated;
  if (example.answer != (expected_true ? "True" : "False")) return "answer " + example.answer;
  // Roles: each chain class and E has two parents (C5: R and D5; E: one) and one property; the
  // parents D1..D5 one property each and nothing else; R and Ep nothing; one class X holds P with
  // the opposite polarity and nothing else; every class edge positive; 14 classes in all.
  std::map<std::string, int> parents, properties;
  std::set<std::string> classes;
  for (const auto& rule : rules) {
    classes.insert(rule.subject);
    if (rule.to_class) {
      classes.insert(rule.object);
      if (rule.negated) return "a negated class edge";
      ++parents[rule.subject];
    } else {
      ++properties[rule.subject];
    }
  }
  if (classes.size() != 14) return "classes: " + std::to_string(classes.size());
  for (const auto& c : chain)
    if (parents[c] != 2 || properties[c] != 1) return "chain class " + c + " has " + std::to_string(parents[c]) + " parents";
  if (parents[entity_class] != 1 || properties[entity_class] != 1) return "the entity's other class";
  int contraries = 0;
  for (const auto& rule : rules)
    if (!rule.to_class && rule.object == property && rule.subject != chain[4]) {
      ++contraries;
      if (rule.negated == conclusion.negated || parents[rule.subject] != 0 || properties[rule.subject] != 1) return "the contrary rule";
    }
  if (contraries != 1) return "contrary rules: " + std::to_string(contraries);
  std::set<std::string> property_words;
  for (const auto& rule : rules)
    if (!rule.to_class) property_words.insert(rule.object);
  if (property_words.size() != 11) return "distinct adjectives: " + std::to_string(property_words.size());
  return "";
}

std::set<std::string> words_of(const std::vector<Example>& examples) {
  std::set<std::string> words;
  for (const auto& example : examples) {
    std::istringstream in(example.question);
    for (std::string word; in >> word;) words.insert(word);
    for (const auto& step : example.steps) {
      std::istringstream steps(step);
      for (std::string word; steps >> word;) words.insert(word);
    }
  }
  return words;
}

}  // namespace

TEST(Prontoqa, EveryReleasedAndGeneratedQuestionHasTheReleasedShape) {
  const auto released = load_dataset(coconut::testing::test_data("prontoqa/valid.json"));
  for (const auto& example : released) EXPECT_EQ(shape_problem(example), "") << example.question;
  const auto generated = generate_prontoqa(2000, 5);
  ASSERT_EQ(generated.size(), 2000u);
  for (const auto& example : generated) EXPECT_EQ(shape_problem(example), "") << example.question;
  // The reader can fail: a question whose answer is flipped, or a step that quotes no rule.
  Example flipped = generated[0];
  flipped.answer = flipped.answer == "True" ? "False" : "True";
  EXPECT_EQ(shape_problem(flipped).rfind("answer", 0), 0u);
  Example misquoted = generated[1];
  misquoted.steps[2] += " ";
  EXPECT_NE(shape_problem(misquoted), "");
}

TEST(Prontoqa, FrequenciesAndWordsAsReleasedSeededAndNeverAReleasedQuestion) {
  auto released = load_dataset(coconut::testing::test_data("prontoqa/train.json"));
  const auto valid = load_dataset(coconut::testing::test_data("prontoqa/valid.json"));
  released.insert(released.end(), valid.begin(), valid.end());
  const auto generated = generate_prontoqa(4000, 9);
  // Frequencies beside the released 9,200 questions' (binomial spreads at 4,000: about 0.8 points).
  const auto rates = [](const std::vector<Example>& examples) {
    double answered_true = 0, conclusion_negated = 0, query_negated = 0, plural = 0, first_fact_c1 = 0;
    for (const auto& example : examples) {
      answered_true += example.answer == "True";
      conclusion_negated += example.steps[5].find(" is not ") != std::string::npos;
      query_negated += example.question.find("True or false: ") != std::string::npos &&
                       example.question.substr(example.question.find("True or false: ")).find(" is not ") != std::string::npos;
      const auto sentences = sentences_of(example.question);
      for (int i = 0; i < 23; ++i) plural += sentences[static_cast<size_t>(i)].find(" are ") != std::string::npos;
      first_fact_c1 += example.steps[0].rfind(sentences[23], 0) == 0;
    }
    const auto n = static_cast<double>(examples.size());
    return std::vector<double>{answered_true / n, conclusion_negated / n, query_negated / n, plural / (23 * n), first_fact_c1 / n};
  };
  const auto want = rates(released), got = rates(generated);
  const char* what[] = {"answer True", "conclusion negated", "query negated", "plural rules", "C1's fact first"};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 0.03) << what[i];
  // Every word of a generated question or step is one the released questions use.
  const auto known = words_of(released);
  for (const auto& word : words_of(generated)) EXPECT_TRUE(known.count(word)) << word;
  EXPECT_EQ(words_of(generated).size(), known.size());  // and all of them are used
  std::set<std::string> released_questions;
  for (const auto& example : released) released_questions.insert(example.question);
  for (const auto& example : generated) EXPECT_FALSE(released_questions.count(example.question));
  EXPECT_EQ(generate_prontoqa(3, 9)[2].question, generated[2].question);  // seeded
  EXPECT_NE(generate_prontoqa(3, 10)[2].question, generated[2].question);
}
