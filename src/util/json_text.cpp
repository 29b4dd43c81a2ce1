#include "util/json_text.h"

#include <stdexcept>

namespace coconut {

namespace {

// The deepest nesting of [ and { outside strings, scanning the raw text once.
int nesting_depth(const std::string& text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') deepest = std::max(deepest, ++depth);
    else if ((c == ']' || c == '}') && depth > 0) --depth;
    if (deepest > kMaxJsonDepth) break;
  }
  return deepest;
}

}  // namespace

nlohmann::json parse_json_text(const std::string& text, const std::string& source) {
  if (nesting_depth(text) > kMaxJsonDepth)
    throw std::runtime_error(source + ": malformed JSON: nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    throw std::runtime_error(source + ": malformed JSON: " + error.what());
  } catch (const nlohmann::json::out_of_range& error) {  // a number past double's range (1e400)
    throw std::runtime_error(source + ": malformed JSON: " + error.what());
  }
}

}  // namespace coconut
