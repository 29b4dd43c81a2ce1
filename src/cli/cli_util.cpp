#include "cli/cli_util.h"

#include <fmt/core.h>

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "model/device.h"
#include "model/llama.h"
#include "pruning/surgery.h"

namespace coconut::cli {

std::vector<int64_t> parse_ids(const std::string& text, const std::string& flag) {
  std::vector<int64_t> ids;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    size_t used = 0;
    try {
      ids.push_back(std::stoll(item, &used));
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size())
      throw std::invalid_argument(flag + ": '" + item + "' is not an integer id (expected e.g. 1,2,3)");
  }
  if (ids.empty()) throw std::invalid_argument(flag + ": no ids given");
  return ids;
}

std::set<int64_t> layers_to_remove(const std::string& drop_layers, const std::string& depth, int64_t layers) {
  if (!drop_layers.empty() && !depth.empty()) throw std::invalid_argument("give --drop-layers or --depth, not both");
  if (!drop_layers.empty()) return parse_index_list(drop_layers);
  std::set<int64_t> removed;
  if (depth.empty() || depth == "full") return removed;
  int64_t kept = 0;
  try {
    size_t used = 0;
    kept = std::stoll(depth, &used);
    if (used != depth.size()) kept = 0;
  } catch (const std::exception&) {
  }
  if (kept < 1 || kept > layers)
    throw std::invalid_argument("--depth: '" + depth + "' is not full or a layer count in 1.." + std::to_string(layers));
  for (int64_t layer = kept; layer < layers; ++layer) removed.insert(layer);
  return removed;
}

namespace {

// The flag's text as a finite number, or an error message.
std::string parse_finite(const std::string& text, double& value) {
  size_t used = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) return "'" + text + "' is not a number";
  if (!std::isfinite(value)) return "'" + text + "' is not a finite number";
  return "";
}

// [low, high], or (low, high] when `low_open`.
CLI::Validator number_range(double low, double high, bool low_open) {
  const std::string range = (low_open ? "(" : "[") + fmt::format("{}", low) + ", " + fmt::format("{}", high) + "]";
  return CLI::Validator(
      [low, high, low_open, range](std::string& text) -> std::string {
        double value = 0;
        if (auto error = parse_finite(text, value); !error.empty()) return error;
        if (value < low || (low_open && value == low) || value > high) return "'" + text + "' is outside " + range;
        return "";
      },
      "in " + range);
}

}  // namespace

CLI::Validator in_range(double low, double high) { return number_range(low, high, false); }

CLI::Validator above_up_to(double low, double high) { return number_range(low, high, true); }

std::string join_ids(const std::vector<int64_t>& ids) {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) text += (i ? "," : "") + std::to_string(ids[i]);
  return text;
}

torch::Device parse_device(const std::string& name) { return device_from_name(name, "--device"); }

std::optional<torch::ScalarType> parse_optional_dtype(const std::string& name) {
  if (name.empty()) return std::nullopt;
  return dtype_from_name(name);
}

}  // namespace coconut::cli
