#include "cli/cli_util.h"

#include <sstream>
#include <stdexcept>

#include "model/llama.h"

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

std::string join_ids(const std::vector<int64_t>& ids) {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) text += (i ? "," : "") + std::to_string(ids[i]);
  return text;
}

torch::Device parse_device(const std::string& name) {
  if (name == "auto") return torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  return torch::Device(name);
}

std::optional<torch::ScalarType> parse_optional_dtype(const std::string& name) {
  if (name.empty()) return std::nullopt;
  return dtype_from_name(name);
}

}  // namespace coconut::cli
