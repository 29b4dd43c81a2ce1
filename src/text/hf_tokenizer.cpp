#include "text/hf_tokenizer.h"

#include "util/atomic_file.h"
#include "util/json_text.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <queue>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <unordered_set>

namespace coconut {

using nlohmann::json;

namespace {

[[noreturn]] void fail(const std::string& source, const std::string& field, const std::string& problem) {
  throw std::runtime_error(source + ": " + field + ": " + problem);
}

// ---- UTF-8 helpers -------------------------------------------------------------------------------

// Length of the UTF-8 sequence starting with `lead` (1 for invalid leads).
size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

void append_utf8(std::string& out, uint32_t code_point) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xE0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
}

// Decodes one code point at `i` (advancing it); returns false on an invalid sequence.
bool next_code_point(const std::string& text, size_t& i, uint32_t& code_point) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  const size_t length = utf8_length(lead);
  if (length == 1) {
    ++i;
    code_point = lead;
    return lead < 0x80;
  }
  if (i + length > text.size()) {
    ++i;
    return false;
  }
  uint32_t value = lead & (0xFF >> (length + 1));
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) {
      i += k;
      return false;
    }
    value = (value << 6) | (byte(i + k) & 0x3F);
  }
  i += length;
  code_point = value;
  return true;
}

// Invalid sequences become U+FFFD, as Rust's String::from_utf8_lossy does.
std::string utf8_lossy(const std::string& bytes) {
  std::string out;
  size_t i = 0;
  while (i < bytes.size()) {
    const size_t start = i;
    uint32_t code_point = 0;
    if (next_code_point(bytes, i, code_point)) {
      out.append(bytes, start, i - start);
    } else {
      out += "\xEF\xBF\xBD";
    }
  }
  return out;
}

bool is_valid_utf8(const std::string& bytes) {
  size_t i = 0;
  uint32_t code_point = 0;
  while (i < bytes.size())
    if (!next_code_point(bytes, i, code_point)) return false;
  return true;
}

// GPT-2's byte <-> printable character table used by byte-level BPE.
struct ByteTable {
  std::string byte_to_char[256];
  std::unordered_map<uint32_t, unsigned char> char_to_byte;
  ByteTable() {
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t code_point = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + next++);
      append_utf8(byte_to_char[b], code_point);
      char_to_byte[code_point] = static_cast<unsigned char>(b);
    }
  }
};
const ByteTable& byte_table() {
  static const ByteTable table;
  return table;
}

// One pass into a new string: replacing in place would move the tail at every match, quadratic on a
// long line (a 4.8 MB line took 24 s through the SentencePiece normaliser's " " -> "\u2581").
void replace_all(std::string& text, const std::string& pattern, const std::string& content) {
  if (pattern.empty()) return;
  size_t position = text.find(pattern);
  if (position == std::string::npos) return;
  std::string replaced;
  replaced.reserve(text.size());
  size_t last = 0;
  for (; position != std::string::npos; position = text.find(pattern, last)) {
    replaced.append(text, last, position - last);
    replaced += content;
    last = position + pattern.size();
  }
  replaced.append(text, last, std::string::npos);
  text = std::move(replaced);
}

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// A compiled PCRE2 pattern (UTF + Unicode properties, JIT when available).
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& source) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      fail(source, "pre_tokenizer Split pattern", "regex error at offset " + std::to_string(offset) + ": " +
                                                     reinterpret_cast<const char*>(message));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is absent
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls visit(begin, end) for every non-empty match, left to right.
  template <typename Visit>
  void for_each_match(const std::string& text, Visit&& visit) const {
    // Freed also when visit throws (an unknown character): the fuzzer found it leaking there.
    const std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> owner(
        pcre2_match_data_create_from_pattern(code_, nullptr), pcre2_match_data_free);
    pcre2_match_data* data = owner.get();
    PCRE2_SIZE start = 0;
    const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    while (start < text.size()) {
      const int result = pcre2_match(code_, subject, text.size(), start, 0, data, nullptr);
      if (result < 0) break;
      const PCRE2_SIZE* vector = pcre2_get_ovector_pointer(data);
      if (vector[1] == vector[0]) {  // empty match: step one character
        start = vector[0] + utf8_length(static_cast<unsigned char>(text[vector[0]]));
        continue;
      }
      visit(static_cast<size_t>(vector[0]), static_cast<size_t>(vector[1]));
      start = vector[1];
    }
  }

 private:
  pcre2_code* code_ = nullptr;
};

const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct AddedToken {
  int64_t id;
  std::string content;
  bool special, lstrip, rstrip, single_word, normalized;
};

struct NormalizerStep {
  enum Kind { kPrepend, kReplace } kind;
  std::string pattern, content;
};

struct PreTokenizerStep {
  enum Kind { kSplit, kByteLevel, kWhitespaceSplit, kWordForms } kind;
  std::shared_ptr<Regex> regex;  // Split, or ByteLevel with use_regex
  bool add_prefix_space = false;
};

struct DecoderStep {
  enum Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kWordForms } kind;
  std::string pattern, content;
  int start = 0, stop = 0;
  WordModifiers modifiers;  // WordForms
};

std::string string_pattern(const json& pattern, const std::string& source, const std::string& field) {
  if (pattern.is_object() && pattern.contains("String")) return pattern["String"].get<std::string>();
  fail(source, field, "only String patterns are supported, got " + pattern.dump());
}


// WordForms pre-tokenizer: whitespace separates; each chunk splits into runs of ASCII letters,
// runs of digits and runs of other characters. A capitalised letter run ("Brimpuses") becomes the
// case marker then the lower-case word; lower-case runs stay; any other casing ("ABC") stays as is.
constexpr const char* kCaseMarker = "<cap>";

bool is_ascii_lower(char c) { return c >= 'a' && c <= 'z'; }
bool is_ascii_upper(char c) { return c >= 'A' && c <= 'Z'; }
bool is_ascii_letter(char c) { return is_ascii_lower(c) || is_ascii_upper(c); }
bool is_ascii_digit(char c) { return c >= '0' && c <= '9'; }

bool contains_word(const std::vector<std::string>& words, std::string_view word) {
  return std::find(words.begin(), words.end(), word) != words.end();
}

