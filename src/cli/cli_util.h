// Small helpers shared by subcommands: parsing id lists and choosing devices/dtypes.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

namespace coconut::cli {

// "1,2,3" -> {1, 2, 3}; anything else is an error naming the flag.
std::vector<int64_t> parse_ids(const std::string& text, const std::string& flag);
std::string join_ids(const std::vector<int64_t>& ids);
// "cpu", "cuda", "cuda:1"; "auto" = cuda when available.
torch::Device parse_device(const std::string& name);
// "" = the model's own dtype.
std::optional<torch::ScalarType> parse_optional_dtype(const std::string& name);

}  // namespace coconut::cli
