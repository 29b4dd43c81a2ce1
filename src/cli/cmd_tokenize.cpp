// coconut tokenize: lines from stdin -> token ids (plain: space-separated; --jsonl: {"ids": [...]}).
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "text/hf_tokenizer.h"
#include "util/json_text.h"

namespace coconut::cli {
namespace {

struct TokenizeFlags {
  std::string tokenizer;
  bool jsonl = false, add_special_tokens = false, decode = false;
};

int run_tokenize(const TokenizeFlags& flags) {
  const auto tokenizer = HfTokenizer::load(flags.tokenizer);
  std::string line;
  int64_t line_number = 0;
  while (std::getline(std::cin, line)) {
    ++line_number;
    if (flags.decode) {
      std::cout << tokenizer->decode(parse_ids(line, "stdin line " + std::to_string(line_number))) << "\n";
      continue;
    }
    std::string text = line;
    if (flags.jsonl) {
      const nlohmann::json object = parse_json_text(line, "stdin line " + std::to_string(line_number));
      if (!object.is_object() || !object.contains("text") || !object["text"].is_string())
        throw std::runtime_error("stdin line " + std::to_string(line_number) + ": expected {\"text\": \"...\"}");
      text = object["text"].get<std::string>();
    }
    const auto ids = flags.add_special_tokens ? tokenizer->encode_with_special_tokens(text) : tokenizer->encode(text);
    if (flags.jsonl) {
      std::cout << nlohmann::json{{"ids", ids}}.dump() << "\n";
    } else {
      for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
      std::cout << "\n";
    }
  }
  return 0;
}

const bool registered = register_command({"tokenize", "encode lines from stdin with an HF tokenizer.json",
                                          [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<TokenizeFlags>();
  app.add_option("--tokenizer", flags->tokenizer, "tokenizer.json or a model folder holding one")->required();
  app.add_flag("--jsonl", flags->jsonl, "input lines are {\"text\": ...}; output lines are {\"ids\": [...]}");
  app.add_flag("--add-special-tokens", flags->add_special_tokens, "apply the post-processor template (e.g. BOS)");
  app.add_flag("--decode", flags->decode, "the reverse: comma-separated ids per line -> text");
  return [flags] { return run_tokenize(*flags); };
}});

}  // namespace
}  // namespace coconut::cli