// WordForms "postfix", "fused" and "joined" (field_prefix names the node): lists of lower-case words, no word in two.
WordModifiers parse_word_modifiers(const json& node, const std::string& source, const std::string& field_prefix) {
  WordModifiers modifiers;
  const std::pair<const char*, std::vector<std::string>*> lists[] = {
      {"postfix", &modifiers.postfix}, {"fused", &modifiers.fused}, {"joined", &modifiers.joined}};
  for (const auto& [key, words] : lists) {
    if (!node.contains(key)) continue;
    const std::string field = field_prefix + "." + key;
    if (!node[key].is_array()) fail(source, field, "must be a list of lower-case words");
    for (const json& word : node[key]) {
      if (!word.is_string() || word.get<std::string>().empty() ||
          !std::all_of(word.get_ref<const std::string&>().begin(), word.get_ref<const std::string&>().end(), is_ascii_lower))
        fail(source, field, "entries must be lower-case words, got " + word.dump());
      for (const auto& [other_key, other_words] : lists)
        if (other_words != words && contains_word(*other_words, word.get<std::string>()) &&
            (other_words == &modifiers.fused || words == &modifiers.fused) &&
            (other_words == &modifiers.joined || words == &modifiers.joined))  // a postfix word may be fused or joined
          fail(source, field, word.dump() + " is also a " + other_key + " word");
      words->push_back(word.get<std::string>());
    }
  }
  return modifiers;
}

// Modifier words ("not") followed by a word after whitespace:
// - postfix: emitted after that word as "~not" ("are not brown" -> are brown ~not), so that the word
//   it modifies comes first: a causal model reading a fact sees the negation where the fact is in view;
// - fused: one piece with that word, "not~brown", when the word is lower-case letters (a capitalised
//   word or a modifier word is not fused); a fused piece missing from the vocabulary encodes as its parts;
// - both (a marked word): the word as fused or as it stands, and then the postfix mark, "not~brown ~not":
//   one token carries the negated property and another says that there was a negation. The mark adds
//   nothing to the text, and the decoder drops it.
// Joined words ("a") after whitespace become one piece with the lower-case word before them, "is~a",
// unless that word is itself a modifier or joined word; a joined piece the vocabulary lacks encodes as its parts.
// A word both joined and postfix moves its joined piece behind the word after it, marked: "is a wumpus." ->
// wumpus ~is~a . (the subject and the object of a fact side by side); where no word follows, or the word is not
// lower-case, the joined piece stays where it is. Such a word on its own ("Is Tom a wumpus?") stays as it stands.
constexpr char kModifierMark = '~';

void for_each_word_form(const std::string& text, const std::string& case_marker, const WordModifiers& modifiers,
                        const std::function<void(const std::string&)>& emit) {
  const auto kind = [](char c) { return is_ascii_letter(c) ? 0 : is_ascii_digit(c) ? 1 : 2; };
  struct Run {
    size_t begin, end;
  };
  std::vector<Run> runs;
  size_t i = 0;
  while (i < text.size()) {
    if (is_ascii_space(text[i])) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < text.size() && !is_ascii_space(text[j]) && kind(text[j]) == kind(text[i])) ++j;
    runs.push_back({i, j});
    i = j;
  }
  const auto emit_run = [&](const Run& span) {
    std::string run = text.substr(span.begin, span.end - span.begin);
    if (kind(run[0]) == 0 && is_ascii_upper(run[0]) &&
        std::all_of(run.begin() + 1, run.end(), [](char c) { return is_ascii_lower(c); })) {
      emit(case_marker);
      run[0] = static_cast<char>(run[0] - 'A' + 'a');
    }
    emit(run);
  };
  const auto view = [&](const Run& span) { return std::string_view(text.data() + span.begin, span.end - span.begin); };
  // A modifier of the next word (postfix, fused), or any modifier word (joined too).
  const auto modifies_next_word = [&](const Run& span) {
    return (contains_word(modifiers.postfix, view(span)) && !contains_word(modifiers.joined, view(span))) ||
           contains_word(modifiers.fused, view(span));
  };
  const auto is_modifier = [&](const Run& span) { return modifies_next_word(span) || contains_word(modifiers.joined, view(span)); };
  const auto one_piece = [&](const Run& first, const Run& second) {  // "not~brown", "is~a"
    return std::string(view(first)) + kModifierMark + std::string(view(second));
  };
  const auto is_lower_word = [&](const Run& span) {
    return std::all_of(view(span).begin(), view(span).end(), is_ascii_lower);
  };
  for (size_t index = 0; index < runs.size(); ++index) {
    const Run& run = runs[index];
    const bool next_after_space = index + 1 < runs.size() && runs[index + 1].begin > run.end;
    const bool modifies = modifies_next_word(run) && next_after_space && kind(text[runs[index + 1].begin]) == 0 &&
                          !is_modifier(runs[index + 1]);
    const bool joins_next = !is_modifier(run) && is_lower_word(run) && next_after_space &&
                            contains_word(modifiers.joined, view(runs[index + 1]));
    const bool marked = contains_word(modifiers.postfix, view(run)) && contains_word(modifiers.fused, view(run));
    if (modifies && marked) {
      if (is_lower_word(runs[index + 1])) {
        emit(one_piece(run, runs[index + 1]));
      } else {
        emit_run(run);
        emit_run(runs[index + 1]);
      }
      emit(kModifierMark + std::string(view(run)));
      ++index;
    } else if (modifies && contains_word(modifiers.postfix, view(run))) {
      emit_run(runs[index + 1]);
      emit(kModifierMark + std::string(view(run)));
      ++index;
    } else if (joins_next && contains_word(modifiers.postfix, view(runs[index + 1])) && index + 2 < runs.size() &&
               runs[index + 2].begin > runs[index + 1].end && is_lower_word(runs[index + 2]) && !is_modifier(runs[index + 2])) {
      emit_run(runs[index + 2]);
      emit(kModifierMark + one_piece(run, runs[index + 1]));
      index += 2;
    } else if (joins_next || (modifies && is_lower_word(runs[index + 1]))) {
      emit(one_piece(run, runs[index + 1]));
      ++index;
    } else {
      emit_run(run);
    }
  }
}

// A fused or joined piece ("not~brown", "is~a", see for_each_word_form) as its two words; nullopt for any other piece.
std::optional<std::pair<std::string, std::string>> split_fused(const std::string& piece, const WordModifiers& modifiers) {
  const size_t mark = piece.find(kModifierMark);
  if (mark == std::string::npos || mark == 0 || mark + 1 == piece.size()) return std::nullopt;
  if (!contains_word(modifiers.fused, std::string_view(piece).substr(0, mark)) &&
      !contains_word(modifiers.joined, std::string_view(piece).substr(mark + 1)))
    return std::nullopt;
  return std::make_pair(piece.substr(0, mark), piece.substr(mark + 1));
}

