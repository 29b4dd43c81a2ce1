// The text of a growing list of generated tokens, released piece by piece: a piece never ends
// inside a UTF-8 character, on a replacement character that the next token may still complete,
// or inside what may still become a stop string, nor after the start of
// a last word the tokenizer may still put words in front of (word forms' postfix marks), the text ends before
// the first stop string, and the pieces put together are the final text (so a streamed answer
// equals the same answer sent at once).
#pragma once

#include <optional>

#include <cstdint>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace coconut::serve {

class TextStream {
 public:
  // `preceding`: the prompt's last token, when the text continues it directly (the tokens are then
  // decoded after it, Tokenizer::decode_continuation).
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop, std::optional<int64_t> preceding = std::nullopt);
  // Adds a generated token; returns the text that became final (possibly empty). Once a stop
  // string appears, stopped() is true and nothing more is released.
  std::string add(int64_t token);
  // The rest of the text, at the end of generation.
  std::string finish();
  bool stopped() const { return stopped_; }
  int64_t token_count() const { return static_cast<int64_t>(tokens_.size()); }

 private:
  const Tokenizer& tokenizer_;
  std::vector<std::string> stop_;
  bool hold_last_word_;           // the tokenizer may still put words in front of the last one
  std::vector<int64_t> context_;  // the preceding token, or none
  std::vector<int64_t> tokens_;
  std::string decoded_;     // every token, special tokens left out
  size_t released_ = 0;     // bytes of decoded_ handed out
  bool stopped_ = false;
};

// Length of the longest prefix of `text` that does not end inside a UTF-8 character.
size_t complete_utf8_prefix(const std::string& text);

}  // namespace coconut::serve
