// Hugging Face model folders: config.json + model.safetensors (or shards listed in
// model.safetensors.index.json) [+ tokenizer files]. One name table maps HF tensor names onto the
// model's parameter names; loading fails on a missing, unexpected or misshapen tensor and says which.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
#include "model/llama.h"

namespace coconut {

// The name table: HF name -> our parameter name ("model.layers.3.mlp.up_proj.weight" ->
// "layers.3.mlp.up_proj.weight"; "lm_head.weight" -> "lm_head.weight"), and back.
std::string parameter_name_from_hf(const std::string& hf_name);
std::string hf_name_from_parameter(const std::string& parameter_name);

// Our parameter name -> shape, as the config implies (per-layer heads and MLP widths included).
std::map<std::string, std::vector<int64_t>> expected_parameter_shapes(const LlamaConfig& config);

// Reads the weights of a folder and checks them against `config`. Returns our names, the file's dtype.
TensorMap load_state_dict(const std::string& directory, const LlamaConfig& config);

// config.json + weights -> a model in `dtype` (default: the config's torch_dtype) on `device`.
// A tensor holding NaN or infinities is an error naming it, unless `allow_nonfinite`. The
// parameters named (ours) in `left_empty` are checked in the file's header but not read: each is
// held as an empty tensor ([0], the model's dtype and device), for weights that come from elsewhere
// (a GGUF file's own blocks, model/quantize_model.h), so that they never take memory.
Llama load_model(const std::string& directory, std::optional<torch::ScalarType> dtype = std::nullopt,
                 torch::Device device = torch::kCPU, bool allow_nonfinite = false,
                 const std::set<std::string>& left_empty = {});

struct SaveOptions {
  std::optional<torch::ScalarType> dtype;  // default: the parameters' own dtype
  uint64_t max_shard_bytes = 0;            // 0 = one model.safetensors
  std::vector<std::string> extra_files;    // copied in (tokenizer.json, tokenizer_config.json, ...)
};

// Writes the folder atomically: everything goes to "<directory>.tmp", which then replaces
// `directory`. A crash mid-save leaves the previous folder intact.
void save_hf_folder(const std::string& directory, Llama& model, const SaveOptions& options = {});

}  // namespace coconut