// The WordForms decoder: words joined by spaces; "##suffix" tokens (letters after "##") and closing punctuation join the
// previous word; the case marker capitalises the next word; a postfix token ("~not") goes back in
// front of the word before it, unless the word is also fused (a marked word: the mark is dropped); a fused or
// joined token ("not~brown", "is~a") is its two words, and a marked joined token ("~is~a") is its two words in
// front of the word before it.
std::string join_word_forms(const std::vector<std::string>& fused_tokens, const std::string& case_marker,
                            const WordModifiers& modifiers) {
  std::vector<std::string> tokens;
  tokens.reserve(fused_tokens.size());
  for (const std::string& token : fused_tokens) {
    if (auto parts = split_fused(token, modifiers)) {
      tokens.push_back(parts->first);
      tokens.push_back(parts->second);
    } else {
      tokens.push_back(token);
    }
  }
  const auto closing = [](const std::string& token) {
    return !token.empty() && token.find_first_not_of(".,;:!?)") == std::string::npos;
  };
  std::string text;
  bool capitalise = false;
  std::optional<size_t> last_word_start;  // where the last word (not a suffix or punctuation) begins in `text`
  for (const std::string& token : tokens) {
    if (token == case_marker) {
      capitalise = true;
      continue;
    }
    if (token.size() > 2 && token.compare(0, 2, "##") == 0 && std::all_of(token.begin() + 2, token.end(), is_ascii_letter)) {
      text += token.substr(2);
      continue;
    }
    const bool postfix_mark = token.size() > 1 && token[0] == kModifierMark &&
                              contains_word(modifiers.postfix, std::string_view(token).substr(1));
    if (postfix_mark && contains_word(modifiers.fused, std::string_view(token).substr(1))) continue;  // marked
    if (postfix_mark && last_word_start) {
      text.insert(*last_word_start, token.substr(1) + " ");
      last_word_start.reset();
      continue;
    }
    const auto behind = token.size() > 1 && token[0] == kModifierMark ? split_fused(token.substr(1), modifiers) : std::nullopt;
    if (behind && contains_word(modifiers.postfix, behind->second)) {
      const std::string words = behind->first + " " + behind->second;
      if (last_word_start) {
        text.insert(*last_word_start, words + " ");
      } else {  // no word to go in front of: the words where they stand
        text += (text.empty() ? "" : " ") + words;
      }
      last_word_start.reset();
      continue;
    }
    if (!text.empty() && !closing(token)) text += ' ';
    last_word_start = is_ascii_letter(token[0]) ? std::optional<size_t>(text.size()) : std::nullopt;
    text += token;
    if (capitalise && is_ascii_lower(token[0])) text[text.size() - token.size()] = static_cast<char>(token[0] - 'a' + 'A');
    capitalise = false;
  }
  return text;
}

}  // namespace

struct HfTokenizer::Impl {
  std::string source;
  json document;  // kept so that save() writes back everything we do not model
  bool word_level = false;
  std::unordered_map<std::string, int64_t> vocab;
  std::vector<std::string> id_to_token;  // model vocabulary, then added tokens
  std::unordered_map<uint64_t, std::pair<int32_t, int64_t>> merges;  // (left << 32 | right) -> (rank, merged)
  bool byte_fallback = false, ignore_merges = false, fuse_unk = false;
  std::optional<int64_t> unk_id;
  std::vector<AddedToken> added;
  std::unordered_map<std::string, size_t> added_by_content;
  std::vector<size_t> added_by_first_byte[256];  // candidates for matching at a text position
  std::vector<NormalizerStep> normalizers;
  std::vector<PreTokenizerStep> pre_tokenizers;
  std::vector<DecoderStep> decoders;
  bool has_decoder = false;
  // WordForms (our extension, see build_word_level_tokenizer): the case marker and the suffix
  // tokens ("##es") that a word missing from the vocabulary may be split into (stem + suffix).
  std::string case_marker;
  std::vector<std::string> word_suffixes;
  WordModifiers modifiers;  // "not" behind its word ("~not") or fused with it ("not~brown"); "a" joined ("is~a")
  std::vector<int64_t> template_prefix, template_suffix;  // TemplateProcessing "single"
  int64_t byte_ids[256];                                  // <0xNN> tokens for byte_fallback, -1 if absent
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache;

  void parse(const json& j);
  void parse_normalizer(const json& node);
  void parse_pre_tokenizer(const json& node);
  void parse_decoder(const json& node);
  void parse_post_processor(const json& node);
  void index_added();

  std::string normalize(std::string text) const;
  // WordForms: a word missing from the vocabulary as (stem id, suffix id) when stem + suffix spells it.
  std::optional<std::pair<int64_t, int64_t>> split_suffix(const std::string& word) const;
  void pre_tokenize(const std::string& piece, size_t step_index, const std::function<void(const std::string&)>& emit) const;
  void bpe(const std::string& piece, std::vector<int64_t>& out) const;
  void encode_segment(const std::string& segment, std::vector<int64_t>& out) const;
  std::vector<int64_t> encode(const std::string& text, bool parse_special) const;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special) const;
  std::optional<size_t> match_added(const std::string& text, size_t position, bool parse_special, size_t* begin,
                                    size_t* end) const;
};

