// The tokenizer interface every model-facing component uses. Implementations: HF tokenizer.json
// (byte-level BPE, SentencePiece-style BPE, WordLevel) under src/text/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace coconut {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Plain encoding: no BOS/EOS added. Special tokens written in the text are parsed as the
  // reference (HF tokenizers) does by default.
  virtual std::vector<int64_t> encode(const std::string& text) const = 0;
  // As HF's add_special_tokens=True: with the tokenizer's own template (BOS first where it adds one).
  virtual std::vector<int64_t> encode_with_special_tokens(const std::string& text) const { return encode(text); }
  virtual std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const = 0;
  virtual int64_t vocab_size() const = 0;
  // Id of a token given by its exact vocabulary string (e.g. "<|latent|>"), if any.
  virtual std::optional<int64_t> token_to_id(const std::string& token) const = 0;
  virtual std::optional<std::string> id_to_token(int64_t id) const = 0;
  // The id unknown words map to (a word-level vocabulary's <unk>), if the tokenizer has one.
  virtual std::optional<int64_t> unknown_token_id() const { return std::nullopt; }
  // Whether decoding one more token may insert text in front of the last word decoded so far (a
  // word-forms postfix mark: "wumpus ~is~a" -> "is a wumpus"), so that a stream must hold that word back.
  virtual bool decode_may_insert_before_last_word() const { return false; }

  // The text of `tokens` as it reads after `context` (the tokens before them), special tokens
  // left out: decoded together and the context's own text cut off, since SentencePiece decoders
  // drop the space before a text's first word ("The sun was" + "▁shining" reads " shining").
  // When the context's text is not a prefix of the whole (it ends inside a byte sequence, say),
  // `tokens` decoded alone.
  std::string decode_continuation(const std::vector<int64_t>& context, const std::vector<int64_t>& tokens) const {
    if (context.empty()) return decode(tokens, true);
    const std::string before = decode(context, true);
    std::vector<int64_t> all = context;
    all.insert(all.end(), tokens.begin(), tokens.end());
    std::string text = decode(all, true);
    return text.rfind(before, 0) == 0 ? text.substr(before.size()) : decode(tokens, true);
  }
};

}  // namespace coconut
