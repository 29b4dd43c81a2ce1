#include "io/gguf_tokenizer.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace coconut {

namespace {

using json = nlohmann::json;

// llama.cpp's token types (tokenizer.ggml.token_type).
enum TokenType : int64_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// GPT-2's pattern as llama.cpp writes it, and Llama 3's as its tokenizer.json does.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

json split(const std::string& pattern) {
  return {{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}};
}
json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

// llama.cpp's names for Llama 3's pre-tokenizer (whole words in the vocabulary are taken before merging).
bool is_llama3_pre(const std::string& pre) { return pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3"; }

// tokenizer.ggml.pre -> the pre-tokenizer that splits as llama.cpp's expressions for it do.
json byte_level_pre_tokenizer(const std::string& pre, const std::string& path) {
  if (pre == "smollm")  // "\p{N}", then GPT-2's pattern: what SmolLM2's own tokenizer.json says
    return {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true)}}};
  if (is_llama3_pre(pre))
    return {{"type", "Sequence"}, {"pretokenizers", {split(kLlama3Pattern), byte_level(false)}}};
  if (pre == "gpt-2") return byte_level(true);
  if (pre == "default")  // llama.cpp's chain for a file that names no pre-tokenizer of its own
    return {{"type", "Sequence"},
            {"pretokenizers",
             {split(R"([\p{P}\$\+<=>\^~\|]+)"), split(kGpt2Pattern), split(R"(\p{N}+)"), split("[0-9][0-9][0-9]"), byte_level(false)}}};
  throw std::invalid_argument(path + ": tokenizer.ggml.pre '" + pre +
                              "' is not a pre-tokenizer read here (smollm, llama-bpe, gpt-2, default are)");
}

std::vector<std::string> string_array(const GgufFile& file, const std::string& key) {
  std::vector<std::string> values;
  for (const json& item : file.required(key, "array")) {
    if (!item.is_string()) throw std::invalid_argument(file.path + ": metadata '" + key + "' must hold strings");
    values.push_back(item.get<std::string>());
  }
  return values;
}

std::optional<int64_t> token_id(const GgufFile& file, const std::string& key, size_t vocab_size) {
  const json* value = file.value(key, "integer");
  if (!value) return std::nullopt;
  const auto id = value->get<int64_t>();
  if (id < 0 || static_cast<size_t>(id) >= vocab_size)
    throw std::invalid_argument(file.path + ": metadata '" + key + "' = " + std::to_string(id) + " is outside the vocabulary of " +
                                std::to_string(vocab_size) + " tokens");
  return id;
}

// SentencePiece merges from scores: every split of a token into two tokens of the vocabulary is a
// merge, ranked by the joined token's score (highest first; ties by the joined token's id, then the
// left part's length), so that HF's lowest-rank-first BPE merges as llama.cpp's SPM tokenizer does.
json merges_from_scores(const std::vector<std::string>& tokens, const std::vector<int64_t>& types, const std::vector<float>& scores,
                        const std::unordered_map<std::string, int64_t>& ids) {
  struct Merge {
    float score;
    int64_t id;
    size_t left_bytes;
  };
  std::vector<Merge> merges;
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (types[id] != kNormal && types[id] != kUserDefined) continue;
    const std::string& token = tokens[id];
    for (size_t cut = 1; cut < token.size(); ++cut) {
      if ((static_cast<unsigned char>(token[cut]) & 0xC0) == 0x80) continue;  // inside a UTF-8 character
      if (ids.count(token.substr(0, cut)) && ids.count(token.substr(cut)))
        merges.push_back({scores[id], static_cast<int64_t>(id), cut});
    }
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    if (a.score != b.score) return a.score > b.score;
    return a.id != b.id ? a.id < b.id : a.left_bytes < b.left_bytes;
  });
  json out = json::array();
  for (const Merge& merge : merges) {
    const std::string& token = tokens[static_cast<size_t>(merge.id)];
    out.push_back(json::array({token.substr(0, merge.left_bytes), token.substr(merge.left_bytes)}));
  }
  return out;
}

}  // namespace

