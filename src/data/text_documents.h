// Plain text for language modelling (training mode `lm`, and the calibration text of pruning
// scores): documents, read from a .txt file (separated by blank lines) or from JSONL (a `text`
// field a line), tokenized with the tokenizer's own template, EOS after each, packed end to end
// and cut into windows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/sequences.h"
#include "text/tokenizer.h"

namespace coconut {

// Whether `path` holds plain text rather than a reasoning dataset: a .txt whose first non-blank
// line has no `||` (the stepwise-internalisation format's separator), or a .jsonl whose first
// non-blank line is an object with a `text` field and no `question`. Throws naming the file when it
// cannot be opened.
bool is_plain_text_dataset(const std::string& path);

// The documents of a plain text file: .txt paragraphs separated by one or more blank lines (the
// lines of a paragraph keep their newlines), or .jsonl with a non-empty string `text` on every
// non-blank line. Errors name the file (and line) and the problem; an empty set is an error.
std::vector<std::string> load_text_documents(const std::string& path);

// Token ids of documents packed end to end, each followed by `eos`, cut into consecutive windows
// of `window` tokens (the last one shorter; dropped when under 2 tokens, which predicts nothing).
// Each window goes in TokenizedExample::question, for build_sequence in mode kLm.
std::vector<TokenizedExample> pack_text_windows(const std::vector<std::vector<int64_t>>& documents, int64_t eos,
                                                int64_t window);

// Documents tokenized as the tokenizer encodes a text on its own (encode_with_special_tokens: BOS
// first where it adds one), then packed (pack_text_windows). Throws for window < 2.
std::vector<TokenizedExample> text_windows(const std::vector<std::string>& documents, const Tokenizer& tokenizer,
                                           int64_t eos, int64_t window);

// The window of a model of context `context` when none is asked for (0): its context, at most
// kDefaultTextWindow tokens (a CPU-sized default; SmolLM2's context is 8192).
inline constexpr int64_t kDefaultTextWindow = 1024;
int64_t text_window_or_default(int64_t requested, int64_t context);

}  // namespace coconut