void HfTokenizer::Impl::parse(const json& j) {
  if (!j.is_object() || !j.contains("model") || !j.at("model").is_object()) fail(source, "model", "is missing");
  const json& model = j.at("model");
  const std::string type = model.value("type", std::string(model.contains("merges") ? "BPE" : ""));
  if (type != "BPE" && type != "WordLevel")
    fail(source, "model.type", "unsupported model '" + type + "' (supported: BPE, WordLevel)");
  word_level = type == "WordLevel";
  if (!model.contains("vocab") || !model.at("vocab").is_object()) fail(source, "model.vocab", "is missing or not an object");
  if (j.contains("added_tokens") && !j.at("added_tokens").is_array() && !j.at("added_tokens").is_null())
    fail(source, "added_tokens", "must be a list, got " + std::string(j.at("added_tokens").type_name()));
  const size_t added_count = j.contains("added_tokens") && j.at("added_tokens").is_array() ? j.at("added_tokens").size() : 0;
  // Ids index a table of tokens, so they must be about dense: a lying id (2^40) would size that table.
  const int64_t id_limit = static_cast<int64_t>(2 * (model.at("vocab").size() + added_count) + 256);
  const auto check_id = [&](const json& value, const std::string& field, const std::string& token) {
    if (!value.is_number_integer()) fail(source, field, "token '" + token + "' has a non-integer id");
    const int64_t id = value.get<int64_t>();
    if (id < 0) fail(source, field, "token '" + token + "' has a negative id");
    if (id >= id_limit)
      fail(source, field, "token '" + token + "' has id " + std::to_string(id) + ", beyond " + std::to_string(id_limit) +
                              " (twice the entries + 256: ids must be about dense)");
    return id;
  };
  for (auto it = model.at("vocab").begin(); it != model.at("vocab").end(); ++it) {
    const int64_t id = check_id(it.value(), "model.vocab", it.key());
    vocab[it.key()] = id;
    if (static_cast<size_t>(id) >= id_to_token.size()) id_to_token.resize(static_cast<size_t>(id) + 1);
    id_to_token[static_cast<size_t>(id)] = it.key();
  }
  if (model.contains("unk_token") && model.at("unk_token").is_string()) {
    auto found = vocab.find(model.at("unk_token").get<std::string>());
    if (found != vocab.end()) unk_id = found->second;
  }
  if (!word_level) {
    byte_fallback = model.value("byte_fallback", false);
    fuse_unk = model.value("fuse_unk", false);
    ignore_merges = model.value("ignore_merges", false);
    if (model.contains("dropout") && !model.at("dropout").is_null() && model.at("dropout").get<double>() != 0.0)
      fail(source, "model.dropout", "BPE dropout is not supported");
    for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(field) && !model[field].is_null() && !model[field].get<std::string>().empty())
        fail(source, std::string("model.") + field, "is not supported");
    if (!model.contains("merges") || !model.at("merges").is_array()) fail(source, "model.merges", "is missing");
    int32_t rank = 0;
    for (const json& merge : model.at("merges")) {
      std::string left, right;
      if (merge.is_string()) {  // "a b"
        const std::string text = merge.get<std::string>();
        const size_t space = text.find(' ');
        if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos)
          fail(source, "model.merges", "entry " + std::to_string(rank) + " is not 'a b': " + merge.dump());
        left = text.substr(0, space);
        right = text.substr(space + 1);
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {  // ["a", "b"]
        left = merge[0].get<std::string>();
        right = merge[1].get<std::string>();
      } else {
        fail(source, "model.merges", "entry " + std::to_string(rank) + " is neither 'a b' nor [a, b]: " + merge.dump());
      }
      const auto l = vocab.find(left), r = vocab.find(right), m = vocab.find(left + right);
      if (l == vocab.end() || r == vocab.end() || m == vocab.end())
        fail(source, "model.merges", "entry " + std::to_string(rank) + " (" + merge.dump() + ") uses tokens missing from the vocab");
      merges.emplace((static_cast<uint64_t>(l->second) << 32) | static_cast<uint64_t>(r->second), std::make_pair(rank, m->second));
      ++rank;
    }
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto found = vocab.find(name);
    byte_ids[b] = found == vocab.end() ? -1 : found->second;
  }
  if (added_count > 0) {
    for (const json& token : j.at("added_tokens")) {
      if (!token.is_object() || !token.contains("id") || !token.contains("content") || !token.at("content").is_string() ||
          token.at("content").get_ref<const std::string&>().empty())
        fail(source, "added_tokens", "entry without an id or a non-empty content string: " + token.dump());
      const std::string& content = token.at("content").get_ref<const std::string&>();
      added.push_back({check_id(token.at("id"), "added_tokens", content), content, token.value("special", false),
                       token.value("lstrip", false), token.value("rstrip", false), token.value("single_word", false),
                       token.value("normalized", false)});
    }
  }
  index_added();
  if (j.contains("normalizer") && !j.at("normalizer").is_null()) parse_normalizer(j.at("normalizer"));
  if (j.contains("pre_tokenizer") && !j.at("pre_tokenizer").is_null()) parse_pre_tokenizer(j.at("pre_tokenizer"));
  if (j.contains("decoder") && !j.at("decoder").is_null()) {
    has_decoder = true;
    parse_decoder(j.at("decoder"));
  }
  if (j.contains("post_processor") && !j.at("post_processor").is_null()) parse_post_processor(j.at("post_processor"));
}

void HfTokenizer::Impl::index_added() {
  added_by_content.clear();
  for (auto& candidates : added_by_first_byte) candidates.clear();
  for (size_t i = 0; i < added.size(); ++i) {
    added_by_content[added[i].content] = i;
    if (!added[i].content.empty()) added_by_first_byte[static_cast<unsigned char>(added[i].content[0])].push_back(i);
    const auto id = static_cast<size_t>(added[i].id);
    if (id >= id_to_token.size()) id_to_token.resize(id + 1);
    id_to_token[id] = added[i].content;
  }
}

void HfTokenizer::Impl::parse_normalizer(const json& node) {
  const std::string type = node.value("type", "");
  if (type == "Sequence") {
    for (const json& child : node.at("normalizers")) parse_normalizer(child);
  } else if (type == "Prepend") {
    normalizers.push_back({NormalizerStep::kPrepend, "", node.at("prepend").get<std::string>()});
  } else if (type == "Replace") {
    normalizers.push_back({NormalizerStep::kReplace, string_pattern(node.at("pattern"), source, "normalizer.Replace"),
                           node.at("content").get<std::string>()});
  } else {
    fail(source, "normalizer", "unsupported normalizer '" + type + "'");
  }
}

