// A GGUF file's tokenizer (its tokenizer.ggml.* metadata) as Hugging Face tokenizer files, read the
// way llama.cpp's vocabulary loader reads them:
//   - "gpt2": byte-level BPE (tokens, merges). The pre-tokenizer follows tokenizer.ggml.pre with
//     llama.cpp's expressions for that name: "smollm" (single digits, then GPT-2's pattern),
//     "llama-bpe" / "llama3" / "llama-v3" (Llama 3's pattern; whole words in the vocabulary are
//     taken before merging), "gpt-2" (GPT-2's pattern) and "default" (llama.cpp's fallback chain);
//   - "llama": SentencePiece-style BPE (tokens, scores, byte tokens <0xXX>): merges are rebuilt from
//     the scores (the pair whose joined token scores highest merges first, as llama.cpp's SPM
//     tokenizer does), with the space prefix of tokenizer.ggml.add_space_prefix.
// Another tokenizer model or pre-tokenizer name is refused by name; nothing is guessed.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "io/gguf.h"

namespace coconut {

struct GgufTokenizerFiles {
  nlohmann::json tokenizer;         // tokenizer.json
  nlohmann::json tokenizer_config;  // tokenizer_config.json: special tokens, add_bos_token, chat_template
  std::optional<int64_t> bos_id, eos_id, pad_id;
  std::string model;  // gpt2 | llama
  std::string pre;    // the pre-tokenizer's name (gpt2 only)
};

GgufTokenizerFiles tokenizer_from_gguf(const GgufFile& file);

}  // namespace coconut
