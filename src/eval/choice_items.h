// Zero-shot multiple-choice items as `coconut eval-lm --choices` and the sweep read them: JSONL, one
// item a line, {"id": ..., "context": str, "choices": [str, ...], "label": int} (id optional: the
// line number).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace coconut {

struct ChoiceItem {
  nlohmann::json id;
  std::string context;
  std::vector<std::string> choices;
  int64_t label = 0;
};

// Every item of `path` (blank lines skipped). Throws std::invalid_argument naming the file, the line
// and the field for a line that is not one (not an object, a missing or empty choice, a label out of
// range), or when the file cannot be read or holds no item.
std::vector<ChoiceItem> load_choice_items(const std::string& path);

}  // namespace coconut