void HfTokenizer::Impl::parse_pre_tokenizer(const json& node) {
  const std::string type = node.value("type", "");
  if (type == "Sequence") {
    for (const json& child : node.at("pretokenizers")) parse_pre_tokenizer(child);
  } else if (type == "Split") {
    if (node.value("behavior", "") != "Isolated" || node.value("invert", false))
      fail(source, "pre_tokenizer.Split", "only behavior Isolated without invert is supported");
    if (!node.contains("pattern") || !node.at("pattern").contains("Regex"))
      fail(source, "pre_tokenizer.Split.pattern", "only Regex patterns are supported");
    PreTokenizerStep step{PreTokenizerStep::kSplit, std::make_shared<Regex>(node.at("pattern").at("Regex").get<std::string>(), source)};
    pre_tokenizers.push_back(step);
  } else if (type == "Digits") {  // digits isolated, one by one or in runs (Unicode N*, as Rust's char::is_numeric)
    const std::string pattern = node.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)";
    pre_tokenizers.push_back({PreTokenizerStep::kSplit, std::make_shared<Regex>(pattern, source)});
  } else if (type == "ByteLevel") {
    PreTokenizerStep step{PreTokenizerStep::kByteLevel, nullptr, node.value("add_prefix_space", false)};
    if (node.value("use_regex", true)) step.regex = std::make_shared<Regex>(kGpt2Pattern, source);
    pre_tokenizers.push_back(step);
  } else if (type == "WhitespaceSplit") {
    pre_tokenizers.push_back({PreTokenizerStep::kWhitespaceSplit, nullptr});
  } else if (type == "WordForms") {
    if (!node.contains("case_marker") || !node.at("case_marker").is_string() || node.at("case_marker").get<std::string>().empty())
      fail(source, "pre_tokenizer.WordForms.case_marker", "must be a non-empty string");
    case_marker = node.at("case_marker").get<std::string>();
    if (!vocab.count(case_marker)) fail(source, "pre_tokenizer.WordForms.case_marker", "'" + case_marker + "' is not in the vocab");
    if (node.contains("suffixes")) {
      if (!node.at("suffixes").is_array()) fail(source, "pre_tokenizer.WordForms.suffixes", "must be a list of strings");
      for (const json& suffix : node.at("suffixes")) {
        if (!suffix.is_string() || suffix.get<std::string>().size() < 3 || suffix.get<std::string>().compare(0, 2, "##") != 0)
          fail(source, "pre_tokenizer.WordForms.suffixes", "entries must be strings '##<suffix>', got " + suffix.dump());
        if (!vocab.count(suffix.get<std::string>()))
          fail(source, "pre_tokenizer.WordForms.suffixes", suffix.dump() + " is not in the vocab");
        word_suffixes.push_back(suffix.get<std::string>());
      }
    }
    modifiers = parse_word_modifiers(node, source, "pre_tokenizer.WordForms");
    if (!word_level) fail(source, "pre_tokenizer.WordForms", "needs a WordLevel model");
    pre_tokenizers.push_back({PreTokenizerStep::kWordForms, nullptr});
  } else {
    fail(source, "pre_tokenizer", "unsupported pre-tokenizer '" + type + "'");
  }
}

void HfTokenizer::Impl::parse_decoder(const json& node) {
  const std::string type = node.value("type", "");
  if (type == "Sequence") {
    for (const json& child : node.at("decoders")) parse_decoder(child);
  } else if (type == "ByteLevel") {
    decoders.push_back({DecoderStep::kByteLevel});
  } else if (type == "Replace") {
    decoders.push_back({DecoderStep::kReplace, string_pattern(node.at("pattern"), source, "decoder.Replace"),
                        node.at("content").get<std::string>()});
  } else if (type == "ByteFallback") {
    decoders.push_back({DecoderStep::kByteFallback});
  } else if (type == "Fuse") {
    decoders.push_back({DecoderStep::kFuse});
  } else if (type == "Strip") {
    decoders.push_back({DecoderStep::kStrip, "", node.at("content").get<std::string>(), node.value("start", 0), node.value("stop", 0)});
  } else if (type == "WordForms") {
    if (!node.contains("case_marker") || !node.at("case_marker").is_string())
      fail(source, "decoder.WordForms.case_marker", "must be a string");
    DecoderStep step{DecoderStep::kWordForms, "", node.at("case_marker").get<std::string>()};
    step.modifiers = parse_word_modifiers(node, source, "decoder.WordForms");
    decoders.push_back(step);
  } else {
    fail(source, "decoder", "unsupported decoder '" + type + "'");
  }
}

void HfTokenizer::Impl::parse_post_processor(const json& node) {
  const std::string type = node.value("type", "");
  if (type == "Sequence") {
    for (const json& child : node.at("processors")) parse_post_processor(child);
  } else if (type == "TemplateProcessing") {
    bool after_sequence = false;
    for (const json& piece : node.at("single")) {
      if (piece.contains("Sequence")) {
        after_sequence = true;
      } else if (piece.contains("SpecialToken")) {
        const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
        if (!node.at("special_tokens").contains(name))
          fail(source, "post_processor.special_tokens", "'" + name + "' is not listed");
        for (const json& id : node.at("special_tokens").at(name).at("ids")) {
          if (!id.is_number_integer() || id.get<int64_t>() < 0 || static_cast<size_t>(id.get<int64_t>()) >= id_to_token.size())
            fail(source, "post_processor.special_tokens", "'" + name + "' has id " + id.dump() + ", not a token of the vocabulary");
          (after_sequence ? template_suffix : template_prefix).push_back(id.get<int64_t>());
        }
      }
    }
  } else if (type != "ByteLevel") {  // ByteLevel post-processing only adjusts offsets
    fail(source, "post_processor", "unsupported post-processor '" + type + "'");
  }
}

std::string HfTokenizer::Impl::normalize(std::string text) const {
  for (const auto& step : normalizers) {
    if (step.kind == NormalizerStep::kPrepend) {
      if (!text.empty()) text = step.content + text;
    } else {
      replace_all(text, step.pattern, step.content);
    }
  }
  return text;
}

