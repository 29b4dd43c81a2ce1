// Hugging Face `tokenizer.json`, encoded and decoded as the reference (HF tokenizers) does:
//   - models: BPE (byte-level as in GPT-2 / Llama 3, or SentencePiece-style with byte_fallback as
//     in Llama 2), WordLevel;
//   - normalizers: Prepend, Replace (string patterns), Sequence;
//   - pre-tokenizers: Split (PCRE2 regex, behaviour Isolated), Digits, ByteLevel, WhitespaceSplit, Sequence;
//   - decoders: ByteLevel, Replace, ByteFallback, Fuse, Strip, Sequence (none: tokens joined by " ");
//   - added tokens (never split; matched in the raw text) and a TemplateProcessing post-processor.
// Anything else is an error naming the file and the field.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/tokenizer.h"

namespace coconut {

class HfTokenizer : public Tokenizer {
 public:
  static std::unique_ptr<HfTokenizer> load(const std::string& path);
  static std::unique_ptr<HfTokenizer> from_json(const nlohmann::json& json, const std::string& source);
  ~HfTokenizer() override;

  // Plain encoding, special tokens written in the text parsed as such (the HF default).
  std::vector<int64_t> encode(const std::string& text) const override;
  // parse_special = false treats special-token text as ordinary text.
  std::vector<int64_t> encode(const std::string& text, bool parse_special) const;
  // With the post-processor's template (e.g. BOS first), as HF's add_special_tokens=True.
  std::vector<int64_t> encode_with_special_tokens(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const override;
  int64_t vocab_size() const override;
  std::optional<int64_t> token_to_id(const std::string& token) const override;
  std::optional<std::string> id_to_token(int64_t id) const override;
  std::optional<int64_t> unknown_token_id() const override;
  bool decode_may_insert_before_last_word() const override;  // a WordForms decoder with postfix words

  // Appends special tokens (skipping those that exist) and returns the id of each.
  std::vector<int64_t> add_special_tokens(const std::vector<std::string>& tokens);
  // Gives an added token (a reserved special token, say) a new name and keeps its id: a new use
  // for a row the model already has. Throws naming `from` when it is not an added token, or `to`
  // when that name is taken.
  void rename_added_token(const std::string& from, const std::string& to);
  // Writes tokenizer.json (atomically); it reloads identically and HF can read it.
  void save(const std::string& path) const;

  struct Impl;

 private:
  HfTokenizer();
  std::unique_ptr<Impl> impl_;
};

// A word-level tokenizer over the whitespace-separated words of `texts`, with `special_tokens`
// first (ids 0..n-1, e.g. <pad> <bos> <eos> <unk>), then words in order of first appearance.
// Saved as an HF tokenizer.json (WordLevel model, WhitespaceSplit pre-tokenizer).
//
// word_forms: words are normalised so that a model trained from scratch sees one token per concept:
// letters, digits and punctuation are separate pieces; a capitalised word is the marker "<cap>" and
// the lower-case word; a word that is another word plus "es" or "s" is the stem and a suffix token
// ("Brimpuses." -> <cap> brimpus ##es .). Decoding restores the text (words joined by spaces,
// closing punctuation and suffixes attached). Stored as tokenizer.json with our own "WordForms"
// pre-tokenizer and decoder, which this loader reads and HF tokenizers does not.
// modifiers (word_forms only) says where a modifying word such as "not" goes; decoding restores it.
struct WordModifiers {
  std::vector<std::string> postfix;  // moved behind the word it modifies: "are not brown." -> are brown ~not .
  std::vector<std::string> fused;    // one token with that word: "are not brown." -> are not~brown .
  std::vector<std::string> joined;   // one token with the word before it: "is a wumpus." -> is~a wumpus .
  // A word both postfix and fused is marked: fused, then its mark: "are not brown." -> are not~brown ~not .
  // A word both postfix and joined moves its joined piece behind the next word: "is a wumpus." -> wumpus ~is~a .
  bool empty() const { return postfix.empty() && fused.empty() && joined.empty(); }
};
std::unique_ptr<HfTokenizer> build_word_level_tokenizer(const std::vector<std::string>& texts,
                                                        const std::vector<std::string>& special_tokens,
                                                        const std::string& unk_token = "<unk>",
                                                        bool word_forms = false,
                                                        const WordModifiers& modifiers = {});

}  // namespace coconut
