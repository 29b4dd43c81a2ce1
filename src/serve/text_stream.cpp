#include "serve/text_stream.h"

#include <algorithm>

namespace coconut::serve {

size_t complete_utf8_prefix(const std::string& text) {
  // Walk back over at most 3 continuation bytes to the last lead byte; keep it only if complete.
  size_t end = text.size();
  size_t start = end;
  while (start > 0 && end - start < 4 && (static_cast<unsigned char>(text[start - 1]) & 0xC0) == 0x80) --start;
  if (start == 0) return end;
  const auto lead = static_cast<unsigned char>(text[start - 1]);
  size_t length = 1;
  if ((lead & 0xE0) == 0xC0) length = 2;
  else if ((lead & 0xF0) == 0xE0) length = 3;
  else if ((lead & 0xF8) == 0xF0) length = 4;
  else return end;  // ASCII or a stray byte: nothing to wait for
  return end - (start - 1) < length ? start - 1 : end;
}

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop, std::optional<int64_t> preceding)
    : tokenizer_(tokenizer), stop_(std::move(stop)), hold_last_word_(tokenizer.decode_may_insert_before_last_word()) {
  if (preceding) context_ = {*preceding};
}

std::string TextStream::add(int64_t token) {
  if (stopped_) return "";
  tokens_.push_back(token);
  decoded_ = tokenizer_.decode_continuation(context_, tokens_);
  // A stop string cannot start in released text (a partial match there was held back).
  size_t stop_at = std::string::npos;
  for (const auto& stop : stop_) stop_at = std::min(stop_at, decoded_.find(stop, released_));
  if (stop_at != std::string::npos) {
    stopped_ = true;
    decoded_.resize(stop_at);
    std::string piece = decoded_.substr(std::min(released_, decoded_.size()));
    released_ = decoded_.size();
    return piece;
  }
  // Hold back a tail that is the start of a stop string, an unfinished UTF-8 character, and the last
  // word where a later token may still put words in front of it.
  size_t safe = complete_utf8_prefix(decoded_);
  // A decode ending in U+FFFD may end inside a byte-level character that the next token completes
  // (the lossy decode then reads differently there): held back until a token shows which it is.
  size_t replaced = decoded_.size();
  while (replaced >= 3 && decoded_.compare(replaced - 3, 3, "\xEF\xBF\xBD") == 0) replaced -= 3;
  safe = std::min(safe, replaced);
  if (hold_last_word_) {
    const size_t space = decoded_.find_last_of(' ');
    safe = std::min(safe, space == std::string::npos ? size_t{0} : space);
  }
  for (const auto& stop : stop_)
    for (size_t length = std::min(stop.size() - 1, decoded_.size()); length > 0; --length)
      if (decoded_.compare(decoded_.size() - length, length, stop, 0, length) == 0) {
        safe = std::min(safe, decoded_.size() - length);
        break;
      }
  if (safe <= released_) return "";
  std::string piece = decoded_.substr(released_, safe - released_);
  released_ = safe;
  return piece;
}

std::string TextStream::finish() {
  if (released_ >= decoded_.size()) return "";
  std::string piece = decoded_.substr(released_);
  released_ = decoded_.size();
  return piece;
}

}  // namespace coconut::serve
