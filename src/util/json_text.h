// Parsing JSON text that may be hostile: nesting is bounded before any tree is built (a deep
// enough tree overflows the stack of recursive copies and destructors).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace coconut {

// Deeper than any real config, tokenizer or dataset (they nest at most 5 levels).
constexpr int kMaxJsonDepth = 64;

// Parses `text`; a malformed document or one nested deeper than kMaxJsonDepth throws
// std::runtime_error naming `source`.
nlohmann::json parse_json_text(const std::string& text, const std::string& source);

}  // namespace coconut
