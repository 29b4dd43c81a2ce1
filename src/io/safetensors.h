// safetensors files: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the raw data.
// Every malformed file is a std::runtime_error naming the file and, where it applies, the tensor.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>

namespace coconut {

using TensorMap = std::map<std::string, torch::Tensor>;  // ordered by name

// Reads every tensor (CPU, the file's dtype). The tensors may share one buffer.
TensorMap read_safetensors(const std::string& path);
// The header's "__metadata__" (empty when there is none); errors as read_safetensors'.
std::map<std::string, std::string> read_safetensors_metadata(const std::string& path);

// Writes tensors in name order, atomically (temporary file + rename). `metadata` goes to
// "__metadata__" (string values only, as the format requires).
void write_safetensors(const std::string& path, const TensorMap& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace coconut
