#include "data/text_documents.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "util/json_text.h"

namespace coconut {

namespace {

bool blank(const std::string& line) { return line.find_first_not_of(" \t\r\n") == std::string::npos; }

std::ifstream open_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(path + ": cannot open dataset file");
  return in;
}

std::string extension_of(const std::string& path) { return std::filesystem::path(path).extension().string(); }

}  // namespace

bool is_plain_text_dataset(const std::string& path) {
  const std::string extension = extension_of(path);
  if (extension != ".txt" && extension != ".jsonl") return false;
  auto in = open_text(path);
  std::string line;
  while (std::getline(in, line) && blank(line)) {
  }
  if (blank(line)) return false;  // an empty file: the reasoning loaders say so
  if (extension == ".txt") return line.find("||") == std::string::npos;
  nlohmann::json item;
  try {
    item = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception&) {
    return false;  // the reasoning loader names the bad line
  }
  return item.is_object() && item.contains("text") && !item.contains("question");
}

std::vector<std::string> load_text_documents(const std::string& path) {
  auto in = open_text(path);
  std::vector<std::string> documents;
  std::string line;
  int64_t number = 0;
  if (extension_of(path) == ".jsonl") {
    while (std::getline(in, line)) {
      ++number;
      if (blank(line)) continue;
      const std::string where = path + ": line " + std::to_string(number);
      const auto item = parse_json_text(line, where);
      if (!item.is_object()) throw std::invalid_argument(where + ": is not a JSON object");
      if (!item.contains("text") || !item["text"].is_string())
        throw std::invalid_argument(where + ": field 'text' is missing or not a string");
      const auto text = item["text"].get<std::string>();
      if (blank(text)) throw std::invalid_argument(where + ": field 'text' is empty");
      documents.push_back(text);
    }
  } else {
    std::string document;
    const auto finish = [&] {
      if (!document.empty()) documents.push_back(document);
      document.clear();
    };
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (blank(line)) {
        finish();
      } else {
        document += (document.empty() ? "" : "\n") + line;
      }
    }
    finish();
  }
  if (documents.empty()) throw std::invalid_argument(path + ": empty dataset (no documents)");
  return documents;
}

std::vector<TokenizedExample> pack_text_windows(const std::vector<std::vector<int64_t>>& documents, int64_t eos,
                                                int64_t window) {
  if (window < 2) throw std::invalid_argument("text window must be at least 2 tokens, got " + std::to_string(window));
  std::vector<int64_t> stream;
  for (const auto& document : documents) {
    stream.insert(stream.end(), document.begin(), document.end());
    stream.push_back(eos);
  }
  std::vector<TokenizedExample> windows;
  for (size_t begin = 0; begin + 2 <= stream.size(); begin += static_cast<size_t>(window)) {
    TokenizedExample example;
    const size_t end = std::min(stream.size(), begin + static_cast<size_t>(window));
    example.question.assign(stream.begin() + static_cast<std::ptrdiff_t>(begin), stream.begin() + static_cast<std::ptrdiff_t>(end));
    windows.push_back(std::move(example));
  }
  return windows;
}

std::vector<TokenizedExample> text_windows(const std::vector<std::string>& documents, const Tokenizer& tokenizer,
                                           int64_t eos, int64_t window) {
  std::vector<std::vector<int64_t>> ids;
  ids.reserve(documents.size());
  for (const auto& document : documents) ids.push_back(tokenizer.encode_with_special_tokens(document));
  return pack_text_windows(ids, eos, window);
}

int64_t text_window_or_default(int64_t requested, int64_t context) {
  if (requested > 0) return requested;
  return std::min(context, kDefaultTextWindow);
}

}  // namespace coconut
