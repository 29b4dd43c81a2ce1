#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "data/example.h"
#include "data/text_documents.h"
#include "util/atomic_file.h"
#include "util/json_text.h"

namespace coconut {

using nlohmann::json;

namespace {

[[noreturn]] void fail(const std::string& where, const std::string& problem) {
  throw std::runtime_error(where + ": " + problem);
}

std::string trim(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \t\r\n") - begin + 1);
}

std::ifstream open_or_fail(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(path, "cannot open dataset file");
  return in;
}

// Parses every non-blank line of a text file with `parse(line, where)`, where = "path: line N".
template <typename Parse>
std::vector<Example> parse_lines(const std::string& path, Parse&& parse) {
  auto in = open_or_fail(path);
  std::vector<Example> examples;
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (!trim(line).empty()) examples.push_back(parse(line, path + ": line " + std::to_string(number)));
  }
  if (examples.empty()) fail(path, "empty dataset (no examples)");
  return examples;
}

void require_not_empty(const std::vector<Example>& examples, const std::string& path) {
  if (examples.empty()) fail(path, "empty dataset (no examples)");
}

// The `<<...>>` annotations of a GSM8K solution, in order.
std::vector<std::string> annotations(const std::string& text) {
  std::vector<std::string> found;
  size_t position = 0;
  while ((position = text.find("<<", position)) != std::string::npos) {
    const size_t end = text.find(">>", position);
    if (end == std::string::npos) break;
    found.push_back(text.substr(position, end + 2 - position));
    position = end + 2;
  }
  return found;
}

}  // namespace

std::vector<Example> load_coconut_json(const std::string& path) {
  auto in = open_or_fail(path);
  std::stringstream text;
  text << in.rdbuf();
  const json document = parse_json_text(text.str(), path);
  if (!document.is_array()) fail(path, "expected a JSON list of examples");
  std::vector<Example> examples;
  for (size_t index = 0; index < document.size(); ++index) {
    const json& item = document[index];
    const std::string where = path + ": example " + std::to_string(index);
    if (!item.is_object()) fail(where, "is not an object");
    for (const char* field : {"question", "answer"})
      if (!item.contains(field) || !item[field].is_string()) fail(where, std::string("field '") + field + "' is missing or not a string");
    if (!item.contains("steps") || !item["steps"].is_array()) fail(where, "field 'steps' is missing or not a list");
    Example example;
    example.question = item["question"].get<std::string>();
    example.answer = item["answer"].get<std::string>();
    if (trim(example.question).empty()) fail(where, "field 'question' is empty");
    if (trim(example.answer).empty()) fail(where, "field 'answer' is empty");
    for (const json& step : item["steps"]) {
      if (!step.is_string()) fail(where, "field 'steps' holds a non-string: " + step.dump());
      example.steps.push_back(step.get<std::string>());
    }
    for (auto it = item.begin(); it != item.end(); ++it)
      if (it.key() != "question" && it.key() != "steps" && it.key() != "answer") example.extra[it.key()] = it.value();
    examples.push_back(std::move(example));
  }
  require_not_empty(examples, path);
  return examples;
}

std::vector<Example> load_icot_text(const std::string& path) {
  return parse_lines(path, [](const std::string& line, const std::string& where) {
    const size_t bar = line.find("||"), hashes = line.rfind("####");
    if (bar == std::string::npos) fail(where, "field 'question': no '||' separator");
    if (hashes == std::string::npos || hashes < bar) fail(where, "field 'answer': no '####' after the chain of thought");
    Example example;
    example.question = trim(line.substr(0, bar));
    example.answer = trim(line.substr(hashes + 4));
    const std::string chain = trim(line.substr(bar + 2, hashes - bar - 2));
    if (chain.find("<<") != std::string::npos) {
      example.steps = annotations(chain);
    } else if (chain.find(" + ") != std::string::npos) {
      size_t start = 0, plus = 0;
      while ((plus = chain.find(" + ", start)) != std::string::npos) {
        example.steps.push_back(trim(chain.substr(start, plus - start)));
        start = plus + 3;
      }
      example.steps.push_back(trim(chain.substr(start)));
    } else if (!chain.empty()) {
      example.steps.push_back(chain);
    }
    if (example.question.empty()) fail(where, "field 'question' is empty");
    if (example.answer.empty()) fail(where, "field 'answer' is empty");
    return example;
  });
}