std::optional<std::pair<int64_t, int64_t>> HfTokenizer::Impl::split_suffix(const std::string& word) const {
  for (const std::string& suffix_token : word_suffixes) {
    const std::string suffix = suffix_token.substr(2);
    if (word.size() <= suffix.size() || word.compare(word.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    auto stem = vocab.find(word.substr(0, word.size() - suffix.size()));
    if (stem != vocab.end()) return std::make_pair(stem->second, vocab.at(suffix_token));
  }
  return std::nullopt;
}

// Applies pre-tokenizer steps [step, end) to `piece` and hands each final piece to `emit`, one
// piece at a time (no intermediate list of the whole text's pieces).
void HfTokenizer::Impl::pre_tokenize(const std::string& piece, size_t step_index,
                                     const std::function<void(const std::string&)>& emit) const {
  if (step_index == pre_tokenizers.size()) {
    if (!piece.empty()) emit(piece);
    return;
  }
  const PreTokenizerStep& step = pre_tokenizers[step_index];
  const auto next = [&](const std::string& part) {
    if (step.kind != PreTokenizerStep::kByteLevel) return pre_tokenize(part, step_index + 1, emit);
    std::string mapped;
    mapped.reserve(part.size() * 2);
    for (unsigned char byte : part) mapped += byte_table().byte_to_char[byte];
    pre_tokenize(mapped, step_index + 1, emit);
  };
  if (step.kind == PreTokenizerStep::kWordForms) {
    for_each_word_form(piece, case_marker, modifiers, next);
    return;
  }
  if (step.kind == PreTokenizerStep::kWhitespaceSplit) {
    size_t i = 0;
    while (i < piece.size()) {
      while (i < piece.size() && is_ascii_space(piece[i])) ++i;
      size_t j = i;
      while (j < piece.size() && !is_ascii_space(piece[j])) ++j;
      if (j > i) next(piece.substr(i, j - i));
      i = j;
    }
    return;
  }
  const std::string& text =
      step.kind == PreTokenizerStep::kByteLevel && step.add_prefix_space && !piece.empty() && piece[0] != ' ' ? " " + piece
                                                                                                               : piece;
  if (!step.regex) return next(text);
  size_t last = 0;
  step.regex->for_each_match(text, [&](size_t begin, size_t end) {
    if (begin > last) next(text.substr(last, begin - last));  // unmatched text stays a piece
    next(text.substr(begin, end - begin));
    last = end;
  });
  if (last < text.size()) next(text.substr(last));
}

// Byte-pair merges over one pre-tokenized piece, lowest rank first (HF's BPE::merge_word).
void HfTokenizer::Impl::bpe(const std::string& piece, std::vector<int64_t>& out) const {
  if (ignore_merges) {
    auto whole = vocab.find(piece);
    if (whole != vocab.end()) {
      out.push_back(whole->second);
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    auto cached = cache.find(piece);
    if (cached != cache.end()) {
      out.insert(out.end(), cached->second.begin(), cached->second.end());
      return;
    }
  }
  // Initial symbols: one per character; unknown characters fall back to bytes or <unk>.
  std::vector<int64_t> symbols;
  size_t i = 0;
  bool previous_unknown = false;
  while (i < piece.size()) {
    const size_t length = std::min(utf8_length(static_cast<unsigned char>(piece[i])), piece.size() - i);
    auto found = vocab.find(piece.substr(i, length));
    if (found != vocab.end()) {
      symbols.push_back(found->second);
      previous_unknown = false;
    } else if (byte_fallback && std::all_of(piece.begin() + static_cast<long>(i), piece.begin() + static_cast<long>(i + length),
                                            [&](char c) { return byte_ids[static_cast<unsigned char>(c)] >= 0; })) {
      for (size_t k = i; k < i + length; ++k) symbols.push_back(byte_ids[static_cast<unsigned char>(piece[k])]);
      previous_unknown = false;
    } else if (unk_id) {
      if (!(fuse_unk && previous_unknown)) symbols.push_back(*unk_id);
      previous_unknown = true;
    } else {
      throw std::runtime_error(source + ": character '" + piece.substr(i, length) +
                               "' is not in the vocabulary and the model has no unk_token or byte fallback");
    }
    i += length;
  }
  // Merge loop over a linked list with a priority queue of candidate pairs (rank, position).
  const size_t count = symbols.size();
  std::vector<int64_t> next_index(count), previous_index(count);
  for (size_t k = 0; k < count; ++k) {
    next_index[k] = static_cast<int64_t>(k) + 1;
    previous_index[k] = static_cast<int64_t>(k) - 1;
  }
  struct Candidate {
    int32_t rank;
    int64_t position;
    int64_t left, right;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : position > other.position;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto push = [&](int64_t position) {
    const int64_t right = next_index[static_cast<size_t>(position)];
    if (right >= static_cast<int64_t>(count)) return;
    auto merge = merges.find((static_cast<uint64_t>(symbols[static_cast<size_t>(position)]) << 32) |
                             static_cast<uint64_t>(symbols[static_cast<size_t>(right)]));
    if (merge != merges.end())
      queue.push({merge->second.first, position, symbols[static_cast<size_t>(position)], symbols[static_cast<size_t>(right)]});
  };
  for (size_t k = 0; k + 1 < count; ++k) push(static_cast<int64_t>(k));
  std::vector<bool> removed(count, false);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    const auto position = static_cast<size_t>(top.position);
    if (removed[position] || symbols[position] != top.left) continue;
    const int64_t right = next_index[position];
    if (right >= static_cast<int64_t>(count) || symbols[static_cast<size_t>(right)] != top.right) continue;
    // Merge right into position.
    symbols[position] = merges.at((static_cast<uint64_t>(top.left) << 32) | static_cast<uint64_t>(top.right)).second;
    removed[static_cast<size_t>(right)] = true;
    next_index[position] = next_index[static_cast<size_t>(right)];
    if (next_index[position] < static_cast<int64_t>(count)) previous_index[static_cast<size_t>(next_index[position])] = top.position;
    if (previous_index[position] >= 0) push(previous_index[position]);
    push(top.position);
  }
  std::vector<int64_t> result;
  for (size_t k = 0; k < count; k = static_cast<size_t>(next_index[k])) result.push_back(symbols[k]);
  out.insert(out.end(), result.begin(), result.end());
  std::lock_guard<std::mutex> lock(cache_mutex);
  if (cache.size() > 200000) cache.clear();
  cache.emplace(piece, std::move(result));
}

void HfTokenizer::Impl::encode_segment(const std::string& segment, std::vector<int64_t>& out) const {
  if (segment.empty()) return;
  const std::function<void(const std::string&)> encode_word = [&](const std::string& piece) {
    auto found = vocab.find(piece);
    if (found != vocab.end()) {
      out.push_back(found->second);
    } else if (auto fused = split_fused(piece, modifiers)) {
      encode_word(fused->first);
      encode_word(fused->second);
    } else if (auto split = split_suffix(piece)) {
      out.push_back(split->first);
      out.push_back(split->second);
    } else if (unk_id) {
      out.push_back(*unk_id);
    } else {
      throw std::runtime_error(source + ": unknown word '" + piece + "' and the vocabulary has no unk_token");
    }
  };
  pre_tokenize(normalize(segment), 0, [&](const std::string& piece) {
    if (word_level) {
      encode_word(piece);
    } else {
      bpe(piece, out);
    }
  });
}

std::optional<size_t> HfTokenizer::Impl::match_added(const std::string& text, size_t position, bool parse_special,
                                                     size_t* begin, size_t* end) const {
  std::optional<size_t> best;
  for (size_t i : added_by_first_byte[static_cast<unsigned char>(text[position])]) {
    const AddedToken& token = added[i];
    if (token.content.empty() || (token.special && !parse_special)) continue;
    if (text.compare(position, token.content.size(), token.content) != 0) continue;
    if (best && added[*best].content.size() >= token.content.size()) continue;
    const size_t token_end = position + token.content.size();
    if (token.single_word) {
      const auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
      if ((position > 0 && word(text[position - 1])) || (token_end < text.size() && word(text[token_end]))) continue;
    }
    best = i;
  }
  if (!best) return best;
  *begin = position;
  *end = position + added[*best].content.size();
  if (added[*best].lstrip)
    while (*begin > 0 && is_ascii_space(text[*begin - 1])) --*begin;
  if (added[*best].rstrip)
    while (*end < text.size() && is_ascii_space(text[*end])) ++*end;
  return best;
}

std::vector<int64_t> HfTokenizer::Impl::encode(const std::string& text, bool parse_special) const {
  std::vector<int64_t> out;
  size_t segment_start = 0, position = 0;
  while (position < text.size()) {
    size_t begin = 0, end = 0;
    auto token = match_added(text, position, parse_special, &begin, &end);
    if (!token) {
      ++position;
      continue;
    }
    begin = std::max(begin, segment_start);
    encode_segment(text.substr(segment_start, begin - segment_start), out);
    out.push_back(added[*token].id);
    segment_start = position = end;
  }
  encode_segment(text.substr(segment_start), out);
  return out;
}

std::string HfTokenizer::Impl::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  for (int64_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= id_to_token.size())
      throw std::out_of_range(source + ": cannot decode id " + std::to_string(id) + " (vocabulary size " +
                              std::to_string(id_to_token.size()) + ")");
    const std::string& token = id_to_token[static_cast<size_t>(id)];
    auto added_entry = added_by_content.find(token);
    if (skip_special && added_entry != added_by_content.end() && added[added_entry->second].special &&
        added[added_entry->second].id == id)
      continue;
    tokens.push_back(token);
  }
  if (!has_decoder) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
    return joined;
  }
  for (const auto& step : decoders) {
    switch (step.kind) {
      case DecoderStep::kByteLevel: {
        std::string bytes;
        for (const auto& token : tokens) {
          size_t i = 0;
          while (i < token.size()) {
            const size_t start = i;
            uint32_t code_point = 0;
            const bool valid = next_code_point(token, i, code_point);
            auto found = valid ? byte_table().char_to_byte.find(code_point) : byte_table().char_to_byte.end();
            if (found != byte_table().char_to_byte.end()) {
              bytes += static_cast<char>(found->second);
            } else {
              bytes.append(token, start, i - start);
            }
          }
        }
        tokens = {utf8_lossy(bytes)};
        break;
      }
      case DecoderStep::kReplace:
        for (auto& token : tokens) replace_all(token, step.pattern, step.content);
        break;
      case DecoderStep::kByteFallback: {
        std::vector<std::string> next;
        std::string pending;
        size_t pending_count = 0;
        const auto flush = [&] {
          if (pending_count == 0) return;
          if (is_valid_utf8(pending)) {
            next.push_back(pending);
          } else {
            for (size_t k = 0; k < pending_count; ++k) next.push_back("\xEF\xBF\xBD");
          }
          pending.clear();
          pending_count = 0;
        };
        for (const auto& token : tokens) {
          unsigned value = 0;
          if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>' &&
              std::sscanf(token.c_str() + 3, "%2x", &value) == 1) {
            pending += static_cast<char>(value);
            ++pending_count;
          } else {
            flush();
            next.push_back(token);
          }
        }
        flush();
        tokens = std::move(next);
        break;
      }
      case DecoderStep::kFuse: {
        std::string joined;
        for (const auto& token : tokens) joined += token;
        tokens = {joined};
        break;
      }
      case DecoderStep::kWordForms:
        tokens = {join_word_forms(tokens, step.content, step.modifiers)};
        break;
      case DecoderStep::kStrip:
        for (auto& token : tokens) {
          for (int k = 0; k < step.start && token.compare(0, step.content.size(), step.content) == 0; ++k)
            token.erase(0, step.content.size());
          for (int k = 0; k < step.stop && token.size() >= step.content.size() &&
                          token.compare(token.size() - step.content.size(), step.content.size(), step.content) == 0;
               ++k)
            token.erase(token.size() - step.content.size());
        }
        break;
    }
  }
  std::string text;
  for (const auto& token : tokens) text += token;
  return text;
}