GgufTokenizerFiles tokenizer_from_gguf(const GgufFile& file) {
  GgufTokenizerFiles files;
  files.model = file.required("tokenizer.ggml.model", "string").get<std::string>();
  if (files.model != "gpt2" && files.model != "llama")
    throw std::invalid_argument(file.path + ": tokenizer.ggml.model '" + files.model +
                                "' is not a tokenizer read here (gpt2 byte-level BPE and llama SentencePiece are)");
  const std::vector<std::string> tokens = string_array(file, "tokenizer.ggml.tokens");
  std::vector<int64_t> types(tokens.size(), kNormal);
  if (const json* listed = file.value("tokenizer.ggml.token_type", "array")) {
    if (listed->size() != tokens.size())
      throw std::invalid_argument(file.path + ": tokenizer.ggml.token_type has " + std::to_string(listed->size()) + " entries for " +
                                  std::to_string(tokens.size()) + " tokens");
    for (size_t id = 0; id < tokens.size(); ++id) {
      if (!(*listed)[id].is_number_integer() || (*listed)[id].get<int64_t>() < kNormal || (*listed)[id].get<int64_t>() > kByte)
        throw std::invalid_argument(file.path + ": tokenizer.ggml.token_type[" + std::to_string(id) + "] is not a token type (1-6)");
      types[id] = (*listed)[id].get<int64_t>();
    }
  }
  files.bos_id = token_id(file, "tokenizer.ggml.bos_token_id", tokens.size());
  files.eos_id = token_id(file, "tokenizer.ggml.eos_token_id", tokens.size());
  files.pad_id = token_id(file, "tokenizer.ggml.padding_token_id", tokens.size());
  const auto unk_id = token_id(file, "tokenizer.ggml.unknown_token_id", tokens.size());

  // The vocabulary, and the tokens matched in the raw text before any splitting (HF's added tokens).
  json vocab = json::object();
  std::unordered_map<std::string, int64_t> ids;
  json added = json::array();
  for (size_t id = 0; id < tokens.size(); ++id) {
    const bool fresh = ids.emplace(tokens[id], static_cast<int64_t>(id)).second;
    const bool matched_whole = types[id] == kControl || types[id] == kUserDefined || (types[id] == kUnknown && files.model == "llama");
    if (!fresh && !matched_whole)
      throw std::invalid_argument(file.path + ": token " + std::to_string(id) + " '" + tokens[id] + "' repeats token " +
                                  std::to_string(ids[tokens[id]]) + "; a vocabulary maps each text to one id");
    if (fresh) vocab[tokens[id]] = id;
    if (matched_whole)
      added.push_back({{"id", id}, {"content", tokens[id]}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", false}, {"special", types[id] != kUserDefined}});
  }

  json& tokenizer = files.tokenizer;
  tokenizer = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added}};
  const json* add_bos_value = file.value("tokenizer.ggml.add_bos_token", "bool");
  bool add_bos = false;
  if (files.model == "gpt2") {
    const json* pre = file.value("tokenizer.ggml.pre", "string");
    files.pre = pre ? pre->get<std::string>() : "default";
    tokenizer["normalizer"] = nullptr;
    tokenizer["pre_tokenizer"] = byte_level_pre_tokenizer(files.pre, file.path);
    tokenizer["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
    json merges = json::array();
    for (const std::string& merge : string_array(file, "tokenizer.ggml.merges")) {
      const size_t space = merge.find(' ', 1);  // a part may itself be a space-like byte character, never empty
      if (space == std::string::npos || space + 1 == merge.size())
        throw std::invalid_argument(file.path + ": tokenizer.ggml.merges entry '" + merge + "' is not two tokens 'a b'");
      merges.push_back(json::array({merge.substr(0, space), merge.substr(space + 1)}));
    }
    const bool llama3 = is_llama3_pre(files.pre);
    tokenizer["model"] = {{"type", "BPE"},           {"dropout", nullptr},      {"unk_token", nullptr},
                          {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                          {"byte_fallback", false},  {"ignore_merges", llama3}, {"vocab", vocab},
                          {"merges", merges}};
    add_bos = add_bos_value ? add_bos_value->get<bool>() : llama3;  // llama.cpp's defaults per pre-tokenizer
  } else {
    std::vector<float> scores(tokens.size(), 0.0f);
    if (const json* listed = file.value("tokenizer.ggml.scores", "array")) {
      if (listed->size() != tokens.size())
        throw std::invalid_argument(file.path + ": tokenizer.ggml.scores has " + std::to_string(listed->size()) + " entries for " +
                                    std::to_string(tokens.size()) + " tokens");
      for (size_t id = 0; id < tokens.size(); ++id) {
        if (!(*listed)[id].is_number()) throw std::invalid_argument(file.path + ": tokenizer.ggml.scores must hold numbers");
        scores[id] = (*listed)[id].get<float>();
      }
    }
    const json* prefix = file.value("tokenizer.ggml.add_space_prefix", "bool");
    json normalizers = json::array();
    if (!prefix || prefix->get<bool>()) normalizers.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
    normalizers.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}});
    tokenizer["normalizer"] = {{"type", "Sequence"}, {"normalizers", normalizers}};
    tokenizer["pre_tokenizer"] = nullptr;
    json decoders = json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                                 {{"type", "ByteFallback"}},
                                 {{"type", "Fuse"}}});
    if (!prefix || prefix->get<bool>()) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    tokenizer["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
    tokenizer["model"] = {{"type", "BPE"},
                          {"dropout", nullptr},
                          {"unk_token", unk_id ? json(tokens[static_cast<size_t>(*unk_id)]) : json(nullptr)},
                          {"continuing_subword_prefix", nullptr},
                          {"end_of_word_suffix", nullptr},
                          {"fuse_unk", true},
                          {"byte_fallback", true},
                          {"vocab", vocab},
                          {"merges", merges_from_scores(tokens, types, scores, ids)}};
    add_bos = add_bos_value ? add_bos_value->get<bool>() : true;
  }
  if (add_bos && !files.bos_id) throw std::invalid_argument(file.path + ": tokenizer.ggml.add_bos_token is set but there is no bos_token_id");
  if (add_bos) {
    const std::string& bos = tokens[static_cast<size_t>(*files.bos_id)];
    tokenizer["post_processor"] = {
        {"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair",
         {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
          {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
          {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
        {"special_tokens", {{bos, {{"id", bos}, {"ids", {*files.bos_id}}, {"tokens", {bos}}}}}}};
  } else {
    tokenizer["post_processor"] = nullptr;
  }

  json& config = files.tokenizer_config;
  config = {{"tokenizer_class", "PreTrainedTokenizerFast"}, {"clean_up_tokenization_spaces", false}, {"add_bos_token", add_bos}};
  const json* add_eos = file.value("tokenizer.ggml.add_eos_token", "bool");
  config["add_eos_token"] = add_eos ? add_eos->get<bool>() : false;
  const std::pair<const char*, std::optional<int64_t>> specials[] = {
      {"bos_token", files.bos_id}, {"eos_token", files.eos_id}, {"pad_token", files.pad_id}, {"unk_token", unk_id}};
  for (const auto& [name, id] : specials)
    if (id) config[name] = tokens[static_cast<size_t>(*id)];
  if (const json* context = file.value("llama.context_length", "integer")) config["model_max_length"] = *context;
  if (const json* chat = file.value("tokenizer.chat_template", "string")) config["chat_template"] = *chat;
  return files;
}

}  // namespace coconut
