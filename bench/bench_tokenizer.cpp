// Tokenizer throughput: load time, and encode MB/s and tokens/s of the Llama 3 tokenizer on
// English prose (ProntoQA questions and the stories answer keys) and on code (this project's
// sources), one core, measured in one run; and whether one long line costs linear time with a
// SentencePiece-style tokenizer (stories260K's: no pre-tokenizer, the whole line is one piece).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "text/hf_tokenizer.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Best of `repeats` encodes, in seconds; the token count through `tokens`.
double encode_seconds(const coconut::HfTokenizer& tokenizer, const std::string& text, size_t& tokens, int repeats = 3) {
  double best = 1e30;
  for (int repeat = 0; repeat < repeats; ++repeat) {
    const auto start = Clock::now();
    tokens = tokenizer.encode(text).size();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

void measure(const coconut::HfTokenizer& tokenizer, const std::string& name, const std::string& text) {
  tokenizer.encode(text.substr(0, 4096));  // touch the code paths
  // A fresh tokenizer cache would be more pessimistic; the reference also caches words.
  size_t tokens = 0;
  const double best = encode_seconds(tokenizer, text, tokens);
  fmt::print("{:<8} {:>8.2f} MB {:>10} tokens {:>8.1f} MB/s {:>12.0f} tokens/s\n", name, text.size() / 1e6, tokens,
             text.size() / best / 1e6, tokens / best);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_tokenizer: encode throughput of the Llama 3 tokenizer"};
  std::string tokenizer_path = "tests/fixtures/tokenizers/llama3/tokenizer.json", text_path = "data/prontoqa/train.json",
              sources = "src", spm_path = "tests/fixtures/models/stories260K/tokenizer.json";
  app.add_option("--tokenizer", tokenizer_path, "tokenizer.json to time")->capture_default_str();
  app.add_option("--text", text_path, "Coconut JSON dataset whose questions and steps are encoded")->capture_default_str();
  app.add_option("--sources", sources, "folder of code to encode")->capture_default_str();
  app.add_option("--spm-tokenizer", spm_path, "SentencePiece-style tokenizer.json for the long-line case")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const auto start = Clock::now();
  const auto tokenizer = coconut::HfTokenizer::load(tokenizer_path);
  fmt::print("load {:.2f} s\n", std::chrono::duration<double>(Clock::now() - start).count());

  std::string prose;
  const auto questions = nlohmann::json::parse(read_file(text_path));
  for (const auto& example : questions) {
    prose += example["question"].get<std::string>() + "\n";
    for (const auto& step : example["steps"]) prose += step.get<std::string>() + " ";
    prose += "\n";
  }
  for (const auto& key : nlohmann::json::parse(read_file("tests/fixtures/models/stories260K/answer_keys.json")))
    prose += key["output_text"].get<std::string>() + "\n";
  std::string code;
  for (const auto& entry : fs::recursive_directory_iterator(sources))
    if (entry.path().extension() == ".cpp" || entry.path().extension() == ".h") code += read_file(entry.path());
  while (code.size() < 2'000'000 && !code.empty()) code += code;
  measure(*tokenizer, "prose", prose);
  measure(*tokenizer, "code", code);

  // One line of prose, 1 MB and 4 MB: linear time gives a ratio near 4 (it was 16 and more when
  // the normaliser's replacement moved the rest of the line at every space).
  std::string line;
  for (char c : prose) line += c == '\n' ? ' ' : c;
  while (line.size() < 4'000'000) line += line;
  const auto spm = coconut::HfTokenizer::load(spm_path);
  size_t tokens_1mb = 0, tokens_4mb = 0;
  // Once each: the line is one piece, so a repeat would only read the tokenizer's piece cache.
  const double one = encode_seconds(*spm, line.substr(0, 1'000'000), tokens_1mb, 1);
  const double four = encode_seconds(*spm, line.substr(0, 4'000'000), tokens_4mb, 1);
  fmt::print("long line (SentencePiece-style): 1 MB {:.2f} s, 4 MB {:.2f} s, ratio {:.2f} (linear: 4)\n", one, four, four / one);
  return 0;
}