HfTokenizer::HfTokenizer() : impl_(std::make_unique<Impl>()) {}
HfTokenizer::~HfTokenizer() = default;

std::unique_ptr<HfTokenizer> HfTokenizer::from_json(const json& document, const std::string& source) {
  std::unique_ptr<HfTokenizer> tokenizer(new HfTokenizer());
  tokenizer->impl_->source = source;
  tokenizer->impl_->document = document;
  try {
    tokenizer->impl_->parse(document);
  } catch (const json::exception& error) {
    throw std::runtime_error(source + ": malformed tokenizer field: " + error.what());
  }
  return tokenizer;
}

std::unique_ptr<HfTokenizer> HfTokenizer::load(const std::string& path) {
  const std::string file = std::filesystem::is_directory(path) ? path + "/tokenizer.json" : path;
  std::ifstream in(file);
  if (!in) throw std::runtime_error(file + ": cannot open tokenizer file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return from_json(parse_json_text(buffer.str(), file), file);
}

std::vector<int64_t> HfTokenizer::encode(const std::string& text) const { return impl_->encode(text, true); }
std::vector<int64_t> HfTokenizer::encode(const std::string& text, bool parse_special) const {
  return impl_->encode(text, parse_special);
}

std::vector<int64_t> HfTokenizer::encode_with_special_tokens(const std::string& text) const {
  std::vector<int64_t> ids = impl_->template_prefix;
  const auto body = impl_->encode(text, true);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), impl_->template_suffix.begin(), impl_->template_suffix.end());
  return ids;
}

std::string HfTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  return impl_->decode(ids, skip_special_tokens);
}

int64_t HfTokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_to_token.size()); }

std::optional<int64_t> HfTokenizer::token_to_id(const std::string& token) const {
  auto added = impl_->added_by_content.find(token);
  if (added != impl_->added_by_content.end()) return impl_->added[added->second].id;
  auto found = impl_->vocab.find(token);
  if (found != impl_->vocab.end()) return found->second;
  return std::nullopt;
}

