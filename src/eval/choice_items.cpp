#include "eval/choice_items.h"

#include <fstream>
#include <stdexcept>

namespace coconut {

std::vector<ChoiceItem> load_choice_items(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::invalid_argument(path + ": cannot open the choices file");
  std::vector<ChoiceItem> items;
  std::string line;
  for (int64_t number = 1; std::getline(file, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(number) + ": ";
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& error) {
      throw std::invalid_argument(where + "not a JSON object (" + error.what() + ")");
    }
    if (!record.is_object()) throw std::invalid_argument(where + "not a JSON object");
    ChoiceItem item;
    item.id = record.contains("id") ? record["id"] : nlohmann::json(number);
    if (!record.contains("context") || !record["context"].is_string()) throw std::invalid_argument(where + "'context' must be a string");
    item.context = record["context"].get<std::string>();
    if (!record.contains("choices") || !record["choices"].is_array() || record["choices"].empty())
      throw std::invalid_argument(where + "'choices' must be a non-empty array of strings");
    for (size_t c = 0; c < record["choices"].size(); ++c) {
      const auto& choice = record["choices"][c];
      if (!choice.is_string()) throw std::invalid_argument(where + "choice " + std::to_string(c) + " is not a string");
      if (choice.get<std::string>().empty()) throw std::invalid_argument(where + "choice " + std::to_string(c) + " is empty");
      item.choices.push_back(choice.get<std::string>());
    }
    if (!record.contains("label") || !record["label"].is_number_integer()) throw std::invalid_argument(where + "'label' must be an integer");
    item.label = record["label"].get<int64_t>();
    if (item.label < 0 || item.label >= static_cast<int64_t>(item.choices.size()))
      throw std::invalid_argument(where + "'label' " + std::to_string(item.label) + " is outside the " +
                                  std::to_string(item.choices.size()) + " choices");
    items.push_back(std::move(item));
  }
  if (items.empty()) throw std::invalid_argument(path + ": no items");
  return items;
}

}  // namespace coconut