std::vector<Example> load_gsm8k_jsonl(const std::string& path) {
  return parse_lines(path, [](const std::string& line, const std::string& where) {
    const json item = parse_json_text(line, where);
    if (!item.is_object()) fail(where, "is not a JSON object");
    for (const char* field : {"question", "answer"})
      if (!item.contains(field) || !item[field].is_string()) fail(where, std::string("field '") + field + "' is missing or not a string");
    const std::string solution = item["answer"].get<std::string>();
    const size_t hashes = solution.rfind("####");
    if (hashes == std::string::npos) fail(where, "field 'answer' has no '#### N' final answer");
    Example example;
    example.question = item["question"].get<std::string>();
    example.steps = annotations(solution.substr(0, hashes));
    example.answer = trim(solution.substr(hashes + 4));
    if (trim(example.question).empty()) fail(where, "field 'question' is empty");
    if (example.answer.empty()) fail(where, "field 'answer': nothing after '####'");
    example.extra["solution"] = solution;
    return example;
  });
}

std::vector<Example> load_dataset(const std::string& path) {
  if (is_plain_text_dataset(path))
    fail(path, "plain text (documents, no questions and answers): train or heal on it with mode: lm, score layers and "
               "heads on it, or measure its perplexity with coconut eval-lm --text");
  const std::string extension = std::filesystem::path(path).extension().string();
  if (extension == ".json") return load_coconut_json(path);
  if (extension == ".jsonl") return load_gsm8k_jsonl(path);
  if (extension == ".txt") return load_icot_text(path);
  fail(path, "unknown dataset format (expected .json, .jsonl or .txt)");
}

void save_coconut_json(const std::string& path, const std::vector<Example>& examples) {
  json document = json::array();
  for (const Example& example : examples) {
    json item = example.extra.is_object() ? example.extra : json::object();
    item["question"] = example.question;
    item["steps"] = example.steps;
    item["answer"] = example.answer;
    document.push_back(std::move(item));
  }
  write_file_atomically(path, document.dump(1) + "\n");
}

namespace {
// The words of a sentence, without the punctuation around them.
std::vector<std::string> sentence_words(const std::string& sentence) {
  std::vector<std::string> words;
  std::string word;
  for (const char c : sentence + " ") {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      word += c;
    } else if (!word.empty()) {
      words.push_back(word);
      word.clear();
    }
  }
  return words;
}
}  // namespace

Example shuffle_question_sentences(const Example& example, std::mt19937_64& rng, double drop_unused, bool keep_query_matches) {
  std::vector<std::string> sentences;
  const std::string& text = example.question;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if ((c == '.' || c == '?' || c == '!') && (i + 1 == text.size() || text[i + 1] == ' ')) {
      sentences.push_back(text.substr(start, i + 1 - start));
      start = i + 1;
      while (start < text.size() && text[start] == ' ') ++start;
      i = start - 1;
    }
  }
  if (start < text.size()) sentences.push_back(text.substr(start));
  Example shuffled = example;
  if (sentences.size() < 3) return shuffled;
  std::shuffle(sentences.begin(), sentences.end() - 1, rng);
  if (drop_unused > 0) {
    std::bernoulli_distribution drop(drop_unused);
    // Only with keep_query_matches: the facts that share one of the query's rare words (those in at
    // most two facts: "Max", "wooden" in "Max is not wooden").
    std::vector<bool> matches_query(sentences.size(), false);
    if (keep_query_matches) {
      std::vector<std::vector<std::string>> fact_words;
      for (auto sentence = sentences.begin(); sentence + 1 != sentences.end(); ++sentence)
        fact_words.push_back(sentence_words(*sentence));
      const auto has_word = [](const std::vector<std::string>& words, const std::string& word) {
        return std::find(words.begin(), words.end(), word) != words.end();
      };
      for (const auto& word : sentence_words(sentences.back())) {
        const auto facts_with_word =
            std::count_if(fact_words.begin(), fact_words.end(), [&](const auto& words) { return has_word(words, word); });
        if (facts_with_word > 2) continue;
        for (size_t i = 0; i < fact_words.size(); ++i)
          if (has_word(fact_words[i], word)) matches_query[i] = true;
      }
    }
    std::vector<std::string> kept;
    for (size_t i = 0; i < sentences.size(); ++i) {
      const bool quoted = std::any_of(example.steps.begin(), example.steps.end(),
                                      [&](const std::string& step) { return step.find(sentences[i]) != std::string::npos; });
      if (i + 1 == sentences.size() || quoted || matches_query[i] || !drop(rng)) kept.push_back(sentences[i]);
    }
    sentences = std::move(kept);
  }
  shuffled.question.clear();
  for (const auto& sentence : sentences) shuffled.question += (shuffled.question.empty() ? "" : " ") + sentence;
  return shuffled;
}

}  // namespace coconut