std::optional<int64_t> HfTokenizer::unknown_token_id() const { return impl_->unk_id; }

bool HfTokenizer::decode_may_insert_before_last_word() const {
  return std::any_of(impl_->decoders.begin(), impl_->decoders.end(), [](const DecoderStep& step) {
    return step.kind == DecoderStep::kWordForms && !step.modifiers.postfix.empty();
  });
}

std::optional<std::string> HfTokenizer::id_to_token(int64_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_token.size()) return std::nullopt;
  return impl_->id_to_token[static_cast<size_t>(id)];
}

std::vector<int64_t> HfTokenizer::add_special_tokens(const std::vector<std::string>& tokens) {
  std::vector<int64_t> ids;
  for (const std::string& token : tokens) {
    if (auto existing = token_to_id(token)) {
      ids.push_back(*existing);
      continue;
    }
    const int64_t id = vocab_size();
    impl_->added.push_back({id, token, true, false, false, false, false});
    impl_->index_added();
    impl_->document["added_tokens"].push_back({{"id", id}, {"content", token}, {"single_word", false}, {"lstrip", false},
                                               {"rstrip", false}, {"normalized", false}, {"special", true}});
    ids.push_back(id);
  }
  return ids;
}

void HfTokenizer::rename_added_token(const std::string& from, const std::string& to) {
  const auto found = impl_->added_by_content.find(from);
  if (found == impl_->added_by_content.end())
    throw std::invalid_argument("'" + from + "' is not an added token of this tokenizer (only added tokens can be renamed)");
  if (token_to_id(to)) throw std::invalid_argument("cannot rename '" + from + "' to '" + to + "': the tokenizer has that token");
  AddedToken& token = impl_->added[found->second];
  token.content = to;
  impl_->index_added();
  for (auto& entry : impl_->document["added_tokens"])
    if (entry.value("content", std::string()) == from) entry["content"] = to;
  // The model's own vocabulary may list it too (BPE vocabularies usually do): renamed there as well.
  if (auto vocab = impl_->vocab.find(from); vocab != impl_->vocab.end()) {
    impl_->vocab.erase(vocab);
    impl_->vocab[to] = token.id;
  }
  json& model_vocab = impl_->document["model"]["vocab"];
  if (model_vocab.is_object() && model_vocab.contains(from)) {
    model_vocab[to] = model_vocab[from];
    model_vocab.erase(from);
  }
}

void HfTokenizer::save(const std::string& path) const {
  write_file_atomically(path, impl_->document.dump(2) + "\n");
}

std::unique_ptr<HfTokenizer> build_word_level_tokenizer(const std::vector<std::string>& texts,
                                                        const std::vector<std::string>& special_tokens,
                                                        const std::string& unk_token, bool word_forms,
                                                        const WordModifiers& modifiers) {
  if (!modifiers.empty() && !word_forms)
    throw std::invalid_argument("build_word_level_tokenizer: postfix, fused or joined words need word_forms");
  json vocab = json::object();
  json added = json::array();
  int64_t next = 0;
  for (const auto& token : special_tokens) {
    if (vocab.contains(token)) continue;
    vocab[token] = next;
    added.push_back({{"id", next}, {"content", token}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
    ++next;
  }
  // Pieces in order of first appearance.
  std::vector<std::string> pieces;
  std::unordered_set<std::string> seen;
  const auto collect = [&](const std::string& piece) {
    if (seen.insert(piece).second) pieces.push_back(piece);
  };
  for (const auto& text : texts) {
    if (word_forms) {
      for_each_word_form(text, kCaseMarker, modifiers, collect);
    } else {
      std::istringstream words(text);
      std::string word;
      while (words >> word) collect(word);
    }
  }
  std::vector<std::string> suffixes_used;
  if (word_forms) {
    // A word that is another word plus a suffix ("brimpuses" = "brimpus" + "es") is not a token of
    // its own: it encodes as the stem and the suffix token.
    const std::vector<std::string> suffixes = {"es", "s"};
    std::vector<std::string> kept;
    for (const auto& piece : pieces) {
      bool split = false;
      for (const auto& suffix : suffixes)
        if (piece.size() > suffix.size() && piece.compare(piece.size() - suffix.size(), suffix.size(), suffix) == 0 &&
            seen.count(piece.substr(0, piece.size() - suffix.size()))) {
          split = true;
          if (std::find(suffixes_used.begin(), suffixes_used.end(), "##" + suffix) == suffixes_used.end())
            suffixes_used.push_back("##" + suffix);
          break;
        }
      if (!split) kept.push_back(piece);
    }
    pieces = std::move(kept);
    pieces.push_back(kCaseMarker);
    // A fused word on its own, for a fused piece the vocabulary lacks ("not~green" -> not green).
    for (const auto& word : modifiers.fused) pieces.push_back(word);
    for (const auto& word : modifiers.joined) pieces.push_back(word);
    // Longest suffix first, as the encoder tries them in order.
    std::sort(suffixes_used.begin(), suffixes_used.end(), [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
    for (const auto& suffix : suffixes_used) pieces.push_back(suffix);
  }
  for (const auto& piece : pieces)
    if (!vocab.contains(piece)) vocab[piece] = next++;
  if (next == 0) throw std::invalid_argument("build_word_level_tokenizer: no words and no special tokens");
  json document = {{"version", "1.0"},
                   {"truncation", nullptr},
                   {"padding", nullptr},
                   {"added_tokens", added},
                   {"normalizer", nullptr},
                   {"pre_tokenizer", {{"type", "WhitespaceSplit"}}},
                   {"post_processor", nullptr},
                   {"decoder", nullptr},
                   {"model", {{"type", "WordLevel"}, {"vocab", vocab}, {"unk_token", unk_token}}}};
  if (word_forms) {
    document["pre_tokenizer"] = {{"type", "WordForms"}, {"case_marker", kCaseMarker}, {"suffixes", suffixes_used}};
    document["decoder"] = {{"type", "WordForms"}, {"case_marker", kCaseMarker}};
    for (const auto& [key, words] : {std::pair{"postfix", &modifiers.postfix}, std::pair{"fused", &modifiers.fused},
                                     std::pair{"joined", &modifiers.joined}})
      if (!words->empty()) {
        document["pre_tokenizer"][key] = *words;
        document["decoder"][key] = *words;
      }
  }
  return HfTokenizer::from_json(document, "<word-level tokenizer>");
}

}  // namespace coconut
